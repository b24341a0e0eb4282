"""The Model & Hardware tab: the form's fields and the draft they compose, the preview (check, problems next to
their fields, hardware, estimate, YAML), Start and the cluster export, through the tab's functions and the handlers
its buttons are wired to."""

from __future__ import annotations

import copy

import gradio as gr
import pytest
import yaml

from conftest import said
from dragon_ui.config import RunConfig
from dragon_ui.engine import training
from dragon_ui.engine.hardware import CudaDevice, HardwareInfo
from dragon_ui.public import Policy
from dragon_ui.studio import machine
from dragon_ui.studio.draft import same_settings
from dragon_ui.ui import model_tab
from dragon_ui.ui.common import message
from dragon_ui.public import LAPTOP

pytestmark = pytest.mark.timeout(300)
ERROR, OK = message("", "error"), message("", "ok")  # how a check's sentence says what kind it is
NO_GPU = HardwareInfo(cuda=[], mps=False, cpu_cores=2)
MODEL_TAB_PATHS = [f"{section}.{setting.key}" for section, settings in model_tab.SECTIONS.items()
                   for setting in settings] + ["name"]


def get_path(draft: dict, path: str):
    value = draft
    for part in path.split("."):
        value = (value or {}).get(part)
    return value


def screen(app, draft: dict, **edits) -> list:
    """The form's inputs (the loaded draft, then every field's value) when the fields show ``draft``, with some
    fields typed over: ``edits`` maps a config path (dots as "__") to what the field shows."""
    shown = dict(zip(MODEL_TAB_PATHS, model_tab.field_values(draft, MODEL_TAB_PATHS), strict=True))
    shown.update({path.replace("__", "."): value for path, value in edits.items()})
    return [draft, *(shown[f.path] if f.path in shown else get_path(draft, f.path) for f in app.form.fields)]


def button(app, elem_id: str, event: str = "click"):
    """The Python function wired to an event of the component with this elem_id."""
    ids = {block_id for block_id, block in app.blocks.items() if getattr(block, "elem_id", None) == elem_id}
    (fn,) = [f.fn for f in app.fns.values() if any(target in ids and name == event for target, name in f.targets)]
    return fn


@pytest.fixture
def tiny_draft(studio, tiny_model_dir) -> dict:
    """The default draft on the tiny model, 2 quick steps on one CPU thread."""
    draft = studio.recipes.default()
    draft["model"]["id"] = str(tiny_model_dir)
    draft["grpo"].update(group_size=2, max_new_tokens=6)
    draft["training"].update(batch_size=2, max_steps=2, save_steps=1, learning_rate=0.01)
    draft["lora"].update(r=4, alpha=8)
    draft["hardware"].update(device="cpu", dtype="float32", cpu_threads=1)
    draft["n_samples"] = 2
    return draft


def test_the_form_composes_what_the_screen_shows(app, studio):
    draft = studio.recipes.default()
    draft["training"]["grad_accum"] = 3  # not on the form: comes from the draft last loaded
    original = copy.deepcopy(draft)
    values = screen(app, draft, model__id="  Qwen/Qwen2.5-0.5B-Instruct ", name=" my run ",
                    lora__enabled=True, lora__r=8, lora__alpha=16, lora__dropout=0.1, lora__target_modules="q_proj, v_proj",
                    training__learning_rate=2e-5, training__epochs=2.0, training__max_steps="", training__batch_size=8,
                    training__save_steps=10, training__gradient_checkpointing=True,
                    grpo__group_size=8, grpo__beta=0.0, grpo__temperature=0.7, grpo__max_new_tokens=64,
                    grpo__loss_type="grpo", grpo__scale_rewards="none",
                    hardware__device="cpu", hardware__dtype="float32", hardware__load_in_4bit=False,
                    hardware__cpu_threads=" ", hardware__gpu="1")
    new = app.form.compose(*values)

    assert new["lora"] == {"enabled": True, "r": 8, "alpha": 16, "dropout": 0.1, "target_modules": ["q_proj", "v_proj"]}
    assert new["training"] == {**original["training"], "learning_rate": 2e-5, "epochs": 2.0, "max_steps": None,
                               "batch_size": 8, "save_steps": 10, "gradient_checkpointing": True, "grad_accum": 3}
    assert new["grpo"] == {**original["grpo"], "group_size": 8, "beta": 0.0, "temperature": 0.7, "max_new_tokens": 64,
                           "loss_type": "grpo", "scale_rewards": "none"}
    assert new["hardware"] == {"device": "cpu", "dtype": "float32", "load_in_4bit": False, "cpu_threads": None,
                               "gpu": 1}
    assert new["model"]["id"] == "Qwen/Qwen2.5-0.5B-Instruct"
    assert new["name"] == "my run"

    assert draft == original  # composing never changes the loaded draft
    for section in ("data", "rewards", "runs_dir", "base_dir"):
        assert new[section] == original[section]
    RunConfig.from_dict(new, policy=LAPTOP)  # still a complete, valid config


def test_a_handler_that_takes_the_draft_gets_what_the_screen_shows(app, studio):
    seen = []
    handler = app.form.takes_draft(lambda draft, extra: seen.append((draft, extra)) or "done")
    assert handler(*screen(app, studio.recipes.default(), training__learning_rate=3e-6), "more") == "done"
    (draft, extra), = seen
    assert draft["training"]["learning_rate"] == 3e-6 and extra == "more"


def test_the_form_shows_the_draft_and_round_trips(app, studio):
    draft = studio.recipes.default()
    draft["lora"]["target_modules"] = ["q_proj", "v_proj"]
    values = model_tab.field_values(draft, MODEL_TAB_PATHS)
    assert values[0] == draft["model"]["id"] and values[-1] == draft["name"]
    assert values[MODEL_TAB_PATHS.index("lora.target_modules")] == "q_proj, v_proj"
    assert values[MODEL_TAB_PATHS.index("grpo.group_size")] == draft["grpo"]["group_size"]
    # Every Model tab setting has one field in the form, whose fill on load puts each value in its field.
    assert sorted(f.path for f in app.form.fields if f.path in MODEL_TAB_PATHS) == sorted(MODEL_TAB_PATHS)
    assert app.form.compose(*screen(app, draft)) == draft


def test_a_valid_draft_previews_its_yaml_cli_and_estimate(app, studio):
    draft = studio.recipes.default()
    preview = model_tab.build_preview(studio, draft, app.form.labels)
    assert preview.check == message("The settings are valid.", "ok") and preview.problems == {}
    assert preview.hardware.startswith("**This run will use:** ") and "- device " in preview.hardware
    assert preview.estimate.startswith("**Estimate** for HuggingFaceTB/SmolLM2-135M-Instruct (135M parameters")
    assert "within about a third of a measured step's time" in preview.estimate  # how sure, on the CPU
    assert "Memory ≈" in preview.estimate and "Time per step ≈" in preview.estimate
    assert RunConfig.from_dict(yaml.safe_load(preview.yaml), base_dir=draft["base_dir"], policy=LAPTOP) == studio.recipes.validate(draft)
    assert "python -m dragon_ui train arithmetic.yaml" in preview.cli
    outputs = preview.outputs()
    file_name, download = outputs[5:7]  # the browser saves the YAML shown under this name: the server writes nothing
    assert file_name == "arithmetic.yaml" and download.interactive
    assert outputs[7:-1] == ("",) * len(model_tab.PROBLEM_AREAS)  # no problem shown next to any fields
    assert preview.ready and outputs[-1].interactive  # Start is offered


@pytest.mark.parametrize(("edits", "area", "sentence", "path"), [
    ({"grpo__group_size": 1}, "grpo", "Group size must be between 2 and 64", "grpo.group_size"),
    ({"grpo__temperature": 0.0}, "grpo", "Temperature must be above 0", "grpo.temperature"),
    ({"training__learning_rate": 0.0}, "training", "Learning rate must be above 0", "training.learning_rate"),
    ({"lora__target_modules": ""}, "lora", "Target modules is empty", "lora.target_modules"),
    ({"model__id": "  "}, "model", "Starting model is empty", "model.id"),
    ({"hardware__load_in_4bit": True, "lora__enabled": False}, "hardware",
     "4-bit weights (QLoRA) needs LoRA (“Train a LoRA adapter” ticked)", "lora.enabled"),
    ({"generation__vllm_server_url": "http://10.0.0.5:8000"}, "scaleout",
     "vLLM server URL is only used with “Generation” vllm-server", "generation.backend"),
    ({"training__max_steps": "ten"}, "training", "Max steps must be a whole number, not the text 'ten'",
     "training.max_steps"),
    ({"grpo__epsilon_high": "0"}, "advanced", "Upper clip (epsilon high) must be between", "grpo.epsilon_high"),
])
def test_an_invalid_value_is_named_in_the_forms_words_next_to_its_fields(app, studio, edits, area, sentence, path):
    draft = app.form.compose(*screen(app, studio.recipes.default(), **edits))
    preview = model_tab.build_preview(studio, draft, app.form.labels)
    assert preview.check.startswith(ERROR) and sentence in preview.check, preview.check
    assert path not in preview.check  # the form's words, not the config file's
    assert "tab)" not in preview.check  # it is on this tab
    assert set(preview.problems) == {area} and sentence in preview.problems[area]
    assert preview.yaml.startswith("# The settings are not valid yet:")
    file_name, download = preview.outputs()[5:7]
    assert file_name == "" and not download.interactive


@pytest.mark.parametrize(("section", "value", "tab", "sentence"), [
    ("data", {"prompt": ""}, "Data", "Prompt is empty; give the name of the column"),
    ("rewards", [{"kind": "regex", "name": "shape", "pattern": "("}], "Rewards",
     "The 1st reward (shape): the regular expression is not a valid regular expression"),
])
def test_a_problem_on_another_tab_is_named_with_that_tab(app, studio, section, value, tab, sentence):
    draft = studio.recipes.default()
    draft[section] = {**draft[section], **value} if isinstance(value, dict) else value
    preview = model_tab.build_preview(studio, draft, app.form.labels)
    assert preview.check.startswith(ERROR) and sentence in preview.check, preview.check
    assert preview.check.endswith(f"(on the {tab} tab)")
    assert preview.problems == {}  # nothing next to this tab's fields


def test_a_hardware_choice_this_machine_cannot_run_is_a_problem_of_the_hardware(app, studio):
    studio._hardware = NO_GPU  # whatever this machine has
    draft = app.form.compose(*screen(app, studio.recipes.default(), hardware__device="cuda"))
    preview = model_tab.build_preview(studio, draft, app.form.labels)
    assert preview.check.startswith(ERROR) and "settings are valid" not in preview.check
    assert "Device is cuda, but no CUDA GPU is visible" in preview.check and "hardware.device" not in preview.check
    assert set(preview.problems) == {"hardware"} and "no CUDA GPU" in preview.problems["hardware"]
    assert preview.hardware == "" and "once the settings work on this machine" in preview.estimate
    assert "device: cuda" in preview.yaml and preview.outputs()[6].interactive  # still saved for a GPU machine

    draft = app.form.compose(*screen(app, studio.recipes.default(), hardware__load_in_4bit=True, lora__enabled=True))
    preview = model_tab.build_preview(studio, draft, app.form.labels)
    assert preview.check.startswith(ERROR) and "4-bit weights (QLoRA) needs a CUDA GPU" in preview.check
    assert set(preview.problems) == {"hardware"}


def test_the_presets_table(studio, monkeypatch, tiny_model_dir):
    rows = machine.preset_rows(machine.offered_presets(studio))
    assert len(rows) == 8 and rows[0][:2] == ["HuggingFaceTB/SmolLM2-135M-Instruct", "135M"]
    monkeypatch.setenv("DRAGON_UI_PUBLIC", "1")  # a public demo offers only the presets it allows
    monkeypatch.setenv("DRAGON_UI_PUBLIC_MODELS", "Qwen/Qwen3-0.6B")
    monkeypatch.setattr(studio, "policy", Policy.from_env(studio.runs_dir))
    assert [preset.id for preset in machine.offered_presets(studio)][-1] == "Qwen/Qwen3-0.6B"
    assert "google/gemma-3-1b-it" not in [preset.id for preset in machine.offered_presets(studio)]
    memories = [float(row[2].strip("~ GB")) for row in rows]
    assert memories[0] < 4.0 and all(m > memories[0] for m in memories[1:])
    assert "offline" in rows[0][4] and "Gated" in rows[4][4]
    assert [row[0] for row in rows if row[3] == "no"] == ["google/gemma-3-1b-it"]  # its template has no tool turn


def test_hardware_panel_lists_what_was_found(studio):
    text = machine.hardware_markdown(studio.hardware())
    assert text.startswith(f"**Detected:** {studio.hardware().summary()}.")
    assert "- 4-bit loading: " in text and "- Memory: " in text and " GB free of " in text

    no_gpu = machine.hardware_markdown(NO_GPU)
    assert "No CUDA GPU is visible" in no_gpu and "4-bit loading: not available (it needs a CUDA GPU)" in no_gpu
    gpu = HardwareInfo(cuda=[CudaDevice(0, "Test GPU", 80.0, 70.0, True)], cpu_cores=2, bitsandbytes=False)
    with_gpu = machine.hardware_markdown(gpu)
    assert "GPU 0 supports bf16" in with_gpu and "not available (bitsandbytes is not installed)" in with_gpu
    assert "available (bitsandbytes is installed)" in machine.hardware_markdown(
        HardwareInfo(cuda=gpu.cuda, cpu_cores=2, bitsandbytes=True))


def test_start_trains_what_the_screen_shows_then_busy_then_continue(app, studio, tiny_draft):
    # The Start button composes the draft from the fields at the moment it is pressed: a value typed just before
    # (here the run name and the steps) is what trains.
    inputs = screen(app, tiny_draft, name="typed-name", training__max_steps=2, training__save_steps=2)
    run_id, status, train_status = button(app, "model-start")(*inputs)
    (handle,) = training.active_runs()
    assert handle is not None and handle.run.id == run_id and run_id.endswith("-typed-name")
    assert status == message(f"Started {run_id}; follow it on the Train tab.", "ok")
    assert status.startswith(model_tab.STARTED)  # what the page reads to show the Train tab
    assert train_status.startswith(f"Run `{run_id}` · ")  # the Train tab at once, not "No run to show yet"
    config = studio.runs.get(run_id).read_config()
    assert config.name == "typed-name" and config.training.save_steps == 2
    assert same_settings(config.to_dict(), app.form.compose(*inputs), policy=LAPTOP)

    queued_id, queued, _ = model_tab.start_run(studio, tiny_draft)  # a busy machine queues the next run
    ((kind, words),) = said(queued)
    assert queued_id != run_id and kind == "ok"
    assert words.startswith(f"Queued {queued_id} behind the run training now (1st in line; expected to start in ")

    assert handle.wait(120) == "succeeded"
    (label, path), = model_tab.finished_runs(studio)
    assert label.startswith(run_id) and path == str(studio.runs.get(run_id).path)
    assert button(app, "model-continue", "input")(path) == path  # picking the run puts its folder in the model id
    assert button(app, "model-continue", "input")(None) == gr.skip()
    draft = app.form.compose(*screen(app, tiny_draft, model__id=path))
    preview = model_tab.build_preview(studio, draft, app.form.labels)
    assert preview.check == message("The settings are valid.", "ok")
    assert f"the starting model of run {run_id}" in preview.estimate


def test_start_with_a_bad_draft_explains_and_stays(studio, tiny_draft):
    tiny_draft["training"]["batch_size"] = 500
    run_id, status, train_status = model_tab.start_run(studio, tiny_draft)
    assert (run_id, train_status) == (gr.skip(),) * 2
    assert status.startswith(ERROR) and "Only " in status and "fewer than training.batch_size (500)" in status
    assert not training.active_runs() and studio.runs.summaries() == []


def test_export_for_a_cluster_gives_a_zip_of_the_launch_folder(studio):
    import zipfile

    draft = studio.recipes.default()
    draft["distributed"]["strategy"] = "zero3"
    archive, note = model_tab.export_for_cluster(studio, draft, 4, 2)
    assert "launch.sh" in note and note.startswith(OK)
    names = zipfile.ZipFile(archive).namelist()
    folder = names[0].split("/")[0]
    assert {f"{folder}/launch.sh", f"{folder}/slurm.sbatch", f"{folder}/config.yaml", f"{folder}/accelerate.yaml",
            f"{folder}/data/arithmetic.csv"} <= set(names)
    accelerate = zipfile.ZipFile(archive).read(f"{folder}/accelerate.yaml").decode()
    assert "zero_stage: 3" in accelerate and "num_processes: 8" in accelerate

    draft["grpo"]["group_size"] = 1
    archive, note = model_tab.export_for_cluster(studio, draft, 4, 1)
    assert archive == gr.skip() and note.startswith(ERROR) and "group_size" in note  # explained, nothing written
    draft["grpo"]["group_size"] = 4
    archive, note = model_tab.export_for_cluster(studio, draft, None, 1)
    assert archive == gr.skip() and "GPUs and nodes must be whole numbers" in note


def test_the_run_name_follows_the_data_file_until_one_is_typed():
    assert model_tab.follow_the_data("arithmetic", "arithmetic", "/data/homework.csv") == ("homework", "homework")
    assert model_tab.follow_the_data("", "", "/data/homework.csv") == ("homework", "homework")
    assert model_tab.follow_the_data("my run", "arithmetic", "/data/homework.csv") == ("my run", "arithmetic")
    assert model_tab.follow_the_data("arithmetic", "arithmetic", None) == ("arithmetic", "arithmetic")


def test_a_loaded_draft_fills_the_fields_and_lists_the_runs_to_continue_anew(studio):
    draft = studio.recipes.default()
    draft["training"]["max_steps"], draft["lora"]["target_modules"] = None, ["q_proj", "v_proj"]
    *values, runs = model_tab.fill_fields(studio, ["training.max_steps", "lora.target_modules", "name"], draft)
    assert values == ["", "q_proj, v_proj", draft["name"]]  # as each field shows its setting
    assert runs.choices == [] and runs.value is None


def test_an_edit_previews_the_settings_anew_and_clears_starts_message_and_the_measured_step(studio, tiny_draft):
    edited = model_tab.preview_after_edit(studio, tiny_draft, {})
    assert edited[0] == message("The settings are valid.", "ok") and edited[-2:] == ("", model_tab.MEASURE_HELP)
    assert len(edited) == len(model_tab.preview_outputs(studio, tiny_draft)) + 2
    tiny_draft["training"]["learning_rate"] = -1
    check = model_tab.preview_after_edit(studio, tiny_draft, {"training.learning_rate": "Learning rate"})[0]
    assert check.startswith(ERROR) and "Learning rate" in check
