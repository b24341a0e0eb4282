"""Rewards paid only when another passes (``only_when``), and a run's goal: checked against tables worked out by hand,
in every place a reward is scored (score_completion, the TRL functions), and their settings' errors."""

import pytest

from dragon_ui.errors import ConfigError
from dragon_ui.public import LAPTOP
from dragon_ui.rewards import (RewardFailures, build_rewards, cannot_pay, goal_names, parse_rewards, reward_rule,
                               score_completion, trl_reward_functions)

CAPITAL = [{"kind": "exact", "name": "exact"},
           {"kind": "length", "name": "short", "max_chars": 20, "weight": 0.3},
           {"kind": "contains", "name": "contains", "weight": 0.5}]

# (gate of "short", reply, reference, expected scores {exact, short, contains}, expected total, withheld)
# "short": 1 up to 20 characters, falling to 0 at 40; exact and contains are 0/1.
GATED = [
    (None, "Lagos", "Maputo", (0, 1, 0), 0.3, {}),  # ungated: a short wrong answer earns the length reward
    ("exact", "Lagos", "Maputo", (0, 0, 0), 0.0, {"short": 1.0}),  # gated on exact: it earns nothing
    ("exact", "Maputo", "Maputo", (1, 1, 1), 1.8, {}),
    ("contains", "The capital is Maputo.", "Maputo", (0, 0.9, 1), 0.77, {}),  # 22 characters: length pays 0.9
    ("exact", "The capital is Maputo.", "Maputo", (0, 0, 1), 0.5, {"short": 0.9}),
    ("contains >= 1", "It is Maputo", "Maputo", (0, 1, 1), 0.8, {}),
    ("contains >= 2", "It is Maputo", "Maputo", (0, 0, 1), 0.5, {"short": 1.0}),  # a threshold it never reaches
]


@pytest.mark.parametrize(("gate", "reply", "reference", "expected", "total", "withheld"), GATED)
def test_a_gated_reward_pays_only_where_its_gate_passes(gate, reply, reference, expected, total, withheld):
    settings = [dict(item) for item in CAPITAL]
    if gate:
        settings[1]["only_when"] = gate
    rewards = build_rewards(parse_rewards(settings, policy=LAPTOP), policy=LAPTOP)
    result = score_completion(rewards, reply, reference)
    assert [result.scores[name] for name in ("exact", "short", "contains")] == pytest.approx(expected)
    assert result.total == pytest.approx(total)
    assert result.withheld == pytest.approx(withheld)


def test_training_pays_what_the_playground_shows():
    """TRL's functions, one per reward, give the gated scores score_completion gives, whichever order TRL calls
    them in, and a gate's failures are counted once."""
    settings = [dict(item) for item in CAPITAL]
    settings[1]["only_when"] = "exact"
    rewards = build_rewards(parse_rewards(settings, policy=LAPTOP), policy=LAPTOP)
    replies = ["Lagos", "Maputo", "The capital is Maputo.", "maputo!"]
    references = ["Maputo"] * len(replies)
    expected = [score_completion(rewards, reply, "Maputo").scores for reply in replies]
    for order in ([0, 1, 2], [1, 0, 2]):
        failures = RewardFailures()
        functions = trl_reward_functions(rewards, failures)
        completions = [[{"role": "assistant", "content": reply}] for reply in replies]
        prompts = [[{"role": "user", "content": "Capital of Mozambique?"}]] * len(replies)
        got = {}
        for index in order:
            got[functions[index].__name__] = functions[index](prompts, completions, reference=references)
        for number, scores in enumerate(expected):
            assert {name: got[name][number] for name in scores} == scores
        assert failures.total() == 0


@pytest.mark.parametrize(("gate", "error"), [
    ("short", "names the reward itself"),
    ("nothing", "'nothing', which is not one of the rewards"),
    ("exact >", "must name another reward"),
    ("exact >= x", "must name another reward"),
    (3, "must name another reward"),
])
def test_a_gate_must_name_another_reward(gate, error):
    settings = [dict(item) for item in CAPITAL]
    settings[1]["only_when"] = gate
    with pytest.raises(ConfigError, match=error):
        parse_rewards(settings, policy=LAPTOP)


def test_a_gate_cannot_be_gated_itself():
    settings = [dict(item) for item in CAPITAL]
    settings[1]["only_when"] = "contains"
    settings[2]["only_when"] = "exact"
    with pytest.raises(ConfigError, match="pays only when exact itself"):
        parse_rewards(settings, policy=LAPTOP)


def test_a_gate_is_said_and_kept_in_one_spelling():
    settings = [dict(item) for item in CAPITAL]
    settings[1]["only_when"] = " contains>=1.0 "
    specs = parse_rewards(settings, policy=LAPTOP)
    assert specs[1].only_when == "contains >= 1"
    assert specs[1].to_dict()["only_when"] == "contains >= 1"
    assert reward_rule(specs[1]).endswith("paid only when contains scores 1 or more")
    settings[1]["only_when"] = "exact"
    assert reward_rule(parse_rewards(settings, policy=LAPTOP)[1]).endswith("paid only when exact passes")


@pytest.mark.parametrize(("rewards", "goal"), [
    (CAPITAL, ["exact"]),  # exact and contains check the answer; exact weighs most
    ([{"kind": "numeric"}, {"kind": "length", "max_chars": 12, "weight": 0.3}], ["numeric"]),
    ([{"kind": "format"}, {"kind": "math", "extract": "answer_tag", "weight": 2.0}], ["math"]),
    ([{"kind": "json"}, {"kind": "contains", "weight": 0.5}], ["json"]),
    ([{"kind": "format"}, {"kind": "length", "max_chars": 9}], []),  # nothing checks the answer
    ([{"kind": "exact", "train": False}, {"kind": "contains", "weight": 0.5}], ["contains"]),  # a metric weighs 0
    ([{"kind": "exact"}, {"kind": "contains", "weight": 0.5, "goal": True}], ["contains"]),  # marked
    ([{"kind": "exact", "goal": False}, {"kind": "contains", "weight": 0.5}], ["contains"]),
    ([{"kind": "exact"}, {"kind": "contains"}], ["exact", "contains"]),  # equal weights: both
    ([{"kind": "regex", "pattern": "x", "goal": True}, {"kind": "exact"}], ["regex"]),
])
def test_the_goal_is_inferred_from_the_kinds_unless_marked(rewards, goal):
    assert goal_names(parse_rewards(rewards, policy=LAPTOP)) == goal


def test_a_stored_configs_reward_dicts_name_the_same_goal():
    """The hacking watch reads the goal from a run's config.json, whose rewards are dicts as to_dict writes them."""
    for rewards, goal in [(CAPITAL, ["exact"]), ([{"kind": "exact", "train": False}, {"kind": "contains"}],
                                                 ["contains"]),
                          ([{"kind": "length", "max_chars": 9}], [])]:
        assert goal_names([spec.to_dict() for spec in parse_rewards(rewards, policy=LAPTOP)]) == goal


def test_a_reward_that_cannot_pay_on_the_references_is_named_with_the_fix():
    specs = parse_rewards([{"kind": "numeric"}, {"kind": "exact"}, {"kind": "contains", "extract": "answer_tag"},
                           {"kind": "length", "max_chars": 3}], policy=LAPTOP)
    found = cannot_pay(specs, ["Paris", "", None, "Tokyo"], policy=LAPTOP)
    assert list(found) == ["numeric"]  # the extraction aside: the reference itself is the reply
    assert found["numeric"] == ("`numeric` (numeric) cannot pay on this data: the reference answer contains no number, "
                                "on all 2 references checked, so no reply can earn it. Use exact or contains instead: "
                                "they compare words.")
    assert cannot_pay(specs, ["Paris", "12"], policy=LAPTOP) == {}  # one reference it can pay on is enough
    assert cannot_pay(specs, [], policy=LAPTOP) == {}


def test_a_slow_reference_ends_the_check_without_a_flag(monkeypatch):
    from dragon_ui.rewards import scoring
    monkeypatch.setattr(scoring, "CHECK_SECONDS", -1.0)  # past the budget at once: nothing is concluded
    assert cannot_pay(parse_rewards([{"kind": "numeric"}], policy=LAPTOP), ["Paris"] * 5, policy=LAPTOP) == {}
