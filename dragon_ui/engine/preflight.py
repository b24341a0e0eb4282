"""Will it learn? Before Start, sample the run's groups for some of its training prompts, as a step samples them, and
score them with its rewards: GRPO learns only from groups whose replies score differently, so the share of groups
with no spread, and whether those all fail (too hard) or all pass (too easy), says before any training whether the
run can learn, and which change would help.

A reply *passes* when its weighted total reaches half the rewards' full marks (``full_marks``: 1 a reward, 0 a
penalty). "No spread" is ``grpo_math.has_spread``, as training counts it. Whether the groups differ in the goal, and
the alternatives where they do not, are engine.goal's. The app's pre-flight button, ``dragon
check --preflight`` and the HTTP API all call ``preflight``.
"""

from __future__ import annotations

import dataclasses
import json
import math
import random
import shlex
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from ..config import Draft, RunConfig
from ..data import DataConfig, prompt_text
from ..errors import DragonError, Stopped
from ..grpo_math import finite_number, has_spread
from ..public import Policy
from ..rewards import Reward, build_rewards
from ..rewards.spec import full_marks
from ..runstore import excerpt, format_seconds
from .evaluation import LoadModel, sampled_replies, score_examples
from .goal import GoalCheck, SampledGroup, alternatives, check_goal
from .presets import PRESETS, find_preset
from .prompts import NO_LIMIT, token_counts
from .redteam import RedTeam, as_number, red_team
from .reward_models import classifiers_on
from .tool_calls import ToolUse, played, ready_for_tools
from .training import Inspection, inspect

PREFLIGHT_S = 60  # the default sample is sized to take about this long
MIN_PROMPTS = 16
MOST_PROMPTS = 256
NO_SPREAD_TOO_MUCH = 0.5  # past this share of groups without spread, most of every step teaches nothing
# ...and past this one, next to nothing does. Measured (docs/performance.md): runs at 44-57 % learned within 10 steps,
# one at 78 % a little in 24, the too_hard lesson at 94 % nothing in 48.
NO_SPREAD_HOPELESS = 0.9
CAPPED_TOO_MANY = 0.25  # past this share of replies cut off at max new tokens, the length cap is hurting
FAILING_TOO_OFTEN = 0.1  # past this share of replies a reward failed on, it is broken for this data
PROMPT_CHARS = 300  # what the report keeps of a prompt or a reference


@dataclass(frozen=True)
class PromptCheck:
    """One prompt's sampled group."""

    number: int  # its row in the data file (1-based), or its place in the training prompts
    prompt: str
    reference: str
    totals: list[float | None]
    passed: int  # replies whose total reached half the full marks
    capped: int  # replies cut off at max new tokens
    longest_tokens: int  # the prompt and its longest reply

    @property
    def pass_rate(self) -> float:
        return self.passed / len(self.totals) if self.totals else 0.0

    @property
    def kind(self) -> str:
        """"spread" (GRPO learns from it), "all fail" or "all pass" (it does not)."""
        if has_spread(self.totals):
            return "spread"
        return "all pass" if self.passed == len(self.totals) and self.totals else "all fail"


@dataclass(frozen=True)
class RewardCheck:
    """One reward over every sampled reply."""

    name: str
    mean: float | None
    spread: float | None  # the standard deviation of its scores
    failed: float  # the share of replies it failed on (a failure scores 0)
    trained: bool = True  # False: a metric, which teaches nothing whatever it scores


@dataclass(frozen=True)
class Fix:
    """A change that would help, made to the settings as they are when it is applied (``applied_to``): settings
    to set (config sections, nested), settings of rewards to change (by name), and rewards to add."""

    label: str
    why: str
    settings: dict = field(default_factory=dict)
    add_rewards: list[dict] = field(default_factory=list)
    change_rewards: dict[str, dict] = field(default_factory=dict)

    def applied_to(self, draft: Draft) -> dict:
        """``draft`` with this fix: its settings set, its rewards changed and added (one of the same name is kept
        instead)."""
        changed: dict[str, Any] = {**draft}
        for section, values in self.settings.items():
            changed[section] = {**(changed.get(section) or {}), **values}
        rewards = [{**reward, **self.change_rewards.get(str(reward.get("name") or reward.get("kind")), {})}
                   if isinstance(reward, dict) else reward for reward in draft.get("rewards") or []]
        names = {reward.get("name") or reward.get("kind") for reward in rewards if isinstance(reward, dict)}
        changed["rewards"] = rewards + [reward for reward in self.add_rewards if reward["name"] not in names]
        return changed

    def as_command_line(self) -> str:
        """The fix as ``dragon`` options (rewards to change or add are shown as YAML to edit under ``rewards:``)."""
        sets = " ".join("--set " + shlex.quote(f"{section}.{name}={json.dumps(value) if isinstance(value, dict) else value}")
                        for section, values in self.settings.items() for name, value in values.items())
        changes = "; under rewards, set " + "; ".join(
            f"{name}: {json.dumps(values)}" for name, values in self.change_rewards.items()) \
            if self.change_rewards else ""
        added = "; add under rewards: " + "; ".join(json.dumps(reward) for reward in self.add_rewards) \
            if self.add_rewards else ""
        return (sets + changes + added).strip("; ")


@dataclass(frozen=True)
class Preflight:
    """What sampling found, the verdict, and the fixes."""

    prompts: list[PromptCheck]
    rewards: list[RewardCheck]
    group_size: int
    max_new_tokens: int
    token_limit: int | None  # the longest prompt a run keeps plus max new tokens; None: no limit is known
    sampling_s: float
    step_s: float | None  # the predicted time of a training step
    ended_early: str = ""  # why sampling ended before every chosen prompt was sampled
    fixes: list[Fix] = field(default_factory=list)
    red_team: RedTeam | None = None  # the gaming replies, scored on the same prompts
    training_prompts: int = 0  # the run's training prompts, sampled or not (0: only the sampled ones are known)
    goal: GoalCheck | None = None  # the goal's part in the groups' spread; None: no reward says the answer is right

    def share(self, kind: str) -> float:
        """The share of groups of ``kind`` ("spread", "all fail", "all pass", or "no spread" for the last two)."""
        if not self.prompts:
            return 0.0
        kinds = [check.kind for check in self.prompts]
        count = len(kinds) - kinds.count("spread") if kind == "no spread" else kinds.count(kind)
        return count / len(kinds)

    @property
    def capped_share(self) -> float:
        replies = sum(len(check.totals) for check in self.prompts)
        return sum(check.capped for check in self.prompts) / replies if replies else 0.0

    @property
    def longest_tokens(self) -> int:
        return max((check.longest_tokens for check in self.prompts), default=0)

    @property
    def verdict(self) -> str:
        """The answer in one or a few sentences, with the numbers."""
        no_spread, fail, passes = (round(100 * self.share(kind)) for kind in ("no spread", "all fail", "all pass"))
        groups = f"{len(self.prompts)} prompt{'s' if len(self.prompts) != 1 else ''}, {self.group_size} replies each"
        if not self.learns:
            head = f"{no_spread} % of groups have no spread ({groups}): "
            hopeless = self.share("no spread") >= NO_SPREAD_HOPELESS
            slowly = "" if hopeless else (f" Only {100 - no_spread} % of the groups teach, so it learns slowly if at "
                                          "all.")
            if self.share("all fail") >= self.share("all pass"):
                sentences = [head + f"{fail} % all fail. {'Too hard' if hopeless else 'Hard'} for this model.{slowly}"
                             " Give partial credit (numeric tolerance, `contains`), shorten the answer format, or "
                             "raise the temperature."]
            else:
                sentences = [head + f"{passes} % all pass. {'Too easy' if hopeless else 'Mostly too easy'}: most "
                             f"replies already earn the reward.{slowly} Drop those prompts, or use harder data or a "
                             "stricter reward."]
        elif self.untaught_goal is not None:
            sentences = [*self.untaught_goal.sentences(),
                         f"({100 - no_spread} % of groups have a spread; {groups}.)"]
        else:
            sentences = [f"It can learn: {100 - no_spread} % of groups have a spread to learn from ({groups}; "
                         f"{fail} % all fail, {passes} % all pass)."]
        if self.capped_share >= CAPPED_TOO_MANY:
            sentences.append(f"{round(100 * self.capped_share)} % of replies are cut off at max new tokens "
                             f"({self.max_new_tokens}): raise it, or ask for a shorter answer.")
        for reward in self.rewards:
            if reward.failed >= FAILING_TOO_OFTEN:
                sentences.append(f"The reward {reward.name} failed on {round(100 * reward.failed)} % of replies "
                                 "(each scores 0): try it in the playground.")
            elif reward.spread == 0 and len(self.prompts) > 1 and reward.trained and not (
                    self.learns and self.untaught_goal is not None and reward.name in self.untaught_goal.names):
                sentences.append(f"The reward {reward.name} gave every reply {reward.mean:g}: it teaches nothing "
                                 "here.")
        if self.ended_early:
            sentences.append(self.ended_early)
        return " ".join(sentences)

    def to_dict(self) -> dict:
        """The report as JSON (the HTTP API's answer, and what a run folder keeps)."""
        return {"verdict": self.verdict, "no_spread": self.share("no spread"), "all_fail": self.share("all fail"),
                "all_pass": self.share("all pass"), "capped": self.capped_share,
                "longest_tokens": self.longest_tokens, "token_limit": self.token_limit,
                "group_size": self.group_size, "max_new_tokens": self.max_new_tokens,
                "sampling_s": round(self.sampling_s, 2), "step_s": None if self.step_s is None else round(self.step_s, 2),
                "ended_early": self.ended_early,
                "rewards": [asdict(reward) for reward in self.rewards],
                "prompts": [{"number": check.number, "prompt": check.prompt, "reference": check.reference,
                             "pass_rate": check.pass_rate, "kind": check.kind, "totals": check.totals,
                             "capped": check.capped, "longest_tokens": check.longest_tokens}
                            for check in self.ranked()],
                "fixes": [asdict(fix) for fix in self.fixes],
                "red_team": None if self.red_team is None else self.red_team.to_dict(),
                "goal": None if self.goal is None else self.goal.to_dict()}

    def ranked(self) -> list[PromptCheck]:
        """The prompts from the hardest (lowest pass rate) to the easiest."""
        return sorted(self.prompts, key=lambda check: (check.pass_rate, check.number))

    @property
    def learns(self) -> bool:
        """Whether enough groups have a spread for most of every step to teach something."""
        return self.share("no spread") < NO_SPREAD_TOO_MUCH

    @property
    def untaught_goal(self) -> GoalCheck | None:
        """The goal's check where too few groups differ in it for training to learn it (GoalCheck.teaches); None
        where training would learn it, or no reward is the goal."""
        return None if self.goal is None or self.goal.teaches else self.goal

    @property
    def good(self) -> bool:
        """The verdict's colour: it learns, and what it learns is the goal."""
        return self.learns and self.untaught_goal is None

    def facts(self) -> list[str]:
        """The numbers behind the verdict, a sentence each (the app shows them as a list, the command line as
        lines)."""
        allowed = "" if self.token_limit is None else f" of the {self.token_limit} a run allows"
        step = "" if self.step_s is None else f"; predicted time per training step: {format_seconds(self.step_s)}"
        rewards = "; ".join(f"{reward.name} {_number(reward.mean)}, {_number(reward.spread)}, "
                            f"{round(100 * reward.failed)} %" for reward in self.rewards)
        goal = self.goal
        spread = [] if goal is None else [
            f"Goal: {', '.join(goal.names)}, passed by {goal.passed} of {goal.replies} replies; it separates the "
            f"replies in {round(100 * goal.spread)} % of the {goal.spread_groups} groups with a spread, and in "
            f"{goal.wrong_wins} of them no reply passes it (there the other rewards pick the winner). The spread by "
            "reward (its share of the groups' spread; the groups only it separates): " + "; ".join(
                f"{share.name} {round(100 * share.advantage)} % ({round(100 * share.alone)} %)"
                for share in goal.shares) + "."]
        return [*spread, f"Groups: {round(100 * self.share('spread'))} % with a spread, {round(100 * self.share('all fail'))} % "
                f"all fail, {round(100 * self.share('all pass'))} % all pass ({len(self.prompts)} prompts, "
                f"{self.group_size} replies each).",
                f"Length: {round(100 * self.capped_share)} % of replies cut off at {self.max_new_tokens} tokens; the "
                f"longest prompt and reply take {self.longest_tokens} tokens{allowed}.",
                f"Time: sampled in {format_seconds(self.sampling_s)}{step}.",
                f"Rewards (mean, spread, failed): {rewards}."]

    def describe(self) -> str:
        """The report as plain text lines (the command line's)."""
        lines = [self.verdict, "", *self.facts(), "Prompts, hardest first (row: pass rate):"]
        lines += [f"  row {check.number}: {round(100 * check.pass_rate)} % ({check.kind}) {_one_line(check.prompt)}"
                  for check in self.ranked()]
        if self.goal is not None and self.goal.winners:
            lines.append("Groups with no right reply, and the wrong reply that wins each:")
            lines += [f"  row {winner.number}: “{_one_line(winner.reply)}” {winner.advantage:+.2f} from {winner.by} "
                      f"(reference {winner.reference})" for winner in self.goal.winners]
        lines += [f"Fix: {fix.label}. {fix.why} ({fix.as_command_line()})" for fix in self.fixes]
        if self.red_team is not None:
            lines.append("Red team: " + self.red_team.describe())
        return "\n".join(lines)


def _number(value: float | None) -> str:
    return "–" if value is None else f"{value:.3g}"


def _one_line(text: str, chars: int = 70) -> str:
    text = " ".join(text.split())
    return text if len(text) <= chars else text[:chars - 1] + "…"


def pass_mark(rewards: list[Reward]) -> float:
    """The weighted total a reply must reach to pass: half the full marks of the rewards trained on (0 where only
    penalties are, so that a reply passes when nothing took a point away)."""
    full = sum(reward.weight * full_marks(reward.spec) for reward in rewards)
    return full / 2


def prompts_for_a_minute(config: RunConfig, generation_s_per_step: float | None, available: int) -> int:
    """How many prompts a pre-flight samples by default: about PREFLIGHT_S of sampling by the estimate's generation
    time, at least MIN_PROMPTS, at most MOST_PROMPTS and the training prompts there are, in whole steps."""
    batch = config.training.batch_size
    wanted = MIN_PROMPTS
    if generation_s_per_step:
        wanted = max(MIN_PROMPTS, round(PREFLIGHT_S / generation_s_per_step * batch))
    wanted = min(wanted, MOST_PROMPTS, available)
    return max(1, min(available, math.ceil(wanted / batch) * batch))


def preflight(config: RunConfig, load: LoadModel, *, policy: Policy, prompts: int | None = None,
              should_stop: Callable[[], bool] | None = None, on_progress: Callable[[int, int], None] | None = None,
              inspection: Inspection | None = None) -> Preflight:
    """The pre-flight of ``config``: every check Start makes (training.inspect), then ``prompts`` of its training
    prompts (by default about a minute's worth, by the estimate), drawn with its seed, sampled and scored with the
    model ``load`` gives (a ModelCache.load, or the app's). A public demo's playground time limit bounds it.
    ``inspection``: what training.inspect found already for this config, if the caller has it."""
    from .estimate import estimate_run
    from .hardware import detect_hardware

    inspection = inspection or inspect(config, policy=policy)
    train = inspection.mapped.train
    generation_s: float | None
    training_pass_s: float | None
    try:
        estimate = estimate_run(config, inspection.hardware, detect_hardware(),
                                prompt_tokens=max(1, round(inspection.prompts.mean)))
        generation_s, training_pass_s = estimate.step.generation_s, estimate.step.training_s + estimate.step.reference_s
    except DragonError:  # a model of unknown size: a default sample, and no predicted step time
        generation_s = training_pass_s = None
    count = min(prompts, len(train)) if prompts else prompts_for_a_minute(config, generation_s, len(train))
    chosen = random.Random(config.training.seed).sample(train, count)
    model, tokenizer = load(config.model, settings=config.hardware)
    if inspection.tools is not None:
        tokenizer = ready_for_tools(tokenizer, config.model.id)
    rewards = build_rewards(config.rewards, base_dir=config.base_dir or None, tokenizer=tokenizer,
                            max_new_tokens=config.grpo.max_new_tokens,
                            classifiers=classifiers_on(inspection.hardware.device), policy=policy)
    fit = inspection.prompts
    token_limit = None if fit.limit >= NO_LIMIT else fit.limit + config.grpo.max_new_tokens
    report = sample_preflight(config, model, tokenizer, chosen, rewards, token_limit, training_pass_s, should_stop,
                              policy.limits.sampling_seconds if policy.limits else None, on_progress, len(train),
                              inspection.tools, policy=policy)
    limit = policy.limits.scoring_seconds if policy.limits else None
    try:
        no_right = report.goal.wrong_wins / len(report.prompts) if report.goal and report.prompts else None
        gamed = red_team(rewards, chosen, config.grpo.max_new_tokens, tokenizer, should_stop, limit, no_right)
    except Stopped:
        if should_stop is not None and should_stop():
            raise
        return dataclasses.replace(report, ended_early=" ".join(filter(None, [
            report.ended_early, f"The red team stopped at this public demo's limit of {limit:g} seconds of scoring."])))
    return dataclasses.replace(report, red_team=gamed)


def sample_preflight(config: RunConfig, model, tokenizer, examples: list[dict], rewards: list[Reward],
                     token_limit: int | None, training_pass_s: float | None = None,
                     should_stop: Callable[[], bool] | None = None, time_limit_s: float | None = None,
                     on_progress: Callable[[int, int], None] | None = None, training_prompts: int = 0,
                     tools: ToolUse | None = None, *, policy: Policy) -> Preflight:
    """Sample ``config.grpo.group_size`` replies to each of ``examples`` as a training step samples them (a step's
    batch of prompts at a time, the run's temperature and sampling settings, calling its ``tools``), score them,
    and report.

    ``should_stop`` (Cancel) raises Stopped. At ``time_limit_s`` sampling ends, and the report covers the prompts
    sampled by then (at least one step's). ``on_progress(done, total)`` is told after each step's batch.
    ``training_pass_s``: the estimate's forward and backward of a step, added to the measured sampling for the
    predicted step time. ``training_prompts``: how many the run trains on, ``examples`` among them. ``policy``
    builds the goal's alternatives (engine.goal) that are scored on the replies."""
    grpo, batch = config.grpo, config.training.batch_size
    mark = pass_mark(rewards)
    prompt_tokens = token_counts(examples, tokenizer, tools.every_function if tools else None)
    deadline = None if time_limit_s is None else time.monotonic() + time_limit_s
    checks: list[PromptCheck] = []
    sampled: list[SampledGroup] = []
    scores: dict[str, list[float]] = {reward.name: [] for reward in rewards}
    failed: dict[str, int] = dict.fromkeys(scores, 0)
    batch_seconds: list[float] = []
    ended_early = ""
    started = time.monotonic()
    for start in range(0, len(examples), batch):
        if deadline is not None and time.monotonic() > deadline and checks:
            ended_early = (f"Sampling stopped at the time limit of {time_limit_s:g} seconds, after {len(checks)} "
                           f"of {len(examples)} prompts.")
            break
        chosen = examples[start:start + batch]
        began = time.monotonic()
        episodes = played(tools, [example for example in chosen for _ in range(grpo.group_size)])
        replies = sampled_replies(model, tokenizer, episodes, grpo, tools, should_stop)
        batch_seconds.append(time.monotonic() - began)
        lengths = [len(ids) for ids in tokenizer(replies, add_special_tokens=False)["input_ids"]]
        for offset, example in enumerate(chosen):
            group = slice(offset * grpo.group_size, (offset + 1) * grpo.group_size)
            group_replies, group_lengths = replies[group], lengths[group]
            results = score_examples(rewards, episodes[group], group_replies, should_stop)
            sampled.append(SampledGroup(example.get("number") or start + offset + 1,
                                        excerpt(prompt_text(example), PROMPT_CHARS) or "",
                                        excerpt(example.get("reference") or "", PROMPT_CHARS) or "",
                                        episodes[group], group_replies, results,
                                        [length >= grpo.max_new_tokens for length in group_lengths]))
            for result in results:
                for name, score in result.scores.items():
                    scores[name].append(score)
                    failed[name] += name in result.errors
            totals = [finite_number(result.total) for result in results]
            checks.append(PromptCheck(
                number=example.get("number") or start + offset + 1,
                prompt=excerpt(prompt_text(example), PROMPT_CHARS) or "",
                reference=excerpt(example.get("reference") or "", PROMPT_CHARS) or "",
                totals=totals, passed=sum(total is not None and total >= mark - 1e-9 for total in totals),
                capped=sum(length >= grpo.max_new_tokens for length in group_lengths),
                longest_tokens=prompt_tokens[start + offset] + max(group_lengths, default=0)))
        if on_progress is not None:
            on_progress(len(checks), len(examples))
    sampling_s = time.monotonic() - started
    step_sampling = statistics.median(batch_seconds[1:] or batch_seconds)  # the first batch warms the model up
    rewards_found = [RewardCheck(reward.name, statistics.fmean(scores[reward.name]) if scores[reward.name] else None,
                                 statistics.pstdev(scores[reward.name]) if scores[reward.name] else None,
                                 failed[reward.name] / len(scores[reward.name]) if scores[reward.name] else 0.0,
                                 not reward.metric)
                     for reward in rewards]
    report = Preflight(checks, rewards_found, grpo.group_size, grpo.max_new_tokens, token_limit, sampling_s,
                       None if training_pass_s is None else step_sampling + training_pass_s, ended_early,
                       training_prompts=training_prompts,
                       goal=check_goal(rewards, sampled, grpo.scale_rewards, grpo.multi_objective_aggregation))
    goal = report.untaught_goal
    if report.learns and goal is not None:
        def resample(system: str) -> tuple[list[dict], list[str]]:
            """The first step's prompts, sampled again with ``system`` as their system message."""
            asked = [{**example, "prompt": [{"role": "system", "content": system},
                                            *[m for m in example["prompt"] if m.get("role") != "system"]]}
                     for example in examples[:batch] for _ in range(grpo.group_size)]
            return asked, sampled_replies(model, tokenizer, asked, grpo, None, should_stop)

        in_time = deadline is None or time.monotonic() < deadline
        found = alternatives(goal, rewards, sampled, config.rewards,
                             lambda some, asked, replies: score_examples(some, asked, replies, should_stop),
                             resample if tools is None and in_time else None, bool(config.data.system),
                             report.capped_share if report.capped_share >= CAPPED_TOO_MANY else None,
                             grpo.max_new_tokens, _larger_model(config.model.id), policy=policy)
        report = dataclasses.replace(report, goal=dataclasses.replace(goal, alternatives=found))
    return dataclasses.replace(report, fixes=fixes_for(report, config))


def _larger_model(model_id: str) -> str | None:
    """The next preset up from ``model_id`` that needs no licence to be accepted; None past the largest, or for a
    model that is not a preset."""
    preset = find_preset(model_id)
    larger = sorted((other for other in PRESETS if preset and other.params > preset.params and not other.gated),
                    key=lambda other: other.params)
    return larger[0].id if larger else None


TEMPERATURE_STEP = 0.3
WARMEST = 1.5  # past this, small models' replies turn to noise
PARTIAL_CREDIT_WEIGHT = 0.5
# The difficulty filter's range that the "drop" fix sets: a pass rate of 0 (every reply failed) or 1 (every reply
# passed) is outside it, as DAPO's dynamic sampling drops such groups; any other share of a group is inside.
KEEP_PASS_RATES = (0.01, 0.99)


def fixes_for(report: Preflight, config: RunConfig) -> list[Fix]:
    """The one-click fixes for what the report found: for groups without spread, a higher temperature (more varied
    replies); for prompts that all fail, partial credit for a reply close to the reference (a number within 5 %, or
    one that contains it); and, learning or not, dropping the prompts where every reply failed or every reply passed
    (data.pass_rates), when some training prompt would stay."""
    dropping = [] if (drop := _drop_fix(report)) is None else [drop]
    fixes = []
    goal = report.untaught_goal
    if report.learns and goal is not None:
        return [Fix(alternative.label, alternative.effect, **alternative.fix)
                for alternative in sorted(goal.alternatives, key=_recommended_first)] + dropping
    if report.learns:
        return dropping
    temperature = config.grpo.temperature
    if temperature < WARMEST:
        warmer = round(min(WARMEST, temperature + TEMPERATURE_STEP), 2)
        fixes.append(Fix(f"Raise the temperature to {warmer:g}",
                         f"More varied replies give more groups a spread (it is {temperature:g}).",
                         settings={"grpo": {"temperature": warmer}}))
    references = [check.reference for check in report.prompts if check.reference]
    if report.share("all fail") >= report.share("all pass") and references:
        numeric = all(as_number(reference) is not None for reference in references)
        extra = ({"kind": "numeric", "name": "close_number", "extract": "last_number", "tolerance": 0.05,
                  "weight": PARTIAL_CREDIT_WEIGHT} if numeric else
                 {"kind": "contains", "name": "mentions_answer", "weight": PARTIAL_CREDIT_WEIGHT})
        if extra["name"] not in {spec.name for spec in config.rewards}:
            what = "a number within 5 % of the reference" if numeric else "a reply that contains the reference"
            fixes.append(Fix(f"Add partial credit ({extra['name']})",
                             f"Pays {PARTIAL_CREDIT_WEIGHT:g} for {what}, so nearly right replies stand out.",
                             add_rewards=[extra]))
    return fixes + dropping


def _recommended_first(alternative) -> tuple:
    """Measured before not measured, then what makes most replies pass the goal (ties keep goal.alternatives'
    order, which puts the gated goal first)."""
    return not alternative.measured, -round(alternative.pays or 0.0, 2)


def _drop_fix(report: Preflight) -> Fix | None:
    """Leaving out, by their pass rate, the prompts whose groups had no spread; None where that would leave out a
    group with a spread too (partial credit can separate replies that all fail), or every training prompt."""
    rates = {str(check.number): round(check.pass_rate, 4) for check in report.prompts}
    low, high = KEEP_PASS_RATES
    kept = DataConfig(min_pass_rate=low, max_pass_rate=high)
    left_out = [check for check in report.prompts if not kept.keeps_rate(rates[str(check.number)])]
    failing = sum(rates[str(check.number)] < low for check in left_out)
    unsampled = max(0, report.training_prompts - len(rates))
    if not left_out or len(left_out) == len(rates) + unsampled or any(check.kind == "spread" for check in left_out):
        return None
    return Fix(f"Drop the prompts that all fail or all pass ({len(left_out)})",
               f"Of the {len(rates)} prompts sampled, every reply failed on {failing} and passed on "
               f"{len(left_out) - failing}: "
               "training on them teaches nothing. The difficulty filter leaves them out of training by their row"
               + (f"; the {unsampled} training rows not sampled stay." if unsampled else "."),
               settings={"data": {"pass_rates": rates, "min_pass_rate": low, "max_pass_rate": high}})
