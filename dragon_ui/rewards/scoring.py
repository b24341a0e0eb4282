"""Building rewards and scoring with them safely: the one path the CLI, the playground, evaluation and TRL share."""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ..chat import completion_text, last_user_text
from ..errors import ConfigError, Stopped, one_line
from ..public import Policy
from .classifier import Classifiers, ClassifierScorer
from .math_answers import PREVIEWS, TRAINING, math_scorer
from .builtin import BUILTIN_SCORERS, EPISODE_SCORE, Reward, Scorer, regex_scorer
from .code import load_custom_function
from .programs import command_scorer
from .spec import (REWARD_KINDS, AnswerReward, ClassifierReward, CommandReward, CustomReward, Gate, MathReward,
                   RegexReward, RewardSpec, gate_of, passes, public_refusal)
from .trl_rewards import trl_scorer


def counts_tokens(specs: list[RewardSpec]) -> bool:
    """Whether scoring with these rewards needs the starting model's tokenizer (to load it only then)."""
    return any(spec.counts_tokens for spec in specs)


def build_rewards(specs: list[RewardSpec], base_dir: str | None = None, training: bool = False, tokenizer=None,
                  max_new_tokens: int | None = None, classifiers: Classifiers | None = None,
                  *, policy: Policy) -> list[Reward]:
    """Turn validated specs into callables; base_dir resolves relative custom files and is the commands' folder.
    ``training``: the rewards of a training run, whose math checks have a worker of their own, so that what visitors
    try in the playground never waits in front of a run. ``tokenizer`` counts tokens for TRL's length and repetition
    kinds, whose length limit is ``max_new_tokens`` unless they set their own. ``classifiers`` loads the models of
    classifier rewards (the engine's, on the run's device); without it they fail on each reply, saying so.

    ``policy``'s refusals are checked again here (after the run's checks) because this is where code actually gets
    loaded.
    """
    rewards = []
    for index, spec in enumerate(specs):
        where = f"rewards[{index}]"
        refusal = public_refusal(spec, where, policy=policy)
        if refusal is not None:
            raise ConfigError(refusal)
        scorer: Scorer
        if isinstance(spec, CustomReward):
            scorer = load_custom_function(spec.code, spec.file, spec.function, spec.name or spec.kind, base_dir,
                                          where)
        elif isinstance(spec, CommandReward):
            scorer = command_scorer(spec, base_dir)
        elif isinstance(spec, RegexReward):
            scorer = regex_scorer(spec, where)
        elif isinstance(spec, MathReward):
            scorer = math_scorer(spec, TRAINING if training else PREVIEWS)
        elif isinstance(spec, ClassifierReward):
            scorer = ClassifierScorer(spec, classifiers, where)
        elif spec.from_trl:
            scorer = trl_scorer(spec, where, tokenizer, max_new_tokens, TRAINING if training else PREVIEWS)
        elif spec.kind in BUILTIN_SCORERS:
            scorer = BUILTIN_SCORERS[spec.kind](spec)
        else:
            raise ConfigError(f"{where}.kind {spec.kind!r} is not a known reward kind; "
                              f"choose one of: {', '.join(REWARD_KINDS)}.")
        rewards.append(Reward(spec, scorer))
    return rewards


# Where each kind cannot read a reference, what to use instead.
WORDS = "Use exact or contains instead: they compare words."
INSTEAD = {"numeric": WORDS, "math": WORDS, "cosine_length": WORDS}
MOST_REFERENCES = 32  # the references a check scores (a math check takes milliseconds each)
CHECK_SECONDS = 2.0  # all of them at most: a reference crafted to be slow to verify ends the check, flagging nothing


def cannot_pay(specs: list[RewardSpec], references: list[str | None], *, policy: Policy) -> dict[str, str]:
    """The rewards that compare a reply with the reference and would pay nothing on any of ``references``, even for a
    reply that is the reference itself (numeric on names, math on words): reward name -> why, as a sentence with the
    fix. Checked on the first MOST_REFERENCES references that are not empty, within CHECK_SECONDS: a reward not
    checked on all of them by then is not flagged."""
    checked = [reference for reference in references if reference and reference.strip()][:MOST_REFERENCES]
    deadline = time.monotonic() + CHECK_SECONDS
    found = {}
    for spec in specs:
        if not spec.reads_reference or not checked:
            continue
        # The reference is the whole reply; ``policy`` refuses what it refused when the list was checked.
        whole = dataclasses.replace(spec, extract="whole") if isinstance(spec, AnswerReward) else spec
        (reward,) = build_rewards([whole], policy=policy)
        errors = []
        for reference in checked:
            score, error = safe_score(reward, "", reference, reference, {})
            if (error is None and passes(score, spec)) or time.monotonic() > deadline:
                break
            errors.append(error)
        else:
            why = next((error for error in errors if error), "the reference itself scores 0")
            found[spec.name] = (f"`{spec.name}` ({spec.kind}) cannot pay on this data: {why}, on all "
                                f"{len(checked)} references checked, so no reply can earn it. "
                                f"{INSTEAD.get(spec.kind, 'Check the reference column, or use another kind.')}")
    return found


# --------------------------------------------------------------------------------------------------------------------
# Scoring safely
# --------------------------------------------------------------------------------------------------------------------


class RewardFailures:
    """Thread-safe failure counts per reward, plus the first message of each (what the user needs to fix it)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._counts: dict[str, int] = {}
        self._first: dict[str, str] = {}

    def record(self, name: str, error: BaseException | str) -> None:
        message = one_line(error)
        with self._lock:
            self._counts[name] = self._counts.get(name, 0) + 1
            self._first.setdefault(name, message)

    def counts(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)

    def first_errors(self) -> dict[str, str]:
        with self._lock:
            return dict(self._first)

    def total(self) -> int:
        with self._lock:
            return sum(self._counts.values())


@dataclass
class ScoreResult:
    """Scores of one completion: per reward (unweighted, 0 where it failed or its gate stayed shut), the weighted
    total, failures, and what each gated reward would have paid had its gate opened (``withheld``)."""

    scores: dict[str, float]
    total: float
    errors: dict[str, str] = field(default_factory=dict)
    withheld: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"scores": dict(self.scores), "total": self.total, "errors": dict(self.errors),
                "withheld": dict(self.withheld)}


def safe_score(reward: Reward, prompt, completion, reference, row,
               failures: RewardFailures | None = None) -> tuple[float, str | None]:
    """Score with one reward and never raise: (score, None), or (0.0, message) with the failure recorded.

    SystemExit is caught too, so a custom reward calling exit() cannot end a training run.
    """
    try:
        return reward(prompt, completion, reference, row), None
    except (Exception, SystemExit) as error:
        message = one_line(error)
        if failures is not None:
            failures.record(reward.name, message)
        return 0.0, message


def prepare(reward: Reward, completions: list[str]) -> None:
    """Let a reward that scores faster in batches (a classifier) score these replies at once; if that fails, each
    reply is scored (and fails, counted) on its own."""
    try:
        reward.prepare(completions)
    except (Exception, SystemExit):
        pass


def score_completions(rewards: list[Reward], completions: list[str], references: list[str | None],
                      prompts: list[str], rows: list[dict],
                      should_stop: Callable[[], bool] | None = None) -> list[ScoreResult]:
    """Score several replies, each as :func:`score_completion` does, letting batch scorers see them all first."""
    for reward in rewards:
        prepare(reward, completions)
    return [score_completion(rewards, completion, reference, prompt, row, should_stop=should_stop)
            for completion, reference, prompt, row in zip(completions, references, prompts, rows, strict=True)]


def score_completion(rewards: list[Reward], completion: str, reference: str | None = None, prompt: str = "",
                     row: dict | None = None, failures: RewardFailures | None = None,
                     should_stop: Callable[[], bool] | None = None) -> ScoreResult:
    """THE way to score one completion with all rewards (CLI, playground, evaluation and training share it).
    Raises Stopped before a reward once ``should_stop()`` (a stop, a time limit): each reward may take its own time
    limit, and a run's limit counts every one of them."""
    row = {} if row is None else row
    scores: dict[str, float] = {}
    errors: dict[str, str] = {}
    for reward in rewards:
        check_stop(should_stop)
        scores[reward.name], error = safe_score(reward, prompt, completion, reference, row, failures)
        if error is not None:
            errors[reward.name] = error
    withheld = {}
    specs = {reward.name: reward.spec for reward in rewards}
    for reward in rewards:
        gate = gate_of(reward.spec)
        if gate is not None and not gate.opens(scores[gate.name], specs[gate.name]):
            withheld[reward.name], scores[reward.name] = scores[reward.name], 0.0
    total = sum(reward.weight * scores[reward.name] for reward in rewards)
    return ScoreResult(scores=scores, total=total, errors=errors, withheld=withheld)


# --------------------------------------------------------------------------------------------------------------------
# TRL adapter
# --------------------------------------------------------------------------------------------------------------------


def check_stop(should_stop: Callable[[], bool] | None) -> None:
    if should_stop is not None and should_stop():
        raise Stopped("stopped while scoring replies")


def trl_reward_functions(rewards: list[Reward], failures: RewardFailures,
                         on_batch: Callable[[str, int, int], None] | None = None,
                         should_stop: Callable[[], bool] | None = None) -> list[Callable]:
    """One TRL reward function per reward, named after it (TRL logs ``rewards/<name>/mean``).

    Scores are unweighted: the trainer passes the weights to TRL (``reward_weights``). Each function reads the
    dataset columns ``reference`` and ``row`` (a JSON string) from TRL's keyword arguments and ignores the rest;
    an empty reference becomes None, as in evaluation, so a reward sees the same inputs in training and evaluation.
    ``episode_scores`` (the engine's, for a run with environments): what gives each reply's environment score, which
    the ``environment`` reward reads from the row. ``on_batch(name, n_scored, n_failed)`` runs after each call; its
    exceptions propagate so that the trainer can stop a run whose reward is completely broken. Once ``should_stop()``
    (a stop, a time limit), Stopped is raised before the next reply is scored: the trainer drops the step and the
    last whole one is checkpointed.
    """
    by_name = {reward.name: reward for reward in rewards}
    latest: dict[str, tuple[list, list[float]]] = {}  # each reward's last batch: (its completions, its scores)
    functions = []
    for reward in rewards:
        gate = gate_of(reward.spec)
        function = _trl_function(reward, failures, on_batch, should_stop, latest)
        functions.append(function if gate is None else _gated(function, gate, by_name[gate.name], latest))
    return functions


def _gated(pays: Callable, gate: Gate, gate_reward: Reward, latest: dict) -> Callable:
    """``pays``, paying only where ``gate_reward`` opens ``gate``: its scores of the same batch when its own function
    has scored it (TRL calls them in the list's order), else scored here (its failures are counted by its own)."""
    def reward_function(prompts, completions, **kwargs) -> list[float]:
        scores = pays(prompts, completions, **kwargs)
        seen = latest.get(gate_reward.name)
        if seen is not None and seen[0] is completions:
            gate_scores = seen[1]
        else:
            gate_scores = _trl_function(gate_reward, RewardFailures(), None, None, {})(prompts, completions, **kwargs)
        return [score if gate.opens(opened, gate_reward.spec) else 0.0
                for score, opened in zip(scores, gate_scores, strict=True)]

    reward_function.__name__ = reward_function.__qualname__ = pays.__name__
    return reward_function


def _trl_function(reward: Reward, failures: RewardFailures, on_batch, should_stop, latest: dict) -> Callable:
    def reward_function(prompts, completions, **kwargs) -> list[float]:
        count = len(completions)
        references = kwargs.get("reference") or [None] * count
        rows = kwargs.get("row") or [None] * count
        episode_scores = kwargs.get("episode_scores") or [None] * count
        parsed: dict[str, dict] = {}  # each row repeats once per generation; parse it once
        scores: list[float] = []
        failed = 0
        prepare(reward, [completion_text(completion) for completion in completions])
        for prompt, completion, reference, row, episode_score in zip(prompts, completions, references, rows,
                                                                     episode_scores, strict=True):
            check_stop(should_stop)
            if isinstance(row, str):
                if row not in parsed:
                    parsed[row] = json.loads(row)
                row = parsed[row]
            if episode_score is not None:
                row = {**(row or {}), EPISODE_SCORE: episode_score}
            score, error = safe_score(reward, last_user_text(prompt), completion_text(completion), reference or None,
                                      row or {}, failures)
            scores.append(score)
            failed += error is not None
        if on_batch is not None:
            on_batch(reward.name, count, failed)
        latest[reward.name] = (completions, scores)
        return scores

    reward_function.__name__ = reward_function.__qualname__ = reward.name
    return reward_function
