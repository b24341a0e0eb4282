"""Runs written by earlier versions open in every tab and command. tests/recorded/run-v1 is a real two-step run of
the tiny model, recorded with version 1 of the run records (reward_<name> beside TRL's reward_std,
frac_reward_zero_std); its weights and checkpoints are left out, as only the records are read here."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from dragon_ui.cli import main
from dragon_ui.runstore import RECORD_VERSION, RunDir
from dragon_ui.studio.backend import Studio
from dragon_ui.ui import compare_tab, experiments_tab, train_tab
from dragon_ui.public import LAPTOP

RECORDED = Path(__file__).resolve().parent / "recorded"


@pytest.fixture
def recorded_run(runs_dir) -> RunDir:
    shutil.copytree(RECORDED / "run-v1", runs_dir / "20261204-180345-recorded-v1")
    return RunDir(runs_dir / "20261204-180345-recorded-v1")


def traces(figure) -> dict[str, list]:
    return {trace.name: list(trace.y) for trace in figure.data}


def test_its_rows_are_read_in_todays_shape(recorded_run):
    rows = recorded_run.read_progress()
    assert [row["step"] for row in rows] == [1, 2]
    for row in rows:
        assert row["version"] == RECORD_VERSION and set(row["rewards"]) == set(row["errors"]) == {"numeric", "length"}
        assert row["reward"] == pytest.approx(row["rewards"]["numeric"] + 0.3 * row["rewards"]["length"], abs=1e-5)
        assert "no_spread_share" in row and "frac_reward_zero_std" not in row
    assert [row["step"] for row in recorded_run.read_heldout()] == [0, 1, 2]


def test_the_train_tab_draws_it(recorded_run, runs_dir):
    studio = Studio(runs_dir, policy=LAPTOP)
    view = train_tab.refresh(studio, recorded_run.id, {}, full=True)
    rows = recorded_run.read_progress()
    reward = traces(view.reward_plot)
    assert reward["numeric"] == [row["rewards"]["numeric"] for row in rows]
    assert reward["length"] == [row["rewards"]["length"] for row in rows]
    assert traces(view.spread_plot)["groups with no spread"] == [row["no_spread_share"] for row in rows]
    assert "Step 2" in view.rollouts and recorded_run.id in view.status


def test_the_compare_and_experiments_tabs_show_it(recorded_run, runs_dir):
    studio = Studio(runs_dir, policy=LAPTOP)
    summary, chart, table, *_ = compare_tab.comparison_outputs(studio, recorded_run.id)
    assert chart is not None and len(table) == len(recorded_run.read_samples())
    board, _, _ = experiments_tab.board(studio, "", "held-out total")
    assert recorded_run.id in board.to_string() or "recorded-v1" in board.to_string()
    said, differing, *charts = experiments_tab.side_by_side(studio, [recorded_run.id], "step")
    rewards_chart = charts[2]
    assert {trace.name.split(" · ")[-1] for trace in rewards_chart.data} >= {"numeric", "length"}


def test_the_commands_read_it(recorded_run, runs_dir, capsys):
    assert main(["runs", "--runs-dir", str(runs_dir)]) == 0
    assert recorded_run.id in capsys.readouterr().out
    assert main(["eval", str(recorded_run.path)]) == 0
    out = capsys.readouterr().out
    assert "Held-out reward during training" in out and "numeric" in out
