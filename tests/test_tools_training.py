"""Multi-turn GRPO end to end on a tiny Qwen2 taught to call a calculator (tests/tool_model.py): the calls and the
tools' answers reach the run's records, TRL's loss mask leaves out exactly the tools' answers, the rewards score the
final answer, and the held-out checks call the tools as training does."""

from __future__ import annotations

import csv

import pytest

from dragon_ui.config import RunConfig
from dragon_ui.engine import training
from dragon_ui.errors import ConfigError
from tool_model import ANSWER, EXPRESSION, QUESTION

pytestmark = pytest.mark.timeout(300)


def tools_config(model_dir, tmp_path, runs_dir, **grpo) -> dict:
    data = tmp_path / "questions.csv"
    with open(data, "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["question", "answer"])
        writer.writerows([[QUESTION, ANSWER]] * 25)  # 20 rows or more keep some held out
    return {
        "name": "tools",
        "model": {"id": str(model_dir)},
        "data": {"source": str(data), "prompt": "question", "reference": "answer", "eval_frac": 0.2},
        # exact: 1 only when the scored text is the final answer alone, not the call or the whole conversation
        "rewards": [{"kind": "exact", "name": "answer"}],
        "tools": [{"kind": "calculator"}],
        "grpo": {"group_size": 2, "max_new_tokens": 64, **grpo},
        "training": {"batch_size": 2, "max_steps": 2, "save_steps": 2, "learning_rate": 0.01},
        "lora": {"r": 4, "alpha": 8},
        "hardware": {"device": "cpu", "cpu_threads": 1, "dtype": "float32"},
        "n_samples": 2,
        "runs_dir": str(runs_dir),
    }


@pytest.fixture
def captured_batches(monkeypatch):
    """What TRL hands its loss for each step: the completions' tokens and masks."""
    from trl import GRPOTrainer

    batches = []
    original = GRPOTrainer._generate_and_score_completions

    def capturing(self, inputs):
        output = original(self, inputs)
        batches.append({key: value for key, value in output.items()
                        if key in ("completion_ids", "completion_mask", "tool_mask")})
        return output

    monkeypatch.setattr(GRPOTrainer, "_generate_and_score_completions", capturing)
    return batches


def test_a_tools_run_records_every_turn_masks_the_answers_and_scores_the_final_reply(
        tiny_tool_model_dir, tmp_path, runs_dir, captured_batches):
    from transformers import AutoTokenizer

    handle = training.start(RunConfig.from_dict(tools_config(tiny_tool_model_dir, tmp_path, runs_dir)))
    handle.wait(timeout=240)
    run = handle.run
    status = run.read_status()
    assert status["state"] == "succeeded", status.get("error")

    # Every sampled completion called the calculator, read its answer and gave it: recorded turn by turn.
    steps = run.read_rollouts()
    assert [step["step"] for step in steps] == [1, 2]
    for group in (group for step in steps for group in step["groups"]):
        for completion in group["completions"]:
            assert completion["turns"] == [
                {"role": "assistant", "text": "", "calls": [{"name": "calculator",
                                                            "arguments": {"expression": EXPRESSION}}]},
                {"role": "tool", "name": "calculator", "text": ANSWER},
                {"role": "assistant", "text": ANSWER, "calls": []}]
            # the rewards saw the final answer alone: `exact` pays 1 only for "408" itself
            assert completion["text"] == ANSWER and completion["scores"] == {"answer": 1.0}
    progress_rows = run.read_progress()
    assert [(row["tool_calls"], row["tool_failures"]) for row in progress_rows] == [(1.0, 0.0), (1.0, 0.0)]

    # TRL's mask: the loss sees the model's tokens (the call, then the answer) and none of the tool's.
    tokenizer = AutoTokenizer.from_pretrained(tiny_tool_model_dir)
    assert len(captured_batches) == 2
    for batch in captured_batches:
        for ids, mask, tool_mask in zip(batch["completion_ids"], batch["completion_mask"], batch["tool_mask"],
                                        strict=True):
            kept = [token for token, m, t in zip(ids.tolist(), mask.tolist(), tool_mask.tolist(), strict=True)
                    if m and t]
            masked = [token for token, m, t in zip(ids.tolist(), mask.tolist(), tool_mask.tolist(), strict=True)
                      if m and not t]
            assert tokenizer.decode(kept) == (f'<tool_call>\n{{"name": "calculator", "arguments": {{"expression": '
                                              f'"{EXPRESSION}"}}}}\n</tool_call><|im_end|>{ANSWER}<|im_end|>')
            assert tokenizer.decode(masked) == (f"\n<|im_start|>user\n<tool_response>\n{ANSWER}\n</tool_response>"
                                                "<|im_end|>\n<|im_start|>assistant\n")

    card = (run.path / "adapter" / "README.md").read_text(encoding="utf-8")
    assert "## Tools" in card and "| calculator | calculator | Work out an arithmetic expression exactly" in card

    # The held-out checks called the tool too, so before and after score the whole exchange's final answer.
    evaluation = run.read_eval()
    assert evaluation["before"]["reward_mean"] == evaluation["after"]["reward_mean"] == 1.0
    assert status["heldout_before"] == status["heldout_after"] == 1.0


def test_a_model_whose_template_cannot_show_tools_is_refused_before_anything_trains(tiny_config_dict):
    config = RunConfig.from_dict({**tiny_config_dict, "tools": [{"kind": "calculator"}]})
    with pytest.raises(ConfigError, match=r"tools: .* cannot call tools: its chat template is not one TRL can show "
                                          "tools with"):
        training.inspect(config)


def test_a_preset_that_cannot_call_tools_is_refused_before_it_is_downloaded(tiny_config_dict):
    config = RunConfig.from_dict({**tiny_config_dict, "model": {"id": "google/gemma-3-1b-it"},
                                  "tools": [{"kind": "calculator"}]})
    with pytest.raises(ConfigError, match="tools: google/gemma-3-1b-it cannot call tools: Gemma 3's chat template has "
                                          "no turn for a tool's answer"):
        training.inspect(config)


def test_worked_examples_and_the_tools_schemas_are_counted_in_the_prompts(tiny_tool_model_dir, tmp_path, runs_dir):
    plain = tools_config(tiny_tool_model_dir, tmp_path, runs_dir)
    plain.pop("tools")
    without = training.inspect(RunConfig.from_dict(plain))
    with_tools = training.inspect(RunConfig.from_dict(tools_config(tiny_tool_model_dir, tmp_path, runs_dir)))
    shown = tools_config(tiny_tool_model_dir, tmp_path, runs_dir)
    shown["tools"] = [{"kind": "calculator", "examples": [{"question": "What is 2 * 3?",
                                                           "arguments": {"expression": "2 * 3"}}]}]
    with_examples = training.inspect(RunConfig.from_dict(shown))
    assert without.prompts.longest < with_tools.prompts.longest < with_examples.prompts.longest
    prompt = with_examples.mapped.train[0]["prompt"]
    assert [message["role"] for message in prompt] == ["user", "assistant", "tool", "assistant", "user"]
    assert prompt[2]["content"] == "6" and prompt[-1]["content"] == QUESTION


def test_the_preflight_and_the_playground_sample_calling_the_tools(tiny_tool_model_dir, tmp_path, runs_dir):
    """Will it learn? and Generate a group sample as a step does: a reply that calls the calculator is scored on its
    final answer. Without the tools, the same model's replies would all be calls, and all fail."""
    from dragon_ui.engine.models import ModelCache
    from dragon_ui.engine.preflight import preflight
    from dragon_ui.studio.playground import generate_groups, preview_examples, sampling_tools

    config = RunConfig.from_dict(tools_config(tiny_tool_model_dir, tmp_path, runs_dir))
    load = ModelCache().load
    report = preflight(config, load, prompts=2)
    assert report.share("all pass") == 1.0, report.verdict
    model, tokenizer = load(config.model, settings=config.hardware)
    examples, ready, tools = sampling_tools(config, preview_examples(config.data, count=1), tokenizer)
    from dragon_ui.rewards import build_rewards

    (group,) = generate_groups(model, ready, build_rewards(config.rewards), examples, config.grpo, tools=tools)
    shown = f'calculator(expression="{EXPRESSION}")\n→ calculator answered: {ANSWER}\n{ANSWER}'
    assert group.completions == [shown] * config.grpo.group_size  # each turn, to read in the playground's table
    assert group.totals == [1.0] * config.grpo.group_size  # scored on the final answer alone
