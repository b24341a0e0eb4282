"""The reward red-team: gaming replies scored against the rewards on real rows, beside the best honest reply. It
catches the reward_hacking lesson's padding reward, passes every other bundled recipe, and names what pays."""

from __future__ import annotations

import pytest

from dragon_ui import ASSETS_DIR
from dragon_ui.config import DEFAULT_MODEL_ID, ModelConfig, RunConfig
from dragon_ui.data import load_and_map
from dragon_ui.engine.models import load_tokenizer, resolve_model
from dragon_ui.engine.redteam import REPEATED, red_team
from dragon_ui.errors import Stopped
from dragon_ui.rewards import RewardSpec, build_rewards, parse_rewards
from dragon_ui.public import LAPTOP

pytestmark = pytest.mark.timeout(300)
RECIPES = ASSETS_DIR / "recipes"


@pytest.fixture(scope="module")
def tokenizer():
    """The default model's (its offline copy): a padded reply is as long as the recipes' model makes it."""
    return load_tokenizer(resolve_model(ModelConfig(id=DEFAULT_MODEL_ID)))


def recipe_red_team(name: str, tokenizer):
    config = RunConfig.from_file(RECIPES / f"{name}.yaml", policy=LAPTOP)
    rewards = build_rewards(config.rewards, base_dir=config.base_dir, tokenizer=tokenizer,
                            max_new_tokens=config.grpo.max_new_tokens, policy=LAPTOP)
    examples = load_and_map(config.data, base_dir=config.base_dir, policy=LAPTOP).train
    return red_team(rewards, examples, config.grpo.max_new_tokens, tokenizer)


@pytest.mark.parametrize("name", ["arithmetic", "beta_and_temperature", "json_answers", "think_answer", "too_hard"])
def test_the_bundled_recipes_rewards_raise_no_alarm(name, tokenizer):
    found = recipe_red_team(name, tokenizer)
    assert not found.flagged, found.describe()
    assert found.verdict.startswith("No gaming reply earns half of what an honest one does (11 tried on 8 rows)")
    assert all(check.honest > 0 for check in found.checks)


def test_the_reward_hacking_lessons_padding_is_caught_before_training(tokenizer):
    found = recipe_red_team("reward_hacking", tokenizer)
    flagged = {check.name: check for check in found.flagged}
    assert "a padded reply at the length cap" in flagged, found.describe()
    assert flagged["a padded reply at the length cap"].paid_by == ["show_working"]
    assert "show_working: it pays for length, not for content" in found.verdict
    assert REPEATED in flagged  # the answer padded out by repeating it pays more than saying it once


ROW = {"prompt": [{"role": "user", "content": "What is 40 + 45?"}], "reference": "85", "row": "{}"}
TEXT_ROW = {"prompt": [{"role": "user", "content": "Capital of Italy?"}], "reference": "Rome", "row": "{}"}
KINDS = {  # rewards -> the gaming replies they pay for (flagged)
    "exact answer": ([{"kind": "exact"}], set()),
    "numeric answer": ([{"kind": "numeric"}], set()),
    "contains pays for a mention": ([{"kind": "contains"}], {"the reference in a negation", "every option listed",
                                                             "a number spray"}),
    "length from a minimum pays for padding": ([{"kind": "numeric"}, {"kind": "length", "min_chars": 100}],
                                               {"a padded reply at the length cap", REPEATED, "a number spray"}),
    "tags alone pay for empty tags": ([{"kind": "format", "preset": "think_answer"}],
                                      {"the tags with nothing in them"}),
    "a keyword anywhere": ([{"kind": "keyword", "words": ["answer"]}], {"a confident wrong answer",
                                                                        "the tags with nothing in them"}),
}


@pytest.mark.parametrize("specs, flagged", KINDS.values(), ids=KINDS.keys())
def test_each_kind_is_flagged_for_what_it_pays_for(specs, flagged, tokenizer):
    rewards = build_rewards([RewardSpec.from_dict(spec, policy=LAPTOP) for spec in specs], tokenizer=tokenizer, max_new_tokens=32, policy=LAPTOP)
    found = red_team(rewards, [ROW], 32, tokenizer)
    assert {check.name for check in found.flagged} == flagged, found.describe()
    assert len(found.checks) == 11


def test_text_answers_get_wrong_answers_of_their_own(tokenizer):
    rewards = build_rewards([RewardSpec.from_dict({"kind": "contains"}, policy=LAPTOP)], tokenizer=tokenizer, max_new_tokens=16, policy=LAPTOP)
    found = red_team(rewards, [TEXT_ROW, {**TEXT_ROW, "reference": "Paris"}], 16, tokenizer)
    examples = {check.name: check.example for check in found.checks}
    assert examples["the reference in a negation"] == "Not Rome, but Paris."
    assert examples["a confident wrong answer"] == "The answer is definitely Paris."
    assert len(tokenizer(examples["a padded reply at the length cap"], add_special_tokens=False)["input_ids"]) <= 16
    assert found.to_dict()["rows"] == 2


def test_the_red_team_stops_at_its_time_limit_or_when_cancelled(tokenizer):
    rewards = build_rewards([RewardSpec.from_dict({"kind": "numeric"}, policy=LAPTOP)], tokenizer=tokenizer, max_new_tokens=16, policy=LAPTOP)
    with pytest.raises(Stopped):
        red_team(rewards, [ROW], 16, tokenizer, time_limit_s=0)
    with pytest.raises(Stopped):
        red_team(rewards, [ROW], 16, tokenizer, should_stop=lambda: True)
    assert len(red_team(rewards, [ROW], 16, tokenizer, time_limit_s=60).checks) == 11


SHORT_AND_RIGHT = [{"kind": "exact"}, {"kind": "length", "name": "short", "max_chars": 20, "weight": 0.3}]


@pytest.mark.parametrize(("gate", "no_right", "flagged"), [
    (None, 0.9, True),  # most groups have no right reply: the short wrong one wins them
    (None, 0.1, False),  # few do: the rewards' shape matters little
    (None, None, False),  # no samples to say (the playground's red team): shown, not flagged
    ("exact", 0.9, False),  # paid only when right: a wrong answer earns nothing for its shape
])
def test_a_wrong_answer_that_wins_by_its_shape_is_judged_against_a_wrong_one(gate, no_right, flagged, tokenizer):
    settings = [dict(spec) for spec in SHORT_AND_RIGHT]
    if gate:
        settings[1]["only_when"] = gate
    rewards = build_rewards(parse_rewards(settings, policy=LAPTOP), tokenizer=tokenizer, max_new_tokens=16, policy=LAPTOP)
    found = red_team(rewards, [TEXT_ROW, {**TEXT_ROW, "reference": "Paris"}], 16, tokenizer, no_right=no_right)
    short = next(check for check in found.checks if check.name == "a short wrong answer")
    assert short.example == "Paris"
    # "The answer is definitely Paris." (31 characters) and "... Rome." (30) earn a little of short: 0.135, 0.15
    assert short.total == pytest.approx(0.0 if gate else 0.3)
    assert short.against_wrong == pytest.approx(0.0 if gate else 0.1425)
    assert short.flagged is flagged, found.describe()
    if flagged:
        assert short.paid_by == ["short"]
        assert "earns 0.16 more than the same wrong answer in a sentence, paid by short" in found.verdict
        assert "pay it only when exact passes (only_when: exact)" in found.verdict
