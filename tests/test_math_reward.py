"""The `math` kind against math-verify itself: table-driven cases where our verdict (the reward as training runs it,
in its worker process) must be math-verify's own, called here directly; plus extraction modes and the time limit."""

from __future__ import annotations

from pathlib import Path

import time
import pytest
from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

from dragon_ui.rewards import build_rewards, parse_rewards, score_completion
from dragon_ui.rewards import math_answers
from dragon_ui.public import LAPTOP
from conftest import environment_of

CASES = [  # reference, reply, the right verdict
    # fractions
    ("0.5", r"$\frac{1}{2}$", True), (r"\frac{1}{2}", "0.5", True), (r"\frac{3}{4}", r"\boxed{0.75}", True),
    (r"\frac{1}{3}", r"$\frac{2}{6}$", True), (r"\dfrac{2}{4}", "$0.5$", True), ("1/3", "0.333", False),
    # decimals
    ("0.5", "0.50", True), ("2.5", "The answer is 2.5.", True), ("2.5", "2.05", False), ("3.14", r"$\pi$", False),
    # percentages
    ("0.5", r"$50\%$", True), ("0.5", "50%", True), ("0.25", r"$25\%$", True),
    # thousands separators
    ("1234", "1,234", True), ("1,234", "1234", True), ("1000000", "1,000,000", True),
    # negative numbers
    ("-7", "$-7$", True), ("-7", "7", False), (r"-\frac{1}{2}", "-0.5", True),
    # LaTeX wrappers and delimiters
    ("42", r"\boxed{42}", True), ("42", r"The final answer is $\boxed{42}$.", True), ("$42$", "42", True),
    (r"\(42\)", "42", True), ("42", r"\[42\]", True), ("42", r"I think 41, no: \boxed{42}", True),
    # sets and intervals
    (r"\{1,2,3\}", r"$\{3,2,1\}$", True), (r"\{1,2\}", r"$\{1,2,3\}$", False), ("(0,1]", "$(0, 1]$", True),
    ("(0,1]", "$[0,1]$", False), (r"[2, \infty)", r"$[2,\infty)$", True),
    # symbolic forms
    (r"2\sqrt{2}", r"$\sqrt{8}$", True), ("x^2+2x+1", "$(x+1)^2$", True), (r"\pi", r"$\pi$", True),
    (r"2\pi", r"$\pi$", False), (r"\sqrt{2}", "$1.41$", False),
    # units and equations
    ("5", "5 cm", True), ("5", r"$5\text{ cm}$", True), ("10", "10 apples", True), ("3", "x = 3", True),
    ("3", "2 + 1 = 3", True),
    # wrong answers that look right
    ("12", "21", False), ("2", "The answer is 2 + 1 = 3", False), ("100", "1000", False), ("0.5", "5", False),
    ("7", "17", False), (r"\frac{1}{2}", r"$\frac{2}{1}$", False),
]


def math_verify_verdict(reference: str, reply: str) -> bool:
    """math-verify as its documentation calls it, the reference put between $…$ when it has no delimiters."""
    delimited = reference if any(mark in reference for mark in ("$", "\\(", "\\[", "\\boxed")) else f"${reference}$"
    gold = parse(delimited, extraction_config=[LatexExtractionConfig(), ExprExtractionConfig()])
    given = parse(reply, extraction_config=[LatexExtractionConfig(boxed_match_priority=0), ExprExtractionConfig()])
    return verify(gold, given)


@pytest.fixture(scope="module")
def math_reward():
    (reward,) = build_rewards(parse_rewards([{"kind": "math"}], policy=LAPTOP), policy=LAPTOP)
    return reward


@pytest.mark.parametrize("reference, reply, right", CASES)
def test_our_verdict_is_math_verifys(math_reward, reference, reply, right):
    result = score_completion([math_reward], reply, reference)
    assert result.errors == {}
    assert result.scores["math"] == float(right) and math_verify_verdict(reference, reply) is right


@pytest.mark.parametrize("extract, reply, score", [
    ("answer_tag", r"<think>1/4 + 1/4</think><answer>\frac{1}{2}</answer>", 1.0),
    ("answer_tag", "<think>so 0.5</think><answer>1/3</answer>", 0.0),  # the number in the thinking does not count
    ("boxed", r"$\boxed{0.5}$ or maybe \frac{1}{3}", 1.0),
    ("after_hashes", "half of it\n#### 50%", 1.0),
    ("answer_tag", "no tags at all", 0.0),
])
def test_an_extraction_mode_hands_math_verify_only_that_part(extract, reply, score):
    (reward,) = build_rewards(parse_rewards([{"kind": "math", "extract": extract}], policy=LAPTOP), policy=LAPTOP)
    assert score_completion([reward], reply, "0.5").scores["math"] == score


def test_a_row_without_a_reference_is_a_counted_failure(math_reward):
    assert score_completion([math_reward], "42", None).errors == {"math": "this row has no reference answer to "
                                                                          "compare against"}


def test_a_check_past_the_time_limit_fails_that_reply_and_the_next_one_is_checked(math_reward, monkeypatch):
    """A tower of powers keeps sympy busy for math-verify's own 3 s; with a shorter limit than that, the reply
    fails in words and its worker is replaced, so the next reply is checked as usual."""
    monkeypatch.setattr(math_answers, "LIMIT_S", 0.5)
    score_completion([math_reward], "1", "1")  # the worker started, outside the limit under test
    tower = "$" + "9^{" * 8 + "9" + "}" * 8 + "$"
    result = score_completion([math_reward], tower, "1")
    assert result.scores["math"] == 0.0 and result.errors == {"math": "math-verify took longer than 0.5 s on this reply"}
    monkeypatch.setattr(math_answers, "LIMIT_S", 10.0)
    assert score_completion([math_reward], r"$\frac{1}{2}$", "0.5").scores["math"] == 1.0


@pytest.mark.timeout(300)
def test_a_training_scores_with_math_verify_from_its_own_thread(tiny_config_dict):
    """math-verify's own time limits need the main thread; a training's rewards run in another, through the worker."""
    from dragon_ui.config import RunConfig
    from dragon_ui.engine import training

    tiny_config_dict["rewards"] = [{"kind": "math"}, {"kind": "length", "min_chars": 12, "weight": 0.3}]
    run = training.train_config(RunConfig.from_dict(tiny_config_dict, policy=LAPTOP), policy=LAPTOP)
    status = run.read_status()
    assert status["state"] == "succeeded", status.get("error")
    rows = run.read_progress()
    assert [row["errors"]["math"] for row in rows] == [0, 0] and all(row["rewards"]["math"] is not None for row in rows)
    scores = [c["scores"]["math"] for r in run.read_rollouts() for g in r["groups"] for c in g["completions"]]
    assert scores and set(scores) <= {0.0, 1.0}


def test_a_busy_playground_neither_holds_up_a_training_nor_waits_without_end(monkeypatch):
    """A visitor who keeps the playground's worker busy (say, twenty math rewards on a slow reply, four calls at
    once) makes other playground checks fail after LIMIT_S, in words, and a training's checks not wait at all."""
    import threading

    monkeypatch.setattr(math_answers, "LIMIT_S", 0.5)
    (training,) = build_rewards(parse_rewards([{"kind": "math"}], policy=LAPTOP), training=True, policy=LAPTOP)
    (playground,) = build_rewards(parse_rewards([{"kind": "math"}], policy=LAPTOP), policy=LAPTOP)
    assert score_completion([training], "1", "1").scores["math"] == 1.0  # its worker started
    release = threading.Event()

    def hold_the_worker():
        with math_answers.PREVIEWS._turns.turn("another address", timeout=60):
            release.wait(60)

    holder = threading.Thread(target=hold_the_worker)
    holder.start()
    try:
        while not math_answers.PREVIEWS._turns._busy:
            time.sleep(0.01)
        assert score_completion([training], r"$\frac{1}{2}$", "0.5").scores["math"] == 1.0
        waited = score_completion([playground], "1", "1")
        assert waited.errors == {"math": "math-verify was busy with other replies for 0.5 s; this one was not checked"}
    finally:
        release.set()
        holder.join()


@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="reads a process's environment from /proc")
def test_the_worker_runs_without_the_servers_secrets(monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_secret")
    monkeypatch.setenv("DRAGON_UI_OWNER_KEY", "owner-secret")
    checker = math_answers.MathChecker()
    assert checker.verify("2", r"\boxed{2}", True) is True
    environment = b"\0".join(environment_of(checker._process.pid))
    assert b"PATH=" in environment  # read after the checker's program started, not in the moment before
    assert b"hf_secret" not in environment and b"owner-secret" not in environment
    checker._stop()
