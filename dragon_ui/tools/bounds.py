"""What one call of a tool may do: hand back at most ANSWER_CHARS of text (the cut said), and not run at all once
the run is stopping. Built-in, custom and environment tools are all called through :func:`answered`."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping

from ..errors import Stopped
from .builtin import ToolError

ANSWER_CHARS = 1000  # what one call may hand back to the model; the rest is cut, and the cut is said


def answered(function: Callable, arguments: Mapping, should_stop: Callable[[], bool] | None) -> str:
    """``function(**arguments)`` as the model gets it: text cut to ANSWER_CHARS, a ToolError's sentence cut too;
    Stopped (not called) once ``should_stop()``, which TRL hands back as a failed call before the run's next
    forward pass ends the step."""
    if should_stop is not None and should_stop():
        raise Stopped("the run is stopping, so the tool was not called")
    try:
        answer = function(**arguments)
    except ToolError as error:
        raise ToolError(cut(str(error), "error")) from None
    return cut(answer if isinstance(answer, str) else json.dumps(answer, ensure_ascii=False, default=str))


def cut(text: str, what: str = "answer") -> str:
    """``text`` as a call may hand it back: at most ANSWER_CHARS characters, the cut said."""
    if len(text) <= ANSWER_CHARS:
        return text
    return text[:ANSWER_CHARS] + f"… (cut: the {what} had {len(text):,} characters)"
