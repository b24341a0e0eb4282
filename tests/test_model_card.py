"""The model card written beside trained weights: Hub front matter the Hub reads, and a body that says what the model
was trained for, on what, how well it does before and after, and how to load it, all from the run directory."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from huggingface_hub import ModelCard
from PIL import Image

from dragon_ui.config import DEFAULT_MODEL_ID
from dragon_ui.engine import weights
from dragon_ui.engine.model_card import CARD_FILE, CURVE_FILE, chain_of, write_model_card
from dragon_ui.rewards import RewardSpec, reward_rule
from dragon_ui.runstore import RunDir
from dragon_ui.public import LAPTOP


def _set(run: RunDir, section: str, **values) -> None:
    config = json.loads(run.config_path.read_text())
    config[section].update(values)
    run.config_path.write_text(json.dumps(config))


def test_a_finished_run_has_a_card_beside_its_adapter(finished_run):
    card = ModelCard.load(finished_run.adapter_dir / CARD_FILE)
    assert card.data.library_name == "peft" and card.data.pipeline_tag == "text-generation"
    assert {"grpo", "trl", "dragon-grpo-studio", "lora"} <= set(card.data.tags)
    assert card.data.base_model is None  # a local model folder has no Hub id to link
    text = card.text
    config = finished_run.read_config()
    for spec in config.rewards:
        assert f"| {spec.name} | {spec.weight:g} | {reward_rule(spec)} |" in text
    status = finished_run.read_status()
    assert status["data_summary"] in text and f"the column `{config.data.prompt}`" in text
    assert "- Source: `arithmetic.csv`" in text and str(finished_run.path.parent) not in text  # no machine paths
    evaluation = finished_run.read_eval()
    before, after = evaluation["before"]["reward_mean"], evaluation["after"]["reward_mean"]
    assert f"| **total (weighted)** | {before:.3f} | {after:.3f} | {after - before:+.3f} |" in text
    checks = finished_run.read_heldout()
    assert f"Held-out reward during training, on 6 of the held-out prompts (greedy): step 0: {before:.3f}" in text
    assert f"step {checks[-1]['step']}: {after:.3f}." in text  # the last check is on the final weights, as "after"
    assert f"| learning rate | {config.training.learning_rate:g} |" in text
    assert "PeftModel.from_pretrained(base, 'path/to/this/folder')" in text
    assert "- Hardware: CPU" in text and "from start to finish" in text
    with Image.open(finished_run.adapter_dir / CURVE_FILE) as image:
        assert image.format == "PNG" and image.size[0] > 400
    assert f"]({CURVE_FILE})" in text


def test_the_front_matter_names_the_hub_model_and_the_hub_dataset(finished_run, tmp_path):
    _set(finished_run, "model", id=DEFAULT_MODEL_ID)
    _set(finished_run, "data", source="openai/gsm8k")
    card = ModelCard.load(write_model_card(finished_run, tmp_path, repo_id="someone/arith"))
    assert card.data.base_model == DEFAULT_MODEL_ID and card.data.datasets == ["openai/gsm8k"]
    assert "[openai/gsm8k](https://huggingface.co/datasets/openai/gsm8k)" in card.text
    assert f"[{DEFAULT_MODEL_ID}](https://huggingface.co/{DEFAULT_MODEL_ID})" in card.text
    assert f"AutoModelForCausalLM.from_pretrained({DEFAULT_MODEL_ID!r})" in card.text
    assert "PeftModel.from_pretrained(base, 'someone/arith')" in card.text


def test_a_merged_model_and_the_zip_carry_the_card(finished_run, tmp_path):
    merged = weights.merge_model(finished_run, tmp_path / "merged")
    card = ModelCard.load(merged / CARD_FILE)
    assert card.data.library_name == "transformers" and "lora" not in card.data.tags
    assert "PeftModel" not in card.text and (merged / CURVE_FILE).is_file()
    with zipfile.ZipFile(weights.zip_adapter(finished_run)) as archive:
        assert {f"adapter/{CARD_FILE}", f"adapter/{CURVE_FILE}"} <= set(archive.namelist())
        assert "PeftModel.from_pretrained" in archive.read(f"adapter/{CARD_FILE}").decode()


def test_a_run_continued_from_earlier_runs_names_the_whole_chain(finished_run, runs_dir, tmp_path):
    import shutil

    first_model = finished_run.read_config().model.id
    second = RunDir(runs_dir / "second")
    shutil.copytree(finished_run.path, second.path)
    _set(second, "model", id=str(finished_run.path))
    third = RunDir(runs_dir / "third")
    shutil.copytree(finished_run.path, third.path)
    _set(third, "model", id=str(second.path))

    root, earlier = chain_of(third.read_config())
    assert root == first_model and [stage.run_id for stage in earlier] == [finished_run.id, "second"]
    text = ModelCard.load(write_model_card(third, tmp_path)).text
    assert f"1. the local model `{Path(first_model).name}`\n2. with the adapter of run `{finished_run.id}` merged in\n3. with the adapter of run " \
           "`second` merged in" in text
    assert "dragon merge runs/second --to merged-earlier-runs" in text
    assert "AutoModelForCausalLM.from_pretrained('merged-earlier-runs')" in text


@pytest.mark.parametrize("spec, rule", [
    ({"kind": "numeric"}, "the number in the reply equals the reference"),
    ({"kind": "exact", "extract": "answer_tag"}, "the answer (answer tag) equals the reference, ignoring case, extra "
                                                 "spaces and trailing . , ; : ! ?"),
    ({"kind": "contains", "case_sensitive": True}, "the reply contains the reference, ignoring extra spaces and "
                                                   "trailing . , ; : ! ?"),
    ({"kind": "regex", "pattern": "^\\d+$"}, "the reply matches `^\\d+$`"),
    ({"kind": "json", "keys": ["name", "age"]}, "the reply is JSON with the keys name, age"),
    ({"kind": "length", "max_chars": 12}, "the reply has 0 to 12 characters"),
    ({"kind": "keyword", "words": ["cat", "dog"], "mode": "all"}, "the reply contains all of: cat, dog"),
    ({"kind": "format", "preset": "think_answer"}, "the reply is laid out in the tags think, answer"),
    ({"kind": "command", "argv": ["pytest", "-q"]}, "the command `pytest -q` passes on the reply"),
])
def test_each_reward_says_what_it_pays_for(spec, rule):
    assert reward_rule(RewardSpec.from_dict(spec, policy=LAPTOP)) == rule


def test_the_zipped_adapter_loads_in_a_fresh_process_on_the_model_its_config_names(finished_run, tiny_model_dir,
                                                                                    tmp_path):
    """The Hub as another machine sees it: a Hub cache holding the starting model under its id, no network. The
    fresh process knows only the unzipped folder; it loads the base its adapter_config names and replies exactly as
    the adapter does here."""
    import shutil

    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from conftest import strengthen_adapter

    strengthen_adapter(finished_run)  # else the adapter of two tiny steps answers like its base
    revision = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "hub" / "models--dragon-test--tiny"
    shutil.copytree(tiny_model_dir, repo / "snapshots" / revision)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(revision)
    _set(finished_run, "model", id="dragon-test/tiny", revision="main")
    with zipfile.ZipFile(weights.zip_adapter(finished_run)) as archive:
        archive.extractall(tmp_path / "elsewhere")

    script = (
        "import sys, torch\n"
        "from peft import PeftConfig, PeftModel\n"
        "from transformers import AutoModelForCausalLM\n"
        "config = PeftConfig.from_pretrained(sys.argv[1])\n"
        "base = AutoModelForCausalLM.from_pretrained(config.base_model_name_or_path, revision=config.revision, "
        "dtype=torch.float32)\n"
        "model = PeftModel.from_pretrained(base, sys.argv[1]).eval()\n"
        "print(model(torch.tensor([[1, 2, 3, 4]])).logits[0, -1].tolist())\n"
    )
    env = {**os.environ, "HF_HUB_CACHE": str(tmp_path / "hub"), "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path / "elsewhere" / "adapter")], env=env,
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    there = torch.tensor(json.loads(done.stdout.strip().splitlines()[-1]))
    tokens = torch.tensor([[1, 2, 3, 4]])
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        plain = base(tokens).logits[0, -1]
        expected = PeftModel.from_pretrained(base, str(finished_run.adapter_dir)).eval()(tokens).logits[0, -1]
    assert torch.allclose(there, expected, atol=1e-5) and not torch.allclose(there, plain, atol=1e-3)


def test_every_checkpoint_carries_this_runs_card_and_trl_writes_none_of_its_own(finished_run):
    """Checkpoints get uploaded too: each has this run's card (not PEFT's blank template naming a machine path), and
    the checkpoints folder has no TRL card ("a fine-tuned version of None")."""
    assert not (finished_run.checkpoints_dir / CARD_FILE).exists()
    for checkpoint in finished_run.checkpoints():
        card = ModelCard.load(checkpoint / CARD_FILE)
        assert "trained with GRPO" in card.text and "More Information Needed" not in card.text
        assert str(finished_run.path.parent) not in card.content


def test_the_card_says_steps_and_rows_once_and_names_the_offline_copy(finished_run, tmp_path):
    from dragon_ui.engine.models import OFFLINE_NOTE

    text = ModelCard.load(write_model_card(finished_run, tmp_path)).text
    status = finished_run.read_status()
    assert f"| training length | {finished_run.read_config().training.max_steps} steps |" in text
    assert f"- {status['data_summary']}" in text and "Rows: " not in text
    assert OFFLINE_NOTE not in text
    finished_run.update_status(model_label=f"{DEFAULT_MODEL_ID} ({OFFLINE_NOTE})")
    text = ModelCard.load(write_model_card(finished_run, tmp_path)).text
    assert f"It was trained on the {OFFLINE_NOTE}" in text


def test_a_saved_adapter_names_its_base_by_hub_id(finished_run, tmp_path):
    """The run folder's own adapter is written portable when it is saved (the zip and the Hub upload did it before,
    but people copy the run folder itself); make_portable is what training applies to each checkpoint and to it."""
    from dragon_ui.config import ModelConfig

    adapter = tmp_path / "adapter"
    shutil.copytree(finished_run.adapter_dir, adapter)
    weights.make_portable(adapter, ModelConfig(id=DEFAULT_MODEL_ID))
    config = json.loads((adapter / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == DEFAULT_MODEL_ID and config["revision"] is None
    local = json.loads((finished_run.adapter_dir / "adapter_config.json").read_text())
    assert local["base_model_name_or_path"] == finished_run.read_config().model.id  # a local model stays local
