"""Public mode's checks: what a visitor's run may do on a public demo (a Hugging Face Space, a workshop's shared
machine), applied by the engine so that the app, its HTTP API and the command line all get them.

Public mode is on where ``SPACE_ID`` is set (every Space) or ``DRAGON_UI_PUBLIC=1``: the entry points build a
``public.Policy`` from the environment and pass it to each check here. There a run's settings can never:

- run code from elsewhere: custom-Python and command rewards (``rewards.public_refusal``), ``model.trust_remote_code``,
  a ``model.revision`` (anyone who opens a pull request on an allowed model's repository could supply it);
- reach outside the demo: data only from the bundled datasets, this visitor's uploads and Hub dataset ids (refused
  by ``data.locate`` before anything on the disk is looked at), models only from the allow-list, no vLLM server
  address, runs only in the demo's own runs folder;
- take more than its share of the machine: each run stops with a checkpoint after ``Limits.run_minutes`` (held-out
  scoring included); completion length, completions per step, rows of data, held-out prompts, upload size, LoRA
  rank (full fine-tuning is off), CPU threads and the estimated memory are capped; each visitor and each network
  address may have a few runs training or waiting, and start only so many an hour (``take_start``).

Every refusal is one sentence that names the limit and how to lift it.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Sequence
from pathlib import Path

from ..config import DEFAULT_MODEL_ID, ModelConfig, RunConfig
from ..data import locate
from ..errors import BusyError, ConfigError
from ..public import LIFT, MODELS_ENV, Allowance, Limits, Policy, Visitor
from ..rewards import public_refusal
from ..rewards.spec import ClassifierReward
from ..tools import public_refusal as tool_refusal
from ..runstore import ACTIVE_STATES, RunDir, list_runs


class PublicDemoRefusal(ConfigError):
    """A setting this public demo does not allow; the message names the limit and how to lift it."""


def check_run(config: RunConfig, reads_data: bool = True, longest_prompt: int | None = None, *, policy: Policy) -> None:
    """Refuse the first setting of ``config`` that a public demo does not allow (nothing outside public mode),
    before any data is read or model loaded; ``reads_data`` False for a run whose data is already in its folder,
    ``longest_prompt`` its longest prompt in tokens, where it is known (check_memory)."""
    limits = policy.limits
    if limits is None:
        return
    if config.runs_dir and Path(config.runs_dir).expanduser().resolve() != policy.runs_dir:
        raise PublicDemoRefusal(f"runs_dir must be left empty in this public demo: runs are kept in its own folder "
                                f"({LIFT} to keep them elsewhere).")
    check_model(config.model, policy=policy)
    if reads_data:
        locate(config.data.source, policy=policy)  # refuses a source this demo does not read
    if config.data.max_rows is not None and config.data.max_rows > limits.dataset_rows:
        raise PublicDemoRefusal(f"data.max_rows must be at most {limits.dataset_rows:,} in this public demo (its "
                                f"limit of rows of data); got {config.data.max_rows:,} ({LIFT} to train on more).")
    if config.grpo.max_new_tokens > limits.max_new_tokens:
        raise PublicDemoRefusal(f"grpo.max_new_tokens must be at most {limits.max_new_tokens} in this public demo "
                                f"(its limit of new tokens per completion); got {config.grpo.max_new_tokens} "
                                f"({LIFT} for longer completions).")
    if config.data.max_prompt_tokens is not None and config.data.max_prompt_tokens > limits.prompt_tokens:
        raise PublicDemoRefusal(f"data.max_prompt_tokens must be at most {limits.prompt_tokens} in this public demo "
                                f"(its limit of tokens per prompt, chat template included); got "
                                f"{config.data.max_prompt_tokens:,} ({LIFT} for longer prompts).")
    if config.completions_per_step > limits.completions_per_step:
        raise PublicDemoRefusal(f"A step samples {config.completions_per_step} completions (training.batch_size "
                                f"{config.training.batch_size} x grpo.group_size {config.grpo.group_size} x "
                                f"training.grad_accum {config.training.grad_accum}), more than this public demo's "
                                f"limit of {limits.completions_per_step}; lower one of them ({LIFT} for bigger "
                                "steps).")
    if not config.lora.enabled:
        raise PublicDemoRefusal("lora.enabled must stay on in this public demo: training every weight takes several "
                                "times the memory and writes the whole model at every checkpoint "
                                f"({LIFT} for full fine-tuning).")
    if config.lora.r > limits.lora_rank:
        raise PublicDemoRefusal(f"lora.r must be at most {limits.lora_rank} in this public demo (its limit of LoRA "
                                f"rank); got {config.lora.r} ({LIFT} for a larger adapter).")
    cores = os.cpu_count() or 1
    if config.hardware.cpu_threads is not None and config.hardware.cpu_threads > cores:
        raise PublicDemoRefusal(f"hardware.cpu_threads must be at most {cores} in this public demo, the cores of "
                                f"this machine; got {config.hardware.cpu_threads} (empty picks the best number).")
    for index, spec in enumerate(config.rewards):
        refusal = public_refusal(spec, f"rewards[{index}]", policy=policy)
        if refusal is not None:
            raise PublicDemoRefusal(refusal)
    for index, tool in enumerate(config.tools):  # a run's folder holds its config: what made it is not trusted
        refusal = tool_refusal(tool.kind, policy=policy)
        if refusal is not None:
            raise PublicDemoRefusal(f"tools[{index}].kind: {refusal}")
    classifiers = {spec.model.strip() for spec in config.rewards if isinstance(spec, ClassifierReward)}
    if len(classifiers) > 1:
        raise PublicDemoRefusal(f"The rewards use {len(classifiers)} classifier models; a run in this public demo may "
                                f"use one (each takes memory from every visitor; {LIFT} to use more).")
    if config.generation.backend == "vllm-server":
        raise PublicDemoRefusal("generation.backend vllm-server is turned off in this public demo: it would send "
                                f"requests from the server to an address you choose ({LIFT} to use a vLLM server).")
    check_memory(config, longest_prompt, policy=policy)


def check_model(model: ModelConfig, *, policy: Policy) -> None:
    """Refuse a model a public demo does not offer: one that runs its repository's code, a revision of its
    repository other than the main one, or one off the allow-list (a large model would take the machine from every
    other visitor) that is not one of the visitor's own finished runs in the demo's runs folder."""
    if not policy.public:
        return
    if model.trust_remote_code:
        raise PublicDemoRefusal("model.trust_remote_code is turned off in this public demo: it would run Python from "
                                f"the model's repository on the server ({LIFT} to use it).")
    if model.revision:
        raise PublicDemoRefusal("model.revision must be left empty in this public demo: a branch or pull request of "
                                "the model's repository could hold other weights and another chat template than the "
                                f"ones offered ({LIFT} to pick a revision).")
    if policy.runs_dir is not None and _is_own_run(model.id, policy.runs_dir, policy=policy):
        return
    allowed = allowed_models(policy=policy)
    if model.id.strip() not in allowed:  # as listed: each other spelling would be another download and cache
        raise PublicDemoRefusal(f"model.id {model.id.strip()!r} is not offered in this public demo; choose one of "
                                f"{', '.join(allowed)} ({LIFT} to train any model, or add it to {MODELS_ENV}).")


def _is_own_run(model_id: str, runs_dir: Path, *, policy: Policy) -> bool:
    """A folder of the demo's runs that the asking visitor started (continuing from it reads only their work)."""
    path = Path(os.path.normpath(os.path.abspath(model_id.strip())))
    if path.parent != runs_dir:
        return False  # decided from the text alone, before anything on the disk is looked at
    return (path / "config.json").is_file() and policy.owns(RunDir(path).read_status().get("owner"))


def check_memory(config: RunConfig, longest_prompt: int | None = None, *, policy: Policy) -> None:
    """Refuse a run whose estimated memory, with the estimate's margin, is more than this machine has: it would end
    out of memory, or push the app into swap for every visitor. ``longest_prompt``: the longest prompt the run
    keeps, in tokens, once its data is read (engine.training.inspect checks again then: a visitor chooses the data,
    and the demo caps it at ``Limits.prompt_tokens``); before that, prompts of a usual length. Nothing is refused
    where the model's size is unknown (a model the owner added to the allow-list), or the machine's memory."""
    from .estimate import MEMORY_MARGIN, PROMPT_TOKENS, admitted_gb, model_dims
    from .hardware import resolve_hardware, this_machine

    if not policy.public:
        return
    info = this_machine()
    try:
        hardware = resolve_hardware(config.hardware, info)
        dims, _ = model_dims(config.model.id)
    except ConfigError:
        return  # an impossible device is refused where the run resolves it, with its own sentence
    memory_gb = _memory_gb(info, hardware)
    needed = admitted_gb(config, dims, hardware, longest_prompt or PROMPT_TOKENS)
    if memory_gb is not None and needed > memory_gb:
        prompts = (f"with its longest prompt of {longest_prompt:,} tokens" if longest_prompt else
                   f"with prompts of about {PROMPT_TOKENS} tokens")
        shorter = ", use shorter prompts (data.max_prompt_tokens)" if longest_prompt else ""
        raise PublicDemoRefusal(f"This run would need about {needed / (1 + MEMORY_MARGIN):.1f} GB of memory "
                                f"{prompts}, {needed:.1f} GB with the estimate's margin of "
                                f"{round(100 * MEMORY_MARGIN)} %: more than the {memory_gb:.1f} GB this machine has; "
                                f"lower the batch size, the group size or max new tokens{shorter}, or turn on "
                                f"gradient checkpointing ({LIFT} on a bigger machine).")


def _memory_gb(info, hardware) -> float | None:
    """All the memory of the device a run uses (not what is free now: that moves while another run trains)."""
    from ..system.memory import system_memory_gb

    return info.cuda[hardware.gpu].total_gb if hardware.device == "cuda" else system_memory_gb(free=False)


def allowed_models(*, policy: Policy) -> list[str]:
    """The models a public demo offers: the presets (not gated) that a run at the public limits fits in this
    machine's memory, then the ones the owner adds with ``DRAGON_UI_PUBLIC_MODELS``."""
    return list(dict.fromkeys([*_fitting_presets(policy.limits or Limits()), *policy.models]))


@functools.cache
def _fitting_presets(limits: Limits) -> tuple[str, ...]:
    from .estimate import PROMPT_TOKENS, admitted_gb
    from .hardware import resolve_hardware, this_machine
    from .presets import PRESETS

    info = this_machine()
    hardware = resolve_hardware(RunConfig().hardware, info)
    memory_gb = _memory_gb(info, hardware)
    config = RunConfig()  # the defaults (4 prompts a step, LoRA), at the public limit of completion length
    config.grpo.max_new_tokens = limits.max_new_tokens
    fitting = [DEFAULT_MODEL_ID]  # the bundled offline copy: a demo always has one model
    for preset in PRESETS:
        if preset.gated or memory_gb is None:
            continue
        if admitted_gb(config, preset.dims, hardware, PROMPT_TOKENS) <= memory_gb:
            fitting.append(preset.id)
    return tuple(dict.fromkeys(fitting))


# ----------------------------------------------------------------------------------------------------------------
# Each visitor's share of the queue.

_starts = Allowance(window_s=3600)  # each network address's starts and resumes in the last hour
_preflights = Allowance(window_s=3600)  # and its pre-flights
_dry_runs = Allowance(window_s=3600)  # and its dry runs


def take_start(runs_dir: Path, preparing: Sequence[Visitor] = (), *, policy: Policy) -> None:
    """Refuse a start or resume that would give the asking visitor, or its network address (a learner's seat, in a
    class: public.Visitor.address), or the whole class, more than its share, or else count it: runs training or
    waiting (an API client can open a new session for every call, so its address counts too; the runs of
    ``preparing``, not in the runs folder yet, count too), and starts in the last hour (a
    start counts whether it then succeeds or not: reading the visitor's data is most of what it costs). Nothing
    outside public mode, or for the operator and the demo's owner."""
    who, limits = policy.visitor, policy.limits
    if limits is None or who.owns_everything:
        return
    active = [{"owner": run.get("owner"), "address": run.get("address"), "seat": run.get("seat")}
              for run in list_runs(runs_dir) if run["state"] in ACTIVE_STATES]
    active += [{"owner": other.key, "address": other.address, "seat": other.seat} for other in preparing]
    if who.seat and sum(bool(run.get("seat")) for run in active) >= limits.class_runs:
        raise BusyError(f"The class has {limits.class_runs} runs training or waiting already, its teacher's limit "
                        "(DRAGON_UI_CLASS_RUNS); wait for one to finish.")
    if sum(run.get("owner") == who.key for run in active) >= limits.runs_per_visitor:
        raise BusyError(f"You already have {limits.runs_per_visitor} runs training or waiting, this public demo's "
                        "limit of runs one visitor may have training or waiting; stop one, or wait for one to "
                        f"finish ({LIFT} without limits).")
    yours = "your seat" if who.seat else "your network address"
    if who.address and sum(run.get("address") == who.address for run in active) >= limits.runs_per_address:
        raise BusyError(f"{limits.runs_per_address} runs from {yours} are already training or waiting, "
                        "this public demo's limit of runs training or waiting from one network address; wait for "
                        f"one to finish ({LIFT} without limits).")
    if who.address and not _starts.take(who.address, 1, limits.starts_per_hour):
        raise BusyError(f"{limits.starts_per_hour} runs were started from {yours} in the last hour, "
                        f"this public demo's limit of starts and resumes per network address per hour; try again "
                        f"in {_starts.minutes_to_wait(who.address)} minutes ({LIFT} without limits).")


def take_preflight(*, policy: Policy) -> None:
    """Refuse a pre-flight past its network address's allowance an hour, or else count it: each one samples the
    model for minutes, as a run's first steps do. Nothing outside public mode, or for the operator and the owner."""
    _take(_preflights, "preflights_per_hour", "pre-flights", policy=policy)


def take_dry_run(*, policy: Policy) -> None:
    """Refuse a dry run where this demo's owner allows none (Policy.measures_steps), or to a visitor it cannot count,
    or past its network address's allowance an hour; or else count it: each one trains a step on the machine every
    visitor shares. Nothing outside public mode, or for the operator and the owner."""
    if not policy.measures_steps:
        raise PublicDemoRefusal("This public demo measures no steps for its visitors: a dry run trains on the machine "
                                f"every visitor shares. The estimate above is what it offers ({LIFT} to measure).")
    if policy.limits is not None and not policy.visitor.owns_everything and not policy.visitor.address:
        raise PublicDemoRefusal("This public demo measures steps only for visitors it can count by network address.")
    _take(_dry_runs, "dry_runs_per_hour", "dry runs", policy=policy)


def _take(allowance: Allowance, limit: str, what: str, *, policy: Policy) -> None:
    who = policy.visitor
    if policy.limits is None or who.owns_everything or not who.address:
        return
    most = getattr(policy.limits, limit)
    if not allowance.take(who.address, 1, most):
        yours = "your seat" if who.seat else "your network address"
        raise BusyError(f"{most} {what} were asked for from {yours} in the last hour, this public "
                        f"demo's limit of {what} per network address per hour; try again in "
                        f"{allowance.minutes_to_wait(who.address)} minutes ({LIFT} without limits).")
