"""GRPO's group arithmetic (dragon_ui.grpo_math): table-driven against TRL 1.16's own formulas, and one set of
groups fed to every screen that shows it (the playground, the Train tab's rollouts, the explain panel), which must
agree with each other."""

from __future__ import annotations

import math

import pytest

from dragon_ui import grpo_math
from dragon_ui.config import GRPOSettings
from dragon_ui.rewards import ScoreResult, build_rewards, parse_rewards
from dragon_ui.studio import explain
from dragon_ui.studio.playground import GroupScores, advantages_of, no_signal_warning
from dragon_ui.ui import train_tab
from dragon_ui.public import LAPTOP

WEIGHTS = {"correct": 1.0, "short": 0.3}


@pytest.mark.parametrize("totals, spread", [
    ([1.0, 0.0], True),
    ([0.3, 0.3, 0.3], False),
    ([1.3, 1.3000000000000003, 1.2999999999999998], False),  # a weighted total's rounding is no spread
    ([1e6, 1e6 + 0.5], False),  # relative to the totals' size
    ([0.0, 1e-3], True),
    ([5.0], False),  # a lone completion has nothing to be compared with
    ([1.0, None], False),  # nor has one beside a completion no reward scored
    ([1.0, None, 0.0], True),
    ([float("nan"), 1.0, 1.0], False),
    ([10**400, 1.0, 1.0], False),  # an integer no float holds is no score (a hand-edited run file)
    ([], False),
])
def test_a_group_has_spread_when_two_scored_totals_differ_by_more_than_rounding(totals, spread):
    assert grpo_math.has_spread(totals) is spread


@pytest.mark.parametrize("groups, share", [
    ([[1.0, 1.0], [0.0, 1.0]], 0.5),
    ([[1.3, 1.3000000000000003, 1.2999999999999998]], 1.0),
    ([[0.0, 1e-3]], 0.0),
    ([[5.0], [0.0, 1.0]], 0.5),
    ([], None),
])
def test_the_no_spread_share_counts_every_group(groups, share):
    assert grpo_math.no_spread_share(groups) == share


def trls_advantages(groups: list[list[dict]], weights: dict, scale_rewards: str, aggregation: str) -> list[float]:
    """TRL 1.16's GRPOTrainer._generate_and_score_completions, its lines for the advantages, on the same scores
    (None where a reward gave none: NaN, as TRL stores it)."""
    import torch
    from trl.trainer.utils import nanstd

    size = len(groups[0])
    per_func = torch.tensor([[math.nan if s.get(n) is None else s[n] for n in weights] for g in groups for s in g],
                            dtype=torch.float64)
    reward_weights = torch.tensor(list(weights.values()), dtype=torch.float64)
    unscorable = torch.isnan(per_func).all(dim=1)
    if aggregation == "sum_then_normalize":
        rewards = (per_func * reward_weights.unsqueeze(0)).nansum(dim=1)
        rewards[unscorable] = torch.nan
        mean = torch.nanmean(rewards.view(-1, size), dim=1).repeat_interleave(size, dim=0)
        if scale_rewards in ("group", "none"):
            std = nanstd(rewards.view(-1, size), dim=1).repeat_interleave(size, dim=0)
        else:
            std = nanstd(rewards).expand_as(rewards)
        advantages = rewards - mean
        if scale_rewards != "none":
            advantages = advantages / (std + 1e-4)
    else:
        grouped = per_func.view(-1, size, len(weights))
        mean_k = torch.nanmean(grouped, dim=1, keepdim=True)
        std_k = nanstd(grouped, dim=1, keepdim=True)
        reward_k = ((grouped - mean_k) / (std_k + 1e-4)).view(-1, len(weights))
        rewards = (reward_k * reward_weights.unsqueeze(0)).nansum(dim=1)
        rewards[unscorable] = torch.nan
        advantages = (rewards - torch.nanmean(rewards)) / (nanstd(rewards) + 1e-4)
    advantages[unscorable] = 0.0  # TRL: "their advantage is forced to 0 afterwards"
    return advantages.tolist()


STEP = [  # one step's groups of per-reward scores: a spread, none, one reward constant, an unscored completion
    [{"correct": 1.0, "short": 1.0}, {"correct": 0.0, "short": 1.0}, {"correct": 1.0, "short": 0.0}],
    [{"correct": 1.0, "short": 0.0}, {"correct": 1.0, "short": 0.0}, {"correct": 1.0, "short": 0.0}],
    [{"correct": 0.0, "short": 0.25}, {"correct": 0.0, "short": 1.0}, {"correct": 0.0, "short": 0.5}],
    [{"correct": 1.0, "short": 0.5}, {"correct": None, "short": None}, {"correct": 0.0, "short": None}],
]


@pytest.mark.parametrize("aggregation", grpo_math.AGGREGATIONS)
@pytest.mark.parametrize("scale_rewards", grpo_math.SCALE_REWARDS)
def test_the_advantages_are_trls(scale_rewards, aggregation):
    ours = grpo_math.advantages(STEP, WEIGHTS, scale_rewards, aggregation).values
    expected = trls_advantages(STEP, WEIGHTS, scale_rewards, aggregation)
    # 1e-7: TRL's nanstd takes Bessel's correction as count / (count - 1) of integer tensors, a float32 quotient
    assert [a for group in ours for a in group] == pytest.approx(expected, rel=1e-7, abs=1e-9)


def test_unknown_settings_are_refused():
    with pytest.raises(ValueError):
        grpo_math.advantages(STEP, WEIGHTS, "per-token")


# --- every screen, the same groups ---------------------------------------------------------------------------------

SCREENS_STEP = STEP[:3] + [  # and a group whose totals differ only by rounding
    [{"correct": 1.0, "short": 1.0}, {"correct": 1.0, "short": 1.0}, {"correct": 1.0, "short": 1.0}],
]


def flat(groups: list[list[float]]) -> list[float]:
    return [value for group in groups for value in group]


def rounded_totals() -> list[list[float]]:
    """The totals as a run records them (6 decimals), with the last group's float noise left in."""
    totals = [[round(grpo_math.weighted_total(s, WEIGHTS), 6) for s in group] for group in SCREENS_STEP]
    totals[-1] = [1.3, 1.3000000000000003, 1.2999999999999998]
    return totals


def rollout_record(totals: list[list[float]], logged: list[list[float]]) -> dict:
    return {"step": 3, "groups": [
        {"prompt": f"prompt {g}", "reference": "1", "completions": [
            {"text": f"reply {i}", "scores": scores, "total": total, "advantage": advantage}
            for i, (scores, total, advantage) in enumerate(zip(group, totals[g], logged[g], strict=True))]}
        for g, group in enumerate(SCREENS_STEP)]}


@pytest.mark.parametrize("aggregation", grpo_math.AGGREGATIONS)
@pytest.mark.parametrize("scale_rewards", grpo_math.SCALE_REWARDS)
def test_every_screen_agrees_on_spread_and_advantages(scale_rewards, aggregation):
    totals = rounded_totals()
    truth = grpo_math.advantages(SCREENS_STEP, WEIGHTS, scale_rewards, aggregation, totals)
    spread = [grpo_math.has_spread(group) for group in totals]
    assert spread == [True, False, True, False]

    playground = [GroupScores(f"prompt {g}", "1", ["reply"] * len(group),
                              [ScoreResult(dict(scores), total) for scores, total in zip(group, totals[g], strict=True)])
                  for g, group in enumerate(SCREENS_STEP)]
    grpo = GRPOSettings(group_size=3, scale_rewards=scale_rewards, multi_objective_aggregation=aggregation)
    rewards = build_rewards(parse_rewards([{"kind": "exact", "name": "correct"},
                                           {"kind": "length", "name": "short", "max_chars": 10, "weight": 0.3}], policy=LAPTOP), policy=LAPTOP)
    assert flat(advantages_of(playground, rewards, grpo)) == pytest.approx(flat(truth.values))
    assert [no_signal_warning(group) is None for group in playground] == spread

    record = rollout_record(totals, truth.values)
    config = {"grpo": {"scale_rewards": scale_rewards, "multi_objective_aggregation": aggregation},
              "rewards": [{"name": "correct", "weight": 1.0}, {"name": "short", "weight": 0.3}]}
    for number in range(1, len(SCREENS_STEP) + 1):
        explained = explain.explain_group(record, number, config)
        assert explained.no_spread is not spread[number - 1]
        assert [c.advantage for c in explained.completions] == pytest.approx(truth.values[number - 1])
        assert explained.agrees is True

    shown = train_tab.rollouts_html(record, list(WEIGHTS), max_groups=len(SCREENS_STEP))
    assert shown.count("Every completion scored the same") == spread.count(False)


def test_huge_weights_give_an_infinite_total_not_an_error():
    """As TRL's nansum does; the run's records keep such a total as missing (finite_or_none)."""
    assert grpo_math.weighted_total({"a": 1e308, "b": 1e308}, {"a": 1.0, "b": 1.0}) == math.inf
