"""Tab 5, Compare: the starting model against the trained one on held-out prompts, a free prompt, and exports.

Handlers are module-level functions taking the Studio first (wired with functools.partial), so tests call exactly
what the buttons call. The work behind them lives in studio/compare.py.
"""

from __future__ import annotations

import functools
import threading
from dataclasses import dataclass

import gradio as gr
import pandas as pd
import plotly.graph_objects as go

from ..studio import compare
from ..studio.backend import Studio
from .common import ONE_MODEL_AT_A_TIME, Shared, explain, message, shows_errors, tab_being_built

CHART_HEIGHT = 340
BEFORE_COLOR, AFTER_COLOR = "#94a3b8", "#10b981"
EMPTY_REPLY = "(empty reply)"
NO_RUN = ("No run to compare yet: start one on the Model & Hardware tab. A run appears here once it has scored its "
          "starting model or saved weights.")

# Runs whose "Evaluate now" was cancelled: the evaluation checks this between batches (gradio's cancel alone would
# leave the batch running in its worker thread and the model busy).
_cancel_requests: set[str] = set()
_cancel_lock = threading.Lock()


def chart(bars: list[dict]) -> go.Figure | None:
    """Grouped bars, before vs after, for the total and each reward (None clears the plot when nothing is scored)."""
    if not bars:
        return None
    labels = [bar["reward"] for bar in bars]
    figure = go.Figure()
    for side, color in (("before", BEFORE_COLOR), ("after", AFTER_COLOR)):
        values = [bar[side] for bar in bars]
        figure.add_trace(go.Bar(name="before training" if side == "before" else "after training", x=labels, y=values,
                                marker_color=color, text=["" if v is None else f"{v:.2f}" for v in values],
                                textposition="outside", cliponaxis=False))  # a label above a full bar stays whole
    figure.update_layout(barmode="group", height=CHART_HEIGHT, uirevision="compare", margin=dict(l=40, r=20, t=40, b=40),
                         title="Mean held-out reward (greedy replies)", yaxis_title="mean reward",
                         legend=dict(orientation="h", y=1.02, x=1, xanchor="right", yanchor="bottom"),
                         template="plotly_white")  # the Train tab's charts use it too
    return figure


def table(rows: list[list]) -> pd.DataFrame:
    """The sample rows; a scored reply that is empty says so, or it would look like a side not scored yet."""
    def shown(row: list) -> list:
        prompt, reference, before, after, before_reward, after_reward, *rest = row
        replies = [EMPTY_REPLY if reward is not None and not str(reply).strip() else reply
                   for reply, reward in ((before, before_reward), (after, after_reward))]
        return [prompt, reference, *replies, before_reward, after_reward, *rest]

    return pd.DataFrame([shown(row) for row in rows], columns=compare.TABLE_HEADERS)


def run_choices(studio: Studio) -> list[tuple[str, str]]:
    return compare.comparable_runs(studio.runs.summaries())


def pick(choices: list[tuple[str, str]], *preferred: str) -> str | None:
    """The first preferred run id that is in the list, else the newest run, else None."""
    ids = [run_id for _, run_id in choices]
    return next((run_id for run_id in preferred if run_id in ids), ids[0] if ids else None)


def comparison_outputs(studio: Studio, run_id: str | None):
    """Summary, chart, table, whether Evaluate now is offered, and a prompt of the run's own to offer the free
    prompt, for one run."""
    if not run_id:
        return message(NO_RUN, "info"), None, table([]), gr.Row(visible=False), gr.Textbox(placeholder="")
    shown = compare.comparison(studio.runs.get(run_id), compare.awaits_its_after(studio, run_id))
    return (message(shown.summary, "info"), chart(shown.bars), table(shown.table), gr.Row(visible=shown.can_evaluate),
            gr.Textbox(placeholder=shown.example_prompt))


show_run = shows_errors(comparison_outputs)


@shows_errors
def refresh(studio: Studio, preferred: str | None, fallback: str | None):
    """Re-list the runs and show one: ``preferred`` if it is listed, else ``fallback``, else the newest.

    The Refresh button prefers the run on screen; a change of the shared run (Train tab, page load) prefers that one.
    """
    choices = run_choices(studio)
    chosen = pick(choices, preferred or "", fallback or "")
    return (gr.Dropdown(choices=choices, value=chosen), *show_run(studio, chosen))


def evaluate(studio: Studio, run_id: str | None):
    """Generator: progress lines while evaluate_now runs, then the refreshed comparison.

    Errors become the status line (a generator's exceptions would escape shows_errors)."""
    keep = (gr.skip(),) * 5
    if not run_id:
        yield message("Choose a run first.", "error"), *keep
        return
    with _cancel_lock:
        _cancel_requests.discard(run_id)
    stopped = threading.Event()

    def should_stop() -> bool:
        if run_id in _cancel_requests:
            stopped.set()
        return stopped.is_set()

    try:
        for progress in compare.rescore(studio, run_id, should_stop):
            yield message(progress, "info"), *keep
        yield message(progress, "warn" if stopped.is_set() else "ok"), *comparison_outputs(studio, run_id)
    except Exception as exc:
        yield message(explain(exc), "error"), *keep


def scoring_due(studio: Studio, run_id: str | None) -> str | dict:
    """The run shown, when it is one's own and ended without scoring its trained model (a stop): nobody should
    have to find Evaluate now. It becomes the page's run due for scoring, which starts the scoring when it changes:
    once per run shown, so that a cancelled or failed scoring is not started again at every look, and a page with
    nothing to score waits for no turn."""
    return run_id if run_id and compare.awaits_its_after(studio, run_id) else gr.skip()


def evaluate_unscored(studio: Studio, run_id: str | None):
    """The scoring of the run due (scoring_due), as Evaluate now does it, if it is still due."""
    if run_id and compare.awaits_its_after(studio, run_id):
        yield from evaluate(studio, run_id)
    else:  # gradio clears every output of a generator that yields nothing
        yield (gr.skip(),) * 6


@shows_errors
def cancel_evaluation(studio: Studio, run_id: str | None) -> str:
    if run_id:
        studio.runs.owned(run_id, "cancel its scoring")
    with _cancel_lock:
        _cancel_requests.add(run_id or "")
    return message("Cancelling after the current batch of prompts...", "warn")


@shows_errors
def ask(studio: Studio, run_id: str | None, prompt: str, max_new_tokens: int, temperature: float):
    """The free prompt answered by the starting and the trained model of one's own run."""
    if not run_id:
        raise gr.Error("Choose a run first.", print_exception=False)
    return compare.answer_both(studio, studio.runs.owned(run_id, "ask its models"), prompt, max_new_tokens,
                               temperature)


@shows_errors
def download_adapter(studio: Studio, run_id: str | None) -> str:
    if not run_id:
        raise gr.Error("Choose a run first.", print_exception=False)
    return compare.adapter_download(studio, run_id)


@shows_errors
def merge(studio: Studio, run_id: str | None):
    """(zip, folder, sentence): the merged full model to download, its folder on the server, and both sizes."""
    if not run_id:
        raise gr.Error("Choose a run first.", print_exception=False)
    archive, shown, said = compare.merged_download(studio, run_id)
    return archive, shown, message(said, "ok")


GGUF_BUTTON = "Download as GGUF (llama.cpp, Ollama)"
GGUF_PRECISIONS = [("q8_0 (smaller)", "q8_0"), ("f16", "f16")]
GGUF_FILES = "GGUF model and its Ollama Modelfile (save both in one folder)"


@shows_errors
def download_gguf(studio: Studio, run_id: str | None, quant: str):
    """([.gguf, Modelfile], sentence): the merged model as one GGUF file for llama.cpp, Ollama or LM Studio."""
    if not run_id:
        raise gr.Error("Choose a run first.", print_exception=False)
    files, said = compare.gguf_download(studio, run_id, quant)
    return files, message(said, "ok")


PUBLISH_KINDS = {"The LoRA adapter (small; loads on the Hub model it names)": False,
                 "The merged full model (loads with transformers alone)": True}


def publish(studio: Studio, run_id: str | None, repo: str, kind: str, private: bool, update: bool,
            token: str) -> str:
    """Upload the run to the Hub; the outcome (a link, or the one sentence of what went wrong) shows in the panel."""
    if not run_id:
        return message("Choose a run first.", "error")
    try:
        published = compare.publish_run(studio, run_id, repo, PUBLISH_KINDS.get(kind, False), bool(private),
                                        bool(update), token)
    except Exception as exc:  # noqa: BLE001 - every failure is a sentence in the panel
        return message(explain(exc), "error")
    what = "merged model" if published.merged else "adapter"
    return message(f"Published the {what} with its model card ({len(published.files)} files): "
                   f"[{published.repo_id}]({published.url})", "ok")


@dataclass
class AskBoth:
    """The free prompt, answered by both models."""

    prompt: gr.Textbox
    max_new_tokens: gr.Slider
    temperature: gr.Slider
    button: gr.Button
    cancel: gr.Button
    before: gr.Textbox
    after: gr.Textbox


@dataclass
class TakeAway:
    """The trained model as a download (the adapter, the merged model, a GGUF file), or published to the Hub."""

    zip_button: gr.Button
    merge_button: gr.Button
    zip_file: gr.File
    merged_file: gr.File
    merged_folder: gr.Textbox
    merge_status: gr.Markdown
    gguf_quant: gr.Radio
    gguf_button: gr.Button
    gguf_files: gr.File
    gguf_status: gr.Markdown
    repo: gr.Textbox
    token: gr.Textbox
    kind: gr.Radio
    private: gr.Checkbox
    update: gr.Checkbox
    publish_button: gr.Button
    publish_status: gr.Markdown


def build(shared: Shared) -> None:
    studio = shared.studio
    this_tab = tab_being_built()
    choices = run_choices(studio)
    with gr.Row(equal_height=True):
        # Custom values: API clients name any run id (an unknown one gets a sentence, not gradio's choice check).
        run_picker = gr.Dropdown(choices, value=pick(choices), label="Run", scale=4, allow_custom_value=True,
                                 info="Runs that have scored the starting model or saved trained weights.",
                                 elem_id="compare-run")
        refresh_button = gr.Button("↻ Refresh", size="sm", scale=0, min_width=110, elem_id="compare-refresh")
        load_settings = gr.Button("Load these settings", size="sm", scale=0, min_width=170,
                                  elem_id="compare-load-settings")
    summary = gr.Markdown(elem_id="compare-summary")
    with gr.Row(visible=False, elem_id="compare-evaluate-row") as evaluate_row:
        evaluate_button = gr.Button("Evaluate now", variant="primary", elem_id="compare-evaluate")
        cancel_button = gr.Button("Cancel", variant="stop", elem_id="compare-cancel")
    evaluate_status = gr.Markdown(elem_id="compare-evaluate-status")
    plot = gr.Plot(label="Before vs after", elem_id="compare-chart")
    samples = gr.Dataframe(value=table([]), headers=compare.TABLE_HEADERS, interactive=False, wrap=True,
                           max_height=420, label="Held-out prompts answered by both models", elem_id="compare-table",
                           column_widths=["22%", "8%", "20%", "20%", "8%", "8%", "14%"])
    asking = ask_both(studio)
    away = take_away(studio)
    shown = [summary, plot, samples, evaluate_row, asking.prompt]
    refresh_button.click(functools.partial(refresh, studio), [run_picker, shared.run_id], [run_picker, *shown],
                         api_name="compare_runs")
    shared.run_id.change(functools.partial(refresh, studio), [shared.run_id, run_picker], [run_picker, *shown],
                         api_visibility="private")
    # A run becomes comparable (its starting model scored, a stop, the end of training) while another tab is open:
    # opening this tab re-lists the runs and shows the one the Train tab shows.
    opened = this_tab.select(functools.partial(refresh, studio), [shared.run_id, run_picker], [run_picker, *shown],
                             api_visibility="private", show_progress="hidden")
    picked = run_picker.input(functools.partial(show_run, studio), [run_picker], shown, api_name="compare_show")
    due = gr.State("")  # the run whose trained model is scored without a click (scoring_due)
    for shown_now in (opened, picked):
        shown_now.then(functools.partial(scoring_due, studio), [run_picker], [due], api_visibility="private",
                       show_progress="hidden")
    due.change(functools.partial(evaluate_unscored, studio), [due], [evaluate_status, *shown],
               api_visibility="private", show_progress="hidden", **ONE_MODEL_AT_A_TIME)
    shared.offer_draft(load_settings.click, studio.runs.settings_of, [run_picker])
    evaluation = evaluate_button.click(functools.partial(evaluate, studio), [run_picker], [evaluate_status, *shown],
                                       api_name="compare_evaluate", **ONE_MODEL_AT_A_TIME)
    cancel_button.click(functools.partial(cancel_evaluation, studio), [run_picker], [evaluate_status],
                        cancels=[evaluation], api_name="compare_cancel")
    connect_ask_both(studio, run_picker, asking)
    connect_take_away(studio, run_picker, away)


def ask_both(studio: Studio) -> AskBoth:
    gr.Markdown("### Ask both models")
    with gr.Row():
        prompt = gr.Textbox(label="Your prompt", lines=2, scale=4, elem_id="compare-prompt",
                            info="Any prompt; the example is one of the run's held-out prompts.")
        with gr.Column(scale=1, min_width=220):
            most = compare.most_new_tokens(policy=studio.policy)
            max_new_tokens = gr.Slider(8, most, value=min(128, most), step=8, label="Max new tokens",
                                       elem_id="compare-max-tokens")
            temperature = gr.Slider(0.0, 1.5, value=0.0, step=0.05, label="Temperature (0 = greedy)",
                                    elem_id="compare-temperature")
    with gr.Row():
        button = gr.Button("Ask both", variant="primary", elem_id="compare-ask")
        cancel = gr.Button("Cancel", elem_id="compare-ask-cancel")
    with gr.Row():
        before = gr.Textbox(label="Before training", lines=4, interactive=False, elem_id="compare-before")
        after = gr.Textbox(label="After training", lines=4, interactive=False, elem_id="compare-after")
    return AskBoth(prompt, max_new_tokens, temperature, button, cancel, before, after)


def take_away(studio: Studio) -> TakeAway:
    gr.Markdown("### Take the trained model with you")
    with gr.Row():
        zip_button = gr.Button("Zip the adapter", elem_id="compare-zip")
        merge_button = gr.Button("Merge into a full model", elem_id="compare-merge")
    with gr.Row():
        zip_file = gr.File(label="Adapter (.zip with its model card and how to load it with peft)", interactive=False,
                           elem_id="compare-zip-file")
        with gr.Column():
            merged_file = gr.File(label="Merged full model (.zip of the folder below)", interactive=False,
                                  elem_id="compare-merged-file")
            merged_folder = gr.Textbox(label="Merged model folder on the server", interactive=False,
                                       elem_id="compare-merged-folder")
    merge_status = gr.Markdown(elem_id="compare-merge-status")
    with gr.Row(equal_height=True):
        gguf_quant = gr.Radio(GGUF_PRECISIONS, value="q8_0", label="GGUF precision", scale=1,
                              elem_id="compare-gguf-quant")
        gguf_button = gr.Button(GGUF_BUTTON, scale=1, elem_id="compare-gguf")
    gguf_files = gr.File(label=GGUF_FILES, file_count="multiple", interactive=False, elem_id="compare-gguf-file")
    gguf_status = gr.Markdown(label="GGUF export", elem_id="compare-gguf-status")
    with gr.Accordion("Publish to the Hugging Face Hub", open=False, elem_id="compare-publish"):
        with gr.Row():
            repo = gr.Textbox(label="Repo name", placeholder="your-user-name/arith-grpo", scale=2,
                              elem_id="compare-publish-repo")
            token = gr.Textbox(label="Hugging Face token (write access)", type="password", scale=2,
                               elem_id="compare-publish-token",
                               placeholder="hf_... (required on this public demo)" if studio.public
                               else "hf_... (empty: the token this machine is logged in with)")
        with gr.Row():
            kind = gr.Radio(list(PUBLISH_KINDS), value=next(iter(PUBLISH_KINDS)), label="What to upload", scale=3,
                            elem_id="compare-publish-kind")
            with gr.Column(scale=1, min_width=200):
                private = gr.Checkbox(value=False, label="Private repo", elem_id="compare-publish-private")
                update = gr.Checkbox(value=False, label="Update it if it exists", elem_id="compare-publish-update")
        publish_button = gr.Button("Publish", variant="primary", elem_id="compare-publish-button")
        publish_status = gr.Markdown(elem_id="compare-publish-status")
    return TakeAway(zip_button, merge_button, zip_file, merged_file, merged_folder, merge_status, gguf_quant,
                    gguf_button, gguf_files, gguf_status, repo, token, kind, private, update, publish_button,
                    publish_status)


def connect_ask_both(studio: Studio, run_picker: gr.Dropdown, asking: AskBoth) -> None:
    answering = asking.button.click(functools.partial(ask, studio),
                                    [run_picker, asking.prompt, asking.max_new_tokens, asking.temperature],
                                    [asking.before, asking.after], api_name="compare_ask", **ONE_MODEL_AT_A_TIME)
    asking.cancel.click(None, cancels=[answering], api_visibility="private")


def connect_take_away(studio: Studio, run_picker: gr.Dropdown, away: TakeAway) -> None:
    away.zip_button.click(functools.partial(download_adapter, studio), [run_picker], [away.zip_file],
                          api_name="compare_zip", **ONE_MODEL_AT_A_TIME)
    away.merge_button.click(functools.partial(merge, studio), [run_picker],
                            [away.merged_file, away.merged_folder, away.merge_status], api_name="compare_merge",
                            **ONE_MODEL_AT_A_TIME)
    away.gguf_button.click(functools.partial(download_gguf, studio), [run_picker, away.gguf_quant],
                           [away.gguf_files, away.gguf_status], api_name="compare_gguf", **ONE_MODEL_AT_A_TIME)
    away.publish_button.click(functools.partial(publish, studio),
                              [run_picker, away.repo, away.kind, away.private, away.update, away.token],
                              [away.publish_status], api_name="compare_publish", **ONE_MODEL_AT_A_TIME)
