"""The run queue: Start while another run trains queues the run; queued runs start by themselves, one after another,
and survive a restart of the app; a queued run can be taken out; a public demo caps the queue."""

from __future__ import annotations

import time

import pytest
from conftest import ended, uploaded_by

from dragon_ui import public
from dragon_ui.public import LAPTOP
from dragon_ui.config import RunConfig
from dragon_ui.engine import queue, training
from dragon_ui.errors import BusyError
from dragon_ui.studio.backend import Studio

pytestmark = pytest.mark.timeout(300)


def place_in_line(run) -> int | None:
    """1 for the next run to start, 2 for the one after it; None for a run that is not waiting."""
    ids = [waiting.id for waiting in queue.waiting_runs(run.path.parent)]
    return ids.index(run.id) + 1 if run.id in ids else None


def wait_for(condition, timeout: float = 120, what: str = "") -> None:
    deadline = time.time() + timeout
    while not condition():
        assert time.time() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def long_config(config: dict, name: str) -> dict:
    return {**config, "name": name, "training": {**config["training"], "max_steps": 500, "save_steps": 1}}


def test_runs_started_while_one_trains_wait_their_turn_and_start_by_themselves(studio, tiny_config_dict, runs_dir):
    first = studio.runs.start(long_config(tiny_config_dict, "first"))
    wait_for(lambda: first.read_progress(), what="the first step")
    second = studio.runs.start({**tiny_config_dict, "name": "second"})
    third = studio.runs.start({**tiny_config_dict, "name": "third"})
    assert [second.read_status()["waiting"], third.read_status()["waiting"]] == ["start", "start"]
    assert second.read_status()["state"] == "queued" and place_in_line(third) == 2
    assert studio.runs.place(second.id).startswith("1st in line; ")
    assert studio.runs.active_ids() == [first.id]

    studio.runs.stop(third.id)  # out of the queue, kept to be resumed later
    assert third.read_status()["state"] == "cancelled" and place_in_line(third) is None
    assert "taken out of the queue" in third.read_status()["stop_reason"]

    scheduler = studio.runs.start_queue()
    try:
        looked = scheduler.rounds
        wait_for(lambda: scheduler.rounds >= looked + 2, what="the scheduler to look at the queue twice")
        assert second.read_status()["state"] == "queued"  # nothing starts while the first run trains
        studio.runs.stop(first.id)
        wait_for(lambda: second.read_status()["state"] == "succeeded", what="the second run to start and finish")
        assert first.read_status()["state"] == "cancelled"
        assert third.read_status()["state"] == "cancelled"  # taken out: it does not start by itself
    finally:
        scheduler.stop()


def test_the_queue_is_the_runs_folder_and_survives_a_restart(studio, tiny_config_dict, runs_dir):
    first = studio.runs.start(long_config(tiny_config_dict, "first"))
    waiting = studio.runs.start({**tiny_config_dict, "name": "waiting"})
    studio.runs.stop(first.id)
    assert ended(first) == "cancelled"
    assert waiting.read_status()["waiting"] == "start"  # no scheduler ran: it still waits, as after a crash
    resumed = studio.runs.resume(first.id)  # a resume while one waits queues behind it
    assert resumed.read_status()["waiting"] == "resume" and place_in_line(resumed) == 2

    scheduler = queue.Scheduler(runs_dir, interval_s=0.2, policy=LAPTOP, workers=studio.workers).start()  # "the app started again"
    try:
        wait_for(lambda: waiting.read_status()["state"] == "succeeded", what="the waiting run")
        wait_for(lambda: resumed.read_status().get("resumed_at"), what="the queued resume to start")
        status = resumed.read_status()
        assert status["state"] in ("running", "queued") and not status.get("waiting")
        studio.runs.stop(first.id)
        wait_for(lambda: not training.active_runs(), what="the resumed run to stop")
    finally:
        scheduler.stop()


def test_a_queued_run_that_cannot_start_is_marked_failed_and_the_queue_goes_on(studio, tiny_config_dict, runs_dir):
    first = studio.runs.start(long_config(tiny_config_dict, "first"))
    broken = studio.runs.start({**tiny_config_dict, "name": "broken"})
    after = studio.runs.start({**tiny_config_dict, "name": "after"})
    broken.config_path.write_text("{not json", encoding="utf-8")
    studio.runs.stop(first.id)
    assert ended(first) == "cancelled"
    assert queue.start_next(runs_dir, policy=LAPTOP, workers=studio.workers) == []
    assert broken.read_status()["state"] == "failed" and "could not start when its turn came" in \
        broken.read_status()["error"]
    (started,) = queue.start_next(runs_dir, policy=LAPTOP, workers=studio.workers)
    assert started.id == after.id
    assert ended(started) == "succeeded"


def test_a_public_demo_caps_the_queue(studio, tiny_config_dict, monkeypatch, tiny_model_dir, training_processes):
    monkeypatch.setenv(public.PUBLIC_ENV, "1")
    monkeypatch.setenv(public.MODELS_ENV, str(tiny_model_dir))
    monkeypatch.setenv("DRAGON_UI_MAX_QUEUE", "1")
    studio = Studio(runs_dir=studio.runs_dir, policy=public.Policy.from_env(studio.runs_dir),  # as the app would start
                    workers=training_processes(public=True))
    tiny_config_dict["data"]["source"] = uploaded_by("v", tiny_config_dict["data"]["source"])
    with public.visiting(public.Visitor(key="v")):
        first = studio.runs.start(long_config(tiny_config_dict, "first"))
        studio.runs.start(tiny_config_dict)
        with pytest.raises(BusyError, match="The queue is full: 1 runs are already waiting"):
            queue.submit_start(RunConfig.from_dict(tiny_config_dict, policy=LAPTOP), policy=studio.policy, workers=studio.workers)
        studio.runs.stop(first.id)
