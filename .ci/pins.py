"""For make lock: the name==version pins of what a pip installation report (pip install --dry-run --report -) would
install, read from stdin, one a line in alphabetical order. A local build label (2.13.0+cpu) is left out, so the pin
holds for every platform's build; a package that requirements.in asks for on some platforms only keeps its marker,
and so does torch's CUDA stack (Linux only, as torch declares it)."""

import json
import re
import sys
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

LINUX_ONLY = re.compile(r"^(nvidia-|cuda-|triton$)")
ranges = (line.split("#", 1)[0].strip() for line in Path(sys.argv[1]).read_text(encoding="utf-8").splitlines())
markers = {canonicalize_name(req.name): str(req.marker) for req in map(Requirement, filter(None, ranges)) if req.marker}
report = json.load(sys.stdin)
for item in sorted(report["install"], key=lambda item: item["metadata"]["name"].lower()):
    name, version = item["metadata"]["name"], item["metadata"]["version"].split("+")[0]
    marker = markers.get(canonicalize_name(name)) or ('platform_system == "Linux"' if LINUX_ONLY.match(
        canonicalize_name(name)) else None)
    print(f"{name}=={version}" + (f"; {marker}" if marker else ""))
