"""Tab 3 · Model & Hardware: the starting model, where it trains, the LoRA and GRPO settings, a rough estimate of
memory and time, the whole config as YAML, and Start.

Each settings group edits its own section of the draft (one handler per section, fired by any of its fields), and
every change of the draft, from any tab, refreshes the checks, the estimate and the YAML below.
"""

from __future__ import annotations

import copy
import hashlib
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import gradio as gr

from ..config import DEVICES, DTYPES, LOSS_TYPES, SCALE_REWARDS
from ..errors import DragonError
from ..estimate import MINIMUM_SETTINGS, estimate_run, format_params, minimum_memory_gb
from ..hardware import HardwareInfo, resolve_hardware
from ..presets import PRESETS
from ..studio import Studio
from .common import TAB_TRAIN, Shared, message, shows_errors

CLI_TEMPLATE = "python -m dragon_ui train {file}"
CONFIG_DOWNLOAD_DIR = Path(tempfile.gettempdir()) / "dragon_ui_configs"


# ----------------------------------------------------------------------------------------------------------------
# How form values become settings.


def _whole_or_auto(value: Any) -> int | None:
    """Blank or 0 means "not set" (max steps: use the epochs; CPU threads: automatic)."""
    return None if value in (None, "", 0) else value


def _target_modules(text: str) -> str | list[str]:
    """ "all-linear", or a list typed as "q_proj, v_proj" (commas or spaces)."""
    names = [name for name in re.split(r"[,\s]+", (text or "").strip()) if name]
    return names[0] if names == ["all-linear"] else names


def _target_modules_text(value: str | list[str]) -> str:
    return value if isinstance(value, str) else ", ".join(value)


@dataclass(frozen=True)
class Setting:
    key: str
    to_draft: Callable[[Any], Any] = lambda value: value
    to_field: Callable[[Any], Any] = lambda value: value


SECTIONS: dict[str, tuple[Setting, ...]] = {
    "model": (Setting("id", lambda value: (value or "").strip()),),
    "hardware": (Setting("device"), Setting("dtype"), Setting("load_in_4bit"),
                 Setting("cpu_threads", _whole_or_auto, lambda value: value or 0)),
    "lora": (Setting("enabled"), Setting("r"), Setting("alpha"), Setting("dropout"),
             Setting("target_modules", _target_modules, _target_modules_text)),
    "grpo": (Setting("group_size"), Setting("beta"), Setting("temperature"), Setting("max_new_tokens"),
             Setting("loss_type"), Setting("scale_rewards")),
    "training": (Setting("learning_rate"), Setting("epochs"), Setting("max_steps", _whole_or_auto, lambda value: value or 0),
                 Setting("batch_size"), Setting("save_steps"), Setting("gradient_checkpointing")),
}


def update_section(draft: dict, section: str, *values: Any) -> dict:
    """A new draft with ``section``'s shown settings set from the form (its other settings are kept)."""
    new = copy.deepcopy(draft)
    target = new.setdefault(section, {})
    for setting, value in zip(SECTIONS[section], values, strict=True):
        target[setting.key] = setting.to_draft(value)
    return new


def _section_handler(section: str):
    def handler(draft: dict, *values: Any) -> dict:
        return update_section(draft, section, *values)

    return handler


def set_run_name(draft: dict, name: str) -> dict:
    new = copy.deepcopy(draft)
    new["name"] = (name or "").strip()
    return new


def field_values(draft: dict) -> list[Any]:
    """The form's values for a draft, in SECTIONS order, then the run name."""
    values = []
    for section, settings in SECTIONS.items():
        stored = draft.get(section) or {}
        values += [setting.to_field(stored.get(setting.key)) for setting in settings]
    return values + [draft.get("name", "")]


# ----------------------------------------------------------------------------------------------------------------
# What the tab shows about the draft.


def preset_rows() -> list[list[str]]:
    return [[preset.id, format_params(preset.params), f"~{minimum_memory_gb(preset.dims):.1f} GB", preset.notes]
            for preset in PRESETS]


def finished_runs(studio: Studio) -> list[tuple[str, str]]:
    """(label, run folder) of the runs a new run can continue from."""
    choices = []
    for run in studio.runs():
        if run["state"] == "succeeded":
            reward = f", held-out reward {run['heldout_after']:.2f}" if isinstance(run.get("heldout_after"), (int, float)) else ""
            choices.append((f"{run['id']} ({run['model']}{reward})", run["dir"]))
    return choices


def hardware_markdown(info: HardwareInfo) -> str:
    lines = [f"**Detected:** {info.summary()}."]
    if info.cuda:
        lines += [f"- GPU {d.index} " + ("supports bf16." if d.bf16 else "has no bf16, so fp16 is used.") for d in info.cuda]
    else:
        lines.append("- No CUDA GPU is visible to PyTorch" + (", but Apple MPS is." if info.mps else "."))
    lines.append(f"- CPU: {info.cpu_cores} cores available; bf16 is "
                 + ("measured faster than fp32 here." if info.cpu_bf16 else "not faster than fp32 here (measured)."))
    lines.append("- 4-bit loading: " + ("available (bitsandbytes is installed)." if info.bitsandbytes else
                                          "not available (bitsandbytes is not installed)."))
    return "\n".join(lines)


@dataclass
class Preview:
    """Everything below the settings, recomputed when the draft changes."""

    check: str
    hardware: str
    estimate: str
    yaml: str
    cli: str
    download: str | None

    def outputs(self) -> tuple:
        return (self.check, self.hardware, self.estimate, self.yaml, self.cli,
                gr.DownloadButton(value=self.download, interactive=self.download is not None))


def config_file_name(draft: dict) -> str:
    stem = re.sub(r"[^A-Za-z0-9._-]+", "-", (draft.get("name") or "").strip()).strip("-.") or "my-run"
    return f"{stem}.yaml"


def write_config_file(draft: dict, yaml_text: str) -> Path:
    """The YAML in a temp folder named by its content, so every browser session downloads its own version."""
    folder = CONFIG_DOWNLOAD_DIR / hashlib.sha1(yaml_text.encode("utf-8")).hexdigest()[:12]
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / config_file_name(draft)
    if not path.is_file():
        path.write_text(yaml_text, encoding="utf-8")
    return path


def build_preview(studio: Studio, draft: dict) -> Preview:
    """Validate the draft and describe it: the sentence for the first problem, the hardware choice with its
    reasons, the estimate, the YAML and the equivalent command line."""
    if not draft:
        return Preview(message("Loading the settings…"), "", "", "", "", None)
    cli = f"Run the same training without the app: save the YAML as `{config_file_name(draft)}` and run\n" \
          f"```\n{CLI_TEMPLATE.format(file=config_file_name(draft))}\n```"
    try:
        config = studio.validate(draft)
    except DragonError as exc:
        problem = message(str(exc), "error")
        return Preview(problem, "", "The estimate appears once the settings are valid.",
                       f"# The settings are not valid yet:\n# {exc}", cli, None)
    try:
        resolved = resolve_hardware(config.hardware, studio.hardware())
    except DragonError as exc:
        return Preview(message("The settings are valid.", "ok"), message(str(exc), "error"),
                       "The estimate appears once the hardware choice works on this machine.",
                       config.to_yaml(), cli, None)
    choice = (f"**This run will use:** {resolved.device} · {resolved.dtype}"
              + (" · 4-bit weights" if resolved.load_in_4bit else "")
              + (f" · {resolved.cpu_threads} CPU threads" if resolved.device == "cpu" else "") + "\n"
              + "\n".join(f"- {reason}" for reason in resolved.reasons))
    try:
        estimate = estimate_run(config, resolved, studio.hardware())
        if config.generation.backend != "transformers":
            estimate.notes.append("vLLM generation is usually several times faster than the generation time assumed here.")
        described = estimate.describe()
    except DragonError as exc:
        described = message(str(exc), "info")
    yaml_text = config.to_yaml()
    return Preview(message("The settings are valid.", "ok"), choice, described, yaml_text, cli,
                   str(write_config_file(draft, yaml_text)))


def start_run(studio: Studio, draft: dict) -> tuple:
    """Start training the draft: (run id, timer, tabs, message); a busy machine or a bad setting is explained
    in the message and nothing else changes."""
    try:
        run = studio.start(draft)
    except DragonError as exc:
        return gr.skip(), gr.skip(), gr.skip(), message(str(exc), "error")
    return (run.id, gr.Timer(active=True), gr.Tabs(selected=TAB_TRAIN),
            message(f"Started {run.id}; follow it on the Train tab.", "ok"))


# ----------------------------------------------------------------------------------------------------------------
# The tab.


def build(shared: Shared) -> None:
    studio = shared.studio
    initial = studio.default_draft()
    values = iter(field_values(initial))

    gr.Markdown("### Model")
    with gr.Row():
        model_id = gr.Dropdown([preset.id for preset in PRESETS], value=next(values), allow_custom_value=True,
                               label="Starting model", scale=3, elem_id="model-id",
                               info="A preset from the table, any Hub id (owner/name) or the path of a local model folder.")
        continue_from = gr.Dropdown(finished_runs(studio), value=None, label="…or continue from a finished run",
                                    scale=2, elem_id="model-continue",
                                    info="Starts from that run's trained model; its folder becomes the model id.")
    with gr.Accordion("Presets (click a row to use it)", open=False):
        gr.Markdown(f"Min. memory: {MINIMUM_SETTINGS}; CPU training is practical up to about 360M parameters.")
        presets = gr.Dataframe(preset_rows(), headers=["Model", "Parameters", "Min. memory", "Notes"],
                               interactive=False, wrap=True, elem_id="model-presets")

    gr.Markdown("### Hardware")
    with gr.Row():
        detected = gr.Markdown(hardware_markdown(studio.hardware()), elem_id="model-hardware-detected")
        detect_again = gr.Button("Detect again", size="sm", scale=0, elem_id="model-detect")
    with gr.Row():
        device = gr.Radio(list(DEVICES), value=next(values), label="Device", elem_id="model-device",
                          info="auto picks a CUDA GPU, then Apple MPS, then the CPU.")
        dtype = gr.Dropdown(list(DTYPES), value=next(values), label="Precision", elem_id="model-dtype",
                            info="auto: bf16 where it is fast, else fp32 (fp16 on GPUs without bf16).")
        load_in_4bit = gr.Checkbox(value=next(values), label="4-bit weights (QLoRA)", elem_id="model-4bit",
                                   info="About 4x less memory for the weights; needs a CUDA GPU, bitsandbytes and LoRA.")
        cpu_threads = gr.Number(value=next(values), precision=0, minimum=0, label="CPU threads", elem_id="model-threads",
                                info="Torch threads on the CPU; 0 = automatic (all cores on small machines, one spare from 4).")
    hardware_choice = gr.Markdown(elem_id="model-hardware-choice")

    with gr.Row(equal_height=False):
        with gr.Column():
            gr.Markdown("### LoRA")
            lora_enabled = gr.Checkbox(value=next(values), label="Train a LoRA adapter", elem_id="model-lora",
                                       info="A small add-on instead of every weight: far less memory; the base stays intact.")
            lora_r = gr.Number(value=next(values), precision=0, label="Rank r", elem_id="model-lora-r",
                               info="The adapter's capacity; 8-32 is plenty for RL.")
            lora_alpha = gr.Number(value=next(values), precision=0, label="Alpha", elem_id="model-lora-alpha",
                                   info="The adapter's scale; usually 2 x r.")
            lora_dropout = gr.Number(value=next(values), step=0.01, label="Dropout", elem_id="model-lora-dropout",
                                     info="Dropout on the adapter's input while training.")
            lora_targets = gr.Textbox(value=next(values), label="Target modules", elem_id="model-lora-targets",
                                      info="Layers that get an adapter: all-linear, or names like q_proj, v_proj.")
        with gr.Column():
            gr.Markdown("### GRPO")
            group_size = gr.Number(value=next(values), precision=0, label="Group size", elem_id="model-group-size",
                                   info="Completions per prompt; GRPO compares them, so more gives a clearer signal but costs time.")
            beta = gr.Number(value=next(values), step=0.01, label="Beta (KL penalty)", elem_id="model-beta",
                             info="How strongly the model is held near where it started; 0 skips the reference model.")
            temperature = gr.Number(value=next(values), step=0.1, label="Temperature", elem_id="model-temperature",
                                    info="Sampling randomness: higher gives more varied completions, too high gives nonsense.")
            max_new_tokens = gr.Number(value=next(values), precision=0, label="Max new tokens", elem_id="model-max-new-tokens",
                                       info="Length cap of each completion; answers cut off here usually score badly.")
            loss_type = gr.Dropdown(list(LOSS_TYPES), value=next(values), label="Loss type", elem_id="model-loss-type",
                                    info="How token losses are averaged; dapo (TRL's default) averages over all tokens of the batch.")
            scale_rewards = gr.Dropdown(list(SCALE_REWARDS), value=next(values), label="Scale rewards",
                                        elem_id="model-scale-rewards",
                                        info="Divide advantages by the reward spread of the group, the batch, or not at all.")
        with gr.Column():
            gr.Markdown("### Training")
            learning_rate = gr.Number(value=next(values), label="Learning rate", elem_id="model-learning-rate",
                                      info="Size of each update; 1e-6 to 2e-5 is typical for RL, LoRA tolerates more.")
            epochs = gr.Number(value=next(values), step=0.5, label="Epochs", elem_id="model-epochs",
                               info="Passes over the training prompts (ignored when max steps is set).")
            max_steps = gr.Number(value=next(values), precision=0, minimum=0, label="Max steps", elem_id="model-max-steps",
                                  info="Stop after this many steps; 0 = train for the epochs above.")
            batch_size = gr.Number(value=next(values), precision=0, label="Batch size (prompts per step)",
                                   elem_id="model-batch-size",
                                   info="Each step samples batch size x group size completions.")
            save_steps = gr.Number(value=next(values), precision=0, label="Save every (steps)", elem_id="model-save-steps",
                                   info="Checkpoint interval; Stop always saves one, and Resume starts from the latest.")
            checkpointing = gr.Checkbox(value=next(values), label="Gradient checkpointing", elem_id="model-checkpointing",
                                        info="Recompute activations in the backward pass: much less memory, ~30% slower.")

    gr.Markdown("### Before you start")
    check = gr.Markdown(elem_id="model-check")
    estimate = gr.Markdown(elem_id="model-estimate")
    with gr.Accordion("The whole configuration (YAML) and the command line", open=False):
        yaml_view = gr.Code(language="yaml", label="Configuration", interactive=False, elem_id="model-yaml")
        cli = gr.Markdown(elem_id="model-cli")
        download = gr.DownloadButton("Download the YAML", size="sm", interactive=False, elem_id="model-download")
    with gr.Row(equal_height=True):
        run_name = gr.Textbox(value=next(values), label="Run name", scale=3, elem_id="model-run-name",
                              info="Names the run's folder; leave empty to name it after the model.")
        start = gr.Button("Start training", variant="primary", scale=1, elem_id="model-start")
    start_status = gr.Markdown(elem_id="model-start-status")

    section_fields = {
        "model": [model_id],
        "hardware": [device, dtype, load_in_4bit, cpu_threads],
        "lora": [lora_enabled, lora_r, lora_alpha, lora_dropout, lora_targets],
        "grpo": [group_size, beta, temperature, max_new_tokens, loss_type, scale_rewards],
        "training": [learning_rate, epochs, max_steps, batch_size, save_steps, checkpointing],
    }
    all_fields = [field for fields in section_fields.values() for field in fields] + [run_name]

    for section, fields in section_fields.items():
        gr.on([field.input for field in fields], _section_handler(section), [shared.draft, *fields], [shared.draft],
              api_name=f"model_set_{section}", show_progress="hidden")
    run_name.input(set_run_name, [shared.draft, run_name], [shared.draft], api_name="model_set_name",
                   show_progress="hidden")

    def use_model(draft: dict, model: str):
        return update_section(draft, "model", model), model

    continue_from.input(use_model, [shared.draft, continue_from], [shared.draft, model_id], api_name="model_continue")
    continue_from.focus(lambda: gr.Dropdown(choices=finished_runs(studio)), None, [continue_from],
                        api_visibility="private", show_progress="hidden")

    def pick_preset(draft: dict, event: gr.SelectData):
        return use_model(draft, PRESETS[event.index[0]].id)

    presets.select(pick_preset, [shared.draft], [shared.draft, model_id], api_visibility="private")

    def fill_fields(draft: dict):
        return *field_values(draft), gr.Dropdown(choices=finished_runs(studio), value=None)

    shared.config_loaded.change(fill_fields, [shared.draft], [*all_fields, continue_from], api_visibility="private",
                                show_progress="hidden")

    preview_outputs = [check, hardware_choice, estimate, yaml_view, cli, download]
    shared.draft.change(lambda draft: build_preview(studio, draft).outputs(), [shared.draft], preview_outputs,
                        api_name="model_preview", show_progress="hidden")

    @shows_errors
    def redetect(draft: dict):
        info = studio.hardware(refresh=True)
        return (hardware_markdown(info), *build_preview(studio, draft).outputs())

    detect_again.click(redetect, [shared.draft], [detected, *preview_outputs], api_name="model_detect_hardware")

    start.click(shows_errors(lambda draft: start_run(studio, draft)), [shared.draft],
                [shared.run_id, shared.timer, shared.tabs, start_status], api_name="model_start")
