"""Tab 6 · Experiments: every run on a leaderboard, and 2–8 runs side by side (their curves over each other and the
settings in which they differ). It reads the run folders only (dragon_ui.experiments), so it shows running, stopped
and finished runs alike; in a public demo everyone's runs are there to read, as in the runs list, and above them
the teacher's board of a class (class_section).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Literal, cast

import gradio as gr
import pandas as pd

from ..errors import ConfigError
from .. import experiments
from ..studio.backend import Studio
from . import class_section, plots
from .common import Shared, message, shows_errors, tab_being_built

MAX_FILTER_CHARS = 200
ColumnKind = Literal["str", "number"]  # gradio's name for what a leaderboard column holds (leaderboard_types)
CHARTS = [  # (key, title, y axis, of the held-out checks rather than the progress rows); each reward's third
    ("reward", "Training reward (total)", "mean reward", False),
    ("reward", "Held-out reward during training", "mean reward", True),
    ("kl", "KL divergence", "KL", False),
    ("completion_len", "Completion length", "tokens", False),
    ("reward_std", "Reward spread", "std", False),
    ("no_spread_share", "Groups with no spread", "fraction", False),
]
NO_CHECKS = "No held-out checks: runs before this feature, or with training.eval_every 0"


@dataclass
class Board:
    """The leaderboard as filtered and ranked: its columns and rows, what it ranks by (the held-out total where the
    reward asked for is no run's), what else it could rank by, and every run's summary."""

    columns: list[str]
    rows: list[list]
    by: str
    rank_choices: list[str]
    summaries: list[dict]


def board_rows(studio: Studio, words: str, by: str = experiments.HELDOUT_TOTAL) -> Board:
    """The leaderboard rows that match the filter ``words``, best by ``by`` (a reward, a metric, or the total)."""
    if not isinstance(words, str) or len(words) > MAX_FILTER_CHARS:
        raise ConfigError(f"The filter takes at most {MAX_FILTER_CHARS} characters.")
    if not isinstance(by, str) or len(by) > experiments.MOST_RANK_CHARS:
        raise ConfigError("Choose what to rank by from the list.")
    summaries = studio.runs.summaries()
    choices = experiments.rank_choices(summaries)
    by = by if by in choices else experiments.HELDOUT_TOTAL
    entries = experiments.leaderboard(summaries, studio.runs.whose if studio.public else None, by)
    return Board(experiments.leaderboard_columns(studio.public, by),
                 [entry.row(studio.public) for entry in entries if entry.matches(words)], by, choices, summaries)


def board(studio: Studio, words: str, by: str) -> tuple[pd.DataFrame, gr.Dropdown, gr.Dropdown]:
    """The leaderboard as filtered and ranked, what it can rank by, and every run as a choice to draw."""
    shown = board_rows(studio, words, by)
    choices = [(f"{summary['id']} · {summary.get('name') or ''}".rstrip(" ·"), summary["id"])
               for summary in shown.summaries]
    return (pd.DataFrame(shown.rows, columns=shown.columns), gr.Dropdown(choices=choices),
            gr.Dropdown(choices=shown.rank_choices, value=shown.by))


def chosen_runs(studio: Studio, run_ids) -> list:
    """The runs picked, checked: a page sends at most MAX_OVERLAID run ids, but any client can send anything."""
    if run_ids is None:
        return []
    if not isinstance(run_ids, list) or not all(isinstance(run_id, str) for run_id in run_ids):
        raise ConfigError("Choose the runs from the list.")
    if len(run_ids) > experiments.MAX_OVERLAID:
        raise ConfigError(f"Choose at most {experiments.MAX_OVERLAID} runs: more lines than that cannot be told apart.")
    return [studio.runs.get(run_id) for run_id in dict.fromkeys(run_ids)]


def side_by_side(studio: Studio, run_ids, x: str) -> tuple:
    """The settings that differ between the chosen runs, a sentence about them, and the overlaid charts."""
    if not isinstance(x, str) or x not in plots.X_AXES:
        raise ConfigError("Draw against steps or minutes.")
    runs = chosen_runs(studio, run_ids)
    curves = [experiments.run_curves(run) for run in runs]
    labels = experiments.legend_labels(curves)
    differing = experiments.differing_settings([curve.config for curve in curves]) if len(runs) > 1 else []
    if len(runs) < 2:
        said = message("Choose two to eight runs to see them side by side.", "info")
    elif differing:
        said = message(f"{len(differing)} setting{'s differ' if len(differing) > 1 else ' differs'} between these runs.",
                       "info")
    else:
        said = message("These runs have the same settings: any difference between them is chance (sampling).", "info")
    charts = [plots.overlay_figure(curves, labels, key, title, y_title, x, NO_CHECKS if heldout else "No values yet",
                                   heldout) for key, title, y_title, heldout in CHARTS]
    charts.insert(2, plots.overlay_rewards_figure(curves, labels, x))
    return said, pd.DataFrame(differing, columns=["Setting", *labels]), *charts


def export(studio: Studio, words: str, by: str) -> gr.File:
    """The leaderboard as filtered and ranked, in a CSV file to download (the file field shows only once there is
    one)."""
    shown = board_rows(studio, words, by)
    path = experiments.write_csv(studio.files.new_download("dragon-runs.csv"), shown.columns, shown.rows)
    return gr.File(str(path), visible=True)


def build(shared: Shared) -> None:
    studio = shared.studio
    this_tab = tab_being_built()
    if studio.public:  # a teacher's first look, above everyone's runs
        class_section.teacher_board(shared)
    gr.Markdown("Every run, best held-out score first (a column's ⋮ menu sorts by it). Totals compare only runs with "
                "the same rewards: rank by one reward or metric to compare the others. Choose runs below to draw them "
                "over each other and to see which settings differ.")
    with gr.Row(equal_height=True):
        words = gr.Textbox(label="Filter", placeholder="a name, a data file, a state…", scale=3, max_length=MAX_FILTER_CHARS,
                           elem_id="experiments-filter")
        by = gr.Dropdown([experiments.HELDOUT_TOTAL], value=experiments.HELDOUT_TOTAL, label="Rank by", scale=2,
                         info="The held-out total, or one reward or metric the runs were scored on.",
                         elem_id="experiments-rank-by")
        refresh_button = gr.Button("↻ Refresh", size="sm", scale=0, min_width=110, elem_id="experiments-refresh")
        export_button = gr.Button("Export CSV", size="sm", scale=0, min_width=130, elem_id="experiments-export")
    columns = experiments.leaderboard_columns(studio.public)
    leaderboard = gr.Dataframe(pd.DataFrame([], columns=columns),
                               datatype=cast(list[ColumnKind], experiments.leaderboard_types(studio.public)),
                               interactive=False, wrap=True, max_height=360, label="Leaderboard",
                               column_widths=["19%", "10%", "13%", "8%", "8%", "8%", "6%", "7%", "9%", "12%",
                                              *(["10%"] if studio.public else [])],
                               elem_id="experiments-leaderboard")
    csv_file = gr.File(label="Leaderboard (.csv)", interactive=False, visible=False, elem_id="experiments-csv")
    with gr.Row(equal_height=True):
        picked = gr.Dropdown([], multiselect=True, max_choices=experiments.MAX_OVERLAID, label="Runs side by side",
                             info=f"Two to {experiments.MAX_OVERLAID} runs.", scale=4, elem_id="experiments-runs")
        x_axis = gr.Radio(list(plots.X_AXES), value="step", label="Along", scale=1, elem_id="experiments-x")
    said = gr.Markdown(elem_id="experiments-said")
    differing = gr.Dataframe(pd.DataFrame([], columns=["Setting"]), interactive=False, wrap=True, label="Settings that differ",
                             elem_id="experiments-differing")
    charts = []
    count = len(CHARTS) + 1  # and the chart of each reward
    for first in range(0, count, 2):
        with gr.Row():
            for number in range(first, min(first + 2, count)):
                charts.append(gr.Plot(elem_id=f"experiments-chart-{number}", show_label=False))

    listed = shows_errors(functools.partial(board, studio))
    drawn = shows_errors(functools.partial(side_by_side, studio))
    shown = [said, differing, *charts]
    board_outputs = [leaderboard, picked, by]
    refresh_button.click(listed, [words, by], board_outputs, api_name="experiments_runs").then(
        drawn, [picked, x_axis], shown, api_visibility="private", show_progress="hidden")
    this_tab.select(listed, [words, by], board_outputs, api_visibility="private", show_progress="hidden").then(
        drawn, [picked, x_axis], shown, api_visibility="private", show_progress="hidden")
    gr.on([words.change, by.input], listed, [words, by], board_outputs, api_visibility="private",
          show_progress="hidden", trigger_mode="always_last")
    gr.on([picked.change, x_axis.change], drawn, [picked, x_axis], shown, api_name="experiments_side_by_side",
          trigger_mode="always_last", show_progress="hidden")
    export_button.click(shows_errors(functools.partial(export, studio)), [words, by], [csv_file],
                        api_name="experiments_export")
