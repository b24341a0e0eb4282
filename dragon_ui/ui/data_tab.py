"""Tab 1 · Data: choose the examples, map their columns to prompt / reference / system, and see what training sees.

Every field change recomputes the preview (playground.preview_data: the same loading and mapping as training) from
what the form shows. Events use ``input`` / ``blur`` / ``release`` rather than ``change``, so filling the fields
from a recipe does not trigger one recomputation per field.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import gradio as gr
import pandas as pd

from ..config import Draft
from ..data import DataConfig, bundled_datasets as shipped_datasets
from ..errors import DragonError
from ..studio.draft import place_problem
from ..studio.files import real_source, shown_source
from ..studio.preflight_view import difficulty_filter, without_difficulty_filter
from ..public import Policy
from ..studio.playground import (DataPreview, data_config, draft_tokenizer, fit_mapping, load_rows, preview_data,
                                 prompt_limit_of, unpayable)
from ..data.tables import SUPPORTED_EXTENSIONS
from ..studio.backend import Studio
from .common import (EventOptions, Form, Shared, asked, chosen_or_unchanged, described, message, number,
                     optional_number, shown_number, shows_errors)
from .guard import in_page_order

def bundled_datasets() -> list[tuple[str, str]]:
    """(file name, absolute path) of every example dataset shipped in assets/datasets, for the picker."""
    return [(path.name, str(path)) for path in shipped_datasets()]


def _model_key(draft: Draft) -> str:
    """Which starting model the preview's chat template and token counts belong to."""
    model = draft.get("model") or {}
    return f"{model.get('id', '')}@{model.get('revision') or ''}"


def _fence(text: str) -> str:
    """A Markdown code block that survives backticks inside the text."""
    fence = "```"
    while fence in text:
        fence += "`"
    return f"{fence}text\n{text}\n{fence}"


MAPPING_PATHS = ("data.prompt", "data.reference", "data.system")
EMPTY_TABLE = pd.DataFrame(columns=["the first rows of the data appear here"])


def problem_text(preview: DataPreview, labels: dict[str, str]) -> str:
    """The preview's problem in the form's words; a mapping problem also lists the columns there are."""
    problem = place_problem(preview.error or "", labels)
    text = problem.text
    if problem.path in MAPPING_PATHS and preview.columns and ", ".join(preview.columns) not in text:  # not twice
        text += f" The columns of this data are: {', '.join(preview.columns)}."
    return message(text, "error")


def preview_views(preview: DataPreview, labels: dict[str, str] | None = None, rendering: str = "") -> tuple:
    """What the preview components show: source status, table, mapping status, counts, rendered prompts, lengths,
    and the sheet picker's choices (shown for a spreadsheet only). ``rendering``: the model whose tokenizer is still
    loading, so the prompts and their lengths are still to come."""
    problem = problem_text(preview, labels or {}) if preview.error else ""
    source_status = problem if preview.error_field == "source" else ""
    mapping_status = problem if preview.error_field == "mapping" else ""
    # No columns would show gradio's own headers "1 2 3": an empty table says what it is for instead.
    table = pd.DataFrame(preview.rows, columns=preview.columns) if preview.columns else EMPTY_TABLE
    if preview.error:
        return source_status, table, mapping_status, "", "", "", gr.skip()
    counts = message(preview.counts_summary(), "ok")
    sheets = gr.Dropdown(choices=preview.sheets, visible=bool(preview.sheets))
    if rendering:
        rendered = message(f"Loading the tokenizer of {rendering} to show the prompts as it reads them…")
        return source_status, table, mapping_status, counts, rendered, "", sheets
    rendered = "\n\n".join(f"**Row {number}**\n\n{_fence(text)}" for number, text in enumerate(preview.rendered, 1))
    if not preview.rendered:
        rendered = message("The first rows all have an empty prompt, so there is no example to show.", "warn")
    rendered = f"{preview.rendered_note}\n\n{rendered}" if preview.rendered_note else rendered
    lengths = preview.lengths.summary() if preview.lengths else ""
    return source_status, table, mapping_status, counts, rendered, lengths, sheets


def _preview(draft: Draft, setting: DataConfig, found: tuple | None, *, policy: Policy) -> tuple[DataPreview, str]:
    """The preview of a data setting rendered with ``found``, the draft's starting model's (tokenizer, note)
    (draft_tokenizer), and "". With None, while that tokenizer is still loading: the preview without it, and the
    model's name."""
    if found is None:  # nor the prompt limit, which may need the hardware: the lengths come with the prompts
        return preview_data(setting, draft.get("base_dir") or None, policy=policy), draft["model"]["id"]
    tokenizer, note = found
    return preview_data(setting, draft.get("base_dir") or None, tokenizer, note,
                        prompt_limit_of(draft, setting, policy=policy), policy=policy), ""


def table_identity(data: DataConfig) -> list:
    """Which table a data setting reads: another one means the mapping may no longer fit."""
    return [data.source, data.hub_config, data.hub_split]


# What update_data, pick_example and upload_file return, in order (the component names used in build).
UPDATED = ("source", "example", "hub_config", "hub_split", "prompt", "prompt_column", "reference", "system",
           "source_status",
           "table", "mapping_status", "counts", "rendered", "lengths", "sheet", "shown_table", "previewed_model")


_KEEP = object()  # "leave the field's value as it is"


def _column_picker(columns: list[str], value=_KEEP) -> gr.Dropdown:
    """An update of a mapping field: its column choices, and its value unless _KEEP (None shows as empty)."""
    if value is _KEEP:
        return gr.Dropdown(choices=columns, allow_custom_value=True)
    return gr.Dropdown(choices=columns, value=value or "", allow_custom_value=True)


def _example_value(source: str, *, policy: Policy) -> str | None:
    """The bundled example a source is, as the picker offers it (files.shown_source); None for any other source."""
    return shown_source(source, policy=policy) if source in {path for _, path in bundled_datasets()} else None


def _apply(draft: Draft, setting: DataConfig, shown_table: list | None, show_source: bool,
           labels: dict[str, str], found: tuple | None, *, policy: Policy) -> tuple:
    """Preview a data setting with the tokenizer ``found`` (_preview); when it reads another table than the one
    shown, first fit the mapping to it.

    The form's fields are only written where something was picked for the user (a new source, a fitted mapping),
    never where the user may be typing. See UPDATED for what comes back.
    """
    notes: list[str] = []
    if setting.source and table_identity(setting) != (shown_table or []):
        try:
            rows = load_rows(setting, draft.get("base_dir") or None, policy=policy).rows
            setting, notes = fit_mapping(setting, rows, policy=policy)
        except DragonError:  # unreadable data: preview_data reports it next to the source field
            notes = []
    preview, rendering = _preview(draft, setting, found, policy=policy)
    source_status, table, mapping_status, counts, rendered, lengths, sheets = preview_views(preview, labels,
                                                                                            rendering)
    if show_source and preview.sheets:  # another file: the sheet read is its first, whichever the last one read
        sheets = gr.Dropdown(choices=preview.sheets, value=setting.sheet or preview.sheets[0], visible=True)
    if notes:
        mapping_status = "\n\n".join([message(" ".join(notes), "info"), mapping_status]).strip()
    if not preview.error:  # the rewards that no reply can earn on these references, where the data changed
        mapping_status = "\n\n".join([mapping_status, *(message(said, "warn") for said in unpayable(
            draft.get("rewards") or [], setting, draft.get("base_dir") or None, policy=policy))]).strip()

    def mapping_field(value: str | None):
        """New column choices; the value only when fit_mapping changed it (never overwrite what is being typed)."""
        return _column_picker(preview.columns, value) if notes else _column_picker(preview.columns)

    def source_field(value):
        return value if show_source else gr.skip()

    return (source_field(shown_source(setting.source, policy=policy)), _example_value(setting.source, policy=policy),
            source_field(setting.hub_config or ""), source_field(setting.hub_split),
            setting.prompt if notes else gr.skip(),
            gr.Dropdown(choices=preview.columns, value=None), mapping_field(setting.reference),
            mapping_field(setting.system), source_status, table, mapping_status, counts, rendered, lengths, sheets,
            table_identity(setting), _model_key(draft))


def update_data(draft: Draft, shown_table: list | None, labels: dict[str, str] | None = None,
                *, policy: Policy) -> tuple:
    """Preview the data settings the form shows.

    When the table itself changed (another file, Hub dataset, config or split), mapping settings that do not fit it
    are replaced by a guess (playground.fit_mapping) and the fields show the new values with a note saying so.
    """
    return _apply(draft, data_config(draft), shown_table, False, labels or {},
                  draft_tokenizer(draft, policy=policy), policy=policy)


def use_source(draft: Draft, source: str | None, shown_table: list | None,
               labels: dict[str, str] | None = None, *, policy: Policy) -> tuple:
    """A bundled dataset was picked or a file uploaded: it becomes the source (a local file, so the Hub settings are
    reset). Gradio keeps an upload in its cache folder for the life of the app."""
    if not source:
        return (gr.skip(),) * len(UPDATED)
    setting = replace(data_config(draft), source=source, hub_config=None, hub_split="train", sheet=None)
    return _apply(draft, setting, shown_table, True, labels or {}, draft_tokenizer(draft, policy=policy), policy=policy)


def fill_fields(draft: Draft, *, policy: Policy) -> tuple:
    """A whole new draft was loaded (recipe, past run, page load): show its data settings, at once (the preview,
    which reads the data, follows: show_preview); its source as the app shows it (files.shown_source).

    Returns (source, example, hub config, hub split, prompt, prompt's column picker, reference, system, held-out
    fraction, max rows, sheet).
    """
    setting = data_config(draft)
    return (shown_source(setting.source, policy=policy), _example_value(setting.source, policy=policy),
            setting.hub_config or "", setting.hub_split, setting.prompt, gr.Dropdown(choices=[], value=None),
            _column_picker([], setting.reference),
            _column_picker([], setting.system), setting.eval_frac, shown_number(setting.max_rows),
            gr.Dropdown(choices=[setting.sheet] if setting.sheet else [], value=setting.sheet,
                        visible=bool(setting.sheet)))


def show_preview(draft: Draft, labels: dict[str, str] | None = None, *, policy: Policy):
    """The preview of the data settings the form shows once a loaded draft is in it. While the starting model's
    tokenizer is still loading (a page opened as the app starts), the table and the counts come first
    (first_preview) and the prompts follow. Yields what UPDATED names."""
    found = draft_tokenizer(draft, wait=False, policy=policy)
    if found is None:
        yield _as_loaded(draft, labels, None, policy=policy)
        found = draft_tokenizer(draft, policy=policy)
    yield _as_loaded(draft, labels, found, policy=policy)


def first_preview(draft: Draft, labels: dict[str, str] | None = None, *, policy: Policy) -> tuple:
    """show_preview's first answer, with the prompts only if the tokenizer is loaded already: quick enough to run
    while the app is built, for the page's first paint."""
    return _as_loaded(draft, labels, draft_tokenizer(draft, wait=False, policy=policy), policy=policy)


def _as_loaded(draft: Draft, labels: dict[str, str] | None, found: tuple | None, *, policy: Policy) -> tuple:
    """The preview of a loaded draft: its table is the one the settings were made for, so nothing is refitted, and
    no field the user may be typing in is written."""
    setting = data_config(draft)
    return _apply(draft, setting, table_identity(setting), False, labels or {}, found, policy=policy)


def refresh_for_model(draft: Draft, previewed_model: str, labels: dict[str, str] | None = None,
                      *, policy: Policy) -> tuple:
    """Another starting model was chosen (Model tab): re-render prompts and token counts with its tokenizer.

    Returns (source status, table, mapping status, counts, rendered prompts, lengths, sheet, previewed model).
    """
    if not previewed_model or _model_key(draft) == previewed_model:
        return (gr.skip(),) * 8
    preview = _preview(draft, data_config(draft), draft_tokenizer(draft, policy=policy), policy=policy)[0]
    return (*preview_views(preview, labels),
            _model_key(draft))


def show_difficulty(draft: Draft) -> tuple:
    """The difficulty filter a pre-flight set, and its Clear button, shown only when there is one."""
    said = difficulty_filter(draft)
    return said, gr.Button(visible=bool(said))


def preview_loaded(draft: Draft, labels: dict[str, str] | None = None, *, policy: Policy) -> Iterator[tuple]:
    """show_preview as a page's load runs it, once the form shows the loaded draft: looked up when it runs, so a
    test may stand a slow one in for it."""
    yield from show_preview(draft, labels, policy=policy)


def use_picked_source(draft: Draft, picked: str | None, shown_table: list | None, labels: dict[str, str] | None = None,
                      *, policy: Policy) -> tuple:
    """A bundled example picked (as the picker shows it, files.shown_source) becomes the source."""
    return use_source(draft, real_source(picked, policy=policy) if picked else None, shown_table, labels,
                      policy=policy)


def take_upload(studio: Studio, draft: Draft, uploaded: str | None, shown_table: list | None,
                labels: dict[str, str] | None = None) -> tuple:
    """An uploaded file becomes the source: in a public demo, moved into this visitor's own folder first
    (Files.keep_upload), where nobody else can read it. See UPDATED for what comes back."""
    if not uploaded:
        return use_source(draft, None, shown_table, labels, policy=studio.policy)
    try:
        kept = studio.files.keep_upload(uploaded)
        try:  # read once here (the preview reuses it): a file that cannot be read is not kept
            setting = replace(data_config(draft), source=kept, hub_config=None, sheet=None)
            sheets = load_rows(setting, policy=studio.policy).sheets
        except DragonError:
            studio.files.discard_upload(kept)
            raise
    except DragonError as exc:
        return _said_at_source(problem_text(DataPreview([], [], [], "", error=str(exc), error_field="source"),
                                            labels or {}))
    # The first sheet is the one read.
    return _which_file(use_picked_source(draft, kept, shown_table, labels, policy=studio.policy), Path(uploaded).name,
                       sheets[0] if sheets else None)


def reshow_upload(draft: Draft, shown_table: list | None, labels: dict[str, str] | None = None, *,
                  policy: Policy) -> tuple:
    """The uploaded file's preview again, once every preview queued before the upload has answered."""
    setting = data_config(draft)
    return _which_file(update_data(draft, shown_table, labels, policy=policy), Path(setting.source).name,
                       setting.sheet)


@dataclass
class SourceFields:
    """Where the data comes from: a bundled example, an upload, or a path or Hub dataset typed in."""

    example: gr.Dropdown
    upload: gr.File
    source: gr.Textbox
    hub_config: gr.Textbox
    hub_split: gr.Textbox
    status: gr.Markdown


@dataclass
class MappingFields:
    """How a row becomes a prompt, and what the data holds."""

    prompt: gr.Textbox
    prompt_column: gr.Dropdown
    reference: gr.Dropdown
    system: gr.Dropdown
    status: gr.Markdown
    eval_frac: gr.Slider
    sheet: gr.Dropdown
    max_rows: gr.Textbox
    counts: gr.Markdown
    difficulty: gr.Markdown
    clear_difficulty: gr.Button
    lengths: gr.Markdown


@dataclass
class DataTab:
    """The components the tab's events use."""

    source: SourceFields
    mapping: MappingFields
    table: gr.Dataframe
    rendered: gr.Markdown
    shown_table: gr.State  # table_identity of the table previewed now
    previewed_model: gr.State

    @property
    def views(self) -> list:
        """What a preview shows (preview_views)."""
        return [self.source.status, self.table, self.mapping.status, self.mapping.counts, self.rendered,
                self.mapping.lengths, self.mapping.sheet]

    @property
    def updated(self) -> list:
        """What a preview writes, as UPDATED names it."""
        source, mapping = self.source, self.mapping
        return [source.source, source.example, source.hub_config, source.hub_split, mapping.prompt,
                mapping.prompt_column, mapping.reference, mapping.system, *self.views, self.shown_table,
                self.previewed_model]


def build(shared: Shared) -> Callable[[], None]:
    """The tab's components and fields; returns the function that wires its events once every tab is built (the
    preview renders prompts with the Model tab's starting model)."""
    gr.Markdown("Choose the examples to learn from and say how each row becomes a prompt. The **reference** is what "
                "rewards compare a reply with (e.g. the correct answer).")
    with gr.Row():
        with gr.Column():
            source = source_fields(shared)
        with gr.Column():
            mapping = mapping_fields(shared.form)
    table = gr.Dataframe(EMPTY_TABLE, label="First rows", interactive=False, max_height=360, wrap=True,
                         elem_id="data-preview")
    with gr.Accordion("Prompts as the model reads them", open=True):
        rendered = gr.Markdown(elem_id="data-rendered")
    tab = DataTab(source, mapping, table, rendered, gr.State([]), gr.State(""))
    shared.fills.append((asked(fill_fields, shared.studio), [
        source.source, source.example, source.hub_config, source.hub_split, mapping.prompt, mapping.prompt_column,
        mapping.reference, mapping.system, mapping.eval_frac, mapping.max_rows, mapping.sheet]))
    shared.fills.append((show_difficulty, [mapping.difficulty, mapping.clear_difficulty]))
    return functools.partial(connect, shared, tab)


def source_fields(shared: Shared) -> SourceFields:
    form, policy = shared.form, shared.studio.policy
    example = gr.Dropdown([(name, shown_source(path, policy=policy)) for name, path in bundled_datasets()],
                          value=None, label="Bundled example", info="Small datasets that ship with the app.",
                          elem_id="data-example")
    upload = gr.File(label="…or upload a file", file_types=list(SUPPORTED_EXTENSIONS), height=120,
                     elem_id="data-upload")
    # It shows a source as the app shows it (files.shown_source); the draft holds the file it stands for.
    source = form.add("data.source", gr.Textbox(elem_id="data-source", **described(
        "data.source", "Press Enter to load it.")), asked(_real_source, shared.studio))
    with gr.Row():
        hub_config = form.add("data.hub_config", gr.Textbox(**described("data.hub_config"),
                                                            placeholder="optional, e.g. main",
                                                            elem_id="data-hub-config"), _text_or_none)
        hub_split = form.add("data.hub_split", gr.Textbox(**described("data.hub_split"), value="train",
                                                          elem_id="data-hub-split"),
                             lambda value: _text(value) or "train")
    return SourceFields(example, upload, source, hub_config, hub_split, gr.Markdown(elem_id="data-source-status"))


def mapping_fields(form: Form) -> MappingFields:
    prompt = form.add("data.prompt", gr.Textbox(
        lines=2, max_lines=12, elem_id="data-prompt", **described("data.prompt", "Enter starts a new line.")),
        lambda value: value or "")
    prompt_column = gr.Dropdown(label="…or use a column as the prompt", choices=[], value=None,
                                elem_id="data-prompt-column")
    reference = form.add("data.reference", gr.Dropdown(
        allow_custom_value=True, elem_id="data-reference", **described("data.reference")), lambda value: value or None)
    system = form.add("data.system", gr.Dropdown(
        allow_custom_value=True, elem_id="data-system", **described("data.system")), lambda value: value or None)
    status = gr.Markdown(elem_id="data-mapping-status")
    eval_frac = form.add("data.eval_frac", gr.Slider(
        0, 0.5, value=0.05, step=0.01, elem_id="data-eval-frac", **described("data.eval_frac")),
        lambda value: float(value) if value is not None else 0.05)
    sheet = form.add("data.sheet", gr.Dropdown(
        choices=[], value=None, allow_custom_value=True, visible=False, elem_id="data-sheet",
        **described("data.sheet")), _text_or_none)
    max_rows = form.add("data.max_rows", optional_number(
        placeholder="all", elem_id="data-max-rows", **described("data.max_rows")), number)
    counts = gr.Markdown(elem_id="data-counts")
    with gr.Row(equal_height=True):
        difficulty = gr.Markdown(elem_id="data-difficulty")
        clear_difficulty = gr.Button("Clear the filter", size="sm", scale=0, min_width=150, visible=False,
                                     elem_id="data-difficulty-clear")
    return MappingFields(prompt, prompt_column, reference, system, status, eval_frac, sheet, max_rows, counts,
                         difficulty, clear_difficulty, gr.Markdown(elem_id="data-lengths"))


def preview_handler(shared: Shared, labels: dict[str, str], fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn(draft, *inputs, labels=..., policy=...)`` as a handler of the form's inputs, then ``inputs``, that shows
    its errors as sentences. Each call makes a handler of its own, so each event takes its own turns (gradio's
    concurrency group is the handler's)."""
    return shows_errors(shared.form.takes_draft(asked(functools.partial(fn, labels=labels), shared.studio)))


def connect(shared: Shared, tab: DataTab) -> None:
    """The tab's events, once every tab has added its fields to the form."""
    form, source, mapping = shared.form, tab.source, tab.mapping
    previews = functools.partial(preview_handler, shared, form.labels)
    updated, with_table = tab.updated, [*form.inputs, tab.shown_table]
    shared.change_draft(mapping.clear_difficulty.click, without_difficulty_filter, [], mapping.difficulty)
    shared.refreshes.append((previews(preview_loaded), form.inputs, updated, IN_TURN))
    shared.first_paint.append((asked(functools.partial(first_preview, labels=form.labels), shared.studio), updated))
    # always_last: a field changed while the preview computes is previewed again with what the form shows then.
    modes: EventOptions = {"trigger_mode": "always_last", "api_visibility": "private"}
    # The prompt is previewed as it is typed: always_last keeps one preview waiting at most, of the latest text.
    gr.on([source.source.blur, source.hub_config.submit, source.hub_config.blur, source.hub_split.submit,
           source.hub_split.blur, mapping.prompt.input, mapping.reference.input, mapping.system.input,
           mapping.eval_frac.release, mapping.max_rows.submit, mapping.max_rows.blur, mapping.sheet.input],
          previews(update_data), with_table, updated, show_progress="hidden", **modes)
    # A new source or prompt column may take seconds to read: the preview table shows that it is coming.
    previewing: EventOptions = {**modes, "show_progress_on": [tab.table]}
    mapping.prompt_column.input(chosen_or_unchanged, [mapping.prompt_column], [mapping.prompt],
                                show_progress="hidden", **modes).then(previews(update_data), with_table, updated,
                                                                      **previewing)
    submitted = source.source.submit(previews(update_data), with_table, updated, **previewing, **IN_TURN)
    picked = source.example.input(previews(use_picked_source), [*form.inputs, source.example, tab.shown_table],
                                  updated, **previewing, **IN_TURN)
    picked.then(previews(update_data), with_table, updated, **previewing, **IN_TURN)
    uploaded = source.upload.upload(
        shows_errors(form.takes_draft(functools.partial(take_upload, shared.studio, labels=form.labels))),
        [*form.inputs, source.upload, tab.shown_table], updated, **previewing, **IN_TURN)
    uploaded.then(previews(reshow_upload), with_table, updated, **previewing, **IN_TURN)
    shared.source_replaced.extend([submitted, picked, uploaded])
    form.component("model.id").change(previews(refresh_for_model), [*form.inputs, tab.previewed_model],
                                      [*tab.views, tab.previewed_model], show_progress="hidden", **modes)


# A page's preview of the loaded settings and its new source's take turns, in the order they came, and a new source is
# previewed once more after them: a file uploaded while the first still computed had its preview overwritten by the
# loaded data's. Other pages' run beside them.
IN_TURN = in_page_order("data-source")


def _said_at_source(said: str) -> tuple:
    """What UPDATED names, with only the source's status line written."""
    outputs: list = [gr.skip()] * len(UPDATED)
    outputs[UPDATED.index("source_status")] = said
    return tuple(outputs)


def _which_file(outputs: tuple, name: str, sheet: str | None) -> tuple:
    """``outputs`` (UPDATED) saying which uploaded file (and sheet) the source is, where nothing else is said: the
    source field holds where the file is kept."""
    said, where = list(outputs), UPDATED.index("source_status")
    if not said[where]:
        said[where] = message(f"Your file {name}" + (f", sheet '{sheet}'" if sheet else "") + ".", "ok")
    return tuple(said)


def _real_source(value: str | None, *, policy: Policy) -> str:
    """The source field's value as the draft holds it: the file a shown source stands for (files.real_source)."""
    return real_source(_text(value), policy=policy)


def _text(value) -> str:
    return (value or "").strip()


def _text_or_none(value) -> str | None:
    return _text(value) or None
