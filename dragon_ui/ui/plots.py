"""Plotly figures of a run's progress rows (one row per optimiser step, see progress.RunStoreCallback).

Pure functions, so the Train tab and the tests build the same figures. Only basic scatter traces: the browser's
bundled plotly.js draws them without extra modules. A constant ``uirevision`` keeps the user's zoom when the figure
is replaced on the next refresh. The values come from monitor.series, which the health alerts read too, so an alert
and the chart beside it always show the same numbers. The Experiments tab draws several runs in the same way.
"""

from __future__ import annotations

from collections.abc import Set

import plotly.graph_objects as go

from ..experiments import RunCurves
from ..runstore import HeldOutRow, ProgressRow, reward_key
from ..grpo_math import finite_number
from ..studio.monitor import reward_names_of, series

HEIGHT = 300
UIREVISION = "dragon-train"
NO_STEPS = "No steps yet"


def line_figure(rows: list[ProgressRow], lines: list[tuple[str, str]], title: str, y_title: str,
                empty_text: str = "No values yet") -> go.Figure:
    """One line per (row key, legend label), against the step; an annotation instead of an empty plot."""
    figure = go.Figure()
    for key, label in lines:
        steps, values = series(rows, key)
        if any(v is not None for v in values):
            figure.add_trace(go.Scatter(x=steps, y=values, mode="lines+markers", name=label, connectgaps=False))
    return _laid_out(figure, title, "step", y_title, UIREVISION, -0.25, NO_STEPS if not rows else empty_text)


def _laid_out(figure: go.Figure, title: str, x_title: str, y_title: str, uirevision: str, legend_y: float,
              empty_text: str) -> go.Figure:
    """Every chart's look; ``empty_text`` in place of a plot that has no line."""
    figure.update_layout(title={"text": title, "x": 0.02}, height=HEIGHT, uirevision=uirevision,
                         margin={"l": 50, "r": 20, "t": 45, "b": 40}, xaxis_title=x_title, yaxis_title=y_title,
                         legend={"orientation": "h", "y": legend_y}, template="plotly_white")
    if not figure.data:
        figure.add_annotation(text=empty_text, showarrow=False, x=0.5, y=0.5, xref="paper", yref="paper",
                              font={"size": 16, "color": "#888"})
        figure.update_xaxes(visible=False)
        figure.update_yaxes(visible=False)
    return figure


def reward_figure(rows: list[ProgressRow], reward_names: list[str] | None = None,
                  heldout: list[HeldOutRow] | None = None, metrics: Set[str] = frozenset()) -> go.Figure:
    """Total reward (weighted sum) and each reward's mean: what the model is being pushed towards, and each metric's
    (``metrics``, named so: not trained on); and the held-out reward of the checks during training (dashed): whether
    that carries over to prompts it does not train on."""
    names = reward_names if reward_names is not None else reward_names_of(rows)
    figure = line_figure(rows, [("reward", "total"), *((reward_key(n), f"{n} (metric)" if n in metrics else n)
                                                        for n in names)], "Reward", "mean reward")
    steps, values = series(heldout or [], "reward")
    if rows and any(value is not None for value in values):
        figure.add_trace(go.Scatter(x=steps, y=values, mode="lines+markers", connectgaps=False,
                                    name=heldout_check_name((heldout or [{}])[-1]),
                                    line={"dash": "dash", "color": "#111827"}))
    return figure


def heldout_check_name(check: HeldOutRow) -> str:
    """The held-out checks' line, named apart from the whole held-out set that Compare scores: "held-out check
    (first 8 of 10 prompts)"."""
    prompts, of = check.get("n_prompts"), check.get("of_prompts")
    if not prompts:
        return "held-out check"
    if of and of > prompts:
        return f"held-out check (first {prompts} of {of} prompts)"
    return f"held-out check ({prompts} prompts)"


def spread_figure(rows: list[ProgressRow]) -> go.Figure:
    """How different the completions of a group score: no spread, no learning signal."""
    return line_figure(rows, [("reward_std", "reward std"), ("no_spread_share", "groups with no spread")],
                       "Reward spread", "std / fraction")


def kl_figure(rows: list[ProgressRow]) -> go.Figure:
    return line_figure(rows, [("kl", "KL to the starting model")], "KL divergence", "KL",
                       empty_text="No KL: it is only computed when beta > 0")


def length_figure(rows: list[ProgressRow], max_new_tokens: int | None = None) -> go.Figure:
    """Mean completion length, with the cap (max new tokens) dashed: lengths at the cap mean cut-off answers."""
    figure = line_figure(rows, [("completion_len", "mean completion length")], "Completion length", "tokens")
    if figure.data and max_new_tokens:
        steps = [step for row in rows if (step := row.get("step")) is not None]
        figure.add_trace(go.Scatter(x=[min(steps), max(steps)], y=[max_new_tokens] * 2, mode="lines", name="cap",
                                    line={"dash": "dash", "color": "#999"}))
    return figure


# ----------------------------------------------------------------------------------------------------------------
# Several runs over each other (the Experiments tab): a colour per run, the same in every chart.

RUN_COLOURS = ["#636efa", "#ef553b", "#00cc96", "#ab63fa", "#ffa15a", "#19d3f3", "#ff6692", "#b6e880"]
REWARD_DASHES = ["solid", "dash", "dot", "dashdot", "longdash", "longdashdot"]
X_AXES = {"step": "step", "minutes": "minutes"}
NO_RUNS = "Choose runs to draw"


def _x_values(rows: list[ProgressRow] | list[HeldOutRow], x: str, progress: list[ProgressRow]) -> list:
    """The step of each row, or the minutes its run had trained by then (a progress row's elapsed_s; for a held-out
    check, that of the progress row of its step)."""
    if x == "step":
        return [row.get("step") for row in rows]
    minutes = {row.get("step"): elapsed / 60 for row in progress
               if (elapsed := finite_number(row.get("elapsed_s"))) is not None}
    minutes.setdefault(0, 0.0)
    return [minutes.get(row.get("step")) for row in rows]


def overlay_figure(curves: list[RunCurves], labels: list[str], key: str, title: str, y_title: str,
                   x: str = "step", empty_text: str = "No values yet", heldout: bool = False) -> go.Figure:
    """One line per run of the progress key ``key`` (of the held-out checks, with ``heldout``), against steps or
    minutes."""
    figure = go.Figure()
    for number, (curve, label) in enumerate(zip(curves, labels)):
        rows = curve.heldout if heldout else curve.rows
        _, values = series(rows, key)
        if any(v is not None for v in values):
            figure.add_trace(go.Scatter(x=_x_values(rows, x, curve.rows), y=values, mode="lines+markers", name=label,
                                        line={"color": RUN_COLOURS[number % len(RUN_COLOURS)]}, connectgaps=False))
    return _overlay_layout(figure, curves, title, y_title, x, empty_text)


def overlay_rewards_figure(curves: list[RunCurves], labels: list[str], x: str = "step") -> go.Figure:
    """Each reward's mean per run: the run's colour, a dash per reward."""
    figure = go.Figure()
    for number, (curve, label) in enumerate(zip(curves, labels)):
        for index, name in enumerate(curve.reward_names or reward_names_of(curve.rows)):
            _, values = series(curve.rows, reward_key(name))
            if any(v is not None for v in values):
                figure.add_trace(go.Scatter(
                    x=_x_values(curve.rows, x, curve.rows), y=values, mode="lines", name=f"{label} · {name}",
                    line={"color": RUN_COLOURS[number % len(RUN_COLOURS)],
                          "dash": REWARD_DASHES[index % len(REWARD_DASHES)]}, connectgaps=False))
    return _overlay_layout(figure, curves, "Each reward", "mean reward", x, "No values yet")


def _overlay_layout(figure: go.Figure, curves: list[RunCurves], title: str, y_title: str, x: str,
                    empty_text: str) -> go.Figure:
    text = NO_RUNS if not curves else NO_STEPS if not any(c.rows for c in curves) else empty_text
    return _laid_out(figure, title, X_AXES[x], y_title, "dragon-experiments", -0.3, text)
