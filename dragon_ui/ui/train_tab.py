"""Tab 4 · Train: the run in ``shared.run_id``, live: status and progress, charts, the latest completions with their
scores, health alerts with fixes, the log, Stop / Resume, and the past runs.

The shared timer ticks once a second while a run is active. A tick reads only what the run directory gained
(monitor.read_snapshot) and leaves every output whose input did not change untouched (gr.skip), so watching costs
next to nothing while the same CPU trains.
"""

from __future__ import annotations

import functools
import html
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, fields
from typing import Any, TypedDict, TypeGuard, cast

import gradio as gr

from ..chat import call_text
from ..config import Draft
from ..errors import DragonError
from ..grpo_math import has_spread, known
from ..rewards import stored_metrics
from ..runstore import ACTIVE_STATES, RunStatus, format_seconds, read_json, state_label
from ..studio.backend import Studio
from ..studio.explain import (GroupExplanation, explain_run_group, formula_lines, plain_words, read_step_rollout,
                             shown_number, step_spread)
from ..studio.monitor import Alert, Snapshot, ends_calling, fingerprint, health_alerts, read_snapshot
from . import plots
from .common import Shared, bound, chosen_or_unchanged, first_cell, message, shows_errors
from .guard import in_page_order

MAX_GROUPS_SHOWN = 4
# By stored state; "cancelled" (shown as "stopped — can resume", see runstore.STATE_LABELS) pauses, it does not end.
STATE_ICONS = {"queued": "⏳", "running": "🏃", "succeeded": "✅", "failed": "❌", "cancelled": "⏸️"}
RUN_COLUMNS = ["Run", "State", "Step", "Reward", "Held-out before", "Held-out after", "Model", "Started"]
PRESS_EXPLAIN = "Press “What did this step do?” under a group of completions."  # a sentence in a pop-up: plain text
# The rollout view is redrawn at every step, so its buttons are handled on the element that stays (delegation).
EXPLAIN_CLICKS = ("element.addEventListener('click', (event) => { const button = event.target.closest("
                  "'button.explain-group'); if (button) trigger('click', {step: Number(button.dataset.step), "
                  "group: Number(button.dataset.group)}); else if (event.target.closest('button.explain-close')) "
                  "trigger('click', {close: true}); });")
MOVES = {"up": "↑ more likely", "down": "↓ less likely", "same": "– unchanged"}
NO_RUN = "No run to show yet: press **Start training** on the Model & Hardware tab, or open a past run below."
BEST_STYLE, WORST_STYLE = "background:#e7f6ec", "background:#fdecec"
TOOL_ANSWER_STYLE = "color:#6b7280;background:#f3f4f6;border-left:3px solid #d1d5db;padding:2px 6px;margin:2px 0"


# ----------------------------------------------------------------------------------------------------------------
# Pieces of the view, as pure functions of the run's data.


def status_markdown(run_id: str, status: RunStatus, queue_place: str = "") -> str:
    """The run's state line, then what to know about it: why it failed, how it resumes, where it is in the
    queue (``queue_place``, for a waiting run), how it scored."""
    state = status.get("state", "unknown")
    phase = status.get("phase") if state in ACTIVE_STATES else ""  # an ended run's state says it all: one state
    parts = [f"{STATE_ICONS.get(state, '')} **{state_label(state)}**", phase or ""]
    if status.get("model_label"):  # its id: the label's account of where it came from is in the log
        parts.append(status["model_label"].split(" (")[0])
    if status.get("device"):
        device = f"{status['device']} {status.get('dtype', '')}".strip()
        if status["device"] == "cpu" and status.get("cpu_threads"):
            device += f", {status['cpu_threads']} thread{'s' if status['cpu_threads'] > 1 else ''}"
        parts.append(device)
    text = f"Run `{run_id}` · " + " · ".join(p for p in parts if p)
    if status.get("waiting") and queue_place:
        text += "\n\n" + message(f"Waiting in the queue: {queue_place}. It starts by itself; Stop takes it out of "
                                 "the queue.", "info")
    elif state == "failed" and (error := status.get("error")):
        text += "\n\n" + message(error, "error")
    elif state == "cancelled":
        resumes_from = (f"continues from {status['latest_checkpoint']}" if status.get("latest_checkpoint")
                        else "starts it again, since it stopped before its first checkpoint")
        text += "\n\n" + message(f"Stopped, not finished: Resume {resumes_from}.", "info")
        if stop_reason := status.get("stop_reason"):
            text += "\n\n" + message(stop_reason, "info")
    elif state == "succeeded" and status.get("heldout_after") is not None and status.get("heldout_before") is not None:
        text += "\n\n" + message(f"Held-out reward on the whole held-out set {status['heldout_before']:.3f} → "
                                 f"{status['heldout_after']:.3f}"
                                 f"{right_answers(status)}; compare replies on the Compare tab.", "ok")
    return text


def right_answers(status: RunStatus) -> str:
    """"; right answers by the goal (exact): 10 % → 35 %", from a run's status; "" for a run with no goal."""
    before, after, goal = status.get("heldout_before_right"), status.get("heldout_after_right"), status.get("goal")
    if not isinstance(before, (int, float)) or not isinstance(after, (int, float)) or not goal:
        return ""
    return f"; right answers by the goal ({', '.join(goal)}): {before:.0%} → {after:.0%}"


def banner_markdown(run_id: str, status: RunStatus) -> str:
    """The line above the tabs while the run a page opened with trains: kept up to date by the Train tab's refresh,
    so that it never shows a step or a state the run has left."""
    step = f"step {status.get('step') or 0} of {status.get('total_steps') or '?'}"
    return message(f"A run is training: `{run_id}`, {step}.", "info")


def progress_html(status: RunStatus) -> str:
    """A bar with step / total, elapsed time and ETA."""
    step, total = status.get("step") or 0, status.get("total_steps")
    fraction = min(1.0, step / total) if total else 0.0
    caption = [f"Step {step} / {total if total else '?'}"]
    if total:
        caption.append(f"{fraction:.0%}")
    if status.get("elapsed_s"):
        caption.append(f"elapsed {format_seconds(status['elapsed_s'])}")
    if status.get("state") in ACTIVE_STATES and status.get("eta_s") and step:
        caption.append(f"about {format_seconds(status['eta_s'])} left")
    return (f'<div role="progressbar" aria-label="Training progress" aria-valuemin="0" aria-valuemax="{total or 0}" aria-valuenow="{step}">'
            '<div style="background:#e5e7eb;border-radius:6px;height:12px;overflow:hidden">'
            f'<div style="width:{fraction * 100:.1f}%;height:100%;background:#10b981"></div></div>'
            f'<div style="font-size:0.9em;margin-top:4px">{html.escape(" · ".join(caption))}</div></div>')


def alerts_markdown(alerts: list[Alert]) -> str:
    if not alerts:
        return ""
    return "\n\n".join(message(f"**{alert.title}.** {alert.fix}", alert.level) for alert in alerts)


def rollouts_html(rollout: dict | None, reward_names: list[str], max_groups: int = MAX_GROUPS_SHOWN,
                  sampling: dict | None = None, config: dict | None = None,
                  explained: tuple[int, str] | None = None) -> str:
    """The latest step's groups: where their spread came from (the run's ``config`` says the weights and the
    goal), each completion with its per-reward scores, total and advantage; the best and worst of a group
    highlighted; ``explained``: (a group's number, its explanation panel), shown under that group. Before the first
    step ends, the completions it sampled (``sampling``), unscored. Everything from the run is escaped: completions
    are untrusted text."""
    if not rollout or not rollout.get("groups"):
        return sampled_html(sampling, max_groups) if sampling and sampling.get("groups") else \
            "<p>No completions yet: they appear as soon as the first step has sampled them.</p>"
    groups = rollout["groups"]
    step = rollout.get("step")
    parts = [f"<p><b>Step {html.escape(str(step))}</b>: {min(len(groups), max_groups)} of {len(groups)} prompts. "
             "Green: the best completion of its group, red: the worst; the advantage is how much each is "
             "reinforced. <i>What did this step do?</i> under a group works out its numbers.</p>"]
    spread = step_spread(rollout, config or {})
    if spread:
        parts.append(f"<p class='step-spread'>{html.escape(spread)}</p>")
    columns = ["#", "Completion", *reward_names, "Total", "Advantage"]
    header = "".join(f"<th>{html.escape(name)}</th>" for name in columns)
    for number, group in enumerate(groups[:max_groups], start=1):
        completions = group.get("completions") or []
        totals = known(c.get("total") for c in completions)
        differ = has_spread(totals)
        parts.append(f"<div class='rollout-group' style='margin:12px 0'><div><b>Prompt:</b> "
                     "<span style='white-space:pre-wrap'>"
                     f"{html.escape(str(group.get('prompt', '')))}</span></div>"
                     f"<div><b>Reference:</b> {html.escape(str(group.get('reference', '')))}</div>")
        rows = []
        for index, completion in enumerate(completions, start=1):
            style = ""
            if differ and completion.get("total") == max(totals):
                style = BEST_STYLE
            elif differ and completion.get("total") == min(totals):
                style = WORST_STYLE
            scores = completion.get("scores") or {}
            cells = [str(index), completion_html(completion.get("text", ""), completion.get("turns")),
                     *(shown_number(scores.get(name)) for name in reward_names),
                     shown_number(completion.get("total")), shown_number(completion.get("advantage"))]
            rows.append(f"<tr style='{style}'>" + "".join(f"<td>{cell}</td>" for cell in cells) + "</tr>")
        parts.append(f"<table style='width:100%' aria-label='Group {number}: its completions, scores and "
                     f"advantages'><thead><tr>{header}</tr></thead>"
                     f"<tbody>{''.join(rows)}</tbody></table>")
        if not differ:
            parts.append("<div><i>Every completion scored the same, so this prompt teaches nothing this step.</i>"
                         "</div>")
        if explained is not None and explained[0] == number:
            parts.append(explained[1])
        elif isinstance(step, int):
            parts.append(f"<button class='explain-group' data-step='{step}' data-group='{number}'>What did this step "
                         f"do? (group {number})</button>")
        parts.append("</div>")
    return "".join(parts)


def completion_html(text, turns) -> str:
    """One completion as the viewer shows it: its text, or, where it called tools, each turn: the model's text and
    calls, each tool's answer greyed (not trained on), and the final answer the rewards scored. Escaped: the turns
    are the model's text and the tools' answers to it."""
    if not isinstance(turns, list) or not turns:
        return f"<span style='white-space:pre-wrap'>{html.escape(str(text))}</span>"
    parts = []
    for number, turn in enumerate(turns, start=1):
        if not isinstance(turn, dict) or (number == len(turns) and not turn.get("calls")
                                          and turn.get("role") != "tool"):
            continue  # the last reply without a call is the final answer, shown below
        said = html.escape(str(turn.get("text") or ""))
        if turn.get("role") == "tool":
            parts.append(f"<div class='tool-answer' style='{TOOL_ANSWER_STYLE}'>{html.escape(str(turn.get('name')))} "
                         f"answered: <span style='white-space:pre-wrap'>{said}</span> "
                         "<small>(not trained on)</small></div>")
            continue
        if said:
            parts.append(f"<div style='white-space:pre-wrap'>{said}</div>")
        for call in turn.get("calls") or []:
            if isinstance(call, dict):
                parts.append(f"<div class='tool-call'><code>{html.escape(call_text(call.get('name'), call.get('arguments')))}"
                             "</code></div>")
    final = "no answer: it ended calling a tool" if ends_calling({"turns": turns}) else html.escape(str(text))
    parts.append(f"<div class='final-answer'><b>Answer:</b> <span style='white-space:pre-wrap'>{final}</span></div>")
    return "".join(parts)


def sampled_html(sampling: dict, max_groups: int = MAX_GROUPS_SHOWN) -> str:
    """The completions the first step just sampled, while it scores them and trains on them: the model at work
    before the step's numbers exist. Escaped like the rollouts: completions are untrusted text."""
    groups = sampling.get("groups") or []
    parts = [f"<p><b>Step {html.escape(str(sampling.get('step')))}</b>, sampled just now: "
             f"{min(len(groups), max_groups)} of {len(groups)} prompts. Their scores and advantages appear when the "
             "step ends.</p>"]
    for group in groups[:max_groups]:
        completions = group.get("completions") if isinstance(group.get("completions"), list) else []
        turns = group.get("turns") if isinstance(group.get("turns"), list) else []
        items = "".join(f"<li>{completion_html(text, turns[n] if n < len(turns) else None)}</li>"
                        for n, text in enumerate(completions))
        parts.append(f"<div class='rollout-group sampled' style='margin:12px 0'><div><b>Prompt:</b> "
                     f"<span style='white-space:pre-wrap'>{html.escape(str(group.get('prompt', '')))}</span></div>"
                     f"<div><b>Reference:</b> {html.escape(str(group.get('reference', '')))}</div>"
                     f"<ol>{items}</ol></div>")
    return "".join(parts)


def explanation_html(explained: GroupExplanation) -> str:
    """The explain panel: what the step did to one group in plain words, its numbers per completion, and the
    formula behind them on request. Prompt and reference come from the run, so they are escaped."""
    e = explained
    names = list(e.weights) or sorted({name for c in e.completions for name in c.scores})
    prompt = e.prompt if len(e.prompt) <= 300 else e.prompt[:299] + "…"
    rows = []
    for c in e.completions:
        parts = " + ".join(f"{shown_number(c.scores.get(name))} × {e.weights.get(name, 1.0):g}" for name in names)
        cells = [str(c.number), html.escape(parts), shown_number(c.total), shown_number(c.advantage), shown_number(c.logged),
                 MOVES[c.direction]]
        rows.append("<tr>" + "".join(f"<td>{cell}</td>" for cell in cells) + "</tr>")
    header = "".join(f"<th>{html.escape(name)}</th>" for name in
                     ("#", "Scores × weights (" + ", ".join(names) + ")", "Total", "Advantage", "TRL's advantage",
                      "This step makes it"))
    words = "".join(f"<p>{html.escape(line)}</p>" for line in plain_words(e))
    formula = "<br>".join(html.escape(line) for line in formula_lines(e))
    return panel_html(f"<h4>Step {e.step}, group {e.group}: what did this step do?</h4>"
                      f"<div><b>Prompt:</b> <span style='white-space:pre-wrap'>{html.escape(prompt)}</span></div>"
                      f"<div><b>Reference:</b> {html.escape(e.reference)}</div>{words}"
                      f"<table style='width:100%' aria-label='Group {e.group}: how each completion moves'>"
                      f"<thead><tr>{header}</tr></thead><tbody>{''.join(rows)}</tbody>"
                      "</table><details><summary>Show the formula</summary>"
                      f"<p style='font-family:monospace'>{formula}</p></details>")


def panel_html(inner: str) -> str:
    """The explain panel under its group, with the button that closes it: until then the completions stay on the
    step explained (refresh leaves them), so that what is being read does not move away."""
    return (f"<div class='explain-panel' role='region' aria-label='What did this step do?'>{inner}"
            "<p><i>The completions shown stay on this step until you close this.</i> "
            "<button class='explain-close'>Close this explanation</button></p></div>")


class Reading(TypedDict):
    """The group whose explanation is open (a gr.State): its run, step and number."""

    run_id: str
    step: int
    group: int


def explain_clicked(studio: Studio, run_id: str, watch: Watched, event: gr.EventData) -> tuple[Any, Reading | None]:
    """(rollouts, reading): the step's groups with the explain panel under the group whose button was pressed, held
    there while it is read; "Close this explanation" shows the run's latest step again. The step and group come
    from the page, so from anyone: they are checked before a file is read, and a wrong one is said in a sentence."""
    data = getattr(event, "_data", None)
    if isinstance(data, dict) and data.get("close") is True:
        return latest_rollouts(watch), None
    step, group = (data.get("step"), data.get("group")) if isinstance(data, dict) else (None, None)
    if not (whole_number(step) and whole_number(group) and 0 <= step <= 10**9 and 1 <= group <= MAX_GROUPS_SHOWN):
        raise gr.Error(PRESS_EXPLAIN, print_exception=False)
    try:
        run = studio.runs.get(run_id)
    except DragonError as exc:
        raise gr.Error(str(exc), print_exception=False) from None
    rollout = read_step_rollout(run, step)
    if rollout is None or len(rollout.get("groups") or []) < group:
        raise gr.Error(f"The run has no completions recorded for group {group} of step {step}.",
                       print_exception=False)
    config = read_json(run.config_path, default={}) or {}
    try:
        panel = explanation_html(explain_run_group(run, step, group))
    except DragonError as exc:
        panel = panel_html(message(html.escape(str(exc)), "warn"))
    except (ArithmeticError, ValueError):  # totals beyond a float's range, from weights of 1e308
        panel = panel_html(message("This group's numbers are too large to work out.", "warn"))
    shown = rollouts_html(rollout, shown_reward_names(shown_snapshot(watch)), config=config, explained=(group, panel))
    return shown, Reading(run_id=run_id, step=step, group=group)


def latest_rollouts(watch: Watched | None) -> str:
    """The rollout view of the run's latest step, as the last refresh read it."""
    snapshot = shown_snapshot(watch)
    return rollouts_html(snapshot.get("rollouts"), shown_reward_names(snapshot), sampling=snapshot.get("sampling"),
                         config=(watch or {}).get("config"))


def shown_reward_names(snapshot: dict) -> list[str]:
    """The reward columns of a run's view: as its status names them, else as its progress rows do."""
    return (snapshot.get("status") or {}).get("reward_names") or plots.reward_names_of(snapshot.get("progress") or [])


def whole_number(value: object) -> TypeGuard[int]:
    """Whether a value the page sent is a whole number (JSON's true is not one)."""
    return isinstance(value, int) and not isinstance(value, bool)


def runs_table(runs: list[dict], whose: Callable[[dict], str] | None = None) -> list[list[Any]]:
    """One row per run; in a public demo (``whose``) a last column says whose run it is."""
    def started(run: dict) -> str:
        """The first start, also for a resumed run."""
        return time.strftime("%Y-%m-%d %H:%M", time.localtime(run["started_at"])) if run.get("started_at") else ""

    return [[run["id"], state_label(run["state"]), f"{run['step']}/{run['total_steps'] or '?'}",
             shown_number(run.get("reward")), shown_number(run.get("heldout_before")), shown_number(run.get("heldout_after")),
             run["model"], started(run), *([whose(run)] if whose else [])]
            for run in runs]


def run_columns(studio: Studio) -> list[str]:
    return [*RUN_COLUMNS, "Whose"] if studio.public else RUN_COLUMNS


# ----------------------------------------------------------------------------------------------------------------
# The whole view.


@dataclass
class TrainView:
    """The Train tab's outputs, in the order the events list them; gr.skip() where nothing changed."""

    watch: Any
    status: Any
    progress: Any
    reward_plot: Any
    spread_plot: Any
    kl_plot: Any
    length_plot: Any
    alerts: Any
    rollouts: Any
    reading: Any  # the group whose explanation is open (Reading): reset when another run is shown
    log: Any
    stop: Any
    resume: Any
    runs: Any
    run_choices: Any
    timer: Any
    banner: Any  # the row above the tabs: hidden once the run it names is no longer active
    banner_text: Any

    def outputs(self) -> tuple:
        return tuple(getattr(self, f.name) for f in fields(self))

    @classmethod
    def unchanged(cls, **changed: Any) -> TrainView:
        """The view that changes nothing but ``changed``."""
        return cls(**{**{f.name: gr.skip() for f in fields(cls)}, **changed})


class Watched(TypedDict, total=False):
    """What the tab keeps between refreshes (a gr.State): the run shown, what was read of its files
    (monitor.Snapshot.to_state), its config and its place in the queue."""

    run_id: str
    snapshot: dict
    config: dict
    queue_place: str


def shown_snapshot(watch: Watched | None) -> dict:
    """What the last refresh read of the run's files (monitor.Snapshot.to_state)."""
    return (watch or {}).get("snapshot") or {}


def shown_status(watch: Watched | None) -> RunStatus:
    """The status of the run as the view shows it: the last refresh's reading (monitor keeps it as a plain dict)."""
    return cast(RunStatus, shown_snapshot(watch).get("status") or {})




def runs_outputs(studio: Studio) -> tuple[list[list[Any]], gr.Dropdown]:
    """The runs list and the run picker's choices (only in an event: a Dropdown made while the page is built is
    shown on it)."""
    runs = studio.runs.summaries()
    return runs_rows(studio, runs), gr.Dropdown(choices=[run["id"] for run in runs])


def runs_rows(studio: Studio, runs: list[dict]) -> list[list[Any]]:
    """The runs list's rows: whose run each is, in a public demo."""
    return runs_table(runs, studio.runs.whose if studio.public else None)


def empty_view(studio: Studio, text: str = NO_RUN) -> TrainView:
    return TrainView({}, text, progress_html({}), plots.reward_figure([]), plots.spread_figure([]),
                     plots.kl_figure([]), plots.length_figure([]), "", rollouts_html(None, []), None, "",
                     gr.Button(interactive=False), gr.Button(interactive=False), *runs_outputs(studio),
                     gr.Timer(active=False), gr.Row(visible=False), "")


def refresh(studio: Studio, run_id: str, watch: Watched, full: bool = False, reading: Reading | None = None) -> TrainView:
    """What changed in ``run_id`` since ``watch`` (the previous refresh's state); ``full`` redraws everything, as
    when another run is shown. Turns the timer off once the run is no longer active. The completions stay as they
    are while a group of this run is being read (``reading``)."""
    skip = gr.skip()
    if not run_id:
        if full or watch:
            return empty_view(studio)
        return TrainView.unchanged(timer=gr.Timer(active=False))
    try:
        run = studio.runs.get(run_id)
    except DragonError as exc:
        return empty_view(studio, message(str(exc), "error"))
    same_run = not full and watch.get("run_id") == run_id
    snap: Snapshot = read_snapshot(run.path, since=watch.get("snapshot") if same_run else None)
    status, rows = snap.status, snap.progress
    config = watch["config"] if same_run else read_json(run.config_path, default={}) or {}
    queue_place = studio.runs.place(run_id) if status.get("waiting") else ""
    new_watch = Watched(run_id=run_id, snapshot=snap.to_state(), config=config, queue_place=queue_place)
    if same_run and not snap.changed and queue_place == watch.get("queue_place", ""):
        return TrainView.unchanged(watch=new_watch)

    reward_names = shown_reward_names({"status": status, "progress": rows})
    held = same_run and isinstance(reading, dict) and reading.get("run_id") == run_id
    state_changed = not same_run or status.get("state") != shown_status(watch).get("state")
    runs, run_choices = runs_outputs(studio) if state_changed else (skip, skip)
    mine = studio.runs.owns(status.get("owner"))
    max_new_tokens = (config.get("grpo") or {}).get("max_new_tokens")
    return TrainView(
        watch=new_watch,
        status=status_markdown(run_id, status, queue_place)
        if snap.status_changed or queue_place != watch.get("queue_place", "") else skip,
        progress=progress_html(status) if snap.status_changed else skip,
        reward_plot=plots.reward_figure(rows, reward_names, snap.heldout, stored_metrics(config))
        if snap.progress_changed else skip,
        spread_plot=plots.spread_figure(rows) if snap.progress_changed else skip,
        kl_plot=plots.kl_figure(rows) if snap.progress_changed else skip,
        length_plot=plots.length_figure(rows, max_new_tokens) if snap.progress_changed else skip,
        alerts=alerts_markdown(health_alerts(rows, status, config, snap.log, snap.rollouts, snap.heldout)),
        rollouts=rollouts_html(snap.rollouts, reward_names, sampling=snap.sampling, config=config)
        if snap.rollouts_changed and not held else skip,
        reading=skip if same_run else None,
        log=snap.log if snap.log_changed else skip,
        stop=gr.Button(interactive=snap.active and mine) if state_changed else skip,
        resume=gr.Button(interactive=mine and status.get("state") in ("failed", "cancelled")) if state_changed
        else skip,
        runs=runs,
        run_choices=run_choices,
        timer=gr.Timer(active=snap.active) if state_changed else skip,
        banner=gr.Row(visible=False) if state_changed and not snap.active else skip,
        banner_text=banner_markdown(run_id, status) if snap.status_changed and snap.active else skip,
    )


FOLLOW_EVERY_S = 0.1  # how often a starting run's files are looked at from the server (a few stats)
FOLLOW_AT_MOST_S = 10  # then the timer alone follows it, however the start goes


def follow_start(studio: Studio, run_id: str, watch: Watched) -> Iterator[tuple]:
    """One's own run while it starts: each change as it comes, looked for on the server every FOLLOW_EVERY_S, so that
    the page says it trains as soon as it does (the timer's next tick would come up to a second later, and quicker
    ticks cost the page more than they save). Ends once the run trains, waits in the queue or ends, and after
    FOLLOW_AT_MOST_S. Only the run's owner follows it: one run starts at a time, so one follower at a time serves
    (its own concurrency group), and nobody else's events wait for it."""
    deadline = time.monotonic() + FOLLOW_AT_MOST_S
    while time.monotonic() < deadline:
        status = shown_status(watch)
        starting = (status.get("state") in ACTIVE_STATES and not status.get("waiting") and not status.get("step")
                    and not str(status.get("phase") or "").startswith("training"))
        if not (starting and studio.runs.owns(status.get("owner"))):
            break
        time.sleep(FOLLOW_EVERY_S)
        view = refresh(studio, run_id, watch)
        if any(value != gr.skip() for value in view.outputs()[1:]):
            yield view.outputs()
        watch = view.watch
    yield (gr.skip(),) * len(fields(TrainView))  # gradio clears every output of a generator that yields nothing


def tick(studio: Studio, run_id: str, watch: Watched) -> list:
    """The once-a-second tick's answer: which run is shown, its files' fingerprint and, while it waits, its place in
    the queue. The view is refreshed (``refresh``, through the change of what the tick saw) only when these change.

    Why not refresh at every tick: gradio's page copies the current value of every output of an event each time the
    event's loading status changes, even hidden. With the charts, the completions and the log as outputs of a tick,
    the page spent most of its time copying them while a run trained on 2 CPUs, and a click waited behind that.
    """
    try:
        run = studio.runs.get(run_id) if run_id else None
    except DragonError:
        return [run_id]  # refresh says what is wrong
    waiting = shown_status(watch).get("waiting")
    return [run_id, fingerprint(run.path, (watch or {}).get("snapshot")) if run else None,
            studio.runs.place(run_id) if waiting else ""]


def stop_run(studio: Studio, run_id: str) -> str:
    if not run_id:
        return message("There is no run to stop.", "info")
    state = studio.runs.get(run_id).read_status().get("state")
    if state not in ACTIVE_STATES:
        return message(f"The run {run_id} is not training (it is {state_label(state)}).", "info")
    waiting = studio.runs.get(run_id).read_status().get("waiting")
    studio.runs.stop(run_id)
    if waiting:
        return message(f"Took {run_id} out of the queue; Resume puts it back in line.", "ok")
    return message("Stopping: the step under way ends at once and the last whole step is saved, so you can resume.", "ok")


def resume_run(studio: Studio, run_id: str) -> tuple[str, Any]:
    """(message, timer): a run that cannot be resumed, or a busy machine, is explained in the message."""
    if not run_id:
        return message("There is no run to resume.", "info"), gr.skip()
    try:
        run = studio.runs.resume(run_id)
    except DragonError as exc:
        return message(str(exc), "error"), gr.skip()
    checkpoint = run.latest_checkpoint()
    where = f"from {checkpoint.name}" if checkpoint else "from the start (it had no checkpoint yet)"
    return message(f"Resuming {run_id} {where}.", "ok"), gr.Timer(active=True)


def view_outputs(studio: Studio, run_id: str, watch: Watched, reading: Reading | None = None,
                 full: bool = False) -> tuple:
    """``refresh`` as the events answer it: the view's outputs, in order."""
    return refresh(studio, run_id, watch, full, reading).outputs()


def settings_of_run(studio: Studio, picked: str | None, shown: str) -> tuple[Draft | dict, str]:
    """"Load these settings": those of the run picked in the list, else of the run shown."""
    return studio.runs.settings_of(picked or shown)


# ----------------------------------------------------------------------------------------------------------------
# The tab.


@dataclass
class PastRuns:
    """The past runs list and what acts on it."""

    runs: gr.Dataframe
    choice: gr.Dropdown
    open: gr.Button
    load_settings: gr.Button
    refresh: gr.Button


def build(shared: Shared) -> None:
    studio = shared.studio
    watch = gr.State({})
    status = gr.Markdown(NO_RUN, elem_id="train-status")
    shared.train_status = status
    progress = gr.HTML(progress_html({}), elem_id="train-progress")
    with gr.Row():
        stop = gr.Button("Stop (saves a checkpoint)", variant="stop", interactive=False, elem_id="train-stop")
        resume = gr.Button("Resume", interactive=False, elem_id="train-resume")
    action = gr.Markdown(elem_id="train-action")
    alerts = gr.Markdown(elem_id="train-alerts")
    with gr.Row():
        reward_plot = gr.Plot(plots.reward_figure([]), show_label=False, elem_id="train-plot-reward")
        spread_plot = gr.Plot(plots.spread_figure([]), show_label=False, elem_id="train-plot-spread")
    with gr.Row():
        kl_plot = gr.Plot(plots.kl_figure([]), show_label=False, elem_id="train-plot-kl")
        length_plot = gr.Plot(plots.length_figure([]), show_label=False, elem_id="train-plot-length")
    gr.Markdown("### What the model writes now")
    rollouts = gr.HTML(rollouts_html(None, []), elem_id="train-rollouts", js_on_load=EXPLAIN_CLICKS)
    reading = gr.State(None)
    log = gr.Textbox(label="Log (last 40 lines)", lines=10, max_lines=40, autoscroll=True, interactive=False,
                     elem_id="train-log")
    past = past_runs(studio)
    view = [watch, status, progress, reward_plot, spread_plot, kl_plot, length_plot, alerts, rollouts, reading,
            log, stop, resume, past.runs, past.choice, shared.timer, shared.banner, shared.banner_text]
    seen = gr.State()  # what the last tick saw of the run's files (tick)
    shared.timer.tick(functools.partial(tick, studio), [shared.run_id, watch], [seen], api_visibility="private",
                      show_progress="hidden")
    # The view's refreshes and an explanation's click take turns within a page: a refresh that read no open
    # explanation and answered after the click drew the completions over it.
    seen.change(functools.partial(view_outputs, studio), [shared.run_id, watch, reading], view, api_name="train_tick",
                show_progress="hidden", **in_page_order("train-view"))
    shared.run_id.change(functools.partial(view_outputs, studio, full=True), [shared.run_id, watch, reading], view,
                         api_name="train_show", show_progress="hidden", **in_page_order("train-view")).then(
        functools.partial(follow_start, studio), [shared.run_id, watch], view, api_name="train_follow",
        api_visibility="private", show_progress="hidden", **in_page_order("follow-start"))
    rollouts.click(bound(explain_clicked, studio), [shared.run_id, watch], [rollouts, reading],
                   api_name="train_explain", show_progress="hidden", **in_page_order("train-view")).then(
        None, js="() => document.querySelector('#train-rollouts .explain-panel')?.scrollIntoView({block: 'nearest'})",
        api_visibility="private")
    stop.click(shows_errors(functools.partial(stop_run, studio)), [shared.run_id], [action], api_name="train_stop",
               show_progress="hidden")
    resume.click(shows_errors(functools.partial(resume_run, studio)), [shared.run_id], [action, shared.timer],
                 api_name="train_resume", show_progress="hidden")
    connect_past_runs(shared, past)


def past_runs(studio: Studio) -> PastRuns:
    """The accordion of past runs: the list, and a picker to open one or load its settings."""
    listed = studio.runs.summaries()
    with gr.Accordion("Past runs", open=False):
        runs = gr.Dataframe(runs_rows(studio, listed), headers=run_columns(studio), interactive=False,
                            max_height=320, elem_id="train-runs")
        with gr.Row():
            choice = gr.Dropdown([run["id"] for run in listed], value=None, label="Run", scale=3,
                                 elem_id="train-run-choice", info="Click a row above or pick a run, then Open.")
            open_run = gr.Button("Open", scale=1, elem_id="train-open")
            load_settings = gr.Button("Load these settings", scale=1, elem_id="train-load-settings")
            refresh_runs = gr.Button("Refresh list", scale=1, elem_id="train-refresh-runs")
    return PastRuns(runs, choice, open_run, load_settings, refresh_runs)


def connect_past_runs(shared: Shared, past: PastRuns) -> None:
    studio = shared.studio
    shared.runs_list = [past.runs, past.choice]
    past.runs.select(first_cell, None, [past.choice], api_visibility="private")
    past.open.click(chosen_or_unchanged, [past.choice], [shared.run_id], api_name="train_open")
    # The picked run's settings, or the shown run's, back in every tab (asking first if the form was edited).
    shared.offer_draft(past.load_settings.click, functools.partial(settings_of_run, studio),
                       [past.choice, shared.run_id])
    past.refresh.click(functools.partial(runs_outputs, studio), None, [past.runs, past.choice], api_name="train_runs",
                       show_progress="hidden")
