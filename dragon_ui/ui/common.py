"""What the tabs share: the cross-tab state, and one way to show engine errors as sentences."""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass

import gradio as gr

from ..errors import DragonError
from ..studio import Studio

log = logging.getLogger(__name__)

TAB_DATA, TAB_REWARDS, TAB_MODEL, TAB_TRAIN, TAB_COMPARE = "data", "rewards", "model", "train", "compare"


@dataclass
class Shared:
    """Components every tab may read or write. Built once by app.build_app before the tabs."""

    studio: Studio
    draft: gr.State  # the run configuration being edited, as a plain dict (RunConfig.to_dict() shape)
    config_loaded: gr.State  # bumped when a whole draft is replaced (recipe, page load): tabs refill their fields
    run_id: gr.State  # the run shown on the Train and Compare tabs ("" when none)
    timer: gr.Timer  # drives the Train tab's refresh while a run is active
    tabs: gr.Tabs


def message(text: str, kind: str = "info") -> str:
    """A one-line status shown next to the control it concerns (Markdown)."""
    icon = {"info": "ℹ️", "ok": "✅", "warn": "⚠️", "error": "❌"}[kind]
    return f"{icon} {text}"


def explain(exc: BaseException) -> str:
    """The sentence to show for an exception: the engine's own message, or a short generic one (logged in full)."""
    if isinstance(exc, DragonError):
        return str(exc)
    log.exception("unexpected error in the UI")
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"Something went wrong: {type(exc).__name__}{': ' + first if first else ''}"


def shows_errors(fn):
    """Turn any exception of a handler into a gr.Error popup with a readable sentence (never a raw traceback)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except gr.Error:
            raise
        except Exception as exc:
            raise gr.Error(explain(exc), print_exception=False) from None

    return wrapper
