"""Exports of a trained run: the adapter zip loads with peft, the merged model answers like the adapter, refusals."""

from __future__ import annotations

import json
import shutil
import zipfile

import pytest
import torch
from conftest import stop_after_last_checkpoint, strengthen_adapter

from dragon_ui import export
from dragon_ui.cli import main
from dragon_ui.errors import ConfigError
from dragon_ui.runstore import RunDir

pytestmark = pytest.mark.timeout(300)

TRAINING_STATE = {"optimizer.pt", "scheduler.pt", "rng_state.pth", "trainer_state.json", "training_args.bin"}


def greedy_ids(model, tokenizer, text: str = "What is 3 + 4? Reply with just the number.") -> list[int]:
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False)
    inputs = tokenizer(prompt, return_tensors="pt", add_special_tokens=False)
    with torch.inference_mode():
        out = model.generate(**inputs, max_new_tokens=12, do_sample=False, pad_token_id=tokenizer.pad_token_id)
    return out[0, inputs["input_ids"].shape[1]:].tolist()


def adapter_applied(tiny_model_dir, adapter_dir):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    return PeftModel.from_pretrained(base, str(adapter_dir)).eval()


def test_adapter_zip_loads_with_peft(finished_run, tiny_model_dir, tmp_path):
    from safetensors.torch import load_file
    from transformers import AutoTokenizer

    strengthen_adapter(finished_run)
    path = export.zip_adapter(finished_run)
    assert path.parent == finished_run.path and path.suffix == ".zip"
    with zipfile.ZipFile(path) as archive:
        names = set(archive.namelist())
        archive.extractall(tmp_path / "unzipped")
    assert {"README.txt", "adapter/adapter_config.json", "adapter/adapter_model.safetensors",
            "adapter/tokenizer.json", "adapter/tokenizer_config.json"} <= names
    assert not {name.split("/")[-1] for name in names} & TRAINING_STATE
    readme = (tmp_path / "unzipped" / "README.txt").read_text()
    assert "PeftModel.from_pretrained" in readme and str(tiny_model_dir) in readme

    adapter = tmp_path / "unzipped" / "adapter"
    model = adapter_applied(tiny_model_dir, adapter)
    assert any("lora_" in name for name, _ in model.named_parameters())
    weights_file = "adapter_model.safetensors"
    assert load_file(adapter / weights_file).keys() == load_file(finished_run.adapter_dir / weights_file).keys()
    tokenizer = AutoTokenizer.from_pretrained(adapter)
    assert greedy_ids(model, tokenizer) == greedy_ids(adapter_applied(tiny_model_dir, finished_run.adapter_dir), tokenizer)
    with model.disable_adapter():
        assert greedy_ids(model, tokenizer) != greedy_ids(adapter_applied(tiny_model_dir, adapter), tokenizer)


def test_a_stopped_run_zips_its_latest_checkpoint(finished_run):
    stop_after_last_checkpoint(finished_run)
    path = export.zip_adapter(finished_run)
    assert "checkpoint-2" in path.name
    with zipfile.ZipFile(path) as archive:
        names = {name.split("/")[-1] for name in archive.namelist()}
        assert "checkpoint-2" in archive.read("README.txt").decode()
    assert {"adapter_config.json", "adapter_model.safetensors"} <= names
    assert not names & TRAINING_STATE


def test_merged_model_answers_like_the_adapter(finished_run, tiny_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    strengthen_adapter(finished_run)
    folder = export.merge_model(finished_run)
    assert folder == finished_run.path / "merged"
    merged = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    assert not any("lora_" in name for name, _ in merged.named_parameters())
    tokenizer = AutoTokenizer.from_pretrained(folder)
    with_adapter = adapter_applied(tiny_model_dir, finished_run.adapter_dir)
    assert greedy_ids(merged, tokenizer) == greedy_ids(with_adapter, tokenizer)
    inputs = tokenizer("What is 3 + 4?", return_tensors="pt")
    with torch.inference_mode():
        merged_logits, adapter_logits = merged(**inputs).logits, with_adapter(**inputs).logits
        with with_adapter.disable_adapter():
            base_logits = with_adapter(**inputs).logits
    assert torch.allclose(merged_logits, adapter_logits, atol=1e-4)
    assert not torch.allclose(merged_logits, base_logits, atol=1e-2)  # the adapter really was folded in
    assert json.loads((folder / export.MERGE_MARKER).read_text())["run"] == finished_run.id
    sentence = export.merge_message(finished_run, folder)
    assert str(folder) in sentence and "the final adapter" in sentence and "no peft needed" in sentence

    assert export.merge_model(finished_run) == folder  # merging again replaces its own earlier merge


def test_merge_refuses_to_overwrite_a_foreign_folder(finished_run, tmp_path):
    foreign = tmp_path / "my-stuff"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep me")
    with pytest.raises(ConfigError, match="not a model merged here"):
        export.merge_model(finished_run, target_dir=foreign)
    assert (foreign / "notes.txt").read_text() == "keep me"


def test_runs_without_usable_weights_are_refused_with_sentences(finished_run):
    shutil.rmtree(finished_run.adapter_dir)
    shutil.rmtree(finished_run.checkpoints_dir)
    for action in (export.zip_adapter, export.merge_model):
        with pytest.raises(ConfigError, match="has no trained weights yet"):
            action(finished_run)


def test_a_4bit_run_is_not_merged(finished_run):
    config = json.loads(finished_run.config_path.read_text())
    config["hardware"]["load_in_4bit"] = True
    finished_run.config_path.write_text(json.dumps(config))
    with pytest.raises(ConfigError, match="4-bit"):
        export.merge_model(finished_run)


def test_full_fine_tuning_already_is_a_full_model(tiny_config_dict, tmp_path):
    from dragon_ui import training
    from dragon_ui.config import RunConfig
    from transformers import AutoModelForCausalLM

    tiny_config_dict["lora"] = {"enabled": False}
    handle = training.start(RunConfig.from_dict(tiny_config_dict))
    handle.wait(timeout=240)
    run = handle.run
    assert run.read_status()["state"] == "succeeded"
    assert export.merge_model(run) == run.full_model_dir
    assert "already is a full model" in export.merge_message(run, run.full_model_dir)
    with pytest.raises(ConfigError, match="no adapter"):
        export.zip_adapter(run)
    copy = export.merge_model(run, target_dir=tmp_path / "copy")
    assert not (copy / "training_args.bin").exists()
    AutoModelForCausalLM.from_pretrained(copy)


def test_merge_command(finished_run, tmp_path, capsys):
    from transformers import AutoModelForCausalLM

    target = tmp_path / "merged-from-cli"
    assert main(["merge", str(finished_run.path), "--to", str(target)]) == 0
    out = capsys.readouterr().out
    assert str(target) in out and "AutoModelForCausalLM" in out
    AutoModelForCausalLM.from_pretrained(target)

    assert main(["merge", str(tmp_path / "no-such-run")]) == 2
    assert "not a run folder" in capsys.readouterr().err


def test_trained_weights_names_where_they_come_from(finished_run):
    assert export.trained_weights(finished_run).label == "the final adapter"
    stop_after_last_checkpoint(finished_run)
    weights = export.trained_weights(RunDir(finished_run.path))
    assert (weights.label, weights.is_final, weights.path.name) == ("checkpoint-2", False, "checkpoint-2")
