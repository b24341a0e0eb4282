"""Take a run's trained weights out of Dragon GRPO Studio: the LoRA adapter as a zip, or a merged full model (a
folder on the server, and the same folder as a zip to download).

A stopped run has no final ``adapter/`` yet, but its latest checkpoint holds the same kind of adapter, so both
exports (and the Compare tab) fall back to it: whatever training has produced so far can be used elsewhere.
"""

from __future__ import annotations

import fnmatch
import json
import logging
import os
import shutil
import tempfile
import threading
import zipfile
from dataclasses import dataclass
from pathlib import Path

from ..errors import ConfigError
from ..system.disk import replaced_atomically
from ..runstore import RunDir
from .model_card import write_model_card
from .trained import TrainedWeights, example_prompt, trained_weights

log = logging.getLogger(__name__)

# What a peft adapter folder needs to be loaded elsewhere; checkpoints also hold optimiser and RNG state, which
# are only useful for resuming and would make the download many times larger.
_TOKENIZER_FILES = ("special_tokens_map.json", "added_tokens.json", "merges.txt", "chat_template.jinja",
                    "chat_template.json")
_TRAINING_STATE = ("optimizer.pt", "scheduler.pt", "scaler.pt", "rng_state*.pth", "trainer_state.json",
                   "training_args.bin")
MERGE_MARKER = "dragon_merge.json"


def _is_export_file(name: str) -> bool:
    return name.startswith(("adapter_", "tokenizer", "vocab.")) or name.endswith(".model") or name in _TOKENIZER_FILES


def _readme(run: RunDir, weights: TrainedWeights) -> str:
    from .models import is_run_dir

    config = run.read_config()
    messages, origin = example_prompt(run)
    base = config.model.id
    chained = is_run_dir(Path(base))
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
        f"Reply with the chat template, as in training ({origin}):",
        "",
        "  messages = [",
        *(f"      {json.dumps(message, ensure_ascii=False)}," for message in messages),
        "  ]",
        "  text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)",
        "  inputs = tokenizer(text, return_tensors=\"pt\", add_special_tokens=False)",
        f"  reply = model.generate(**inputs, max_new_tokens={config.grpo.max_new_tokens})",
        "  print(tokenizer.decode(reply[0, inputs.input_ids.shape[1]:], skip_special_tokens=True))",
        "",
    ]
    return "\n".join(lines)


def zip_adapter(run: RunDir) -> Path:
    """A zip in the run folder with ``adapter/`` (adapter weights, config, tokenizer and model card) and a README.txt.

    Built fresh on every call, so a stopped run that trained further since the last download gets its newest checkpoint.
    """
    weights = adapter_weights(run)
    suffix = "" if weights.is_final else f"-{weights.label}"
    target = run.path / f"{run.id}{suffix}-adapter.zip"
    with (replaced_atomically(target) as tmp, zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED) as archive,
          tempfile.TemporaryDirectory() as folder):
        for path in export_adapter(run, weights, Path(folder)):
            archive.write(path, f"adapter/{path.name}")
        archive.writestr("README.txt", _readme(run, weights))
    return target


def adapter_weights(run: RunDir) -> TrainedWeights:
    """The run's newest adapter; a run that trained every weight has none, and the sentence says where its model is."""
    weights = trained_weights(run)
    if not weights.is_adapter:
        raise ConfigError(f"The run {run.id} trained every weight (LoRA was off), so it has no adapter to download; "
                          f"the whole trained model is the folder {weights.path}.")
    return weights


def export_adapter(run: RunDir, weights: TrainedWeights, folder: Path, repo_id: str | None = None) -> list[Path]:
    """Fill ``folder`` with what loads the adapter elsewhere: its weights and tokenizer, the config naming the base
    by Hub id, and a fresh model card (a checkpoint has none, and an older card may predate the scores). The files."""
    for path in sorted(p for p in weights.path.iterdir() if p.is_file() and _is_export_file(p.name)):
        if path.name == "adapter_config.json":
            (folder / path.name).write_text(portable_adapter_config(path, run.read_config().model), encoding="utf-8")
        else:
            shutil.copy2(path, folder / path.name)
    write_model_card(run, folder, repo_id=repo_id)
    return sorted(folder.iterdir())


def make_portable(folder: Path, model) -> None:
    """Rewrite ``folder``'s adapter_config.json (where it has one) with the portable base (portable_adapter_config),
    atomically: a run's adapter and checkpoints are what people copy and upload."""
    path = folder / "adapter_config.json"
    if path.is_file():
        with replaced_atomically(path) as tmp:
            tmp.write_text(portable_adapter_config(path, model), encoding="utf-8")


def portable_adapter_config(path: Path, model) -> str:
    """The adapter's config with ``base_model_name_or_path`` as the starting model's Hub id (and revision), so that
    ``PeftModel.from_pretrained`` finds the base anywhere; PEFT writes the folder the weights were loaded from,
    which for the offline copy of the default model is a cache folder that exists on this machine only. A local
    model folder or an earlier run stays as it is: it has no Hub id (the README says how to load those)."""
    from .models import is_hub_id

    adapter_config = json.loads(path.read_text(encoding="utf-8"))
    if is_hub_id(model.id.strip()):
        adapter_config["base_model_name_or_path"] = model.id.strip()
        adapter_config["revision"] = model.revision
    return json.dumps(adapter_config, indent=2, sort_keys=True)


def _check_merge_target(target: Path) -> None:
    """Refuse to overwrite a folder that we did not create: merging replaces the target folder entirely."""
    if target.exists() and (not target.is_dir() or (any(target.iterdir()) and not (target / MERGE_MARKER).is_file())):
        raise ConfigError(f"{target} already exists and is not a model merged here; choose a new or empty folder.")


def newest_change(folder: Path) -> int:
    """The latest modification time (ns) of any file in ``folder``, 0 for an empty or missing one."""
    return max((path.stat().st_mtime_ns for path in folder.rglob("*") if path.is_file()), default=0)


def _merged_from(target: Path, weights: TrainedWeights) -> bool:
    """True when ``target`` is a merge of these weights made after they were last written: merging again would
    give the same folder (a minute or more for a large model)."""
    try:
        marker = json.loads((target / MERGE_MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return marker.get("weights") == weights.label and newest_change(target) >= newest_change(weights.path)


def merge_model(run: RunDir, target_dir: str | Path | None = None) -> Path:
    """The starting model with the trained adapter folded in (peft merge_and_unload), saved as a full model folder.

    Merging happens on the CPU in float32, so the merged model answers exactly like the adapter applied at runtime.
    An adapter trained on 4-bit weights (QLoRA) is folded into the full-precision starting model, as QLoRA adapters
    are everywhere: folding it into the 4-bit weights would round it away.
    Default target: ``<run>/merged``; a merge of the same weights already there is reused. A full fine-tuning run
    already has a full model: it is returned as is, or copied when another target is given.
    """
    config = run.read_config()
    weights = trained_weights(run)
    target = Path(target_dir).expanduser().resolve() if target_dir else run.merged_dir
    if not weights.is_adapter:
        if target_dir is None or target == weights.path:
            return weights.path
        _check_merge_target(target)
        _replace_folder(target, lambda staging: shutil.copytree(weights.path, staging, dirs_exist_ok=True,
                                                                ignore=shutil.ignore_patterns(*_TRAINING_STATE)),
                        run, weights)
        return target
    with _MERGING:  # one merge at a time; a second ask for the same merge finds it done
        _check_merge_target(target)
        if _merged_from(target, weights):
            return target
        _merge(run, config, weights, target)
    return target


_MERGING = threading.Lock()


def _merge(run: RunDir, config, weights: TrainedWeights, target: Path) -> None:
    from peft import PeftModel

    from ..config import HardwareSettings
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


def _replace_folder(target: Path, fill, run: RunDir, weights: TrainedWeights) -> None:
    """Fill a staging folder next to ``target`` and swap it in, so a reader sees a whole model or none."""
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        fill(staging)
        write_model_card(run, staging, merged=True)
        (staging / MERGE_MARKER).write_text(json.dumps({"run": run.id, "weights": weights.label,
                                                        "starting_model": run.read_config().model.id}), encoding="utf-8")
        shutil.rmtree(target, ignore_errors=True)
        os.replace(staging, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


@dataclass
class MergedDownload:
    """The merged full model: its folder on the server and the zip of it that the app offers for download."""

    folder: Path
    archive: Path
    archive_bytes: int


def model_files(folder: Path) -> list[Path]:
    """The files a full model folder needs elsewhere (not the trainer's resume state)."""
    return sorted(path for path in folder.rglob("*") if path.is_file()
                  and not any(fnmatch.fnmatch(path.name, pattern) for pattern in _TRAINING_STATE))


def merged_download(run: RunDir) -> MergedDownload:
    """Merge the run (or reuse its merge) and zip the folder for download; the zip is built once per merge.

    Weights are stored uncompressed: they barely compress, and deflating gigabytes would take minutes.
    """
    folder = merge_model(run)
    archive = run.path / f"{run.id}-merged.zip"
    if not archive.is_file() or archive.stat().st_mtime_ns < newest_change(folder):
        with replaced_atomically(archive) as tmp, zipfile.ZipFile(tmp, "w") as zipped:
            for path in model_files(folder):
                weights = path.suffix in (".safetensors", ".bin", ".pt")
                zipped.write(path, f"{run.id}-merged/{path.relative_to(folder)}",
                             compress_type=zipfile.ZIP_STORED if weights else zipfile.ZIP_DEFLATED)
        log.info("Zipped the merged model of run %s into %s", run.id, archive)
    return MergedDownload(folder, archive, archive.stat().st_size)


def format_size(n_bytes: int) -> str:
    for unit, size in (("GB", 2**30), ("MB", 2**20), ("KB", 2**10)):
        if n_bytes >= size:
            return f"{n_bytes / size:.1f} {unit}"
    return f"{n_bytes} bytes"


def merge_message(run: RunDir, folder: Path, shown: str | None = None) -> str:
    """The sentence shown after merge_model (UI and CLI): where the folder is (``shown`` as, when not its whole
    path), how big, and how to load it."""
    size = format_size(sum(path.stat().st_size for path in model_files(folder)))
    where = shown or folder
    if not run.read_config().lora.enabled and folder == run.full_model_dir:
        return (f"This run trained every weight, so {where} ({size}) already is a full model: nothing to merge. "
                "Load it with AutoModelForCausalLM.from_pretrained on that folder.")
    return (f"Saved the trained model ({trained_weights(run).label} of run {run.id}) as a full model in {where} "
            f"({size}); load it with AutoModelForCausalLM.from_pretrained on that folder, no peft needed.")


def merged_download_message(run: RunDir, merged: MergedDownload, shown: str | None = None) -> str:
    """merge_message, plus the download: the folder stays on the server, the zip travels."""
    return (f"{merge_message(run, merged.folder, shown)} To take it with you, download {merged.archive.name} "
            f"({format_size(merged.archive_bytes)}): the same folder as a zip.")
