"""The Train tab: plots, rollout viewer and status pieces, and the live monitor driven through its tick handler
while a tiny run trains (handlers found by api_name in the built app; runs started as the Model tab's Start does)."""

from __future__ import annotations

import re
import time
import types
from dataclasses import fields

import gradio as gr
import plotly.graph_objects as go
import pytest
from conftest import handler, said

from dragon_ui import public
from dragon_ui.engine import training
from dragon_ui.errors import ConfigError
from dragon_ui.runstore import ACTIVE_STATES, RunDir
from dragon_ui.studio import monitor
from dragon_ui.studio.backend import Studio
from dragon_ui.studio.draft import same_settings
from dragon_ui.ui import model_tab, plots, train_tab
from dragon_ui.ui.train_tab import TrainView
from dragon_ui.public import LAPTOP

pytestmark = pytest.mark.timeout(300)
SKIP = gr.skip()


def skipped(value) -> bool:
    return isinstance(value, dict) and value == SKIP


def view(values: tuple) -> TrainView:
    return TrainView(*values)


@pytest.fixture
def tiny_draft(studio, tiny_config_dict) -> dict:
    draft = studio.recipes.default()
    draft.update({key: value for key, value in tiny_config_dict.items() if key != "runs_dir"})
    return draft


# ----------------------------------------------------------------------------------------------------------------
# Pure pieces.

ROWS = [{"step": 1, "reward": 0.2, "reward_std": 0.3, "rewards": {"numeric": 0.1, "length": 0.4}, "kl": 0.0,
         "completion_len": 12.0, "no_spread_share": 0.5},
        {"step": 2, "reward": 0.4, "reward_std": 0.2, "rewards": {"numeric": 0.3, "length": 0.5}, "kl": 0.01,
         "completion_len": 9.0, "no_spread_share": 0.25}]


@pytest.mark.parametrize("build", [plots.reward_figure, plots.spread_figure, plots.kl_figure, plots.length_figure])
def test_empty_plots_say_no_steps_yet(build):
    figure = build([])
    assert isinstance(figure, go.Figure) and not figure.data
    assert [a.text for a in figure.layout.annotations] == ["No steps yet"]
    assert figure.layout.height == plots.HEIGHT and figure.layout.uirevision == plots.UIREVISION


def test_plots_of_progress_rows():
    reward = plots.reward_figure(ROWS)
    assert [trace.name for trace in reward.data] == ["total", "numeric", "length"]
    assert list(reward.data[0].x) == [1, 2] and list(reward.data[0].y) == [0.2, 0.4]
    assert reward.layout.uirevision == plots.UIREVISION and not reward.layout.annotations
    assert [t.name for t in plots.reward_figure(ROWS, ["numeric"]).data] == ["total", "numeric"]
    assert [t.name for t in plots.spread_figure(ROWS).data] == ["reward std", "groups with no spread"]
    assert list(plots.kl_figure(ROWS).data[0].y) == [0.0, 0.01]
    length = plots.length_figure(ROWS, max_new_tokens=16)
    assert [t.name for t in length.data] == ["mean completion length", "cap"] and list(length.data[1].y) == [16, 16]


def test_kl_plot_explains_a_missing_kl():
    figure = plots.kl_figure([{**row, "kl": None} for row in ROWS])
    assert not figure.data and figure.layout.annotations[0].text == "No KL: it is only computed when beta > 0"


def completion(text: str, total: float, advantage: float) -> dict:
    return {"text": text, "scores": {"numeric": total, "length": 1.0}, "total": total, "advantage": advantage}


def test_rollouts_are_escaped_and_best_and_worst_highlighted():
    rollout = {"step": 7, "groups": [
        {"prompt": "What is 2 + 2? <b>", "reference": "4",
         "completions": [completion("<script>alert(1)</script>", 0.0, -1.0), completion("4", 1.0, 1.0),
                         completion("four", 0.5, 0.0)]},
        {"prompt": "Same?", "reference": "x", "completions": [completion("a", 1.0, 0.0), completion("b", 1.0, 0.0)]},
    ]}
    text = train_tab.rollouts_html(rollout, ["numeric", "length"])
    assert "<script>" not in text and "&lt;script&gt;alert(1)&lt;/script&gt;" in text
    assert "What is 2 + 2? &lt;b&gt;" in text and "<b>Step 7</b>: 2 of 2 prompts" in text
    assert text.count(train_tab.BEST_STYLE) == 1 and text.count(train_tab.WORST_STYLE) == 1
    best_row = text[text.index(train_tab.BEST_STYLE):]
    assert best_row.index(">4<") < best_row.index("</tr>")
    assert text.count("Every completion scored the same") == 1  # the second group
    assert "<th>numeric</th><th>length</th><th>Total</th><th>Advantage</th>" in text
    assert "No completions yet" in train_tab.rollouts_html(None, [])
    many = {"step": 1, "groups": rollout["groups"] * 5}
    assert "4 of 10 prompts" in train_tab.rollouts_html(many, ["numeric"])


@pytest.mark.parametrize("status, shown, note", [
    ({"state": "cancelled", "latest_checkpoint": "checkpoint-4"}, "**stopped — can resume**",
     [("info", "Stopped, not finished: Resume continues from checkpoint-4.")]),
    ({"state": "cancelled"}, "**stopped — can resume**",
     [("info", "Stopped, not finished: Resume starts it again, since it stopped before its first checkpoint.")]),
    ({"state": "running", "phase": "training"}, "**running** · training", []),
    ({"state": "queued", "phase": "waiting to resume"}, "**queued** · waiting to resume", []),
    ({"state": "succeeded", "phase": "done"}, "**succeeded**", []),
    ({"state": "cancelled", "phase": "done", "latest_checkpoint": "checkpoint-4"}, "**stopped — can resume**",
     [("info", "Stopped, not finished: Resume continues from checkpoint-4.")]),
])
def test_states_read_as_people_read_them(status, shown, note):
    """A stopped run said "cancelled", which sounds final; it resumes from its latest checkpoint. An ended run's
    header reads its state alone: "stopped — can resume · done" said two."""
    line, *notes = said(train_tab.status_markdown("run-1", status))
    assert line[1].endswith(shown) and notes == note and "cancelled" not in line[1]


@pytest.mark.parametrize("state, shown", [("cancelled", "stopped — can resume"), ("failed", "failed"),
                                          ("succeeded", "succeeded"), ("running", "running")])
def test_runs_table_states_and_first_start(state, shown):
    first_start = time.mktime((2025, 3, 4, 9, 30, 0, 0, 0, -1))
    run = {"id": "r", "state": state, "step": 3, "total_steps": 10, "reward": 0.5, "heldout_before": None,
           "heldout_after": None, "model": "m", "started_at": first_start}
    assert train_tab.runs_table([run]) == [["r", shown, "3/10", "0.50", "–", "–", "m", "2025-03-04 09:30"]]


def test_status_line_and_progress_bar():
    status = {"state": "failed", "phase": "done", "device": "cpu", "dtype": "float32", "cpu_threads": 1,
              "error": "The model ran out of memory."}
    (_, line), reason = said(train_tab.status_markdown("run-1", status))
    assert line.startswith("Run `run-1` · ") and line.endswith(" **failed** · cpu float32, 1 thread")
    assert reason == ("error", "The model ran out of memory.")
    bar = train_tab.progress_html({"state": "running", "step": 5, "total_steps": 20, "elapsed_s": 50, "eta_s": 150})
    assert "width:25.0%" in bar and "Step 5 / 20 · 25% · elapsed 50 s · about 2 min left" in bar
    assert "Step 0 / ?" in train_tab.progress_html({"state": "queued"})


def test_alerts_markdown():
    from dragon_ui.studio.monitor import Alert

    assert train_tab.alerts_markdown([]) == ""
    text = train_tab.alerts_markdown([Alert("warn", "Title", "Do this."), Alert("error", "Broken", "Fix it.")])
    assert said(text) == [("warn", "**Title.** Do this."), ("error", "**Broken.** Fix it.")]


# ----------------------------------------------------------------------------------------------------------------
# The live monitor.


def test_tick_without_a_run_changes_nothing_and_stops_the_timer(app):
    result = view(handler(app, "train_tick")("", {}))
    assert all(skipped(getattr(result, f.name)) for f in fields(TrainView) if f.name != "timer")
    assert isinstance(result.timer, gr.Timer) and not result.timer.active
    shown = view(handler(app, "train_show")("", {}))
    assert shown.status == train_tab.NO_RUN and not shown.timer.active


def test_the_tick_answers_with_a_fingerprint_and_the_view_refreshes_only_when_it_changes(app, studio, monkeypatch):
    """Every second the page asks for one small value (train_tab.tick); the view (charts, completions, log) is
    refreshed through that value's change, so a quiet second costs the page nothing."""
    (timer,) = [block for block in app.blocks.values() if isinstance(block, gr.Timer)]
    (tick,) = [fn for fn in app.fns.values() if (timer._id, "tick") in fn.targets]
    (seen,) = tick.outputs
    assert isinstance(seen, gr.State)
    (refreshing,) = [fn for fn in app.fns.values() if (seen._id, "change") in fn.targets]
    assert refreshing.api_name == "train_tick" and len(refreshing.outputs) == len(fields(TrainView))

    monkeypatch.setattr(monitor, "time", types.SimpleNamespace(time=lambda: 1000.0))
    run = RunDir.create(studio.runs_dir, "ticked")
    (run.path / "config.json").write_text("{}", encoding="utf-8")
    run.update_status(state="running", step=0)
    first = train_tab.tick(studio, run.id, {})
    assert train_tab.tick(studio, run.id, {}) == first  # nothing new: the same answer, no refresh
    run.append_progress({"step": 1, "reward": 0.5})
    assert train_tab.tick(studio, run.id, {}) != first
    assert train_tab.tick(studio, "", {}) == ["", None, ""]
    assert train_tab.tick(studio, "../elsewhere", {}) == ["../elsewhere"]  # refresh says there is no such run

    run.update_status(state="queued", waiting=True)  # a waiting run: its place in the queue counts too
    shown = view(handler(app, "train_tick")(run.id, {}))
    assert train_tab.tick(studio, run.id, shown.watch)[-1] == studio.runs.place(run.id) != ""


def test_start_then_ticks_follow_the_run_to_its_end(app, studio, tiny_draft):
    run_id, *_ = model_tab.start_run(studio, tiny_draft)
    shown = view(handler(app, "train_show")(run_id, {}))  # shared.run_id changed
    assert shown.timer.active and shown.stop.interactive and not shown.resume.interactive
    # Then the server follows it while it starts, until it trains (well before the follower's time is up).
    began = time.monotonic()
    followed = [view(values) for values in handler(app, "train_follow")(run_id, shown.watch)]
    assert time.monotonic() - began < train_tab.FOLLOW_AT_MOST_S
    assert followed[-1].outputs() == (SKIP,) * len(fields(TrainView))  # ends leaving the page as it is
    last = (followed[-2] if len(followed) > 1 else shown).watch["snapshot"]["status"]
    assert last.get("step") or last["phase"].startswith("training") or last["state"] not in ACTIVE_STATES, last
    assert shown.status.startswith(f"Run `{run_id}` · ")
    assert run_id in [row[0] for row in shown.runs]

    tick, watch = handler(app, "train_tick"), shown.watch
    seen = {"status": [], "plots": 0, "rollouts": [], "timer": [], "stop": [], "banner": [], "banner_shown": []}
    (handle,) = training.active_runs()
    while True:
        alive = handle.is_alive()
        result = view(tick(run_id, watch))
        watch = result.watch
        if not skipped(result.status):
            seen["status"].append(result.status)
        if not skipped(result.reward_plot):
            seen["plots"] += 1
        if not skipped(result.rollouts):
            seen["rollouts"].append(result.rollouts)
        if not skipped(result.timer):
            seen["timer"].append(result.timer.active)
            seen["stop"].append(result.stop.interactive)
        if not skipped(result.banner_text):
            seen["banner"].append(said(result.banner_text))
        if not skipped(result.banner):
            seen["banner_shown"].append(result.banner.visible)
        if not alive:
            break
        time.sleep(0.2)

    line, held_out = said(seen["status"][-1])
    assert "**succeeded**" in line[1] and held_out[0] == "ok" and held_out[1].startswith("Held-out reward")
    assert seen["timer"][-1] is False and seen["stop"][-1] is False  # the run ended: the timer stops, Stop greys out
    # The banner above the tabs (a reload while it trained shows it) follows each step, and goes when the run ends.
    steps = [int(re.search(r"step (\d+) of", words).group(1)) for ((kind, words),) in seen["banner"]]
    assert steps == sorted(steps) and seen["banner_shown"] == [False]
    assert seen["plots"] >= 1 and "<b>Step 2</b>" in seen["rollouts"][-1]
    assert [row["step"] for row in watch["snapshot"]["progress"]] == [1, 2]
    assert "Run " in watch["snapshot"]["log"] and "succeeded" in watch["snapshot"]["log"]

    again = view(tick(run_id, watch))  # nothing new: everything skipped
    assert again.outputs()[1:] == (SKIP,) * (len(again.outputs()) - 1)

    reopened = view(handler(app, "train_show")(run_id, {}))  # a page reload re-renders everything from the files
    assert [t.name for t in reopened.reward_plot.data] == ["total", "numeric", "length", "held-out check (6 prompts)"]
    assert list(reopened.reward_plot.data[0].x) == [1, 2]
    assert list(reopened.reward_plot.data[-1].x) == [0, 1, 2]  # the starting model, then a check after each step
    assert list(reopened.reward_plot.data[-1].y) == [row["reward"] for row in studio.runs.get(run_id).read_heldout()]
    assert "<b>Step 2</b>" in reopened.rollouts and not reopened.timer.active

    # "Load these settings" gives the run's settings back as a draft, to train them again or change them.
    settings, label = studio.runs.settings_of(run_id)
    assert same_settings(settings, tiny_draft, policy=LAPTOP) and run_id in label
    assert settings["runs_dir"] == str(studio.runs_dir)
    with pytest.raises(ConfigError, match="Choose a run first"):
        studio.runs.settings_of("")


def test_stop_cancels_then_resume_continues(app, studio, tiny_draft):
    tiny_draft["training"].update(max_steps=200, save_steps=100)
    run_id, *_ = model_tab.start_run(studio, tiny_draft)
    (handle,) = training.active_runs()
    run = studio.runs.get(run_id)
    deadline = time.time() + 120
    while not run.read_progress() and time.time() < deadline:  # wait for the first step
        time.sleep(0.1)

    stopping = handler(app, "train_stop")(run_id)
    assert said(stopping) == [("ok", "Stopping: the step under way ends at once and the last whole step is saved, so you can resume.")]
    assert handle.wait(120) == "cancelled"
    assert "is not training (it is stopped — can resume)" in handler(app, "train_stop")(run_id)
    shown = view(handler(app, "train_show")(run_id, {}))
    line, resumes = said(shown.status)
    assert "**stopped — can resume**" in line[1] and resumes[1].startswith("Stopped, not finished: Resume continues "
                                                                          "from checkpoint-")
    assert shown.resume.interactive and not shown.stop.interactive
    first_start = run.read_status()["started_at"]

    text, timer = handler(app, "train_resume")(run_id)
    ((kind, words),) = said(text)
    assert kind == "ok" and words.startswith(f"Resuming {run_id} from checkpoint-") and timer.active
    (resumed,) = training.active_runs()
    busy_text, busy_timer = handler(app, "train_resume")(run_id)
    ((kind, words),) = said(busy_text)
    assert kind == "error" and busy_timer == SKIP  # still starting (queued) or already running
    assert re.fullmatch(rf"The run {run_id} is still (queued|running); stop it before resuming\.", words)
    studio.runs.stop(run_id)
    assert resumed.wait(120) == "cancelled"
    status = run.read_status()
    assert status["started_at"] == first_start < status["resumed_at"]  # the runs list's "Started" is the first start
    (row,) = train_tab.runs_table(studio.runs.summaries())
    assert row[1] == "stopped — can resume"
    assert row[-1] == time.strftime("%Y-%m-%d %H:%M", time.localtime(first_start))


def test_open_a_past_run(app, studio):
    assert handler(app, "train_open")("20250101-000000-old") == "20250101-000000-old"
    assert handler(app, "train_open")(None) == SKIP
    table, choices = handler(app, "train_runs")()
    assert table == [] and choices.choices == []
    missing = view(handler(app, "train_show")("no-such-run", {}))
    ((kind, words),) = said(missing.status)
    assert kind == "error" and words.startswith("There is no run called 'no-such-run'")


def test_the_page_shows_only_the_fields_the_tabs_placed(app):
    """A component made while the page is built is shown on it: the run picker's update, made once to fill the runs
    list, was a stray unlabelled "Dropdown" under Past runs. Every field placed on purpose has an id."""
    strays = [(type(block).__name__, block.label) for block in app.blocks.values()
              if isinstance(block, gr.components.FormComponent) and not isinstance(block, (gr.State, gr.BrowserState))
              and not block.elem_id]
    assert strays == []


def test_only_its_owner_follows_a_starting_run_so_no_visitor_holds_the_follower(tmp_path, monkeypatch):
    monkeypatch.setenv(public.PUBLIC_ENV, "1")
    studio = Studio(runs_dir=tmp_path / "runs", policy=public.Policy.from_env(tmp_path / "runs"))
    starting = {"snapshot": {"status": {"state": "running", "phase": "starting", "owner": "alice"}}}
    with public.visiting(public.Visitor(key="bob")):
        began = time.monotonic()
        assert list(train_tab.follow_start(studio, "any", starting)) == [(SKIP,) * len(fields(TrainView))]
        assert time.monotonic() - began < train_tab.FOLLOW_EVERY_S  # returned at once, without a look at the files


def test_a_completion_that_called_tools_shows_each_turn_escaped_and_the_tools_answers_greyed():
    from dragon_ui.ui.train_tab import completion_html, rollouts_html

    turns = [{"role": "assistant", "text": "Let me <b>check</b>.", "calls": [
                 {"name": "calculator", "arguments": {"expression": "437 × 478"}}]},
             {"role": "tool", "name": "calculator", "text": "<script>alert(1)</script>"},
             {"role": "assistant", "text": "208886", "calls": []}]
    shown = completion_html("208886", turns)
    assert "Let me &lt;b&gt;check&lt;/b&gt;." in shown and "<script>" not in shown
    assert '<code>calculator(expression=&quot;437 × 478&quot;)</code>' in shown
    assert "class='tool-answer'" in shown and "(not trained on)" in shown and "&lt;script&gt;" in shown
    assert shown.endswith("<b>Answer:</b> <span style='white-space:pre-wrap'>208886</span></div>")
    assert shown.count("208886") == 1  # the final reply is shown once, as the answer
    stuck = completion_html("", turns[:2])
    assert "no answer: it ended calling a tool" in stuck
    assert completion_html("<i>85</i>", None) == "<span style='white-space:pre-wrap'>&lt;i&gt;85&lt;/i&gt;</span>"
    rollout = {"step": 1, "groups": [{"prompt": "What is 437 × 478?", "reference": "208886", "completions": [
        {"text": "208886", "turns": turns, "scores": {"answer": 1.0}, "total": 1.0, "advantage": 0.7}]}]}
    assert "(not trained on)" in rollouts_html(rollout, ["answer"])
    sampled = {"step": 1, "groups": [{"prompt": "q", "reference": "r", "completions": ["208886", "12"],
                                      "turns": [turns, None]}]}
    assert rollouts_html(None, ["answer"], sampling=sampled).count("(not trained on)") == 1


def test_the_explain_handler_gets_the_clicked_groups_data_from_gradio(studio):
    """The handler is explain_clicked with the studio given (common.bound): gradio still sees its ``event``
    parameter, and so passes the click's data. With functools.partial it saw no annotation and passed none."""
    from gradio.helpers import special_args

    from dragon_ui.ui.common import bound

    clicked = bound(train_tab.explain_clicked, studio)
    inputs, _, at, _ = special_args(clicked, ["a-run", {}], None, gr.EventData(None, {"step": 1, "group": 2}))
    assert at == 2 and inputs[:2] == ["a-run", {}] and inputs[2]._data == {"step": 1, "group": 2}
    with pytest.raises(gr.Error, match=re.escape(train_tab.PRESS_EXPLAIN)):
        clicked("a-run", {}, gr.EventData(None, {"step": "1", "group": 2}))


def test_an_explanation_and_the_refreshes_take_turns_within_a_page(app):
    """A refresh that read no open explanation, answering after the click, drew the completions over the panel."""
    groups = {fn.api_name: fn.concurrency_id for fn in app.fns.values()
              if fn.api_name in ("train_tick", "train_show", "train_explain")}
    assert len(groups) == 3 and len(set(groups.values())) == 1, groups


def test_load_these_settings_takes_the_run_picked_else_the_run_shown(studio, finished_run):
    draft, what = train_tab.settings_of_run(studio, None, finished_run.id)
    assert what == f"the settings of run {finished_run.id}"
    assert draft["grpo"] == finished_run.read_config().to_dict()["grpo"]
    assert train_tab.settings_of_run(studio, finished_run.id, "another-run")[1] == what
    with pytest.raises(ConfigError, match="Choose a run first."):
        train_tab.settings_of_run(studio, "", "")


def test_a_refresh_of_an_unchanged_run_leaves_every_output_alone(studio, finished_run):
    first = train_tab.refresh(studio, finished_run.id, {})
    assert train_tab.shown_status(first.watch)["state"] == "succeeded" and not skipped(first.status)
    again = train_tab.refresh(studio, finished_run.id, first.watch)
    assert again.watch["run_id"] == finished_run.id and all(skipped(value) for value in again.outputs()[1:])
    assert train_tab.shown_status({}) == {} and train_tab.shown_status(None) == {}
