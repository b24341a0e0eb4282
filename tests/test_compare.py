"""Before/after comparison of a run: chart and table data, evaluate-now on a stopped run, and the free prompt."""

from __future__ import annotations

import json
import sys

import pytest
import torch
from conftest import (
    ended,
    openmp_threads_around,
    stop_after_last_checkpoint,
    strengthen_adapter,
)

from dragon_ui.config import RunConfig
from dragon_ui.engine import training
from dragon_ui.public import LAPTOP
from dragon_ui.engine import evaluation
from dragon_ui.engine.evaluation import evaluate_model, generate_replies
from dragon_ui.errors import BusyError, ConfigError
from dragon_ui.rewards import build_rewards
from dragon_ui.studio import compare
from dragon_ui.studio.backend import Studio
from dragon_ui.ui import plots

pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def studio(runs_dir):
    return Studio(runs_dir=runs_dir, policy=LAPTOP)


def base_and_adapter(tiny_model_dir, adapter_dir):
    """The starting model and the same with the adapter applied, loaded independently of the Studio's cache."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    adapted = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32),
                                        str(adapter_dir))
    return base, adapted, tokenizer


def test_comparison_of_a_finished_run(finished_run, studio):
    evaluation, samples = finished_run.read_eval(), finished_run.read_samples()
    shown = compare.comparison(finished_run)

    assert [bar["reward"] for bar in shown.bars] == ["total", "numeric", "length"]
    assert shown.bars[0] == {"reward": "total", "before": evaluation["before"]["reward_mean"],
                             "after": evaluation["after"]["reward_mean"]}
    for bar in shown.bars[1:]:
        assert bar["before"] == evaluation["before"]["reward_breakdown"][bar["reward"]]
        assert bar["after"] == evaluation["after"]["reward_breakdown"][bar["reward"]]

    assert len(shown.table) == len(samples) == 3
    shared, varying = compare.shared_template([sample["prompt"] for sample in samples])
    assert shared and f"Every prompt reads “{shared}”" in shown.summary  # said once, each row shows its own part
    assert shown.example_prompt == samples[0]["prompt"]
    for row, sample, part in zip(shown.table, samples, varying):
        assert len(row) == len(compare.TABLE_HEADERS) and part in sample["prompt"] and part != sample["prompt"]
        assert row[:4] == [part, sample["reference"], sample["before"]["reply"], sample["after"]["reply"]]
        assert row[4] == pytest.approx(sample["before"]["reward"], abs=1e-3)
        assert "numeric" in row[6] and "length" in row[6] and "→" in row[6]
    assert not shown.can_evaluate
    assert f"{evaluation['before']['reward_mean']:.3f} before" in shown.summary and "6 held-out prompts" in shown.summary
    # numeric (0 or 1) is the goal: a reply is right where it pays, so the share right is its mean
    for side in ("before", "after"):
        assert evaluation[side]["goal"] == ["numeric"]
        assert evaluation[side]["right"] == pytest.approx(evaluation[side]["reward_breakdown"]["numeric"])
    right = [round(evaluation[side]["right"] * 6) for side in ("before", "after")]
    assert f"Right answers by the goal (numeric): {right[0]} of 6 before → {right[1]} of 6 after." in shown.summary

    assert compare.comparable_runs(studio.runs.summaries()) == [(f"{finished_run.id} · succeeded", finished_run.id)]
    assert "Train tab's held-out checks" not in shown.summary  # they answered all 6 prompts too


def test_held_out_checks_on_fewer_prompts_are_told_apart_from_the_whole_set(finished_run):
    """0.473 on 8 prompts in the Train tab and 0.458 on 10 in Compare, both called "held-out", for one model."""
    checks = finished_run.read_heldout()
    assert checks and all((row["n_prompts"], row["of_prompts"]) == (6, 6) for row in checks)
    assert plots.heldout_check_name(checks[-1]) == "held-out check (6 prompts)"
    fewer = [{**row, "n_prompts": 4} for row in checks]
    finished_run.heldout_path.write_text("".join(json.dumps(row) + "\n" for row in fewer), encoding="utf-8")
    assert plots.heldout_check_name(fewer[-1]) == "held-out check (first 4 of 6 prompts)"
    summary = compare.comparison(finished_run).summary
    assert "on all 6 held-out prompts" in summary
    assert "The Train tab's held-out checks answer the first 4 of them, so their numbers differ." in summary


def test_evaluate_now_scores_a_stopped_run_from_its_latest_checkpoint(finished_run, studio, tiny_model_dir):
    strengthen_adapter(finished_run)
    original_eval, _ = stop_after_last_checkpoint(finished_run)
    shown = compare.comparison(finished_run)
    assert shown.can_evaluate and "Evaluate now" in shown.summary and "checkpoint-2" in shown.summary
    assert [bar["after"] for bar in shown.bars] == [None, None, None]

    # A cancel before the first batch leaves the files as they were.
    progress = list(evaluation.evaluate_now(studio.previews.load, finished_run, should_stop=lambda: True, policy=LAPTOP))
    assert progress[-1].startswith("Cancelled") and "after" not in finished_run.read_eval()

    progress = list(evaluation.evaluate_now(studio.previews.load, finished_run, policy=LAPTOP))
    assert progress[-1].startswith("Done") and "checkpoint-2" in progress[-1]
    scored = finished_run.read_eval()
    assert scored["before"] == original_eval["before"]  # already scored by training: kept, not recomputed
    assert scored["after"]["weights"] == "checkpoint-2"
    assert scored["improvement"] == pytest.approx(scored["after"]["reward_mean"] - scored["before"]["reward_mean"])
    # The same numbers and replies as an evaluation of the checkpoint done independently of the Studio.
    config = finished_run.read_config()
    examples = evaluation.held_out_examples(finished_run)
    _, adapted, tokenizer = base_and_adapter(tiny_model_dir, finished_run.latest_checkpoint())
    expected = evaluate_model(adapted, tokenizer, examples, build_rewards(config.rewards, policy=LAPTOP), config.grpo.max_new_tokens)
    assert scored["after"]["reward_mean"] == pytest.approx(expected.reward_mean)
    assert scored["after"]["reward_breakdown"] == pytest.approx(expected.breakdown)
    samples = finished_run.read_samples()
    assert [s["after"]["reply"] for s in samples] == expected.replies[:3]
    assert all(s["before"]["reply"] != s["after"]["reply"] for s in samples)
    assert not compare.comparison(finished_run).can_evaluate

    # Without any stored score, both sides are computed; "before" matches what training recorded.
    finished_run.eval_path.unlink()
    finished_run.samples_path.unlink()
    list(evaluation.evaluate_now(studio.previews.load, finished_run, policy=LAPTOP))
    scored = finished_run.read_eval()
    assert scored["before"]["reward_mean"] == pytest.approx(original_eval["before"]["reward_mean"])
    assert scored["after"]["reward_mean"] == pytest.approx(expected.reward_mean)


def test_evaluate_now_explains_what_is_missing(finished_run, studio):
    with pytest.raises(ConfigError, match="still running"):
        finished_run.update_status(state="running", pid=None)
        next(evaluation.evaluate_now(studio.previews.load, finished_run, policy=LAPTOP))
    finished_run.update_status(state="cancelled")
    # What a dataset too small to hold prompts out leaves: an empty eval.jsonl and no scores.
    (finished_run.eval_data_path).write_text("")
    finished_run.eval_path.unlink()
    finished_run.samples_path.unlink()
    with pytest.raises(ConfigError, match="no held-out prompts"):
        next(evaluation.evaluate_now(studio.previews.load, finished_run, policy=LAPTOP))
    shown = compare.comparison(finished_run)
    assert "no held-out prompts" in shown.summary and not shown.can_evaluate and shown.bars == shown.table == []


def test_answer_both_gives_the_starting_and_the_trained_reply(tiny_config_dict, studio, tiny_model_dir):
    tiny_config_dict["data"]["system"] = "Answer with one number."  # the free prompt is asked like training prompts
    tiny_config_dict["hardware"]["dtype"] = "float32"
    run = training.train_config(RunConfig.from_dict(tiny_config_dict, policy=LAPTOP), policy=LAPTOP)
    strengthen_adapter(run)

    before, after = compare.answer_both(studio, run, "What is 3 + 4?", max_new_tokens=12)
    assert isinstance(before, str) and isinstance(after, str) and before != after
    base, adapted, tokenizer = base_and_adapter(tiny_model_dir, run.adapter_dir)
    conversation = [[{"role": "system", "content": "Answer with one number."}, {"role": "user", "content": "What is 3 + 4?"}]]
    assert before == generate_replies(base, tokenizer, conversation, 12)[0]
    assert after == generate_replies(adapted, tokenizer, conversation, 12)[0]
    # The cached model is left with its adapter on, and asking again gives the same greedy replies.
    assert compare.answer_both(studio, run, "What is 3 + 4?", max_new_tokens=12) == (before, after)

    sampled = compare.answer_both(studio, run, "What is 3 + 4?", max_new_tokens=12, temperature=1.0)
    assert all(isinstance(reply, str) for reply in sampled)
    with pytest.raises(ConfigError, match="Type a prompt"):
        compare.answer_both(studio, run, "   ")


def test_answer_both_refuses_while_training_uses_the_cpu(finished_run, tiny_config_dict, studio):
    slow = "import time\ndef reward(prompt, completion, reference, row):\n    time.sleep(0.2)\n    return 1.0\n"
    tiny_config_dict["rewards"].append({"kind": "custom", "name": "slow", "code": slow})
    run = studio.runs.start(tiny_config_dict)
    try:
        with pytest.raises(BusyError, match="training is running"):
            compare.answer_both(studio, finished_run, "What is 3 + 4?")
    finally:
        studio.runs.stop(run.id)
    assert ended(run) == "cancelled"


def test_a_run_without_weights_cannot_answer(finished_run, studio):
    import shutil

    shutil.rmtree(finished_run.adapter_dir)
    shutil.rmtree(finished_run.checkpoints_dir)
    with pytest.raises(ConfigError, match="no trained weights yet"):
        compare.answer_both(studio, finished_run, "What is 3 + 4?")
    assert not compare.comparison(finished_run).can_evaluate


def test_full_fine_tuning_runs_compare_two_separate_models(tiny_config_dict, studio, tiny_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tiny_config_dict["lora"] = {"enabled": False}
    tiny_config_dict["hardware"]["dtype"] = "float32"
    run = training.train_config(RunConfig.from_dict(tiny_config_dict, policy=LAPTOP), policy=LAPTOP)
    # Make the trained model visibly different from the starting one.
    trained = AutoModelForCausalLM.from_pretrained(run.full_model_dir, dtype=torch.float32)
    torch.manual_seed(0)
    with torch.no_grad():
        for parameter in trained.model.layers.parameters():
            parameter.add_(torch.randn_like(parameter))
    trained.save_pretrained(run.full_model_dir)

    before, after = compare.answer_both(studio, run, "What is 3 + 4?", max_new_tokens=12)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    conversation = [[{"role": "user", "content": "What is 3 + 4?"}]]
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    assert before == generate_replies(base, tokenizer, conversation, 12)[0]
    assert after == generate_replies(trained, tokenizer, conversation, 12)[0] != before

    list(evaluation.evaluate_now(studio.previews.load, run, policy=LAPTOP))
    config = run.read_config()
    expected = evaluate_model(trained, tokenizer, evaluation.held_out_examples(run), build_rewards(config.rewards, policy=LAPTOP),
                              config.grpo.max_new_tokens)
    assert run.read_eval()["after"]["reward_mean"] == pytest.approx(expected.reward_mean)
    assert run.read_eval()["after"]["weights"] == "the final model"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="counts this process's threads in /proc/self/task")
def test_replies_on_a_borrowed_thread_leave_no_openmp_workers_behind(tiny_model_dir):
    """The UI's previews run on pooled threads that outlive the request; OpenMP workers left on them would make a
    later training's every step wait (see hardware.release_openmp_threads)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model, tokenizer = AutoModelForCausalLM.from_pretrained(tiny_model_dir), AutoTokenizer.from_pretrained(tiny_model_dir)
    conversation = [{"role": "user", "content": "What is 3 + 4?"}]
    busy, after, _ = openmp_threads_around(lambda: generate_replies(model, tokenizer, [conversation], 4))
    assert after < busy


TEMPLATE = "Solve the problem and put the answer after ####. Problem: "


@pytest.mark.parametrize("prompts, shared, parts", [
    ([TEMPLATE + "What is 2+3?", TEMPLATE + "What is 10-4?"],
     "Solve the problem and put the answer after ####. Problem: What is …", ["2+3?", "10-4?"]),
    (["What is 2+3? Answer with one number only.", "How many legs has a cat? Answer with one number only."],
     "… Answer with one number only.", ["What is 2+3?", "How many legs has a cat?"]),
    ([TEMPLATE + "2+3 Reply briefly and clearly please.", TEMPLATE + "10-4 Reply briefly and clearly please."],
     "Solve the problem and put the answer after ####. Problem: … Reply briefly and clearly please.",
     ["2+3", "10-4"]),
    (["What is 2+3?", "What is 10-4?"], "", ["What is 2+3?", "What is 10-4?"]),  # too short to be worth it
    ([TEMPLATE + "What is 2+3?"], "", [TEMPLATE + "What is 2+3?"]),  # one prompt shares nothing
    (["Translate: Haus", "Translate: Hausboot"], "", ["Translate: Haus", "Translate: Hausboot"]),
])
def test_shared_template_cuts_at_whole_words(prompts, shared, parts):
    assert compare.shared_template(prompts) == (shared, parts)
