"""Runs side by side (dragon_ui.experiments, the Experiments tab): the leaderboard, the settings that differ, the
overlaid curves and the CSV, from run folders written as training writes them."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from dragon_ui import public
from dragon_ui.config import RunConfig
from dragon_ui.runstore import RunDir, write_json_atomic
from dragon_ui import experiments
from dragon_ui.ui import plots
from dragon_ui.ui import experiments_tab
from dragon_ui.ui.experiments_tab import CHARTS
from dragon_ui.public import LAPTOP
from conftest import handler, tiny_config


def make_run(runs_dir: Path, run_id: str, config: dict, status: dict, progress: list[dict] = (),
             heldout: list[tuple[int, float]] = ()) -> RunDir:
    """A run folder as training leaves it: its validated config, its status, a progress row per step, a held-out
    check (step, reward) now and then."""
    run = RunDir(runs_dir / run_id)
    run.path.mkdir(parents=True)
    run.write_config(RunConfig.from_dict(config, policy=LAPTOP))
    write_json_atomic(run.status_path, status)
    for row in progress:
        run.append_progress(row)
    for step, reward in heldout:
        run.append_heldout({"step": step, "reward": reward, "rewards": {"numeric": reward}, "n_prompts": 8,
                            "seconds": 0.3})
    return run


def rows_of(rewards: list[float], seconds_per_step: float = 30.0) -> list[dict]:
    return [{"step": step, "reward": reward, "rewards": {"numeric": reward / 2}, "kl": 0.01 * step,
             "completion_len": 8.0, "reward_std": 0.2, "no_spread_share": 0.25,
             "elapsed_s": seconds_per_step * step} for step, reward in enumerate(rewards, start=1)]


@pytest.fixture
def three_runs(tiny_model_dir, tmp_path, runs_dir):
    """Three runs: a finished one, a better finished one with other settings, and one still running."""
    base = tiny_config(tiny_model_dir, tmp_path, runs_dir)
    better = {**base, "name": "stronger", "grpo": {**base["grpo"], "beta": 0.0, "temperature": 0.5},
              "rewards": [{"kind": "numeric", "weight": 2.0}, {"kind": "length", "max_chars": 12, "weight": 0.3},
                          {"kind": "regex", "pattern": r"^\d+$", "name": "digits_only", "weight": 0.5}]}
    return [
        make_run(runs_dir, "20261201-100000-tiny", base,
                 {"state": "succeeded", "step": 4, "total_steps": 4, "heldout_before": 0.25, "heldout_after": 0.5,
                  "heldout_before_scores": {"numeric": 0.25}, "heldout_after_scores": {"numeric": 0.5},
                  "elapsed_s": 120.0, "started_at": 1_790_000_000}, rows_of([0.2, 0.3, 0.4, 0.5]),
                 [(0, 0.25), (2, 0.4), (4, 0.5)]),
        make_run(runs_dir, "20261201-110000-stronger", better,
                 {"state": "succeeded", "step": 4, "total_steps": 4, "heldout_before": 0.25, "heldout_after": 0.9,
                  "heldout_before_scores": {"numeric": 0.05, "length": 0.4, "digits_only": 0.0},
                  "heldout_after_scores": {"numeric": 0.3, "length": 0.9, "digits_only": 0.0},  # a total of 0.87
                  "elapsed_s": 60.0, "started_at": 1_790_003_600}, rows_of([0.4, 0.6, 0.8, 0.9], 15.0),
                 [(0, 0.25), (2, 0.6), (4, 0.9)]),
        make_run(runs_dir, "20261201-120000-tiny", base,
                 {"state": "running", "step": 2, "total_steps": 4, "heldout_before": 0.25, "elapsed_s": 50.0,
                  "started_at": 1_790_007_200, "pid": None}, rows_of([0.2, 0.35], 25.0)),
    ]


def test_the_leaderboard_ranks_by_held_out_reward_after_with_its_change(studio, three_runs):
    entries = experiments.leaderboard(studio.runs.summaries())
    assert [e.run_id for e in entries] == ["20261201-110000-stronger", "20261201-100000-tiny",
                                           "20261201-120000-tiny"]  # best after first; not scored yet last
    best, finished, running = entries
    assert best.change == pytest.approx(0.65) and finished.change == pytest.approx(0.25) and running.change is None
    assert (best.minutes, best.steps, best.state) == (1.0, 4, "succeeded")
    assert running.state == "running" and running.row(public=False)[3:6] == [0.25, None, None]
    assert best.data == "arithmetic.csv"  # a file by its name: no server path on a board everyone reads


def test_the_leaderboard_ranks_by_one_reward_where_the_totals_do_not_compare(studio, three_runs):
    """"stronger" has the higher total only because it is paid by more rewards, with more weight: on numeric,
    the one reward both runs were scored on, "tiny" is better."""
    summaries = studio.runs.summaries()
    assert experiments.rank_choices(summaries) == [experiments.HELDOUT_TOTAL, "digits_only", "length", "numeric"]
    entries = experiments.leaderboard(summaries, by="numeric")
    assert [e.run_id for e in entries] == ["20261201-100000-tiny", "20261201-110000-stronger", "20261201-120000-tiny"]
    assert [(e.heldout_before, e.heldout_after) for e in entries] == [(0.25, 0.5), (0.05, 0.3), (None, None)]
    assert experiments.leaderboard_columns(False, "numeric")[3:6] == ["numeric before", "numeric after", "Change"]
    only_one = experiments.leaderboard(summaries, by="length")
    assert [e.heldout_after for e in only_one] == [0.9, None, None]  # a run not scored on it ranks with the unscored


@pytest.mark.parametrize("words, expected", [
    ("", 3),
    ("stronger", 1),
    ("TINY", 2),
    ("arithmetic.csv", 3),
    ("tiny running", 1),
    ("succeeded tiny", 1),
    ("nothing-like-it", 0),
])
def test_the_filter_keeps_runs_with_every_word(studio, three_runs, words, expected):
    entries = experiments.leaderboard(studio.runs.summaries())
    assert sum(entry.matches(words) for entry in entries) == expected


@pytest.mark.parametrize("source, shown", [
    ("openai/gsm8k", "openai/gsm8k"),
    ("/srv/uploads/0a1b2c/visitor/reviews.xlsx", "reviews.xlsx"),
    ("data/train.csv", "train.csv"),
    ("/data/runs/20261201-100000-tiny/adapter", "20261201-100000-tiny/adapter"),
    ("HuggingFaceTB/SmolLM2-135M-Instruct", "HuggingFaceTB/SmolLM2-135M-Instruct"),
    ("", ""),
])
def test_sources_and_models_are_shown_by_name(source, shown):
    assert experiments.shown_name(source) == shown


def config_with(**changes) -> dict:
    config = {"name": "a", "runs_dir": "/x", "base_dir": "/y", "data": {"source": "/srv/a/data.csv", "prompt": "q"},
              "grpo": {"beta": 0.04, "temperature": 0.8},
              "rewards": [{"kind": "numeric", "name": "numeric", "weight": 1.0}]}
    for path, value in changes.items():
        section, _, key = path.partition("__")
        if key:
            config[section] = {**config[section], key: value}
        else:
            config[section] = value
    return config


@pytest.mark.parametrize("other, expected", [
    (config_with(), []),
    (config_with(name="b", runs_dir="/z", base_dir="/w"), []),  # where a run was made is no setting
    (config_with(grpo__beta=0.0), [["grpo.beta", "0.04", "0.0"]]),
    (config_with(data__source="/elsewhere/data.csv"), []),  # the same file name: the same data as far as shown
    (config_with(data__source="openai/gsm8k"), [["data.source", "data.csv", "openai/gsm8k"]]),
    (config_with(rewards=[{"kind": "numeric", "name": "numeric", "weight": 2.0}]),
     [["reward · numeric", "numeric × 1.0", "numeric × 2.0"]]),
    (config_with(rewards=[{"kind": "numeric", "name": "numeric", "weight": 1.0},
                          {"kind": "regex", "name": "digits", "weight": 0.5, "pattern": "^\\d+$"}]),
     [["reward · digits", "–", "regex × 0.5 (pattern ^\\d+$)"]]),
    (config_with(rewards=[{"kind": "python", "name": "numeric", "weight": 1.0, "code": "def reward(): return 1"}]),
     [["reward · numeric", "numeric × 1.0", "python × 1.0, its own code #"]]),
])
def test_only_the_settings_that_differ_are_listed(other, expected):
    rows = experiments.differing_settings([config_with(), other])
    if expected and expected[0][2].endswith("#"):  # a code's fingerprint: check its form, not its digits
        assert rows[0][:2] == expected[0][:2] and rows[0][2].startswith(expected[0][2]) and len(rows[0][2]) > 30
    else:
        assert rows == expected


def test_two_codes_differ_by_their_fingerprints():
    one = config_with(rewards=[{"kind": "python", "name": "mine", "code": "def reward(*a): return 1"}])
    two = config_with(rewards=[{"kind": "python", "name": "mine", "code": "def reward(*a): return 0"}])
    assert experiments.differing_settings([one, two])[0][0] == "reward · mine"
    assert experiments.differing_settings([one, one]) == []


def test_the_csv_opens_safely_in_a_spreadsheet(tmp_path):
    rows = [["=HYPERLINK(\"http://x\")", "+1", "-cmd", "@SUM(A1)", "plain", 0.5, -0.25, None]]
    path = experiments.write_csv(tmp_path / "runs.csv", list("ABCDEFGH"), rows)
    with open(path, newline="", encoding="utf-8") as fh:
        header, row = list(csv.reader(fh))
    assert header == list("ABCDEFGH")
    assert row == ["'=HYPERLINK(\"http://x\")", "'+1", "'-cmd", "'@SUM(A1)", "plain", "0.5", "-0.25", ""]


def test_overlaid_curves_give_each_run_one_colour_against_steps_or_minutes(studio, three_runs):
    curves = [experiments.run_curves(run) for run in three_runs[:2]]
    labels = experiments.legend_labels(curves)
    assert labels == ["tiny", "stronger"]
    by_step = plots.overlay_figure(curves, labels, "reward", "Training reward", "mean reward")
    assert [list(trace.x) for trace in by_step.data] == [[1, 2, 3, 4], [1, 2, 3, 4]]
    assert [list(trace.y) for trace in by_step.data] == [[0.2, 0.3, 0.4, 0.5], [0.4, 0.6, 0.8, 0.9]]
    by_minute = plots.overlay_figure(curves, labels, "reward", "Training reward", "mean reward", x="minutes")
    assert list(by_minute.data[1].x) == [0.25, 0.5, 0.75, 1.0]  # 15 s a step
    rewards = plots.overlay_rewards_figure(curves, labels)
    names = [trace.name for trace in rewards.data]
    assert names == ["tiny · numeric", "tiny · length", "stronger · numeric", "stronger · length",
                     "stronger · digits_only"] or names == ["tiny · numeric", "stronger · numeric"]
    colours = {trace.name.split(" · ")[0]: trace.line.color for trace in rewards.data}
    assert colours == {"tiny": by_step.data[0].line.color, "stronger": by_step.data[1].line.color}
    assert len(set(colours.values())) == 2


def test_two_runs_of_one_name_are_told_apart_in_the_legend(three_runs):
    curves = [experiments.run_curves(run) for run in (three_runs[0], three_runs[2])]
    assert experiments.legend_labels(curves) == ["20261201-100000-tiny", "20261201-120000-tiny"]


def test_the_tab_lists_draws_and_exports_the_runs(app, studio, three_runs):
    board, choices, by = handler(app, "experiments_runs")("", experiments.HELDOUT_TOTAL)
    assert list(board.columns) == experiments.LEADERBOARD_COLUMNS and len(board) == 3
    assert board.iloc[0]["Run"] == "20261201-110000-stronger" and board.iloc[0]["Change"] == pytest.approx(0.65)
    assert [value for _, value in choices.choices] == [run.id for run in reversed(three_runs)]
    assert [value for _, value in by.choices] == [experiments.HELDOUT_TOTAL, "digits_only", "length", "numeric"]
    filtered, _, _ = handler(app, "experiments_runs")("stronger", experiments.HELDOUT_TOTAL)
    assert list(filtered["Run"]) == ["20261201-110000-stronger"]
    by_numeric, _, by = handler(app, "experiments_runs")("", "numeric")
    assert list(by_numeric["Run"])[:2] == ["20261201-100000-tiny", "20261201-110000-stronger"] and by.value == "numeric"
    gone, _, by = handler(app, "experiments_runs")("", "accuracy")  # no run's any more: back to the total
    assert gone.iloc[0]["Run"] == "20261201-110000-stronger" and by.value == experiments.HELDOUT_TOTAL

    said, differing, *charts = handler(app, "experiments_side_by_side")([three_runs[0].id, three_runs[1].id], "step")
    assert "4 settings differ between these runs" in said
    settings = dict(zip(differing["Setting"], zip(differing.iloc[:, 1], differing.iloc[:, 2])))
    assert settings["grpo.beta"] == ("0.04", "0.0") and settings["grpo.temperature"][1] == "0.5"
    assert settings["reward · numeric"] == ("numeric × 1.0", "numeric × 2.0")
    assert settings["reward · digits_only"][0] == "–"
    assert "model.id" not in settings and "training.learning_rate" not in settings  # the same in both
    assert len(charts) == len(CHARTS) + 1 and all(len(chart.data) == 2 for chart in charts if chart.data)
    assert [trace.name for trace in charts[0].data] == ["tiny", "stronger"]
    heldout = charts[1]  # the held-out checks during training, beside the training reward
    assert [list(trace.y) for trace in heldout.data] == [[0.25, 0.4, 0.5], [0.25, 0.6, 0.9]]
    _, _, *by_minute = handler(app, "experiments_side_by_side")([three_runs[0].id, three_runs[1].id], "minutes")
    assert list(by_minute[1].data[1].x) == [0.0, 0.5, 1.0]  # step 0, then the minutes of steps 2 and 4 (15 s a step)

    exported = handler(app, "experiments_export")("tiny", "numeric")
    assert exported.visible
    with open(exported.value["path"], newline="", encoding="utf-8") as fh:
        header, *rows = list(csv.reader(fh))
    assert header == experiments.leaderboard_columns(False, "numeric") and [row[0] for row in rows] == [
        "20261201-100000-tiny", "20261201-120000-tiny"]


def test_one_run_is_drawn_and_asks_for_another(app, three_runs):
    said, differing, *charts = handler(app, "experiments_side_by_side")([three_runs[2].id], "minutes")
    assert "Choose two to eight runs" in said and differing.empty
    assert list(charts[0].data[0].x) == [25 / 60, 50 / 60]


@pytest.mark.parametrize("run_ids, x, says", [
    (["../../etc"], "step", "There is no run with that id"),
    ([f"run-{n}" for n in range(9)], "step", "at most 8 runs"),
    ("20261201-100000-tiny", "step", "Choose the runs from the list"),
    ([{"id": 1}], "step", "Choose the runs from the list"),
    ([], "hours", "Draw against steps or minutes"),
    ([], ["step"], "Draw against steps or minutes"),
])
def test_what_a_client_sends_is_checked(app, three_runs, run_ids, x, says):
    with pytest.raises(Exception) as raised:
        handler(app, "experiments_side_by_side")(run_ids, x)
    assert says in str(raised.value)


def test_a_filter_longer_than_the_field_is_refused(app, three_runs):
    with pytest.raises(Exception, match="at most 200 characters"):
        handler(app, "experiments_runs")("x" * 201, experiments.HELDOUT_TOTAL)


@pytest.mark.parametrize("by", [["numeric"], {"a": 1}, None, "x" * 101])
def test_what_to_rank_by_is_checked(app, three_runs, by):
    with pytest.raises(Exception, match="Choose what to rank by from the list"):
        handler(app, "experiments_runs")("", by)


def test_a_public_demo_lists_everyones_runs_as_whose_they_are(monkeypatch, runs_dir, three_runs):
    from dragon_ui.studio.backend import Studio

    monkeypatch.setenv("DRAGON_UI_PUBLIC", "1")
    status = json.loads(three_runs[1].status_path.read_text())
    write_json_atomic(three_runs[1].status_path, {**status, "owner": "someone"})
    write_json_atomic(three_runs[0].status_path, {**json.loads(three_runs[0].status_path.read_text()), "owner": "me"})
    with public.visiting(public.Visitor(key="me")):  # the app serves each event so (tests/test_public.py)
        board, _, _ = experiments_tab.board(Studio(runs_dir=runs_dir, policy=public.Policy.from_env(runs_dir)), "",
                                            experiments.HELDOUT_TOTAL)
    assert list(board.columns) == [*experiments.LEADERBOARD_COLUMNS, "Whose"]
    whose = dict(zip(board["Run"], board["Whose"]))
    assert whose["20261201-110000-stronger"] == "another visitor's" and whose["20261201-100000-tiny"] == "yours"
    assert not any("/" in str(value) for value in board["Data"])  # no server path of anyone's upload


def test_the_command_line_writes_the_same_leaderboard(three_runs, runs_dir, tmp_path, capsys):
    from dragon_ui.cli import main

    target = tmp_path / "board.csv"
    assert main(["runs", "--csv", str(target)]) == 0
    assert f"Leaderboard written to {target}" in capsys.readouterr().out
    with open(target, newline="", encoding="utf-8") as fh:
        header, *rows = list(csv.reader(fh))
    assert header == experiments.LEADERBOARD_COLUMNS
    assert [(row[0], row[4], row[5]) for row in rows] == [("20261201-110000-stronger", "0.9", "0.65"),
                                                          ("20261201-100000-tiny", "0.5", "0.25"),
                                                          ("20261201-120000-tiny", "", "")]
    assert main(["runs", "--csv", str(target), "--rank-by", "numeric"]) == 0
    with open(target, newline="", encoding="utf-8") as fh:
        header, *rows = list(csv.reader(fh))
    assert header[3:5] == ["numeric before", "numeric after"] and rows[0][0] == "20261201-100000-tiny"
    capsys.readouterr()
    assert main(["runs", "--csv", str(target), "--rank-by", "accuracy"]) == 2
    assert "No run was scored on 'accuracy'; rank by one of: held-out total, digits_only, length, numeric" in \
        capsys.readouterr().err


def test_the_leaderboard_ranks_by_right_answers_each_by_its_own_goal():
    """Runs whose goals differ (exact for one, contains for the other) compare by the share each gets right."""
    summaries = [{"id": run, "state": "succeeded", "heldout_before": 0.2, "heldout_after": total,
                  "heldout_before_right": 0.1, "heldout_after_right": right, "goal": [goal]}
                 for run, total, right, goal in (("a", 0.9, 0.2, "exact"), ("b", 0.5, 0.6, "contains"))]
    assert experiments.rank_choices(summaries)[:2] == [experiments.HELDOUT_TOTAL, experiments.RIGHT_ANSWERS]
    assert [e.run_id for e in experiments.leaderboard(summaries)] == ["a", "b"]
    ranked = experiments.leaderboard(summaries, by=experiments.RIGHT_ANSWERS)
    assert [(e.run_id, e.heldout_before, e.heldout_after) for e in ranked] == [("b", 0.1, 0.6), ("a", 0.1, 0.2)]
    assert experiments.RIGHT_ANSWERS not in experiments.rank_choices([{**s, "heldout_before_right": None,
                                                                       "heldout_after_right": None}
                                                                      for s in summaries])
