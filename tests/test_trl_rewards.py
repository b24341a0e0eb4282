"""TRL's own reward functions as kinds (think_format, overlong, repetition, cosine_length): each score is what TRL's
function gives on the same reply and the same tokens, in the playground, the command line, evaluation and training."""

from __future__ import annotations

import json
import math

import pytest
from transformers import AutoTokenizer
from trl.rewards import (get_cosine_scaled_reward, get_repetition_penalty_reward, get_soft_overlong_punishment,
                         think_format_reward)

from dragon_ui.config import RunConfig
from dragon_ui.errors import ConfigError
from dragon_ui.rewards import build_rewards, parse_rewards, reward_rule, score_completion
from dragon_ui.studio.monitor import health_alerts
from dragon_ui.studio.playground import playground_rewards
from dragon_ui.public import LAPTOP

REPEATS = "12 12 12 12 12 12 12 12 12 12"


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


def ids(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def trls_score(kind: str, settings: dict, reply: str, reference: str, tokenizer, max_new_tokens: int) -> float:
    """TRL's function called directly, as TRL's trainer would call it, on the reply's tokens."""
    limit = settings.get("max_tokens", max_new_tokens)
    message = [[{"role": "assistant", "content": reply}]]
    if kind == "think_format":
        return think_format_reward(message)[0]
    if kind == "overlong":
        buffer = settings.get("buffer_tokens", max(1, round(0.2 * limit)))
        return get_soft_overlong_punishment(limit, buffer)([ids(tokenizer, reply)])[0]
    if kind == "repetition":
        return get_repetition_penalty_reward(settings.get("ngram_size", 3), -1.0)([ids(tokenizer, reply)])[0]
    return get_cosine_scaled_reward(limit)(message, [f"${reference}$"], [ids(tokenizer, reply)])[0]


CASES = [
    ("think_format", {}, "<think>carry the 1</think> 85", ""),
    ("think_format", {}, "<think>\nfirst\nsecond\n</think>\n<answer>85</answer>", ""),
    ("think_format", {}, "85 <think>late</think>", ""),
    ("think_format", {}, "<think>one</think><think>two</think> 85", ""),
    ("think_format", {}, "<think>never closed 85", ""),
    ("think_format", {}, "", ""),
    ("overlong", {"max_tokens": 10, "buffer_tokens": 4}, "85", ""),
    ("overlong", {"max_tokens": 10, "buffer_tokens": 4}, "What is 47 + 38? Reply", ""),
    ("overlong", {"max_tokens": 10, "buffer_tokens": 4}, "What is 47 + 38? Reply with just the number.", ""),
    ("overlong", {"max_tokens": 10, "buffer_tokens": 4}, REPEATS * 3, ""),
    ("overlong", {}, "What is 47 + 38? Reply with just the number.", ""),  # the run's max new tokens, a fifth
    ("overlong", {"max_tokens": 6, "buffer_tokens": 6}, "What is 47", ""),
    ("repetition", {}, "What is 47 + 38?", ""),
    ("repetition", {}, REPEATS, ""),
    ("repetition", {"ngram_size": 1}, REPEATS, ""),
    ("repetition", {"ngram_size": 5}, "12", ""),  # fewer tokens than the n-gram: 0
    ("cosine_length", {"max_tokens": 40}, "\\boxed{85}", "85"),
    ("cosine_length", {"max_tokens": 40}, "The sum is $85$ " + REPEATS, "85"),
    ("cosine_length", {"max_tokens": 40}, "\\boxed{84}", "85"),
    ("cosine_length", {"max_tokens": 40}, "I think it is $84$ " + REPEATS * 4, "85"),
    ("cosine_length", {"max_tokens": 40}, "\\boxed{\\frac{1}{2}}", "0.5"),
    ("cosine_length", {"max_tokens": 40}, "85", "85"),  # TRL's accuracy_reward needs LaTeX: a bare number is wrong
    ("cosine_length", {}, "\\boxed{85}", "85"),
]


@pytest.mark.parametrize("kind, settings, reply, reference", CASES)
def test_each_score_is_trls_own(kind, settings, reply, reference, tokenizer):
    reward = build_rewards(parse_rewards([{"kind": kind, **settings}], policy=LAPTOP), tokenizer=tokenizer, max_new_tokens=12, policy=LAPTOP)
    result = score_completion(reward, reply, reference=reference or None)
    assert result.errors == {}
    expected = trls_score(kind, settings, reply, reference, tokenizer, 12)
    assert result.scores[kind] == pytest.approx(expected, abs=1e-12)


def test_the_cases_cover_every_outcome(tokenizer):
    """The table above is not all zeros: each kind gives its full range on it."""
    seen: dict[str, set[float]] = {}
    for kind, settings, reply, reference in CASES:
        seen.setdefault(kind, set()).add(round(trls_score(kind, settings, reply, reference, tokenizer, 12), 3))
    assert seen["think_format"] == {0.0, 1.0}
    assert min(seen["overlong"]) == -1.0 and max(seen["overlong"]) == 0.0 and len(seen["overlong"]) >= 3
    assert min(seen["repetition"]) < -0.5 and max(seen["repetition"]) == 0.0
    assert {value > 0 for value in seen["cosine_length"]} == {True, False}
    assert len(seen["cosine_length"]) >= 4  # short and long, right and wrong


def test_the_weight_scales_a_penalty_into_the_total(tokenizer):
    rewards = build_rewards(parse_rewards([{"kind": "numeric"}, {"kind": "repetition", "weight": 0.5}], policy=LAPTOP),
                            tokenizer=tokenizer, policy=LAPTOP)
    result = score_completion(rewards, REPEATS, reference="12")
    assert result.scores["numeric"] == 1.0 and result.scores["repetition"] < 0
    assert result.total == pytest.approx(1.0 + 0.5 * result.scores["repetition"])


def test_without_a_tokenizer_a_token_counting_reward_fails_in_words_and_is_counted():
    rewards = build_rewards(parse_rewards([{"kind": "repetition"}, {"kind": "think_format"}], policy=LAPTOP), policy=LAPTOP)
    result = score_completion(rewards, "<think>a</think>")
    assert result.scores == {"repetition": 0.0, "think_format": 1.0}
    assert "needs the starting model's tokenizer" in result.errors["repetition"]


def test_a_length_limit_comes_from_the_reward_or_the_run():
    with pytest.raises(ConfigError, match=r"rewards\[0\]\.max_tokens is missing"):
        build_rewards(parse_rewards([{"kind": "overlong"}], policy=LAPTOP), policy=LAPTOP)
    with pytest.raises(ConfigError, match=r"buffer_tokens \(20\) is larger than grpo.max_new_tokens \(16\), the "
                                          "length limit"):
        build_rewards(parse_rewards([{"kind": "overlong", "buffer_tokens": 20}], policy=LAPTOP), max_new_tokens=16, policy=LAPTOP)


@pytest.mark.parametrize("settings, problem", [
    ({"kind": "overlong", "max_tokens": 10, "buffer_tokens": 11}, r"buffer_tokens \(11\) is larger than .*max_tokens"),
    ({"kind": "overlong", "max_tokens": 0}, "whole number of tokens from 1 to 32768"),
    ({"kind": "cosine_length", "max_tokens": 1e300}, "whole number of tokens from 1 to 32768"),
    ({"kind": "overlong", "max_tokens": 10**400}, "must be a number"),
    ({"kind": "repetition", "ngram_size": -10**400}, "must be a number"),
    ({"kind": "overlong", "max_tokens": 2.5}, "whole number of tokens"),
    ({"kind": "overlong", "buffer_tokens": "many"}, "must be a number"),
    ({"kind": "repetition", "ngram_size": 0}, "from 1 to"),
    ({"kind": "repetition", "ngram_size": 33}, "at most 32"),
    ({"kind": "repetition", "max_tokens": 10}, "does not apply to a repetition reward; it is a setting of overlong"),
    ({"kind": "think_format", "tags": ["think"]}, "does not apply to a think_format reward"),
    ({"kind": "cosine_length", "buffer_tokens": 3}, "does not apply to a cosine_length reward"),
    ({"kind": "numeric", "ngram_size": 3}, "it is a setting of repetition rewards"),
])
def test_bad_settings_are_refused_with_the_field_named(settings, problem):
    with pytest.raises(ConfigError, match=problem):
        parse_rewards([settings], policy=LAPTOP)


def test_a_buffer_longer_than_the_runs_replies_is_refused_when_the_config_is_checked(tiny_config_dict):
    tiny_config_dict["rewards"].append({"kind": "overlong", "buffer_tokens": 7})
    with pytest.raises(ConfigError, match=r"rewards\[2\]\.buffer_tokens \(7\) is larger than grpo.max_new_tokens \(6\)"):
        RunConfig.from_dict(tiny_config_dict, policy=LAPTOP).validate()


def test_each_kind_says_what_it_pays_for():
    rules = {spec.kind: reward_rule(spec) for spec in parse_rewards(
        [{"kind": "think_format"}, {"kind": "overlong", "max_tokens": 64}, {"kind": "repetition"},
         {"kind": "cosine_length"}], policy=LAPTOP)}
    assert "<think>" in rules["think_format"] and "64 tokens" in rules["overlong"]
    assert "3-token" in rules["repetition"] and "the run's max new tokens" in rules["cosine_length"]


def test_the_playground_counts_with_the_drafts_model_and_its_max_new_tokens(tiny_config_dict, tokenizer):
    draft = {**tiny_config_dict, "rewards": [{"kind": "overlong"}], "grpo": {"max_new_tokens": 10}}
    reply = "12 12 12 12 12 12 12 12 12"
    score = score_completion(playground_rewards(draft, policy=LAPTOP), reply).scores["overlong"]
    assert score == get_soft_overlong_punishment(10, 2)([ids(tokenizer, reply)])[0] and -1 < score < 0
    draft["grpo"] = {"max_new_tokens": "half typed"}
    with pytest.raises(ConfigError, match="max_tokens is missing"):
        playground_rewards(draft, policy=LAPTOP)


def test_a_penalty_that_stays_at_zero_is_not_a_reward_that_never_pays():
    config = {"rewards": [{"kind": "numeric"}, {"kind": "repetition", "name": "no_repeats"}]}
    rows = [{"step": step, "rewards": {"numeric": 0.0, "no_repeats": 0.0}} for step in range(1, 9)]
    flat = {alert.key for alert in health_alerts(rows, {}, config) if alert.kind == "reward_flat"}
    assert flat == {"rewards/numeric"}


def test_trls_math_verify_calls_get_the_workers_time_limits(monkeypatch):
    """TRL's accuracy_reward would give math-verify up to 25 s a reply; in the worker each call gets CHECK_S, so a
    cosine_length check ends within the time a reply may hold the shared worker."""
    import trl.rewards.accuracy_rewards as accuracy

    from dragon_ui.rewards import math_answers

    seen = []
    monkeypatch.setattr(accuracy, "parse", lambda text, parsing_timeout=None, **_: seen.append(parsing_timeout) or [1])
    monkeypatch.setattr(accuracy, "verify", lambda gold, answer, timeout_seconds=None: seen.append(timeout_seconds) or 1)
    monkeypatch.setattr(accuracy, "limited_by_dragon", False, raising=False)
    math_answers._limit_trls_math_verify()
    accuracy.accuracy_reward([[{"content": "\\boxed{1}"}]], ["1"])
    assert seen == [math_answers.CHECK_S] * 3 and 3 * math_answers.CHECK_S < math_answers.LIMIT_S


def test_the_command_line_scores_a_recipe_by_name(capsys):
    from dragon_ui.cli import main

    assert main(["score", "--rewards", "arithmetic", "--completion", "42"]) == 0
    assert json.loads(capsys.readouterr().out)["scores"]["length"] == 1.0


def test_the_command_line_scores_with_the_configs_model(tiny_config_dict, tmp_path, capsys):
    from dragon_ui.cli import main

    tiny_config_dict["rewards"] = [{"kind": "overlong", "max_tokens": 4, "buffer_tokens": 2}, {"kind": "think_format"}]
    path = tmp_path / "config.json"
    path.write_text(json.dumps(tiny_config_dict), encoding="utf-8")
    assert main(["score", "--rewards", str(path), "--completion", "What is 47 + 38? Reply"]) == 0
    assert json.loads(capsys.readouterr().out)["scores"] == {"overlong": -1.0, "think_format": 0.0}


def test_a_training_scores_with_trls_functions_on_the_replies_tokens(tiny_config_dict, tokenizer):
    """End to end on the tiny model: every sampled reply's score is TRL's on its tokens, the held-out checks score
    with the same rewards, and a penalty at 0 raises no alarm in the run's log."""
    from dragon_ui.engine import training

    tiny_config_dict["rewards"] = [{"kind": "think_format"}, {"kind": "overlong", "buffer_tokens": 3},
                                   {"kind": "repetition", "ngram_size": 1},
                                   {"kind": "cosine_length", "weight": 0.5}]
    run = training.train_config(RunConfig.from_dict(tiny_config_dict, policy=LAPTOP), policy=LAPTOP)
    status = run.read_status()
    assert status["state"] == "succeeded", status.get("error")
    rows = run.read_progress()
    assert all(row["errors"][name] == 0 for row in rows for name in ("overlong", "repetition", "cosine_length"))
    checked = 0
    for record in run.read_rollouts():
        for group in record["groups"]:
            for completion in group["completions"]:
                reply, scores = completion["text"], completion["scores"]
                # TRL keeps the scores as float32
                assert scores["overlong"] == pytest.approx(
                    trls_score("overlong", {"buffer_tokens": 3}, reply, "", tokenizer, 6), rel=1e-6)
                assert scores["repetition"] == pytest.approx(
                    trls_score("repetition", {"ngram_size": 1}, reply, "", tokenizer, 6), rel=1e-6)
                assert scores["think_format"] == think_format_reward([[{"content": reply}]])[0]
                assert math.isfinite(scores["cosine_length"]) and -1 <= scores["cosine_length"] <= 1
                checked += 1
    assert checked == 8  # 2 steps x 2 prompts x 2 replies
    evaluation = run.read_eval()
    assert set(evaluation["after"]["reward_breakdown"]) == {"think_format", "overlong", "repetition", "cosine_length"}
