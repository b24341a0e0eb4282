"""The pre-flight ("will it learn?"): the rules table by table, then end to end on the tiny model and the command line."""

from __future__ import annotations

import csv
import dataclasses
import json
import threading
import time

import pytest
import yaml

from dragon_ui.cli import main
from dragon_ui.config import RunConfig
from dragon_ui.engine.models import ModelCache
from dragon_ui.engine.preflight import (MIN_PROMPTS, MOST_PROMPTS, Fix, Preflight, PromptCheck, RewardCheck, fixes_for,
                                        pass_mark, preflight, prompts_for_a_minute)
from dragon_ui.errors import ConfigError, Stopped
from dragon_ui.grpo_math import has_spread
from dragon_ui.rewards import RewardSpec, build_rewards
from dragon_ui.public import LAPTOP

pytestmark = pytest.mark.timeout(300)


def check(totals, passed: int | None = None, capped: int = 0, number: int = 1, reference: str = "12") -> PromptCheck:
    passed = sum(total is not None and total >= 0.5 for total in totals) if passed is None else passed
    return PromptCheck(number, f"prompt {number}", reference, list(totals), passed, capped, 40)


def report(checks, rewards=(), capped_tokens: int = 64, ended: str = "") -> Preflight:
    rewards = list(rewards) or [RewardCheck("answer", 0.5, 0.5, 0.0)]
    return Preflight(list(checks), rewards, len(checks[0].totals), capped_tokens, 512, 10.0, 3.0, ended)


GROUPS = {  # totals of one group -> its kind
    "all right": ([1.0, 1.0, 1.0, 1.0], "all pass"),
    "all wrong": ([0.0, 0.0, 0.0, 0.0], "all fail"),
    "one right": ([1.0, 0.0, 0.0, 0.0], "spread"),
    "partly right, all the same": ([0.3, 0.3, 0.3, 0.3], "all fail"),
    "differing only by rounding": ([1.3, 1.3 + 1e-9, 1.3, 1.3], "all pass"),
    "a reward failed on some": ([None, 0.0, 0.0, None], "all fail"),
}


@pytest.mark.parametrize("totals, kind", GROUPS.values(), ids=GROUPS.keys())
def test_a_group_is_learned_from_only_with_a_spread_and_is_otherwise_too_hard_or_too_easy(totals, kind):
    assert check(totals).kind == kind
    assert (kind == "spread") == has_spread(totals)  # one definition of "no spread", training's


VERDICTS = {  # groups -> words the verdict says
    "hard": ([[0, 0], [0, 0], [0, 0], [1, 0]], "75 % of groups have no spread (4 prompts, 2 replies each): 75 % all "
                                               "fail. Hard for this model. Only 25 % of the groups teach, so it learns "
                                               "slowly if at all. Give partial credit"),
    "too hard": ([[0, 0]] * 9 + [[1, 0]], "90 % of groups have no spread (10 prompts, 2 replies each): 90 % all fail. "
                                          "Too hard for this model. Give partial credit"),
    "mostly too easy": ([[1, 1], [1, 1], [1, 1], [0, 1]], "75 % of groups have no spread (4 prompts, 2 replies each): "
                                                          "75 % all pass. Mostly too easy: most replies already earn "
                                                          "the reward. Only 25 % of the groups teach"),
    "too easy": ([[1, 1]] * 10, "100 % of groups have no spread (10 prompts, 2 replies each): 100 % all pass. Too easy: "
                                "most replies already earn the reward. Drop those prompts"),
    "can learn": ([[1, 0], [0, 1], [1, 0], [1, 1]], "It can learn: 75 % of groups have a spread to learn from (4 prompts, "
                                                    "2 replies each; 0 % all fail, 25 % all pass)."),
}


@pytest.mark.parametrize("groups, words", VERDICTS.values(), ids=VERDICTS.keys())
def test_the_verdict_says_which_and_gives_the_numbers(groups, words):
    found = report([check(group, number=n) for n, group in enumerate(groups)])
    assert found.verdict.startswith(words), found.verdict


def test_the_verdict_adds_cut_off_replies_and_rewards_that_fail_or_never_vary():
    found = report([check([1, 0], capped=1), check([0, 1], capped=1)],
                   [RewardCheck("answer", 0.5, 0.5, 0.0), RewardCheck("broken", 0.0, 0.0, 0.5),
                    RewardCheck("format", 1.0, 0.0, 0.0), RewardCheck("accuracy", 0.0, 0.0, 0.0, trained=False)],
                   ended="Sampling stopped at the time limit.")
    verdict = found.verdict
    assert "50 % of replies are cut off at max new tokens (64)" in verdict
    assert "The reward broken failed on 50 % of replies" in verdict
    assert "The reward format gave every reply 1: it teaches nothing here." in verdict
    assert "The reward answer" not in verdict
    assert "accuracy" not in verdict  # a metric teaches nothing whatever it scores: not worth a sentence
    assert verdict.endswith("Sampling stopped at the time limit.")


def test_the_prompts_are_ranked_hardest_first_and_the_report_is_json():
    found = report([check([1, 1], number=3), check([0, 0], number=7), check([1, 0], number=5)])
    assert [c.number for c in found.ranked()] == [7, 5, 3]
    data = json.loads(json.dumps(found.to_dict()))
    assert [p["number"] for p in data["prompts"]] == [7, 5, 3] and data["prompts"][0]["kind"] == "all fail"
    assert data["no_spread"] == pytest.approx(2 / 3) and data["verdict"] == found.verdict
    assert "row 7: 0 % (all fail)" in found.describe()


MARKS = {  # rewards -> the total a reply must reach to pass
    "one reward": ([{"kind": "numeric"}], 0.5),
    "weighted": ([{"kind": "numeric", "weight": 2}, {"kind": "length", "max_chars": 9, "weight": 0.4}], 1.2),
    "a penalty adds no marks": ([{"kind": "numeric"}, {"kind": "repetition", "weight": 1}], 0.5),
    "only penalties": ([{"kind": "repetition"}], 0.0),
}


@pytest.mark.parametrize("specs, mark", MARKS.values(), ids=MARKS.keys())
def test_a_reply_passes_at_half_the_full_marks(specs, mark, tiny_model_dir):
    from dragon_ui.engine.models import load_tokenizer, resolve_model
    from dragon_ui.config import ModelConfig

    tokenizer = load_tokenizer(resolve_model(ModelConfig(id=str(tiny_model_dir))))
    rewards = build_rewards([RewardSpec.from_dict(spec, policy=LAPTOP) for spec in specs], tokenizer=tokenizer, max_new_tokens=16, policy=LAPTOP)
    assert pass_mark(rewards) == pytest.approx(mark)


SIZES = {  # (generation seconds a step, training prompts, batch size) -> prompts sampled
    "slow: at least 16": ((30.0, 500, 4), MIN_PROMPTS),
    "a minute's worth, in whole steps": ((2.0, 500, 4), 120),
    "rounded up to whole steps": ((7.0, 500, 3), 27),
    "fast: at most 256": ((0.01, 5000, 4), MOST_PROMPTS),
    "no more than there are": ((2.0, 10, 4), 10),
    "unknown speed: 16": ((None, 500, 4), MIN_PROMPTS),
}


@pytest.mark.parametrize("given, count", SIZES.values(), ids=SIZES.keys())
def test_the_default_sample_takes_about_a_minute(given, count, tiny_config_dict):
    seconds, available, batch = given
    config = RunConfig.from_dict({**tiny_config_dict, "training": {"batch_size": batch}}, policy=LAPTOP)
    assert prompts_for_a_minute(config, seconds, available) == count


def fixes(groups, tiny_config_dict, references=("12",), **grpo) -> list[Fix]:
    config = RunConfig.from_dict({**tiny_config_dict, "grpo": {**tiny_config_dict["grpo"], **grpo}}, policy=LAPTOP)
    checks = [check(group, number=n, reference=references[n % len(references)])
              for n, group in enumerate(groups, start=1)]
    return fixes_for(report(checks), config)


def test_too_hard_offers_a_warmer_temperature_and_partial_credit(tiny_config_dict):
    warmer, partial, drop = fixes([[0, 0], [0, 0], [1, 0]], tiny_config_dict)
    assert warmer.settings == {"grpo": {"temperature": 1.3}} and not warmer.add_rewards
    assert warmer.as_command_line() == "--set grpo.temperature=1.3"
    warmed = warmer.applied_to(tiny_config_dict)
    assert warmed["grpo"] == {**tiny_config_dict["grpo"], "temperature": 1.3}
    assert warmed["rewards"] == tiny_config_dict["rewards"] and tiny_config_dict["grpo"].get("temperature") is None
    added = partial.applied_to(warmed)
    assert added["rewards"] == [*tiny_config_dict["rewards"], {"kind": "numeric", "name": "close_number",
                                                               "extract": "last_number", "tolerance": 0.05,
                                                               "weight": 0.5}]
    assert added["grpo"]["temperature"] == 1.3  # each fix applies to the settings as they are by then
    assert partial.applied_to(added)["rewards"] == added["rewards"]  # applied twice, it adds the reward once
    assert "add under rewards" in partial.as_command_line()
    assert drop.label == "Drop the prompts that all fail or all pass (2)"
    assert drop.settings == {"data": {"pass_rates": {"1": 0.0, "2": 0.0, "3": 0.5}, "min_pass_rate": 0.01,
                                      "max_pass_rate": 0.99}}
    assert drop.as_command_line() == ("--set 'data.pass_rates={\"1\": 0.0, \"2\": 0.0, \"3\": 0.5}' "
                                      "--set data.min_pass_rate=0.01 --set data.max_pass_rate=0.99")
    dropped = drop.applied_to(added)
    assert dropped["data"] == {**tiny_config_dict["data"], **drop.settings["data"]}
    RunConfig.from_dict(dropped, policy=LAPTOP)  # what the fixes write is a valid run


def test_partial_credit_for_text_answers_is_contains(tiny_config_dict):
    partial = fixes([[0, 0], [0, 0]], tiny_config_dict, references=("Paris", "Rome"))[-1]
    assert partial.add_rewards == [{"kind": "contains", "name": "mentions_answer", "weight": 0.5}]


FEW_FIXES = {  # what the pre-flight found -> the fixes' labels
    "it can learn": (([[1, 0], [0, 1]], {}), []),
    "it can learn, and one prompt all passes": (([[1, 0], [0, 1], [1, 1]], {}),
                                                ["Drop the prompts that all fail or all pass (1)"]),
    "too easy: no partial credit": (([[1, 1], [1, 1]], {}), ["Raise the temperature to 1.3"]),  # nothing left to keep
    "warm already": (([[0, 0], [0, 0]], {"temperature": 1.5}), ["Add partial credit (close_number)"]),
    "nearly warm enough": (([[0, 0], [0, 0]], {"temperature": 1.4}), ["Raise the temperature to 1.5",
                                                                       "Add partial credit (close_number)"]),
}


def test_dropping_every_sampled_prompt_is_offered_while_other_training_rows_stay(tiny_config_dict):
    config = RunConfig.from_dict(tiny_config_dict, policy=LAPTOP)
    checks = [check([0, 0], number=n) for n in (4, 9)]
    assert [fix.label for fix in fixes_for(dataclasses.replace(report(checks), training_prompts=2), config)][-1:] \
        != ["Drop the prompts that all fail or all pass (2)"]  # nothing would be left to train on
    drop = fixes_for(dataclasses.replace(report(checks), training_prompts=24), config)[-1]
    assert drop.label == "Drop the prompts that all fail or all pass (2)"
    assert drop.why.endswith("; the 22 training rows not sampled stay.")
    assert drop.settings["data"]["pass_rates"] == {"4": 0.0, "9": 0.0}


def test_no_prompt_whose_group_has_a_spread_is_dropped(tiny_config_dict):
    """Partial credit separates replies that all fail: such a group teaches, though its pass rate is 0. Leaving out
    the rows by pass rate would leave it out too, so the drop is not offered (the too_hard lesson's fixed run)."""
    config = RunConfig.from_dict(tiny_config_dict, policy=LAPTOP)
    nearly = check([0.25, 0.0], number=4)  # close_number paid one reply, none passed
    assert nearly.kind == "spread" and nearly.pass_rate == 0.0
    found = dataclasses.replace(report([nearly, check([0, 0], number=9), check([1, 0], number=12)]),
                                training_prompts=24)
    assert not [fix for fix in fixes_for(found, config) if fix.label.startswith("Drop")]


@pytest.mark.parametrize("found, labels", FEW_FIXES.values(), ids=FEW_FIXES.keys())
def test_only_the_fixes_that_apply_are_offered(found, labels, tiny_config_dict):
    groups, grpo = found
    assert [fix.label for fix in fixes(groups, tiny_config_dict, **grpo)] == labels


# ----------------------------------------------------------------------------------------------------------------
# End to end, on the tiny model.


def test_a_preflight_samples_the_runs_groups_and_reports(tiny_config_dict):
    config = RunConfig.from_dict(tiny_config_dict, policy=LAPTOP)
    progress = []
    found = preflight(config, ModelCache().load, prompts=5, on_progress=lambda done, total: progress.append((done, total)), policy=LAPTOP)
    assert progress == [(2, 5), (4, 5), (5, 5)]  # a step's batch of prompts at a time
    assert len(found.prompts) == 5 and all(len(c.totals) == config.grpo.group_size for c in found.prompts)
    assert all(0 <= c.longest_tokens <= found.token_limit for c in found.prompts)
    assert {reward.name for reward in found.rewards} == {"numeric", "length"}
    assert found.step_s is not None and found.sampling_s > 0 and found.verdict
    again = preflight(config, ModelCache().load, prompts=5, policy=LAPTOP)
    assert [c.number for c in again.prompts] == [c.number for c in found.prompts]  # drawn with the run's seed
    with open(config.data.source, newline="", encoding="utf-8") as file:
        questions = [row["question"] for row in csv.DictReader(file)]
    assert all(c.prompt == questions[c.number - 1] for c in found.prompts)  # numbered by their row in the file


def test_a_preflight_can_be_cancelled(tiny_config_dict):
    asked = []

    def cancel_after_a_while() -> bool:
        asked.append(1)
        return len(asked) > 3

    with pytest.raises(Stopped):
        preflight(RunConfig.from_dict(tiny_config_dict, policy=LAPTOP), ModelCache().load, prompts=6, should_stop=cancel_after_a_while, policy=LAPTOP)


def test_the_command_line_prints_the_verdict(tiny_config_dict, tmp_path, capsys):
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(tiny_config_dict), encoding="utf-8")
    assert main(["check", str(path), "--preflight", "--prompts", "4"]) == 0
    out = capsys.readouterr().out
    assert "Red team: " in out and "a short wrong answer" in out
    assert out.count("Red team:") == 1  # the pre-flight's, on the prompts it sampled: check's own is not repeated
    assert out.index("Red team:") > out.index("Pre-flight: sampling")
    assert "Pre-flight: sampling" in out and "4 of 4 prompts sampled" in out
    assert "% of groups" in out and "Prompts, hardest first" in out
    assert main(["check", str(path), "--preflight", "--prompts", "0"]) == 2
    assert "--prompts must be at least 1." in capsys.readouterr().err


def test_the_check_names_the_goal_and_a_reward_that_cannot_pay(tiny_config_dict, tmp_path, capsys):
    rows = "\n".join(f"What is the capital of {country}?,{city}" for country, city in
                     [("France", "Paris"), ("Italy", "Rome"), ("Japan", "Tokyo")] * 8)
    (tmp_path / "capitals.csv").write_text(f"question,answer\n{rows}\n", encoding="utf-8")
    config = {**tiny_config_dict, "data": {**tiny_config_dict["data"], "source": str(tmp_path / "capitals.csv")},
              "rewards": [{"kind": "numeric"}, {"kind": "length", "max_chars": 20, "weight": 0.3}]}
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    assert main(["check", str(path)]) == 0  # it can start: the warning does not stop it
    out = capsys.readouterr().out
    assert "Rewards: numeric, length (the goal: numeric)" in out
    assert ("Warning: `numeric` (numeric) cannot pay on this data: the reference answer contains no number, on all "
            "24 references checked, so no reply can earn it. Use exact or contains instead") in out


def test_a_fix_applies_only_what_the_last_preflight_offered(tiny_config_dict):
    from dragon_ui.studio.preflight_view import apply_fix

    warmer = Fix("Raise the temperature to 1.3", "why", settings={"grpo": {"temperature": 1.3}})
    draft, said = apply_fix(tiny_config_dict, [warmer], 0)
    assert draft["grpo"]["temperature"] == 1.3 and said.startswith("Applied the pre-flight's fix: Raise the temp")
    for found, number in (([], 0), ([warmer], 1), ([warmer], -1), (None, 0)):
        with pytest.raises(ConfigError, match="There is no such fix"):
            apply_fix(tiny_config_dict, found, number)


def test_one_preflight_runs_at_a_time_and_none_beside_a_training(studio, tiny_config_dict, monkeypatch):
    """A pre-flight gradio has cancelled may still be sampling: a second one is refused until it ends, rather than
    run beside it; and none starts (reading its data) while a training uses the CPU."""
    from dragon_ui.errors import BusyError
    from dragon_ui.studio import backend

    started, release = threading.Event(), threading.Event()

    def slow(*args, **kwargs):
        started.set()
        release.wait(30)
        return "report"

    monkeypatch.setattr(backend, "preflight", slow)
    first = threading.Thread(target=studio.preflight, args=(tiny_config_dict,))
    first.start()
    assert started.wait(30)
    with pytest.raises(BusyError, match="A pre-flight or a dry run is running on this machine already; a pre-f"):
        studio.preflight(tiny_config_dict)
    with pytest.raises(BusyError, match="already; a dry run beside it would slow both down"):
        studio.measure_step(tiny_config_dict)  # a step measured beside the sampling would take too long
    release.set()
    first.join(30)
    assert studio.preflight(tiny_config_dict) == "report"  # free again once it ended

    def training(doing):
        raise BusyError(f"A training is running on this machine; {doing} now would slow it down badly.")

    monkeypatch.setattr(studio.previews, "refuse_while_training", training)
    with pytest.raises(BusyError, match="a pre-flight now would slow it down"):
        studio.preflight(tiny_config_dict)


def test_cancel_reaches_the_preflights_thread_at_once(tiny_config_dict):
    """gradio closes a cancelled generator only once it yields, and the thread may be loading a model or sampling a
    batch meanwhile: Cancel sets the session's stop flag itself, so the sampling ends at its next token."""
    from types import SimpleNamespace

    from dragon_ui.ui import preflight_section as panel

    asked, ended = threading.Event(), threading.Event()

    class Sampling:
        def preflight(self, draft, should_stop, on_progress):
            asked.set()
            while not should_stop():
                time.sleep(0.01)
            ended.set()
            raise Stopped("cancelled")

    shown = panel.checked(Sampling(), tiny_config_dict, "session-a")
    said, _, cancel, *_ = next(shown)
    assert "Reading the data" in said and cancel.visible is True  # Cancel shows while it runs
    assert asked.wait(30)
    panel.cancel_preflight(SimpleNamespace(session_hash="session-b"))  # another session's Cancel: not this one
    assert not ended.wait(0.3)
    said, button = panel.cancel_preflight(SimpleNamespace(session_hash="session-a"))
    assert "Cancelled" in said and button.visible is False
    assert ended.wait(5)
    shown.close()
    assert "session-a" not in panel._running
