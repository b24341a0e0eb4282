"""Tab 1 · Data: choose the examples, map their columns to prompt / reference / system, and see what training sees.

Every field change recomputes the preview (playground.preview_data: the same loading and mapping as training) and
writes draft["data"]. Events use ``input`` / ``blur`` / ``release`` rather than ``change``, so filling the fields
from a recipe does not trigger one recomputation per field.
"""

from __future__ import annotations

import copy

import gradio as gr
import pandas as pd

from ..config import ModelConfig
from ..data import SUPPORTED_EXTENSIONS, DataConfig
from ..errors import DragonError
from ..playground import DataPreview, fit_mapping, load_rows, preview_data, preview_tokenizer
from ..studio import ASSETS_DIR
from .common import Shared, message, shows_errors

DATASETS_DIR = ASSETS_DIR / "datasets"


def bundled_datasets() -> list[tuple[str, str]]:
    """(file name, absolute path) of every example dataset shipped in assets/datasets."""
    return [(path.name, str(path)) for path in sorted(DATASETS_DIR.iterdir())
            if path.suffix.lower() in SUPPORTED_EXTENSIONS]


def _model_key(draft: dict) -> str:
    """Which starting model the preview's chat template and token counts belong to."""
    model = draft.get("model") or {}
    return f"{model.get('id', '')}@{model.get('revision') or ''}"


def _tokenizer(draft: dict) -> tuple[object | None, str]:
    model = draft.get("model") or {}
    if not model.get("id"):
        return None, ("Shown as plain system:/user: text, with lengths in words, because no starting model is "
                      "chosen yet.")
    return preview_tokenizer(ModelConfig(id=model["id"], revision=model.get("revision"),
                                         trust_remote_code=bool(model.get("trust_remote_code"))))


def _fence(text: str) -> str:
    """A Markdown code block that survives backticks inside the text."""
    fence = "```"
    while fence in text:
        fence += "`"
    return f"{fence}text\n{text}\n{fence}"


def preview_views(preview: DataPreview) -> tuple:
    """What the preview components show: source status, table, mapping status, counts, rendered prompts, lengths."""
    source_status = message(preview.error, "error") if preview.error_field == "source" else ""
    mapping_status = message(preview.error, "error") if preview.error_field == "mapping" else ""
    table = pd.DataFrame(preview.rows, columns=preview.columns)
    if preview.error:
        return source_status, table, mapping_status, "", "", ""
    rendered = "\n\n".join(f"**Row {number}**\n\n{_fence(text)}" for number, text in enumerate(preview.rendered, 1))
    if not preview.rendered:
        rendered = message("The first rows all have an empty prompt, so there is no example to show.", "warn")
    rendered = f"{preview.rendered_note}\n\n{rendered}" if preview.rendered_note else rendered
    lengths = preview.lengths.summary() if preview.lengths else ""
    return source_status, table, mapping_status, message(preview.counts_summary(), "ok"), rendered, lengths


def _data_setting(draft: dict, source, hub_config, hub_split, prompt, reference, system, eval_frac) -> DataConfig:
    """The draft's data section with the form's values; empty optional boxes mean "not used"."""
    current = draft.get("data") or {}
    return DataConfig(
        source=(source or "").strip(), prompt=prompt or "", reference=reference or None, system=system or None,
        hub_config=(hub_config or "").strip() or None, hub_split=(hub_split or "").strip() or "train",
        eval_frac=float(eval_frac if eval_frac is not None else current.get("eval_frac", 0.05)),
        seed=current.get("seed", 42), max_rows=current.get("max_rows"),
    )


def _draft_setting(draft: dict) -> DataConfig:
    data = draft.get("data") or {}
    return _data_setting(draft, data.get("source"), data.get("hub_config"), data.get("hub_split"), data.get("prompt"),
                         data.get("reference"), data.get("system"), data.get("eval_frac"))


def _preview(draft: dict, setting: DataConfig) -> DataPreview:
    """The preview of a data setting, rendered with the tokenizer of the draft's starting model."""
    tokenizer, note = _tokenizer(draft)
    return preview_data(setting, draft.get("base_dir") or None, tokenizer, note)


def _table_identity(data: dict | DataConfig) -> tuple:
    if isinstance(data, DataConfig):
        return data.source, data.hub_config, data.hub_split
    return data.get("source", ""), data.get("hub_config"), data.get("hub_split", "train")


# What update_data, pick_example and upload_file return, in order (the component names used in build).
UPDATED = ("draft", "source", "example", "hub_config", "hub_split", "prompt", "reference", "system", "source_status",
           "table", "mapping_status", "counts", "rendered", "lengths", "previewed_model")


_KEEP = object()  # "leave the field's value as it is"


def _column_picker(columns: list[str], value=_KEEP) -> gr.Dropdown:
    """An update of a mapping field: its column choices, and its value unless _KEEP (None shows as empty)."""
    if value is _KEEP:
        return gr.Dropdown(choices=columns, allow_custom_value=True)
    return gr.Dropdown(choices=columns, value=value or "", allow_custom_value=True)


def _example_value(source: str) -> str | None:
    return source if source in {path for _, path in bundled_datasets()} else None


def _apply(draft: dict, setting: DataConfig, show_source: bool) -> tuple:
    """Write a data setting into a new draft and preview it; see update_data for what comes back."""
    notes: list[str] = []
    if setting.source and _table_identity(setting) != _table_identity(draft.get("data") or {}):
        try:
            setting, notes = fit_mapping(setting, load_rows(setting, draft.get("base_dir") or None))
        except DragonError:  # unreadable data: preview_data reports it next to the source field
            notes = []
    new_draft = copy.deepcopy(draft)
    new_draft["data"] = {**(draft.get("data") or {}), "source": setting.source, "prompt": setting.prompt,
                         "reference": setting.reference, "system": setting.system, "hub_config": setting.hub_config,
                         "hub_split": setting.hub_split, "eval_frac": setting.eval_frac}
    preview = _preview(new_draft, setting)
    source_status, table, mapping_status, counts, rendered, lengths = preview_views(preview)
    if notes:
        mapping_status = "\n\n".join([message(" ".join(notes), "info"), mapping_status]).strip()

    def mapping_field(value: str | None):
        """New column choices; the value only when fit_mapping changed it (never overwrite what is being typed)."""
        return _column_picker(preview.columns, value) if notes else _column_picker(preview.columns)

    def source_field(value):
        return value if show_source else gr.skip()

    return (new_draft, source_field(setting.source), _example_value(setting.source),
            source_field(setting.hub_config or ""), source_field(setting.hub_split), mapping_field(setting.prompt),
            mapping_field(setting.reference), mapping_field(setting.system), source_status, table, mapping_status,
            counts, rendered, lengths, _model_key(new_draft))


@shows_errors
def update_data(draft: dict, source: str, hub_config: str, hub_split: str, prompt: str, reference: str, system: str,
                eval_frac: float) -> tuple:
    """Apply the form to draft["data"] and recompute the preview.

    When the table itself changed (another file, Hub dataset, config or split), mapping settings that do not fit it
    are replaced by a guess (playground.fit_mapping) and the fields show the new values with a note saying so.
    Returns (draft, source, example, hub config, hub split, prompt, reference, system, source status, table,
    mapping status, counts, rendered prompts, lengths, previewed model).
    """
    setting = _data_setting(draft, source, hub_config, hub_split, prompt, reference, system, eval_frac)
    return _apply(draft, setting, show_source=False)


@shows_errors
def pick_example(draft: dict, example: str | None, prompt, reference, system, eval_frac) -> tuple:
    """A bundled dataset was chosen: it becomes the source (a local file, so the Hub settings are reset)."""
    if not example:
        return (gr.skip(),) * len(UPDATED)
    return _apply(draft, _data_setting(draft, example, "", "train", prompt, reference, system, eval_frac), True)


@shows_errors
def upload_file(draft: dict, path: str | None, prompt, reference, system, eval_frac) -> tuple:
    """An uploaded file becomes the source; Gradio keeps it in its cache folder for the life of the app."""
    if not path:
        return (gr.skip(),) * len(UPDATED)
    return _apply(draft, _data_setting(draft, path, "", "train", prompt, reference, system, eval_frac), True)


@shows_errors
def fill_fields(draft: dict) -> tuple:
    """A whole new draft arrived (recipe or page load): show its data settings and their preview.

    Returns (source, example, hub config, hub split, prompt, reference, system, held-out fraction, source status,
    table, mapping status, counts, rendered prompts, lengths, previewed model).
    """
    setting = _draft_setting(draft)
    preview = _preview(draft, setting)
    columns = preview.columns
    return (setting.source, _example_value(setting.source), setting.hub_config or "", setting.hub_split,
            _column_picker(columns, setting.prompt), _column_picker(columns, setting.reference),
            _column_picker(columns, setting.system), setting.eval_frac, *preview_views(preview),
            _model_key(draft))


@shows_errors
def refresh_for_model(draft: dict, previewed_model: str) -> tuple:
    """Another starting model was chosen (Model tab): re-render prompts and token counts with its tokenizer.

    Any other draft change leaves the preview untouched. Returns (source status, table, mapping status, counts,
    rendered prompts, lengths, previewed model).
    """
    if not previewed_model or _model_key(draft) == previewed_model:
        return (gr.skip(),) * 7
    return (*preview_views(_preview(draft, _draft_setting(draft))), _model_key(draft))


def build(shared: Shared) -> None:
    gr.Markdown("Choose the examples to learn from and say how each row becomes a prompt. The **reference** is what "
                "rewards compare a reply with (e.g. the correct answer).")
    with gr.Row():
        with gr.Column():
            example = gr.Dropdown(bundled_datasets(), value=None, label="Bundled example",
                                  info="Small datasets that ship with the app.", elem_id="data-example")
            upload = gr.File(label="…or upload a file", file_types=list(SUPPORTED_EXTENSIONS), height=120,
                             elem_id="data-upload")
            source = gr.Textbox(label="Data source", info="A file path or a Hugging Face dataset id like openai/gsm8k "
                                "(press Enter to load).", elem_id="data-source")
            with gr.Row():
                hub_config = gr.Textbox(label="Hub config", placeholder="optional, e.g. main",
                                        elem_id="data-hub-config")
                hub_split = gr.Textbox(label="Hub split", value="train", elem_id="data-hub-split")
            source_status = gr.Markdown(elem_id="data-source-status")
        with gr.Column():
            prompt = gr.Dropdown(label="Prompt", allow_custom_value=True, elem_id="data-prompt",
                                 info="Pick a column, or type a template such as Q: {question}")
            reference = gr.Dropdown(label="Reference answer", allow_custom_value=True, elem_id="data-reference",
                                    info="A column or template the rewards compare replies with; may stay empty.")
            system = gr.Dropdown(label="System message", allow_custom_value=True, elem_id="data-system",
                                 info="Fixed text, a column or a template; may stay empty.")
            mapping_status = gr.Markdown(elem_id="data-mapping-status")
            eval_frac = gr.Slider(0, 0.5, value=0.05, step=0.01, label="Held-out fraction", elem_id="data-eval-frac",
                                  info="Rows kept aside to compare the model before and after training.")
            counts = gr.Markdown(elem_id="data-counts")
            lengths = gr.Markdown(elem_id="data-lengths")
    table = gr.Dataframe(label="First rows", interactive=False, max_height=360, wrap=True, elem_id="data-preview")
    with gr.Accordion("Prompts as the model reads them", open=True):
        rendered = gr.Markdown(elem_id="data-rendered")
    previewed_model = gr.State("")

    views = [source_status, table, mapping_status, counts, rendered, lengths, previewed_model]
    updated = [shared.draft, source, example, hub_config, hub_split, prompt, reference, system, *views]
    form = [shared.draft, source, hub_config, hub_split, prompt, reference, system, eval_frac]
    source.submit(update_data, form, updated, api_name="data_update")
    for event in (source.blur, hub_config.submit, hub_config.blur, hub_split.submit, hub_split.blur, prompt.input,
                  reference.input, system.input, eval_frac.release):
        event(update_data, form, updated, api_visibility="private")
    mapping = [prompt, reference, system, eval_frac]
    example.input(pick_example, [shared.draft, example, *mapping], updated, api_name="data_pick_example")
    upload.upload(upload_file, [shared.draft, upload, *mapping], updated, api_name="data_upload")
    shared.config_loaded.change(fill_fields, [shared.draft],
                                [source, example, hub_config, hub_split, prompt, reference, system, eval_frac, *views],
                                api_visibility="private")
    shared.draft.change(refresh_for_model, [shared.draft, previewed_model], views, show_progress="hidden",
                        api_visibility="private")
