"""Tab 3 · Model & Hardware: the starting model, where it trains, the LoRA and GRPO settings, a rough estimate of
memory and time, the whole config as YAML, and Start.

Each settings group edits its own section of the draft (one handler per section, fired by any of its fields), and
every change of the draft, from any tab, refreshes the checks, the estimate and the YAML below.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass, field
from typing import Any, Callable

import gradio as gr

from ..config import DEVICES, DTYPES, GENERATION_BACKENDS, IMPORTANCE_SAMPLING_LEVELS, LOSS_TYPES, STRATEGIES, TRACKERS, Draft
from ..grpo_math import AGGREGATIONS, SCALE_REWARDS
from ..errors import DragonError
from ..runstore import slug
from ..studio import machine
from ..studio.backend import Studio
from ..studio.draft import Problem, place_problem, renamed
from ..studio.playground import preview_examples
from . import preflight_section
from .common import (MESSAGE_ICONS, TAB_TRAIN, Form, Shared, chosen_or_unchanged, client_left, described,
                     first_cell, in_the_page, message, number, optional_number, shown_number, shows_errors,
                     tab_selected)

TAB_TITLE = "Model & Hardware"
STARTED = MESSAGE_ICONS["ok"]  # how Start's message begins when the run started or was queued (start_run)
CLI_TEMPLATE = "python -m dragon_ui train {file}"


# ----------------------------------------------------------------------------------------------------------------
# How form values become settings.


def _target_modules(text: str) -> str | list[str]:
    """ "all-linear", or a list typed as "q_proj, v_proj" (commas or spaces)."""
    names = [name for name in re.split(r"[,\s]+", (text or "").strip()) if name]
    return names[0] if names == ["all-linear"] else names


def _target_modules_text(value: str | list[str] | None) -> str:
    """What the field shows: a kept draft may have none (the config's default then applies) or anything else."""
    if isinstance(value, str):
        return value
    return ", ".join(map(str, value)) if isinstance(value, list) else ""


@dataclass(frozen=True)
class Setting:
    """One field of the form: the draft key it edits, its widget, and how its value converts between the form and
    the draft. Its label and help are the config field's own (config.setting_help)."""

    key: str
    widget: Callable[..., Any] = gr.Number
    options: dict = field(default_factory=dict)  # more keyword arguments for the widget
    to_draft: Callable[[Any], Any] = lambda value: value
    to_field: Callable[[Any], Any] = lambda value: value
    advanced: bool = False  # shown in the section's "Advanced" accordion


WHOLE = {"precision": 0}


def optional(empty_means: str) -> dict:
    """A setting whose empty field means its default, said in the field (``empty_means``)."""
    return {"widget": optional_number, "options": {"placeholder": empty_means}, "to_draft": number,
            "to_field": shown_number}


ADVANCED_PER_ROW = 4
ADVANCED_HELP = (
    "TRL's defaults train plain GRPO; each setting here is one published change to it. "
    "[DAPO](https://huggingface.co/papers/2503.14476): clip-higher, leaving cut-off completions out (and the loss "
    "type dapo, TRL's default). [GSPO](https://huggingface.co/papers/2507.18071): sequence-level importance sampling. "
    "[GDPO](https://huggingface.co/papers/2601.05242): combine rewards after normalising each. "
    "[Beyond the 80/20 rule](https://huggingface.co/papers/2506.01939): train on the most uncertain tokens. "
    "Clipping and GSPO act only when a batch is trained on more than once (updates per batch ≥ 2). "
    "[TRL's GRPO trainer](https://huggingface.co/docs/trl/grpo_trainer) documents them all.")
SECTIONS: dict[str, tuple[Setting, ...]] = {
    "model": (
        Setting("id", gr.Dropdown, {"choices": machine.PRESET_IDS, "allow_custom_value": True},
                lambda value: (value or "").strip()),
    ),
    "hardware": (
        Setting("device", gr.Radio, {"choices": list(DEVICES)}),
        Setting("dtype", gr.Dropdown, {"choices": list(DTYPES)}),
        Setting("load_in_4bit", gr.Checkbox),
        Setting("cpu_threads", **optional("automatic")),
        Setting("gpu", **optional("the first")),
    ),
    "lora": (
        Setting("enabled", gr.Checkbox),
        Setting("r", options=WHOLE),
        Setting("alpha", options=WHOLE),
        Setting("dropout", options={"step": 0.01}),
        Setting("target_modules", gr.Textbox, to_draft=_target_modules, to_field=_target_modules_text),
    ),
    "grpo": (
        Setting("group_size", options=WHOLE),
        Setting("beta", options={"step": 0.01}),
        Setting("temperature", options={"step": 0.1}),
        Setting("max_new_tokens", options=WHOLE),
        Setting("loss_type", gr.Dropdown, {"choices": list(LOSS_TYPES)}),
        Setting("scale_rewards", gr.Dropdown, {"choices": list(SCALE_REWARDS)}),
        Setting("num_iterations", options={**WHOLE, "minimum": 1}, advanced=True),
        Setting("epsilon", options={"step": 0.01}, advanced=True),
        Setting("epsilon_high", **optional("epsilon"), advanced=True),
        Setting("importance_sampling_level", gr.Radio, {"choices": list(IMPORTANCE_SAMPLING_LEVELS)}, advanced=True),
        Setting("mask_truncated_completions", gr.Checkbox, advanced=True),
        Setting("multi_objective_aggregation", gr.Dropdown, {"choices": list(AGGREGATIONS)}, advanced=True),
        Setting("top_entropy_quantile", options={"step": 0.05}, advanced=True),
        Setting("entropy_coef", options={"step": 0.001}, advanced=True),
        Setting("top_p", options={"step": 0.05}, advanced=True),
        Setting("top_k", options={**WHOLE, "minimum": 0}, advanced=True),
        Setting("min_p", **optional("off"), advanced=True),
        Setting("repetition_penalty", options={"step": 0.05}, advanced=True),
    ),
    "training": (
        Setting("learning_rate"),
        Setting("epochs", options={"step": 0.5}),
        Setting("max_steps", **optional("the epochs")),
        Setting("batch_size", options=WHOLE),
        Setting("save_steps", options=WHOLE),
        Setting("gradient_checkpointing", gr.Checkbox),
        Setting("eval_every", **optional("about ten checks a run")),
    ),
    "logging": (
        Setting("report_to", gr.CheckboxGroup, {"choices": list(TRACKERS)}, to_draft=list,
                to_field=lambda value: [value] if isinstance(value, str) and value else list(value or [])),
    ),
    "distributed": (
        Setting("strategy", gr.Dropdown, {"choices": list(STRATEGIES)}),
    ),
    "generation": (
        Setting("backend", gr.Dropdown, {"choices": list(GENERATION_BACKENDS)}),
        Setting("vllm_server_url", gr.Textbox, to_draft=lambda value: (value or "").strip() or None,
                to_field=lambda value: value or ""),
    ),
}


def section_of(draft: Draft, section: str) -> dict:
    """A section of the draft, empty where a kept draft has none (or something else)."""
    found = draft.get(section)
    return found if isinstance(found, dict) else {}


def widgets(section: str, draft: Draft, form: Form, advanced: bool = False, part: slice = slice(None)) -> list:
    """The form fields of one section (its advanced ones, or the others; ``part`` of them), showing the draft's
    values (elem_id model-<section>-<key>), each added to the form at its config path."""
    stored = section_of(draft, section)
    chosen = [setting for setting in SECTIONS[section] if setting.advanced == advanced][part]
    return [form.add(f"{section}.{setting.key}",
                     setting.widget(value=setting.to_field(stored.get(setting.key)),
                                    elem_id=f"model-{section}-{setting.key.replace('_', '-')}",
                                    **described(f"{section}.{setting.key}"), **setting.options),
                     setting.to_draft)
            for setting in chosen]


SETTINGS_AT = {f"{section}.{setting.key}": setting for section, settings in SECTIONS.items() for setting in settings}


def field_values(draft: Draft, paths: list[str]) -> list[Any]:
    """The form's values for a draft, for the fields at these config paths (in the order the tab added them)."""
    values = []
    for path in paths:
        if path == "name":
            values.append(draft.get("name", ""))
        else:
            section, key = path.split(".", 1)
            values.append(SETTINGS_AT[path].to_field(section_of(draft, section).get(key)))
    return values


# ----------------------------------------------------------------------------------------------------------------
# What the tab shows about the draft.


def finished_runs(studio: Studio) -> list[tuple[str, str]]:
    """(label, run folder) of the runs a new run can continue from (in a public demo, the visitor's own)."""
    choices = []
    for run in studio.runs.summaries():
        if run["state"] == "succeeded" and studio.runs.owns(run.get("owner")):
            after = run.get("heldout_after")
            reward = f", held-out reward {after:.2f}" if isinstance(after, (int, float)) else ""
            choices.append((f"{run['id']} ({run['model']}{reward})", run["dir"]))
    return choices


# Which area of this tab shows a problem with a config section; problems of other tabs' sections are shown there
# and named in the check, problems without a section only in the check.
PROBLEM_AREAS = ("model", "hardware", "lora", "grpo", "advanced", "training", "scaleout", "name")
AREA_OF_SECTION = {"model": "model", "hardware": "hardware", "lora": "lora", "grpo": "grpo", "training": "training",
                   "logging": "training", "distributed": "scaleout", "generation": "scaleout", "name": "name"}


@dataclass
class Preview:
    """Everything below the settings, recomputed whenever the form changes."""

    check: str
    hardware: str
    estimate: str
    yaml: str
    cli: str
    file_name: str | None  # what the YAML is saved as, when it may be (the settings are valid)
    problems: dict[str, str] = field(default_factory=dict)  # PROBLEM_AREAS key -> message next to those fields
    ready: bool = False  # the settings are valid and work here: Start is offered

    def outputs(self) -> tuple:
        return (self.check, self.hardware, self.estimate, self.yaml, self.cli, self.file_name or "",
                gr.Button(interactive=self.file_name is not None),
                *(self.problems.get(area, "") for area in PROBLEM_AREAS), gr.Button(interactive=self.ready))


def config_file_name(draft: Draft) -> str:
    return f"{slug((draft.get('name') or '').strip(), empty='my-run')}.yaml"


# "Download the YAML" saves the text the page shows, made into a file by the browser: the server writes nothing for
# it (a file for every edit of the settings was a file for every event any visitor sent).
SAVE_IN_THE_BROWSER = """(text, name) => {
    const link = document.createElement('a');
    link.href = URL.createObjectURL(new Blob([text], {type: 'application/x-yaml'}));
    link.download = name;
    document.body.appendChild(link);
    link.click();
    link.remove();
    setTimeout(() => URL.revokeObjectURL(link.href), 60000);
    return [];
}"""


def placed(problem: Problem) -> tuple[str, dict[str, str]]:
    """(the check's sentence, {area: message}) for a problem: next to its fields, and in the check with the tab
    it is on when that is another tab."""
    setting = SETTINGS_AT.get(problem.path or "")
    area = "advanced" if setting is not None and setting.advanced else AREA_OF_SECTION.get(problem.section or "")
    return message(problem.seen_from(TAB_TITLE), "error"), ({area: message(problem.text, "error")} if area else {})


def build_preview(studio: Studio, draft: Draft, labels: dict[str, str] | None = None) -> Preview:
    """Validate the draft and describe it: the first problem, placed next to its fields and worded with their
    ``labels``; the hardware choice with its reasons, the estimate, the YAML and the equivalent command line."""
    if not draft:
        return Preview(message("Loading the settings…"), "", "", "", "", None)
    labels = labels or {}
    cli = f"Run the same training without the app: save the YAML as `{config_file_name(draft)}` and run\n" \
          f"```\n{CLI_TEMPLATE.format(file=config_file_name(draft))}\n```"
    try:
        config = studio.recipes.validate(draft)
        preview_examples(config.data, config.base_dir or None, policy=studio.policy)  # read and mapped as the Data tab does
    except DragonError as exc:
        problem = place_problem(str(exc), labels, draft.get("rewards") or [], draft.get("tools") or [])
        check, problems = placed(problem)
        return Preview(check, "", "The estimate appears once the settings are valid.",
                       f"# The settings are not valid yet:\n# {exc}", cli, None, problems)
    yaml_text = config.to_yaml()
    download = config_file_name(draft)  # also for another machine, whatever this one has
    try:  # what this machine must have for it: the hardware chosen, the trackers' packages
        planned = machine.plan(studio, config)
    except DragonError as exc:
        check, problems = placed(place_problem(str(exc), labels))
        return Preview(check, "", "The estimate appears once the settings work on this machine.", yaml_text,
                       cli, download, problems)
    estimate = planned.estimate if planned.estimated else message(planned.estimate, "info")
    return Preview(message("The settings are valid.", "ok"), planned.choice, estimate, yaml_text, cli, download,
                   ready=True)


def export_for_cluster(studio: Studio, draft: Draft, gpus: Any, nodes: Any) -> tuple:
    """(zip path or skip, message): the draft as a self-contained launch folder for ``nodes`` x ``gpus`` GPUs
    (studio.machine.export)."""
    try:
        config = studio.recipes.validate(draft)
        archive = machine.export(studio, config, config_file_name(draft)[:-5], int(gpus), int(nodes))
    except (DragonError, TypeError, ValueError, OverflowError) as exc:
        return gr.skip(), message(str(exc) if isinstance(exc, DragonError) else "GPUs and nodes must be whole numbers.", "error")
    return str(archive), message(f"Unzip it on the GPU machine and run `./launch.sh` there ({archive.stem}/README.md "
                                 "explains the SLURM template and where results appear).", "ok")


def start_run(studio: Studio, draft: Draft, labels: dict[str, str] | None = None) -> tuple:
    """Start training the draft: (run id, message, the Train tab's status line); a busy machine or a bad setting is
    explained in the message, in the screen's words (``labels``), and nothing else changes. The page then shows the
    Train tab when the message says it started (``STARTED``), which follows the new run (train_tab.follow_start)."""
    try:
        run = studio.runs.start(draft)
    except DragonError as exc:
        problem = place_problem(str(exc), labels or {}, draft.get("rewards") or [], draft.get("tools") or [])
        return gr.skip(), message(problem.seen_from(TAB_TITLE), "error"), gr.skip()
    if run.read_status().get("waiting"):
        said = (f"Queued {run.id} behind the run training now ({studio.runs.place(run.id)}): it starts by itself "
                "when its turn comes, even with this page closed. Follow it on the Train tab.")
    else:
        said = f"Started {run.id}; follow it on the Train tab."
    return run.id, message(said, "ok"), f"Run `{run.id}` · {message('starting…', 'info')}"


def continue_choices(studio: Studio) -> gr.Dropdown:
    """The "continue from a finished run" picker, listing the runs as they are now, none picked."""
    return gr.Dropdown(choices=finished_runs(studio), value=None)


def fill_fields(studio: Studio, paths: list[str], draft: Draft) -> tuple:
    """A whole new draft was loaded: the tab's fields (at config ``paths``) show it, and the runs to continue from
    are listed anew."""
    return *field_values(draft, paths), continue_choices(studio)


def preview_outputs(studio: Studio, draft: Draft, labels: dict[str, str] | None = None) -> tuple:
    """build_preview as the events show it (Preview.outputs)."""
    return build_preview(studio, draft, labels).outputs()


def preview_after_edit(studio: Studio, draft: Draft, labels: dict[str, str] | None = None) -> tuple:
    """The preview, Start's message emptied and the measured step forgotten: a failed Start's message, and a step
    measured with other settings, go as soon as the settings change."""
    return *preview_outputs(studio, draft, labels), "", MEASURE_HELP


MEASURE_HELP = ("*Measure one step* trains one real step of these settings on the data's longest prompts, in a "
                "process of its own, and says its time and peak memory (about a step's time, plus loading the model).")


def measure_step(studio: Studio, draft: Draft, labels: dict[str, str] | None = None) -> str:
    """"Measure one step": the draft's dry run (Studio.measure_step) in a sentence under the estimate, or why there
    is none, in the screen's words."""
    try:
        measured = studio.measure_step(draft, should_stop=client_left())
    except DragonError as exc:
        problem = place_problem(str(exc), labels or {}, draft.get("rewards") or [], draft.get("tools") or [])
        return message(problem.seen_from(TAB_TITLE), "error")
    return message(measured.describe(), "ok")


def hardware_found(studio: Studio) -> str:
    return machine.hardware_markdown(studio.hardware())


@shows_errors
def redetect(studio: Studio, draft: Draft, labels: dict[str, str] | None = None) -> tuple:
    """"Detect again": the hardware found now, and the preview of the draft on it."""
    return machine.hardware_markdown(machine.redetect(studio)), *preview_outputs(studio, draft, labels)


def follow_the_data(name: str, auto_name: str, source: str | None) -> tuple[str, str]:
    """(run name, the name the app chose): the run name follows the data file while the app chose it; a typed
    name is kept."""
    return renamed(name, auto_name, source or "")


# ----------------------------------------------------------------------------------------------------------------
# The tab.


def problem_area(area: str) -> gr.Markdown:
    return gr.Markdown(elem_id=f"model-{area}-problem", show_label=False)


@dataclass
class ModelTab:
    """The components the tab's events use; ``areas``: where each PROBLEM_AREAS problem shows."""

    model_id: gr.Dropdown
    continue_from: gr.Dropdown
    presets: gr.Dataframe
    detected: gr.Markdown
    detect_again: gr.Button
    hardware_choice: gr.Markdown
    areas: dict[str, gr.Markdown]
    export: ClusterExport
    start: StartRow

    @property
    def preview(self) -> list:
        """What Preview.outputs fills, in order."""
        start = self.start
        return [start.check, self.hardware_choice, start.estimate, start.yaml_view, start.cli, start.file_name,
                start.download, *(self.areas[area] for area in PROBLEM_AREAS), start.start]


@dataclass
class ClusterExport:
    gpus: gr.Number
    nodes: gr.Number
    button: gr.Button
    status: gr.Markdown
    file: gr.File


@dataclass
class StartRow:
    """Before you start: the check, the estimate, the YAML, the run name, "Will it learn?" and Start."""

    check: gr.Markdown
    estimate: gr.Markdown
    yaml_view: gr.Code
    cli: gr.Markdown
    download: gr.Button
    file_name: gr.Textbox
    run_name: gr.Textbox
    will_it_learn: gr.Button
    start: gr.Button
    status: gr.Markdown
    measure: gr.Button
    measured: gr.Markdown


def build(shared: Shared) -> Callable[[], None]:
    """The tab's components; returns the function that wires the events that read the whole form (app.build_app
    calls it once every tab has added its fields)."""
    studio, form = shared.studio, shared.form
    initial = studio.recipes.default()
    areas: dict[str, gr.Markdown] = {}
    gr.Markdown("### Model")
    with gr.Row():
        with gr.Column(scale=3):
            (model_id,) = widgets("model", initial, form)
            if studio.public:  # the models this demo offers; typing another gets the reason it is not offered
                model_id.choices = [(model, model) for model in studio.allowed_models()]
        continue_from = gr.Dropdown(finished_runs(studio), value=None, label="…or continue from a finished run",
                                    scale=2, elem_id="model-continue",
                                    info="Starts from that run's trained model; its folder becomes the model id.")
    areas["model"] = problem_area("model")
    presets = presets_table(studio)
    gr.Markdown("### Hardware")
    with gr.Row():
        detected = gr.Markdown("Detecting the hardware…", elem_id="model-hardware-detected")
        detect_again = gr.Button("Detect again", size="sm", scale=0, elem_id="model-detect")
    with gr.Row():
        widgets("hardware", initial, form)
    areas["hardware"] = problem_area("hardware")
    # Filled when the page opens the settings (shared.refreshes); the build imports no torch, so the server answers
    # sooner, and the app's warm-up (Studio.warm_up) has measured the CPU for the estimate by then.
    preview = build_preview(studio, {})
    hardware_choice = gr.Markdown(preview.hardware, elem_id="model-hardware-choice")
    settings_columns(form, initial, areas)
    advanced_settings(form, initial, areas)
    export = scale_out(form, initial, areas)
    tab = ModelTab(model_id, continue_from, presets, detected, detect_again, hardware_choice, areas, export,
                   start_row(form, initial, areas, preview, measures=studio.policy.measures_steps))
    connect_preflight = preflight_section.build(shared, tab.start.will_it_learn)
    own = [f for f in form.fields if f.path in SETTINGS_AT or f.path == "name"]  # not the Rewards tab's tool rounds
    continue_from.input(chosen_or_unchanged, [continue_from], [model_id], api_visibility="private")
    continue_from.focus(functools.partial(continue_choices, studio), None, [continue_from], api_visibility="private",
                        show_progress="hidden")
    presets.select(first_cell, None, [model_id], api_visibility="private")
    shared.fills.append((functools.partial(fill_fields, studio, [f.path for f in own]),
                         [*(f.component for f in own), continue_from]))
    return functools.partial(connect, shared, tab, connect_preflight)


def presets_table(studio: Studio) -> gr.Dataframe:
    with gr.Accordion("Presets (click a row to use it)", open=False):
        gr.Markdown(f"Min. memory: {machine.MINIMUM_SETTINGS}; CPU training is practical up to about 360M "
                    "parameters. Tools: whether a run with tools (Rewards tab) can train it to call them.")
        presets = gr.Dataframe(machine.preset_rows(machine.offered_presets(studio)), headers=machine.PRESET_COLUMNS,
                               interactive=False, wrap=True, elem_id="model-presets")
    return presets


def settings_columns(form: Form, initial: Draft, areas: dict[str, gr.Markdown]) -> None:
    """LoRA, GRPO and Training side by side, each with its problem area."""
    with gr.Row(equal_height=False):
        for section, title in (("lora", "LoRA"), ("grpo", "GRPO"), ("training", "Training")):
            with gr.Column():
                gr.Markdown(f"### {title}")
                widgets(section, initial, form)
                if section == "training":
                    widgets("logging", initial, form)
                areas[section] = problem_area(section)


def advanced_settings(form: Form, initial: Draft, areas: dict[str, gr.Markdown]) -> None:
    with gr.Accordion("Advanced GRPO: TRL's variants (DAPO, GSPO, GDPO, …)", open=False, elem_id="model-advanced"):
        gr.Markdown(ADVANCED_HELP)
        for first in range(0, sum(setting.advanced for setting in SECTIONS["grpo"]), ADVANCED_PER_ROW):
            with gr.Row():
                widgets("grpo", initial, form, advanced=True, part=slice(first, first + ADVANCED_PER_ROW))
    areas["advanced"] = problem_area("advanced")  # outside, so a problem shows while the accordion is closed


def scale_out(form: Form, initial: Draft, areas: dict[str, gr.Markdown]) -> ClusterExport:
    with gr.Accordion("Scale out: several GPUs or a cluster", open=False):
        gr.Markdown("Train this exact run on a multi-GPU machine or a SLURM cluster: the download is a folder with "
                    "the config, the data, the engine, an accelerate config, `launch.sh` and a SLURM template.")
        with gr.Row():
            widgets("distributed", initial, form)
            widgets("generation", initial, form)
        areas["scaleout"] = problem_area("scaleout")
        with gr.Row(equal_height=True):
            gpus = gr.Number(8, label="GPUs per node", precision=0, minimum=1, elem_id="model-export-gpus")
            nodes = gr.Number(1, label="Nodes", precision=0, minimum=1, elem_id="model-export-nodes")
            button = gr.Button("Export launch folder", elem_id="model-export")
        status = gr.Markdown(elem_id="model-export-status")
        file = gr.File(label="Launch folder (zip)", interactive=False, elem_id="model-export-file")
    return ClusterExport(gpus, nodes, button, status, file)


def start_row(form: Form, initial: Draft, areas: dict[str, gr.Markdown], preview: Preview,
              measures: bool = True) -> StartRow:
    """Before you start, showing ``preview`` until the page's own comes; ``measures``: with Measure one step."""
    gr.Markdown("### Before you start")
    check = gr.Markdown(preview.check, elem_id="model-check")
    estimate = gr.Markdown(preview.estimate, elem_id="model-estimate")
    with gr.Row(equal_height=True, visible=measures):  # a public demo's owner allows its visitors dry runs, or not
        measure = gr.Button("Measure one step", size="sm", scale=0, min_width=180, elem_id="model-measure")
        measured = gr.Markdown(MEASURE_HELP, elem_id="model-measured")
    with gr.Accordion("The whole configuration (YAML) and the command line", open=False):
        yaml_view = gr.Code(preview.yaml, language="yaml", label="Configuration", interactive=False,
                            elem_id="model-yaml")
        cli = gr.Markdown(preview.cli, elem_id="model-cli")
        download = gr.Button("Download the YAML", size="sm", interactive=preview.file_name is not None,
                             elem_id="model-download")
        file_name = gr.Textbox(preview.file_name or "", visible=False, elem_id="model-download-name")
    with gr.Row(equal_height=True):
        run_name = form.add("name", gr.Textbox(value=initial.get("name", ""), scale=3, elem_id="model-run-name",
                                               **described("name", "Until you type one, it follows the data file.")),
                            lambda value: (value or "").strip())
        will_it_learn = gr.Button("Will it learn?", scale=1, elem_id="model-preflight")
        start = gr.Button("Start training", variant="primary", scale=1, elem_id="model-start", interactive=False)
    areas["name"] = problem_area("name")
    return StartRow(check, estimate, yaml_view, cli, download, file_name, run_name, will_it_learn, start,
                    gr.Markdown(elem_id="model-start-status"), measure, measured)


def connect(shared: Shared, tab: ModelTab, connect_preflight: Callable[[], None]) -> None:
    """The events that read the whole form, once every tab has added its fields."""
    studio, form, start = shared.studio, shared.form, tab.start
    labels, preview = form.labels, tab.preview
    connect_preflight()
    start.download.click(None, [start.yaml_view, start.file_name], None, js=SAVE_IN_THE_BROWSER,
                         api_visibility="private", show_progress="hidden")
    form.watch(functools.partial(preview_after_edit, studio, labels=labels), [*preview, start.status, start.measured])
    # Turns of their own: the step trains in a process of its own, and the model events need not wait minutes for it.
    start.measure.click(form.takes_draft(shows_errors(functools.partial(measure_step, studio, labels=labels))),
                        form.inputs, [start.measured], api_visibility="private", concurrency_limit=1,
                        concurrency_id="dry-runs")
    # Start is offered once the loaded settings are in the form and checked.
    shared.refreshes.append((form.takes_draft(functools.partial(preview_outputs, studio, labels=labels)),
                             form.inputs, preview))
    shared.refreshes.append((functools.partial(hardware_found, studio), [], [tab.detected]))
    tab.detect_again.click(form.takes_draft(functools.partial(redetect, studio, labels=labels)), form.inputs,
                           [tab.detected, *preview], show_progress_on=[tab.detected], api_visibility="private")
    export = tab.export
    export.button.click(form.takes_draft(functools.partial(export_for_cluster, studio)),
                        [*form.inputs, export.gpus, export.nodes], [export.file, export.status],
                        api_visibility="private", concurrency_limit=1, concurrency_id="exports")
    started = f"(inputs[0] || '').startsWith({json.dumps(STARTED)})"
    start.start.click(form.takes_draft(shows_errors(functools.partial(start_run, studio, labels=labels))),
                      form.inputs, [shared.run_id, start.status, shared.train_status], api_visibility="private",
                      show_progress="hidden").success(**in_the_page([shared.tabs], tab_selected(TAB_TRAIN, started)),
                                                      inputs=[start.status])
    source = form.component("data.source")
    for replaced in shared.source_replaced:
        replaced.then(follow_the_data, [start.run_name, shared.auto_name, source], [start.run_name, shared.auto_name],
                      api_visibility="private", show_progress="hidden")
