"""The starting model against the trained one: what the Compare tab shows.

Training writes eval.json and samples.json (greedy replies on the held-out prompts, scored by the run's rewards), and
engine.evaluation.evaluate_now scores a stopped run the same way. This module turns them into chart and table data,
and answers a free prompt with both models, from one cached load (Previews.load): the trained adapter on the
starting model, switched off for the "before" side.
"""

from __future__ import annotations

import numbers
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from ..engine import gguf_export, training, weights
from ..engine.evaluation import (SIDES, before_and_after, evaluate_now, generate_replies, metric_names, model_for,
                                 shown_reward_name)
from ..engine.publish import Published, publish
from ..engine.trained import TrainedWeights, shared_system_message, trained_weights
from ..errors import ConfigError
from ..public import Policy
from ..runstore import ACTIVE_STATES, RunDir, state_label

ASK_MAX_NEW_TOKENS = 512  # the Compare tab's slider; a public demo allows its own limit of new tokens
TABLE_HEADERS = ["Prompt", "Reference", "Before", "After", "Before reward", "After reward", "Per reward (before → after)"]



@dataclass
class Comparison:
    """Everything the Compare tab shows for one run."""

    summary: str  # one or two sentences above the chart
    bars: list[dict]  # {"reward": "total" | reward name, "before": float | None, "after": float | None}
    table: list[list]  # rows under TABLE_HEADERS, one per sample prompt
    can_evaluate: bool  # weights newer than the stored "after" side exist: "Evaluate now" has something to do
    example_prompt: str = ""  # a held-out prompt of the run, whole: what the free prompt may ask


def comparable_runs(summaries: list[dict]) -> list[tuple[str, str]]:
    """(label, run id) for each run with something to compare: an evaluation or trained weights, newest first.

    ``summaries`` as from runstore.list_runs (Runs.summaries())."""
    choices = []
    for summary in summaries:
        run = RunDir(summary["dir"])
        if run.eval_path.is_file() or run.has_final_weights() or run.latest_checkpoint() is not None:
            choices.append((f"{summary['id']} · {state_label(summary['state'])}", summary["id"]))
    return choices


def _has_held_out(run: RunDir) -> bool:
    """Without reading the file: training writes an empty eval.jsonl when it keeps no held-out prompts."""
    path = run.eval_data_path
    return path.is_file() and path.stat().st_size > 0


def _newest_weights(run: RunDir) -> TrainedWeights | None:
    try:
        return trained_weights(run)
    except ConfigError:
        return None


def comparison(run: RunDir, scored_on_opening: bool = False) -> Comparison:
    """Chart bars, table rows and a summary sentence from the run's eval.json and samples.json;
    ``scored_on_opening``: the tab scores its trained model as it shows it (awaits_its_after)."""
    evaluation = run.read_eval()
    before, after = evaluation.get("before"), evaluation.get("after")
    rows = before_and_after(evaluation)
    names, metrics = [name for name, _, _ in rows[1:] if name is not None], metric_names(evaluation)
    bars = [{"reward": "total" if name is None else shown_reward_name(name, metrics), **dict(zip(SIDES, values))}
            for name, *values in rows]
    samples = run.read_samples()
    prompts = [sample.get("prompt", "") for sample in samples]
    shared_text, varying = shared_template(prompts)
    table = [_table_row({**sample, "prompt": prompt}, names) for sample, prompt in zip(samples, varying)]

    state = run.read_status().get("state", "unknown")
    weights = _newest_weights(run)
    scored_from = (after or {}).get("weights")  # set by evaluate_now; training's own "after" used the final weights
    stale = after is not None and weights is not None and scored_from is not None and scored_from != weights.label
    can_evaluate = (state not in ACTIVE_STATES and weights is not None and (after is None or stale)
                    and _has_held_out(run))
    summary = _summary(run, evaluation, state, weights if can_evaluate else None, scored_on_opening)
    if shared_text:
        summary += f" Every prompt reads “{shared_text}”; the table shows the part that differs."
    return Comparison(summary, bars if before or after else [], table, can_evaluate, prompts[0] if prompts else "")


def shared_template(prompts: list[str]) -> tuple[str, list[str]]:
    """(what every prompt shares, with … where they differ; each prompt's own part): a long template repeated in
    each row would hide the part the model answered. Cut at spaces; nothing is shared under two prompts or where
    the shared text is short."""
    if len(prompts) < 2:
        return "", prompts
    head = os.path.commonprefix(prompts)
    tail = os.path.commonprefix([prompt[::-1] for prompt in prompts])[::-1]
    head = head[:head.rfind(" ") + 1] if " " in head else ""  # whole words only
    tail = tail[tail.find(" "):] if " " in tail else ""
    shortest = min(len(prompt) for prompt in prompts)
    if len(head) + len(tail) > shortest:  # the two overlap in the shortest prompt
        tail = ""
    if len(head) + len(tail) < 20:
        return "", prompts
    parts = [prompt[len(head):len(prompt) - len(tail)].strip() for prompt in prompts]
    return f"{head.strip()} … {tail.strip()}".strip(), parts  # "…" marks where each prompt's own part goes


def _table_row(sample: dict, names: list[str]) -> list:
    before, after = sample.get("before") or {}, sample.get("after") or {}
    def side(scored: dict, name: str) -> str:
        return _cell_number(scored.get("scores", {}).get(name))

    per_reward = "; ".join(f"{name} {side(before, name)} → {side(after, name)}" for name in names)
    return [sample.get("prompt", ""), sample.get("reference", ""), before.get("reply", ""), after.get("reply", ""),
            _rounded(before.get("reward")), _rounded(after.get("reward")), per_reward]


def _cell_number(value) -> str:
    """A score in the Compare table: two decimals, "–" when that side is not scored."""
    return "–" if value is None else f"{value:.2f}"


def _rounded(value):
    return None if value is None else round(value, 3)


def _checks_note(run: RunDir, n: int) -> str:
    """Where the Train tab's held-out checks answered fewer prompts than the whole set scored here, say so: the two
    "before" numbers differ for that reason alone."""
    checks = [row.get("n_prompts") for row in run.read_heldout()]
    fewer = checks[-1] if checks else None
    if not isinstance(fewer, int) or not 0 < fewer < n:
        return ""
    return f" (The Train tab's held-out checks answer the first {fewer} of them, so their numbers differ.)"


def _summary(run: RunDir, evaluation: dict, state: str, to_evaluate: TrainedWeights | None,
             scored_on_opening: bool = False) -> str:
    """The Compare tab's sentence; ``to_evaluate``: the weights Evaluate now would score (None: nothing to score)."""
    before, after = evaluation.get("before"), evaluation.get("after")
    n = evaluation.get("n_prompts", 0)
    if before and after:
        source = f" The trained side was scored from {after['weights']}." if after.get("weights") else ""
        text = (f"Held-out reward on all {n} held-out prompts (greedy replies): {before['reward_mean']:.3f} before → "
                f"{after['reward_mean']:.3f} after ({after['reward_mean'] - before['reward_mean']:+.3f}).{source}"
                f"{_checks_note(run, n)}")
        if before.get("right") is not None and after.get("right") is not None:
            text += (f" Right answers by the goal ({', '.join(after.get('goal') or [])}): "
                     f"{round(before['right'] * n)} of {n} before → {round(after['right'] * n)} of {n} after.")
        if to_evaluate is not None:
            text += f" Newer weights exist ({to_evaluate.label}): press Evaluate now to score them."
        metrics = sorted(metric_names(evaluation))
        if metrics:
            text += (f" {', '.join(metrics)} {'is a metric' if len(metrics) == 1 else 'are metrics'}: scored, but "
                     "not part of the total and never trained on.")
        return text
    if not _has_held_out(run):
        return (f"The run {run.id} has no held-out prompts (datasets under 20 rows keep none), so there is no "
                "before/after score; the free prompt below still compares both models.")
    if state in ACTIVE_STATES:
        start = f"The starting model scored {before['reward_mean']:.3f} on {n} held-out prompts. " if before else ""
        return start + f"The run is {state}; the trained side is scored when it finishes."
    if to_evaluate is not None:
        start = f"The starting model scored {before['reward_mean']:.3f} on {n} held-out prompts, but" if before else \
            "There is no held-out score yet:"
        then = (f"Shown here, its trained model ({to_evaluate.label}) is scored on them by itself (see below); "
                "Evaluate now scores it at any time" if scored_on_opening else
                f"Press Evaluate now to score {to_evaluate.label} on the held-out prompts")
        return f"{start} the run ended ({state_label(state)}) before scoring the trained model. {then}."
    if before:
        return (f"The starting model scored {before['reward_mean']:.3f} on {n} held-out prompts, but the run ended "
                f"({state_label(state)}) before saving any trained weights, so there is nothing to compare it with.")
    return f"The run {run.id} has no held-out scores and no trained weights yet (it is {state_label(state)})."


# ---------------------------------------------------------------------------------------------------------------
# Generating with both models.


ASK_PROMPT_CHARS = 4000  # a free prompt's length: a question, not a document
ASK_TEMPERATURE_MAX = 3.0


def most_new_tokens(*, policy: Policy) -> int:
    """The longest reply "Ask both models" may ask for: a public demo's limit of new tokens per completion."""
    return policy.limits.max_new_tokens if policy.limits else ASK_MAX_NEW_TOKENS


def answer_both(studio, run: RunDir, prompt: str, max_new_tokens: int | None = None,
                temperature: float = 0.0) -> tuple[str, str]:
    """(before, after): the starting and the trained model's replies to one prompt, greedy unless temperature > 0.
    Each value is checked here, since any client can send any: a public demo keeps to its limit of new tokens."""
    if not isinstance(prompt, str) or not prompt.strip():
        raise ConfigError("Type a prompt first; both models will answer it.")
    if len(prompt) > ASK_PROMPT_CHARS:
        raise ConfigError(f"The prompt has {len(prompt):,} characters; ask with at most {ASK_PROMPT_CHARS:,}.")
    config = run.read_config()
    tokens = config.grpo.max_new_tokens if max_new_tokens is None else max_new_tokens
    most = most_new_tokens(policy=studio.policy)
    if isinstance(tokens, bool) or not isinstance(tokens, numbers.Real) or not 1 <= tokens <= most \
            or tokens != int(tokens):
        raise ConfigError(f"Max new tokens must be a whole number from 1 to {most}.")
    if isinstance(temperature, bool) or not isinstance(temperature, numbers.Real) \
            or not 0 <= temperature <= ASK_TEMPERATURE_MAX:
        raise ConfigError(f"The temperature must be a number from 0 to {ASK_TEMPERATURE_MAX:g}.")
    weights = trained_weights(run)
    conversation = shared_system_message(run) + [{"role": "user", "content": prompt.strip()}]
    replies = []
    for side in SIDES:
        with model_for(studio.previews.load, config, weights, side) as (model, tokenizer):
            replies += generate_replies(model, tokenizer, [conversation], int(tokens), temperature=float(temperature))
    return replies[0], replies[1]


# ---------------------------------------------------------------------------------------------------------------
# What the Compare tab's buttons do with one's own run.


def awaits_its_after(studio, run_id: str) -> bool:
    """Whether a run is one's own, ended, and has trained weights but no "after" score yet: what a stop leaves."""
    try:
        run = studio.runs.get(run_id)
    except ConfigError:
        return False
    status = run.read_status()
    return (studio.runs.owns(status.get("owner")) and status.get("state") not in ACTIVE_STATES
            and "after" not in run.read_eval() and _has_held_out(run) and _newest_weights(run) is not None)


def rescore(studio, run_id: str, should_stop: Callable[[], bool]) -> Iterator[str]:
    """"Evaluate now": score one's own run again on its held-out prompts; a sentence per batch (evaluate_now)."""
    run = studio.runs.owned(run_id, "score it again")
    training.wait_while_ending()  # Compare opened right after Stop
    yield from evaluate_now(studio.previews.load, run, should_stop=should_stop, policy=studio.policy)


def adapter_download(studio, run_id: str) -> str:
    """The zipped adapter of one's own run, handed out to download."""
    return studio.files.handed_out(weights.zip_adapter(studio.runs.owned(run_id, "download its adapter")))


def _own_run_to_merge(studio, run_id: str, action: str, doing: str) -> RunDir:
    """One's own run, to ``action`` with work that merges its whole model (``doing``): refused beside a training
    on this machine's CPU, which it would slow down badly."""
    run = studio.runs.owned(run_id, action)
    studio.previews.refuse_while_training(doing)
    return run


def merged_download(studio, run_id: str) -> tuple[str, str, str]:
    """(zip handed out, the merged folder as the app shows it, a sentence with both sizes) of one's own run."""
    run = _own_run_to_merge(studio, run_id, "merge and download its model", "merging a model")
    merged = weights.merged_download(run)
    shown = studio.files.shown_path(merged.folder)
    return studio.files.handed_out(merged.archive), shown, weights.merged_download_message(run, merged, shown)


def gguf_download(studio, run_id: str, quant: str) -> tuple[list[str], str]:
    """([the .gguf file, its Modelfile] handed out, a sentence saying how to run them) of one's own run. Two files
    rather than a zip: a GGUF is already one file, and a copy of it in a zip would double gigabytes on the disk."""
    gguf_export.check_quant(quant)
    run = _own_run_to_merge(studio, run_id, "convert and download its model", "converting a model to GGUF")
    studio.files.refuse_beyond_share(gguf_export.expected_bytes(run, quant), "The GGUF file of this run")
    export = gguf_export.export_gguf(run, quant)
    ollama, llama_cpp = gguf_export.run_commands(export)
    said = (f"{gguf_export.export_message(run, export)} Save both files in one folder and run it there, in Ollama: "
            f"`{ollama}`, or in llama.cpp: `{llama_cpp}`; LM Studio imports the .gguf file.")
    return [studio.files.handed_out(export.path), studio.files.handed_out(export.modelfile)], said


def publish_run(studio, run_id: str, repo: str, merged: bool, private: bool, update: bool, token: str) -> Published:
    """Upload one's own run (its adapter, or the merged model) to the Hub, under the app's policy."""
    run = studio.runs.owned(run_id, "publish it")
    if merged:
        studio.previews.refuse_while_training("merging a model to publish it")
    return publish(run, repo, merged=merged, private=private, token=token, update=update, policy=studio.policy)
