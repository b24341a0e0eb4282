"""What one training step did with one group of completions, worked out from the run folder and said in words.

GRPO's whole update for a prompt is in a few numbers: each completion's weighted reward, the group's mean and spread,
the advantage that follows, and the KL pull toward the starting model. :func:`explain_group` recomputes the
advantages from the scores the run wrote, the way TRL 1.16's ``GRPOTrainer._generate_and_score_completions`` does for
the run's ``scale_rewards`` and ``multi_objective_aggregation``, and checks them against the advantages TRL itself
logged for the step, so the panel teaches what really happened rather than a textbook version of it.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..config import GRPOSettings
from ..engine.goal import spread_by_reward
from ..errors import DragonError
from ..grpo_math import STD_EPSILON, advantages, finite_number, has_spread, known, sample_std, weighted_total
from ..rewards import gate_of, goal_names, training_weight
from ..runstore import RunDir, read_json

AGREE = 1e-3  # our advantage and TRL's, equal up to float32 arithmetic and the 6 decimals the run keeps
DEFAULTS = GRPOSettings()  # what a stored config's missing setting meant: the run trained with the default

# How each loss type turns a completion's advantage into its share of the update (TRL 1.16's compute_loss), in words
# and as the formula: loss types that average the same way share a sentence.
_EQUAL_COMPLETIONS = ("each completion's tokens are averaged first, so every completion counts the same whatever its "
                      "length", "loss = mean over completions i of ( mean over tokens t of ℓ(i, t) )")
_EQUAL_TOKENS = ("every token of the step counts the same, so a long completion moves the model more than a short one",
                 "loss = (sum over all tokens of ℓ) / (number of tokens in the step)")
_AVERAGING = {
    "grpo": _EQUAL_COMPLETIONS, "sapo": _EQUAL_COMPLETIONS,
    "dapo": _EQUAL_TOKENS, "cispo": _EQUAL_TOKENS, "vespo": _EQUAL_TOKENS,
    "bnpo": ("every token of the batch counts the same, so a long completion moves the model more than a short one",
             "loss = (sum over all tokens of ℓ) / (number of tokens in the batch)"),
    "dr_grpo": ("tokens are summed and divided by a fixed number (completions × max new tokens), so a long completion "
                "moves the model more and no length is favoured by the averaging",
                "loss = (sum over all tokens of ℓ) / (completions × max new tokens)"),
    "luspo": ("each completion's tokens are summed, so a completion moves the model in proportion to its length",
              "loss = mean over completions i of ( sum over tokens t of ℓ(i, t) )"),
}
LOSS_WEIGHTING = {loss: words for loss, (words, _) in _AVERAGING.items()}
LOSS_FORMULA = {loss: formula for loss, (_, formula) in _AVERAGING.items()}
CLIPPED_OBJECTIVE = "−min(ρ_t A_i, clip(ρ_t, 1 − ε, 1 + ε) A_i)"  # grpo, bnpo, dr_grpo, dapo and luspo
TOKEN_OBJECTIVE = {
    "cispo": "−min(ρ_t, 1 + ε_high) A_i log π(t)   (the clipped ratio is held constant)",
    "sapo": "−σ(τ (ρ_t − 1)) (4 / τ) A_i   (a soft gate instead of a clip; τ depends on the sign of A_i)",
    "vespo": "−φ_i A_i log π(t)   (φ_i: a weight from the sequence's importance ratio)",
}


class ExplainError(DragonError):
    """The group asked for is not in the run folder; the message says so in the screen's words."""


@dataclass(frozen=True)
class CompletionNumbers:
    number: int  # 1-based, as the rollout viewer numbers them
    scores: dict[str, float | None]
    total: float | None
    advantage: float  # ours, from the totals (grpo_math)
    logged: float | None  # TRL's

    @property
    def direction(self) -> str:
        """"up", "down" or "same": what the step does to this completion's probability."""
        if abs(self.advantage) < AGREE:
            return "same"
        return "up" if self.advantage > 0 else "down"


@dataclass(frozen=True)
class GroupExplanation:
    step: int
    group: int  # 1-based
    prompt: str
    reference: str
    weights: dict[str, float]
    completions: list[CompletionNumbers]
    mean: float | None
    spread: float | None  # the group's sample standard deviation (TRL's nanstd, Bessel-corrected)
    divisor: float | None  # what (total - mean) is divided by; None: nothing (scale_rewards "none")
    scale_rewards: str
    aggregation: str  # multi_objective_aggregation: sum_then_normalize (TRL's default) or normalize_then_sum (GDPO)
    loss_type: str
    beta: float
    kl: float | None
    largest_difference: float | None  # |ours - TRL's| at most this; None when TRL logged no advantages
    tool_calls: int = 0  # calls the group's completions made: the loss leaves the tools' answers out
    gates: dict[str, str] = field(default_factory=dict)  # reward name -> when it pays (its only_when), if gated

    @property
    def no_spread(self) -> bool:
        return not has_spread(c.total for c in self.completions)

    @property
    def agrees(self) -> bool | None:
        return None if self.largest_difference is None else self.largest_difference <= AGREE * max(
            1.0, *(abs(c.logged) for c in self.completions if c.logged is not None))


def _scores(item: Any) -> dict[str, float | None]:
    scores = item.get("scores") if isinstance(item, dict) else None
    return {str(name): finite_number(value) for name, value in (scores or {}).items()} if isinstance(scores, dict) \
        else {}


def explain_group(rollout: dict, group_number: int, config: dict, kl: float | None = None) -> GroupExplanation:
    """The numbers behind group ``group_number`` (1-based) of one step's rollout record, for a run whose settings
    are ``config`` (the run's config.json) and whose step logged ``kl``."""
    groups = [g for g in rollout.get("groups") or [] if isinstance(g, dict)]
    if not 1 <= group_number <= len(groups):
        raise ExplainError(f"Step {rollout.get('step', '?')} has {len(groups)} groups; there is no group {group_number}.")
    grpo = config.get("grpo") or {}
    scale = str(grpo.get("scale_rewards", DEFAULTS.scale_rewards))  # a setting it lacks: the config's default
    aggregation = str(grpo.get("multi_objective_aggregation", DEFAULTS.multi_objective_aggregation))
    weights = {str(r.get("name") or r.get("kind")): training_weight(r)
               for r in config.get("rewards") or [] if isinstance(r, dict)}
    items = [[c if isinstance(c, dict) else {} for c in g.get("completions") or []] for g in groups]
    totals = [[finite_number(c.get("total")) for c in group] for group in items]
    worked_out = advantages([[_scores(c) for c in group] for group in items], weights, scale, aggregation, totals)
    index = group_number - 1
    group, group_totals = groups[index], totals[index]
    values = known(group_totals)
    completions, differences = [], []
    for number, (item, total, ours) in enumerate(zip(items[index], group_totals, worked_out.values[index]), start=1):
        logged = finite_number(item.get("advantage"))
        if logged is not None:
            differences.append(abs(ours - logged))
        completions.append(CompletionNumbers(number, _scores(item), total, ours, logged))
    return GroupExplanation(
        step=int(rollout.get("step") or 0), group=group_number, prompt=str(group.get("prompt", "")),
        reference=str(group.get("reference", "")), weights=weights, completions=completions,
        mean=statistics.fmean(values) if values else None, spread=sample_std(values),
        divisor=worked_out.divisors[index], scale_rewards=scale, aggregation=aggregation,
        loss_type=str(grpo.get("loss_type", DEFAULTS.loss_type)),
        beta=float(finite_number(grpo.get("beta", DEFAULTS.beta)) or 0.0), kl=finite_number(kl),
        largest_difference=max(differences) if differences else None,
        tool_calls=sum(len(turn.get("calls") or []) for item in items[index] for turn in item.get("turns") or []
                       if isinstance(turn, dict)),
        gates={str(r.get("name") or r.get("kind")): gate.describe() for r in config.get("rewards") or []
               if isinstance(r, dict) and (gate := gate_of(r)) is not None})


def shown_number(value: Any, digits: int = 2) -> str:
    """A number as the rollout viewer and this panel show it: ``digits`` decimals, without the minus of a value that
    rounds to zero ("-0.00" reads as a negative advantage); "–" for anything that is not a number."""
    return f"{round(value, digits) + 0.0:.{digits}f}" if isinstance(value, (int, float)) else "–"


def _small(value: float) -> str:
    """Two significant digits without an exponent: a KL of 0.000048 reads as that, not as 0.0000 or 4.8e-05."""
    if value == 0:
        return "0"
    return f"{value:.{max(2, 1 - math.floor(math.log10(abs(value))))}f}"


def _numbers(numbers: list[int]) -> str:
    said = [str(n) for n in numbers]
    return said[0] if len(said) == 1 else ", ".join(said[:-1]) + " and " + said[-1]


def plain_words(explained: GroupExplanation) -> list[str]:
    """The step's effect on this group in a few sentences, for someone who has never seen the formula."""
    e = explained
    count = len(e.completions)
    totals = ", ".join(shown_number(c.total) for c in e.completions)
    if e.no_spread:
        same = shown_number(e.completions[0].total) if e.completions else "–"
        lines = [f"All {count} completions scored the same weighted total, {same}. GRPO learns only from differences "
                 "within a group: every advantage is 0, so this step pushes none of them up or down.",
                 "To learn from prompts like this one, the scores must differ: give partial credit (a reward that "
                 "pays for being close, or for part of the format), raise the temperature or the completions per "
                 "prompt, or use easier or harder prompts."]
    else:
        lines = [f"The {count} completions scored {totals} (each reward's score times its weight, added up). Their "
                 f"mean is {shown_number(e.mean)} and their spread (standard deviation) {shown_number(e.spread)}."]
        if e.aggregation == "normalize_then_sum":
            how = ("found the GDPO way (multi-objective aggregation normalize_then_sum): each reward's score is first "
                   "compared with the group's other scores for that reward (minus their mean, divided by their "
                   "spread), so every reward counts whatever its range; those are weighted and added up, and the "
                   f"sum is compared with the whole step's (minus its mean, divided by its spread, {shown_number(e.divisor)})")
        elif e.scale_rewards == "group":
            how = "its total minus the mean, divided by the group's spread"
        elif e.scale_rewards == "batch":
            how = f"its total minus the mean, divided by the spread of the whole step ({shown_number(e.divisor)})"
        else:
            how = "its total minus the mean (scale_rewards is none: no division)"
        up = [c.number for c in e.completions if c.direction == "up"]
        down = [c.number for c in e.completions if c.direction == "down"]
        moves = []
        if up:
            moves.append(f"{'completion' if len(up) == 1 else 'completions'} {_numbers(up)} scored above the mean, "
                         f"so the step makes replies like {'it' if len(up) == 1 else 'them'} more likely")
        if down:
            moves.append(f"{'completion' if len(down) == 1 else 'completions'} {_numbers(down)} scored below it, "
                         f"so the step makes replies like {'it' if len(down) == 1 else 'them'} less likely")
        lines.append(f"Each completion's advantage is {how}: " + "; ".join(moves) + ".")
        lines.append(f"How much each one moves the model: with loss type {e.loss_type}, "
                     f"{LOSS_WEIGHTING.get(e.loss_type, 'each token carries its completion’s advantage')}.")
    if e.tool_calls:
        lines.append(f"These completions called tools {e.tool_calls} time{'s' if e.tool_calls != 1 else ''}. The loss "
                     "sees only the model's own tokens: its text, its calls and its final answer. The tools' answers "
                     "(grey above) sit inside the completion, but they are masked out of the loss, so the step makes "
                     "the calls more or less likely, never the answers the tools gave.")
    if e.beta:
        kl = "" if e.kl is None else (f" This step's KL was {_small(e.kl)}, so the pull costs about "
                                      f"{_small(e.beta * e.kl)} per token, next to advantages of about "
                                      f"{shown_number(_typical(e), 2)}.")
        lines.append(f"Beta is {e.beta:g}: every token also pays beta times its KL divergence from the starting "
                     f"model, which pulls the model back toward where it began.{kl}")
    else:
        lines.append("Beta is 0: nothing pulls the model back toward where it began, so only the advantages move it.")
    if e.agrees is True:
        lines.append(f"These advantages match the ones TRL logged for this step (largest difference "
                     f"{e.largest_difference:.1e}).")
    elif e.agrees is False:
        lines.append(f"These advantages differ from the ones TRL logged for this step by up to "
                     f"{e.largest_difference:.3g}: a reward that failed and scored nothing can explain it; the table "
                     "shows both.")
    return lines


def _typical(e: GroupExplanation) -> float:
    sizes = [abs(c.advantage) for c in e.completions]
    return statistics.fmean(sizes) if sizes else 0.0


def formula_lines(explained: GroupExplanation) -> list[str]:
    """The same computation as formulas, with this group's numbers in them."""
    e = explained
    reward = " + ".join(f"{weight:g} × s_{name}" for name, weight in e.weights.items()) or "Σ_k w_k × s_k"
    gated = [f"s_{name} is 0 unless {when} (its only_when)" for name, when in e.gates.items()]
    lines = [f"r_i = {reward}   (the weighted total of completion i{'; ' if gated else ''}{'; '.join(gated)})",
             f"mean = (1/G) Σ r_i = {shown_number(e.mean, 4)}   (G = {len(e.completions)})",
             f"std = √( Σ (r_i − mean)² / (G − 1) ) = {shown_number(e.spread, 4)}"]
    if e.aggregation == "normalize_then_sum":
        summed = " + ".join(f"{weight:g} × z_{name}" for name, weight in e.weights.items()) or "Σ_k w_k × z_k"
        lines = ["z_k,i = (s_k,i − mean_k) / (std_k + 0.0001)   (each reward k, within the group of G = "
                 f"{len(e.completions)})",
                 f"r_i = {summed}   (the weighted sum of completion i's normalised scores)",
                 f"A_i = (r_i − mean_step) / (std_step + 0.0001), std_step = "
                 f"{shown_number((e.divisor or 0) - STD_EPSILON, 4)} over every completion of the step"]
    elif e.scale_rewards == "group":
        lines.append("A_i = (r_i − mean) / (std + 0.0001)")
    elif e.scale_rewards == "batch":
        lines.append(f"A_i = (r_i − mean) / (std_step + 0.0001), std_step = {shown_number((e.divisor or 0) - STD_EPSILON, 4)} "
                     "over every completion of the step")
    else:
        lines.append("A_i = r_i − mean")
    kl = f" + {e.beta:g} × KL_t" if e.beta else ""
    lines.append(f"ℓ(i, t) = {TOKEN_OBJECTIVE.get(e.loss_type, CLIPPED_OBJECTIVE)}{kl}   (ρ_t: the token's probability now "
                 "over its probability when it was sampled)")
    lines.append(LOSS_FORMULA.get(e.loss_type, "loss: see TRL's GRPOTrainer.compute_loss"))
    return lines


def step_spread(rollout: dict | None, config: dict) -> str:
    """Where one step's spread came from, in a sentence (the Train tab's, above its groups): each trained reward's
    share of it and the groups only it separated (engine.goal.spread_by_reward), and how many the goal separated;
    "" when no group had a spread."""
    groups = [[_scores(c) for c in g.get("completions") or [] if isinstance(c, dict)]
              for g in (rollout or {}).get("groups") or [] if isinstance(g, dict)]
    rewards: list[Mapping[str, Any]] = [r for r in config.get("rewards") or [] if isinstance(r, dict)]
    weights = {str(r.get("name") or r.get("kind")): training_weight(r) for r in rewards}
    by_reward = spread_by_reward(groups, {name: weight for name, weight in weights.items() if weight > 0})
    if not by_reward:
        return ""
    spread = [group for group in groups if has_spread(weighted_total(scores, weights) for scores in group)]
    said = "This step's spread came from " + ", ".join(
        f"{name} {round(100 * share)} %" + (f" (only it separated {round(alone * len(spread))})" if alone else "")
        for name, (share, alone) in sorted(by_reward.items(), key=lambda item: -item[1][0])) + \
        f", over the {len(spread)} of {len(groups)} groups with a spread."
    goal = goal_names(rewards)
    if goal:
        separated = sum(has_spread(sum(scores.get(name) or 0.0 for name in goal) for scores in group)
                        for group in spread)
        said += f" The goal, {', '.join(goal)}, separated the replies in {separated} of them."
    return said


def read_step_rollout(run: RunDir, step: int) -> dict | None:
    """The rollout record of ``step``, or None. Each line starts with its step (the run writes ``{"step": n, ...``),
    so only the wanted line is parsed, however long the run."""
    prefix = f'{{"step": {int(step)}, '.encode()
    try:
        with open(run.rollouts_path, "rb") as handle:
            for line in handle:
                if line.startswith(prefix) and line.endswith(b"\n"):
                    return json.loads(line)
    except FileNotFoundError:
        return None
    return None


def explain_run_group(run: RunDir, step: int, group_number: int) -> GroupExplanation:
    """Group ``group_number`` of ``step`` in the run folder ``run``, with the KL the step logged."""
    rollout = read_step_rollout(run, step)
    if rollout is None:
        raise ExplainError(f"The run has no completions recorded for step {step}.")
    kl = next((row.get("kl") for row in run.read_progress() if row.get("step") == step), None)
    return explain_group(rollout, group_number, read_json(run.config_path, default={}) or {}, kl)
