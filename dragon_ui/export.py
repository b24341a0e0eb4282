"""Take a run's trained weights out of Dragon GRPO Studio: the LoRA adapter as a zip, or a merged full model.

A stopped run has no final ``adapter/`` yet, but its latest checkpoint holds the same kind of adapter, so both
exports (and the Compare tab) fall back to it: whatever training has produced so far can be used elsewhere.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from .errors import ConfigError
from .runstore import RunDir

log = logging.getLogger(__name__)

# What a peft adapter folder needs to be loaded elsewhere; checkpoints also hold optimiser and RNG state, which
# are only useful for resuming and would make the download many times larger.
_TOKENIZER_FILES = ("special_tokens_map.json", "added_tokens.json", "merges.txt", "chat_template.jinja",
                    "chat_template.json")
_TRAINING_STATE = ("optimizer.pt", "scheduler.pt", "scaler.pt", "rng_state*.pth", "trainer_state.json",
                   "training_args.bin")
MERGE_MARKER = "dragon_merge.json"


@dataclass
class TrainedWeights:
    """The newest trained weights of a run: its final adapter/model, or else its latest checkpoint."""

    path: Path
    label: str  # "the final adapter", "the final model" or "checkpoint-12": how the UI names where "after" comes from
    is_adapter: bool  # LoRA adapter (apply to the starting model) or a full model folder
    is_final: bool


def trained_weights(run: RunDir) -> TrainedWeights:
    """Where the run's trained weights are; ConfigError with a sentence when it has saved none yet."""
    config = run.read_config()
    lora = config.lora.enabled
    final = run.adapter_dir if lora else run.full_model_dir
    marker = "adapter_config.json" if lora else "config.json"
    if (final / marker).is_file():
        return TrainedWeights(final, "the final adapter" if lora else "the final model", lora, True)
    checkpoint = run.latest_checkpoint()
    if checkpoint is not None and (checkpoint / marker).is_file():
        return TrainedWeights(checkpoint, checkpoint.name, lora, False)
    state = run.read_status().get("state", "unknown")
    raise ConfigError(f"The run {run.id} has no trained weights yet (it is {state}): it saves them every "
                      f"{config.training.save_steps} steps and when it finishes or is stopped.")


def _is_export_file(name: str) -> bool:
    return name.startswith(("adapter_", "tokenizer", "vocab.")) or name.endswith(".model") or name in _TOKENIZER_FILES


def _readme(run: RunDir, weights: TrainedWeights) -> str:
    config = run.read_config()
    base = config.model.id
    chained = Path(base).is_dir() and (Path(base) / "status.json").is_file()
    load_from = "base-model" if chained else base
    lines = [
        f"LoRA adapter trained with GRPO by Dragon GRPO Studio: run {run.id} ({weights.label}).",
        "",
        f"Starting model: {base}",
    ]
    if chained:
        lines += ["That is an earlier run: its own starting model with its adapter merged in. Merge it first with",
                  f"  python -m dragon_ui merge {base} --to base-model",
                  "and use base-model below as the starting model."]
    lines += [
        "",
        "Load it with peft (pip install transformers peft):",
        "",
        "  from peft import PeftModel",
        "  from transformers import AutoModelForCausalLM, AutoTokenizer",
        "",
        f"  base = AutoModelForCausalLM.from_pretrained({load_from!r})",
        "  model = PeftModel.from_pretrained(base, \"adapter\")  # the adapter/ folder of this zip",
        "  tokenizer = AutoTokenizer.from_pretrained(\"adapter\")",
        "  model = model.merge_and_unload()  # optional: a plain transformers model, as fast as the original",
        "",
        "Reply with the chat template, as in training:",
        "",
        "  text = tokenizer.apply_chat_template([{\"role\": \"user\", \"content\": \"What is 12 + 30?\"}],",
        "                                       add_generation_prompt=True, tokenize=False)",
        "  inputs = tokenizer(text, return_tensors=\"pt\", add_special_tokens=False)",
        "  print(tokenizer.decode(model.generate(**inputs, max_new_tokens=64)[0, inputs.input_ids.shape[1]:]))",
        "",
    ]
    return "\n".join(lines)


def zip_adapter(run: RunDir) -> Path:
    """A zip in the run folder with ``adapter/`` (adapter weights, config and tokenizer) and a README.txt.

    Built fresh on every call, so a stopped run that trained further since the last download gets its newest checkpoint.
    """
    weights = trained_weights(run)
    if not weights.is_adapter:
        raise ConfigError(f"The run {run.id} trained every weight (LoRA was off), so it has no adapter to download; "
                          f"the whole trained model is the folder {weights.path}.")
    files = sorted(p for p in weights.path.iterdir() if p.is_file() and _is_export_file(p.name))
    suffix = "" if weights.is_final else f"-{weights.label}"
    target = run.path / f"{run.id}{suffix}-adapter.zip"
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=run.path)
    os.close(fd)
    try:
        with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED) as archive:
            for path in files:
                archive.write(path, f"adapter/{path.name}")
            archive.writestr("README.txt", _readme(run, weights))
        os.replace(tmp, target)  # a download never sees half a zip
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target


def _check_merge_target(target: Path) -> None:
    """Refuse to overwrite a folder that we did not create: merging replaces the target folder entirely."""
    if target.exists() and (not target.is_dir() or (any(target.iterdir()) and not (target / MERGE_MARKER).is_file())):
        raise ConfigError(f"{target} already exists and is not a model merged here; choose a new or empty folder.")


def merge_model(run: RunDir, target_dir: str | Path | None = None) -> Path:
    """The starting model with the trained adapter folded in (peft merge_and_unload), saved as a full model folder.

    Merging happens on the CPU in float32, so the merged model answers exactly like the adapter applied at runtime.
    Default target: ``<run>/merged``. A full fine-tuning run already has a full model: it is returned as is, or
    copied when another target is given.
    """
    config = run.read_config()
    if config.hardware.load_in_4bit:
        raise ConfigError(f"The run {run.id} trained on 4-bit weights; merging its adapter into them would round the "
                          "result. Download the adapter instead and apply it with peft to the same 4-bit model.")
    weights = trained_weights(run)
    target = Path(target_dir).expanduser().resolve() if target_dir else run.path / "merged"
    if not weights.is_adapter:
        if target_dir is None or target == weights.path:
            return weights.path
        _check_merge_target(target)
        _replace_folder(target, lambda staging: shutil.copytree(weights.path, staging, dirs_exist_ok=True,
                                                                ignore=shutil.ignore_patterns(*_TRAINING_STATE)),
                        run, weights)
        return target
    _check_merge_target(target)

    from peft import PeftModel

    from .config import HardwareSettings
    from .hardware import resolve_hardware
    from .models import load_model, load_tokenizer, resolve_model

    source = resolve_model(config.model)
    tokenizer = load_tokenizer(source)
    base = load_model(source, resolve_hardware(HardwareSettings(device="cpu", dtype="float32")))
    merged = PeftModel.from_pretrained(base, str(weights.path)).merge_and_unload()

    def save(staging: Path) -> None:
        merged.save_pretrained(staging)
        tokenizer.save_pretrained(staging)

    _replace_folder(target, save, run, weights)
    log.info("Merged %s of run %s into %s", weights.label, run.id, target)
    return target


def _replace_folder(target: Path, fill, run: RunDir, weights: TrainedWeights) -> None:
    """Fill a staging folder next to ``target`` and swap it in, so a reader sees a whole model or none."""
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        fill(staging)
        (staging / MERGE_MARKER).write_text(json.dumps({"run": run.id, "weights": weights.label,
                                                        "starting_model": run.read_config().model.id}), encoding="utf-8")
        shutil.rmtree(target, ignore_errors=True)
        os.replace(staging, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def merge_message(run: RunDir, folder: Path) -> str:
    """The sentence shown after merge_model (UI and CLI): what the folder is and how to load it."""
    if not run.read_config().lora.enabled and folder == run.full_model_dir:
        return (f"This run trained every weight, so {folder} already is a full model: nothing to merge. "
                "Load it with AutoModelForCausalLM.from_pretrained on that folder.")
    return (f"Saved the trained model ({trained_weights(run).label} of run {run.id}) as a full model in {folder}; "
            "load it with AutoModelForCausalLM.from_pretrained on that folder, no peft needed.")
