"""The starting model against the trained one: what the Compare tab shows, and the evaluations it can run itself.

Training already writes eval.json and samples.json (greedy replies on the held-out prompts, scored by the run's
rewards). This module turns them into chart and table data, evaluates a stopped run from its latest checkpoint the
same way, and answers a free prompt with both models. Both models come from one cached load (Studio.inference_model):
the trained adapter on the starting model, switched off for the "before" side.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from .config import ModelConfig, RunConfig
from .data import read_jsonl
from .errors import ConfigError
from .evaluation import EVAL_BATCH, generate_replies, record_eval, score_replies
from .export import TrainedWeights, trained_weights
from .rewards import build_rewards
from .runstore import ACTIVE_STATES, RunDir, state_label, write_json_atomic

SIDES = ("before", "after")
TABLE_HEADERS = ["Prompt", "Reference", "Before", "After", "Before reward", "After reward", "Per reward (before → after)"]

# The cached PeftModel is shared by every request; switching its adapter off for one request must not change what
# another request generates at the same moment.
_GENERATION_LOCK = threading.Lock()


@dataclass
class Comparison:
    """Everything the Compare tab shows for one run."""

    run_id: str
    summary: str  # one or two sentences above the chart
    bars: list[dict]  # {"reward": "total" | reward name, "before": float | None, "after": float | None}
    table: list[list]  # rows under TABLE_HEADERS, one per sample prompt
    can_evaluate: bool  # weights newer than the stored "after" side exist: "Evaluate now" has something to do


def comparable_runs(summaries: list[dict]) -> list[tuple[str, str]]:
    """(label, run id) for each run with something to compare: an evaluation or trained weights, newest first.

    ``summaries`` as from runstore.list_runs (Studio.runs())."""
    choices = []
    for summary in summaries:
        run = RunDir(summary["dir"])
        if run.eval_path.is_file() or run.has_final_weights() or run.latest_checkpoint() is not None:
            choices.append((f"{summary['id']} · {state_label(summary['state'])}", summary["id"]))
    return choices


def held_out_examples(run: RunDir) -> list[dict]:
    path = run.data_dir / "eval.jsonl"
    return read_jsonl(path) if path.is_file() else []


def _has_held_out(run: RunDir) -> bool:
    """Without reading the file: training writes an empty eval.jsonl when it keeps no held-out prompts."""
    path = run.data_dir / "eval.jsonl"
    return path.is_file() and path.stat().st_size > 0


def _newest_weights(run: RunDir) -> TrainedWeights | None:
    try:
        return trained_weights(run)
    except ConfigError:
        return None


def comparison(run: RunDir) -> Comparison:
    """Chart bars, table rows and a summary sentence from the run's eval.json and samples.json."""
    evaluation = run.read_eval()
    before, after = evaluation.get("before"), evaluation.get("after")
    names = list((before or after or {}).get("reward_breakdown", {}))
    scored = {side: evaluation.get(side) or {} for side in SIDES}
    bars = [{"reward": "total", **{side: scored[side].get("reward_mean") for side in SIDES}}]
    bars += [{"reward": name, **{side: scored[side].get("reward_breakdown", {}).get(name) for side in SIDES}}
             for name in names]
    table = [_table_row(sample, names) for sample in run.read_samples()]

    state = run.read_status().get("state", "unknown")
    weights = _newest_weights(run)
    scored_from = (after or {}).get("weights")  # set by evaluate_now; training's own "after" used the final weights
    stale = after is not None and weights is not None and scored_from is not None and scored_from != weights.label
    can_evaluate = (state not in ACTIVE_STATES and weights is not None and (after is None or stale)
                    and _has_held_out(run))
    return Comparison(run.id, _summary(run, evaluation, state, weights, can_evaluate), bars if before or after else [],
                      table, can_evaluate)


def _table_row(sample: dict, names: list[str]) -> list:
    before, after = sample.get("before") or {}, sample.get("after") or {}
    per_reward = "; ".join(f"{name} {_fmt(before.get('scores', {}).get(name))} → {_fmt(after.get('scores', {}).get(name))}"
                           for name in names)
    return [sample.get("prompt", ""), sample.get("reference", ""), before.get("reply", ""), after.get("reply", ""),
            _rounded(before.get("reward")), _rounded(after.get("reward")), per_reward]


def _fmt(value) -> str:
    return "–" if value is None else f"{value:.2f}"


def _rounded(value):
    return None if value is None else round(value, 3)


def _summary(run: RunDir, evaluation: dict, state: str, weights: TrainedWeights | None, can_evaluate: bool) -> str:
    before, after = evaluation.get("before"), evaluation.get("after")
    n = evaluation.get("n_prompts", 0)
    if before and after:
        source = f" The trained side was scored from {after['weights']}." if after.get("weights") else ""
        text = (f"Held-out reward on {n} prompts (greedy replies): {before['reward_mean']:.3f} before → "
                f"{after['reward_mean']:.3f} after ({after['reward_mean'] - before['reward_mean']:+.3f}).{source}")
        if can_evaluate:
            text += f" Newer weights exist ({weights.label}): press Evaluate now to score them."
        return text
    if not _has_held_out(run):
        return (f"The run {run.id} has no held-out prompts (datasets under 20 rows keep none), so there is no "
                "before/after score; the free prompt below still compares both models.")
    if state in ACTIVE_STATES:
        start = f"The starting model scored {before['reward_mean']:.3f} on {n} held-out prompts. " if before else ""
        return start + f"The run is {state}; the trained side is scored when it finishes."
    if can_evaluate:
        start = f"The starting model scored {before['reward_mean']:.3f} on {n} held-out prompts, but" if before else \
            "There is no held-out score yet:"
        return (f"{start} the run ended ({state_label(state)}) before scoring the trained model. Press Evaluate now "
                f"to score {weights.label} on the held-out prompts.")
    if before:
        return (f"The starting model scored {before['reward_mean']:.3f} on {n} held-out prompts, but the run ended "
                f"({state_label(state)}) before saving any trained weights, so there is nothing to compare it with.")
    return f"The run {run.id} has no held-out scores and no trained weights yet (it is {state_label(state)})."


# ---------------------------------------------------------------------------------------------------------------
# Generating with both models.


@contextlib.contextmanager
def _model_for(studio, config: RunConfig, weights: TrainedWeights, side: str):
    """(model, tokenizer) for one side, held exclusively while the caller generates."""
    with _GENERATION_LOCK:
        if weights.is_adapter:
            model, tokenizer = studio.inference_model(config.model, adapter_dir=weights.path, settings=config.hardware)
            if side == "before":
                with model.disable_adapter():
                    yield model, tokenizer
            else:
                yield model, tokenizer
        else:  # full fine-tuning: two different models, so the cache swaps between them
            model_config = config.model if side == "before" else ModelConfig(id=str(weights.path))
            yield studio.inference_model(model_config, settings=config.hardware)


def _shared_system_message(run: RunDir) -> list[dict]:
    """The system message every training prompt had (recipes use one), so a free prompt is asked the same way."""
    path = run.data_dir / "train.jsonl"
    examples = read_jsonl(path) if path.is_file() else []
    systems = {json.dumps([m for m in ex["prompt"] if m.get("role") == "system"]) for ex in examples}
    return json.loads(systems.pop()) if len(systems) == 1 else []


def answer_both(studio, run: RunDir, prompt: str, max_new_tokens: int | None = None,
                temperature: float = 0.0) -> tuple[str, str]:
    """(before, after): the starting and the trained model's replies to one prompt, greedy unless temperature > 0."""
    if not prompt or not prompt.strip():
        raise ConfigError("Type a prompt first; both models will answer it.")
    config = run.read_config()
    weights = trained_weights(run)
    conversation = _shared_system_message(run) + [{"role": "user", "content": prompt.strip()}]
    tokens = max_new_tokens or config.grpo.max_new_tokens
    replies = []
    for side in SIDES:
        with _model_for(studio, config, weights, side) as (model, tokenizer):
            replies += generate_replies(model, tokenizer, [conversation], tokens, temperature=temperature)
    return replies[0], replies[1]


def evaluate_now(studio, run: RunDir, should_stop: Callable[[], bool] = lambda: False,
                 rescore_before: bool = False) -> Iterator[str]:
    """Score the run's newest weights (and the starting model, if not scored yet or ``rescore_before``) on its
    held-out prompts: the Compare tab's "Evaluate now" and ``python -m dragon_ui eval``.

    A generator of progress sentences, one per batch; eval.json and samples.json are written with record_eval exactly
    as training writes them, one side at a time. When ``should_stop()`` turns true it stops between batches, leaving
    the files as they were before the unfinished side.
    """
    config = run.read_config()
    state = run.read_status().get("state")
    if state in ACTIVE_STATES:
        raise ConfigError(f"The run {run.id} is still {state}; it scores the trained model itself when it finishes.")
    examples = held_out_examples(run)
    if not examples:
        raise ConfigError(f"The run {run.id} has no held-out prompts (datasets under 20 rows keep none), so there is "
                          "nothing to evaluate.")
    weights = trained_weights(run)
    rewards = build_rewards(config.rewards, base_dir=config.base_dir or None)
    sides = [side for side in SIDES if side == "after" or rescore_before or "before" not in run.read_eval()]
    yield f"Loading the model with {weights.label}..."
    for side in sides:
        started = time.monotonic()
        replies: list[str] = []
        for start in range(0, len(examples), EVAL_BATCH):
            if should_stop():
                yield f"Cancelled; the {side} side was not saved."
                return
            with _model_for(studio, config, weights, side) as (model, tokenizer):
                replies += generate_replies(model, tokenizer, [ex["prompt"] for ex in examples[start:start + EVAL_BATCH]],
                                            config.grpo.max_new_tokens, batch_size=EVAL_BATCH)
            model_name = "starting model" if side == "before" else f"trained model ({weights.label})"
            yield f"The {model_name} answered {len(replies)} of {len(examples)} held-out prompts..."
        result = score_replies(examples, replies, rewards, time.monotonic() - started)
        evaluation = record_eval(run, side, result, examples, config.n_samples)
        if side == "after":  # say where "after" came from, so a later checkpoint shows up as newer
            evaluation["after"]["weights"] = weights.label
            write_json_atomic(run.eval_path, evaluation)
    after = run.read_eval()["after"]["reward_mean"]
    yield f"Done: the trained model ({weights.label}) scored {after:.3f} on {len(examples)} held-out prompts."

