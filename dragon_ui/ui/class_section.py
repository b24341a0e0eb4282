"""A class on a public demo: the learner's seat (above the tabs), the teacher's board (on the Experiments tab), and
the recipe the teacher hands every seat, which each seated page offers at its next tick (studio.classroom).
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass
from typing import Any

import gradio as gr
import pandas as pd

from ..errors import ConfigError, DragonError
from ..experiments import write_csv
from ..studio.backend import Studio
from ..studio.classroom import BOARD_COLUMNS, NAME_CHARS, Handout
from .common import TAB_TRAIN, Shared, bound, in_the_page, message, shows_errors, tab_selected

HANDOUT_TICK_S = 10.0  # how often a seated page asks whether the teacher handed out a recipe
BOARD_TICK_S = 5.0  # how often an open board is read again


@dataclass
class SeatPanel:
    """Where a learner takes a seat with the class code, and the line that says whose seat this page has."""

    code: gr.Textbox
    name: gr.Textbox
    sit: gr.Button
    status: gr.Markdown
    seen: gr.BrowserState  # the number of the last hand-out this browser was offered
    due: gr.State  # the hand-out this page is to offer now (its number)
    timer: gr.Timer


@dataclass
class TeacherBoard:
    """The owner's view of the class: a row per seat, and what acts on every seat at once."""

    said: gr.Markdown
    table: gr.Dataframe
    refresh: gr.Button
    hand_out: gr.Button
    stop_all: gr.Button
    pause: gr.Button
    export: gr.Button
    close: gr.Button
    seat: gr.Dropdown
    free: gr.Button
    csv: gr.File
    timer: gr.Timer


def seat_panel(storage_key: str) -> SeatPanel:
    """The learner's panel, above the tabs of a public demo."""
    with gr.Accordion("In a class? Take your seat", open=False, elem_id="class-join"):
        with gr.Row(equal_height=True):
            code = gr.Textbox(label="Class code", scale=2, max_length=200, elem_id="class-code",
                              info="The code your teacher gave you.")
            name = gr.Textbox(label="Your name", scale=2, max_length=NAME_CHARS, elem_id="class-name",
                              info="How your teacher's board shows you.")
            sit = gr.Button("Take my seat", scale=1, elem_id="class-sit")
    status = gr.Markdown(elem_id="class-seat")
    seen = gr.BrowserState(0, storage_key="dragon-grpo-studio-handout", secret=storage_key)
    return SeatPanel(code, name, sit, status, seen, gr.State(0), gr.Timer(HANDOUT_TICK_S, active=False))


def seat_line(seat: str) -> str:
    return message(f"You sit as **{seat}** in this class: your runs count as your seat's, and your teacher's board "
                   "shows them.", "ok")


def take_seat(studio: Studio, code: Any, name: Any) -> tuple:
    """Seat this page's browser in the class; the code field is emptied either way."""
    try:
        who = studio.visitors.sit(studio.policy.visitor, code, name)
    except DragonError as exc:
        return "", message(str(exc), "error"), gr.skip()
    return "", seat_line(who.seat), gr.Timer(active=True)


def seat_opened(studio: Studio, seen: Any) -> tuple:
    """A page opened: its seat, if its browser has one, and the hand-out it has not been offered yet."""
    seat = studio.policy.visitor.seat
    if not seat:
        return "", gr.Timer(active=False), gr.skip(), gr.skip()
    return (seat_line(seat), gr.Timer(active=True), *handout_due(studio, seen))


def handout_due(studio: Studio, seen: Any) -> tuple:
    """(the number this browser has been offered, the hand-out to offer now) when the teacher handed out a recipe
    since this browser was last offered one; unchanged otherwise, and for a page without a seat."""
    handout = studio.classroom.handout() if studio.classroom is not None else None
    if handout is None or not studio.policy.visitor.seat:
        return gr.skip(), gr.skip()
    if isinstance(seen, int) and not isinstance(seen, bool) and seen >= handout.number:
        return gr.skip(), gr.skip()
    return handout.number, handout.number


def handout_offered(studio: Studio, number: Any) -> tuple[dict, str]:
    """The recipe handed out, as a draft to load (asking first when the form was edited)."""
    handout: Handout | None = studio.classroom.handout() if studio.classroom is not None else None
    if handout is None or not studio.policy.visitor.seat or number != handout.number:
        raise ConfigError("Your teacher's recipe is not for this page: take a seat in the class first.")
    return handout.draft, handout.label


def teacher_board(shared: Shared) -> TeacherBoard:
    """The teacher's board, on the Experiments tab of a public demo."""
    with gr.Accordion("Class board (the teacher's)", open=False, elem_id="class-board") as box:
        said = gr.Markdown(message("Enter the owner key on the owner panel to see the class.", "info"),
                           elem_id="class-board-said")
        with gr.Row(equal_height=True):
            refresh = gr.Button("↻ Refresh", size="sm", scale=0, min_width=110, elem_id="class-board-refresh")
            hand_out = gr.Button("Give everyone this recipe", size="sm", scale=1, elem_id="class-hand-out")
            pause = gr.Button("Pause the queue", size="sm", scale=1, elem_id="class-pause")
            stop_all = gr.Button("Stop all runs", size="sm", variant="stop", scale=1, elem_id="class-stop-all")
            export = gr.Button("Export results (CSV)", size="sm", scale=1, elem_id="class-export")
            close = gr.Button("Close the class", size="sm", scale=1, elem_id="class-close")
        with gr.Row(equal_height=True):
            seat = gr.Dropdown([], value=None, label="Seat", scale=3, elem_id="class-seat-choice",
                               info="A seat taken by mistake, or by someone who should not have the code.")
            free = gr.Button("Free this seat", size="sm", scale=1, elem_id="class-free-seat")
        table = gr.Dataframe(pd.DataFrame([], columns=BOARD_COLUMNS), interactive=False, wrap=True, max_height=480,
                             label="Seats (click a row to open its run)", elem_id="class-board-table")
        csv = gr.File(label="Class results (.csv)", interactive=False, visible=False, elem_id="class-csv")
    board = TeacherBoard(said, table, refresh, hand_out, stop_all, pause, export, close, seat, free, csv,
                         gr.Timer(BOARD_TICK_S, active=False))
    connect_board(shared, board, box)
    return board


def board_shown(studio: Studio) -> tuple:
    """(sentence, rows, the pause button, the seats to free, the board's timer): read again every BOARD_TICK_S while
    an owner has it open."""
    teacher = studio.teacher
    assert teacher is not None  # the board is built in a public demo alone
    try:
        rows = teacher.board()
    except DragonError as exc:
        return message(str(exc), "info"), gr.skip(), gr.skip(), gr.skip(), gr.Timer(active=False)
    classroom = studio.classroom
    assert classroom is not None
    paused = teacher.queue_paused()
    state = ("the queue is paused: waiting runs start when you resume it" if paused else
             "the queue is running")
    opened = "" if classroom.open else " No class code is set yet: set one on the owner panel."
    handed = classroom.handout()
    handout = f" Recipe handed out at {time.strftime('%H:%M', time.localtime(handed.at))}." if handed else ""
    said = message(f"{len(rows)} seat{'s' * (len(rows) != 1)} taken; {state}.{handout}{opened}", "info")
    return (said, pd.DataFrame(rows, columns=BOARD_COLUMNS),
            gr.Button("Resume the queue" if paused else "Pause the queue"),
            gr.Dropdown(choices=[row[0] for row in rows]), gr.Timer(active=True))


def board_closed() -> gr.Timer:
    """A closed board is not read again."""
    return gr.Timer(active=False)


def recipe_handed_out(studio: Studio, draft: Any) -> str:
    teacher = studio.teacher
    assert teacher is not None
    handout = teacher.hand_out(draft)
    return message(f"Handed out to every seat at {time.strftime('%H:%M', time.localtime(handout.at))}: each page "
                   f"loads it within "
                   f"{HANDOUT_TICK_S:g} s, asking first where its learner has edited the settings.", "ok")


def everything_stopped(studio: Studio) -> str:
    teacher = studio.teacher
    assert teacher is not None
    stopped = teacher.stop_all()
    return message(f"Asked {stopped} run{'s' * (stopped != 1)} to stop (waiting ones left the queue); each saves its "
                   "last step and can be resumed.", "ok")


def queue_toggled(studio: Studio) -> tuple:
    teacher = studio.teacher
    assert teacher is not None
    paused = not teacher.queue_paused()
    teacher.pause_queue(paused)
    said = ("The queue is paused: runs training go on, waiting ones start when you resume it." if paused else
            "The queue runs again: waiting runs start as the machine has room.")
    return message(said, "ok"), gr.Button("Resume the queue" if paused else "Pause the queue")


def board_exported(studio: Studio) -> gr.File:
    teacher = studio.teacher
    assert teacher is not None
    rows = teacher.board()  # the owner's alone, before any file is made
    return gr.File(str(write_csv(studio.files.new_download("dragon-class.csv"), BOARD_COLUMNS, rows)), visible=True)


def seat_run_opened(studio: Studio, event: gr.SelectData) -> str:
    """The run of the seat whose row was clicked, shown on the Train tab."""
    teacher = studio.teacher
    assert teacher is not None
    return teacher.seat_run(event.index[0] if isinstance(event.index, list | tuple) and event.index else None)


def connect_board(shared: Shared, board: TeacherBoard, box: gr.Accordion) -> None:
    studio = shared.studio
    shown = shows_errors(functools.partial(board_shown, studio))
    outputs = [board.said, board.table, board.pause, board.seat, board.timer]
    gr.on([board.refresh.click, box.expand, board.timer.tick], shown, None, outputs, api_name="class_board",
          show_progress="hidden", trigger_mode="always_last")
    box.collapse(board_closed, None, [board.timer], api_visibility="private", show_progress="hidden")
    board.hand_out.click(shows_errors(shared.form.takes_draft(functools.partial(recipe_handed_out, studio))),
                         shared.form.inputs, [board.said], api_name="class_hand_out")
    board.stop_all.click(shows_errors(functools.partial(everything_stopped, studio)), None, [board.said],
                         api_name="class_stop_all")
    board.pause.click(shows_errors(functools.partial(queue_toggled, studio)), None, [board.said, board.pause],
                      api_name="class_pause")
    board.export.click(shows_errors(functools.partial(board_exported, studio)), None, [board.csv],
                       api_name="class_export")
    board.close.click(shows_errors(functools.partial(class_closed, studio)), None, [board.said],
                      api_name="class_close")
    board.free.click(shows_errors(functools.partial(seat_freed, studio)), [board.seat], [board.said],
                     api_name="class_free_seat")
    assert shared.tabs is not None
    board.table.select(shows_errors(bound(seat_run_opened, studio)), None, [shared.run_id],
                       api_visibility="private").then(**in_the_page([shared.tabs], f"[{tab_selected(TAB_TRAIN)}]"))


def offer_handouts(shared: Shared, panel: SeatPanel) -> None:
    """A hand-out due is offered as a recipe is (app.Drafts): asking first where the form was edited."""
    shared.offer_draft(panel.due.change, functools.partial(handout_offered, shared.studio), [panel.due])


def class_opened(studio: Studio, code: Any) -> tuple[str, str]:
    """The owner panel's "Open the class": with the code typed, or one made now (shown to the owner alone)."""
    teacher = studio.teacher
    assert teacher is not None
    try:
        made = teacher.open_class(code)
    except DragonError as exc:
        return gr.skip(), message(str(exc), "error")
    if made:
        said = f"The class is open with the code **{made}** (write it on the board)"
    elif isinstance(code, str) and code.strip():
        said = "The class is open with the code you typed"
    else:
        said = "The class stays open with its code, and pages held up by wrong codes may try again"
    return "", message(f"{said}: learners take a seat with it above the tabs.", "ok")


def seat_freed(studio: Studio, name: Any) -> str:
    teacher = studio.teacher
    assert teacher is not None
    teacher.free_seat(name)
    return message(f"Freed {name}'s seat: that browser counts by network address again, and its runs stay.", "ok")


def class_closed(studio: Studio) -> str:
    teacher = studio.teacher
    assert teacher is not None
    teacher.close_class()
    return message("The class is closed: no code, no seats. Learners' runs stay; they count by network address "
                   "again.", "ok")


def connect_seat(shared: Shared, panel: SeatPanel, page_loaded: Any) -> None:
    """The seat's events; ``page_loaded``: the page's load, after which its visitor is its browser's."""
    studio = shared.studio
    panel.sit.click(functools.partial(take_seat, studio), [panel.code, panel.name],
                    [panel.code, panel.status, panel.timer], api_name="class_sit")
    page_loaded.then(functools.partial(seat_opened, studio), [panel.seen],
                     [panel.status, panel.timer, panel.seen, panel.due], api_visibility="private",
                     show_progress="hidden")
    panel.timer.tick(functools.partial(handout_due, studio), [panel.seen], [panel.seen, panel.due],
                     api_visibility="private", show_progress="hidden")
