"""Cheap incremental reads of a run directory, and health alerts that fire exactly on their conditions."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import types

import pytest

from dragon_ui.engine import progress, training
from dragon_ui.runstore import RunDir, current_row, value_at
from dragon_ui.studio import monitor
from dragon_ui.studio.monitor import health_alerts, read_snapshot
from dragon_ui.ui import plots

pytestmark = pytest.mark.timeout(240)


def progress_row(step: int, **values) -> dict:
    """A healthy progress row; ``values`` override its fields (a reward's value as reward_<name>, its failures as
    errors_<name>: the flat names of version 1 rows, which the readers nest, runstore.current_row)."""
    row = {"step": step, "reward": 0.5, "reward_std": 0.3, "reward_numeric": 0.5, "kl": 0.01, "completion_len": 10.0,
           "clipped_ratio": 0.1, "no_spread_share": 0.25, "errors_numeric": 0}
    return current_row({**row, **values})


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
    monkeypatch.setattr(monitor, "read_appended_rows", lambda *args: reads.append(args) or ([], 0))
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


WRITES = {
    "status": lambda run: run.update_status(phase="training"),
    "progress": lambda run: run.append_progress(progress_row(2)),
    "held-out": lambda run: run.append_heldout({"step": 2, "reward": 0.5}),
    "rollouts": lambda run: run.append_rollouts({"step": 2, "groups": []}),
    "sampling": lambda run: run.write_sampling({"step": 1, "groups": []}),
    "log": lambda run: run.log_path.write_text("09:00:00 INFO step 1/10\n09:00:05 INFO step 2/10\n"),
}


@pytest.mark.parametrize("part", list(WRITES))
def test_the_fingerprint_changes_with_each_file_the_train_tab_reads_and_only_then(run, part, monkeypatch):
    clock = [1000.0]
    monkeypatch.setattr(monitor, "time", types.SimpleNamespace(time=lambda: clock[0]))
    shown = read_snapshot(run.path).to_state()  # what the Train tab shows: the run is active
    before = monitor.fingerprint(run.path, shown)
    clock[0] += monitor.STATUS_RECHECK_S - 0.1
    assert monitor.fingerprint(run.path, shown) == before  # nothing written, no re-read due: the Train tab skips
    WRITES[part](run)
    assert monitor.fingerprint(run.path, shown) != before


def test_the_fingerprint_asks_for_the_status_re_read_that_notices_a_dead_process(run, monkeypatch):
    clock = [1000.0]
    monkeypatch.setattr(monitor, "time", types.SimpleNamespace(time=lambda: clock[0]))
    shown = read_snapshot(run.path).to_state()
    assert monitor.fingerprint(run.path, shown)[-1] is None
    clock[0] += monitor.STATUS_RECHECK_S  # due: it differs at every tick until the refresh has re-read the status
    due = monitor.fingerprint(run.path, shown)
    clock[0] += 1
    assert due[-1] is not None and monitor.fingerprint(run.path, shown) != due
    shown = read_snapshot(run.path, since=shown).to_state()
    assert monitor.fingerprint(run.path, shown)[-1] is None
    run.update_status(state="succeeded")  # a run that ended is never re-read for nothing
    shown = read_snapshot(run.path, since=shown).to_state()
    clock[0] += 10 * monitor.STATUS_RECHECK_S
    assert monitor.fingerprint(run.path, shown)[-1] is None


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


def test_snapshots_follow_a_real_training_run(studio, tiny_config_dict):
    """Polling while a tiny run trains in its process gives, row for row, what the run wrote, and ends on its final
    state."""
    run = studio.runs.start(tiny_config_dict)
    (handle,) = training.active_runs()
    state: dict | None = None
    seen_states = set()
    while True:
        alive = handle.is_alive()
        snap = read_snapshot(run.path, since=state)
        state = snap.to_state()
        seen_states.add(snap.status.get("state"))
        if not alive:
            break
        handle.wait(0.05)
    final = read_snapshot(run.path, since=state)
    assert not final.changed
    assert snap.status["state"] == "succeeded" and not snap.active
    assert snap.progress == run.read_progress() and [r["step"] for r in snap.progress] == [1, 2]
    assert snap.rollouts == run.read_rollouts()[-1] and len(snap.rollouts["groups"]) == 2
    assert "step 2/2" in snap.log and len(snap.log.splitlines()) <= monitor.LOG_LINES
    assert seen_states & {"queued", "running"}


# ----------------------------------------------------------------------------------------------------------------
# Health alerts, on recorded progress rows.

CONFIG = {"grpo": {"group_size": 4, "temperature": 1.0, "max_new_tokens": 16, "beta": 0.04},
          "training": {"learning_rate": 1e-5}}

# A healthy run of the arithmetic recipe (rewards numeric, weight 1, and format, weight 0.5; 2 prompts x 4
# completions per step): step, numeric, format, kl, completion_len, clipped_ratio, no_spread_share, reward_std.
RECORDED = [
    (1, 0.250, 0.375, 0.0000, 14.1, 0.250, 0.50, 0.42),
    (2, 0.250, 0.500, 0.0011, 13.6, 0.125, 0.50, 0.45),
    (3, 0.375, 0.500, 0.0024, 12.9, 0.125, 0.25, 0.47),
    (4, 0.375, 0.625, 0.0041, 12.2, 0.000, 0.50, 0.44),
    (5, 0.500, 0.625, 0.0063, 11.8, 0.125, 0.25, 0.49),
    (6, 0.500, 0.750, 0.0085, 11.1, 0.000, 0.25, 0.46),
    (7, 0.625, 0.750, 0.0102, 10.7, 0.000, 0.50, 0.41),
    (8, 0.500, 0.875, 0.0131, 10.2, 0.125, 0.25, 0.43),
    (9, 0.625, 0.875, 0.0150, 9.8, 0.000, 0.50, 0.38),
    (10, 0.750, 0.875, 0.0172, 9.5, 0.000, 0.50, 0.35),
]


def recorded_row(step, numeric, format_, kl, completion_len, clipped_ratio, no_spread_share, reward_std) -> dict:
    """One progress row with exactly the keys progress.RunStoreCallback writes."""
    return {"step": step, "epoch": round(step / 40, 4), "elapsed_s": round(6.2 * step, 2),
            "eta_s": round(6.2 * (40 - step), 1), "loss": 0.0123, "lr": 1e-05, "kl": kl,
            "reward": round(numeric + 0.5 * format_, 6), "reward_std": reward_std, "reward_numeric": numeric,
            "reward_format": format_, "completion_len": completion_len, "clipped_ratio": clipped_ratio,
            "no_spread_share": no_spread_share, "step_time_s": 6.2, "peak_gpu_mem_gb": None, "world_size": 1,
            "completions_per_step": 8, "errors_numeric": 0, "errors_format": 0}


def recorded(**last: list) -> list[dict]:
    """The recorded run with the values of its last steps replaced, key by key: ``kl=[0.4, 0.97]`` sets the KL of
    steps 9 and 10."""
    rows = [recorded_row(*values) for values in RECORDED]
    for key, values in last.items():
        for row, value in zip(rows[-len(values):], values):
            row[key] = value
    return [current_row(row) for row in rows]  # reward_<name> and errors_<name> nested, as the readers read them


RISING_KL = [0.02, 0.03, 0.04, 0.15, 0.28, 0.404]
FALLING = [1.0, 1.0, 1.0, 0.6, 0.5, 0.4]  # the training reward of the last 6 steps: its last 3 below the 3 before
KL_SPIKE = [0.1, 0.25, 0.31, 0.4, 0.97]
ZERO = {"no_spread_share": [1.0], "reward": [0.0], "reward_numeric": [0.0], "reward_format": [0.0],
        "reward_std": [0.0]}

# rows -> each alert as (kind, step, value it quotes, how the title quotes it)
CASES = {
    "healthy": (recorded(), []),
    "healthy, one step": (recorded()[:1], []),
    "no steps yet": ([], []),
    "no KL (beta 0)": (recorded(kl=[None] * 10), []),
    "rising KL": (recorded(kl=RISING_KL, reward=FALLING), [("kl_rising", 10, 0.404, "now 0.404 at step 10")]),
    "KL spike": (recorded(kl=KL_SPIKE, reward=FALLING), [("kl_spike", 10, 0.97, "KL jumped to 0.970 at step 10")]),
    "KL spike two steps ago": (recorded(kl=[0.1, 0.25, 0.4, 0.97, 0.35, 0.3], reward=FALLING),
                               [("kl_spike", 8, 0.97, "KL jumped to 0.970 at step 8")]),
    "KL spike long ago": (recorded(kl=[0.1, 0.25, 0.4, 0.97, 0.35, 0.3, 0.32, 0.3], reward=FALLING), []),
    "KL high": (recorded(kl=[1.4, 1.5, 1.6, 1.5], reward=FALLING), [("kl_high", 10, 1.5, "now 1.500 at step 10")]),
    "KL grew 6x but is tiny": (recorded(kl=[0.01, 0.01, 0.01, 0.05, 0.06, 0.07], reward=FALLING), []),
    "KL above 0.1 but not rising fast": (recorded(kl=[0.2, 0.2, 0.2, 0.3, 0.3, 0.3], reward=FALLING), []),
    "KL jump too small to matter": (recorded(kl=[0.02, 0.03, 0.02, 0.09], reward=FALLING), []),
    # KL measures how far the model moved; a run that learns must move. No alarm while the reward is not falling.
    "KL high while the reward climbs": (recorded(kl=[1.4, 1.5, 1.6, 1.5]), []),
    "rising KL while the reward climbs": (recorded(kl=RISING_KL), []),
    "KL spike while the reward holds": (recorded(kl=KL_SPIKE, reward=[1.0] * 6), []),
    "KL high, too early to tell": (recorded(kl=[1.4, 1.5])[-4:], [("kl_high", 10, 1.5, "now 1.500 at step 10")]),
    "zero spread at the last step": (recorded(no_spread_share=[1.0], reward_std=[0.29]),
                                     [("no_spread", 10, 1.0, "Every group scored the same at step 10")]),
    "zero spread earlier only": (recorded(no_spread_share=[1.0, 0.25]), []),
    "every completion scores 0": (recorded(**ZERO), [("all_zero", 10, 0.0, "Every completion scored 0 at step 10")]),
    "almost no spread, three steps": (recorded(no_spread_share=[0.9, 0.95, 0.9]),
                                      [("little_spread", 10, 0.9, "90% of them at step 10")]),
    "almost no spread, two steps": (recorded(no_spread_share=[0.9, 0.95]), []),
    "clipped lengths": (recorded(clipped_ratio=[0.75], completion_len=[15.6]),
                        [("clipped", 10, 0.75, "75% cut off, mean length 15.6 of 16 tokens")]),
    "half clipped": (recorded(clipped_ratio=[0.5]), []),
    "clipped earlier only": (recorded(clipped_ratio=[0.75, 0.0]), []),
    "failing reward": (recorded(errors_numeric=[3, 7, 12]),
                       [("reward_errors", 10, 12, "failed on 12 completions so far, 5 of 8 in step 10")]),
    "failed once, not since": (recorded(errors_format=[1, 1]),
                               [("reward_errors", 10, 1, "failed on 1 completion so far, none in step 10")]),
    "reward always 0": (recorded(reward_format=[0.0] * 5),
                        [("reward_flat", 10, 0.0, "'format' scored 0 on each of the last 5 steps")]),
    "reward 0 for four steps": (recorded(reward_format=[0.0] * 4), []),
    "reward constant all run": (recorded(reward_format=[1.0] * 10),
                                [("reward_flat", 10, 1.0, "'format' gave 1.000 on every step so far")]),
    # Reward hacking: one reward bought with another.
    "one reward up, another down": (recorded(reward_numeric=[0.6, 0.625, 0.6, 0.3, 0.25, 0.2],
                                             reward_format=[0.5, 0.5, 0.5, 0.875, 1.0, 1.0]),
                                    [("reward_trade_off", 10, 1.0, "'format' rose to 1.000 at step 10 while 'numeric' "
                                      "fell to 0.200 (the last 3 steps against the 3 before: format 0.50 → 0.96, "
                                      "numeric 0.61 → 0.25)")]),
    "one up, another down by less than noise": (recorded(reward_numeric=[0.6, 0.625, 0.6, 0.5, 0.5, 0.5],
                                                         reward_format=[0.5, 0.5, 0.5, 0.875, 1.0, 1.0]), []),
    "both up": (recorded(reward_numeric=[0.2, 0.2, 0.2, 0.5, 0.5, 0.5], reward_format=[0.5, 0.5, 0.5, 0.9, 1.0, 1.0]),
                []),
}
FIX_MENTIONS = {"kl_rising": "learning rate (now 1e-05; LoRA on a model under 1B",
                "kl_spike": "5e-5 to 5e-4, larger models from 1e-5 to 2e-4; training every weight wants 1e-6 to 2e-5) "
                            "or raise beta (now 0.04)",
                "kl_high": "learning rate (now 1e-05; LoRA on a model under 1B",
                "no_spread": "group_size (now 4) or temperature (now 1.0)",
                "all_zero": "group_size (now 4) or temperature (now 1.0)",
                "little_spread": "group_size (now 4) or temperature (now 1.0)",
                "clipped": "max new tokens (now 16)", "reward_errors": "Rewards tab", "reward_flat": "Rewards tab",
                "reward_trade_off": "lower its weight or make it stricter"}


@pytest.mark.parametrize(("rows", "expected"), CASES.values(), ids=CASES.keys())
def test_alerts_on_recorded_rows(rows, expected):
    """Which alerts fire, and the number each quotes is the value recorded at the step it names."""
    alerts = health_alerts(rows, {}, CONFIG)
    assert [(a.kind, a.step, a.value) for a in alerts] == [case[:3] for case in expected]
    for alert, (_, step, _, quoted) in zip(alerts, expected):
        assert quoted in alert.title
        assert alert.value == value_at(next(row for row in rows if row["step"] == step), alert.key)
        assert FIX_MENTIONS[alert.kind] in alert.fix


@pytest.mark.parametrize(("rows", "chart", "line"), [
    (recorded(kl=RISING_KL, reward=FALLING), plots.kl_figure, "KL to the starting model"),
    (recorded(kl=KL_SPIKE, reward=FALLING), plots.kl_figure, "KL to the starting model"),
    (recorded(kl=[1.4, 1.5, 1.6, 1.5], reward=FALLING), plots.kl_figure, "KL to the starting model"),
    (recorded(no_spread_share=[1.0]), plots.spread_figure, "groups with no spread"),
    (recorded(no_spread_share=[0.9, 0.95, 0.9]), plots.spread_figure, "groups with no spread"),
    (recorded(**ZERO), plots.reward_figure, "total"),
    (recorded(reward_format=[0.0] * 5), plots.reward_figure, "format"),
], ids=["rising KL", "KL spike", "KL high", "zero spread", "little spread", "all zero", "reward always 0"])
def test_the_number_an_alert_quotes_is_the_charts_last_point(rows, chart, line):
    (alert,) = health_alerts(rows, {}, CONFIG)
    (trace,) = [trace for trace in chart(rows).data if trace.name == line]
    assert (trace.x[-1], trace.y[-1]) == (alert.step, alert.value)


def test_the_kl_alert_quotes_the_latest_kl_as_the_log_line_and_chart_show_it():
    """The report: the log said 0.404, the alert an average of the last steps (0.16), and a jump to 0.97 said
    nothing."""
    rows = recorded(kl=RISING_KL, reward=FALLING)
    (alert,) = health_alerts(rows, {}, CONFIG)
    assert f"now {progress.log_number(rows[-1]['kl'])}" in alert.title and plots.kl_figure(rows).data[0].y[-1] == 0.404
    (spike,) = health_alerts(recorded(kl=RISING_KL[:-1] + [0.97], reward=FALLING), {}, CONFIG)
    assert spike.kind == "kl_spike" and spike.value == 0.97


def test_the_clipped_alert_quotes_the_length_charts_last_point():
    rows = recorded(clipped_ratio=[0.8], completion_len=[15.8])
    (alert,) = health_alerts(rows, {}, CONFIG)
    line, cap = plots.length_figure(rows, max_new_tokens=16).data
    assert f"mean length {line.y[-1]:.1f} of {cap.y[-1]} tokens" in alert.title


def test_reward_errors_alert_quotes_the_first_error_from_the_log():
    log = ("09:00:01 INFO step 1/4\n09:00:01 WARNING Reward 'numeric' failed on some completions (scored 0); "
           "first error: ValueError: could not convert 'x' to a number\n")
    (alert,) = health_alerts(recorded(errors_numeric=[1, 3]), {}, CONFIG, log)
    assert alert.level == "error"
    assert alert.title == "The reward 'numeric' failed on 3 completions so far, 2 of 8 in step 10 (they scored 0)"
    assert alert.fix.startswith("First error: ValueError: could not convert 'x' to a number")
    (from_status,) = health_alerts([], {"reward_errors": {"custom": 1}}, CONFIG)
    assert from_status.title == "The reward 'custom' failed on 1 completion so far (they scored 0)"
    assert from_status.fix.startswith("Its first error is in the run's log")
    assert health_alerts(recorded(), {"reward_errors": {"numeric": 0}}, CONFIG) == []


def test_a_failing_reward_is_not_also_reported_as_always_0():
    rows = recorded(reward_numeric=[0.0] * 5, reward=[0.4375] * 5, errors_numeric=[8, 16, 24, 32, 40])
    assert [alert.kind for alert in health_alerts(rows, {}, CONFIG)] == ["reward_errors"]


@pytest.mark.parametrize("config, advice", [
    ({"lora": {"enabled": True}, "model": {"id": "HuggingFaceTB/SmolLM2-135M-Instruct"}},
     "LoRA on a model under 1B parameters usually trains well from 5e-5 to 5e-4"),
    ({"lora": {"enabled": True}, "model": {"id": "Qwen/Qwen2.5-1.5B-Instruct"}},
     "LoRA on a model of 1B parameters or more usually trains well from 1e-5 to 2e-4"),
    ({"lora": {"enabled": False}, "model": {"id": "HuggingFaceTB/SmolLM2-135M-Instruct"}},
     "training every weight usually wants 1e-6 to 2e-5"),
])
def test_the_learning_rate_advice_fits_lora_and_the_models_size(config, advice):
    (alert,) = health_alerts(recorded(kl=[1.4, 1.5, 1.6, 1.5], reward=FALLING), {}, {**CONFIG, **config})
    assert advice in alert.fix and "(now 1e-05; " in alert.fix


# ----------------------------------------------------------------------------------------------------------------
# Reward hacking in the latest step's completions (rollouts.jsonl, as the completions viewer shows them).


def rollout_of(*groups: tuple[str, list[str]]) -> dict:
    """A step's sampled groups as progress.RunStoreCallback writes them: (reference, completion texts) each."""
    return {"step": 12, "groups": [
        {"prompt": f"question {n}", "reference": reference,
         "completions": [{"text": text, "scores": {}, "total": 0.0, "advantage": 0.0} for text in texts]}
        for n, (reference, texts) in enumerate(groups)]}


ROLLOUT_CASES = {
    "healthy": (rollout_of(("85", ["85", "The answer is 85", "84", "85"]), ("12", ["12", "12.", "13", "twelve"])), []),
    "one reply to different answers": (rollout_of(("85", ["1 2 3 4 5", "1 2 3 4 5", "85", "1 2  3 4 5"]),
                                                  ("12", ["1 2 3 4 5", "1 2 3 4 5", "1 2 3 4 5", "12"])),
                                       [("same_reply", 6 / 8, "6 of 8 completions at step 12 are the same reply, "
                                         "“1 2 3 4 5”, to questions with 2 different answers")]),
    "one reply, the same answer everywhere": (rollout_of(("positive", ["positive"] * 4), ("positive", ["positive"] * 4)),
                                              []),
    "one reply to half": (rollout_of(("85", ["x", "x", "85", "84"]), ("12", ["x", "12", "13", "14"])), []),
    "repetition": (rollout_of(("85", ["85 85 85 85 85 85 85 85 85", "the answer is 85 the answer is 85 the answer is 85",
                                      "85", "85 85 85 85 85 85 85 85"]), ("12", ["12", "12 12 12 12 12 12 12 12", "12", "12"])),
                   [("repetition", 4 / 8, "4 of 8 completions at step 12 repeat themselves")]),
    "long but varied": (rollout_of(("85", ["first add the tens then add the ones and the sum is 85"] * 1
                                   + ["85", "85", "85"])), []),
    "empty replies": (rollout_of(("85", ["", " ", "85", ""]), ("12", ["", "12", "", "\n"])),
                      [("empty_replies", 6 / 8, "6 of 8 completions at step 12 are empty")]),
    "no rollout yet": (None, []),
}


@pytest.mark.parametrize(("rollout", "expected"), ROLLOUT_CASES.values(), ids=ROLLOUT_CASES.keys())
def test_reward_hacking_in_the_latest_completions(rollout, expected):
    alerts = health_alerts(recorded(), {}, CONFIG, rollout=rollout)
    assert [(a.kind, a.value) for a in alerts] == [case[:2] for case in expected]
    for alert, (_, _, quoted) in zip(alerts, expected):
        assert quoted in alert.title and alert.step == 12 and "completions below" in alert.fix


def checks(*rewards: float, steps=(0, 5, 10)) -> list[dict]:
    """Held-out checks as training writes them (heldout.jsonl) at ``steps``."""
    return [{"version": 2, "step": step, "reward": reward, "rewards": {"numeric": reward}, "n_prompts": 8,
             "seconds": 0.4}
            for step, reward in zip(steps, rewards)]


@pytest.mark.parametrize("heldout, quoted", [
    (checks(0.40, 0.41, 0.40), "The training reward rose from 0.52 to 1.06 between steps 0 and 10 while the held-out "
                               "reward stayed at 0.400 (from 0.400)"),
    (checks(0.50, 0.40, 0.30), "The training reward rose from 0.52 to 1.06 between steps 0 and 10 while the held-out "
                               "reward fell from 0.500 to 0.300"),
    (checks(0.30, 0.50, 0.70), None),
    (checks(0.40, 0.40), None),  # two checks are too few to tell
    ([], None),
])
def test_the_training_reward_rising_while_the_held_out_reward_does_not(heldout, quoted):
    alerts = [a for a in health_alerts(recorded(), {}, CONFIG, heldout=heldout) if a.kind == "heldout_gap"]
    if quoted is None:
        assert alerts == []
    else:
        (alert,) = alerts
        assert alert.title == quoted and alert.step == 10 and alert.value == heldout[-1]["reward"]
        assert "completions below" in alert.fix


METRIC_CONFIG = {**CONFIG, "rewards": [{"kind": "numeric"}, {"kind": "format", "weight": 0.5, "train": False}]}


def metric_checks(*format_scores: float) -> list[dict]:
    """Held-out checks at steps 0, 5 and 10 with the metric 'format' at these scores."""
    return [{**check, "rewards": {"numeric": 0.5, "format": score}}
            for check, score in zip(checks(0.5, 0.5, 0.5), format_scores)]


@pytest.mark.parametrize("rows, config, heldout, quoted", [
    (recorded(reward=[0.5, 0.5, 0.5, 0.8, 0.9, 1.0], reward_format=[0.8, 0.8, 0.8, 0.5, 0.4, 0.3]), METRIC_CONFIG, [],
     "The metric 'format' fell from 0.800 to 0.400 on the training prompts (the last 3 steps against the 3 before) "
     "while the training reward rose from 0.50 to 0.90"),
    (recorded(), METRIC_CONFIG, metric_checks(0.8, 0.6, 0.4),
     "The metric 'format' fell from 0.800 to 0.400 in the held-out checks of steps 0 to 10 while the training reward "
     "rose from 0.52 to 1.06"),
    (recorded(), METRIC_CONFIG, metric_checks(0.8, 0.75, 0.7), None),  # by less than TRADE_OFF
    (recorded(reward=[0.5, 0.5, 0.5, 0.8, 0.9, 1.0], reward_format=[0.4, 0.4, 0.4, 0.5, 0.6, 0.7]), METRIC_CONFIG, [],
     None),  # the metric rises with the reward
    (recorded(reward=[0.9] * 6, reward_format=[0.8, 0.8, 0.8, 0.5, 0.4, 0.3]), METRIC_CONFIG, [],
     None),  # the training reward does not rise: not a loophole, whatever else it is
    (recorded(reward=[0.5, 0.5, 0.5, 0.8, 0.9, 1.0], reward_format=[0.8, 0.8, 0.8, 0.5, 0.4, 0.3]), CONFIG, [],
     None),  # format is trained on: a falling reward, not a metric
])
def test_a_metric_falling_while_the_training_reward_rises(rows, config, heldout, quoted):
    alerts = health_alerts(rows, {}, config, heldout=heldout)
    falling = [a for a in alerts if a.kind == "metric_falling"]
    assert not any(a.kind == "reward_trade_off" and "format" in a.title for a in alerts if config is METRIC_CONFIG)
    if quoted is None:
        assert falling == []
    else:
        (alert,) = falling
        assert alert.title == quoted and alert.step == 10 and alert.value == pytest.approx(0.4)
        assert "which it never sees" in alert.fix and "completions below" in alert.fix


def test_a_held_out_reward_that_climbs_with_the_training_reward_is_no_alarm():
    rising = recorded(reward=[0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.1])
    assert health_alerts(rising, {}, CONFIG, heldout=checks(0.2, 0.6, 1.0)) == []


# A real CPU run of the reward_hacking recipe as shipped (bench/reward_hacking.py; SmolLM2-135M, answer: numeric,
# show_working: length with min_chars 120, at most 32 new tokens): step, answer, show_working, completion_len,
# clipped_ratio.
LESSON_RUN = [
    (1, 0.333, 0.268, 12.2, 0.083), (2, 0.167, 0.493, 21.3, 0.417), (3, 0.542, 0.463, 19.1, 0.292),
    (4, 0.625, 0.405, 18.0, 0.292), (5, 0.500, 0.423, 18.3, 0.375), (6, 0.792, 0.285, 14.1, 0.208),
    (7, 0.625, 0.456, 19.2, 0.375), (8, 0.500, 0.600, 23.9, 0.542), (9, 0.500, 0.593, 23.0, 0.542),
    (10, 0.292, 0.699, 27.3, 0.667), (11, 0.333, 0.808, 29.2, 0.833), (12, 0.375, 0.694, 28.2, 0.792),
    (13, 0.458, 0.840, 30.2, 0.917), (14, 0.417, 0.758, 28.0, 0.792), (15, 0.375, 0.792, 29.7, 0.833),
    (16, 0.667, 0.678, 25.6, 0.625),
]
PAYS_FOR_LENGTH = {"kind": "length", "name": "show_working", "min_chars": 120, "weight": 1.0}
LESSON_CONFIG = {"grpo": {"group_size": 6, "temperature": 0.8, "max_new_tokens": 32, "beta": 0.04},
                 "training": {"learning_rate": 3e-4}, "rewards": [{"kind": "numeric", "name": "answer"},
                                                                  PAYS_FOR_LENGTH]}


def lesson_rows() -> list[dict]:
    return [progress_row(step, reward=answer + working, reward_answer=answer, reward_show_working=working,
                         completion_len=length, clipped_ratio=cap, reward_numeric=None)
            for step, answer, working, length, cap in LESSON_RUN]


def test_padding_for_a_length_reward_is_caught_on_the_lessons_real_run():
    rows = lesson_rows()
    fired = [row["step"] for index, row in enumerate(rows)
             if "padding" in {a.kind for a in health_alerts(rows[:index + 1], {}, LESSON_CONFIG)}]
    assert fired == list(range(10, 17))  # from step 10 on (5 minutes into the run on 2 vCPUs), then at every step
    alerts = health_alerts(rows, {}, LESSON_CONFIG)
    (padding,) = [a for a in alerts if a.kind == "padding"]
    assert padding.title == ("Replies grew from 18 to 28 tokens and 75% of them now stop at the cap of 32 tokens "
                             "(the last 3 steps; 26% in the first 3), while 'show_working', which pays for length, "
                             "rose from 0.41 to 0.74")
    assert "give 'show_working' a maximum instead of a minimum" in padding.fix
    assert "clipped" not in {a.kind for a in alerts}  # "raise max new tokens" would only feed the padding


@pytest.mark.parametrize("rewards, rows", [
    # A length reward that pays for short replies: the cap reached is the plain clipped alert's business.
    ([{"kind": "numeric", "name": "answer"}, {"kind": "length", "name": "show_working", "max_chars": 12}],
     lesson_rows()),
    # Replies at the cap from the start: nothing grew.
    ([PAYS_FOR_LENGTH], [progress_row(step, clipped_ratio=0.7, reward_show_working=0.5 + step / 20)
                         for step in range(1, 8)]),
    # Lengths grew to the cap while the length reward stayed where it was.
    ([PAYS_FOR_LENGTH], [{**row, "rewards": {**row["rewards"], "show_working": 0.7}} for row in lesson_rows()]),
])
def test_no_padding_alert_without_a_length_reward_that_rose_with_the_lengths(rewards, rows):
    kinds = {a.kind for a in health_alerts(rows, {}, {**LESSON_CONFIG, "rewards": rewards})}
    assert "padding" not in kinds and "clipped" in kinds


TOOLS_CONFIG = {**CONFIG, "tools": [{"kind": "calculator", "name": "calculator"}],
                "grpo": {**CONFIG["grpo"], "max_tool_calling_iterations": 2}}
CALLED = [{"role": "assistant", "text": "", "calls": [{"name": "calculator", "arguments": {"expression": "2 * 3"}}]},
          {"role": "tool", "name": "calculator", "text": "6"}]
ANSWERED = [*CALLED, {"role": "assistant", "text": "6", "calls": []}]


def tool_rollout(*endings: list[dict]) -> dict:
    """One group whose completions ended as ``endings`` (their turns), each final text as the records keep it."""
    completions = [{"text": turns[-1]["text"] if turns[-1]["role"] == "assistant" else "", "turns": turns,
                    "scores": {}, "total": 0.0, "advantage": 0.0} for turns in endings]
    return {"step": 12, "groups": [{"prompt": "What is 2 * 3?", "reference": "6", "completions": completions}]}


TOOL_CASES = {
    "calling and answering": ({"tool_calls": [0.5, 0.75, 1.0], "tool_failures": [0.0, 0.1, 0.0]},
                              tool_rollout(ANSWERED, ANSWERED, CALLED[:1] + [{"role": "assistant", "text": "6",
                                                                              "calls": []}]), []),
    "no call for three steps": ({"tool_calls": [0.0, 0.0, 0.0], "tool_failures": [0.0, 0.0, 0.0]}, None,
                                [("tools_unused", 0.0, "No completion called a tool in the last 3 steps (to step 10)")]),
    "a call two steps ago": ({"tool_calls": [0.25, 0.0, 0.0], "tool_failures": [1.0, 0.0, 0.0]}, None, []),
    "every call failing": ({"tool_calls": [1.0, 1.5, 1.0], "tool_failures": [1.0, 1.0, 1.0]}, None,
                           [("tool_failures", 1.0, "Every tool call failed in the last 3 steps (to step 10)")]),
    "most calls failing": ({"tool_calls": [1.0, 1.5, 1.0], "tool_failures": [1.0, 0.9, 1.0]}, None, []),
    "stuck in calls": ({"tool_calls": [1.0, 1.0, 2.0], "tool_failures": [0.0, 0.0, 0.0]},
                       tool_rollout(CALLED, CALLED[:1], ANSWERED, CALLED + CALLED),
                       [("no_final_answer", 0.75, "3 of 4 completions at step 12 end in a tool call, not an answer")]),
    "half stuck": ({"tool_calls": [1.0, 1.0, 1.0], "tool_failures": [0.0, 0.0, 0.0]},
                   tool_rollout(CALLED, ANSWERED, ANSWERED, ANSWERED), []),
}


@pytest.mark.parametrize(("last", "rollout", "expected"), TOOL_CASES.values(), ids=TOOL_CASES.keys())
def test_a_tools_run_is_warned_when_its_model_skips_breaks_or_never_leaves_its_tools(last, rollout, expected):
    alerts = health_alerts(recorded(**last), {}, TOOLS_CONFIG, rollout=rollout)
    assert [(a.kind, a.value) for a in alerts] == [case[:2] for case in expected]
    for alert, (_, _, quoted) in zip(alerts, expected, strict=True):
        assert quoted in alert.title
    # the same rows without tools in the config raise nothing about tools, and a stuck reply is not "empty"
    assert health_alerts(recorded(**last), {}, CONFIG, rollout=rollout) == []


GOAL_CONFIG = {**CONFIG, "rewards": [{"kind": "numeric"}, {"kind": "format", "weight": 0.5}]}
RISING = [0.3, 0.3, 0.3, 0.4, 0.5, 0.5, 0.6, 0.7, 0.8, 0.8]  # every step's training reward


@pytest.mark.parametrize("numeric, config, fires", [
    ([0.2] * 10, GOAL_CONFIG, True),  # the reward rises, the goal stays: the format is what it learns
    ([0.0] * 10, GOAL_CONFIG, True),  # a goal that never pays: said beside the alert that it teaches nothing
    ([0.2, 0.2, 0.2, 0.3, 0.3, 0.4, 0.4, 0.5, 0.6, 0.6], GOAL_CONFIG, False),  # the goal rises with it
    ([0.9, 0.9, 0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.3], GOAL_CONFIG, False),  # it fell: the trade-off alert's
    ([0.2] * 10, {**GOAL_CONFIG, "rewards": [{"kind": "format"}]}, False),  # no reward is a goal
])
def test_the_training_reward_rising_while_the_goal_stays(numeric, config, fires):
    alerts = [a for a in health_alerts(recorded(reward=RISING, reward_numeric=numeric), {}, config)
              if a.kind == "goal_flat"]
    if not fires:
        assert alerts == []
        return
    (alert,) = alerts
    assert alert.title == ("The training reward rose from 0.30 to 0.77 since the first 3 steps while your goal, "
                           f"'numeric', stayed at {numeric[-1]:.2f} (from {numeric[0]:.2f})")
    assert "paid by 'format', not by 'numeric'" in alert.fix and "Pays only when: numeric" in alert.fix
