"""The pre-flight as the Model tab shows it: the report (engine.preflight), its prompts as table rows, and one of its
fixes applied to the settings shown."""

from __future__ import annotations

from ..config import Draft
from ..data import DataConfig
from ..engine.preflight import Fix, Preflight
from ..errors import ConfigError

__all__ = ["MOST_FIXES", "PROMPT_COLUMNS", "Fix", "Preflight", "apply_fix", "difficulty_filter", "prompt_rows",
           "without_difficulty_filter"]

# engine.preflight.fixes_for offers at most a warmer temperature, partial credit and the drop; or, where the goal does
# not teach, the goal's alternatives (another goal, the shaping gated, one for each other extraction, a system
# message, more tokens, a larger model) and the drop.
MOST_FIXES = 8
PROMPT_COLUMNS = ["Row", "Pass rate", "Group", "Prompt", "Reference"]


def prompt_rows(report: Preflight) -> list[list]:
    """The sampled prompts, hardest first, as the table's rows (PROMPT_COLUMNS)."""
    return [[check.number, f"{round(100 * check.pass_rate)} %", check.kind, check.prompt, check.reference]
            for check in report.ranked()]


def difficulty_filter(draft: Draft) -> str:
    """The difficulty filter the draft sets, in a sentence ("" for none): how many rows the pre-flight measured, the
    range kept, and how many of them fall outside it."""
    data = draft.get("data")
    if not isinstance(data, dict):
        return ""
    rates = data.get("pass_rates")
    if not isinstance(rates, dict) or not rates:
        return ""
    low, high = (value if isinstance(value := data.get(name), (int, float)) else default
                 for name, default in (("min_pass_rate", 0.0), ("max_pass_rate", 1.0)))
    kept = DataConfig(min_pass_rate=low, max_pass_rate=high)
    outside = sum(not kept.keeps_rate(rate) for rate in rates.values() if isinstance(rate, (int, float)))
    return (f"**Difficulty filter:** training leaves out the {outside} of {len(rates)} rows measured by a pre-flight "
            f"whose pass rate is outside {low:g} to {high:g}; the other rows all train.")


def without_difficulty_filter(draft: Draft) -> tuple[dict, str]:
    """The draft with no difficulty filter (every row trains again), and the sentence saying so."""
    data = {key: value for key, value in (draft.get("data") or {}).items()
            if key not in ("pass_rates", "min_pass_rate", "max_pass_rate")}
    return {**draft, "data": data}, "Cleared the difficulty filter: every row trains."


def apply_fix(draft: Draft, found: list[Fix], number: int) -> tuple[dict, str]:
    """The draft with the ``number``th fix of the last pre-flight, and the sentence saying so."""
    if not isinstance(found, list) or not 0 <= number < len(found):
        raise ConfigError("There is no such fix: press Will it learn? again.")
    fix = found[number]
    return fix.applied_to(draft), f"Applied the pre-flight's fix: {fix.label}. Press Will it learn? again to see it."
