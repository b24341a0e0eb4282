"""Tests for dragon_ui.rewards: every kind and extraction mode, validation messages, failure handling, TRL adapter."""

import dataclasses
import json
import os
import re
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from dragon_ui.errors import ConfigError
from dragon_ui.public import LAPTOP, Limits, Policy
from dragon_ui.rewards import (
    EXTRACT_MODES,
    GOAL_KINDS,
    PENALTY_KINDS,
    REWARD_CLASSES,
    REWARD_KINDS,
    REWARD_SETTINGS,
    RewardFailures,
    RewardSpec,
    ScoreResult,
    build_rewards,
    check_some_weight,
    public_refusal,
    extract_answer,
    parse_rewards,
    safe_score,
    score_completion,
    training_weight,
    trl_reward_functions,
)

PY = sys.executable
LONG = "lorem ipsum dolor sit amet " * 4000  # about 108k characters


@pytest.fixture(autouse=True)
def private_machine(monkeypatch):
    """Run as on a private machine unless a test turns public mode on."""
    monkeypatch.delenv("SPACE_ID", raising=False)
    monkeypatch.delenv("DRAGON_UI_PUBLIC", raising=False)


def build(settings: dict, base_dir=None):
    return build_rewards([RewardSpec.from_dict(settings, policy=LAPTOP)], base_dir=base_dir, policy=LAPTOP)[0]


def score(settings: dict, completion: str, reference=None, prompt: str = "", row=None):
    """Score through the safe path and fail the test if the reward itself failed."""
    value, error = safe_score(build(settings), prompt, completion, reference, row or {})
    assert error is None, error
    return value


def test_kind_and_mode_lists():
    assert REWARD_KINDS == ("exact", "contains", "numeric", "math", "regex", "json", "length", "keyword", "format",
                            "think_format", "overlong", "repetition", "cosine_length", "classifier", "command", "custom",
                            "environment")
    assert EXTRACT_MODES == ("whole", "last_number", "after_hashes", "boxed", "answer_tag")


def test_each_kind_says_what_it_is():
    """The traits the goal, the pre-flight, the monitor and scoring read, each said by its kind's class."""
    assert GOAL_KINDS == ("exact", "contains", "numeric", "math", "json", "cosine_length", "environment")
    assert PENALTY_KINDS == ("overlong", "repetition")
    assert [cls.kind for cls in REWARD_CLASSES if cls.reads_reference] == ["exact", "contains", "numeric", "math",
                                                                         "cosine_length"]
    assert [cls.kind for cls in REWARD_CLASSES if cls.from_trl] == ["think_format", "overlong", "repetition",
                                                                  "cosine_length"]
    assert [cls.kind for cls in REWARD_CLASSES if cls.counts_tokens] == ["overlong", "repetition", "cosine_length"]
    assert all(cls.help.strip() for cls in REWARD_CLASSES)


def test_a_setting_several_kinds_take_is_declared_alike_in_each():
    """The Rewards tab has one field for it and the reference one row, made from its first declaration."""
    for cls in REWARD_CLASSES:
        for spec in dataclasses.fields(cls):
            first = REWARD_SETTINGS[spec.name]
            assert (spec.default, dict(spec.metadata)) == (first.default, dict(first.metadata)), (cls.kind, spec.name)
            assert spec.metadata["label"] and spec.metadata["help"] and callable(spec.metadata["read"])


# ---------------------------------------------------------------------------------------------------------------------
# Extraction
# ---------------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("mode, text, expected", [
    ("whole", "  The answer is 5. ", "  The answer is 5. "),
    ("last_number", "first 3 then -4.5", "-4.5"),
    ("last_number", "total: 1,234.5 dollars", "1234.5"),
    ("last_number", "from 3-5 apples", "5"),
    ("last_number", "x = +7", "7"),
    ("last_number", "minus \u22122", "-2"),
    ("last_number", "half is .5", ".5"),
    ("last_number", "The answer is 42.", "42"),
    ("last_number", "no numbers here", ""),
    ("last_number", "", ""),
    ("after_hashes", "reasoning #### 72", "72"),
    ("after_hashes", "a #### 1 #### 2 ", "2"),
    ("after_hashes", "no hashes", ""),
    ("boxed", r"so \boxed{\frac{1}{2}} done", r"\frac{1}{2}"),
    ("boxed", r"\boxed{1} then \boxed{2}", "2"),
    ("boxed", r"cut off \boxed{3", ""),
    ("boxed", "no box", ""),
    ("answer_tag", "<answer>1</answer> <answer> 2 </answer>", " 2 "),
    ("answer_tag", "<answer>unclosed", ""),
    ("answer_tag", "</answer> only", ""),
    ("answer_tag", "<answer>ünïcødé ✓</answer>", "ünïcødé ✓"),
])
def test_extract_answer(mode, text, expected):
    assert extract_answer(text, mode) == expected


@pytest.mark.parametrize("mode", EXTRACT_MODES)
def test_extraction_is_fast_on_long_text(mode):
    start = time.perf_counter()
    extract_answer(LONG + " 12 <answer>7</answer> #### 9 \\boxed{3" + "{" * 1000, mode)
    assert time.perf_counter() - start < 0.5


# ---------------------------------------------------------------------------------------------------------------------
# Built-in kinds
# ---------------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("settings, completion, reference, expected", [
    # exact
    ({"kind": "exact"}, "  Paris.  ", "paris", 1.0),
    ({"kind": "exact"}, "The   capital\nis Paris", "the capital is paris!", 1.0),
    ({"kind": "exact"}, "Paris, France", "Paris", 0.0),
    ({"kind": "exact", "case_sensitive": True}, "paris", "Paris", 0.0),
    ({"kind": "exact", "case_sensitive": True}, "Paris", "Paris", 1.0),
    ({"kind": "exact"}, "", "Paris", 0.0),
    ({"kind": "exact"}, "STRASSE", "straße", 1.0),
    ({"kind": "exact", "extract": "after_hashes"}, "steps... #### 72", "72", 1.0),
    ({"kind": "exact", "extract": "after_hashes"}, "no hashes 72", "72", 0.0),
    ({"kind": "exact", "extract": "boxed"}, r"thus \boxed{x+1}.", "x+1", 1.0),
    ({"kind": "exact", "extract": "answer_tag"}, "<think>hm</think><answer> Yes </answer>", "yes", 1.0),
    ({"kind": "exact", "extract": "last_number"}, "it is 1,234", "1234", 1.0),
    ({"kind": "exact", "extract": "last_number"}, "no number", "1234", 0.0),
    # contains
    ({"kind": "contains"}, "I think the answer is PARIS, France.", "paris", 1.0),
    ({"kind": "contains"}, "London", "paris", 0.0),
    ({"kind": "contains", "case_sensitive": True}, "PARIS", "Paris", 0.0),
    ({"kind": "contains", "extract": "answer_tag"}, "Paris <answer>Rome</answer>", "paris", 0.0),
    ({"kind": "contains"}, "", "paris", 0.0),
    ({"kind": "contains"}, LONG + "needle", "needle", 1.0),
    # numeric
    ({"kind": "numeric"}, "The answer is 42.", "42", 1.0),
    ({"kind": "numeric"}, "The answer is 42.0", "#### 42", 1.0),
    ({"kind": "numeric"}, "It's -3.5 degrees", "-3.5", 1.0),
    ({"kind": "numeric"}, "It's 3.5 degrees", "-3.5", 0.0),
    ({"kind": "numeric"}, "Total: 1,234.5", "1234.5", 1.0),
    ({"kind": "numeric"}, "first 7, finally 8", "7", 0.0),
    ({"kind": "numeric"}, "no number at all", "7", 0.0),
    ({"kind": "numeric"}, "", "7", 0.0),
    ({"kind": "numeric"}, "0.0000001", "0", 1.0),
    ({"kind": "numeric"}, "100.4", "100", 0.0),
    ({"kind": "numeric", "tolerance": 0.01}, "100.9", "100", 1.0),
    ({"kind": "numeric", "tolerance": 0.01}, "101.1", "100", 0.0),
    ({"kind": "numeric", "extract": "boxed"}, r"maybe 5 \boxed{6} or 7", "6", 1.0),
    ({"kind": "numeric", "extract": "after_hashes"}, "42 and no hashes", "42", 0.0),
    ({"kind": "numeric", "extract": "answer_tag"}, "<answer>x = 1/3 ≈ 0.333</answer>", "0.333", 1.0),
    ({"kind": "numeric"}, LONG + " 9", "9", 1.0),
    # regex
    ({"kind": "regex", "pattern": r"answer:\s*\d+"}, "Answer: 12", None, 1.0),
    ({"kind": "regex", "pattern": r"answer:\s*\d+", "case_sensitive": True}, "Answer: 12", None, 0.0),
    ({"kind": "regex", "pattern": r"^\d+$"}, "abc", None, 0.0),
    ({"kind": "regex", "pattern": "ü+"}, "grüüß", None, 1.0),
    # json
    ({"kind": "json"}, '{"a": 1}', None, 1.0),
    ({"kind": "json"}, '```json\n{"a": 1}\n```', None, 1.0),
    ({"kind": "json"}, '  ```\n[1, 2]\n```  ', None, 1.0),
    ({"kind": "json"}, '```json {"a": 1}```', None, 1.0),
    ({"kind": "json"}, 'Here: ```json\n{"a": 1}\n```', None, 0.0),
    ({"kind": "json"}, '{"a": 1,}', None, 0.0),
    ({"kind": "json"}, "", None, 0.0),
    ({"kind": "json"}, "[" * 100_000, None, 0.0),
    ({"kind": "json", "keys": ["a", "b"]}, '{"a": 1, "b": 2, "c": 3}', None, 1.0),
    ({"kind": "json", "keys": ["a", "b"]}, '{"a": 1}', None, 0.5),
    ({"kind": "json", "keys": ["a", "b"]}, '[{"a": 1, "b": 2}]', None, 0.0),
    ({"kind": "json", "keys": "a"}, '"a"', None, 0.0),
    ({"kind": "json", "keys": ["ключ"]}, '{"ключ": "значение"}', None, 1.0),
    # length (stripped length is what counts)
    ({"kind": "length", "min_chars": 10, "max_chars": 20}, "x" * 10, None, 1.0),
    ({"kind": "length", "min_chars": 10, "max_chars": 20}, "x" * 20, None, 1.0),
    ({"kind": "length", "min_chars": 10, "max_chars": 20}, "   " + "x" * 5 + "  ", None, 0.5),
    ({"kind": "length", "min_chars": 10, "max_chars": 20}, "", None, 0.0),
    ({"kind": "length", "min_chars": 10, "max_chars": 20}, "x" * 25, None, 0.75),
    ({"kind": "length", "min_chars": 10, "max_chars": 20}, "x" * 40, None, 0.0),
    ({"kind": "length", "min_chars": 10, "max_chars": 20}, "x" * 41, None, 0.0),
    ({"kind": "length", "max_chars": 20}, "", None, 1.0),
    ({"kind": "length", "max_chars": 0}, "x", None, 0.0),
    ({"kind": "length", "min_chars": 4}, "ü" * 3, None, 0.75),
    ({"kind": "length", "min_chars": 4}, LONG, None, 1.0),
    # keyword
    ({"kind": "keyword", "words": ["Paris", "France"]}, "I love paris", None, 1.0),
    ({"kind": "keyword", "words": ["Paris", "France"]}, "I love Rome", None, 0.0),
    ({"kind": "keyword", "words": ["Paris", "France"], "mode": "all"}, "PARIS", None, 0.5),
    ({"kind": "keyword", "words": ["Paris", "France"], "mode": "all"}, "Paris, France", None, 1.0),
    ({"kind": "keyword", "words": "because"}, "Because reasons", None, 1.0),
    ({"kind": "keyword", "words": ["Straße"]}, "STRASSE", None, 1.0),
    ({"kind": "keyword", "words": ["needle"]}, "", None, 0.0),
])
def test_builtin_kinds(settings, completion, reference, expected):
    assert score(settings, completion, reference) == pytest.approx(expected)


THIRD = 1 / 3


@pytest.mark.parametrize("settings, completion, expected", [
    ({"kind": "format"}, "<think>plan</think><answer>42</answer>", 1.0),
    ({"kind": "format"}, "\n <think>\nplan\n</think>\n\n<answer>42</answer>\n", 1.0),
    ({"kind": "format"}, "<think></think><answer></answer>", 1.0),
    ({"kind": "format", "preset": "think_answer"}, "<think>a</think><answer>b</answer>", 1.0),
    ({"kind": "format"}, "Sure! <think>a</think><answer>b</answer>", 2 * THIRD),
    ({"kind": "format"}, "<think>a</think> and <answer>b</answer>", 2 * THIRD),
    ({"kind": "format"}, "<answer>b</answer><think>a</think>", 2 * THIRD),
    ({"kind": "format"}, "<think>a</think><answer>b</answer><answer>c</answer>", 2 * THIRD),
    ({"kind": "format"}, "<think>a<think>b</think><answer>c</answer>", 2 * THIRD),
    ({"kind": "format"}, "<think>a</think><answer>b", THIRD),
    ({"kind": "format"}, "</think>a<think><answer>b</answer>", THIRD),
    ({"kind": "format"}, "just text", 0.0),
    ({"kind": "format"}, "", 0.0),
    ({"kind": "format"}, "<THINK>a</THINK><ANSWER>b</ANSWER>", 0.0),
    ({"kind": "format"}, "<think>" + LONG + "</think><answer>1</answer>", 1.0),
    ({"kind": "format"}, "<think>" + LONG + "</think><answer>1", THIRD),
    ({"kind": "format", "tags": ["reasoning", "code", "answer"]},
     "<reasoning>r</reasoning><code>c</code><answer>a</answer>", 1.0),
    ({"kind": "format", "tags": ["reasoning", "code", "answer"]}, "<reasoning>r</reasoning><answer>a</answer>", 0.5),
    ({"kind": "format", "tags": "answer"}, "<answer>a</answer>", 1.0),
    ({"kind": "format", "tags": "answer"}, "x <answer>a</answer>", 0.5),
])
def test_format(settings, completion, expected):
    assert score(settings, completion) == pytest.approx(expected)


@pytest.mark.parametrize("settings, reference", [
    ({"kind": "exact"}, "Paris"),
    ({"kind": "contains"}, "Paris"),
    ({"kind": "numeric"}, "7"),
    ({"kind": "regex", "pattern": "(a+)+$"}, None),
    ({"kind": "json", "keys": ["a"]}, None),
    ({"kind": "length", "min_chars": 5, "max_chars": 10}, None),
    ({"kind": "keyword", "words": ["x", "y"], "mode": "all"}, None),
    ({"kind": "format"}, None),
])
def test_builtins_are_fast_on_long_completions(settings, reference):
    reward = build(settings)
    start = time.perf_counter()
    value = reward("", LONG + "<think>", reference, {})
    assert time.perf_counter() - start < 0.5
    assert 0.0 <= value <= 1.0


@pytest.mark.parametrize("settings, reference, message", [
    ({"kind": "numeric"}, "no digits", "the reference answer contains no number"),
    ({"kind": "numeric"}, None, "this row has no reference answer to compare against"),
    ({"kind": "exact"}, None, "this row has no reference answer to compare against"),
    ({"kind": "exact"}, "  . ", "the reference answer is empty"),
    ({"kind": "contains"}, "", "the reference answer is empty"),
])
def test_unusable_reference_is_a_counted_failure(settings, reference, message):
    failures = RewardFailures()
    value, error = safe_score(build(settings), "", "42", reference, {}, failures)
    assert (value, error) == (0.0, message)
    assert failures.counts() == {settings["kind"]: 1}


# ---------------------------------------------------------------------------------------------------------------------
# Validation
# ---------------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("settings, fragment", [
    ({}, "rewards[0] has no kind"),
    ({"kind": "nope"}, "rewards[0].kind 'nope' is not a known reward kind"),
    ("numeric", "rewards[0] must be a mapping"),
    ({"kind": "numeric", "foo": 1}, "rewards[0] has an unknown setting 'foo'; known settings for a numeric reward "
                                    "are: kind, name, weight, train, goal, only_when, extract, tolerance."),
    ({"kind": "numeric", "pattern": "x"}, "rewards[0].pattern does not apply to a numeric reward"),
    ({"kind": "exact", "tolerance": 0.1},
     "rewards[0].tolerance does not apply to an exact reward; it is a setting of numeric rewards."),
    ({"kind": "format", "extract": "boxed"}, "rewards[0].extract does not apply"),
    ({"kind": "numeric", "weight": -1}, "rewards[0].weight must be zero or more"),
    ({"kind": "numeric", "weight": float("nan")}, "rewards[0].weight must be a finite number"),
    ({"kind": "numeric", "weight": True}, "rewards[0].weight must be a number"),
    ({"kind": "numeric", "weight": "heavy"}, "rewards[0].weight must be a number"),
    ({"kind": "numeric", "tolerance": -0.1}, "rewards[0].tolerance must be zero or more"),
    ({"kind": "numeric", "name": "my reward"}, "rewards[0].name 'my reward' may only use letters, digits"),
    ({"kind": "numeric", "name": "a-b"}, "rewards[0].name 'a-b' may only use"),
    ({"kind": "numeric", "extract": "first"}, "rewards[0].extract 'first' is not one of: whole, last_number"),
    ({"kind": "exact", "case_sensitive": "yes"}, "rewards[0].case_sensitive must be true or false"),
    ({"kind": "regex"}, "rewards[0].pattern is missing"),
    ({"kind": "regex", "pattern": "("}, "rewards[0].pattern is not a valid regular expression: missing ) at "
                                        "position 1."),
    ({"kind": "json", "keys": [1]}, "rewards[0].keys must contain only non-empty texts"),
    ({"kind": "length"}, "rewards[0].min_chars and rewards[0].max_chars are both missing"),
    ({"kind": "length", "min_chars": 10, "max_chars": 5}, "rewards[0].min_chars (10) is larger than "
                                                          "rewards[0].max_chars (5)"),
    ({"kind": "length", "min_chars": -1}, "rewards[0].min_chars must be a whole number"),
    ({"kind": "length", "max_chars": 2.5}, "rewards[0].max_chars must be a whole number"),
    ({"kind": "keyword"}, "rewards[0].words is missing"),
    ({"kind": "keyword", "words": []}, "rewards[0].words must be a non-empty list"),
    ({"kind": "keyword", "words": ["a"], "mode": "some"}, "rewards[0].mode 'some' is not one of: any, all"),
    ({"kind": "format", "preset": "xml"}, "rewards[0].preset 'xml' is not one of: think_answer"),
    ({"kind": "format", "preset": "think_answer", "tags": ["a"]}, "rewards[0].preset and rewards[0].tags are both"),
    ({"kind": "format", "tags": ["<think>"]}, "rewards[0].tags entries are plain tag names"),
    ({"kind": "format", "tags": ["a", "a"]}, "rewards[0].tags names the same tag twice"),
    ({"kind": "command"}, "rewards[0].argv is missing"),
    ({"kind": "command", "argv": []}, "rewards[0].argv must be a non-empty list"),
    ({"kind": "command", "argv": ["", "x"]}, "rewards[0].argv[0] (the program to run) is empty"),
    ({"kind": "command", "argv": "python 'unclosed"}, "rewards[0].argv cannot be split into arguments"),
    ({"kind": "command", "argv": ["x"], "timeout": 0}, "rewards[0].timeout must be more than zero"),
    ({"kind": "command", "argv": ["x"], "input": "pipe"}, "rewards[0].input 'pipe' is not one of: stdin, file"),
    ({"kind": "command", "argv": ["x"], "score_from": "stderr"}, "rewards[0].score_from 'stderr' is not one of"),
    ({"kind": "command", "argv": ["x"], "min_score": 5, "max_score": 5},
     "rewards[0].max_score (5) must be larger than rewards[0].min_score (5)"),
    ({"kind": "custom"}, "rewards[0].code and rewards[0].file: give exactly one"),
    ({"kind": "custom", "code": "x = 1", "file": "r.py"}, "rewards[0].code and rewards[0].file: give exactly one"),
    ({"kind": "custom", "code": "def reward(p, c, r, row):\n    return (\n"}, "rewards[0].code has a syntax error on "
                                                                             "line 2"),
    ({"kind": "custom", "code": "def score(p, c, r, row):\n    return 1\n"}, "rewards[0].code defines no function "
                                                                           "named 'reward'"),
    ({"kind": "custom", "code": "reward = 3"}, "rewards[0].code defines 'reward', but it is a int"),
    ({"kind": "custom", "code": "def reward(completion):\n    return 1\n"}, "rewards[0].code defines 'reward', but "
                                                                          "it cannot be called"),
    ({"kind": "custom", "code": "1 / 0"}, "rewards[0].code failed while loading: ZeroDivisionError"),
    ({"kind": "custom", "code": "def f(p, c, r, row): return 1", "function": "not valid"},
     "rewards[0].function must be a Python function name"),
])
def test_validation_errors_name_the_field(settings, fragment):
    with pytest.raises(ConfigError) as caught:
        RewardSpec.from_dict(settings, policy=LAPTOP)
    message = str(caught.value)
    assert fragment in message
    assert message.startswith("rewards[0]")
    assert "\n" not in message and message.endswith(".")


@pytest.mark.parametrize("items, fragment", [
    ([], "rewards must be a non-empty list"),
    ("numeric", "rewards must be a non-empty list"),
    ([{"kind": "numeric"}, 3], "rewards[1] must be a mapping"),
    ([{"kind": "numeric"}, {"kind": "exact"}, {"kind": "numeric"}],
     "rewards[2].name: two rewards are named 'numeric' (rewards[0] and rewards[2]); give one of them a different "
     "name."),
    ([{"kind": "numeric", "name": "a"}, {"kind": "exact", "name": "a"}], "two rewards are named 'a'"),
    ([{"kind": "numeric"}, {"kind": "regex", "pattern": "[a-"}], "rewards[1].pattern is not a valid regular"),
])
def test_parse_rewards_errors(items, fragment):
    with pytest.raises(ConfigError) as caught:
        parse_rewards(items, policy=LAPTOP)
    assert fragment in str(caught.value)


def test_custom_file_errors_name_the_field(tmp_path):
    with pytest.raises(ConfigError, match=r"rewards\[0\]\.file \(.*missing\.py\) cannot be read"):
        build_rewards([RewardSpec.from_dict({"kind": "custom", "file": "missing.py"}, policy=LAPTOP)], base_dir=str(tmp_path), policy=LAPTOP)
    (tmp_path / "broken.py").write_text("def reward(p, c, r, row):\n    return 1 +\n")
    with pytest.raises(ConfigError, match=r"rewards\[0\]\.file \(.*broken\.py\) has a syntax error on line 2"):
        build_rewards([RewardSpec.from_dict({"kind": "custom", "file": "broken.py"}, policy=LAPTOP)], base_dir=str(tmp_path), policy=LAPTOP)


def test_parse_rewards_defaults_and_coercion():
    specs = parse_rewards([
        {"kind": "numeric", "weight": 2},
        {"kind": "keyword", "name": "kw", "words": "because", "pattern": None, "extract": ""},
        {"kind": "json", "keys": []},
        {"kind": "command", "argv": "python -c 'print(1)'", "timeout": "5"},
        {"kind": "length", "min_chars": 3.0},
        {"kind": "format"},
    ], policy=LAPTOP)
    assert [spec.name for spec in specs] == ["numeric", "kw", "json", "command", "length", "format"]
    assert specs[0].weight == 2.0 and isinstance(specs[0].weight, float)
    assert specs[1].words == ["because"]
    assert specs[2].keys is None
    assert specs[3].argv == ["python", "-c", "print(1)"] and specs[3].timeout == 5.0
    assert specs[4].min_chars == 3 and isinstance(specs[4].min_chars, int)
    assert specs[5].preset == "think_answer"


@pytest.mark.parametrize("settings", [
    {"kind": "exact", "case_sensitive": True, "extract": "boxed"},
    {"kind": "numeric", "name": "answer", "weight": 2.5, "tolerance": 0.01, "extract": "after_hashes"},
    {"kind": "regex", "pattern": r"\d", "case_sensitive": True},
    {"kind": "json", "keys": ["a", "b"]},
    {"kind": "length", "max_chars": 300},
    {"kind": "keyword", "words": ["a", "b"], "mode": "all", "weight": 0},
    {"kind": "format"},
    {"kind": "format", "tags": ["x", "y"]},
    {"kind": "command", "argv": [PY, "-c", "pass"], "input": "file", "score_from": "stdout", "min_score": -1,
     "max_score": 10, "timeout": 3},
    {"kind": "custom", "code": "def check(p, c, r, row):\n    return 1\n", "function": "check"},
])
def test_to_dict_round_trips(settings):
    spec = RewardSpec.from_dict(settings, policy=LAPTOP)
    data = spec.to_dict()
    assert {"kind", "name", "weight"} <= data.keys()
    assert json.loads(json.dumps(data)) == data
    assert RewardSpec.from_dict(data, policy=LAPTOP) == spec
    assert "extract" not in RewardSpec.from_dict({"kind": "numeric"}, policy=LAPTOP).to_dict()


# ---------------------------------------------------------------------------------------------------------------------
# Public demo
# ---------------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("settings, fragment", [
    ({"kind": "custom", "code": "def reward(p, c, r, row): return 1"},
     "rewards[0].kind: custom Python rewards are turned off in this public demo because they run arbitrary code on "
     "the server; run Dragon GRPO Studio on your own machine (make run) to use them."),
    ({"kind": "command", "argv": [PY, "-c", "pass"]},
     "rewards[0].kind: command rewards are turned off in this public demo because they run arbitrary programs"),
])
def test_public_demo_refuses_code_rewards(settings, fragment):
    spec = RewardSpec.from_dict(settings, policy=LAPTOP)  # the settings are fine; a public demo's policy refuses to run them
    assert public_refusal(spec, "rewards[0]", policy=LAPTOP) is None
    assert fragment in public_refusal(spec, "rewards[0]", policy=Policy(limits=Limits()))
    build_rewards([spec], policy=LAPTOP)
    with pytest.raises(ConfigError) as caught:
        build_rewards([spec], policy=Policy(limits=Limits()))
    assert fragment in str(caught.value)
    assert build_rewards([RewardSpec.from_dict({"kind": "numeric"}, policy=LAPTOP)], policy=Policy(limits=Limits()))


@pytest.mark.parametrize("env, public", [({}, False), ({"DRAGON_UI_PUBLIC": "0"}, False),
                                         ({"DRAGON_UI_PUBLIC": "1"}, True), ({"SPACE_ID": "someone/dragon"}, True)])
def test_public_demo_flag(monkeypatch, env, public):
    for key in ("SPACE_ID", "DRAGON_UI_PUBLIC"):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert Policy.from_env(Path("runs")).public is public


# ---------------------------------------------------------------------------------------------------------------------
# Custom rewards and failure handling
# ---------------------------------------------------------------------------------------------------------------------

def custom(code: str, **extra) -> dict:
    return {"kind": "custom", "code": textwrap.dedent(code), **extra}


def test_custom_reward_gets_all_arguments():
    reward = build(custom("""
        import math
        def reward(prompt, completion, reference, row):
            return len(completion) / 10 + (reference == row["answer"]) + math.floor(len(prompt) / 100)
    """))
    assert reward("hi", "abcde", "7", {"answer": "7"}) == pytest.approx(1.5)


def test_custom_reward_from_file(tmp_path):
    (tmp_path / "my_reward.py").write_text("def check(prompt, completion, reference, row):\n    return -2.5\n")
    spec = RewardSpec.from_dict({"kind": "custom", "file": "my_reward.py", "function": "check"}, policy=LAPTOP)
    assert build_rewards([spec], base_dir=str(tmp_path), policy=LAPTOP)[0]("", "", None, {}) == -2.5


@pytest.mark.parametrize("body, score_, message", [
    ("return 1 / 0", 0.0, "ZeroDivisionError: division by zero"),
    ("raise ValueError('bad\\nsecond line')", 0.0, "ValueError: bad"),
    ("raise RuntimeError()", 0.0, "RuntimeError"),
    ("raise SystemExit(3)", 0.0, "SystemExit: 3"),
    ("return float('nan')", 0.0, "returned nan, not a finite number"),
    ("return float('inf')", 0.0, "returned inf, not a finite number"),
    ("return None", 0.0, "returned None (NoneType), not a number"),
    ("return 'x'", 0.0, "returned 'x' (str), not a number"),
    ("return [1]", 0.0, "returned [1] (list), not a number"),
    ("return True", 1.0, None),
    ("return 3", 3.0, None),
    ("return -0.25", -0.25, None),
])
def test_custom_failures_score_zero_and_are_counted(body, score_, message):
    reward = build(custom(f"def reward(prompt, completion, reference, row):\n    {body}\n", name="mine"))
    failures = RewardFailures()
    for _ in range(3):
        value, error = safe_score(reward, "p", "c", None, {}, failures)
    assert (value, error) == (score_, message)
    if message is None:
        assert failures.total() == 0 and failures.counts() == {}
    else:
        assert failures.counts() == {"mine": 3}
        assert failures.first_errors() == {"mine": message}
        assert failures.total() == 3


def test_failures_keep_the_first_message_and_are_thread_safe():
    failures = RewardFailures()
    failures.record("a", ZeroDivisionError("division by zero"))
    failures.record("a", "later problem")
    threads = [threading.Thread(target=lambda: [failures.record("b", "x") for _ in range(500)]) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures.counts() == {"a": 2, "b": 2000}
    assert failures.first_errors() == {"a": "ZeroDivisionError: division by zero", "b": "x"}
    assert failures.total() == 2002


def test_score_completion_weights_and_errors():
    rewards = build_rewards(parse_rewards([
        {"kind": "numeric", "weight": 2},
        {"kind": "format", "weight": 0.5},
        custom("def reward(p, c, r, row):\n    return row['missing']\n", name="broken"),
    ], policy=LAPTOP), policy=LAPTOP)
    failures = RewardFailures()
    result = score_completion(rewards, "<think>x</think><answer>12</answer>", "12", failures=failures)
    assert isinstance(result, ScoreResult)
    assert result.scores == {"numeric": 1.0, "format": 1.0, "broken": 0.0}
    assert result.total == pytest.approx(2.5)
    assert result.errors == {"broken": "KeyError: 'missing'"}
    assert result.to_dict() == {"scores": result.scores, "total": result.total, "errors": result.errors,
                                "withheld": {}}
    assert failures.counts() == {"broken": 1}
    assert score_completion(rewards, "").errors.keys() == {"numeric", "broken"}


def test_a_metric_is_scored_but_adds_nothing_to_the_total():
    specs = parse_rewards([{"kind": "length", "max_chars": 40, "weight": 2},
                           {"kind": "exact", "name": "accuracy", "weight": 3, "train": False}], policy=LAPTOP)
    assert specs[1].to_dict() == {"kind": "exact", "name": "accuracy", "weight": 3.0, "train": False}
    assert "train" not in specs[0].to_dict()  # trained on is the default, and is not written out
    assert [training_weight(spec) for spec in specs] == [2.0, 0.0]
    assert [training_weight(spec.to_dict()) for spec in specs] == [2.0, 0.0]  # a stored config's dict alike
    result = score_completion(build_rewards(specs, policy=LAPTOP), "12", "12")
    assert result.scores == {"length": 1.0, "accuracy": 1.0} and result.total == 2.0
    with pytest.raises(ConfigError, match="rewards\\[1\\].train must be true or false"):
        parse_rewards([specs[0].to_dict(), {"kind": "exact", "train": "no"}], policy=LAPTOP)


@pytest.mark.parametrize("rewards, says", [
    ([{"kind": "exact", "train": False}], "Every reward is a metric (not trained on) or has weight 0"),
    ([{"kind": "exact", "train": False}, {"kind": "length", "max_chars": 9, "weight": 0}],
     "train on one with a weight above 0"),
    ([{"kind": "exact", "weight": 0}], "Every reward has weight 0, so the total is always 0"),
])
def test_a_list_with_nothing_to_train_on_is_refused(rewards, says):
    with pytest.raises(ConfigError, match=re.escape(says)):
        check_some_weight(parse_rewards(rewards, policy=LAPTOP))


# ---------------------------------------------------------------------------------------------------------------------
# Command rewards
# ---------------------------------------------------------------------------------------------------------------------

def command(code: str, **extra) -> dict:
    return {"kind": "command", "argv": [PY, "-c", textwrap.dedent(code)], "timeout": 20, **extra}


@pytest.mark.parametrize("settings, completion, expected", [
    (command("import sys; sys.exit(0 if sys.stdin.read() == 'ok ü' else 1)"), "ok ü", 1.0),
    (command("import sys; sys.exit(0 if sys.stdin.read() == 'ok' else 1)"), "not ok", 0.0),
    (command("import sys; print(len(sys.stdin.read()))", score_from="stdout", max_score=10), "abcd", 0.4),
    (command("print('score: 15')", score_from="stdout", min_score=10, max_score=20), "", 0.5),
    (command("print(50)", score_from="stdout", max_score=10), "", 1.0),
    (command("print(-3)", score_from="stdout"), "", 0.0),
    (command("import sys; sys.exit(open(sys.argv[1]).read() != 'from file')", input="file"), "from file", 1.0),
    ({"kind": "command", "input": "file", "score_from": "stdout",
      "argv": [PY, "-c", "import sys; print(len(open(sys.argv[1].split('=')[1]).read()))", "--in={completion_file}"]},
     "x" * 7, 1.0),
    ({"kind": "command", "argv": [PY, "-c", "import sys; print(open(sys.argv[1]).read())", "{reference_file}"],
      "score_from": "stdout", "max_score": 100}, "", 0.42),
    (command("import os; print(os.environ['DRAGON_REFERENCE'] + ' ' + os.environ['DRAGON_PROMPT'])",
             score_from="stdout", max_score=10), "", 0.3),
])
def test_command_scores(settings, completion, expected):
    assert score(settings, completion, reference="42", prompt="3") == pytest.approx(expected)


@pytest.mark.parametrize("settings, message", [
    ({"kind": "command", "argv": ["dragon-no-such-program-xyz", "--help"]},
     "command not found: 'dragon-no-such-program-xyz' (is it installed and on the PATH?)"),
    (command("print('no digits here')", score_from="stdout"), "printed no number on standard output"),
    (command("import sys; print(1); sys.exit('checker crashed')", score_from="stdout"),
     "exited with code 1: checker crashed"),
])
def test_command_failures(settings, message):
    failures = RewardFailures()
    assert safe_score(build(settings), "", "x", None, {}, failures) == (0.0, message)
    assert failures.first_errors() == {"command": message}


def _alive(pid: int) -> bool:
    """True while the process exists and is not a zombie waiting to be reaped."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.skipif(os.name != "posix", reason="process groups are POSIX")
def test_hanging_command_is_killed_with_its_grandchildren(tmp_path):
    pid_file = tmp_path / "grandchild.pid"
    settings = command(f"""
        import subprocess, sys, time
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
        open({str(pid_file)!r}, "w").write(str(child.pid))
        time.sleep(30)
    """, timeout=1)
    failures = RewardFailures()
    start = time.monotonic()
    value, error = safe_score(build(settings), "", "x", None, {}, failures)
    assert time.monotonic() - start < 5
    assert (value, error) == (0.0, "timed out after 1 s")
    assert failures.counts() == {"command": 1}
    grandchild = int(pid_file.read_text())
    deadline = time.monotonic() + 3
    while _alive(grandchild) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(grandchild)


# ---------------------------------------------------------------------------------------------------------------------
# TRL adapter
# ---------------------------------------------------------------------------------------------------------------------

def test_trl_reward_functions():
    rewards = build_rewards(parse_rewards([
        {"kind": "numeric", "name": "correct"},
        custom("def reward(prompt, completion, reference, row):\n    return len(prompt) + row['bonus']\n",
               name="mine"),
    ], policy=LAPTOP), policy=LAPTOP)
    failures = RewardFailures()
    batches = []
    functions = trl_reward_functions(rewards, failures, on_batch=lambda *args: batches.append(args))
    assert [f.__name__ for f in functions] == ["correct", "mine"]

    prompt = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "2+2?"},
              {"role": "assistant", "content": "hm"}, {"role": "user", "content": "what is 2+2?"}]
    row = json.dumps({"bonus": 0.5})
    kwargs = {
        "completion_ids": [[1], [2], [3]],
        "reference": ["4", "4", ""],
        "row": [row, row, json.dumps({})],
        "trainer_state": object(),
        "log_extra": lambda *a: None,
        "log_metric": lambda *a: None,
    }
    completions = [[{"role": "assistant", "content": "It is 4."}], [{"role": "assistant", "content": "5"}],
                   "plain 4"]
    prompts = [prompt, prompt, "plain prompt"]
    assert functions[0](prompts=prompts, completions=completions, **kwargs) == [1.0, 0.0, 0.0]
    assert functions[1](prompts=prompts, completions=completions, **kwargs) == [12.5, 12.5, 0.0]
    assert batches == [("correct", 3, 1), ("mine", 3, 1)]
    assert failures.counts() == {"correct": 1, "mine": 1}
    assert failures.first_errors() == {"correct": "this row has no reference answer to compare against",
                                       "mine": "KeyError: 'bonus'"}


def test_trl_on_batch_errors_propagate():
    def on_batch(name, scored, failed):
        if failed == scored:
            raise RuntimeError(f"reward {name} failed on every completion")

    function = trl_reward_functions(build_rewards(parse_rewards([{"kind": "numeric"}], policy=LAPTOP), policy=LAPTOP), RewardFailures(),
                                    on_batch=on_batch)[0]
    assert function(prompts=["p"], completions=["1"], reference=["1"], row=["{}"]) == [1.0]
    with pytest.raises(RuntimeError, match="reward numeric failed on every completion"):
        function(prompts=["p"], completions=["1"], reference=["none"], row=["{}"])


def test_module_stays_light():
    import subprocess
    code = "import sys, dragon_ui.rewards; print(sorted({'torch', 'gradio', 'trl', 'transformers'} & set(sys.modules)))"
    out = subprocess.run([PY, "-c", code], capture_output=True, text=True, check=True,
                         cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__)))).stdout
    assert out.strip() == "[]"
