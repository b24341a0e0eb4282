"""A class of 25 on one machine, against the real app in public mode started with a class code (as
tests/test_public_attacks.py starts it): 25 learners behind one network address each take a seat and start a
5-step run of the default recipe, none is refused for the address, each sees its place in the queue and when it
should start, and the teacher's board lists the 25 seats; a visitor without the code is still counted by the
address. The teacher then stops everything."""

from __future__ import annotations

import re
import secrets
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import test_public_attacks as attacks
from raw_gradio import RawVisitor
from test_public_attacks import OWNER_KEY, TOKEN_STORE

from dragon_ui.runstore import ACTIVE_STATES, RunDir
from dragon_ui.studio.recipes import DEFAULT_RECIPE

demo = attacks.demo  # its fixture, used here by name
pytestmark = [pytest.mark.timeout(900), pytest.mark.slow]
CODE = f"class-{secrets.token_hex(4)}"
LEARNERS = 25
OWNER_STORE = "dragon-grpo-studio-owner-key"


@pytest.fixture(scope="module")
def demo_limits() -> dict:
    return {"DRAGON_UI_CLASS_CODE": CODE, "DRAGON_UI_MAX_RUNS_PER_ADDRESS": "1"}


def five_steps(learner: RawVisitor, model_dir) -> dict:
    """The default recipe, as the HTTP API hands it out, on the tiny model for 5 short steps."""
    config = learner.call("recipe", DEFAULT_RECIPE).data[0]
    config["model"] = {**config["model"], "id": str(model_dir)}
    config["grpo"] = {**config["grpo"], "group_size": 2, "max_new_tokens": 8}
    config["training"] = {**config["training"], "max_steps": 5, "batch_size": 2, "grad_accum": 1}
    config["hardware"] = {**config["hardware"], "device": "cpu", "cpu_threads": 1}
    return config


def seated(demo, number: int) -> RawVisitor:
    learner = RawVisitor(demo.app)
    learner.open_page(**{TOKEN_STORE: secrets.token_urlsafe(24)})
    answer = learner.call("class_sit", CODE, f"Learner {number:02d}")
    assert answer.ok and f"You sit as **Learner {number:02d}**" in answer.data[1], answer
    return learner


def started(learner: RawVisitor, config: dict) -> str:
    answer = learner.call("start", config)
    assert answer.ok, answer.error
    return answer.data[0]


def turn_seen(learner: RawVisitor, run_id: str) -> str:
    """The Train tab's status line of the learner's run, as their page shows it once they open it."""
    assert learner.call("train_runs").ok  # the list of runs as it is now, to choose from
    opened = learner.call("train_open", run_id)
    assert opened.ok, opened.error
    answer = learner.call("train_tick")
    return learner.app.output(learner.app.api("train_tick"), answer, "train-status")


def test_a_class_of_25_behind_one_address_trains_with_a_seat_each(demo, tiny_model_dir):
    with ThreadPoolExecutor(LEARNERS) as pool:
        learners = list(pool.map(lambda number: seated(demo, number), range(LEARNERS)))
    config = five_steps(learners[0], tiny_model_dir)
    with ThreadPoolExecutor(LEARNERS) as pool:  # all at once: none is refused for the address they share
        run_ids = list(pool.map(lambda learner: started(learner, config), learners))
    assert len(set(run_ids)) == LEARNERS
    seats = {RunDir(demo.runs / run_id).read_status()["seat"] for run_id in run_ids}
    assert seats == {f"Learner {number:02d}" for number in range(LEARNERS)}

    stranger, another = RawVisitor(demo.app), RawVisitor(demo.app)  # no code: counted by the address, as before
    for visitor in (stranger, another):
        visitor.open_page(**{TOKEN_STORE: secrets.token_urlsafe(24)})
    strangers_run = started(stranger, config)
    refused = another.call("start", config)
    assert not refused.ok and "1 runs from your network address are already training or waiting" in refused.error

    turns = [turn_seen(learner, run_id) for learner, run_id in zip(learners, run_ids, strict=True)]
    waiting = [turn for turn in turns if "Waiting in the queue" in turn]
    assert len(waiting) >= LEARNERS - 3, turns  # the first have started, or finished, meanwhile
    for turn in waiting:
        assert re.search(r"\d+(st|nd|rd|th) in line; expected to start in about \d", turn), turn

    teacher = RawVisitor(demo.app)
    teacher.open_page(**{TOKEN_STORE: secrets.token_urlsafe(24), OWNER_STORE: OWNER_KEY})
    board = teacher.call("class_board")
    assert board.ok, board.error
    table = teacher.app.output(teacher.app.api("class_board"), board, "class-board-table")
    assert [row[0] for row in table["data"]] == [f"Learner {number:02d}" for number in range(LEARNERS)]
    assert [row[1] for row in table["data"]] == run_ids  # by name, as learners were numbered
    assert "25 seats taken; the queue is running" in board.data[0]
    waiting_rows = [row for row in table["data"] if row[2] == "waiting"]
    assert waiting_rows and all(re.search(r"in line; expected to start in about", row[3]) for row in waiting_rows)
    assert all(row[7] == "numeric × 1, length × 0.3" for row in table["data"])  # the default recipe's rewards
    learner_asks = learners[0].call("class_board")
    assert learner_asks.ok and "Only this demo's owner can see the class board" in learner_asks.data[0]

    stopped = teacher.call("class_stop_all")
    assert stopped.ok, stopped.error
    deadline = time.monotonic() + 180
    every = [*run_ids, strangers_run]
    while any(RunDir(demo.runs / run_id).read_status()["state"] in ACTIVE_STATES for run_id in every):
        assert time.monotonic() < deadline, "the runs did not stop"
        time.sleep(1)
