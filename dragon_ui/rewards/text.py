"""Reading an answer out of a reply: the last number, the part after ####, inside \\boxed{} or <answer> tags; and the
normalisation exact and contains compare with."""

from __future__ import annotations

import re
from collections import deque

from ..errors import RewardError


EXTRACT_MODES: tuple[str, ...] = ("whole", "last_number", "after_hashes", "boxed", "answer_tag")

# A number: optional sign, digits with optional thousands separators ("1,234"), optional decimals; ".5" too.
# The sign only counts when it is not glued to a word or number, so "3-5" reads as 3 and 5 (not 3 and -5), and a
# number never starts in the middle of another one. Scientific notation is not recognised ("1e-5" reads as 1, 5).
_NUMBER_RE = re.compile(
    r"(?:(?<![\w.])[-+\u2212])?(?<![\d.])(?:(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.\d+)?|\.\d+)"
)


def _last_number_text(text: str) -> str | None:
    """The last number in ``text`` in plain form (no thousands separators, ASCII minus, no plus), or None."""
    last = deque(_NUMBER_RE.finditer(text), maxlen=1)
    if not last:
        return None
    return last[0].group().replace(",", "").replace("\u2212", "-").lstrip("+")


def last_number(text: str) -> float | None:
    number = _last_number_text(text)
    return None if number is None else float(number)


def _boxed(text: str) -> str:
    """Content of the last ``\\boxed{...}``, braces balanced; "" when there is none or it is cut off."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return ""
    start += len("\\boxed{")
    depth = 1
    for index in range(start, len(text)):
        char = text[index]
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                return text[start:index]
    return ""


def _answer_tag(text: str) -> str:
    """Content of the last ``<answer>...</answer>`` (case-sensitive tags, like the format reward)."""
    end = text.rfind("</answer>")
    start = text.rfind("<answer>", 0, end) if end >= 0 else -1
    return text[start + len("<answer>"):end] if start >= 0 else ""


def extract_answer(text: str, mode: str = "whole") -> str:
    """Apply an extraction mode (see ``EXTRACT_MODES``); "" when the mode finds nothing.

    ``last_number`` returns the number in plain form ("1,234" -> "1234") so that ``exact`` can compare it.
    """
    if mode == "whole":
        return text
    if mode == "last_number":
        return _last_number_text(text) or ""
    if mode == "after_hashes":
        index = text.rfind("####")
        return text[index + 4:].strip() if index >= 0 else ""
    if mode == "boxed":
        return _boxed(text)
    if mode == "answer_tag":
        return _answer_tag(text)
    raise ValueError(f"unknown extract mode {mode!r}")


def normalise(text: str, case_sensitive: bool) -> str:
    """Strip, collapse whitespace, lowercase (casefold) unless case-sensitive, drop trailing ``.,;:!?``."""
    text = " ".join(text.split())
    if not case_sensitive:
        text = text.casefold()
    return text.rstrip(" .,;:!?")


def require_reference(reference: str | None) -> str:
    if reference is None:
        raise RewardError("this row has no reference answer to compare against")
    return reference
