"""Which reward the groups' spread comes from, who wins where no reply is right, and the alternatives measured on the
sampled replies (engine.goal), on groups written out by hand: no model is needed to check the arithmetic."""

import json

import pytest

from dragon_ui.engine.goal import SampledGroup, alternatives, check_goal
from dragon_ui.engine.preflight import Fix
from dragon_ui.public import LAPTOP
from dragon_ui.rewards import build_rewards, parse_rewards, score_completions

TRAP = [{"kind": "exact"}, {"kind": "length", "name": "short", "max_chars": 20, "weight": 0.3},
        {"kind": "contains", "weight": 0.5}]
# Two groups of four replies as the model writes them: sentences that name the answer, and short wrong words.
# No reply is the bare answer: exact never pays. In the third, none names it either: only short separates them.
GROUPS = [("hot", "cold", ["The opposite of hot is cold.", "freezing", "It is cold, I think so.", "warmth"]),
          ("big", "small", ["The opposite of big is small.", "tiny", "Large things are big.", "huge"]),
          ("up", "down", ["upward", "The word you want is sky-high.", "top", "The answer is above."])]


def sampled(rewards, groups=GROUPS) -> list[SampledGroup]:
    found = []
    for number, (word, reference, replies) in enumerate(groups, 1):
        example = {"prompt": [{"role": "user", "content": f"Opposite of {word}?"}], "reference": reference,
                   "row": "{}", "number": number}
        results = score_completions(rewards, replies, [reference] * len(replies), [word] * len(replies),
                                    [{}] * len(replies))
        found.append(SampledGroup(number, f"Opposite of {word}?", reference, [example] * len(replies), replies,
                                  results, [False] * len(replies)))
    return found


def scorer(some, examples, replies):
    return score_completions(some, replies, [e["reference"] for e in examples], [""] * len(replies),
                             [json.loads(e["row"]) for e in examples])


def test_a_goal_that_never_pays_is_named_with_where_the_spread_comes_from():
    rewards = build_rewards(parse_rewards(TRAP, policy=LAPTOP), policy=LAPTOP)
    check = check_goal(rewards, sampled(rewards))
    assert check.names == ["exact"] and check.passed == 0 and check.replies == 12
    assert not check.teaches and check.spread == 0 and check.spread_groups == 3
    shares = {share.name: share for share in check.shares}
    assert shares["exact"].advantage == 0
    assert shares["contains"].advantage + shares["short"].advantage == pytest.approx(1)
    assert shares["contains"].passed == pytest.approx(3 / 12)
    assert (shares["short"].alone, shares["contains"].alone) == pytest.approx((1 / 3, 0))
    assert check.spread_from == ["contains", "short"]
    assert check.wrong_wins == 3
    said = " ".join(check.sentences())
    assert "Your goal, `exact`, never pays: 0 of 12 sampled replies pass it, while `contains` passes 25 %." in said
    assert "The groups differ by `contains` and `short`" in said
    # totals 0.3, 0.15, 0.3, 0.3: (0.3 - 0.2625) / (0.075 + 1e-4) = +0.50 for each of three short wrong words
    assert "for row 3, “upward” (reference down) gets +0.50, most of it from `short`" in said
    assert "No change measured here makes `exact` pay for this model" in said


def test_the_winner_of_a_group_with_no_right_reply_is_the_one_its_advantage_puts_first():
    """Group 2: "tiny" (4 characters, length 1) and "huge" beat the sentence that contains "small" on length, but
    the sentence earns contains (0.5) and length 0.9 (29 characters): 0.77 against 0.3. It wins, from contains."""
    rewards = build_rewards(parse_rewards(TRAP, policy=LAPTOP), policy=LAPTOP)
    check = check_goal(rewards, sampled(rewards))
    assert [winner.number for winner in check.winners] == [3, 2, 1]  # the one a shaping reward picked first
    winners = {winner.number: winner for winner in check.winners}
    # totals 0.665, 0.3, 0.285 and 0.3: the sentence is 0.5 above the others, whose spread is 0.1875 (TRL's
    # Bessel-corrected std): (0.665 - 0.3875) / (0.188 + 1e-4) = 1.50
    assert winners[2].reply == "The opposite of big is small." and winners[2].by == "contains"
    assert winners[2].advantage == pytest.approx(1.5, abs=0.01)


def test_a_goal_that_separates_the_replies_teaches():
    rewards = build_rewards(parse_rewards([{"kind": "contains"}, {"kind": "length", "max_chars": 20,
                                                                   "weight": 0.3}], policy=LAPTOP), policy=LAPTOP)
    check = check_goal(rewards, sampled(rewards))
    assert check.names == ["contains"] and check.teaches and check.sentences() == []


def test_the_alternatives_are_measured_on_the_sampled_replies_and_fix_the_draft():
    specs = parse_rewards(TRAP, policy=LAPTOP)
    rewards = build_rewards(specs, policy=LAPTOP)
    groups = sampled(rewards)
    check = check_goal(rewards, groups)
    found = alternatives(check, rewards, groups, specs, scorer, None, False, None, 24, None, policy=LAPTOP)
    labels = [alternative.label for alternative in found]
    assert labels[0] == "Make `contains` the goal; pay `short` only when it passes"
    assert "Make `contains` the goal, keep `exact` as a metric" in labels
    gated = found[0]
    # Gated: group 3 (no reply contains the answer) loses its spread, and with it its wrong winner.
    assert gated.effect == "Groups that a wrong reply wins: 3 → 0 of 3; groups with a spread: 3 → 2."
    swap = found[labels.index("Make `contains` the goal, keep `exact` as a metric")]
    assert swap.pays == pytest.approx(3 / 12) and "`contains` would pass 25 %" in swap.effect
    fixed = Fix(gated.label, gated.effect, **gated.fix).applied_to({"rewards": TRAP})
    assert fixed["rewards"] == [{"kind": "exact", "goal": False, "train": False},
                                {"kind": "length", "name": "short", "max_chars": 20, "weight": 0.3,
                                 "only_when": "contains"},
                                {"kind": "contains", "weight": 1.0, "goal": True}]
    # The fixed rewards, scored again: the goal is contains, and no group has a wrong winner any more.
    after = build_rewards(parse_rewards(fixed["rewards"], policy=LAPTOP), policy=LAPTOP)
    again = check_goal(after, sampled(after))
    assert again.names == ["contains"] and again.teaches and again.wrong_wins == 0


def test_a_system_message_is_measured_on_replies_sampled_again():
    specs = parse_rewards(TRAP, policy=LAPTOP)
    rewards = build_rewards(specs, policy=LAPTOP)
    groups = sampled(rewards)
    check = check_goal(rewards, groups)
    asked = []

    def resample(system):
        asked.append(system)
        example = {**groups[0].examples[0], "prompt": [{"role": "system", "content": system}]}
        return [example] * 4, ["cold", "Cold.", "The opposite is cold.", "warm"]

    found = alternatives(check, rewards, groups, specs, scorer, resample, False, None, 24, None, policy=LAPTOP)
    system = next(alternative for alternative in found if "system message" in alternative.label)
    assert system.pays == 0.5 and system.keeps_goal and "50 % of 4 replies sampled again pass `exact`" in system.effect
    assert system.fix == {"settings": {"data": {"system": asked[0]}}}
    assert "No change measured here" not in " ".join(
        check.__class__(**{**vars(check), "alternatives": found}).sentences())
    found = alternatives(check, rewards, groups, specs, scorer, resample, True, None, 24, None, policy=LAPTOP)
    assert not any("system message" in a.label for a in found)  # the data has one


def test_room_and_a_larger_model_are_offered_one_measured_one_not():
    specs = parse_rewards(TRAP, policy=LAPTOP)
    rewards = build_rewards(specs, policy=LAPTOP)
    groups = sampled(rewards)
    check = check_goal(rewards, groups)
    found = {a.label: a for a in alternatives(check, rewards, groups, specs, scorer, None, False, 0.4, 24,
                                              "HuggingFaceTB/SmolLM2-360M-Instruct", policy=LAPTOP)}
    room = found["Give replies room: 48 new tokens"]
    assert room.measured and room.fix == {"settings": {"grpo": {"max_new_tokens": 48}}}
    assert room.effect == ("40 % of replies were cut off at 24 tokens; the goal passed on none of those and 0 % of "
                           "the whole ones.")  # the hand-made groups mark no reply as cut off
    larger = found["Try a larger model (SmolLM2-360M-Instruct)"]
    assert not larger.measured and larger.effect.startswith("Not measured")
    assert larger.fix == {"settings": {"model": {"id": "HuggingFaceTB/SmolLM2-360M-Instruct"}}}
    assert not any("room" in label for label in (a.label for a in alternatives(
        check, rewards, groups, specs, scorer, None, False, None, 24, None, policy=LAPTOP)))


def test_a_goal_that_pays_a_little_is_gated_on_the_goal_that_pays_most():
    """One bare "cold" of twelve replies: exact pays (1 of 12) but separates one group in three. Gating short on
    exact would leave almost nothing to learn from; on contains, which pays three times as often, it does not."""
    groups_with_one = [(word, reference, list(replies)) for word, reference, replies in GROUPS]
    groups_with_one[0][2][1] = "cold"
    specs = parse_rewards(TRAP, policy=LAPTOP)
    rewards = build_rewards(specs, policy=LAPTOP)
    groups = sampled(rewards, groups_with_one)
    check = check_goal(rewards, groups)
    assert check.passed == 1 and check.spread == pytest.approx(1 / 3)
    assert check.teaches  # a third of the groups differ in the goal: enough (GOAL_SEPARATES)
    found = alternatives(check, rewards, groups, specs, scorer, None, False, None, 24, None, policy=LAPTOP)
    assert found[0].label == "Make `contains` the goal; pay `short` only when it passes"
    assert found[0].fix["change_rewards"]["short"] == {"only_when": "contains"}
