"""What this machine can train, in the Model & Hardware tab's words: the model presets it offers, its hardware,
the hardware a draft would use and how long its steps would take, and a draft as a launch folder for a cluster."""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from .. import speedups
from ..config import RunConfig
from ..engine import trackers
from ..engine.estimate import MINIMUM_SETTINGS, estimate_run, forget_cpu_speed, format_params, minimum_memory_gb
from ..engine.hardware import HardwareInfo, ResolvedHardware, resolve_hardware
from ..engine.presets import PRESETS
from ..errors import DragonError
from ..scaleout.launch_folder import export_launch_folder
from ..speedups import ENV as SPEEDUPS_ENV, choose as choose_speedups  # for the app's entry point
from ..system.memory import system_memory_gb

__all__ = ["MINIMUM_SETTINGS", "PRESET_COLUMNS", "PRESET_IDS", "SPEEDUPS_ENV", "Plan", "choose_speedups", "export",
           "hardware_markdown", "offered_presets", "plan", "preset_rows", "redetect", "speedups_markdown"]

PRESET_IDS = [preset.id for preset in PRESETS]


def offered_presets(studio) -> list:
    """The presets to offer: all of them, or in a public demo those it allows."""
    if not studio.public:
        return list(PRESETS)
    allowed = {model_id.lower() for model_id in studio.allowed_models()}
    return [preset for preset in PRESETS if preset.id.lower() in allowed]


PRESET_COLUMNS = ["Model", "Parameters", "Min. memory", "Tools", "Notes"]


def preset_rows(presets) -> list[list[str]]:
    return [[preset.id, format_params(preset.params), f"~{minimum_memory_gb(preset.dims):.1f} GB",
             "yes" if preset.no_tools is None else "no", preset.notes] for preset in presets]


def hardware_markdown(info: HardwareInfo) -> str:
    lines = [f"**Detected:** {info.summary()}."]
    if info.cuda:
        lines += [f"- GPU {d.index} " + ("supports bf16." if d.bf16 else "has no bf16, so fp16 is used.")
                  for d in info.cuda]
    else:
        lines.append("- No CUDA GPU is visible to PyTorch" + (", but Apple MPS is." if info.mps else "."))
    free, total = system_memory_gb(free=True), system_memory_gb(free=False)
    if free is not None and total is not None:
        lines.append(f"- Memory: {free:.1f} GB free of {total:.1f} GB.")
    lines.append(speedups_markdown(speedups.status()))
    if not info.cuda:
        lines.append("- 4-bit loading: not available (it needs a CUDA GPU).")
    else:
        lines.append("- 4-bit loading: " + ("available (bitsandbytes is installed)." if info.bitsandbytes else
                                              "not available (bitsandbytes is not installed)."))
    return "\n".join(lines)


def speedups_markdown(state: dict) -> str:
    """Which of Dragon's speed-ups are on (most apply to CPU and Apple GPU runs), and why any is off."""
    active, disabled = state["active"], state["disabled"]
    line = f"- Speed-ups: {len(active)} of {len(active) + len(disabled)} on"
    if not disabled:
        return line + " (most of them speed up training on the CPU)."
    return line + ":\n" + "\n".join(f"  - {name} is off: {reason}." for name, reason in disabled.items())


@dataclass
class Plan:
    """How a valid draft would run here: the hardware chosen (with why, in words) and the estimate in words (or,
    not ``estimated``, why there is none)."""

    hardware: ResolvedHardware
    choice: str
    estimate: str
    estimated: bool = True


def plan(studio, config: RunConfig) -> Plan:
    """The hardware ``config`` would use on this machine and how long it would take; DragonError when this machine
    cannot run it (an absent device, a tracker that is not installed)."""
    resolved = resolve_hardware(config.hardware, studio.hardware())
    trackers.check(config.logging, policy=studio.policy)
    choice = (f"**This run will use:** {resolved.device} · {resolved.dtype}"
              + (f" · GPU {resolved.gpu}" if resolved.device == "cuda" else "")
              + (" · 4-bit weights" if resolved.load_in_4bit else "")
              + (f" · {resolved.cpu_threads} CPU thread{'s' if resolved.cpu_threads != 1 else ''}"
                 if resolved.device == "cpu" else "") + "\n"
              + "\n".join(f"- {reason}" for reason in resolved.reasons))
    try:
        return Plan(resolved, choice, estimate_run(config, resolved, studio.hardware()).describe())
    except DragonError as exc:  # an unknown model size: no estimate, the run can still start
        return Plan(resolved, choice, str(exc), estimated=False)


def redetect(studio) -> HardwareInfo:
    """Detect the hardware again, and measure the CPU again for the next estimate."""
    forget_cpu_speed()
    return studio.hardware(refresh=True)


def export(studio, config: RunConfig, name: str, gpus: int, nodes: int) -> Path:
    """``config`` as a zipped launch folder named ``name`` for ``nodes`` x ``gpus`` GPUs (scaleout/launch_folder.py),
    made once per config and size: asked again, the same zip. It is built in a folder of its own, which goes once
    zipped, and the zip counts against the visitor's share of the disk (Files.take_share)."""
    size = f"{nodes}x{gpus}gpu"
    folder = studio.files.downloads_dir / studio.files.download_name(f"{config.to_yaml()}{size}")
    archive = folder / f"{name}-{size}.zip"
    if archive.is_file():
        return archive
    studio.files.take_share(0, 1)
    with tempfile.TemporaryDirectory(dir=studio.files.downloads_dir) as building:
        launch = export_launch_folder(config, Path(building) / archive.stem, gpus, nodes, policy=studio.policy)
        made = Path(shutil.make_archive(str(launch), "zip", launch.parent, launch.name))
        studio.files.take_share(made.stat().st_size, 0)
        folder.mkdir(exist_ok=True)
        os.replace(made, archive)
    return archive
