"""For make reference: put the settings table (`dragon settings --markdown`, read from stdin) into the reference.

The table is made from the config fields' own labels and help, so docs/reference.md is never edited by hand there.
"""

import sys
from pathlib import Path

BEGIN, END = "<!-- settings: begin -->", "<!-- settings: end -->"

page = Path(sys.argv[1])
text = page.read_text(encoding="utf-8")
before, found, rest = text.partition(BEGIN)
_, ended, after = rest.partition(END)
if not (found and ended):
    sys.exit(f"{page} has no {BEGIN} … {END} markers to put the settings table between.")
page.write_text(f"{before}{BEGIN}\n{sys.stdin.read()}{END}{after}", encoding="utf-8")
