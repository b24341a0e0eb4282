"""For make reference: write the tables docs/reference.md holds between markers, each made by the code it
describes (the settings from the config fields' own labels and help, the reward and tool kinds from their classes,
the public demo's limits from theirs), so the page is never edited by hand there."""

import sys
from pathlib import Path

from dragon_ui.config import settings_table
from dragon_ui.public import Limits
from dragon_ui.rewards.spec import reward_kinds_table, reward_settings_table
from dragon_ui.tools.spec import environment_kinds_table, tool_kinds_table, tool_settings_table

TABLES = {"settings": settings_table, "reward kinds": reward_kinds_table, "reward settings": reward_settings_table,
          "tool kinds": tool_kinds_table, "environment kinds": environment_kinds_table,
          "tool settings": tool_settings_table, "limits": Limits.table}

page = Path(sys.argv[1])
text = page.read_text(encoding="utf-8")
for name, table in TABLES.items():
    begin, end = f"<!-- {name}: begin -->", f"<!-- {name}: end -->"
    before, found, rest = text.partition(begin)
    _, ended, after = rest.partition(end)
    if not (found and ended):
        sys.exit(f"{page} has no {begin} … {end} markers to put the {name} table between.")
    text = f"{before}{begin}\n{table()}{end}{after}"
page.write_text(text, encoding="utf-8")
