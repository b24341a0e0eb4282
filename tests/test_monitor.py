"""Cheap incremental reads of a run directory, and health alerts that fire exactly on their conditions."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from dragon_ui import monitor, training
from dragon_ui.config import RunConfig
from dragon_ui.monitor import health_alerts, read_snapshot
from dragon_ui.runstore import RunDir

pytestmark = pytest.mark.timeout(240)


def progress_row(step: int, **values) -> dict:
    """A healthy progress row; ``values`` override its fields."""
    row = {"step": step, "reward": 0.5, "reward_std": 0.3, "reward_numeric": 0.5, "kl": 0.01, "completion_len": 10.0,
           "clipped_ratio": 0.1, "frac_reward_zero_std": 0.25, "errors_numeric": 0}
    return {**row, **values}


@pytest.fixture
def run(tmp_path) -> RunDir:
    run = RunDir(tmp_path / "20250101-000000-test")
    run.path.mkdir()
    run.update_status(state="running", step=1, total_steps=10)
    run.append_progress(progress_row(1))
    run.append_rollouts({"step": 1, "groups": []})
    run.log_path.write_text("09:00:00 INFO step 1/10\n", encoding="utf-8")
    return run


def test_first_snapshot_reads_everything(run):
    snap = read_snapshot(run.path)
    assert snap.status_changed and snap.progress_changed and snap.rollouts_changed and snap.log_changed
    assert snap.status["state"] == "running" and snap.active
    assert [row["step"] for row in snap.progress] == [1]
    assert snap.rollouts == {"step": 1, "groups": []}
    assert snap.log == "09:00:00 INFO step 1/10"


def test_nothing_changed_means_nothing_read(run, monkeypatch):
    first = read_snapshot(run.path)
    reads = []
    monkeypatch.setattr(monitor, "read_jsonl", lambda *args: reads.append(args) or ([], 0))
    monkeypatch.setattr(RunDir, "read_status", lambda self: pytest.fail("status re-read although unchanged"))
    monkeypatch.setattr(RunDir, "log_tail", lambda self, n: pytest.fail("log re-read although unchanged"))
    again = read_snapshot(run.path, since=first.to_state())
    assert not again.changed and reads == []
    assert again.progress == first.progress and again.status == first.status and again.log == first.log


@pytest.mark.parametrize("part", ["progress", "rollouts", "status", "log"])
def test_only_what_changed_is_flagged(run, part):
    first = read_snapshot(run.path)
    if part == "progress":
        run.append_progress(progress_row(2))
    elif part == "rollouts":
        run.append_rollouts({"step": 2, "groups": [{"prompt": "p", "reference": "r", "completions": []}]})
    elif part == "status":
        run.update_status(phase="training")
    else:
        with open(run.log_path, "a", encoding="utf-8") as fh:
            fh.write("09:00:05 INFO step 2/10\n")
    snap = read_snapshot(run.path, since=first.to_state())
    flags = {"progress": snap.progress_changed, "rollouts": snap.rollouts_changed, "status": snap.status_changed,
             "log": snap.log_changed}
    assert flags == {name: name == part for name in flags}
    assert [row["step"] for row in snap.progress] == ([1, 2] if part == "progress" else [1])
    assert snap.rollouts["step"] == (2 if part == "rollouts" else 1)
    assert snap.status.get("phase") == ("training" if part == "status" else None)
    assert snap.log.endswith("step 2/10") == (part == "log")


def test_only_new_rows_are_read(run):
    first = read_snapshot(run.path)
    for step in (2, 3):
        run.append_progress(progress_row(step))
    with open(run.progress_path, "a", encoding="utf-8") as fh:
        fh.write('{"step": 4, "rew')  # a row still being written is left for the next poll
    second = read_snapshot(run.path, since=first.to_state())
    assert [row["step"] for row in second.progress] == [1, 2, 3]
    with open(run.progress_path, "a", encoding="utf-8") as fh:
        fh.write('ard": 1.0}\n')
    third = read_snapshot(run.path, since=second.to_state())
    assert [row["step"] for row in third.progress] == [1, 2, 3, 4]
    assert third.cursor["progress"][1] == run.progress_path.stat().st_size


def test_a_resume_that_rewrites_the_files_resets_the_rows(run):
    for step in (2, 3):
        run.append_progress(progress_row(step))
        run.append_rollouts({"step": step, "groups": []})
    before = read_snapshot(run.path)
    run.truncate_after_step(1)  # what resuming from checkpoint-1 does
    run.append_progress(progress_row(2, reward=0.9))
    snap = read_snapshot(run.path, since=before.to_state())
    assert snap.progress_changed and [(r["step"], r["reward"]) for r in snap.progress] == [(1, 0.5), (2, 0.9)]
    assert snap.rollouts_changed and snap.rollouts["step"] == 1


def test_a_snapshot_of_another_run_starts_over(run, tmp_path):
    other = RunDir(tmp_path / "other")
    other.path.mkdir()
    other.update_status(state="succeeded")
    snap = read_snapshot(other.path, since=read_snapshot(run.path).to_state())
    assert snap.changed and snap.progress == [] and snap.rollouts is None and snap.status["state"] == "succeeded"


def test_a_dead_training_process_is_noticed_without_any_file_changing(run, monkeypatch):
    finished = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    run.mark_owner()
    run.update_status(pid=int(finished.stdout))  # a process that no longer exists
    monkeypatch.setattr(monitor, "STATUS_RECHECK_S", 3600.0)
    status = json.loads(run.status_path.read_text())
    first = read_snapshot(run.path, since={"run_dir": str(run.path), "status": status, "progress": [], "rollouts": None,
                                           "log": "", "cursor": {"status": monitor._stamp(run.status_path),
                                                                 "status_read_at": time.time()}})
    assert first.status["state"] == "running"  # unchanged file, recheck not due: not read
    monkeypatch.setattr(monitor, "STATUS_RECHECK_S", 0.0)
    second = read_snapshot(run.path, since=first.to_state())
    assert second.status_changed and second.status["state"] == "failed"
    assert "stopped unexpectedly" in second.status["error"]


def test_snapshots_follow_a_real_training_run(tiny_config_dict):
    """Polling while a tiny run trains gives, row for row, what the run wrote, and ends on its final state."""
    handle = training.start(RunConfig.from_dict(tiny_config_dict))
    state: dict | None = None
    seen_states = set()
    while True:
        alive = handle.is_alive()
        snap = read_snapshot(handle.run.path, since=state)
        state = snap.to_state()
        seen_states.add(snap.status.get("state"))
        if not alive:
            break
        handle.thread.join(0.05)
    final = read_snapshot(handle.run.path, since=state)
    assert not final.changed
    assert snap.status["state"] == "succeeded" and not snap.active
    assert snap.progress == handle.run.read_progress() and [r["step"] for r in snap.progress] == [1, 2]
    assert snap.rollouts == handle.run.read_rollouts()[-1] and len(snap.rollouts["groups"]) == 2
    assert "step 2/2" in snap.log and len(snap.log.splitlines()) <= monitor.LOG_LINES
    assert seen_states & {"queued", "running"}


# ----------------------------------------------------------------------------------------------------------------
# Health alerts.

CONFIG = {"grpo": {"group_size": 4, "temperature": 1.0, "max_new_tokens": 16, "beta": 0.04},
          "training": {"learning_rate": 1e-5}}


def titles(rows: list[dict], status: dict | None = None, log: str = "") -> list[str]:
    return [alert.title for alert in health_alerts(rows, status or {}, CONFIG, log)]


def steps(n: int, **values) -> list[dict]:
    return [progress_row(step, **values) for step in range(1, n + 1)]


@pytest.mark.parametrize("rows", [[], steps(1), steps(10)])
def test_a_healthy_run_has_no_alerts(rows):
    assert titles(rows) == []


@pytest.mark.parametrize(("rows", "expected"), [
    (steps(3, frac_reward_zero_std=1.0), ["Every completion in a group gets the same reward"]),
    (steps(3, frac_reward_zero_std=0.9), ["Every completion in a group gets the same reward"]),
    (steps(3, frac_reward_zero_std=1.0, reward=0.0, reward_numeric=0.0),
     ["Every completion scores 0, so there is nothing to learn from"]),
    (steps(2, frac_reward_zero_std=1.0), []),  # too few steps to tell
    (steps(5) + steps(2, frac_reward_zero_std=1.0), []),  # only the last two
    (steps(3, frac_reward_zero_std=0.85), []),
])
def test_no_spread_alert_needs_the_last_three_steps(rows, expected):
    assert titles(rows) == expected


@pytest.mark.parametrize(("clipped", "fires"), [([0.6, 0.6, 0.6], True), ([0.0, 0.0, 1.0], False),
                                                ([0.5, 0.5, 0.5], False), ([0.0, 0.8, 0.8], True)])
def test_length_cap_alert(clipped, fires):
    rows = [progress_row(i + 1, clipped_ratio=c) for i, c in enumerate(clipped)]
    alerts = health_alerts(rows, {}, CONFIG)
    assert [a.title.startswith("Most completions hit the length cap") for a in alerts] == ([True] if fires else [])
    if fires:
        assert "now 16" in alerts[0].fix


@pytest.mark.parametrize(("kl", "fires"), [
    ([0.01] * 6, False),
    ([1.5] * 3, True),  # high, however it got there
    ([0.02, 0.02, 0.02, 0.2, 0.3, 0.4], True),  # more than 3x in three steps, above 0.1
    ([0.01, 0.01, 0.01, 0.05, 0.06, 0.07], False),  # grew 6x but still tiny
    ([0.2, 0.2, 0.2, 0.3, 0.3, 0.3], False),  # above 0.1 but not fast
    ([None] * 6, False),  # beta 0: no KL logged
])
def test_kl_alert(kl, fires):
    rows = [progress_row(i + 1, kl=value) for i, value in enumerate(kl)]
    alerts = health_alerts(rows, {}, CONFIG)
    assert [a.title.startswith("KL is rising fast") for a in alerts] == ([True] if fires else [])
    if fires:
        assert "learning rate (now 1e-05)" in alerts[0].fix and "beta (now 0.04)" in alerts[0].fix


def test_reward_errors_alert_quotes_the_first_error_from_the_log():
    log = ("09:00:01 INFO step 1/4\n09:00:01 WARNING Reward 'numeric' failed on some completions (scored 0); "
           "first error: ValueError: could not convert 'x' to a number\n")
    rows = steps(2, errors_numeric=3, errors_custom=0)
    (alert,) = health_alerts(rows, {}, CONFIG, log)
    assert alert.level == "error"
    assert alert.title == "The reward 'numeric' failed on 3 completions so far (they scored 0)"
    assert alert.fix.startswith("First error: ValueError: could not convert 'x' to a number")
    (from_status,) = health_alerts([], {"reward_errors": {"custom": 1}}, CONFIG)
    assert from_status.title.startswith("The reward 'custom' failed on 1 completion so")
    assert from_status.fix.startswith("Its first error is in the run's log")
    assert health_alerts(steps(2, errors_numeric=0), {"reward_errors": {"numeric": 0}}, CONFIG) == []
