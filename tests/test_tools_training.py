"""Multi-turn GRPO end to end on a tiny Qwen2 taught to call a calculator (tests/tool_model.py): the calls and the
tools' answers reach the run's records, TRL's loss mask leaves out exactly the tools' answers, the rewards score the
final answer, and the held-out checks call the tools as training does."""

from __future__ import annotations

import csv

import pytest

from dragon_ui.config import RunConfig
from dragon_ui.engine import training
from dragon_ui.public import LAPTOP
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

    run = training.train_config(RunConfig.from_dict(tools_config(tiny_tool_model_dir, tmp_path, runs_dir), policy=LAPTOP), policy=LAPTOP)
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
    config = RunConfig.from_dict({**tiny_config_dict, "tools": [{"kind": "calculator"}]}, policy=LAPTOP)
    with pytest.raises(ConfigError, match=r"tools: .* cannot call tools: its chat template is not one TRL can show "
                                          "tools with"):
        training.inspect(config, policy=LAPTOP)


def test_a_preset_that_cannot_call_tools_is_refused_before_it_is_downloaded(tiny_config_dict):
    config = RunConfig.from_dict({**tiny_config_dict, "model": {"id": "google/gemma-3-1b-it"},
                                  "tools": [{"kind": "calculator"}]}, policy=LAPTOP)
    with pytest.raises(ConfigError, match="tools: google/gemma-3-1b-it cannot call tools: Gemma 3's chat template has "
                                          "no turn for a tool's answer"):
        training.inspect(config, policy=LAPTOP)


def test_worked_examples_and_the_tools_schemas_are_counted_in_the_prompts(tiny_tool_model_dir, tmp_path, runs_dir):
    plain = tools_config(tiny_tool_model_dir, tmp_path, runs_dir)
    plain.pop("tools")
    without = training.inspect(RunConfig.from_dict(plain, policy=LAPTOP), policy=LAPTOP)
    with_tools = training.inspect(RunConfig.from_dict(tools_config(tiny_tool_model_dir, tmp_path, runs_dir), policy=LAPTOP), policy=LAPTOP)
    shown = tools_config(tiny_tool_model_dir, tmp_path, runs_dir)
    shown["tools"] = [{"kind": "calculator", "examples": [{"question": "What is 2 * 3?",
                                                           "arguments": {"expression": "2 * 3"}}]}]
    with_examples = training.inspect(RunConfig.from_dict(shown, policy=LAPTOP), policy=LAPTOP)
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

    config = RunConfig.from_dict(tools_config(tiny_tool_model_dir, tmp_path, runs_dir), policy=LAPTOP)
    load = ModelCache().load
    report = preflight(config, load, prompts=2, policy=LAPTOP)
    assert report.share("all pass") == 1.0, report.verdict
    model, tokenizer = load(config.model, settings=config.hardware)
    examples, ready, tools = sampling_tools(config, preview_examples(config.data, count=1, policy=LAPTOP), tokenizer, policy=LAPTOP)
    from dragon_ui.rewards import build_rewards

    (group,) = generate_groups(model, ready, build_rewards(config.rewards, policy=LAPTOP), examples, config.grpo, tools=tools)
    shown = f'calculator(expression="{EXPRESSION}")\n→ calculator answered: {ANSWER}\n{ANSWER}'
    assert group.completions == [shown] * config.grpo.group_size  # each turn, to read in the playground's table
    assert group.totals == [1.0] * config.grpo.group_size  # scored on the final answer alone


COUNTING_ENVIRONMENT = '''
class Counting:
    """Answers calculator calls and remembers them; scores the conversation by what it was asked."""

    worth = {worth}

    def reset(self, question, reference, row):
        self.calls = []

    def calculator(self, expression: str) -> str:
        """Work out an arithmetic expression exactly.

        Args:
            expression: The arithmetic to work out.
        """
        self.calls.append(expression)
        return "408" if expression == "12 * 34" else "?"

    def get_reward(self) -> float:
        return self.worth if self.calls == ["12 * 34"] else 0.0
'''


def environment_config(model_dir, tmp_path, runs_dir, worths: dict[str, float]) -> dict:
    """A run whose model plays one environment per conversation (a Counting one per name, each scoring its
    conversations ``worth``), picked per row by the column ``game`` when there are several; the rows cycle through
    them, and each row's reference names its environment."""
    config = tools_config(model_dir, tmp_path, runs_dir)
    names = list(worths)
    data = tmp_path / "games.csv"
    with open(data, "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["question", "answer", "game"])
        writer.writerows([[QUESTION, names[row % len(names)], names[row % len(names)]] for row in range(25)])
    config["data"].update(source=str(data), reference="answer",
                          environment_column="game" if len(names) > 1 else None)
    config["tools"] = [{"kind": "environment", "name": name, "class_name": "Counting",
                        "code": COUNTING_ENVIRONMENT.format(worth=worth)} for name, worth in worths.items()]
    config["rewards"] = [{"kind": "environment", "name": "played"}]
    return config


def test_each_conversation_plays_its_own_environment_which_scores_it(tiny_tool_model_dir, tmp_path, runs_dir):
    """One environment per conversation, picked by the row's column: its method is the tool the model calls, and
    its get_reward is the run's environment reward, in the rollouts, the progress rows and the held-out scores,
    not a reward TRL adds beside the run's."""
    config = environment_config(tiny_tool_model_dir, tmp_path, runs_dir, {"easy": 1.0, "hard": 0.25})
    run = training.train_config(RunConfig.from_dict(config, policy=LAPTOP), policy=LAPTOP)
    status = run.read_status()
    assert status["state"] == "succeeded", status.get("error")

    groups = [group for step in run.read_rollouts() for group in step["groups"]]
    assert {group["reference"] for group in groups} == {"easy", "hard"}  # both environments were played
    for group in groups:
        for completion in group["completions"]:
            assert completion["turns"][:2] == [
                {"role": "assistant", "text": "", "calls": [{"name": "calculator",
                                                            "arguments": {"expression": EXPRESSION}}]},
                {"role": "tool", "name": "calculator", "text": ANSWER}]
            assert completion["scores"] == {"played": {"easy": 1.0, "hard": 0.25}[group["reference"]]}
    for row in run.read_progress():
        assert set(row["rewards"]) == {"played"}, row  # TRL's own get_reward column ("Counting") is not there

    evaluation = run.read_eval()
    held_out = [example["environment"] for example in training.read_jsonl(run.eval_data_path)]
    expected = sum({"easy": 1.0, "hard": 0.25}[name] for name in held_out) / len(held_out)
    assert evaluation["before"]["reward_breakdown"]["played"] == pytest.approx(expected)
    assert evaluation["after"]["reward_breakdown"]["played"] == pytest.approx(expected)


@pytest.mark.parametrize(("change", "refusal"), [
    ({"data": {"environment_column": None}}, r"data.environment_column is missing: with 2 environments"),
    ({"rows": {3: "chess"}}, r"Row 3: data.environment_column 'game' says 'chess', which is not one of the "
                             r"environments: easy, hard"),
])
def test_rows_that_pick_no_environment_are_refused_before_training(tiny_tool_model_dir, tmp_path, runs_dir, change,
                                                                   refusal):
    config = environment_config(tiny_tool_model_dir, tmp_path, runs_dir, {"easy": 1.0, "hard": 0.25})
    for row, game in change.get("rows", {}).items():
        path = config["data"]["source"]
        with open(path, encoding="utf-8") as handle:
            lines = handle.read().splitlines()
        lines[row] = lines[row].rsplit(",", 1)[0] + f",{game}"
        with open(path, "w", encoding="utf-8") as handle:
            handle.write("\n".join(lines) + "\n")
    config["data"].update(change.get("data", {}))
    with pytest.raises(ConfigError, match=refusal):
        training.inspect(RunConfig.from_dict(config, policy=LAPTOP), policy=LAPTOP)


def test_a_bundled_environment_alone_is_played_and_scores_itself(tiny_tool_model_dir, tmp_path, runs_dir):
    """The arithmetic environment, the run's only one: its calculator answers the model's call, and it scores 0 a
    conversation that never submits a result, while the answer it gives in words still earns `exact`."""
    config = tools_config(tiny_tool_model_dir, tmp_path, runs_dir)
    config["tools"] = [{"kind": "arithmetic"}]
    config["rewards"] = [{"kind": "exact", "name": "answer"}, {"kind": "environment", "name": "submitted"}]
    config["training"]["max_steps"] = 1
    run = training.train_config(RunConfig.from_dict(config, policy=LAPTOP), policy=LAPTOP)
    assert run.read_status()["state"] == "succeeded", run.read_status().get("error")
    for group in run.read_rollouts()[0]["groups"]:
        for completion in group["completions"]:
            assert completion["turns"][1] == {"role": "tool", "name": "calculator", "text": ANSWER}
            assert completion["scores"] == {"answer": 1.0, "submitted": 0.0}
    assert run.read_eval()["after"]["reward_breakdown"] == {"answer": 1.0, "submitted": 0.0}
