"""The Model tab's "Will it learn?": the pre-flight (engine.preflight) of the settings shown, with its progress, a
Cancel, the verdict, the prompts hardest first, and its fixes as buttons that change the settings shown."""

from __future__ import annotations

import contextvars
import functools
import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import gradio as gr

from ..config import Draft
from ..errors import Stopped
from ..runstore import format_seconds
from ..studio.backend import Studio
from ..studio.preflight_view import MOST_FIXES, PROMPT_COLUMNS, Preflight, apply_fix, prompt_rows
from .common import (ONE_MODEL_AT_A_TIME, SAMPLING, TAB_REWARDS, Form, Shared, bound, explain, first_cell,
                     in_the_page, message, tab_selected)
from .rewards_tab import playground_rows


@dataclass
class PreflightSection:
    button: gr.Button  # "Will it learn?"
    cancel: gr.Button
    fix_buttons: list[gr.Button]
    status: gr.Markdown
    prompts: gr.Dataframe
    fixes: gr.State  # the last report's fixes, held by the server: a fix button applies one of these alone


def build(shared: Shared, button: gr.Button) -> Callable[[], None]:
    """The pre-flight's components, under the Start row; returns the function that wires its events once every tab
    has added its fields (``button`` starts it)."""
    with gr.Row():
        cancel = gr.Button("Cancel the pre-flight", variant="stop", size="sm", scale=0, min_width=220,
                           visible=False, elem_id="preflight-cancel")  # shown while one runs
        fix_buttons = [gr.Button(visible=False, size="sm", scale=0, min_width=220, elem_id=f"preflight-fix-{n}")
                       for n in range(MOST_FIXES)]
    status = gr.Markdown(elem_id="preflight-status")
    prompts = gr.Dataframe(headers=PROMPT_COLUMNS, visible=False, interactive=False, wrap=True, max_height=360,
                           label="Prompts, hardest first (pick one to try it in the Rewards tab's playground)",
                           elem_id="preflight-prompts")
    section = PreflightSection(button, cancel, fix_buttons, status, prompts, gr.State([]))
    return functools.partial(connect, shared, section)


def connect(shared: Shared, section: PreflightSection) -> None:
    form = shared.form
    checking = section.button.click(bound(check_shown, shared.studio, form), form.inputs,
                                    [section.status, section.prompts, section.cancel, *section.fix_buttons,
                                     section.fixes], api_visibility="private", show_progress="hidden",
                                    **ONE_MODEL_AT_A_TIME)
    section.cancel.click(cancel_preflight, None, [section.status, section.cancel], cancels=[checking],
                         api_visibility="private", show_progress="hidden")
    for number, fix_button in enumerate(section.fix_buttons):
        shared.change_draft(fix_button.click, functools.partial(apply_fix, number=number), [section.fixes],
                            section.status)
    section.prompts.select(bound(open_prompt, shared.studio, form), form.inputs,
                           [shared.playground_row, shared.playground_row_text], api_visibility="private",
                           show_progress="hidden").then(**in_the_page([shared.tabs], f"[{tab_selected(TAB_REWARDS)}]"))


def check_shown(studio: Studio, form: Form, request: gr.Request, *shown: Any) -> Iterator[tuple]:
    """"Will it learn?" on the settings the form shows (checked), as the session that asked."""
    yield from checked(studio, form.compose(*shown), request.session_hash)


def open_prompt(studio: Studio, form: Form, event: gr.SelectData, *shown: Any) -> tuple:
    """A prompt of the table, picked: its row in the playground, to sample or score by hand."""
    row = first_cell(event)
    return playground_rows(form.compose(*shown), row, form.labels, policy=studio.policy)


# The stop flag of each session's running pre-flight: Cancel sets it at once. gradio closes the cancelled generator
# only once it yields, which a thread busy loading a model or sampling a batch would keep it from doing for long.
_running: dict[str | None, threading.Event] = {}


def cancel_preflight(request: gr.Request | None = None) -> tuple:
    """The Cancel button: the session's pre-flight stops at its next token or reward. (status, the button)"""
    closed = _running.get(request.session_hash if request is not None else None)
    if closed is not None:
        closed.set()
    return message("Cancelled: nothing was changed.", "info"), gr.Button(visible=False)


def checked(studio: Studio, draft: Draft, session: str | None = None):
    """The pre-flight on a thread of its own, so the page sees its progress: yields (status, prompts, Cancel, each
    fix button, the fixes). Cancel (cancel_preflight), or closing it when the page goes away, stops the sampling within
    a token."""
    updates: queue.Queue = queue.Queue()
    closed = _running[session] = threading.Event()

    def work() -> None:
        try:
            with SAMPLING:
                if closed.is_set():  # cancelled while the playground's group finished
                    raise Stopped("the pre-flight was cancelled")
                updates.put(studio.preflight(draft, should_stop=closed.is_set,
                                             on_progress=lambda done, total: updates.put((done, total))))
        except Stopped:
            updates.put(None)
        except Exception as exc:  # noqa: BLE001 - shown as the sentence it is, and logged if unexpected
            updates.put(explain(exc))

    running = (gr.Dataframe(visible=False), gr.Button(visible=True), *[gr.Button(visible=False)] * MOST_FIXES, [])
    failed = (gr.Dataframe(visible=False), *[gr.Button(visible=False)] * (1 + MOST_FIXES), [])
    # In the context of the request (public.visiting): the pre-flight acts for the visitor who asked.
    threading.Thread(target=contextvars.copy_context().run, args=(work,), name="preflight", daemon=True).start()
    started = time.monotonic()
    try:
        yield message("Will it learn? Reading the data and loading the model…"), *running
        while True:
            update = updates.get()
            if isinstance(update, tuple):
                done, total = update
                left = (time.monotonic() - started) / done * (total - done)
                yield message(f"Will it learn? Sampled {done} of {total} prompts; about {format_seconds(left)} "
                              "left."), *running
                continue
            if isinstance(update, Preflight):
                yield shown(update)
            elif isinstance(update, str):
                yield message(update, "error"), *failed
            return
    finally:
        closed.set()
        if _running.get(session) is closed:
            del _running[session]


def shown(report: Preflight) -> tuple:
    """The report as the page shows it: (status, prompts, Cancel, each fix button, the fixes)."""
    lines = [message(report.verdict, "ok" if report.good else "warn"), "",
             *(f"- {fact}" for fact in report.facts())]
    if report.goal is not None and report.goal.winners:
        lines.append("- Groups where no reply passes the goal, and the reply the other rewards make the winner: "
                     + "; ".join(f"row {winner.number}: “{winner.reply}” ({winner.advantage:+.2f}, from "
                                 f"`{winner.by}`; reference {winner.reference})" for winner in report.goal.winners))
    if report.red_team is not None:
        lines.append(f"- Red team: {report.red_team.verdict}")
    if report.fixes:
        lines.append("- Fixes (each changes the settings shown; check again after): "
                     + " ".join(f"**{fix.label}**: {fix.why}" for fix in report.fixes))
    buttons = [gr.Button(fix.label.replace("`", ""), visible=True) for fix in report.fixes[:MOST_FIXES]]
    buttons += [gr.Button(visible=False)] * (MOST_FIXES - len(buttons))
    return ("\n".join(lines), gr.Dataframe(prompt_rows(report), headers=PROMPT_COLUMNS, visible=True),
            gr.Button(visible=False), *buttons,
            report.fixes[:MOST_FIXES])
