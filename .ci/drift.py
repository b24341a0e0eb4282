"""For make test-drift: which of the newest releases that the ranges allow differ from the locked ones.

Reads a pip installation report (pip install --dry-run --ignore-installed --report - -r requirements-dev.txt, no
constraints) from stdin, prints each package whose newest allowed version is not the one constraints.txt pins, and
exits 1 if any is, 0 if the lock is the newest (then make test has just tested exactly these).
"""

import json
import sys
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

locked = {}
for line in Path(sys.argv[1]).read_text(encoding="utf-8").splitlines():
    if line.strip() and not line.startswith("#"):
        pin = Requirement(line)
        locked[canonicalize_name(pin.name)] = str(pin.specifier).removeprefix("==")
newest = {canonicalize_name(item["metadata"]["name"]): item["metadata"]["version"].split("+")[0]
          for item in json.load(sys.stdin)["install"]}
moved = sorted(name for name in newest if locked.get(name) != newest[name])
for name in moved:
    print(f"  {name}: {locked.get(name, 'not locked')} -> {newest[name]}")
sys.exit(1 if moved else 0)
