"""Does the spread teach the goal? GRPO reinforces whatever makes a group's replies differ. The pre-flight's sampled
groups say which reward that is: each reward's share of the groups' spread, the groups it alone separates, and,
where no reply is right, the reply that the other rewards make the winner. When the goal (rewards.goal_names: the
rewards that say the answer is right) pays nothing, or separates few groups, training will teach something else.

The alternatives are measured before they are offered: each is scored on the replies already sampled (another kind
or extraction for the goal, the shaping rewards paid only when the goal passes), or on a few more sampled with the
change (a system message asking for the answer alone); what cannot be measured here (a larger model) says so.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..grpo_math import advantages, finite_number, has_spread
from ..public import Policy
from ..rewards import EXTRACT_MODES, Reward, ScoreResult, build_rewards, goal_names, parse_rewards, right_by_goal
from ..rewards.spec import (GOAL_KINDS, PENALTY_KINDS, ContainsReward, ExactReward, MathReward, NumericReward, RewardSpec,
                            gate_of, passes)
from ..runstore import excerpt

GOAL_SEPARATES = 0.1  # below this share of the spread groups differing in the goal, training teaches other things
NEEDS_GOAL = 0.5  # below this share of replies passing the goal, a larger model is worth offering
MOST_ROOM = 1024  # the new tokens the "more room" alternative offers at most; a longer cap is a choice to make by hand
REPLY_CHARS = 160  # what a report keeps of a winning reply
MOST_WINNERS = 5
# The system message the "answer alone" alternative adds to every prompt.
ANSWER_ALONE = "Reply with the answer alone: no sentence, no explanation."


@dataclass(frozen=True)
class SampledGroup:
    """One prompt's sampled replies with their scores, as the pre-flight scored them."""

    number: int
    prompt: str
    reference: str
    examples: list[dict]  # the mapped row each reply answers (the same row, or its played episodes)
    replies: list[str]
    results: list[ScoreResult]
    capped: list[bool]  # replies cut off at max new tokens


@dataclass(frozen=True)
class RewardShare:
    """Where one reward stands in the groups' spread."""

    name: str
    advantage: float  # its share of the spread of the groups' totals (the shares add up to 1)
    alone: float  # the share of spread groups in which no other reward separates the replies
    passed: float  # the share of replies it passes (half its full marks or more)


@dataclass(frozen=True)
class Winner:
    """A group in which no reply is right, and the reply its advantage puts first all the same."""

    number: int
    prompt: str
    reference: str
    reply: str
    advantage: float
    by: str  # the reward that lifts it above the group's mean the most
    wrong_everywhere: bool = False  # no reward that checks the answer passes it (not even a looser one)


@dataclass(frozen=True)
class Alternative:
    """A change that would let training teach the goal, with what it was measured to do (``effect``), or why it
    was not (``measured`` False). ``fix``: the settings it changes, for a one-click fix."""

    label: str
    effect: str
    measured: bool
    fix: dict = field(default_factory=dict)  # engine.preflight.Fix's fields
    pays: float | None = None  # the share of sampled replies its goal passes
    keeps_goal: bool = False  # whether its goal is still the goal the user chose (read another way, or asked for)


@dataclass(frozen=True)
class GoalCheck:
    """The goal's rewards over the pre-flight's groups."""

    names: list[str]
    passed: int  # replies that pass every goal reward
    replies: int
    spread: float  # the share of groups with a spread whose goal scores differ too (the goal separates them)
    spread_groups: int
    shares: list[RewardShare]
    winners: list[Winner]  # up to MOST_WINNERS groups a wrong reply wins, those a shaping reward picked first
    wrong_wins: int  # groups that no reply is right in and that have a spread all the same
    checks_answer: list[str] = field(default_factory=list)  # the rewards of GOAL_KINDS, goal or not
    alternatives: list[Alternative] = field(default_factory=list)

    @property
    def pays(self) -> float:
        return self.passed / self.replies if self.replies else 0.0

    @property
    def teaches(self) -> bool:
        """Whether enough of the groups training learns from differ in the goal for it to learn the goal too: a
        right reply among wrong ones earns the group's largest advantage. Measured: the arithmetic recipe learns
        its sums (docs/performance.md) with the goal separating a quarter of the groups; the right-not-short
        lesson's goal, separating none, is never learned."""
        return not self.spread_groups or self.spread >= GOAL_SEPARATES

    @property
    def spread_from(self) -> list[str]:
        """The rewards other than the goal that make a share of the spread, largest first."""
        others = [share for share in self.shares if share.name not in self.names and share.advantage >= 0.05]
        return [share.name for share in sorted(others, key=lambda share: -share.advantage)]

    def sentences(self) -> list[str]:
        """What the verdict says of the goal, where it does not teach; [] where it does."""
        if self.teaches:
            return []
        goal = _listed(self.names)
        others = _listed(self.spread_from) or "other rewards"
        paying = [f"`{share.name}` passes {round(100 * share.passed)} %" for share in self.shares
                  if share.name in self.checks_answer and share.name not in self.names and share.passed > 0]
        besides = f", while {', '.join(paying)}" if paying else ""
        if self.passed == 0:
            said = [f"Your goal, {goal}, never pays: 0 of {self.replies} sampled replies pass it{besides}."]
        else:
            said = [f"Your goal, {goal}, passes only {self.passed} of {self.replies} sampled replies{besides}, and "
                    f"separates the replies in {round(100 * self.spread)} % of the groups that have a spread."]
        said.append(f"The groups differ by {others}, so training will mostly make what {others} pay for more "
                    f"common, not what {goal} checks.")
        if self.winners:
            best = self.winners[0]
            said.append(f"In {self.wrong_wins} group{'s' if self.wrong_wins != 1 else ''} no reply passes {goal}, and "
                        f"the other rewards pick a winner all the same: for row {best.number}, “{_short(best.reply)}” "
                        f"(reference {best.reference}) gets {best.advantage:+.2f}, most of it from `{best.by}`.")
        if self.passed == 0 and not any(alternative.keeps_goal and alternative.pays for alternative in
                                        self.alternatives):
            said.append(f"No change measured here makes {goal} pay for this model: choose a goal it can reach, or "
                        "a larger model.")
        return said

    def to_dict(self) -> dict:
        return {"names": self.names, "passed": self.passed, "replies": self.replies, "spread": self.spread,
                "teaches": self.teaches, "spread_from": self.spread_from,
                "shares": [vars(share) for share in self.shares], "winners": [vars(w) for w in self.winners],
                "wrong_wins": self.wrong_wins,
                "alternatives": [{"label": a.label, "effect": a.effect, "measured": a.measured, "pays": a.pays}
                                 for a in self.alternatives]}


def _listed(names: list[str]) -> str:
    quoted = [f"`{name}`" for name in names]
    return quoted[0] if len(quoted) == 1 else ", ".join(quoted[:-1]) + " and " + quoted[-1] if quoted else ""


def _short(text: str, chars: int = 60) -> str:
    text = " ".join(text.split())
    return text if len(text) <= chars else text[:chars - 1] + "…"


def right(result: ScoreResult, goal: list[Reward]) -> bool:
    return right_by_goal(result.scores, [reward.spec for reward in goal])


def check_goal(rewards: list[Reward], groups: list[SampledGroup], scale_rewards: str = "group",
               aggregation: str = "sum_then_normalize") -> GoalCheck | None:
    """The goal's place in the groups' spread; None where no reward says the answer is right."""
    names = goal_names([reward.spec for reward in rewards])
    if not names or not groups:
        return None
    goal = [reward for reward in rewards if reward.name in names]
    weights = {reward.name: reward.weight for reward in rewards}
    trained = [reward for reward in rewards if reward.weight > 0]
    spread_groups, goal_spread = 0, 0
    winners: list[Winner] = []
    wrong_wins = 0
    checks_answer = [reward.name for reward in rewards if reward.spec.kind in GOAL_KINDS]
    for group in groups:
        totals = [result.total for result in group.results]
        if not has_spread(totals):
            continue
        spread_groups += 1
        goal_spread += has_spread([sum(result.scores[reward.name] for reward in goal) for result in group.results])
        if not any(right(result, goal) for result in group.results):
            wrong_wins += 1
            winners.append(_winner(group, trained, weights, scale_rewards, aggregation,
                                   [reward for reward in rewards if reward.name in checks_answer]))
    replies = [result for group in groups for result in group.results]
    by_reward = spread_by_reward([[result.scores for result in group.results] for group in groups],
                                 {reward.name: reward.weight for reward in trained})
    shares = [RewardShare(reward.name, *by_reward.get(reward.name, (0.0, 0.0)),
                          sum(passes(result.scores[reward.name], reward.spec) for result in replies) / len(replies))
              for reward in rewards]
    winners.sort(key=lambda winner: (not winner.wrong_everywhere, winner.by in checks_answer, -winner.advantage))
    return GoalCheck(names, sum(right(result, goal) for result in replies), len(replies),
                     goal_spread / spread_groups if spread_groups else 0.0, spread_groups, shares,
                     winners[:MOST_WINNERS], wrong_wins, checks_answer)


def spread_by_reward(groups: Sequence[Sequence[Mapping[str, float | None]]],
                     weights: Mapping[str, float]) -> dict[str, tuple[float, float]]:
    """Each reward of ``weights`` (those trained on) over the groups (each its replies' scores) whose weighted
    totals have a spread: (its share of the spread, the share of those groups only it separates). A group's share
    is Σ w·(s − mean s)·(t − mean t) over Σ (t − mean t)², t the weighted total: the shares add up to 1 (a reward
    that pulls against the total has a negative one), averaged over the groups. {} when no group has a spread."""
    shares = dict.fromkeys(weights, 0.0)
    alone = dict.fromkeys(weights, 0)
    counted = 0
    for group in groups:
        scores = [{name: score for name in weights if (score := finite_number(replies.get(name))) is not None}
                  for replies in group]
        scores = [reply for reply in scores if len(reply) == len(weights)]  # a reward that did not score: left out
        totals = [sum(weights[name] * reply[name] for name in weights) for reply in scores]
        if not has_spread(totals):
            continue
        counted += 1
        mean_total = statistics.fmean(totals)
        variance = sum((total - mean_total) ** 2 for total in totals)
        separating = [name for name in weights if has_spread([reply[name] for reply in scores])]
        if len(separating) == 1:
            alone[separating[0]] += 1
        for name, weight in weights.items():
            mean = statistics.fmean(reply[name] for reply in scores)
            shares[name] += sum(weight * (reply[name] - mean) * (total - mean_total)
                                for reply, total in zip(scores, totals, strict=True)) / variance
    return {name: (shares[name] / counted, alone[name] / counted) for name in weights} if counted else {}


def _winner(group: SampledGroup, trained: list[Reward], weights: dict, scale_rewards: str, aggregation: str,
            checking: list[Reward]) -> Winner:
    """The reply the group's advantages put first, and the reward that lifts it most; ``checking``: the rewards
    that check the answer, which say whether it is wrong by every measure."""
    scores = [result.scores for result in group.results]
    values = advantages([scores], weights, scale_rewards, aggregation).values[0]
    best = max(range(len(values)), key=lambda index: values[index])
    lift = {reward.name: reward.weight * (scores[best][reward.name]
                                          - statistics.fmean(s[reward.name] for s in scores)) for reward in trained}
    return Winner(group.number, group.prompt, group.reference, excerpt(group.replies[best], REPLY_CHARS) or "",
                  round(values[best], 2), max(lift, key=lambda name: lift[name]),
                  not any(passes(scores[best][reward.name], reward.spec) for reward in checking))


# ------------------------------------------------------------------------------------------------------------------
# The alternatives, measured on the sampled replies


def alternatives(check: GoalCheck, rewards: list[Reward], groups: list[SampledGroup], specs: list[RewardSpec],
                 score: Callable[[list[Reward], list[dict], list[str]], list[ScoreResult]],
                 resample: Callable[[str], tuple[list[dict], list[str]]] | None, data_has_system: bool,
                 cut_off: float | None, max_new_tokens: int, larger_model: str | None,
                 *, policy: Policy) -> list[Alternative]:
    """What could make training teach the goal, each measured where it can be: ``score(rewards, examples,
    replies)`` scores replies (the pre-flight's score_examples); ``resample(system)`` samples some prompts again with
    that system message (None: no time for it). ``cut_off``: the share of replies cut off at ``max_new_tokens``,
    where the pre-flight found it too many (else None). ``larger_model``: the next preset up, if any."""
    goal = [reward for reward in rewards if reward.name in check.names]
    examples = [example for group in groups for example in group.examples]
    replies = [reply for group in groups for reply in group.replies]
    found: list[Alternative] = []
    best: tuple[float, Swap, list[float]] | None = None  # the swap of goal that pays most, and its scores
    for swap in (swap for reward in goal for swap in goal_swaps(reward.spec, specs, policy=policy)):
        scores = [result.scores[swap.goal.name]
                  for result in score(build_rewards([swap.goal], policy=policy), examples, replies)]
        share = sum(passes(value, swap.goal) for value in scores) / len(scores)
        if share <= check.pays:
            continue
        found.append(Alternative(swap.label, f"`{swap.goal.name}` would pass {round(100 * share)} % of the sampled "
                                 f"replies, where {_listed(check.names)} passes {round(100 * check.pays)} %.", True,
                                 swap.fix, share, swap.keeps_goal))
        if best is None or share > best[0]:
            best = share, swap, scores
    gated = _gated(check, rewards, groups, best)
    if gated is not None:
        found.insert(0, gated)
    if resample is not None and not data_has_system:
        asked, answered = resample(ANSWER_ALONE)
        results = score(goal, asked, answered)
        share = sum(right(result, goal) for result in results) / len(results) if results else 0.0
        found.append(Alternative(
            "Ask for the answer alone (a system message)",
            f"With the system message “{ANSWER_ALONE}”, {round(100 * share)} % of {len(results)} replies sampled "
            f"again pass {_listed(check.names)} ({round(100 * check.pays)} % without).", True,
            {"settings": {"data": {"system": ANSWER_ALONE}}}, share, keeps_goal=True))
    if cut_off is not None and max_new_tokens < MOST_ROOM:
        more = min(MOST_ROOM, max_new_tokens * 2)
        flags = [(capped, right(result, goal)) for group in groups
                 for result, capped in zip(group.results, group.capped, strict=True)]
        found.append(Alternative(
            f"Give replies room: {more} new tokens",
            f"{round(100 * cut_off)} % of replies were cut off at {max_new_tokens} tokens; the goal passed on "
            f"{_percent([ok for capped, ok in flags if capped])} of those and "
            f"{_percent([ok for capped, ok in flags if not capped])} of the whole ones.", True,
            {"settings": {"grpo": {"max_new_tokens": more}}}))
    if larger_model and check.pays < NEEDS_GOAL:
        found.append(Alternative(
            f"Try a larger model ({larger_model.split('/')[-1]})",
            "Not measured: the pre-flight samples only the model it has. A larger model follows an answer format "
            "more often, and each step takes longer.", False, {"settings": {"model": {"id": larger_model}}}))
    return found



def _percent(flags: list[bool]) -> str:
    return f"{round(100 * sum(flags) / len(flags))} %" if flags else "none"


@dataclass(frozen=True)
class Swap:
    """Another goal in a goal reward's place: ``goal`` the reward that would say the answer is right, ``fix`` the
    change (Fix's fields), ``keeps_goal`` whether it is still the same reward (read another way)."""

    label: str
    goal: RewardSpec
    fix: dict
    keeps_goal: bool
    weights: dict[str, float]  # the training weights the change sets


def goal_swaps(spec: RewardSpec, specs: list[RewardSpec], *, policy: Policy) -> list[Swap]:
    """For a goal reward that compares the answer: another extraction of it, or, for `exact`, `contains` as the
    goal (the list's own `contains`, or a new one) with `exact` kept as a metric."""
    swaps = []
    if isinstance(spec, (ExactReward, NumericReward, MathReward)):
        for mode in EXTRACT_MODES:
            if mode in ("whole", spec.extract) or (isinstance(spec, ExactReward) and mode == "last_number"):
                continue
            candidate = parse_rewards([{**_settings(spec), "extract": mode}], policy=policy)[0]
            swaps.append(Swap(f"Read `{spec.name}`'s answer from {mode.replace('_', ' ')}", candidate,
                              {"change_rewards": {spec.name: {"extract": mode}}}, True, {}))
    if isinstance(spec, ExactReward):
        existing = next((other for other in specs if isinstance(other, ContainsReward) and other.extract == spec.extract
                         and other.case_sensitive == spec.case_sensitive and gate_of(other) is None), None)
        name = existing.name if existing else "answer_in_reply"
        if existing is None and name in {other.name for other in specs}:
            return swaps
        weight = max(spec.weight, existing.weight if existing else 0.0)
        candidate = parse_rewards([{"kind": "contains", "name": name, "extract": spec.extract,
                                    "case_sensitive": spec.case_sensitive}], policy=policy)[0]
        change: dict[str, dict[str, Any]] = {spec.name: {"goal": False, "train": False}}
        if existing is not None:
            change[name] = {"goal": True, "weight": weight}
        added = [] if existing else [{"kind": "contains", "name": name, "goal": True, "weight": weight,
                                      **({"extract": spec.extract} if spec.extract != "whole" else {})}]
        swaps.append(Swap(f"Make `{name}` the goal, keep `{spec.name}` as a metric", candidate,
                          {"change_rewards": change, "add_rewards": added}, False, {spec.name: 0.0, name: weight}))
    return swaps


def _settings(spec: RewardSpec) -> dict:
    return {key: value for key, value in spec.to_dict().items() if key not in ("only_when", "goal", "train")}


def _gated(check: GoalCheck, rewards: list[Reward], groups: list[SampledGroup],
           best: tuple[float, Swap, list[float]] | None) -> Alternative | None:
    """The shaping rewards paid only when the goal passes: the swap that pays most (``best``: it pays more than
    the goal, or it would not be there), made with it, else the goal as it is, where it pays at all. Measured: the
    groups a wrong reply wins, and those with a spread."""
    if len(check.names) != 1:
        return None
    swap = None if best is None else best[1]
    if check.passed == 0 and swap is None:
        return None
    gate = swap.goal if swap else next(reward.spec for reward in rewards if reward.name == check.names[0])
    shaping = {reward.name for reward in rewards if reward.weight > 0 and reward.name not in (gate.name, *check.names)
               and reward.spec.kind not in GOAL_KINDS + PENALTY_KINDS and gate_of(reward.spec) is None}
    if not shaping:
        return None
    weights = {reward.name: reward.weight for reward in rewards} | (swap.weights if swap else {})
    gate_scores = iter(best[2] if best is not None else [])
    wrong_wins = spread = 0
    for group in groups:
        totals, opened = [], []
        for result in group.results:
            scores = dict(result.scores)
            if swap:
                scores[gate.name] = next(gate_scores)
            opened.append(passes(scores[gate.name], gate))
            totals.append(sum(weights.get(name, 0.0) * (0.0 if name in shaping and not opened[-1] else value)
                              for name, value in scores.items()))
        spread += has_spread(totals)
        wrong_wins += has_spread(totals) and not any(opened)
    fix = {"change_rewards": {name: {"only_when": gate.name} for name in sorted(shaping)}}
    label = f"Pay {_listed(sorted(shaping))} only when `{gate.name}` passes"
    if swap:
        fix = {"change_rewards": swap.fix["change_rewards"] | fix["change_rewards"],
               "add_rewards": swap.fix.get("add_rewards", [])}
        label = (swap.label if swap.keeps_goal else f"Make `{gate.name}` the goal") + \
            f"; pay {_listed(sorted(shaping))} only when it passes"
    return Alternative(label, f"Groups that a wrong reply wins: {check.wrong_wins} → {wrong_wins} of {len(groups)}; "
                       f"groups with a spread: {check.spread_groups} → {spread}.", True, fix,
                       best[0] if best is not None else check.pays)
