"""Exports of a trained run: the adapter zip loads with peft, the merged model answers like the adapter, refusals."""

from __future__ import annotations

import ast
import json
import shutil
import zipfile

import pytest
import torch
from conftest import stop_after_last_checkpoint, strengthen_adapter

from dragon_ui.cli import main
from dragon_ui.data import read_jsonl, write_jsonl
from dragon_ui.engine import trained, weights
from dragon_ui.errors import ConfigError
from dragon_ui.runstore import RunDir
from dragon_ui.public import LAPTOP

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
    path = weights.zip_adapter(finished_run)
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


JSON_PROMPT = [{"role": "system", "content": "Reply with JSON only."},
               {"role": "user", "content": 'Give {"name": "Ana", "age": 30} back as JSON.'}]


def readme_of(run: RunDir) -> str:
    with zipfile.ZipFile(weights.zip_adapter(run)) as archive:
        return archive.read("README.txt").decode("utf-8")


def readme_code(readme: str) -> str:
    """The README's Python: its indented lines (a run started from a model folder has no merge command there)."""
    return "\n".join(line[2:] for line in readme.splitlines() if line.startswith("  "))


def readme_messages(readme: str) -> list[dict]:
    """The chat messages of the README's example, read as the Python literal they are written as."""
    code = readme_code(readme)
    start = code.index("messages = [")
    return ast.literal_eval(code[start:code.index("\n]", start) + 2].split("=", 1)[1].strip())


@pytest.mark.parametrize("held_out, training, expected, origin", [
    ([JSON_PROMPT], [], JSON_PROMPT, "a held-out prompt of this run"),
    ([], [JSON_PROMPT], JSON_PROMPT, "a training prompt of this run"),
    (None, None, trained.PLACEHOLDER_PROMPT, "a placeholder"),
], ids=["held-out", "nothing-held-out", "no-data-files"])
def test_the_readme_example_asks_the_runs_own_kind_of_prompt(finished_run, held_out, training, expected, origin):
    """A JSON run's README used to show an arithmetic question."""
    shutil.rmtree(finished_run.data_dir)
    if held_out is not None:
        write_jsonl(finished_run.eval_data_path, [{"prompt": p, "reference": ""} for p in held_out])
        write_jsonl(finished_run.train_data_path, [{"prompt": p, "reference": ""} for p in training])
    readme = readme_of(finished_run)
    assert "12 + 30" not in readme and origin in readme
    assert readme_messages(readme) == expected


def test_the_readme_code_runs(finished_run, tmp_path, monkeypatch, capsys):
    with zipfile.ZipFile(weights.zip_adapter(finished_run)) as archive:
        archive.extractall(tmp_path)
    readme = (tmp_path / "README.txt").read_text(encoding="utf-8")
    assert readme_messages(readme) == read_jsonl(finished_run.eval_data_path)[0]["prompt"]
    monkeypatch.chdir(tmp_path)  # the README loads "adapter", the folder of the zip
    exec(readme_code(readme), {})
    assert capsys.readouterr().out  # it printed the reply


def test_a_stopped_run_zips_its_latest_checkpoint(finished_run):
    stop_after_last_checkpoint(finished_run)
    path = weights.zip_adapter(finished_run)
    assert "checkpoint-2" in path.name
    with zipfile.ZipFile(path) as archive:
        names = {name.split("/")[-1] for name in archive.namelist()}
        assert "checkpoint-2" in archive.read("README.txt").decode()
    assert {"adapter_config.json", "adapter_model.safetensors"} <= names
    assert not names & TRAINING_STATE


def test_merged_model_answers_like_the_adapter(finished_run, tiny_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    strengthen_adapter(finished_run)
    folder = weights.merge_model(finished_run)
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
    assert json.loads((folder / weights.MERGE_MARKER).read_text())["run"] == finished_run.id
    sentence = weights.merge_message(finished_run, folder)
    assert str(folder) in sentence and "the final adapter" in sentence and "no peft needed" in sentence

    assert weights.merge_model(finished_run) == folder  # merging again replaces its own earlier merge


def test_the_merged_model_downloads_as_a_zip_built_once(finished_run, tmp_path):
    """The merged folder used to stay on the server; the zip is reused until the weights change."""
    from transformers import AutoModelForCausalLM

    merged = weights.merged_download(finished_run)
    assert merged.folder == finished_run.path / "merged" and merged.archive.parent == finished_run.path
    assert merged.archive_bytes == merged.archive.stat().st_size > 0
    with zipfile.ZipFile(merged.archive) as archive:
        archive.extractall(tmp_path)
    AutoModelForCausalLM.from_pretrained(tmp_path / f"{finished_run.id}-merged")
    message = weights.merged_download_message(finished_run, merged)
    folder_size = weights.format_size(sum(p.stat().st_size for p in merged.folder.iterdir()))
    for piece in (str(merged.folder), folder_size, merged.archive.name, weights.format_size(merged.archive_bytes)):
        assert piece in message, piece

    written = merged.archive.stat().st_mtime_ns, (merged.folder / "config.json").stat().st_mtime_ns
    again = weights.merged_download(finished_run)
    assert again == merged
    assert (again.archive.stat().st_mtime_ns, (again.folder / "config.json").stat().st_mtime_ns) == written

    strengthen_adapter(finished_run)  # new weights: merged and zipped again
    changed = weights.merged_download(finished_run)
    assert changed.archive.stat().st_mtime_ns > written[0]
    assert (changed.folder / "config.json").stat().st_mtime_ns > written[1]


@pytest.mark.parametrize("n_bytes, shown", [(512, "512 bytes"), (2048, "2.0 KB"), (5 * 2**20, "5.0 MB"),
                                            (int(3.4 * 2**30), "3.4 GB")])
def test_format_size(n_bytes, shown):
    assert weights.format_size(n_bytes) == shown


def test_merge_refuses_to_overwrite_a_foreign_folder(finished_run, tmp_path):
    foreign = tmp_path / "my-stuff"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep me")
    with pytest.raises(ConfigError, match="not a model merged here"):
        weights.merge_model(finished_run, target_dir=foreign)
    assert (foreign / "notes.txt").read_text() == "keep me"


def test_runs_without_usable_weights_are_refused_with_sentences(finished_run):
    shutil.rmtree(finished_run.adapter_dir)
    shutil.rmtree(finished_run.checkpoints_dir)
    for action in (weights.zip_adapter, weights.merge_model):
        with pytest.raises(ConfigError, match="has no trained weights yet"):
            action(finished_run)


def test_a_4bit_run_merges_into_the_full_precision_model_on_the_cpu(finished_run):
    """A QLoRA run trained on a CUDA GPU is merged here, on a CPU without bitsandbytes' 4-bit kernels."""
    config = json.loads(finished_run.config_path.read_text())
    config["hardware"].update(load_in_4bit=True, device="cuda", dtype="float16")
    finished_run.config_path.write_text(json.dumps(config))
    merged = weights.merge_model(finished_run, finished_run.path / "merged-4bit")
    saved = json.loads((merged / "config.json").read_text())
    assert "quantization_config" not in saved


def test_full_fine_tuning_already_is_a_full_model(tiny_config_dict, tmp_path):
    from dragon_ui.config import RunConfig
    from dragon_ui.engine import training
    from transformers import AutoModelForCausalLM

    tiny_config_dict["lora"] = {"enabled": False}
    run = training.train_config(RunConfig.from_dict(tiny_config_dict, policy=LAPTOP), policy=LAPTOP)
    assert run.read_status()["state"] == "succeeded"
    assert weights.merge_model(run) == run.full_model_dir
    assert "already is a full model" in weights.merge_message(run, run.full_model_dir)
    with pytest.raises(ConfigError, match="no adapter"):
        weights.zip_adapter(run)
    copy = weights.merge_model(run, target_dir=tmp_path / "copy")
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
    assert trained.trained_weights(finished_run).label == "the final adapter"
    stop_after_last_checkpoint(finished_run)
    found = trained.trained_weights(RunDir(finished_run.path))
    assert (found.label, found.is_final, found.path.name) == ("checkpoint-2", False, "checkpoint-2")


def test_the_zipped_adapter_names_its_base_by_hub_id_not_by_a_folder_of_this_machine(finished_run, tmp_path):
    """A run from the offline copy of the default model: PEFT wrote the copy's cache folder as the base; the zip says
    the Hub id and revision, which load anywhere. A local model folder has no Hub id and stays as it is."""
    import json
    import subprocess
    import sys

    from dragon_ui.config import DEFAULT_MODEL_ID

    local = json.loads((finished_run.adapter_dir / "adapter_config.json").read_text())["base_model_name_or_path"]
    with zipfile.ZipFile(weights.zip_adapter(finished_run)) as archive:
        assert json.loads(archive.read("adapter/adapter_config.json"))["base_model_name_or_path"] == local

    config = json.loads(finished_run.config_path.read_text())
    config["model"].update(id=DEFAULT_MODEL_ID, revision="main")
    finished_run.config_path.write_text(json.dumps(config))
    with zipfile.ZipFile(weights.zip_adapter(finished_run)) as archive:
        archive.extractall(tmp_path / "unzipped")
    read = subprocess.run([sys.executable, "-c", "import sys; from peft import PeftConfig; c = "
                           "PeftConfig.from_pretrained(sys.argv[1]); print(c.base_model_name_or_path, c.revision)",
                           str(tmp_path / "unzipped" / "adapter")], capture_output=True, text=True, timeout=120)
    assert read.stdout.split() == [DEFAULT_MODEL_ID, "main"], read.stderr
