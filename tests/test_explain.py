"""The explain panel's numbers: recomputed from the scores a run wrote and checked against the advantages TRL logged
(real tiny runs, one per way of scaling rewards), and its words on recorded groups (table-driven)."""

from __future__ import annotations

import json
import statistics

import gradio as gr
import pytest

from dragon_ui.config import LOSS_TYPES, RunConfig
from dragon_ui.engine import training
from dragon_ui.public import LAPTOP
from dragon_ui.runstore import RunDir
from dragon_ui.studio import explain
from dragon_ui.ui import train_tab

pytestmark = pytest.mark.timeout(300)


@pytest.mark.parametrize("scale_rewards, loss_type, aggregation", [
    ("group", "dapo", "sum_then_normalize"), ("batch", "grpo", "sum_then_normalize"),
    ("none", "dr_grpo", "sum_then_normalize"), ("group", "dapo", "normalize_then_sum")])
def test_every_groups_advantages_are_the_ones_trl_logged(tiny_config_dict, scale_rewards, loss_type, aggregation):
    tiny_config_dict["grpo"].update(group_size=3, scale_rewards=scale_rewards, loss_type=loss_type,
                                    multi_objective_aggregation=aggregation)
    # Paid by the character below 12, the tiny model's short random replies all score differently.
    tiny_config_dict["rewards"][1] = {"kind": "length", "min_chars": 12, "weight": 0.3}
    run = training.train_config(RunConfig.from_dict(tiny_config_dict, policy=LAPTOP), policy=LAPTOP)
    assert run.read_status()["state"] == "succeeded", run.read_status().get("error")
    checked = 0
    for rollout in run.read_rollouts():
        for number in range(1, len(rollout["groups"]) + 1):
            explained = explain.explain_run_group(run, rollout["step"], number)
            assert explained.scale_rewards == scale_rewards and explained.loss_type == loss_type
            assert explained.aggregation == aggregation
            assert explained.agrees is True, (explained.largest_difference, explained.completions)
            assert len(explained.completions) == 3 and explained.kl is not None
            checked += not explained.no_spread
    assert checked == 4  # every group (2 steps of 2 prompts); groups whose scores differ, so the advantages are not all zero


def group(*totals: float, advantages: list[float] | None = None, reference: str = "42") -> dict:
    """A recorded group whose only reward is 'numeric' (weight 1), so each total is its score."""
    advantages = advantages or [0.0] * len(totals)
    return {"prompt": "What is 40 + 2?", "reference": reference,
            "completions": [{"text": f"reply {i}", "scores": {"numeric": total}, "total": total, "advantage": adv}
                            for i, (total, adv) in enumerate(zip(totals, advantages))]}


def config(scale_rewards: str = "group", loss_type: str = "dapo", beta: float = 0.04) -> dict:
    return {"rewards": [{"kind": "numeric", "name": "numeric", "weight": 1.0}],
            "grpo": {"scale_rewards": scale_rewards, "loss_type": loss_type, "beta": beta}}


# TRL's formula by hand: totals (1, 0, 0, 1) have mean 0.5 and sample std 0.5774 (Bessel), so A = ±0.5/0.5775.
HALF = 0.5 / (0.57735 + 1e-4)


@pytest.mark.parametrize("totals, scale, expected, up, down", [
    ((1.0, 0.0, 0.0, 1.0), "group", [HALF, -HALF, -HALF, HALF], [1, 4], [2, 3]),
    ((1.0, 0.0, 0.0, 1.0), "none", [0.5, -0.5, -0.5, 0.5], [1, 4], [2, 3]),
    ((1.0, 1.0, 1.0, 1.0), "group", [0.0] * 4, [], []),
    ((0.3, 0.3000000000000001, 0.29999999999999993), "group", [0.0] * 3, [], []),  # float noise is no spread
    ((2.0, 0.0), "group", [1 / (1.41421 + 1e-4), -1 / (1.41421 + 1e-4)], [1], [2]),
])
def test_advantages_follow_trls_formula(totals, scale, expected, up, down):
    explained = explain.explain_group({"step": 3, "groups": [group(*totals)]}, 1, config(scale))
    assert [c.advantage for c in explained.completions] == pytest.approx(expected, abs=1e-4)
    assert [c.number for c in explained.completions if c.direction == "up"] == up
    assert [c.number for c in explained.completions if c.direction == "down"] == down


def test_batch_scaling_divides_by_the_spread_of_the_whole_step():
    rollout = {"step": 1, "groups": [group(1.0, 0.0), group(1.0, 1.0)]}
    explained = explain.explain_group(rollout, 1, config("batch"))
    step_std = 0.5  # of (1, 0, 1, 1), Bessel-corrected: √(0.75 / 3)
    assert explained.completions[0].advantage == pytest.approx(0.5 / (step_std + 1e-4), abs=1e-4)
    assert "spread of the whole step" in " ".join(explain.plain_words(explained))


def test_a_group_where_every_score_is_the_same_says_why_nothing_is_learned():
    words = " ".join(explain.plain_words(explain.explain_group({"step": 1, "groups": [group(1.0, 1.0, 1.0)]}, 1,
                                                                 config())))
    assert "All 3 completions scored the same weighted total, 1.00" in words
    assert "every advantage is 0" in words and "give partial credit" in words


def test_the_words_say_which_completions_go_up_and_down_and_what_beta_adds():
    rollout = {"step": 5, "groups": [group(1.0, 0.0, 0.0, 1.0, advantages=[HALF, -HALF, -HALF, HALF])]}
    explained = explain.explain_group(rollout, 1, config(beta=0.04), kl=0.25)
    words = " ".join(explain.plain_words(explained))
    assert "completions 1 and 4 scored above the mean, so the step makes replies like them more likely" in words
    assert "completions 2 and 3 scored below it, so the step makes replies like them less likely" in words
    one_down = {"step": 5, "groups": [group(1.0, 1.0, 0.0, advantages=[HALF, HALF, -2 * HALF])]}
    words_one = " ".join(explain.plain_words(explain.explain_group(one_down, 1, config())))
    assert "completion 3 scored below it, so the step makes replies like it less likely" in words_one
    assert "Beta is 0.04" in words and "This step's KL was 0.25, so the pull costs about 0.010 per token" in words
    assert "match the ones TRL logged" in words and explained.agrees is True
    tiny = explain.explain_group(rollout, 1, config(beta=0.04), kl=0.0012)
    assert "KL was 0.0012, so the pull costs about 0.000048 per token" in " ".join(explain.plain_words(tiny))
    assert "Beta is 0: nothing pulls" in " ".join(explain.plain_words(
        explain.explain_group(rollout, 1, config(beta=0.0))))


def test_a_group_that_called_tools_says_the_loss_leaves_the_tools_answers_out():
    rollout = {"step": 5, "groups": [group(1.0, 0.0, advantages=[0.7071, -0.7071])]}
    called = {"role": "assistant", "text": "", "calls": [{"name": "calculator", "arguments": {"expression": "2*3"}}]}
    rollout["groups"][0]["completions"][0]["turns"] = [called, {"role": "tool", "name": "calculator", "text": "6"},
                                                       {"role": "assistant", "text": "6", "calls": []}]
    explained = explain.explain_group(rollout, 1, config())
    assert explained.tool_calls == 1
    assert "called tools 1 time. The loss sees only the model's own tokens" in " ".join(explain.plain_words(explained))
    rollout["groups"][0]["completions"][0].pop("turns")
    assert "tools" not in " ".join(explain.plain_words(explain.explain_group(rollout, 1, config())))


def test_advantages_that_differ_from_trls_are_reported_not_hidden():
    rollout = {"step": 5, "groups": [group(1.0, 0.0, advantages=[0.3, -0.3])]}
    explained = explain.explain_group(rollout, 1, config())
    assert explained.agrees is False
    assert "differ from the ones TRL logged" in " ".join(explain.plain_words(explained))


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_every_loss_type_is_explained_in_words_and_as_a_formula(loss_type):
    explained = explain.explain_group({"step": 1, "groups": [group(1.0, 0.0)]}, 1, config(loss_type=loss_type))
    assert explain.LOSS_WEIGHTING[loss_type] in " ".join(explain.plain_words(explained))
    formula = explain.formula_lines(explained)
    assert formula[0].startswith("r_i = 1 × s_numeric") and explain.LOSS_FORMULA[loss_type] in formula


@pytest.mark.parametrize("number", [0, 2, -1])
def test_a_group_that_is_not_there_is_refused_in_words(number):
    with pytest.raises(explain.ExplainError, match="there is no group"):
        explain.explain_group({"step": 1, "groups": [group(1.0, 0.0)]}, number, config())


def test_one_steps_record_is_found_without_reading_a_line_still_being_written(tmp_path):
    run = RunDir(tmp_path)
    for step in (1, 2, 12):
        run.append_rollouts({"step": step, "groups": [group(float(step), 0.0)]})
    with open(run.rollouts_path, "a", encoding="utf-8") as handle:
        handle.write(json.dumps({"step": 13, "groups": []})[:-3])  # a writer half-way through its line
    assert explain.read_step_rollout(run, 12)["groups"][0]["completions"][0]["total"] == 12.0
    assert explain.read_step_rollout(run, 1)["step"] == 1
    assert explain.read_step_rollout(run, 13) is None and explain.read_step_rollout(run, 3) is None


def test_the_panel_escapes_what_the_run_wrote_and_shows_the_formula_on_request():
    hostile = group(1.0, 0.0, advantages=[0.707, -0.707])
    hostile["prompt"] = "<script>alert(1)</script>"
    hostile["reference"] = "<img src=x onerror=alert(2)>"
    explained = explain.explain_group({"step": 2, "groups": [hostile]}, 1, config())
    panel = train_tab.explanation_html(explained)
    assert "<script>" not in panel and "<img" not in panel and "&lt;script&gt;" in panel
    assert "<details><summary>Show the formula</summary>" in panel and "A_i = (r_i − mean) / (std + 0.0001)" in panel
    assert "↑ more likely" in panel and "↓ less likely" in panel and "1.00 × 1" in panel


class Event:
    def __init__(self, data):
        self._data = data


@pytest.mark.parametrize("data", [None, "x", [], {"step": "1", "group": 1}, {"step": 1, "group": 0},
                                  {"step": True, "group": 1}, {"step": -1, "group": 1}, {"step": 1.5, "group": 1},
                                  {"step": 10**12, "group": 1}, {"step": 1}, {"close": "yes"},
                                  {"step": 1, "group": train_tab.MAX_GROUPS_SHOWN + 1}])
def test_a_click_with_made_up_numbers_is_answered_in_a_sentence(studio, data):
    with pytest.raises(gr.Error, match="under a group of completions"):
        train_tab.explain_clicked(studio, "", {}, Event(data))


def test_a_click_on_a_run_or_step_that_is_not_there_is_answered_in_a_sentence(studio, tmp_path):
    with pytest.raises(gr.Error, match="There is no run"):
        train_tab.explain_clicked(studio, "../../etc", {}, Event({"step": 1, "group": 1}))
    run = listed_run(studio, "explained")
    run.append_rollouts({"step": 1, "groups": [group(1.0, 0.0)]})
    with pytest.raises(gr.Error, match="no completions recorded for group 2 of step 1"):
        train_tab.explain_clicked(studio, run.id, {}, Event({"step": 1, "group": 2}))
    with pytest.raises(gr.Error, match="no completions recorded for group 1 of step 3"):
        train_tab.explain_clicked(studio, run.id, {}, Event({"step": 3, "group": 1}))


def test_the_explanation_opens_under_its_group_and_holds_the_step_until_closed(studio):
    """It answered below the fourth group, far from the button pressed under the first."""
    run = listed_run(studio, "explained")
    for step in (1, 2):
        run.append_rollouts({"step": step, "groups": [group(float(step), 0.0), group(0.0, 1.0), group(1.0, 1.0)]})
    run.update_status(state="running", step=2)
    shown = train_tab.refresh(studio, run.id, {})
    assert "<b>Step 2</b>" in shown.rollouts and shown.reading is None

    rollouts, reading = train_tab.explain_clicked(studio, run.id, shown.watch, Event({"step": 1, "group": 2}))
    assert reading == {"run_id": run.id, "step": 1, "group": 2} and "<b>Step 1</b>" in rollouts
    groups = rollouts.split("class='rollout-group'")[1:]
    assert [("explain-panel" in part) for part in groups] == [False, True, False]  # under group 2, not below all
    assert "Step 1, group 2: what did this step do?" in groups[1] and "explain-close" in groups[1]
    assert "group 2)</button>" not in rollouts and "group 1)</button>" in rollouts  # its button gives way to it

    run.append_rollouts({"step": 3, "groups": [group(3.0, 0.0)]})  # a new step while it is read: the view holds
    run.update_status(state="running", step=3)
    held = train_tab.refresh(studio, run.id, shown.watch, reading=reading)
    assert skipped(held.rollouts) and skipped(held.reading) and "step 3" in held.banner_text
    closed, reading = train_tab.explain_clicked(studio, run.id, held.watch, Event({"close": True}))
    assert reading is None and "<b>Step 3</b>" in closed and "explain-panel" not in closed
    other = train_tab.refresh(studio, run.id, held.watch, full=True, reading={**reading_of(run), "run_id": "x"})
    assert "<b>Step 3</b>" in other.rollouts and other.reading is None  # another run shown: nothing held


def listed_run(studio, name: str) -> RunDir:
    """A run the studio lists: its config and status written."""
    run = RunDir.create(studio.runs_dir, name)
    (run.path / "config.json").write_text(json.dumps(config()), encoding="utf-8")
    run.update_status(state="succeeded")
    return run


def skipped(value) -> bool:
    return isinstance(value, dict) and value == gr.skip()


def reading_of(run) -> dict:
    return {"run_id": run.id, "step": 1, "group": 1}


def test_a_group_whose_totals_overflow_is_answered_in_the_panel(studio, monkeypatch):
    """Weights may be as large as a float allows, and so may the totals a run writes (a visitor's own run)."""
    huge = {"step": 1, "groups": [{"prompt": "p", "reference": "r", "completions": [
        {"text": "a", "scores": {"a": 1.0}, "total": 1e308, "advantage": 0.0}] * 2}]}
    run = listed_run(studio, "huge")
    run.append_rollouts(huge)
    monkeypatch.setattr(train_tab, "explain_run_group", lambda run, step, group: explain.explain_group(
        huge, group, {"rewards": [{"name": "a", "weight": 1e308}]}))
    rollouts, _ = train_tab.explain_clicked(studio, run.id, {}, Event({"step": 1, "group": 1}))
    assert "too large to work out" in rollouts.split("explain-panel")[1]


def test_gdpo_normalises_each_reward_in_its_group_before_adding_them_up():
    """normalize_then_sum by hand: a reward whose scores differ by 0.01 moves the advantage as much as one whose
    scores differ by 1, where the plain weighted total would hardly notice it."""
    scores = [{"big": 1.0, "tiny": 0.0}, {"big": 0.0, "tiny": 0.01}, {"big": 1.0, "tiny": 0.01}]
    completions = [{"text": str(i), "scores": s, "total": s["big"] + 0.5 * s["tiny"], "advantage": 0.0}
                   for i, s in enumerate(scores)]
    rollout = {"step": 1, "groups": [{"prompt": "p", "reference": "", "completions": completions}]}
    settings = {"rewards": [{"name": "big", "kind": "numeric", "weight": 1.0},
                            {"name": "tiny", "kind": "length", "weight": 0.5}],
                "grpo": {"multi_objective_aggregation": "normalize_then_sum", "beta": 0.0}}
    explained = explain.explain_group(rollout, 1, settings)

    def normalised(values):
        return [(v - statistics.fmean(values)) / (statistics.stdev(values) + 1e-4) for v in values]

    sums = [b + 0.5 * t for b, t in zip(normalised([1.0, 0.0, 1.0]), normalised([0.0, 0.01, 0.01]))]
    expected = [(v - statistics.fmean(sums)) / (statistics.stdev(sums) + 1e-4) for v in sums]
    assert [c.advantage for c in explained.completions] == pytest.approx(expected, rel=1e-9)
    assert expected[2] > expected[0] + 0.5  # the 0.01 of 'tiny' matters
    assert "normalize_then_sum" in " ".join(explain.plain_words(explained))
    assert explain.formula_lines(explained)[1] == ("r_i = 1 × z_big + 0.5 × z_tiny   (the weighted sum of "
                                                   "completion i's normalised scores)")


def test_a_gated_reward_says_when_it_pays_in_the_formula():
    gated = config()
    gated["rewards"] = [{"kind": "exact", "name": "exact"},
                        {"kind": "length", "name": "short", "max_chars": 20, "weight": 0.3, "only_when": "exact"}]
    rollout = {"step": 2, "groups": [{"prompt": "Opposite of hot?", "reference": "cold", "completions": [
        {"text": "cold", "scores": {"exact": 1.0, "short": 1.0}, "total": 1.3},
        {"text": "warm", "scores": {"exact": 0.0, "short": 0.0}, "total": 0.0}]}]}
    explained = explain.explain_group(rollout, 1, gated)
    assert explained.gates == {"short": "exact passes"}
    assert explain.formula_lines(explained)[0] == ("r_i = 1 × s_exact + 0.3 × s_short   (the weighted total of "
                                                   "completion i; s_short is 0 unless exact passes (its only_when))")


def test_a_steps_spread_is_said_reward_by_reward_with_the_goals_share():
    """Two groups: in the first only short separates the replies (no reply is right), in the second exact does and
    short pulls the same way."""
    trap = {"rewards": [{"kind": "exact", "name": "exact"},
                        {"kind": "length", "name": "short", "max_chars": 20, "weight": 0.5}]}
    rollout = {"step": 3, "groups": [
        {"completions": [{"scores": {"exact": 0.0, "short": 1.0}}, {"scores": {"exact": 0.0, "short": 0.0}}]},
        {"completions": [{"scores": {"exact": 1.0, "short": 1.0}}, {"scores": {"exact": 0.0, "short": 0.0}}]},
        {"completions": [{"scores": {"exact": 0.0, "short": 0.0}}, {"scores": {"exact": 0.0, "short": 0.0}}]}]}
    # group 2: totals 1.5 and 0, mean 0.75; exact's part 1 × 0.5 × 0.75 × 2 / (2 × 0.75²) = 2/3, short's 1/3
    assert explain.step_spread(rollout, trap) == (
        "This step's spread came from short 67 % (only it separated 1), exact 33 %, over the 2 of 3 groups with a "
        "spread. The goal, exact, separated the replies in 1 of them.")
    assert explain.step_spread({"step": 1, "groups": [rollout["groups"][2]]}, trap) == ""


def test_a_setting_a_stored_config_lacks_is_the_configs_default():
    """An older or hand-written config.json without grpo.beta trained with the config's default (0.04), not 0."""
    from dragon_ui.config import GRPOSettings
    rollout = {"step": 5, "groups": [group(1.0, 0.0, 0.0, 1.0, advantages=[HALF, -HALF, -HALF, HALF])]}
    explained = explain.explain_group(rollout, 1, {"rewards": config()["rewards"], "grpo": {}}, kl=0.25)
    defaults = GRPOSettings()
    assert (explained.beta, explained.loss_type, explained.scale_rewards, explained.aggregation) == (
        defaults.beta, defaults.loss_type, defaults.scale_rewards, defaults.multi_objective_aggregation)
    assert explained.beta == 0.04
