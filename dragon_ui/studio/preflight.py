"""The pre-flight as the Model tab shows it: the report (engine.preflight), its prompts as table rows, and one of its
fixes applied to the settings shown."""

from __future__ import annotations

from ..engine.preflight import Fix, Preflight
from ..errors import ConfigError

__all__ = ["MOST_FIXES", "PROMPT_COLUMNS", "Fix", "Preflight", "apply_fix", "prompt_rows"]

MOST_FIXES = 2  # engine.preflight.fixes_for offers at most a warmer temperature and partial credit
PROMPT_COLUMNS = ["Row", "Pass rate", "Group", "Prompt", "Reference"]


def prompt_rows(report: Preflight) -> list[list]:
    """The sampled prompts, hardest first, as the table's rows (PROMPT_COLUMNS)."""
    return [[check.number, f"{round(100 * check.pass_rate)} %", check.kind, check.prompt, check.reference]
            for check in report.ranked()]


def apply_fix(draft: dict, found: list[Fix], number: int) -> tuple[dict, str]:
    """The draft with the ``number``th fix of the last pre-flight, and the sentence saying so."""
    if not isinstance(found, list) or not 0 <= number < len(found):
        raise ConfigError("There is no such fix: press Will it learn? again.")
    fix = found[number]
    return fix.applied_to(draft), f"Applied the pre-flight's fix: {fix.label}. Press Will it learn? again to see it."
