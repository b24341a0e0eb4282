"""Before/after evaluation on held-out prompts: greedy replies scored by the run's own rewards.

Greedy decoding makes the comparison repeatable (the same model always gives the same reply), and scoring with the
same rewards as training answers the question the user actually asked: did the model get better at *this*?
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from ..chat import completion_text
from ..config import GRPOSettings, ModelConfig, RunConfig
from ..data import prompt_text, read_jsonl
from ..errors import ConfigError, Stopped
from ..public import Policy
from .. import speedups
from ..rewards import (EPISODE_SCORE, Reward, ScoreResult, build_rewards, goal_names, right_by_goal,
                       score_completions)
from ..runstore import ACTIVE_STATES, HeldOutRow, RunDir, format_seconds, write_json_atomic
from .hardware import release_openmp_threads
from .reward_models import classifiers_on
from .tool_calls import EPISODE_TOOLS, ToolUse, played, ready_for_tools, tool_use
from .trained import TrainedWeights, trained_weights

log = logging.getLogger(__name__)

EVAL_BATCH = 16  # prompts per generate call; training, the Compare tab and the CLI batch alike, so greedy replies match
REPLIES_EVERY_S = 0.3  # how often generate_replies hands on the replies so far (on_replies): as often as a page redraws


@dataclass
class EvalResult:
    reward_mean: float
    breakdown: dict[str, float]  # reward name -> mean unweighted score
    replies: list[str]
    totals: list[float]
    scores: list[dict[str, float]]
    seconds: float
    metrics: list[str] = field(default_factory=list)  # the breakdown's names that are metrics, not in reward_mean
    goal: list[str] = field(default_factory=list)  # the rewards that say the answer is right (goal_names)
    right: float | None = None  # the share of replies that pass every goal reward; None: no goal

    def summary(self) -> dict:
        return {"reward_mean": self.reward_mean, "reward_breakdown": self.breakdown, "metrics": self.metrics,
                "goal": self.goal, "right": self.right, "n_prompts": len(self.replies),
                "seconds": round(self.seconds, 2)}


def generate_replies(model, tokenizer, conversations: list[list[dict]], max_new_tokens: int, batch_size: int = EVAL_BATCH,
                     temperature: float = 0.0, should_stop: Callable[[], bool] | None = None,
                     sampling: dict | None = None,
                     on_replies: Callable[[list[str]], None] | None = None) -> list[str]:
    """Reply to each chat prompt (greedy when temperature is 0), batched with left padding. ``should_stop`` is
    asked after every generated token; once it is true, generation ends and Stopped is raised. ``sampling``: more of
    generate's sampling settings (top_p, top_k, min_p, repetition_penalty), as a run samples with them.
    ``on_replies`` is handed every reply so far (the unfinished ones as far as they go) at most every
    REPLIES_EVERY_S while they are generated, for a view that shows them as they come."""
    import torch
    from transformers import StoppingCriteria, StoppingCriteriaList

    replies: list[str] = []
    prompt_length, said_at = 0, time.monotonic()

    class SaySoFar(StoppingCriteria):
        def __call__(self, input_ids, scores, **kwargs):
            nonlocal said_at
            if time.monotonic() - said_at >= REPLIES_EVERY_S:
                on_replies(replies + tokenizer.batch_decode(input_ids[:, prompt_length:], skip_special_tokens=True))
                said_at = time.monotonic()
            return torch.zeros((input_ids.shape[0],), dtype=torch.bool, device=input_ids.device)

    stopping = StoppingCriteriaList([*_stopping_when_asked(should_stop),
                                     *([SaySoFar()] if on_replies is not None else [])])
    device = next(model.parameters()).device
    texts = [tokenizer.apply_chat_template(c, add_generation_prompt=True, tokenize=False) for c in conversations]
    was_training = model.training
    model.eval()
    try:
        for start in range(0, len(texts), batch_size):
            if should_stop is not None and should_stop():
                raise Stopped("stopped while generating replies")
            batch = tokenizer(texts[start:start + batch_size], return_tensors="pt", padding=True, padding_side="left",
                              add_special_tokens=False).to(device)
            prompt_length = batch["input_ids"].shape[1]
            how = _how(temperature, sampling)
            with torch.inference_mode():
                out = speedups.generate(model, temperature > 0, **batch, max_new_tokens=max_new_tokens,
                                        pad_token_id=tokenizer.pad_token_id, stopping_criteria=stopping, **how)
            if should_stop is not None and should_stop():
                raise Stopped("stopped while generating replies")
            new_tokens = out[:, batch["input_ids"].shape[1]:]
            replies.extend(tokenizer.batch_decode(new_tokens, skip_special_tokens=True))
    finally:
        model.train(was_training)
        # Previews run here on the UI's pooled threads, which outlive the request; their idle OpenMP workers would
        # slow a later training by half (see release_openmp_threads).
        release_openmp_threads()
    return replies


def _how(temperature: float, sampling: dict | None) -> dict:
    """generate's settings: greedy at temperature 0, else sampled with ``sampling``'s settings."""
    if temperature > 0:
        return {"do_sample": True, "temperature": temperature, "top_p": 1.0, "top_k": None, **(sampling or {})}
    return {"do_sample": False, "top_k": None}


def sampled_replies(model, tokenizer, examples: list[dict], grpo: GRPOSettings,
                    tools: ToolUse | None = None, should_stop: Callable[[], bool] | None = None,
                    on_replies: Callable[[list[str]], None] | None = None) -> list[str]:
    """Replies to mapped ``examples`` sampled as a training step samples them, in one batch: its temperature, length
    cap and sampling settings, calling ``tools`` as training does (``examples`` then played: tool_calls.played;
    each reply is its final answer, and ``on_replies`` is not told of them as they grow)."""
    if tools is None:
        return generate_replies(model, tokenizer, [example["prompt"] for example in examples], grpo.max_new_tokens,
                                batch_size=len(examples), temperature=grpo.temperature, should_stop=should_stop,
                                sampling=_sampling(grpo), on_replies=on_replies)
    return [completion_text(reply) for reply in sampled_turns(model, tokenizer, examples, grpo, tools, should_stop)]


def sampled_turns(model, tokenizer, episodes: list[dict], grpo: GRPOSettings, tools: ToolUse,
                  should_stop: Callable[[], bool] | None = None) -> list[list[dict]]:
    """sampled_replies' replies to played ``episodes`` with ``tools``, whole: each the messages it added (its calls,
    the tools' answers, the final answer last)."""
    return _with_tools(model, lambda: reply_with_tools(model, tokenizer, episodes, tools.max_rounds,
                                                       grpo.max_new_tokens, len(episodes), should_stop,
                                                       grpo.temperature, _sampling(grpo)))


def _sampling(grpo: GRPOSettings) -> dict:
    """generate's sampling settings of a run (Hugging Face's names)."""
    return {"top_p": grpo.top_p, "top_k": grpo.top_k or None, "min_p": grpo.min_p,
            "repetition_penalty": grpo.repetition_penalty}


def _with_tools(model, reply: Callable[[], list]) -> list:
    """``reply()`` with the model in eval mode, put back as it was; idle OpenMP workers released as
    generate_replies does (the UI's pooled threads outlive the request)."""
    was_training = model.training
    model.eval()
    try:
        return reply()
    finally:
        model.train(was_training)
        release_openmp_threads()


def _stopping_when_asked(should_stop: Callable[[], bool] | None) -> list:
    """generate's stopping criterion that ends every row once ``should_stop()`` (asked after each token); none
    without one. The caller raises Stopped once generate returns."""
    if should_stop is None:
        return []
    import torch
    from transformers import StoppingCriteria

    class StopWhenAsked(StoppingCriteria):
        def __call__(self, input_ids, scores, **kwargs):
            return torch.full((input_ids.shape[0],), should_stop(), dtype=torch.bool, device=input_ids.device)

    return [StopWhenAsked()]


def reply_with_tools(model, tokenizer, episodes: list[dict], max_rounds: int, max_new_tokens: int,
                     batch_size: int, should_stop: Callable[[], bool] | None = None, temperature: float = 0.0,
                     sampling: dict | None = None) -> list[list[dict]]:
    """Replies (greedy at ``temperature`` 0) to played ``episodes`` (ToolUse.episodes) that call their tools as
    training does: each round generates for the conversations still going, runs the tools they call and hands the
    answers back, up to ``max_rounds`` rounds. Each reply is the messages it added (the last assistant message is
    the final answer the rewards score); its generated tokens and the tools' answers share ``max_new_tokens``, as
    in training."""
    import torch
    from transformers import StoppingCriteriaList
    from trl.chat_template_utils import parse_response

    histories = [list(episode["prompt"]) for episode in episodes]
    functions = [episode[EPISODE_TOOLS] for episode in episodes]
    added: list[list[dict]] = [[] for _ in episodes]
    left = [max_new_tokens] * len(episodes)
    going = list(range(len(episodes)))
    device = next(model.parameters()).device
    stop_ids = {tokenizer.eos_token_id, tokenizer.pad_token_id}
    for round_number in range(max_rounds + 1):
        calling = []
        for start in range(0, len(going), batch_size):
            if should_stop is not None and should_stop():
                raise Stopped("stopped while generating replies")
            batch_rows = going[start:start + batch_size]
            texts = [tokenizer.apply_chat_template(histories[i], tools=functions[i], add_generation_prompt=True,
                                                   tokenize=False) for i in batch_rows]
            batch = tokenizer(texts, return_tensors="pt", padding=True, padding_side="left",
                              add_special_tokens=False).to(device)
            with torch.inference_mode():
                out = speedups.generate(model, temperature > 0, **batch,
                                        max_new_tokens=max(left[i] for i in batch_rows),
                                        pad_token_id=tokenizer.pad_token_id, **_how(temperature, sampling),
                                        stopping_criteria=StoppingCriteriaList(_stopping_when_asked(should_stop)))
            if should_stop is not None and should_stop():
                raise Stopped("stopped while generating replies")
            prompt_length = batch["input_ids"].shape[1]
            for row, i in enumerate(batch_rows):
                ids = _until_end(out[row, prompt_length:].tolist()[:left[i]], stop_ids, tokenizer.eos_token_id)
                left[i] -= len(ids)
                prefix = batch["input_ids"][row][batch["attention_mask"][row].bool()].tolist()  # its prompt, unpadded
                message = parse_response(tokenizer, ids, prefix=prefix, tools=functions[i])
                message.setdefault("role", "assistant")
                histories[i].append(message)
                added[i].append(message)
                if message.get("tool_calls") and round_number < max_rounds and left[i] > 0:
                    calling.append(i)
        going = []
        for i in calling:
            answers = _answers(added[i][-1]["tool_calls"], functions[i])
            tokens = sum(len(tokenizer(answer["content"], add_special_tokens=False)["input_ids"]) for answer in answers)
            if tokens >= left[i]:  # as TRL: answers that would pass the budget are left out, and the reply ends
                continue
            left[i] -= tokens
            histories[i] += answers
            added[i] += answers
            going.append(i)
        if not going:
            break
    return added


def _until_end(ids: list[int], stop_ids: set, eos_id: int) -> list[int]:
    """A row's generated tokens up to and including its end of turn (the padding after it dropped)."""
    for position, token in enumerate(ids):
        if token in stop_ids:
            return ids[:position] + ([eos_id] if token == eos_id else [])
    return ids


def _answers(calls: list[dict], functions: list[Callable]) -> list[dict]:
    """The tool messages answering ``calls``, as TRL makes them: an error becomes {"error": ...} for the model."""
    by_name = {function.__name__: function for function in functions}
    messages = []
    for call in calls:
        function = call.get("function") or {}
        name = function.get("name", "unknown")
        try:
            if name not in by_name:
                raise ValueError(f"Tool {name} not found.")
            content = by_name[name](**(function.get("arguments") or {}))  # build_tools' functions answer text
        except Stopped:
            raise
        except Exception as error:  # as TRL: any failure of the call is the model's to read
            content = str({"error": str(error)})
        messages.append({"role": "tool", "name": name, "content": content})
    return messages


def held_out_replies(model, tokenizer, examples: list[dict], max_new_tokens: int, tools: ToolUse | None = None,
                     should_stop: Callable[[], bool] | None = None, batch_size: int = EVAL_BATCH) -> list[str]:
    """Greedy replies to mapped examples, as the rewards score them: with ``tools`` (``examples`` then played:
    tool_calls.played), each calls them as training does and its final answer is the reply."""
    if tools is None:
        return generate_replies(model, tokenizer, [example["prompt"] for example in examples], max_new_tokens,
                                batch_size=batch_size, should_stop=should_stop)
    return [completion_text(reply) for reply in _with_tools(model, lambda: reply_with_tools(
        model, tokenizer, examples, tools.max_rounds, max_new_tokens, batch_size, should_stop))]


def evaluate_model(model, tokenizer, examples: list[dict], rewards: list[Reward], max_new_tokens: int,
                   should_stop: Callable[[], bool] | None = None, tools: ToolUse | None = None) -> EvalResult:
    """Greedy replies to every held-out example (calling ``tools`` as training does), scored with every reward;
    means are over prompts. Raises Stopped once ``should_stop()`` (a stop, a time limit) turns true."""
    started = time.monotonic()
    examples = played(tools, examples)
    replies = held_out_replies(model, tokenizer, examples, max_new_tokens, tools, should_stop)
    return score_replies(examples, replies, rewards, time.monotonic() - started, should_stop)


def score_examples(rewards: list[Reward], examples: list[dict], replies: list[str],
                   should_stop: Callable[[], bool] | None = None) -> list[ScoreResult]:
    """Score ``replies[i]`` as a reply to the mapped ``examples[i]`` (its reference, its prompt's text, its row and,
    played in an environment, the environment's score) with every reward; Stopped once ``should_stop()``."""
    rows = [json.loads(ex.get("row") or "{}") for ex in examples]
    for row, example in zip(rows, examples, strict=True):
        if EPISODE_SCORE in example:
            row[EPISODE_SCORE] = example[EPISODE_SCORE]
    return score_completions(rewards, list(replies), [ex.get("reference") or None for ex in examples],
                             [prompt_text(ex) for ex in examples], rows, should_stop)


def score_replies(examples: list[dict], replies: list[str], rewards: list[Reward], seconds: float,
                  should_stop: Callable[[], bool] | None = None) -> EvalResult:
    """Score one reply per held-out example with every reward (also used by evaluate_now, which generates batch
    by batch to report progress); Stopped once ``should_stop()``."""
    results = score_examples(rewards, examples, replies, should_stop)
    return scored(replies, [r.total for r in results], [r.scores for r in results], rewards, seconds)


def scored(replies: list[str], totals: list[float], scores: list[dict[str, float]], rewards: list[Reward],
           seconds: float) -> EvalResult:
    """The means over the prompts of their scored replies."""
    n = max(1, len(totals))
    breakdown = {r.name: sum(s[r.name] for s in scores) / n for r in rewards}
    goal = goal_names([r.spec for r in rewards])
    goal_specs = [r.spec for r in rewards if r.name in goal]
    right = sum(right_by_goal(s, goal_specs) for s in scores) / n if goal else None
    return EvalResult(sum(totals) / n, breakdown, replies, totals, scores, seconds,
                      [r.name for r in rewards if r.metric], goal, right)


def record_eval(run: RunDir, stage: str, result: EvalResult, examples: list[dict], n_samples: int) -> dict:
    """Store one side ("before" or "after") in eval.json and samples.json, keeping the other side intact."""
    evaluation = run.read_eval()
    evaluation[stage] = result.summary()
    evaluation["n_prompts"] = len(examples)
    if "before" in evaluation and "after" in evaluation:
        evaluation["improvement"] = evaluation["after"]["reward_mean"] - evaluation["before"]["reward_mean"]
    write_json_atomic(run.eval_path, evaluation)

    samples = run.read_samples() or [{"prompt": prompt_text(ex), "reference": ex.get("reference", "")}
                                     for ex in examples[:n_samples]]
    for sample, reply, total, scores in zip(samples, result.replies, result.totals, result.scores):
        sample[stage] = {"reply": reply, "reward": total, "scores": scores}
    write_json_atomic(run.samples_path, samples)
    if stage == "before":
        run.update_status(heldout_before=result.reward_mean, heldout_before_scores=result.breakdown,
                          heldout_before_right=result.right, goal=result.goal)
    else:
        run.update_status(heldout_after=result.reward_mean, heldout_after_scores=result.breakdown,
                          heldout_after_right=result.right, goal=result.goal)
    log.info("Held-out reward %s training: %.3f (%s) on %d prompts in %.1f s", stage, result.reward_mean,
             ", ".join(f"{k} {v:.3f}" for k, v in result.breakdown.items()), len(examples), result.seconds)
    return evaluation


def starting_weights(model):
    """Inside ``with``, a LoRA-trained ``model`` is its starting model: PEFT's adapter switched off leaves exactly
    the frozen weights it started from, so "before" needs neither a second copy nor a score taken before training."""
    return model.disable_adapter()


class HeldOutChecks:
    """The held-out reward during training (heldout.jsonl): every few steps, greedy replies to the first
    ``training.eval_prompts`` held-out prompts, scored by the run's rewards. The same few prompts every time, so the
    points of the curve compare. Step 0 is the starting model on them: with LoRA, scored at the first check with the
    adapter switched off (Start is not kept waiting for it); otherwise taken from the "before" scoring.

    One process only: with several, the others would wait at the next step's collective for as long as it takes."""

    def __init__(self, run: RunDir, config: RunConfig, eval_rows: list[dict], rewards: list[Reward], tokenizer,
                 should_stop: Callable[[], bool], processes: int, tools: ToolUse | None = None) -> None:
        self.run, self.config, self.rewards, self.tokenizer, self.tools = run, config, rewards, tokenizer, tools
        wanted = config.training.eval_every != 0 and processes == 1 and not run.read_only
        self.examples = eval_rows[:config.training.eval_prompts] if wanted else []
        self.held_out = len(eval_rows)
        self.should_stop = should_stop
        self.every = 0
        self.start_pending = config.lora.enabled and not any(row.get("step") == 0 for row in run.read_heldout())

    def begin(self, total_steps: int) -> None:
        """Decide how often to check, once the trainer knows its number of steps."""
        if self.examples:
            self.every = self.config.training.checks_at(total_steps)

    def record_start(self, before: EvalResult) -> None:
        """Step 0 of the curve: the starting model's scores on the same prompts, from the whole set's "before"."""
        count = len(self.examples)
        if count:
            self._append(0, scored(before.replies[:count], before.totals[:count], before.scores[:count], self.rewards,
                                   0.0))

    def due(self, step: int, total_steps: int) -> bool:
        return bool(self.every) and (step % self.every == 0 or step == total_steps)

    def check(self, model, step: int) -> None:
        """Score the model as it is now (after the starting model, if step 0 is still to be scored); raises Stopped on
        a stop or the time limit (nothing more is written then)."""
        if self.start_pending:
            with starting_weights(model):
                self._append(0, self._score(model))
            self.start_pending = False
        result = self._score(model)
        self._append(step, result)
        log.info("Held-out reward at step %d: %.3f on %d prompts (%.1f s)", step, result.reward_mean,
                 len(self.examples), result.seconds)

    def _score(self, model) -> EvalResult:
        started = time.monotonic()
        examples = played(self.tools, self.examples)
        replies = held_out_replies(model, self.tokenizer, examples, self.config.grpo.max_new_tokens, self.tools,
                                   self.should_stop)
        return score_replies(examples, replies, self.rewards, time.monotonic() - started, self.should_stop)

    def _append(self, step: int, result: EvalResult) -> None:
        self.run.append_heldout({"step": step, "reward": result.reward_mean,
                                 "rewards": dict(result.breakdown), "right": result.right,
                                 "n_prompts": len(result.totals), "of_prompts": self.held_out,
                                 "seconds": round(result.seconds, 2)})


# ---------------------------------------------------------------------------------------------------------------
# Evaluating a finished or stopped run again, outside training.

SIDES = ("before", "after")
# The cached PeftModel is shared by every request; switching its adapter off for one request must not change what
# another request generates at the same moment.
_GENERATION_LOCK = threading.Lock()
# What gives a (model, tokenizer): engine.models.ModelCache.load, or the app's version that refuses while training.
LoadModel = Callable[..., tuple]


def before_and_after(evaluation: dict) -> list[tuple[str | None, float | None, float | None]]:
    """eval.json as rows of (reward name, before, after): the weighted total first (name None), then each reward
    and metric (metric_names); a side not scored yet is None. The Compare tab's chart, ``eval`` and the model card
    all show these rows."""
    before, after = evaluation.get("before") or {}, evaluation.get("after") or {}
    rows: list[tuple[str | None, float | None, float | None]] = [
        (None, before.get("reward_mean"), after.get("reward_mean"))]
    for name in (before or after).get("reward_breakdown", {}):
        rows.append((name, *(side.get("reward_breakdown", {}).get(name) for side in (before, after))))
    return rows


def metric_names(evaluation: dict) -> set[str]:
    """The rewards of eval.json that are metrics: scored, but not part of the total (nor trained on)."""
    return {str(name) for side in SIDES for name in (evaluation.get(side) or {}).get("metrics") or []}


def shown_reward_name(name: str | None, metrics: set[str]) -> str:
    """A row of before_and_after as a table labels it: the total, a reward, or a metric saying it is one."""
    if name is None:
        return "total (weighted)"
    return f"{name} (metric)" if name in metrics else name


def heldout_curve(rows: list[HeldOutRow]) -> str:
    """The held-out checks during training in one line ("step 0: 0.420 · step 10: 0.550 · ..."), for the command
    line and the model card; "" when the run made none."""
    points = [(row["step"], row["reward"]) for row in rows if isinstance(row.get("reward"), (int, float))]
    return " · ".join(f"step {step}: {reward:.3f}" for step, reward in points)


def held_out_examples(run: RunDir) -> list[dict]:
    path = run.eval_data_path
    return read_jsonl(path) if path.is_file() else []


@contextlib.contextmanager
def model_for(load: LoadModel, config: RunConfig, weights: TrainedWeights, side: str):
    """(model, tokenizer) for one side ("before": the starting model, "after": the trained one), held exclusively while
    the caller generates; ``load`` is a ModelCache.load or the app's guarded version of it."""
    with _GENERATION_LOCK:
        if weights.is_adapter:
            model, tokenizer = load(config.model, adapter_dir=weights.path, settings=config.hardware)
            if side == "before":
                with starting_weights(model):
                    yield model, tokenizer
            else:
                yield model, tokenizer
        else:  # full fine-tuning: two different models, so the cache swaps between them
            model_config = config.model if side == "before" else ModelConfig(id=str(weights.path))
            yield load(model_config, settings=config.hardware)


def expected_time(run: RunDir, sides: int) -> str:
    """" It takes about 40 s, …": a scoring of the held-out prompts takes about as long as the run's last one of
    them (greedy replies to the same prompts, by a model of the same size); "" when none was timed."""
    timed = [side.get("seconds") for side in (run.read_eval().get(name) or {} for name in SIDES)]
    seconds = max((value for value in timed if isinstance(value, (int, float))), default=None)
    if not seconds:
        return ""
    return (f" It takes about {format_seconds(seconds * sides)}, as long as the last scoring of these prompts "
            "took.")


def evaluate_now(load: LoadModel, run: RunDir, should_stop: Callable[[], bool] = lambda: False,
                 rescore_before: bool = False, while_training: bool = False,
                 *, policy: Policy) -> Iterator[str]:
    """Score the run's newest weights (and the starting model, if not scored yet or ``rescore_before``) on its
    held-out prompts: the Compare tab's "Evaluate now" and ``python -m dragon_ui eval``, with ``load`` giving the
    models (a ModelCache.load).

    A generator of progress sentences, one per batch; eval.json and samples.json are written with record_eval exactly
    as training writes them, one side at a time. When ``should_stop()`` turns true it stops between batches, leaving
    the files as they were before the unfinished side. ``while_training``: the run's own training calls it, after
    its sharded trainer has saved the weights.
    """
    config = run.read_config()
    state = run.read_status().get("state")
    if state in ACTIVE_STATES and not while_training:
        raise ConfigError(f"The run {run.id} is still {state}; it scores the trained model itself when it finishes.")
    examples = held_out_examples(run)
    if not examples:
        raise ConfigError(f"The run {run.id} has no held-out prompts (datasets under 20 rows keep none), so there is "
                          "nothing to evaluate.")
    weights = trained_weights(run)
    rewards: list[Reward] = []  # built with the first model's tokenizer, which TRL's length rewards count with
    tools = tool_use(config, read_jsonl(run.train_data_path) + examples, policy=policy) if config.tools else None
    sides = [side for side in SIDES if side == "after" or rescore_before or "before" not in run.read_eval()]
    yield f"Loading the model with {weights.label}...{expected_time(run, len(sides))}"
    for side in sides:
        started = time.monotonic()
        replies: list[str] = []
        episodes = played(tools, examples)  # fresh environments for each side
        for start in range(0, len(examples), EVAL_BATCH):
            if should_stop():
                yield f"Cancelled; the {side} side was not saved."
                return
            with model_for(load, config, weights, side) as (model, tokenizer):
                rewards = rewards or build_rewards(config.rewards, base_dir=config.base_dir or None,
                                                   tokenizer=tokenizer, max_new_tokens=config.grpo.max_new_tokens,
                                                   classifiers=classifiers_on(str(model.device)), policy=policy)
                if tools is not None:
                    tokenizer = ready_for_tools(tokenizer, config.model.id)
                replies += held_out_replies(model, tokenizer, episodes[start:start + EVAL_BATCH],
                                            config.grpo.max_new_tokens, tools)
            model_name = "starting model" if side == "before" else f"trained model ({weights.label})"
            yield f"The {model_name} answered {len(replies)} of {len(examples)} held-out prompts..."
        try:
            result = score_replies(episodes, replies, rewards, time.monotonic() - started, should_stop)
        except Stopped:
            yield f"Cancelled; the {side} side was not saved."
            return
        evaluation = record_eval(run, side, result, examples, config.n_samples)
        if side == "after":  # say where "after" came from, so a later checkpoint shows up as newer
            evaluation["after"]["weights"] = weights.label
            write_json_atomic(run.eval_path, evaluation)
    after = run.read_eval()["after"]["reward_mean"]
    yield f"Done: the trained model ({weights.label}) scored {after:.3f} on {len(examples)} held-out prompts."

