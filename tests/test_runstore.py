"""Tests for dragon_ui.runstore: the run folder contract between the trainer (writer) and the UI and CLI (readers)."""

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dragon_ui import runstore
from dragon_ui.config import RunConfig
from dragon_ui.runstore import RunDir, append_jsonl, list_runs, read_json, read_appended_rows, write_json_atomic
from dragon_ui.public import LAPTOP

MINIMAL_CONFIG = {
    "model": "some/model",
    "data": {"source": "table.csv", "prompt": "question", "reference": "answer"},
    "rewards": [{"kind": "numeric"}],
}

SUMMARY_KEYS = {"id", "state", "step", "total_steps", "reward", "heldout_before", "heldout_after", "model"}


@pytest.fixture
def frozen_clock(monkeypatch):
    """Every run id gets the same timestamp, as if all runs were created within one second."""
    monkeypatch.setattr(runstore.time, "strftime", lambda fmt, *args: "20240102-030405")


@pytest.fixture
def run(runs_dir) -> RunDir:
    return RunDir.create(runs_dir, "test")


def dead_pid() -> int:
    """The pid of a process that has exited (and been reaped), so it no longer exists."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


# ----------------------------------------------------------------------------------------------------- create


def test_create_makes_unique_ids_within_one_second(runs_dir, frozen_clock):
    runs = [RunDir.create(runs_dir, "arith") for _ in range(3)]
    assert [r.id for r in runs] == ["20240102-030405-arith", "20240102-030405-arith-2", "20240102-030405-arith-3"]
    assert all(r.path.is_dir() and r.path.parent == runs_dir.resolve() for r in runs)


def test_create_makes_the_runs_folder(tmp_path):
    run = RunDir.create(tmp_path / "deep" / "runs", "x")
    assert run.path.is_dir()


@pytest.mark.parametrize("name, suffix", [
    ("arith", "arith"),
    ("my run/1", "my-run-1"),
    ("../../etc", "etc"),
    ("", "run"),
    ("???", "run"),
    ("x" * 100, "x" * 48),
    ("v1.2_final", "v1.2_final"),
])
def test_create_slugs_the_name_into_a_safe_folder_name(runs_dir, frozen_clock, name, suffix):
    run = RunDir.create(runs_dir, name)
    assert run.id == f"20240102-030405-{suffix}"
    assert run.path.parent == runs_dir.resolve()


def test_paths_live_inside_the_run_folder(run):
    for name in ("config_path", "status_path", "log_path", "progress_path", "rollouts_path", "data_dir",
                 "checkpoints_dir", "adapter_dir", "full_model_dir", "eval_path", "samples_path", "stop_request_path"):
        assert getattr(run, name).parent == run.path


# -------------------------------------------------------------------------------------------------- json files


@pytest.mark.parametrize("data", [{"a": 1}, [1, 2, 3], {"text": "Zoë 🐉", "nested": {"x": [None, True]}}, "plain"])
def test_write_json_atomic_round_trips_and_leaves_no_temp_files(tmp_path, data):
    path = tmp_path / "sub" / "status.json"
    write_json_atomic(path, data)
    write_json_atomic(path, data)  # replacing an existing file too
    assert read_json(path) == data
    assert [p.name for p in path.parent.iterdir()] == ["status.json"]


def test_write_json_atomic_failure_keeps_the_old_file_and_no_temp(tmp_path):
    path = tmp_path / "status.json"
    write_json_atomic(path, {"state": "running"})
    with pytest.raises(ValueError):
        write_json_atomic(path, {"reward": float("nan")})  # allow_nan=False: NaN is not JSON
    assert read_json(path) == {"state": "running"}
    assert [p.name for p in tmp_path.iterdir()] == ["status.json"]


@pytest.mark.parametrize("content", [None, "", "{not json", '{"half": '])
def test_read_json_returns_default_for_missing_or_broken_files(tmp_path, content):
    path = tmp_path / "x.json"
    if content is not None:
        path.write_text(content, encoding="utf-8")
    assert read_json(path) is None
    assert read_json(path, default={}) == {}


# ------------------------------------------------------------------------------------------------------ jsonl


def test_read_jsonl_ignores_a_trailing_partial_line_and_resumes_from_the_offset(tmp_path):
    path = tmp_path / "progress.jsonl"
    append_jsonl(path, {"step": 1})
    append_jsonl(path, {"step": 2, "text": "Zoë"})
    complete = path.stat().st_size
    with open(path, "a", encoding="utf-8") as fh:
        fh.write('{"step": 3, "rew')  # the writer is mid-line

    rows, offset = read_appended_rows(path)
    assert rows == [{"step": 1}, {"step": 2, "text": "Zoë"}]
    assert offset == complete

    assert read_appended_rows(path, offset) == ([], offset)  # nothing new yet

    with open(path, "a", encoding="utf-8") as fh:
        fh.write('ard": 0.5}\n')
    append_jsonl(path, {"step": 4})
    rows, next_offset = read_appended_rows(path, offset)
    assert rows == [{"step": 3, "reward": 0.5}, {"step": 4}]
    assert next_offset == path.stat().st_size
    assert read_appended_rows(path, next_offset) == ([], next_offset)
    assert [row["step"] for row in read_appended_rows(path)[0]] == [1, 2, 3, 4]


@pytest.mark.parametrize("start", [0, 17])
def test_read_jsonl_of_a_missing_file(tmp_path, start):
    assert read_appended_rows(tmp_path / "none.jsonl", start) == ([], start)


@pytest.mark.parametrize("chunk", [1, 7, 64, 64 * 2**10])
def test_the_newest_row_is_read_from_the_end_as_the_whole_file_would_give_it(tmp_path, monkeypatch, chunk):
    """read_last_appended_row against read_appended_rows, over files of rows longer and shorter than the chunk it
    reads back, with blank, damaged and unfinished lines, from every start a reader may hold."""
    import random

    monkeypatch.setattr(runstore, "TAIL_CHUNK", chunk)
    draw = random.Random(chunk)
    for case in range(40):
        path = tmp_path / f"{case}.jsonl"
        lines = [json.dumps({"step": i, "text": "é" * draw.choice([0, 3, 50, 300])}) + "\n" for i in range(draw.randint(0, 6))]
        lines += draw.choice([[], ["\n"], ["not json\n"], ['{"step": 99, "unfini']])
        path.write_bytes("".join(lines).encode())
        for start in {0, *(len("".join(lines[:i]).encode()) for i in range(len(lines) + 1))}:
            rows, offset = read_appended_rows(path, start)
            assert runstore.read_last_appended_row(path, start) == (rows[-1:], offset), (lines, start)


def test_the_newest_row_of_a_long_run_is_read_without_reading_the_rest(tmp_path, monkeypatch):
    path = tmp_path / "rollouts.jsonl"
    for step in range(1, 201):
        append_jsonl(path, {"step": step, "groups": ["x" * 5000]})
    read = []
    real_open = open
    monkeypatch.setattr("builtins.open", lambda *args, **kwargs: _counting(real_open(*args, **kwargs), read))
    rows, offset = runstore.read_last_appended_row(path)
    assert rows[0]["step"] == 200 and offset == path.stat().st_size
    assert sum(read) <= 2 * runstore.TAIL_CHUNK  # of about 1 MB


def _counting(handle, read: list):
    original = handle.read
    handle.read = lambda *args: read.append(len(data := original(*args))) or data
    return handle


def test_read_jsonl_skips_blank_lines(tmp_path):
    path = tmp_path / "x.jsonl"
    path.write_text('{"a": 1}\n\n  \n{"a": 2}\n', encoding="utf-8")
    assert read_appended_rows(path)[0] == [{"a": 1}, {"a": 2}]


# ----------------------------------------------------------------------------------------------------- status


@pytest.mark.parametrize("state, label", [
    ("cancelled", "stopped — can resume"),  # "cancelled" sounded final; the run resumes from its checkpoint
    ("queued", "queued"), ("running", "running"), ("succeeded", "succeeded"), ("failed", "failed"),
    (None, "unknown"),
])
def test_states_as_people_read_them(state, label):
    assert runstore.state_label(state) == label


def test_update_status_merges_fields(run):
    assert run.read_status() == {}
    first = run.update_status(state="queued", step=0, total_steps=10)
    assert first["state"] == "queued" and "updated_at" in first
    second = run.update_status(state="running", step=3)
    assert {k: second[k] for k in ("state", "step", "total_steps")} == {"state": "running", "step": 3, "total_steps": 10}
    assert second["updated_at"] >= first["updated_at"]
    assert read_json(run.status_path) == second
    assert [p.name for p in run.path.iterdir()] == ["status.json"]


@pytest.mark.parametrize("state", ["running", "queued"])
def test_a_run_whose_process_died_is_reported_and_saved_as_failed(run, state):
    run.update_status(state=state, step=4, pid=dead_pid(), host=socket.gethostname())
    status = run.read_status()
    assert status["state"] == "failed"
    assert "Interrupted" in status["error"]
    assert status["step"] == 4 and status["finished_at"] <= time.time()
    saved = read_json(run.status_path)
    assert saved["state"] == "failed" and "Interrupted" in saved["error"]


def test_a_run_owned_by_this_process_stays_running(run):
    run.update_status(state="running")
    run.mark_owner()
    status = run.read_status()
    assert (status["state"], status["pid"], status["host"]) == ("running", os.getpid(), socket.gethostname())
    assert "error" not in status and "error" not in read_json(run.status_path)


@pytest.mark.parametrize("fields", [
    {"state": "running", "pid": "dead", "host": "HOST"},  # pid not a number: cannot tell
    {"state": "running", "pid": "DEAD", "host": "another-machine"},  # another host's pid means nothing here
    {"state": "running", "host": "HOST"},  # no pid recorded yet
    {"state": "succeeded", "pid": "DEAD", "host": "HOST"},  # finished runs are left as they are
    {"state": "cancelled", "pid": "DEAD", "host": "HOST"},
])
def test_runs_that_cannot_be_judged_abandoned_keep_their_state(run, fields):
    pid = dead_pid()
    fields = {k: (pid if v == "DEAD" else socket.gethostname() if v == "HOST" else v) for k, v in fields.items()}
    run.update_status(**fields)
    assert run.read_status()["state"] == fields["state"]
    assert read_json(run.status_path)["state"] == fields["state"]


# ------------------------------------------------------------------------------------------- progress, rollouts


def test_truncate_after_step_drops_newer_rows(run):
    for step in range(1, 6):
        run.append_progress({"step": step, "reward": step / 10})
        run.append_rollouts({"step": step, "groups": [{"prompt": f"p{step}"}]})
    run.truncate_after_step(3)
    assert [row["step"] for row in run.read_progress()] == [1, 2, 3]
    assert [row["step"] for row in run.read_rollouts()] == [1, 2, 3]
    assert run.read_progress()[2] == {"version": 2, "step": 3, "reward": 0.3}
    assert not [p for p in run.path.iterdir() if p.name.startswith(".")]  # no temp files left
    run.append_progress({"step": 4, "reward": 0.9})  # a resumed run appends after the kept rows
    assert [row["step"] for row in run.read_progress()] == [1, 2, 3, 4]


@pytest.mark.parametrize("step, kept", [(0, []), (5, [1, 2, 3, 4, 5]), (99, [1, 2, 3, 4, 5])])
def test_truncate_after_step_bounds(run, step, kept):
    for s in range(1, 6):
        run.append_progress({"step": s})
    run.truncate_after_step(step)
    assert [row["step"] for row in run.read_progress()] == kept


def test_truncate_after_step_without_files(run):
    run.truncate_after_step(3)
    assert run.read_progress() == [] and run.read_rollouts() == []
    assert not run.progress_path.exists()


# ------------------------------------------------------------------------------------------------ checkpoints


def make_checkpoint(run: RunDir, name: str, complete: bool = True) -> Path:
    path = run.checkpoints_dir / name
    path.mkdir(parents=True)
    (path / "adapter_model.safetensors").write_bytes(b"weights")
    if complete:
        (path / "trainer_state.json").write_text("{}", encoding="utf-8")
    return path


def test_latest_checkpoint_picks_the_highest_complete_one(run):
    assert run.latest_checkpoint() is None
    assert run.checkpoints() == []
    for step in (5, 9, 10):
        make_checkpoint(run, f"checkpoint-{step}")
    make_checkpoint(run, "checkpoint-12", complete=False)  # still being written, or cut off by a crash
    make_checkpoint(run, "checkpoint-final")
    (run.checkpoints_dir / "checkpoint-99").write_text("a file, not a folder", encoding="utf-8")
    assert run.latest_checkpoint() == run.checkpoints_dir / "checkpoint-10"  # numeric, not text, order
    assert [p.name for p in run.checkpoints()] == ["checkpoint-5", "checkpoint-9", "checkpoint-10"]


def test_latest_checkpoint_none_when_all_incomplete(run):
    make_checkpoint(run, "checkpoint-1", complete=False)
    assert run.latest_checkpoint() is None


@pytest.mark.parametrize("files, expected", [
    ([], False),
    (["adapter/adapter_config.json"], True),
    (["model/config.json"], True),
    (["adapter/tokenizer.json"], False),
])
def test_has_final_weights(run, files, expected):
    for name in files:
        (run.path / name).parent.mkdir(parents=True, exist_ok=True)
        (run.path / name).write_text("{}", encoding="utf-8")
    assert run.has_final_weights() is expected


# ------------------------------------------------------------------------------------------------ stop, log


def test_stop_request_round_trip(run):
    assert not run.stop_requested()
    run.request_stop()
    assert run.stop_requested()
    assert RunDir(run.path).stop_requested()  # seen by any other reader of the folder
    run.request_stop()  # asking twice is fine
    run.clear_stop_request()
    assert not run.stop_requested()
    run.clear_stop_request()  # clearing twice is fine


@pytest.mark.parametrize("text, max_chars", [
    ("", 10),
    ("short log\n", 100),
    ("".join(f"line {i}\n" for i in range(1000)), 50),
    ("".join(f"line {i}\n" for i in range(1000)), 20_000),
    ("x" * 30, 30),
])
def test_log_tail_returns_at_most_max_chars_of_the_end(run, text, max_chars):
    run.log_path.write_text(text, encoding="utf-8")
    tail = run.log_tail(max_chars=max_chars)
    assert len(tail) <= max_chars
    assert tail == text[-max_chars:] if text else tail == ""


def test_log_tail_with_non_ascii_text_never_raises(run):
    run.log_path.write_text("🐉" * 100, encoding="utf-8")
    tail = run.log_tail(max_chars=10)
    assert len(tail) <= 10 and tail.endswith("🐉")


def test_log_tail_without_a_log(run):
    assert run.log_tail() == ""


# ------------------------------------------------------------------------------------------------- config


def test_config_round_trips_through_the_run_folder(run, tmp_path):
    config = RunConfig.from_dict(MINIMAL_CONFIG, base_dir=tmp_path, policy=LAPTOP)
    run.write_config(config)
    assert run.read_config() == config


def test_read_config_of_a_folder_without_one(run):
    from dragon_ui.errors import ConfigError

    with pytest.raises(ConfigError, match="not a run folder"):
        run.read_config()


# ------------------------------------------------------------------------------------------------- list_runs


def test_list_runs_newest_first_with_summaries(runs_dir, monkeypatch):
    stamps = iter(["20240101-000000", "20240301-000000", "20240201-000000"])
    monkeypatch.setattr(runstore.time, "strftime", lambda fmt, *args: next(stamps))
    made = []
    for index, name in enumerate(["first", "third", "second"]):
        run = RunDir.create(runs_dir, name)
        run.write_config(RunConfig.from_dict({**MINIMAL_CONFIG, "model": f"org/model-{index}"}, policy=LAPTOP))
        made.append(run)
    made[0].update_status(state="succeeded", step=10, total_steps=10, reward=0.8, heldout_before=0.2, heldout_after=0.7)
    made[1].update_status(state="running", step=2, total_steps=5, reward=0.1, pid=os.getpid(), host=socket.gethostname())
    (runs_dir / "not-a-run").mkdir()  # no config.json: ignored
    (runs_dir / "stray.txt").write_text("x", encoding="utf-8")

    summaries = list_runs(runs_dir)
    assert [s["id"] for s in summaries] == [made[1].id, made[2].id, made[0].id]
    for summary in summaries:
        assert SUMMARY_KEYS <= set(summary)
        json.dumps(summary)
    newest, middle, oldest = summaries
    assert (newest["state"], newest["step"], newest["total_steps"], newest["model"]) == ("running", 2, 5, "org/model-1")
    assert (middle["state"], middle["step"], middle["reward"], middle["model"]) == ("unknown", 0, None, "org/model-2")
    assert (oldest["state"], oldest["reward"], oldest["heldout_before"], oldest["heldout_after"]) == (
        "succeeded", 0.8, 0.2, 0.7)


def test_list_runs_reports_abandoned_runs_as_failed(runs_dir):
    run = RunDir.create(runs_dir, "crashed")
    run.write_config(RunConfig.from_dict(MINIMAL_CONFIG, policy=LAPTOP))
    run.update_status(state="running", pid=dead_pid(), host=socket.gethostname())
    (summary,) = list_runs(runs_dir)
    assert summary["state"] == "failed" and "Interrupted" in summary["error"]


@pytest.mark.parametrize("make", [lambda tmp: tmp / "missing", lambda tmp: tmp])
def test_list_runs_of_missing_or_empty_folder(tmp_path, make):
    assert list_runs(make(tmp_path)) == []


@pytest.mark.parametrize("written, read", [
    ({"step": 1, "reward": 0.5, "reward_std": 0.2, "reward_numeric": 0.4, "errors_numeric": 1,
      "frac_reward_zero_std": 0.25},
     {"version": 2, "step": 1, "reward": 0.5, "reward_std": 0.2, "rewards": {"numeric": 0.4},
      "errors": {"numeric": 1}, "no_spread_share": 0.25}),
    ({"step": 0, "reward": 0.3, "reward_length": 0.9, "n_prompts": 6, "seconds": 1.2},  # a held-out check
     {"version": 2, "step": 0, "reward": 0.3, "rewards": {"length": 0.9}, "errors": {}, "n_prompts": 6,
      "seconds": 1.2}),
    ({"version": 2, "step": 3, "reward_std": 0.1, "rewards": {"std": 0.7}},  # today's rows are read as written
     {"version": 2, "step": 3, "reward_std": 0.1, "rewards": {"std": 0.7}}),
])
def test_rows_of_earlier_versions_are_read_in_todays_shape(run, written, read):
    append_jsonl(run.progress_path, written)
    append_jsonl(run.heldout_path, written)
    assert run.read_progress() == run.read_heldout() == [read]


@pytest.mark.parametrize("key, value", [("reward", 0.5), ("reward_std", 0.1), ("rewards/std", 0.7),
                                        ("rewards/missing", None), ("errors/std", 2), ("nothing", None)])
def test_a_chart_key_names_a_top_level_value_or_one_inside_rewards_and_errors(key, value):
    row = {"reward": 0.5, "reward_std": 0.1, "rewards": {"std": 0.7}, "errors": {"std": 2}}
    assert runstore.value_at(row, key) == value


@pytest.mark.parametrize("written", [
    {"version": 2, "step": 1, "rewards": 5, "errors": [1, 2]},  # today's version, sections of the wrong type
    {"version": "2", "step": 1, "reward_numeric": 0.5},  # a version that is not a number
    {"step": 1, "rewards": {"x": 1}, "reward_numeric": 0.5, "errors_numeric": "many"},  # version 1 with a section
    "not a row",
    {"version": 2, "step": 2, "kl": 10**400, "elapsed_s": 10**400},  # numbers no float holds
    {"version": 2, "kl": 0.1},  # no step
    {"version": 2, "step": [1], "kl": 0.1},
])
def test_a_damaged_progress_file_still_draws_and_alerts(run, written):
    """A hand-edited or damaged run folder: the charts and the alerts read what they can and never raise."""
    from dragon_ui.experiments import run_curves
    from dragon_ui.studio.monitor import health_alerts
    from dragon_ui.ui import plots

    append_jsonl(run.progress_path, {"version": 2, "step": 1, "kl": 0.01, "completion_len": 5.0, "elapsed_s": 6.0})
    append_jsonl(run.progress_path, written)
    with open(run.progress_path, "a", encoding="utf-8") as fh:
        fh.write("{not json\n" + '{"step": 3, "kl": ' + "9" * 5000 + "}\n")
    rows = run.read_progress()
    assert rows[0]["step"] == 1
    for figure in (plots.reward_figure, plots.spread_figure, plots.kl_figure):
        figure(rows)
    plots.length_figure(rows, max_new_tokens=16)
    run.write_config(RunConfig())
    plots.overlay_figure([run_curves(run)], ["run"], "kl", "KL", "KL", "minutes", "No values yet", False)
    health_alerts(rows, {"reward_errors": ["not", "a", "dict"]}, {})


def update_status_keywords() -> set[str]:
    """Every key the code passes to update_status by name, and those of the dicts it spreads into it."""
    import ast

    found: set[str] = set()
    for path in (Path(runstore.__file__).parent).rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "update_status":
                for keyword in node.keywords:
                    if keyword.arg is not None:
                        found.add(keyword.arg)
                    elif isinstance(keyword.value, ast.Dict):
                        found |= {key.value for key in keyword.value.keys if isinstance(key, ast.Constant)}
    return found


def test_every_status_key_the_code_writes_is_declared():
    declared = set(runstore.RunStatus.__annotations__)
    assert update_status_keywords() - declared == set()


def test_every_status_key_a_real_run_wrote_is_declared():
    """tests/recorded/run-v1's status.json, written by a whole run (training, scoring before and after)."""
    recorded = read_json(Path(__file__).parent / "recorded" / "run-v1" / "status.json")
    assert set(recorded) - set(runstore.RunStatus.__annotations__) == set()
