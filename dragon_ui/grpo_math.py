"""GRPO's group arithmetic in plain Python, as TRL 1.16's ``GRPOTrainer._generate_and_score_completions`` does it.

Each completion's weighted total, whether a group's totals differ (GRPO learns only from groups whose do), and the
advantages for every ``scale_rewards`` and ``multi_objective_aggregation``. The run's records, the Train tab, the
explain panel, the Rewards tab's playground and the health alerts all take these numbers from here, so they agree
with one another and with what trained. No torch: the screens need none.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeGuard

STD_EPSILON = 1e-4  # TRL adds it to the spread before dividing, so a group whose scores barely differ stays finite
# Totals closer than this, relative to the largest, are the same: a weighted total is rounded (1.0 + 0.3 is not 1.3
# in floats, and a run keeps 6 decimals), and that rounding is no spread to learn from.
SAME = 1e-6
SCALE_REWARDS = ("group", "batch", "none")
AGGREGATIONS = ("sum_then_normalize", "normalize_then_sum")

Scores = Mapping[str, float | None]


def finite_number(value: object) -> float | None:
    """The value if it is a finite number (not a bool), else None: records are read as they are, and a value may be
    missing, NaN, or anything a hand-edited file holds."""
    return value if finite(value) else None


def finite(value: object) -> TypeGuard[float]:
    """Whether the value is a finite number (not a bool): a score a reward gave."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:  # an integer too large for a float
        return False


def known(values: Iterable[float | None]) -> list[float]:
    """The values that are finite numbers (a reward that failed or returned None has no score)."""
    return [v for v in values if finite(v)]


def weighted_total(scores: Scores, weights: Mapping[str, float]) -> float | None:
    """Σ weight × score over the rewards that scored (TRL's nansum); None when none did: TRL then leaves the
    completion out of its group's mean and gives it no advantage."""
    parts = [(weights[name], score) for name, score in scores.items()
             if name in weights and finite(score)]
    return sum(weight * score for weight, score in parts) if parts else None  # inf where TRL's would be


def sample_std(values: Iterable[float | None]) -> float | None:
    """TRL's nanstd: the Bessel-corrected standard deviation of the known values; None for fewer than two."""
    values = known(values)
    return statistics.stdev(values) if len(values) > 1 else None


def has_spread(totals: Iterable[float | None]) -> bool:
    """Whether GRPO can learn from a group: two scored completions at least, whose totals differ by more than
    rounding (SAME, relative to the largest). A lone completion has nothing to be compared with."""
    values = known(totals)
    return len(values) > 1 and max(values) - min(values) > SAME * max(1.0, *(abs(v) for v in values))


def no_spread_share(groups: Iterable[Iterable[float | None]]) -> float | None:
    """The share of a step's groups without spread (``has_spread``), None without groups. TRL's own
    frac_reward_zero_std compares the float32 spread with zero at an absolute tolerance, so a rounded weighted total
    counts there as a spread; here it does not."""
    flags = [not has_spread(group) for group in groups]
    return sum(flags) / len(flags) if flags else None


@dataclass(frozen=True)
class Advantages:
    """A step's advantages, per group and completion, with what they were worked out from."""

    values: list[list[float]]  # 0 for a completion no reward scored, as TRL gives it
    compared: list[list[float | None]]  # the weighted totals, or (GDPO) the sums of the normalised scores
    baselines: list[float | None]  # per group, what is subtracted: the group's mean (GDPO: the batch's)
    divisors: list[float | None]  # per group, what the difference is divided by (spread + ε); None: not divided


def advantages(groups: Sequence[Sequence[Scores]], weights: Mapping[str, float], scale_rewards: str = "group",
               aggregation: str = "sum_then_normalize",
               totals: Sequence[Sequence[float | None]] | None = None) -> Advantages:
    """Each completion's advantage, for ``groups`` (each a list of per-reward scores, one per completion) sampled in
    one step. ``totals``: the groups' weighted totals where they are known already (a run's records keep them); else
    they are worked out from the scores."""
    if scale_rewards not in SCALE_REWARDS or aggregation not in AGGREGATIONS:
        raise ValueError(f"unknown scale_rewards {scale_rewards!r} or multi_objective_aggregation {aggregation!r}")
    if aggregation == "normalize_then_sum":  # GDPO: each reward relative to its group, then one batch-wide scale
        compared = [_normalised_sums(group, weights) for group in groups]
        everything = [v for group in compared for v in group]
        values = known(everything)
        baselines = [statistics.fmean(values) if values else None] * len(groups)
        divisors: list[float | None] = [(sample_std(values) or 0.0) + STD_EPSILON] * len(groups)
    else:
        compared = [list(group) for group in totals] if totals is not None else \
            [[weighted_total(scores, weights) for scores in group] for group in groups]
        baselines = [statistics.fmean(values) if (values := known(group)) else None for group in compared]
        if scale_rewards == "group":
            divisors = [(sample_std(group) or 0.0) + STD_EPSILON for group in compared]
        elif scale_rewards == "batch":
            divisors = [(sample_std(v for group in compared for v in group) or 0.0) + STD_EPSILON] * len(compared)
        else:
            divisors = [None] * len(compared)
    per_completion = [[(v - baseline) / (divisor or 1.0) if finite(v) and baseline is not None else 0.0 for v in group]
                      for group, baseline, divisor in zip(compared, baselines, divisors, strict=True)]
    return Advantages(per_completion, compared, baselines, divisors)


def _normalised_sums(group: Sequence[Scores], weights: Mapping[str, float]) -> list[float | None]:
    """GDPO's per-completion value: each reward's score made relative to the group, (s - mean) / (std + ε), then
    weighted and added up over the rewards that scored; None where none did."""
    relative: list[dict[str, float]] = [{} for _ in group]
    for name in weights:
        column = [scores.get(name) for scores in group]
        values = known(column)
        if not values:
            continue
        mean, divisor = statistics.fmean(values), (sample_std(values) or 0.0) + STD_EPSILON
        for index, score in enumerate(column):
            if finite(score):
                relative[index][name] = (score - mean) / divisor
    return [weighted_total(scores, weights) for scores in relative]
