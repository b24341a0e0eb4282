"""The Model & Hardware tab, through the handlers its fields and buttons are wired to (found by api_name)."""

from __future__ import annotations

import copy

import gradio as gr
import pytest
from conftest import handler
import yaml

from dragon_ui import training
from dragon_ui.config import RunConfig
from dragon_ui.ui import model_tab
from dragon_ui.ui.common import TAB_TRAIN

pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def tiny_draft(studio, tiny_model_dir) -> dict:
    """The default draft on the tiny model, 2 quick steps on one CPU thread."""
    draft = studio.default_draft()
    draft["model"]["id"] = str(tiny_model_dir)
    draft["grpo"].update(group_size=2, max_new_tokens=6)
    draft["training"].update(batch_size=2, max_steps=2, save_steps=1, learning_rate=0.01)
    draft["lora"].update(r=4, alpha=8)
    draft["hardware"].update(device="cpu", dtype="float32", cpu_threads=1)
    draft["n_samples"] = 2
    return draft


def test_every_section_handler_updates_only_its_section(app, studio):
    draft = studio.default_draft()
    draft["training"]["grad_accum"] = 3  # not on this tab: must survive
    original = copy.deepcopy(draft)

    new = handler(app, "model_set_lora")(draft, True, 8, 16, 0.1, "q_proj, v_proj")
    assert new["lora"] == {"enabled": True, "r": 8, "alpha": 16, "dropout": 0.1, "target_modules": ["q_proj", "v_proj"]}
    new = handler(app, "model_set_training")(new, 2e-5, 2.0, 0, 8, 10, True)
    assert new["training"] == {**original["training"], "learning_rate": 2e-5, "epochs": 2.0, "max_steps": None,
                               "batch_size": 8, "save_steps": 10, "gradient_checkpointing": True, "grad_accum": 3}
    new = handler(app, "model_set_grpo")(new, 8, 0.0, 0.7, 64, "grpo", "none")
    assert new["grpo"] == {"group_size": 8, "beta": 0.0, "temperature": 0.7, "max_new_tokens": 64, "loss_type": "grpo",
                           "scale_rewards": "none"}
    new = handler(app, "model_set_hardware")(new, "cpu", "float32", False, 0)
    assert new["hardware"] == {"device": "cpu", "dtype": "float32", "load_in_4bit": False, "cpu_threads": None}
    new = handler(app, "model_set_model")(new, "  Qwen/Qwen2.5-0.5B-Instruct ")
    assert new["model"]["id"] == "Qwen/Qwen2.5-0.5B-Instruct"
    new = handler(app, "model_set_name")(new, " my run ")
    assert new["name"] == "my run"

    assert draft == original  # handlers never change their input
    for section in ("data", "rewards", "runs_dir"):
        assert new[section] == original[section]
    RunConfig.from_dict(new)  # still a complete, valid config


def test_the_form_shows_the_draft_and_round_trips(studio):
    draft = studio.default_draft()
    draft["lora"]["target_modules"] = ["q_proj", "v_proj"]
    values = model_tab.field_values(draft)
    assert values[0] == draft["model"]["id"]
    assert "q_proj, v_proj" in values and values[-1] == draft["name"]
    assert values[model_tab.field_values(draft).index("q_proj, v_proj") + 1] == draft["grpo"]["group_size"]
    rebuilt = copy.deepcopy(draft)
    position = 0
    for section, settings in model_tab.SECTIONS.items():
        rebuilt = model_tab.update_section(rebuilt, section, *values[position:position + len(settings)])
        position += len(settings)
    assert rebuilt == draft


def test_a_valid_draft_previews_its_yaml_cli_and_estimate(app, studio):
    draft = studio.default_draft()
    check, hardware, estimate, yaml_text, cli, download = handler(app, "model_preview")(draft)
    assert check == "✅ The settings are valid."
    assert hardware.startswith("**This run will use:** cpu") and "- device cpu:" in hardware
    assert estimate.startswith("**Rough estimate** for HuggingFaceTB/SmolLM2-135M-Instruct (135M parameters")
    assert "Memory ≈" in estimate and "Time per step ≈" in estimate
    assert RunConfig.from_dict(yaml.safe_load(yaml_text), base_dir=draft["base_dir"]) == studio.validate(draft)
    assert "python -m dragon_ui train arithmetic.yaml" in cli
    assert download.value["orig_name"] == "arithmetic.yaml" and download.interactive
    with open(download.value["path"], encoding="utf-8") as fh:
        assert fh.read() == yaml_text


@pytest.mark.parametrize(("section", "values", "sentence"), [
    ("grpo", (1, 0.04, 1.0, 16, "dapo", "group"), "grpo.group_size must be between 2 and 64"),
    ("grpo", (4, 0.04, 0.0, 16, "dapo", "group"), "grpo.temperature must be above 0"),
    ("training", (0.0, 1.0, 0, 4, 20, False), "training.learning_rate must be above 0"),
    ("lora", (True, 16, 32, 0.05, ""), "lora.target_modules is empty"),
    ("model", ("",), "model.id is empty"),
])
def test_an_invalid_value_shows_the_sentence(app, studio, section, values, sentence):
    draft = handler(app, f"model_set_{section}")(studio.default_draft(), *values)
    check, _, estimate, yaml_text, _, download = handler(app, "model_preview")(draft)
    assert check.startswith("❌ ") and sentence in check
    assert yaml_text.startswith("# The settings are not valid yet:")
    assert download.value is None and not download.interactive


def test_an_impossible_hardware_choice_is_a_sentence(app, studio):
    if studio.hardware().cuda:
        pytest.skip("this machine has a CUDA GPU")
    draft = handler(app, "model_set_hardware")(studio.default_draft(), "cuda", "auto", False, 0)
    check, hardware, estimate, yaml_text, _, download = handler(app, "model_preview")(draft)
    assert check == "✅ The settings are valid."
    assert hardware == ("❌ hardware.device is cuda, but no CUDA GPU is visible to PyTorch on this machine; "
                        "choose auto or cpu.")
    assert "once the hardware choice works" in estimate
    assert "device: cuda" in yaml_text and download.interactive  # a config for a GPU machine can still be saved


def test_the_presets_table():
    rows = model_tab.preset_rows()
    assert len(rows) == 8 and rows[0][:2] == ["HuggingFaceTB/SmolLM2-135M-Instruct", "135M"]
    memories = [float(row[2].strip("~ GB")) for row in rows]
    assert memories[0] < 4.0 and all(m > memories[0] for m in memories[1:])
    assert "offline" in rows[0][3] and "Gated" in rows[4][3]


def test_hardware_panel_lists_what_was_found(studio):
    text = model_tab.hardware_markdown(studio.hardware())
    assert text.startswith(f"**Detected:** {studio.hardware().summary()}.")
    assert "- 4-bit loading: " in text and "- Memory: " in text and " GB free of " in text


def test_start_trains_and_switches_to_the_train_tab_then_busy_then_continue(app, studio, tiny_draft):
    start = handler(app, "model_start")
    run_id, timer, tabs, status = start(tiny_draft)
    handle = training.active_run()
    assert handle is not None and handle.run.id == run_id
    assert isinstance(timer, gr.Timer) and timer.active
    assert isinstance(tabs, gr.Tabs) and tabs.selected == TAB_TRAIN
    assert status == f"✅ Started {run_id}; follow it on the Train tab."

    busy = start(tiny_draft)
    assert busy[:3] == (gr.skip(),) * 3
    assert busy[3] == (f"❌ A training is already running ({run_id}); stop it on the Train tab or wait for it to "
                       "finish first.")

    assert handle.wait(120) == "succeeded"
    (label, path), = model_tab.finished_runs(studio)
    assert label.startswith(run_id) and path == str(studio.run(run_id).path)
    draft, model_id = handler(app, "model_continue")(tiny_draft, path)
    assert draft["model"]["id"] == model_id == path
    check, _, estimate, *_ = handler(app, "model_preview")(draft)
    assert check == "✅ The settings are valid."
    assert f"the starting model of run {run_id}" in estimate


def test_start_with_a_bad_draft_explains_and_stays(app, tiny_draft):
    tiny_draft["training"]["batch_size"] = 500
    run_id, timer, tabs, status = handler(app, "model_start")(tiny_draft)
    assert (run_id, timer, tabs) == (gr.skip(),) * 3
    assert status.startswith("❌ Only ") and "fewer than training.batch_size (500)" in status
    assert training.active_run() is None


def test_export_for_a_cluster_gives_a_zip_of_the_launch_folder(app, studio):
    import zipfile

    export = handler(app, "model_export")
    draft = studio.default_draft()
    draft["distributed"]["strategy"] = "zero3"
    archive, note = export(draft, 4, 2)
    assert "launch.sh" in note
    names = zipfile.ZipFile(archive).namelist()
    folder = names[0].split("/")[0]
    assert {f"{folder}/launch.sh", f"{folder}/slurm.sbatch", f"{folder}/config.yaml", f"{folder}/accelerate.yaml",
            f"{folder}/data/arithmetic.csv"} <= set(names)
    accelerate = zipfile.ZipFile(archive).read(f"{folder}/accelerate.yaml").decode()
    assert "zero_stage: 3" in accelerate and "num_processes: 8" in accelerate

    draft["grpo"]["group_size"] = 1
    archive, note = export(draft, 4, 1)
    assert "grpo.group_size" in note  # an invalid draft is explained, nothing is written
