"""End-to-end GRPO runs on the tiny random Llama: run-store contract, stop/resume, failures, chaining, one-at-a-time."""

from __future__ import annotations

import json
import shutil

import pytest

from dragon_ui import speedups
from dragon_ui.speedups import registry, shared_prompts
from dragon_ui.config import RunConfig
from dragon_ui.engine import progress, training
from dragon_ui.errors import BusyError
from dragon_ui.runstore import RunDir
from dragon_ui.public import LAPTOP
from conftest import ended

pytestmark = pytest.mark.timeout(300)


def run_to_end(config_dict: dict) -> RunDir:
    run = training.train_config(RunConfig.from_dict(config_dict, policy=LAPTOP), policy=LAPTOP)
    return run


def custom_reward(code: str, name: str = "custom") -> dict:
    return {"kind": "custom", "name": name, "code": code}


def test_two_steps_write_the_whole_run_store(tiny_config_dict):
    from dragon_ui.runstore import RunStatus

    run = run_to_end(tiny_config_dict)

    status = run.read_status()
    assert status["state"] == "succeeded", status.get("error")
    assert set(status) <= set(RunStatus.__annotations__)  # the typed record declares every key written
    assert status["step"] == status["total_steps"] == 2
    for key in ("started_at", "finished_at", "eta_s", "device", "dtype", "model_label", "reward_names",
                "heldout_before", "heldout_after", "latest_checkpoint", "pid", "host"):
        assert key in status, key
    assert status["device"] == "cpu"
    # Which speed-ups ran and the library versions: what a run that behaves differently elsewhere is compared by.
    assert status["speedups"] == speedups.status() and set(status["speedups"]["active"]) == set(speedups.ALL)
    assert set(status["versions"]) == set(speedups.LIBRARIES)
    assert status["versions"]["trl"].startswith("1.16") and status["versions"]["torch"]

    assert RunConfig.from_dict(json.loads(run.config_path.read_text()), policy=LAPTOP) == RunConfig.from_dict(tiny_config_dict, policy=LAPTOP)

    progress = run.read_progress()
    assert [row["step"] for row in progress] == [1, 2]
    for row in progress:
        for key in ("version", "step", "epoch", "elapsed_s", "eta_s", "loss", "lr", "kl", "reward", "reward_std",
                    "rewards", "errors", "completion_len", "clipped_ratio", "no_spread_share"):
            assert key in row, key
        assert set(row["rewards"]) == set(row["errors"]) == {"numeric", "length"} and row["errors"]["numeric"] == 0
        assert 0.0 <= row["rewards"]["length"] <= 1.0
        assert row["reward"] == pytest.approx(row["rewards"]["numeric"] + 0.3 * row["rewards"]["length"], abs=1e-5)
        assert 0 < row["completion_len"] <= 6

    # The held-out reward during training: the same few prompts (here all 6 held-out ones) at each check, so step 0
    # is the "before" scoring and the last check, on the final weights, the "after" one.
    heldout, evaluation = run.read_heldout(), run.read_eval()
    assert [row["step"] for row in heldout] == [0, 1, 2] and {row["n_prompts"] for row in heldout} == {6}
    assert heldout[0]["reward"] == pytest.approx(evaluation["before"]["reward_mean"])
    assert heldout[-1]["reward"] == pytest.approx(evaluation["after"]["reward_mean"])
    assert heldout[-1]["rewards"]["numeric"] == pytest.approx(evaluation["after"]["reward_breakdown"]["numeric"])

    rollouts = run.read_rollouts()
    assert [r["step"] for r in rollouts] == [1, 2]
    groups = rollouts[-1]["groups"]
    assert len(groups) == 2  # batch_size prompts
    for group in groups:
        assert group["prompt"].startswith("What is") and group["reference"].isdigit()
        assert len(group["completions"]) == 2  # group_size
        for completion in group["completions"]:
            assert set(completion["scores"]) == {"numeric", "length"}
            assert completion["total"] == pytest.approx(completion["scores"]["numeric"] + 0.3 * completion["scores"]["length"], abs=1e-5)
            assert isinstance(completion["advantage"], float)
        advantages = [c["advantage"] for c in group["completions"]]
        assert sum(advantages) == pytest.approx(0.0, abs=1e-4)  # group-relative

    assert [p.name for p in run.checkpoints()] == ["checkpoint-1", "checkpoint-2"]
    assert (run.checkpoints()[-1] / "optimizer.pt").is_file()
    assert (run.adapter_dir / "adapter_config.json").is_file()
    assert (run.adapter_dir / "tokenizer_config.json").is_file()

    evaluation = run.read_eval()
    assert evaluation["n_prompts"] == 6
    for side in ("before", "after"):
        assert set(evaluation[side]["reward_breakdown"]) == {"numeric", "length"}
    samples = run.read_samples()
    assert len(samples) == 3
    assert {"prompt", "reference", "before", "after"} <= set(samples[0])
    assert (run.train_data_path).is_file() and (run.eval_data_path).is_file()
    log = run.log_tail()
    assert "step 2/2" in log and "Held-out reward after training" in log


def test_a_lora_run_scores_its_starting_model_after_training_exactly_as_before_it(tiny_config_dict):
    """Start is not kept waiting for the "before" scoring: a LoRA run takes it after training with its adapter off
    (and step 0 of the held-out curve at the first check). A full fine-tune, whose starting weights are gone by then,
    scores it first; the two give the same replies and scores, since the frozen weights are the starting model."""
    tiny_config_dict["hardware"]["dtype"] = "float32"
    lora = run_to_end(tiny_config_dict)
    log = lora.log_tail()
    assert "Scoring the starting model" not in log  # the phase a full fine-tune goes through before training
    assert log.index("step 2/2") < log.index("Held-out reward before training") < log.index("Held-out reward after")
    tiny_config_dict["lora"]["enabled"] = False
    tiny_config_dict["training"]["learning_rate"] = 1e-4
    full = run_to_end(tiny_config_dict)
    first, second = lora.read_eval()["before"], full.read_eval()["before"]
    assert first["reward_mean"] == second["reward_mean"] and first["reward_breakdown"] == second["reward_breakdown"]
    assert [row["before"] for row in lora.read_samples()] == [row["before"] for row in full.read_samples()]
    assert lora.read_heldout()[0] | {"seconds": 0} == full.read_heldout()[0] | {"seconds": 0}


def test_the_first_step_shows_its_completions_and_what_it_does_before_it_ends(tiny_config_dict, monkeypatch):
    """sampling.json holds the batch being trained as soon as it is sampled, and the phase says which part of the
    first step runs."""
    from dragon_ui.engine import progress

    seen = []
    original = progress.RunStoreCallback.on_log

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not seen:
            seen.append((self.run.read_sampling(), self.run.read_status()["phase"], self.run.read_rollouts()))
        return original(self, args, state, control, logs=logs, **kwargs)

    monkeypatch.setattr(progress.RunStoreCallback, "on_log", on_log)
    run = run_to_end(tiny_config_dict)
    (sampling, phase, rollouts), = seen
    assert phase == progress.FIRST_LEARNING and rollouts == []  # before the first step's row and rollouts
    assert sampling["step"] == 1 and len(sampling["groups"]) == 2
    finished = run.read_rollouts()[0]
    assert [group["prompt"] for group in sampling["groups"]] == [group["prompt"] for group in finished["groups"]]
    assert [group["completions"] for group in sampling["groups"]] == \
        [[item["text"] for item in group["completions"]] for group in finished["groups"]]
    assert run.read_status()["phase"] == "done"


def test_adapter_loads_with_peft(tiny_config_dict, tiny_model_dir):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    run = run_to_end(tiny_config_dict)
    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model_dir), str(run.adapter_dir))
    assert any("lora_" in name for name, _ in model.named_parameters())


def test_stop_mid_run_then_resume_continues_the_step_count(tiny_config_dict, runs_dir):
    # A reward that asks the run to stop while step 2 is being scored (its first 6 calls score the held-out prompts
    # before training, then 4 completions a step): the step is cut short at its next forward pass, and the run is
    # left as it was after step 1, with that step's checkpoint.
    marker = runs_dir.parent / "stopped-once"  # one stop only: the resumed run must be left alone
    code = (
        "import pathlib, glob\n"
        "calls = [0]\n"
        "def reward(prompt, completion, reference, row):\n"
        "    calls[0] += 1\n"
        f"    if calls[0] == 6 + 4 + 2 and not pathlib.Path({str(marker)!r}).exists():\n"
        f"        pathlib.Path({str(marker)!r}).write_text('x')\n"
        f"        for run in glob.glob({str(runs_dir)!r} + '/*/'):\n"
        "            pathlib.Path(run, 'stop.request').write_text('test')\n"
        "    return 1.0\n"
    )
    tiny_config_dict["rewards"].append(custom_reward(code, "stopper"))
    tiny_config_dict["training"].update(max_steps=4, save_steps=10)
    run = run_to_end(tiny_config_dict)

    status = run.read_status()
    assert status["state"] == "cancelled", status.get("error")
    assert status["step"] == 1
    assert [p.name for p in run.checkpoints()] == ["checkpoint-1"]  # a stop saves first, whatever save_steps says
    assert [row["step"] for row in run.read_progress()] == [1]  # step 2 was cut short, not finished
    assert not run.has_final_weights()
    assert not run.stop_requested()
    first_start = status["started_at"]

    training.resume_here(run.path, policy=LAPTOP)
    status = run.read_status()
    assert status["state"] == "succeeded", status.get("error")
    assert status["step"] == 4
    assert status["started_at"] == first_start < status["resumed_at"]  # the runs list shows when it began
    assert [row["step"] for row in run.read_progress()] == [1, 2, 3, 4]
    state = json.loads((run.checkpoints()[-1] / "trainer_state.json").read_text())
    assert state["global_step"] == 4
    assert "Resuming" in run.log_tail()
    # The schedule continued where it stopped: the same learning rates as a run that was never interrupted.
    uninterrupted = run_to_end(tiny_config_dict)
    assert [row["lr"] for row in run.read_progress()] == pytest.approx([row["lr"] for row in uninterrupted.read_progress()])
    # Stopped before its starting model was scored (a LoRA run scores it after training): finished, it has both.
    assert run.read_eval()["before"] == uninterrupted.read_eval()["before"] | {"seconds": run.read_eval()["before"]["seconds"]}
    assert "after" in run.read_eval()


def test_a_stop_during_scoring_scores_nothing_more(tiny_config_dict, runs_dir):
    """Each reward may take its own time limit (math-verify's is 3 s), so a stop or a run's time limit must not wait
    for every reply of the step to be scored by every reward: it acts before the next reply is scored, and the run
    is left as it was after its last whole step."""
    stopped = runs_dir.parent / "stopped"
    late = runs_dir.parent / "scored-after-the-stop"
    stopper = (
        "import pathlib, glob\n"
        "calls = [0]\n"
        "def reward(prompt, completion, reference, row):\n"
        "    calls[0] += 1\n"
        f"    if calls[0] == 6 + 4 + 1:\n"
        f"        pathlib.Path({str(stopped)!r}).write_text('x')\n"
        f"        for run in glob.glob({str(runs_dir)!r} + '/*/'):\n"
        "            pathlib.Path(run, 'stop.request').write_text('test')\n"
        "    return 1.0\n"
    )
    counter = (
        "import pathlib\n"
        "def reward(prompt, completion, reference, row):\n"
        f"    if pathlib.Path({str(stopped)!r}).exists():\n"
        f"        with open({str(late)!r}, 'a') as late:\n"
        "            late.write('scored\\n')\n"
        "    return 1.0\n"
    )
    tiny_config_dict["rewards"] += [custom_reward(stopper, "stopper"), custom_reward(counter, "counter")]
    tiny_config_dict["training"].update(max_steps=4, save_steps=10)
    run = run_to_end(tiny_config_dict)

    status = run.read_status()
    assert stopped.exists() and status["state"] == "cancelled", status.get("error")
    assert not late.exists()  # not one more reply scored, by this reward or the next
    assert [p.name for p in run.checkpoints()] == [f"checkpoint-{status['step']}"]
    assert [row["step"] for row in run.read_progress()] == list(range(1, status["step"] + 1))


def test_resume_after_a_crash_truncates_rows_past_the_checkpoint(tiny_config_dict):
    tiny_config_dict["training"].update(max_steps=3, save_steps=2)
    run = run_to_end(tiny_config_dict)
    # Simulate a crash after step 3 that lost checkpoint-3 but left its progress rows.
    shutil.rmtree(run.checkpoints_dir / "checkpoint-3")
    shutil.rmtree(run.adapter_dir)
    run.update_status(state="failed", error="simulated crash")
    training.resume_here(run.path, policy=LAPTOP)
    assert run.read_status()["state"] == "succeeded"
    assert [row["step"] for row in run.read_progress()] == [1, 2, 3]


UNSURE_REWARD = ("import warnings\n"
                 "def reward(prompt, completion, reference, row):\n"
                 "    warnings.warn('this reward is unsure')\n"
                 "    return 0.5\n")


@pytest.mark.filterwarnings("always")  # every warning raised, so a hidden one cannot pass for a fixed one
@pytest.mark.parametrize("lora, checkpointing", [(True, False), (True, True), (False, True)],
                         ids=["lora", "lora-checkpointing", "full-checkpointing"])
def test_the_run_log_has_real_warnings_but_no_deprecation_notices(tiny_config_dict, lora, checkpointing):
    """transformers' FutureWarnings about renamed arguments used to fill every run's log."""
    tiny_config_dict["lora"]["enabled"] = lora
    tiny_config_dict["training"]["gradient_checkpointing"] = checkpointing
    tiny_config_dict["rewards"].append(custom_reward(UNSURE_REWARD, "unsure"))
    run = run_to_end(tiny_config_dict)
    assert run.read_status()["state"] == "succeeded", run.read_status().get("error")
    log = run.log_path.read_text(encoding="utf-8")
    assert "UserWarning: this reward is unsure" in log
    assert "FutureWarning" not in log and "DeprecationWarning" not in log and "deprecated" not in log


def test_a_reward_that_always_fails_ends_the_run_as_failed_with_its_message(tiny_config_dict):
    tiny_config_dict["rewards"].append(custom_reward("def reward(prompt, completion, reference, row):\n"
                                                     "    raise ValueError('my reward is broken')\n", "broken"))
    run = run_to_end(tiny_config_dict)
    status = run.read_status()
    assert status["state"] == "failed"
    assert "broken" in status["error"] and "my reward is broken" in status["error"]
    assert "ValueError" in status["traceback"]
    assert "failed" in run.log_tail()


def test_a_reward_that_fails_sometimes_is_counted_and_training_goes_on(tiny_config_dict):
    code = ("calls = [0]\n"
            "def reward(prompt, completion, reference, row):\n"
            "    calls[0] += 1\n"
            "    if calls[0] % 3 == 0:\n"
            "        raise ZeroDivisionError('every third call')\n"
            "    return 0.5\n")
    tiny_config_dict["rewards"].append(custom_reward(code, "flaky"))
    run = run_to_end(tiny_config_dict)
    status = run.read_status()
    assert status["state"] == "succeeded", status.get("error")
    progress = run.read_progress()
    # 6 held-out calls come first (not counted: evaluation has its own tally), then 2 steps x 4 completions =
    # calls 7..14, of which 9 and 12 fail.
    assert progress[-1]["errors"] == {"flaky": 2, "numeric": 0, "length": 0}
    assert status["reward_errors"]["flaky"] == 2
    assert "every third call" in run.log_tail()


def test_only_one_training_per_app(studio, tiny_config_dict):
    slow = "import time\ndef reward(prompt, completion, reference, row):\n    time.sleep(0.2)\n    return 1.0\n"
    tiny_config_dict["rewards"].append(custom_reward(slow, "slow"))
    first = studio.runs.start(tiny_config_dict)
    second = training.prepare(RunConfig.from_dict(tiny_config_dict, policy=LAPTOP), waiting=True, policy=LAPTOP)
    try:
        assert [handle.run.id for handle in training.active_runs()] == [first.id]
        with pytest.raises(BusyError, match="already running"):
            training.start_waiting(second, resume=False, policy=LAPTOP, workers=studio.workers)
    finally:
        studio.runs.stop(first.id)
    assert ended(first) == "cancelled"
    assert not training.active_runs()


def test_stop_before_training_begins_leaves_a_cancelled_run(tiny_config_dict):
    run = training.train_config(RunConfig.from_dict(tiny_config_dict, policy=LAPTOP), policy=LAPTOP, on_start=lambda job: job.stop())
    status = run.read_status()
    assert status["state"] == "cancelled"
    assert status.get("error") is None


def test_a_finished_run_can_be_the_starting_model_of_the_next(tiny_config_dict):
    first = run_to_end(tiny_config_dict)
    tiny_config_dict["model"] = {"id": str(first.path)}
    tiny_config_dict["name"] = "second-stage"
    second = run_to_end(tiny_config_dict)
    status = second.read_status()
    assert status["state"] == "succeeded", status.get("error")
    assert f"+ run {first.id}" in status["model_label"]
    # The merged first stage is the reference for the second: its "before" equals the first run's "after" weights.
    assert second.read_eval()["before"]["reward_mean"] == pytest.approx(first.read_eval()["after"]["reward_mean"])


def test_full_fine_tuning_saves_the_whole_model(tiny_config_dict):
    tiny_config_dict["lora"] = {"enabled": False}
    run = run_to_end(tiny_config_dict)
    assert run.read_status()["state"] == "succeeded", run.read_status().get("error")
    assert (run.full_model_dir / "config.json").is_file()
    assert not run.adapter_dir.exists()


def test_bad_input_is_refused_before_a_run_folder_exists(tiny_config_dict, runs_dir):
    from dragon_ui.errors import ConfigError

    tiny_config_dict["data"]["prompt"] = "{nonexistent}"
    with pytest.raises(ConfigError, match="nonexistent"):
        training.train_config(RunConfig.from_dict(tiny_config_dict, policy=LAPTOP), policy=LAPTOP)
    tiny_config_dict["data"]["prompt"] = "question"
    tiny_config_dict["training"]["batch_size"] = 100
    with pytest.raises(ConfigError, match=r"Only 24 training prompts \(6 more are held out .* data\.eval_frac 0 trains "
                                          r"on them too\), fewer than training\.batch_size \(100\)"):
        training.train_config(RunConfig.from_dict(tiny_config_dict, policy=LAPTOP), policy=LAPTOP)
    assert not runs_dir.exists() or not any(runs_dir.iterdir())


def test_a_speedup_that_raises_while_training_is_switched_off_and_the_run_succeeds(tiny_config_dict, monkeypatch):
    """As when a transformers release changes the cache a speed-up relies on: the step runs TRL's way instead."""
    def moved(*args, **kwargs):
        raise TypeError("an internal this speed-up relies on changed")

    monkeypatch.setattr(shared_prompts, "forward_sharing_prompts", moved)
    monkeypatch.setattr(shared_prompts, "prefill_sharing_prompts", moved)
    monkeypatch.setattr(registry, "_failed", {})  # switched off for this test's process state only
    tiny_config_dict["lora"]["dropout"] = 0.0  # so that the policy pass would share prompts too
    run = run_to_end(tiny_config_dict)
    status = run.read_status()
    assert status["state"] == "succeeded", status.get("error")
    assert status["step"] == 2
    assert status["speedups"]["disabled"]["shared_prompts"].startswith("it raised TypeError")
    assert "Speed-up shared_prompts raised TypeError" in run.log_path.read_text(encoding="utf-8")



def test_groups_that_all_scored_the_same_are_counted_from_the_scores_the_run_wrote(tiny_config_dict):
    """A real run where no completion can match (exact) and every one is short enough (length, weight 0.3): each
    group's totals are all 0.3. TRL's own frac_reward_zero_std compares a float32 spread with zero at an absolute
    1e-8, which the rounding of 0.3 in groups of 6 makes it miss; the run's own count reads the totals it wrote."""
    from dragon_ui.studio.monitor import health_alerts

    tiny_config_dict["rewards"] = [{"kind": "exact"}, {"kind": "length", "max_chars": 1000, "weight": 0.3}]
    tiny_config_dict["grpo"]["group_size"] = 6
    run = run_to_end(tiny_config_dict)
    rows = run.read_progress()
    assert [row["no_spread_share"] for row in rows] == [1.0, 1.0]
    totals = {item["total"] for rollout in run.read_rollouts() for group in rollout["groups"]
              for item in group["completions"]}
    assert totals == {0.3}
    alerts = health_alerts(rows, run.read_status(), run.read_config().to_dict())
    assert "no_spread" in {alert.kind for alert in alerts}


def test_the_log_shows_the_latest_steps_pace_and_the_eta_leaves_the_first_step_out():
    """Rows logged at these times after a session that started at step 10 (a resume) at t=100: a slow first step
    (loading, warm-up) and then steps of 8 s, with one row covering two steps."""
    pace = progress.StepPace(start_step=10, started_at=100.0)
    assert pace.logged(11, 130.0) == (30.0, 30.0)  # one step to go by: its own time
    assert pace.logged(12, 138.0) == (8.0, 8.0)  # the slow first step is left out of the ETA's pace
    assert pace.logged(14, 156.0) == (9.0, 26.0 / 3)  # a row two steps after the last: each took 9 s


def test_a_stop_during_a_held_out_check_ends_the_run_with_that_step_saved(tiny_config_dict, monkeypatch):
    """A stop or the time limit that arrives while the model answers the held-out prompts (their generation asks
    should_stop after every token) ends the run there: the step before the check is whole, so it is checkpointed."""
    from dragon_ui.engine import evaluation
    from dragon_ui.errors import Stopped

    def stopped_midway(self, model, step):
        raise Stopped("stopped while generating replies")

    monkeypatch.setattr(evaluation.HeldOutChecks, "check", stopped_midway)
    tiny_config_dict["training"].update(max_steps=4, eval_every=2)
    run = run_to_end(tiny_config_dict)
    status = run.read_status()
    assert status["state"] == "cancelled" and status["step"] == 2, status.get("error")
    assert run.latest_checkpoint().name == "checkpoint-2"
    # Nothing: with LoRA the starting model is scored at the first check too (its adapter off), which never finished.
    assert [row["step"] for row in run.read_heldout()] == []


@pytest.mark.parametrize("eval_every, total, expected", [(None, 95, 10), (None, 4, 1), (0, 95, 0), (7, 95, 7)])
def test_held_out_checks_come_about_ten_times_a_run_unless_told(eval_every, total, expected):
    from dragon_ui.config import TrainingSettings

    assert TrainingSettings(eval_every=eval_every).checks_at(total) == expected


def test_held_out_checks_can_be_turned_off(tiny_config_dict):
    tiny_config_dict["training"]["eval_every"] = 0
    run = run_to_end(tiny_config_dict)
    assert run.read_status()["state"] == "succeeded" and run.read_eval()["after"]
    assert not run.heldout_path.exists()


def test_a_reward_named_std_trains_and_keeps_its_own_chart(tiny_config_dict):
    """Its mean was stored as reward_std, the key of TRL's spread of the totals: one overwrote the other."""
    from dragon_ui.ui import plots

    tiny_config_dict["rewards"] = [{"kind": "numeric"}, {"kind": "length", "max_chars": 12, "name": "std",
                                                         "weight": 0.3}]
    run = run_to_end(tiny_config_dict)
    assert run.read_status()["state"] == "succeeded"
    rows = run.read_progress()
    for row in rows:
        assert row["reward"] == pytest.approx(row["rewards"]["numeric"] + 0.3 * row["rewards"]["std"], abs=1e-5)
    traces = {trace.name: list(trace.y) for trace in plots.reward_figure(rows).data}
    assert traces["std"] == [row["rewards"]["std"] for row in rows]
    spread = {trace.name: list(trace.y) for trace in plots.spread_figure(rows).data}
    assert spread["reward std"] == [row["reward_std"] for row in rows]
