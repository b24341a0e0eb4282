"""Public mode's checks: what a visitor's run may do on a public demo (a Hugging Face Space, a workshop's shared
machine), applied by the engine so that the app, its HTTP API and the command line all get them.

Public mode is on where ``SPACE_ID`` is set (every Space) or ``DRAGON_UI_PUBLIC=1`` (see ``public.py``). There a
run's settings can never:

- run code from elsewhere: custom-Python and command rewards (refused by ``rewards``), ``model.trust_remote_code``;
- reach outside the demo: data only from the bundled datasets, this visitor's uploads and Hub dataset ids (refused
  by ``data`` before anything on the disk is looked at), models only from the allow-list, no vLLM server address,
  runs only in the demo's own runs folder;
- hold the machine for long: each run stops with a checkpoint after ``Limits.run_minutes``; completion length,
  completions per step, rows of data, upload size and the queue are capped (``public.Limits``).

Every refusal is one sentence that names the limit and how to lift it.
"""

from __future__ import annotations

import functools
from pathlib import Path

from ..config import DEFAULT_MODEL_ID, ModelConfig, RunConfig, resolve_runs_dir
from ..data import check_public_source
from ..errors import ConfigError
from ..public import LIFT, MODELS_ENV, Limits, extra_models, is_public_demo, visitor
from ..runstore import RunDir


class PublicDemoRefusal(ConfigError):
    """A setting this public demo does not allow; the message names the limit and how to lift it."""


def check_run(config: RunConfig, reads_data: bool = True) -> None:
    """Refuse the first setting of ``config`` that a public demo does not allow (nothing outside public mode),
    before any data is read or model loaded; ``reads_data`` False for a run whose data is already in its folder."""
    if not is_public_demo():
        return
    limits = Limits.from_env()
    check_model(config.model, config.runs_dir or None)
    if reads_data:
        check_public_source(config.data.source, config.base_dir or None)
    if config.data.max_rows is not None and config.data.max_rows > limits.dataset_rows:
        raise PublicDemoRefusal(f"data.max_rows must be at most {limits.dataset_rows:,} in this public demo (its "
                                f"limit of rows of data); got {config.data.max_rows:,} ({LIFT} to train on more).")
    if config.grpo.max_new_tokens > limits.max_new_tokens:
        raise PublicDemoRefusal(f"grpo.max_new_tokens must be at most {limits.max_new_tokens} in this public demo "
                                f"(its limit of new tokens per completion); got {config.grpo.max_new_tokens} "
                                f"({LIFT} for longer completions).")
    if config.completions_per_step > limits.completions_per_step:
        raise PublicDemoRefusal(f"A step samples {config.completions_per_step} completions (training.batch_size "
                                f"{config.training.batch_size} x grpo.group_size {config.grpo.group_size} x "
                                f"training.grad_accum {config.training.grad_accum}), more than this public demo's "
                                f"limit of {limits.completions_per_step}; lower one of them ({LIFT} for bigger "
                                "steps).")
    if config.generation.backend == "vllm-server":
        raise PublicDemoRefusal("generation.backend vllm-server is turned off in this public demo: it would send "
                                f"requests from the server to an address you choose ({LIFT} to use a vLLM server).")
    if config.runs_dir and resolve_runs_dir(config.runs_dir) != resolve_runs_dir():
        raise PublicDemoRefusal(f"runs_dir must be left empty in this public demo: runs are kept in its own folder "
                                f"({LIFT} to keep them elsewhere).")


def check_model(model: ModelConfig, runs_dir: str | None = None) -> None:
    """Refuse a model a public demo does not offer: one that runs its repository's code, or one off the allow-list
    (a large model would take the machine from every other visitor) that is not one of the visitor's own finished
    runs in the demo's runs folder."""
    if not is_public_demo():
        return
    if model.trust_remote_code:
        raise PublicDemoRefusal("model.trust_remote_code is turned off in this public demo: it would run Python from "
                                f"the model's repository on the server ({LIFT} to use it).")
    if _is_own_run(model.id, resolve_runs_dir(runs_dir)):
        return
    allowed = allowed_models()
    if model.id.strip().lower() not in {allowed_id.lower() for allowed_id in allowed}:
        raise PublicDemoRefusal(f"model.id {model.id.strip()!r} is not offered in this public demo; choose one of "
                                f"{', '.join(allowed)} ({LIFT} to train any model, or add it to {MODELS_ENV}).")


def _is_own_run(model_id: str, runs_dir: Path) -> bool:
    """A folder of the demo's runs that the current visitor started (continuing from it reads only their work)."""
    path = Path(model_id.strip()).expanduser()
    if not path.is_absolute() or path.resolve().parent != runs_dir:
        return False  # decided from the text alone, before anything on the disk is looked at
    return (path / "config.json").is_file() and visitor().owns(RunDir(path.resolve()).read_status().get("owner"))


def allowed_models() -> list[str]:
    """The models a public demo offers: the presets (not gated) that a run at the public limits fits in this
    machine's memory, then the ones the owner adds with ``DRAGON_UI_PUBLIC_MODELS``."""
    return list(dict.fromkeys([*_fitting_presets(), *extra_models()]))


@functools.cache
def _fitting_presets() -> tuple[str, ...]:
    from .estimate import estimate_memory
    from .hardware import detect_hardware, resolve_hardware, system_memory_gb
    from .presets import PRESETS

    limits = Limits.from_env()
    info = detect_hardware()
    hardware = resolve_hardware(RunConfig().hardware, info)
    # all of it, not what is free now: the list must not change while a visitor's run holds some of it
    memory_gb = info.cuda[hardware.gpu].total_gb if hardware.device == "cuda" else system_memory_gb(free=False)
    config = RunConfig()  # the defaults (4 prompts a step, LoRA), at the public limit of completion length
    config.grpo.max_new_tokens = limits.max_new_tokens
    fitting = [DEFAULT_MODEL_ID]  # the bundled offline copy: a demo always has one model
    for preset in PRESETS:
        if preset.gated or memory_gb is None:
            continue
        needed = estimate_memory(config, preset.dims, hardware.dtype, load_in_4bit=False, device=hardware.device)
        if needed.total_gb <= memory_gb:
            fitting.append(preset.id)
    return tuple(dict.fromkeys(fitting))
