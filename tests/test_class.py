"""A class on one shared machine, rule by rule: the class code, seats and their names, each seat's share and the
class's total, turns by seat, the teacher's board and what only the teacher may do. tests/test_class_e2e.py plays a
whole class of 25 against the running app."""

from __future__ import annotations

import hashlib
import time

import pytest
from conftest import demo, ended, turn_public_mode_on, uploaded_by

from dragon_ui import data, public
from dragon_ui.engine import public_checks, queue
from dragon_ui.errors import BusyError, ConfigError, NotYoursError
from dragon_ui.studio import visitors as visitors_module
from dragon_ui.studio.backend import Studio
from dragon_ui.studio.classroom import Classroom, seat_name
from dragon_ui.studio.visitors import WRONG_CODES_PER_ADDRESS, WRONG_CODES_PER_PAGE, WRONG_KEYS_ALLOWED, Visitors

pytestmark = pytest.mark.timeout(300)
CODE = "dragons-of-room-4"


@pytest.fixture
def public_mode(monkeypatch, tiny_model_dir, runs_dir):
    turn_public_mode_on(monkeypatch, tiny_model_dir)
    monkeypatch.setattr(public_checks, "_starts", public.Allowance(window_s=3600))


def classroom(folder, code: str = CODE, **limits) -> Classroom:
    return Classroom(folder, code, public.Limits(**limits))


@pytest.mark.parametrize("code, refusal", [
    ("", None),
    ("   ", None),
    ("short", "must have at least 6 characters"),
    (CODE, None),
])
def test_a_class_code_too_short_to_resist_guessing_is_refused_when_the_app_starts(monkeypatch, runs_dir, code,
                                                                                   refusal):
    monkeypatch.setenv(public.PUBLIC_ENV, "1")
    monkeypatch.setenv(public.CLASS_CODE_ENV, code)
    if refusal:
        with pytest.raises(ConfigError, match=f"DRAGON_UI_CLASS_CODE {refusal}"):
            public.Policy.from_env(runs_dir)
    else:
        assert public.Policy.from_env(runs_dir).class_code == code.strip()
    assert public.CLASS_CODE_ENV not in public.without_secrets({public.CLASS_CODE_ENV: code or "x"})


@pytest.mark.parametrize("typed, shown, refusal", [
    ("Ana", "Ana", None),
    ("  Ana   Lima ", "Ana Lima", None),
    ("Zoë O'Neil-Ng", "Zoë O'Neil-Ng", None),
    ("<img src=x onerror=alert(1)>", None, r"letters, digits, spaces and \. ' - _ only"),
    ("[me](javascript:alert(1))", None, r"letters, digits, spaces and \. ' - _ only"),
    ("", None, "Type your name"),
    ("   ", None, "Type your name"),
    (None, None, "Type your name"),
    (["Ana"], None, "Type your name"),
    ("x" * 41, None, "at most 40 characters"),
    ("Ana\x00", None, r"letters, digits, spaces and \. ' - _ only"),
    ("Ana\u202eevil", None, r"letters, digits, spaces and \. ' - _ only"),  # text drawn right to left
    ("Ａna", "Ana", None),  # full-width: one spelling of each letter
    ("\u3164", None, r"letters, digits, spaces and \. ' - _ only"),  # a letter that draws nothing
    ("Ana\u3164", None, r"letters, digits, spaces and \. ' - _ only"),
    ("._.", None, "has a letter in it"),
    ("42", None, "has a letter in it"),
])
def test_a_seats_name_is_what_was_typed_tidied(typed, shown, refusal):
    if refusal:
        with pytest.raises(ConfigError, match=refusal):
            seat_name(typed)
    else:
        assert seat_name(typed) == shown


def test_a_seat_is_its_browsers_through_a_reload_and_a_restart(tmp_path):
    visitors = Visitors(classroom=classroom(tmp_path, class_seats=2))
    token = visitors.arrive("page", None)
    stranger = visitors.of("page", address="room")
    assert not stranger.seat and stranger.address == "room"
    seated = visitors.sit(stranger, f"  {CODE} ", "Ana")
    assert seated.seat == "Ana" and seated.address == public.seat_address(stranger.key) != "room"
    visitors.arrive("reloaded", token)
    assert visitors.of("reloaded", address="room") == seated
    assert visitors.turn_of("reloaded", "room") == seated.address and visitors.turn_of("other", "room") == "room"

    restarted = Visitors(classroom=Classroom(tmp_path, "", public.Limits(class_seats=2)))  # no code in its environment
    restarted.arrive("after-restart", token)
    assert restarted.of("after-restart", address="room").seat == "Ana"
    assert restarted.classroom is not None and not restarted.classroom.open  # the environment's code is its own

    with pytest.raises(ConfigError, match="A seat named 'ana' is taken already"):
        visitors.sit(visitors.of("bob", address="room"), CODE, "ana")
    assert visitors.sit(visitors.of("bob", address="room"), CODE, "Bob").seat == "Bob"
    assert visitors.sit(seated, CODE, "Ana L.").seat == "Ana L."  # a seat is renamed, not a seat more
    with pytest.raises(BusyError, match="All 2 seats of this class are taken"):
        visitors.sit(visitors.of("carol", address="room"), CODE, "Carol")


def test_the_code_given_on_the_owner_panel_is_kept_unless_the_environment_sets_one(tmp_path):
    room = classroom(tmp_path, code="")
    assert not room.open and not room.is_code("")
    with pytest.raises(ConfigError, match="at least 6 characters"):
        room.set_code("abc")
    room.set_code("a-new-code")
    assert room.open and room.is_code("a-new-code") and not room.is_code("a-new-cod")
    assert classroom(tmp_path, code="").is_code("a-new-code")
    started_with = classroom(tmp_path, code=CODE)
    assert started_with.is_code(CODE) and not started_with.is_code("a-new-code")
    kept = "".join(path.read_text() for path in (tmp_path / ".class").iterdir())
    assert "a-new-code" not in kept and hashlib.sha256(b"a-new-code").hexdigest() not in kept  # salted, slow
    room.sit("ana", "Ana")
    room.close()
    assert not room.open and room.seats() == [] and not classroom(tmp_path, code="").open
    assert classroom(tmp_path, code="").seats() == []


def test_no_seat_without_a_class_or_with_a_wrong_code(tmp_path):
    visitors = Visitors(classroom=classroom(tmp_path, code=""))
    with pytest.raises(ConfigError, match="This demo has no class open"):
        visitors.sit(visitors.of("page", address="room"), CODE, "Ana")
    visitors = Visitors(classroom=classroom(tmp_path / "open"))
    for code, refusal in ((None, "Type the class code"), ("  ", "Type the class code"), ("wrong", "not this class")):
        with pytest.raises(ConfigError, match=refusal):
            visitors.sit(visitors.of("page", address="room"), code, "Ana")
    with pytest.raises(ConfigError, match="A seat is taken from a page"):
        visitors.sit(public.NOBODY, CODE, "Ana")


def test_wrong_class_codes_hold_up_a_page_then_its_address_and_are_not_compared(tmp_path, monkeypatch):
    """A page that mistypes a few times waits; a guesser opening a new page per guess is held up once their address
    has sent many (then every page there waits, until the teacher opens the class again), and a held-up guess is
    not even compared: it costs no hashing. Owner keys are counted apart."""
    visitors = Visitors(owner_key="the-owner-key", classroom=classroom(tmp_path))
    compared = []
    real_is_code = visitors.classroom.is_code
    monkeypatch.setattr(visitors.classroom, "is_code", lambda code: compared.append(code) or real_is_code(code))
    for attempt in range(WRONG_CODES_PER_PAGE):
        with pytest.raises(ConfigError, match="not this class's code"):
            visitors.sit(visitors.of("mistyper", address="room"), f"typo-{attempt}", "Eve")
    with pytest.raises(BusyError, match="Too many wrong class codes from this page; try again in 15 minutes"):
        visitors.sit(visitors.of("mistyper", address="room"), CODE, "Eve")
    assert visitors.sit(visitors.of("neighbour", address="room"), CODE, "Ana").seat == "Ana"

    for attempt in range(WRONG_CODES_PER_ADDRESS - WRONG_CODES_PER_PAGE):
        with pytest.raises(ConfigError, match="not this class's code"):
            visitors.sit(visitors.of(f"guess-{attempt}", address="room"), f"guess-{attempt}", "Eve")
    guesses = len(compared)
    for page in ("neighbour", "a-new-page"):
        with pytest.raises(BusyError, match="Too many wrong class codes from your network address; try again in 15 "
                                            "minutes, or ask your teacher to open the class again"):
            visitors.sit(visitors.of(page, address="room"), CODE, "Eve")
    assert len(compared) == guesses  # refused before the code was hashed
    assert visitors.sit(visitors.of("elsewhere", address="home"), CODE, "Bob").seat == "Bob"
    assert visitors.unlock(visitors.of("owner", address="room"), "the-owner-key").owns_everything
    visitors.forgive(visitors_module.CLASS_CODE)  # the teacher opened the class again
    assert visitors.sit(visitors.of("mistyper", address="room"), CODE, "Eve").seat == "Eve"
    for attempt in range(WRONG_CODES_PER_PAGE):
        with pytest.raises(ConfigError):
            visitors.sit(visitors.of("carol", address="room"), f"typo-{attempt}", "Carol")
    later = time.monotonic() + visitors_module.WRONG_KEYS_WINDOW_S
    monkeypatch.setattr(visitors_module.time, "monotonic", lambda: later)
    assert visitors.sit(visitors.of("carol", address="room"), CODE, "Carol").seat == "Carol"


def test_a_seated_learners_wrong_owner_keys_count_by_their_network_address(tmp_path):
    """A seat is counted as an address of its own for shares, not for guesses: one person may hold many seats."""
    visitors = Visitors(owner_key="the-owner-key", classroom=classroom(tmp_path))
    seats = [visitors.sit(visitors.of(f"seat-{number}", address="room"), CODE, f"Seat {number}")
             for number in range(3)]
    for attempt in range(WRONG_KEYS_ALLOWED):
        assert visitors.unlock(seats[attempt % 3], f"guess-{attempt}") is None
    with pytest.raises(BusyError, match="Too many wrong owner keys from your network address"):
        visitors.unlock(seats[0], "the-owner-key")


def test_the_teachers_controls_are_the_owners_alone(public_mode, studio, tiny_config_dict):
    teacher = studio.teacher
    learner = public.Visitor(key="ana", address=public.seat_address("ana"), seat="Ana")
    with public.visiting(learner):
        for act in (teacher.board, teacher.stop_all, lambda: teacher.pause_queue(True), teacher.close_class,
                    lambda: teacher.free_seat("Ana"),
                    lambda: teacher.open_class(CODE), lambda: teacher.hand_out(tiny_config_dict),
                    lambda: teacher.seat_run(0)):
            with pytest.raises(NotYoursError, match="Only this demo's owner can"):
                act()
    owner = public.Visitor(key="teacher", unlocked=True)
    with public.visiting(owner):
        made = teacher.open_class("")  # none typed: one is made, that nobody guesses
        assert len(made) == 10 and studio.classroom.is_code(made)
        assert teacher.open_class("  ") == "" and studio.classroom.is_code(made)  # open: its code stays
        assert teacher.open_class(CODE) == "" and studio.classroom.is_code(CODE)
        upload = uploaded_by("teacher", tiny_config_dict["data"]["source"])
        with pytest.raises(ConfigError, match="A learner could not start these settings: .*upload"):
            teacher.hand_out({**tiny_config_dict, "data": {**tiny_config_dict["data"], "source": upload}})
        bundled = {**tiny_config_dict, "data": {**tiny_config_dict["data"],
                                                "source": str(data.BUNDLED_DATASETS_DIR / "arithmetic.csv")}}
        first, second = teacher.hand_out(bundled), teacher.hand_out(bundled)
        assert second.number > first.number and second.draft["data"]["source"] == "arithmetic.csv"
        assert studio.classroom.handout() == second
        studio.classroom.close()  # a browser keeps the last number it was offered: a later hand-out is higher
        studio.classroom.set_code(CODE)
        assert teacher.hand_out(bundled).number > second.number
        teacher.pause_queue(True)
        assert teacher.queue_paused()
        teacher.pause_queue(False)
        assert not teacher.queue_paused()


def long_run(config: dict, name: str) -> dict:
    bundled = {**config["data"], "source": str(data.BUNDLED_DATASETS_DIR / "arithmetic.csv")}
    return {**config, "name": name, "data": bundled,
            "training": {**config["training"], "max_steps": 5000, "save_steps": 5000}}


def test_each_seat_has_an_addresses_share_and_the_class_a_total(public_mode, studio, tiny_config_dict,
                                                                monkeypatch, training_processes):
    """One room, one network address: strangers share its limits, each seat has its own, the class its total."""
    for env, value in (("DRAGON_UI_MAX_RUNS_PER_ADDRESS", "2"), ("DRAGON_UI_MAX_STARTS_PER_HOUR", "3"),
                       ("DRAGON_UI_CLASS_RUNS", "3"), ("DRAGON_UI_MAX_QUEUE", "3")):
        monkeypatch.setenv(env, value)
    studio = Studio(runs_dir=studio.runs_dir, policy=demo(), workers=training_processes(public=True))
    room = Visitors(classroom=studio.classroom)
    studio.classroom.set_code(CODE)
    seats = [room.sit(room.of(f"learner-{number}", address="room"), CODE, f"Learner {number}") for number in range(3)]
    config = long_run(tiny_config_dict, "class")
    runs = []
    with public.visiting(seats[0]):
        runs += [studio.runs.start(config), studio.runs.start(config)]  # more than the address allows strangers
        with pytest.raises(BusyError, match="You already have 2 runs training or waiting"):
            studio.runs.start(config)
    with public.visiting(seats[1]):
        runs.append(studio.runs.start(config))
    with public.visiting(seats[2]), pytest.raises(BusyError, match="The class has 3 runs training or waiting"):
        studio.runs.start(config)
    assert [run.read_status()["seat"] for run in runs] == ["Learner 0", "Learner 0", "Learner 1"]
    strangers = [public.Visitor(key=f"stranger-{number}", address="room") for number in range(3)]
    with public.visiting(strangers[0]):  # the class's runs fill neither the address's share nor the queue
        runs.append(studio.runs.start(config))
    with public.visiting(strangers[1]):
        runs.append(studio.runs.start(config))
    with public.visiting(strangers[2]), pytest.raises(BusyError, match="2 runs from your network address are "
                                                                       "already training or waiting"):
        studio.runs.start(config)
    with public.visiting(public.Visitor(key="teacher", unlocked=True)):
        assert studio.teacher.stop_all() == 5
    assert [ended(run) for run in runs] == ["cancelled"] * 5
    with public.visiting(seats[0]):
        runs.append(studio.runs.start(config))
        with pytest.raises(BusyError, match="3 runs were started from your seat in the last hour"):
            studio.runs.start(config)
    with public.visiting(strangers[2]):  # the address's own starts: 2 of its 3 were spent
        runs.append(studio.runs.start(config))
        with pytest.raises(BusyError, match="3 runs were started from your network address in the last hour"):
            studio.runs.start(config)
    with public.visiting(public.Visitor(key="teacher", unlocked=True)):
        board = studio.teacher.board()
        assert [row[0] for row in board] == ["Learner 0", "Learner 1", "Learner 2"]
        assert board[0][1] == runs[-2].id and board[2][1:3] == ["", "no run yet"]
        assert studio.teacher.seat_run(0) == runs[-2].id and studio.teacher.seat_run(1) == runs[2].id
        for row, refusal in ((2, "Learner 2 has no run yet"), (3, "Click a seat's row"), (-1, "Click a seat's row"),
                             ("0", "Click a seat's row"), (True, "Click a seat's row")):
            with pytest.raises(ConfigError, match=refusal):
                studio.teacher.seat_run(row)
        for name in ("Nobody", None, ["Learner 2"]):
            with pytest.raises(ConfigError, match="Choose a seat of the class to free"):
                studio.teacher.free_seat(name)
        studio.teacher.free_seat("Learner 2")
        assert [row[0] for row in studio.teacher.board()] == ["Learner 0", "Learner 1"]
        assert studio.teacher.stop_all() == 2
    assert [ended(run) for run in runs[-2:]] == ["cancelled"] * 2
    assert queue.waiting_runs(studio.runs_dir) == []
