"""GRPO training of one run, in the calling thread, writing everything it does into the run directory.

One runner, two hosts: the app hands each run to a process of its own (engine/workers.py, which calls
:func:`train_here`), and the command line, a process of its own already, calls it in its main thread
(:func:`train_config`). Either way :func:`prepare` checks the run and creates its folder first, in the process that was
asked, so mistakes are said there; then the runner loads data and model, runs TRL's ``GRPOTrainer`` (the algorithm
is TRL's, not ours) and scores the starting and the trained model on held-out prompts (a full fine-tune scores the
starting one first; LoRA after training, with the adapter off, so Start trains at once). ``progress.RunStoreCallback``
turns TRL's logs into ``progress.jsonl`` / ``rollouts.jsonl`` rows and honours stop requests. An app trains
several runs side by side only where the machine has room for them (engine/capacity.py), each held to its share.

Failure policy: every exception ends the run as ``failed`` with a readable reason; checkpoints already written stay;
a resume continues from the latest one with step count, optimiser and schedule intact.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from .. import speedups
from ..config import GRPO_VARIANTS, RunConfig
from .reward_models import check_labels, classifiers_on
from ..data import MappedData, load_and_map, read_jsonl, write_jsonl
from ..errors import BusyError, ConfigError, DragonError, Stopped, describe
from ..public import Policy
from ..rewards import Reward, RewardFailures, build_rewards, training_weight, trl_reward_functions
from ..runstore import ACTIVE_STATES, RunDir, write_json_atomic
from ..scaleout import distributed
from . import capacity, public_checks, trackers
from .capacity import Share
from .evaluation import HeldOutChecks, evaluate_model, evaluate_now, record_eval, starting_weights
from .hardware import HardwareInfo, ResolvedHardware, resolve_hardware
from .model_card import write_model_card
from .weights import make_portable
from .models import BY_LAUNCHER, ON_DEVICE, ModelCache, load_model, load_tokenizer, resolve_model, take_set_aside
from .prompts import PromptFit, context_length, fit_prompts, prompt_limit
from .presets import find_preset
from .tool_calls import TOOL_FAMILIES, ToolUse, ready_for_tools, scoring_episodes, tool_use
from .workers import TrainingProcess, Workers

log = logging.getLogger("dragon_ui")

_ACTIVE_LOCK = threading.Lock()
_active: list[TrainingProcess] = []  # first started first; those that have ended leave at the next start


PUBLIC_CHECKPOINTS_KEPT = 2  # a public demo keeps a run's newest checkpoints only: the disk is everyone's


class Training:
    """A run being trained by this process: its run directory, a thread-safe stop, the policy it trains under,
    whose time limit (in a public demo) ends it, counted from the moment the runner starts, and the ``share`` of the
    machine it holds itself to (engine/capacity.py; none for the command line's, alone in its process)."""

    def __init__(self, run: RunDir, *, policy: Policy, share: Share | None = None) -> None:
        self.run = run
        self.policy = policy
        self.share = share or Share()
        self.stop_event = threading.Event()
        self.time_limit_s = policy.limits.run_minutes * 60 if policy.limits else None
        self.started = time.monotonic()  # set again when the runner starts

    def stop(self) -> None:
        """Ask the training to stop at its next forward pass (see _stoppable_forward_passes); it saves a checkpoint of
        the last whole step and marks the run cancelled."""
        self.stop_event.set()
        self.run.request_stop()

    def stop_requested(self) -> bool:
        return self.stop_event.is_set() or self.run.stop_requested()

    def out_of_time(self) -> bool:
        return self.time_limit_s is not None and time.monotonic() - self.started >= self.time_limit_s

    def should_stop(self) -> bool:
        """A stop was asked for, or the time limit has passed: checked between a step's forward passes and between
        batches of held-out scoring, so either takes effect within moments."""
        return self.stop_requested() or self.out_of_time()


def active_runs() -> list[TrainingProcess]:
    """The trainings this app has running, each in a process of its own, first started first (the UI re-attaches
    to them after a page reload)."""
    return [handle for handle in list(_active) if handle.is_alive()]


ENDING_S = 60  # how long a training that has ended is waited for while its process saves and exits


def wait_while_ending(timeout_s: float = ENDING_S) -> None:
    """A stopped or finished training writes its run's state a moment before its process exits: what would be
    refused beside a training (a preview, a scoring) waits for that moment rather than being refused just after
    Stop. The trainings still going on are not waited for."""
    for handle in active_runs():  # those ending end side by side: after the first, the others wait little
        if handle.run.read_status().get("state") not in ACTIVE_STATES:
            handle.wait(timeout_s)


def train_config(config: RunConfig, run_dir: str | Path | None = None, *, policy: Policy,
                 on_start: Callable[[Training], object] | None = None) -> RunDir:
    """Check the data, rewards and hardware, create the run directory and train it here, to its end: the command
    line's way (a process of its own). Mistakes found without loading a model raise ConfigError before any folder
    is created; so does a setting ``policy`` refuses. ``on_start`` gets the training first (to stop it on Ctrl+C)."""
    return _train_to_the_end(prepare(config, run_dir, policy=policy), None, on_start, policy=policy)


def resume_here(run_dir: str | Path, *, policy: Policy,
                on_start: Callable[[Training], object] | None = None) -> RunDir:
    """Continue a stopped, failed or interrupted run here from its latest checkpoint (or from the start if it has
    none), to its end: the command line's resume."""
    run, checkpoint = _reopen(run_dir, policy=policy)
    return _train_to_the_end(run, checkpoint, on_start, policy=policy)


def _train_to_the_end(run: RunDir, resume_from: Path | None,
                      on_start: Callable[[Training], object] | None, *, policy: Policy) -> RunDir:
    job = Training(run, policy=policy)
    if on_start is not None:
        on_start(job)
    train_here(job, resume_from)
    return run


@dataclass
class Inspection:
    """What a run would train on, found without loading any weights: the data (the prompts the model cannot read
    already dropped), what counting the prompts found, and the hardware it would use."""

    mapped: MappedData
    prompts: PromptFit
    hardware: ResolvedHardware
    tools: ToolUse | None = None  # the tools the model may call (its prompts already show their worked examples)


def inspect(config: RunConfig, *, policy: Policy) -> Inspection:
    """Every check a run passes before it trains (``policy``'s, the data's, the prompts', the rewards'), with what
    they found; ConfigError with the sentence to show at the first that fails. ``check`` prints it."""
    public_checks.check_run(config, policy=policy)
    preset = find_preset(config.model.id)
    if config.tools and preset is not None and preset.no_tools:  # said before anything is downloaded
        raise ConfigError(f"tools: {preset.id} cannot call tools: {preset.no_tools}; pick {TOOL_FAMILIES}.")
    hardware = resolve_hardware(config.hardware)
    distributed.check_runnable_here(config, hardware.device)
    mapped = load_and_map(config.data, base_dir=config.base_dir or None, policy=policy)
    source = resolve_model(config.model)
    limit, why = prompt_limit(config, hardware.device, context_length(source), policy=policy)
    tokenizer = load_tokenizer(source)
    tools = tool_use(config, mapped.train + mapped.eval, policy=policy)
    if tools is not None:  # the worked examples go before each question, in the prompts the run stores
        tokenizer = ready_for_tools(tokenizer, source.label)
        mapped = replace(mapped, train=tools.shown(mapped.train), eval=tools.shown(mapped.eval))
    mapped, prompts = fit_prompts(mapped, tokenizer, limit, why, tools.every_function if tools else None)
    public_checks.check_memory(config, prompts.longest_kept, policy=policy)
    if len(mapped.train) < config.training.batch_size:
        held_out = (f" ({len(mapped.eval)} more are held out for the before/after comparison; data.eval_frac 0 "
                    "trains on them too)") if mapped.eval else ""
        raise ConfigError(f"Only {len(mapped.train)} training prompts{held_out}, fewer than training.batch_size "
                          f"({config.training.batch_size}); add rows or lower the batch size.")
    build_rewards(config.rewards, base_dir=config.base_dir or None, max_new_tokens=config.grpo.max_new_tokens,
                  policy=policy)
    for index, spec in enumerate(config.rewards):
        if spec.kind == "classifier":
            check_labels(spec, f"rewards[{index}]")
    trackers.check(config.logging, policy=policy)
    return Inspection(mapped, prompts, hardware, tools)


def prepare(config: RunConfig, run_dir: str | Path | None = None, waiting: bool = False,
            *, policy: Policy) -> RunDir:
    """Everything of ``start`` but the training: the checks, then the run folder with its config and its mapped
    data, in state queued; ``waiting``: in the queue (``queue.py``), from the moment its status is written, which is
    the last thing done here."""
    inspection = inspect(config, policy=policy)
    mapped = inspection.mapped
    path = None
    if distributed.is_main_process():  # under accelerate/torchrun, one process creates and fills the folder
        if run_dir is None:
            run = RunDir.create(config.resolved_runs_dir(), config.name or Path(config.model.id.rstrip("/")).name + "-grpo")
        else:
            run = RunDir(Path(run_dir))
            run.path.mkdir(parents=True, exist_ok=True)
        run.write_config(config)
        write_jsonl(run.train_data_path, mapped.train)
        write_jsonl(run.eval_data_path, mapped.eval)
        if mapped.dropped:
            write_json_atomic(run.dropped_rows_path, mapped.dropped)
        run.update_status(waiting="start" if waiting else None, queued_at=time.time() if waiting else None,
                          state="queued", step=0, total_steps=None, created_at=time.time(),
                          phase="waiting for its turn" if waiting else "waiting to start",
                          owner=policy.visitor.key if policy.public else None,
                          owner_address=policy.visitor.address if policy.public else None,
                          seat=(policy.visitor.seat or None) if policy.public else None,
                          reward_names=[spec.name for spec in config.rewards], data_summary=mapped.summary(),
                          n_train=len(mapped.train), n_eval=len(mapped.eval), n_skipped=mapped.n_skipped,
                          longest_prompt_tokens=inspection.prompts.longest_kept,
                          world_size=distributed.world_size())
        path = str(run.path)
    path = distributed.broadcast_from_main(path)
    return RunDir(Path(path), read_only=not distributed.is_main_process())


def resume(run_dir: str | Path, *, policy: Policy, workers: Workers) -> TrainingProcess:
    """Continue a stopped, failed or interrupted run from its latest checkpoint (or from the start if it has none),
    in a process of ``workers``: the app's resume, refused (BusyError) where the machine has no room for it beside
    the trainings of this app, before anything of the run changes."""
    _refuse_if_no_room(RunDir(Path(run_dir)), workers)
    run, checkpoint = _reopen(run_dir, policy=policy)
    return _launch(run, checkpoint, workers, policy=policy)


def _reopen(run_dir: str | Path, *, policy: Policy) -> tuple[RunDir, Path | None]:
    """The run, checked resumable and marked queued again, with the checkpoint it continues from."""
    run = check_resumable(run_dir, policy=policy)
    checkpoint = run.latest_checkpoint()
    distributed.barrier()  # every process has read the state before the main one changes it
    run.clear_stop_request()
    run.update_status(state="queued", phase="waiting to resume", error=None, traceback=None, finished_at=None,
                      stop_reason=None, pid=None)  # owned by no process until one takes it (mark_owner)
    return run, checkpoint


def check_resumable(run_dir: str | Path, *, policy: Policy) -> RunDir:
    """The run, if it can be resumed (raises BusyError or ConfigError with the reason otherwise)."""
    run = RunDir(Path(run_dir), read_only=not distributed.is_main_process())
    # Its data was read (and checked) when it started.
    public_checks.check_run(run.read_config(), reads_data=False,
                            longest_prompt=run.read_status().get("longest_prompt_tokens"), policy=policy)
    state = run.read_status().get("state")
    if state in ACTIVE_STATES:
        raise BusyError(f"The run {run.id} is still {state}; stop it before resuming.")
    if state == "succeeded":
        raise ConfigError(f"The run {run.id} already finished; start a new run from it instead (use it as the model).")
    return run


def start_waiting(run: RunDir, resume: bool, *, policy: Policy, workers: Workers) -> TrainingProcess:
    """Train a run that waited in the queue, in a process of ``workers``: from its start, or (``resume``) from its
    latest checkpoint. A folder whose config cannot be read (ConfigError) never takes the machine."""
    run.read_config()
    return _start(run, resume, policy=policy, workers=workers)


def start_prepared(run: RunDir, *, policy: Policy, workers: Workers) -> TrainingProcess:
    """Train a run queue.submit_start has just prepared, from its start: its config was checked as it was written,
    so it is not read back."""
    return _start(run, False, policy=policy, workers=workers)


def _start(run: RunDir, resume: bool, *, policy: Policy, workers: Workers) -> TrainingProcess:
    _refuse_if_no_room(run, workers)
    run.clear_stop_request()
    run.update_status(waiting=None, phase="waiting to resume" if resume else "waiting to start", stop_reason=None,
                      pid=None)  # owned by no process until one takes it (mark_owner)
    return _launch(run, run.latest_checkpoint() if resume else None, workers, policy=policy)


def need_of(run: RunDir, machine: HardwareInfo) -> capacity.Need:
    """What ``run`` takes of ``machine`` (engine/capacity.py); capacity.UNKNOWN for a folder whose config cannot be
    read, which then takes its turn alone."""
    try:
        config = run.read_config()
    except ConfigError:
        return capacity.UNKNOWN
    return capacity.need_of(config, machine, run.read_status().get("longest_prompt_tokens"))


def _refuse_if_no_room(run: RunDir, workers: Workers) -> capacity.Need:
    """What ``run`` takes of the machine, if it fits beside the trainings of this app; BusyError if not."""
    running = active_runs()
    if any(handle.run.id == run.id for handle in running):
        raise BusyError(f"The run {run.id} is training already.")
    need = need_of(run, workers.machine)
    if not capacity.fits(workers.machine, [handle.need or capacity.UNKNOWN for handle in running], need,
                         workers.side_by_side):
        names = ", ".join(handle.run.id for handle in running)
        raise BusyError(f"A training is already running ({names}) and this machine has no room for another beside "
                        "it; stop it or wait for it to finish first.")
    return need


def _launch(run: RunDir, resume_from: Path | None, workers: Workers, *, policy: Policy) -> TrainingProcess:
    """Hand the run to a process of ``workers``, which trains it (train_here) while the app serves, held to its
    share of the machine."""
    with _ACTIVE_LOCK:
        need = _refuse_if_no_room(run, workers)
        share = capacity.share_of(run.read_config(), need, workers.machine, workers.side_by_side)
        handle = workers.take(run, resume_from, policy=policy, need=need, share=share)
        _active[:] = [*active_runs(), handle]
        return handle


# ---------------------------------------------------------------------------------------------------------------
# The runner.


def train_here(job: Training, resume_from: Path | None) -> None:
    """Train ``job``'s run in the calling thread, to its end, and leave its final state in its status: the whole
    work of a worker process (engine/worker_main.py) and of ``dragon train``."""
    run = job.run
    run.mark_owner()
    job.started = time.monotonic()
    log_handler = None if run.read_only else _attach_run_log(run)
    now = time.time()
    first_run = not run.read_status().get("started_at")
    if first_run:
        run.update_status(state="running", phase="starting", started_at=now)
    else:  # a resume keeps the first start: the runs list shows it
        run.update_status(state="running", phase="starting", resumed_at=now)
    try:
        config = run.read_config()
        if resume_from is not None:
            log.info("Resuming %s from %s", run.id, resume_from.name)
        outcome = _train(job, config, resume_from)
        # A speed-up that raised while training was switched off: the final status says so.
        run.update_status(state=outcome, phase="done", finished_at=time.time(), eta_s=0, speedups=speedups.status())
        log.info("Run %s %s.", run.id, outcome)
        if outcome == "succeeded" and not run.read_only:
            _write_card(run, config)
    except Stopped:
        log.info("Run %s stopped before training began.", run.id)
        run.update_status(state="cancelled", phase="done", finished_at=time.time(), stop_reason=_time_limit_reason(job))
    except BaseException as exc:  # the runner must never end without saying why
        reason = explain_failure(exc)
        log.error("Run %s failed: %s", run.id, reason)
        run.update_status(state="failed", phase="done", finished_at=time.time(), error=reason,
                          traceback=_traceback_tail(exc))
        if not isinstance(exc, Exception):  # Ctrl+C, SystemExit: marked failed, and still what it was
            raise
    finally:
        run.clear_stop_request()
        if log_handler is not None:
            _detach_run_log(log_handler)
        _free_accelerator_memory()


def _train(handle: Training, config: RunConfig, resume_from: Path | None) -> str:
    """Everything a run does, in order; returns the final state."""
    run = handle.run

    def phase(text: str) -> None:
        if distributed.any_process(handle.should_stop()):
            raise Stopped("stopped before training began")
        run.update_status(phase=text)
        log.info("%s", text[0].upper() + text[1:] + "...")

    phase("checking the hardware")
    hardware = resolve_hardware(config.hardware)  # imports the libraries first
    handle.share.apply(hardware)
    speedups.start_checking()  # once per set of library versions, while the data and the model load
    _use_hardware(hardware, handle.share)
    run.update_status(device=hardware.device, dtype=hardware.dtype, cpu_threads=hardware.cpu_threads,
                      hardware_reasons=hardware.reasons, gpu_name=_gpu_name(hardware))
    for reason in hardware.reasons:
        log.info("Hardware: %s", reason)

    train_rows = read_jsonl(run.train_data_path)
    eval_rows = read_jsonl(run.eval_data_path)
    log.info("Data: %s", run.read_status().get("data_summary") or f"{len(train_rows)} training prompts")
    # Before the model: under ZeRO-3 the training arguments make transformers shard the weights as they load.
    args = grpo_args(config, run, hardware, policy=handle.policy)
    sharded = distributed.shards_weights(config)

    phase("loading the model")
    source = resolve_model(config.model)
    run.update_status(model_label=source.label)
    log.info("Model: %s", source.label)
    dtype = hardware.weights_dtype(config.lora.enabled)
    loaded = None if sharded else take_set_aside(source, hardware, dtype)
    if loaded is not None:
        model, tokenizer = loaded
        log.info("The model was loaded already (the app loaded it before Start).")
    else:
        tokenizer = load_tokenizer(source)
        model = load_model(source, hardware, dtype=dtype, placement=BY_LAUNCHER if sharded else ON_DEVICE)
    rewards = build_rewards(config.rewards, base_dir=config.base_dir or None, training=True, tokenizer=tokenizer,
                            max_new_tokens=config.grpo.max_new_tokens, classifiers=classifiers_on(hardware.device),
                            policy=handle.policy)
    tools = tool_use(config, train_rows + eval_rows, handle.should_stop, policy=handle.policy)
    if tools is not None:
        tokenizer = ready_for_tools(tokenizer, source.label)

    checks = HeldOutChecks(run, config, [] if sharded else eval_rows, rewards, tokenizer, handle.should_stop,
                           distributed.world_size(), tools)
    # The starting model is scored after training where its weights are still there then: with sharded weights
    # (no process holds the whole model), and with LoRA, whose frozen weights are the starting model once the
    # adapter is switched off, so Start is not kept waiting. Only a full fine-tune must score it first.
    if (not sharded and not config.lora.enabled
            and distributed.broadcast_from_main(bool(eval_rows) and "before" not in run.read_eval())):
        phase(f"scoring the starting model on {len(eval_rows)} held-out prompts")
        if not run.read_only:  # the main process evaluates; the others wait for it
            result = evaluate_model(model, tokenizer, eval_rows, rewards, config.grpo.max_new_tokens,
                                    should_stop=handle.should_stop, tools=tools)
            record_eval(run, "before", result, eval_rows, config.n_samples)
            checks.record_start(result)
        distributed.barrier()

    phase("building the trainer")
    from . import progress  # transformers' TrainerCallback: loaded with the trainer, not with the app

    failures = RewardFailures()
    callback = progress.RunStoreCallback(run, handle.should_stop, rewards, failures, config, checks)
    inside_a_step = handle.should_stop if distributed.world_size() == 1 else None  # see _stoppable_forward_passes
    trainer = build_trainer(config, args, model, tokenizer, train_rows, rewards, failures, callback.sampled,
                            inside_a_step, tools)
    callback.trainer = trainer
    trackers.point_at_run(trainer, run)
    trainer.add_callback(callback)
    if resume_from is not None:
        run.truncate_after_step(int(resume_from.name.split("-")[-1]))

    # Until the first step's row, the phase says which part of that (slowest) step runs: see RunStoreCallback.
    run.update_status(phase=progress.FIRST_SAMPLING, speedups=speedups.status(),
                      versions=speedups.library_versions())
    world = distributed.world_size()
    log.info("Training: %d prompts, %d completions per step (%d prompts x %d completions%s).", len(train_rows),
             config.completions_per_step * world, config.training.batch_size * config.training.grad_accum * world,
             config.grpo.group_size, f", over {world} processes" if world > 1 else "")
    try:
        with _stoppable_forward_passes(trainer.model, handle):
            trainer.train(resume_from_checkpoint=str(resume_from) if resume_from else None)
    except Stopped:  # inside a step: its work is dropped, and the last whole step is checkpointed
        callback.stopped = True
        _checkpoint_last_step(trainer, run, config)

    if callback.stopped:
        said = _time_limit_reason(handle)
        if said:
            run.update_status(stop_reason=said)
            log.info("%s", said)
        log.info("Stopped at step %d; checkpoint saved.", trainer.state.global_step)
        return "cancelled"

    run.update_status(phase="saving the trained weights")
    target = run.adapter_dir if config.lora.enabled else run.full_model_dir
    trainer.save_model(str(target))  # every process takes part (sharded weights are gathered); only the main one writes
    if not run.read_only:
        tokenizer.save_pretrained(str(target))
        make_portable(target, config.model)
        log.info("Saved the trained %s to %s", "adapter" if config.lora.enabled else "model", target)
    if eval_rows and sharded:
        del trainer, model, callback  # the shards and their optimiser state leave the GPUs first
        _free_accelerator_memory()
        distributed.barrier()
        if not run.read_only:
            _evaluate_saved_weights(run, policy=handle.policy)
    elif eval_rows and not run.read_only:
        sides = ["before"] if config.lora.enabled and "before" not in run.read_eval() else []
        try:
            for side in [*sides, "after"]:
                which = "starting" if side == "before" else "trained"
                run.update_status(phase=f"scoring the {which} model on {len(eval_rows)} held-out prompts")
                with starting_weights(trainer.model) if side == "before" else contextlib.nullcontext():
                    result = evaluate_model(trainer.model, tokenizer, eval_rows, rewards, config.grpo.max_new_tokens,
                                            should_stop=handle.should_stop, tools=tools)
                record_eval(run, side, result, eval_rows, config.n_samples)
        except Stopped:  # the trained weights are saved: the run is done, its held-out score can be taken later
            why = "the time limit" if handle.out_of_time() else "a stop"
            log.info("The held-out scoring of the %s model ended early (%s); Evaluate now on the Compare tab scores "
                     "it.", which, why)
    distributed.barrier()
    return "succeeded"


def _time_limit_reason(handle: Training) -> str | None:
    """The status's stop_reason when a public demo's time limit ended the run; None when something else did."""
    if handle.time_limit_s is None or not handle.out_of_time():
        return None
    return (f"It reached this public demo's limit of {handle.time_limit_s / 60:g} minutes per run (held-out scoring "
            "included); Resume trains it further (after any runs waiting before it).")


@contextlib.contextmanager
def _stoppable_forward_passes(model, handle: Training):
    """While the trainer trains, raise Stopped at the next forward pass of the model once ``handle.should_stop()``:
    a stop or a time limit then ends a step that samples long completions within moments, instead of after it.

    The hook sits on the causal LM itself (under PEFT's wrapper), which every generated token and every scoring pass
    goes through. Several processes must leave at the same step, so a launched run stops between steps only.
    """
    if distributed.world_size() > 1:
        yield
        return

    def stop_now(module, args):
        if handle.should_stop():
            raise Stopped("stopped inside a training step")

    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    hook = inner.register_forward_pre_hook(stop_now)
    try:
        yield
    finally:
        hook.remove()


def _checkpoint_last_step(trainer, run: RunDir, config: RunConfig) -> None:
    """Save the state after the last whole step, when a stop inside a step left it unsaved. The step that was cut
    short had changed nothing yet (the optimiser steps after every forward pass of a step), so the weights, the
    optimiser and the schedule are exactly those of ``global_step``."""
    step = trainer.state.global_step
    if step == 0 or (run.checkpoints_dir / f"checkpoint-{step}" / "trainer_state.json").is_file():
        return
    from .progress import finish_checkpoint

    trainer._save_checkpoint(trainer.model, trial=None)
    finish_checkpoint(run, config, step)


def _write_card(run: RunDir, config: RunConfig) -> None:
    """The model card beside the trained weights. The weights are what matters: a card that cannot be written is
    a warning in the run's log, not a failed run (the zip, a merge and an upload write it again)."""
    try:
        write_model_card(run, run.adapter_dir if config.lora.enabled else run.full_model_dir)
    except Exception as exc:  # noqa: BLE001 - any failure here leaves a good run good
        log.warning("The model card could not be written: %s", exc)


def _gpu_name(hardware: ResolvedHardware) -> str | None:
    """The GPU's model name for the run's status and model card ("NVIDIA H100 80GB HBM3"), None off CUDA."""
    if hardware.device != "cuda":
        return None
    import torch

    return torch.cuda.get_device_properties(hardware.gpu).name


def _evaluate_saved_weights(run: RunDir, *, policy: Policy) -> None:
    """Score the starting and the trained model from the saved weights, loaded whole on the main process's GPU once
    the sharded trainer has let go of every GPU (the others wait at a barrier).

    A model sharded because it is too big for one GPU may not fit there even to generate; the trained weights are
    saved by then, so that ends with a warning naming the command that scores them elsewhere, not a failed run.
    """
    cache = ModelCache()
    try:
        for message in evaluate_now(cache.load, run, rescore_before="before" not in run.read_eval(),
                                    while_training=True, policy=policy):
            run.update_status(phase=message[0].lower() + message[1:].rstrip("."))
            log.info("%s", message)
    except Exception as exc:
        log.warning("The held-out prompts could not be scored with the model whole on one GPU (%s); the trained "
                    "weights are saved: score them with `python -m dragon_ui eval %s` where there is more memory.",
                    explain_failure(exc), run.path)
    finally:
        cache.release()


def grpo_args(config: RunConfig, run: RunDir, hardware: ResolvedHardware, *, policy: Policy):
    """The RunConfig as TRL's GRPOConfig; TRL's constraints are met here by construction."""
    from trl import GRPOConfig

    group, batch = config.grpo.group_size, config.training.batch_size
    vllm: dict[str, Any] = {}
    if config.generation.backend != "transformers":
        vllm = dict(use_vllm=True, vllm_mode=config.generation.backend.removeprefix("vllm-"),
                    vllm_gpu_memory_utilization=config.generation.vllm_gpu_memory_utilization)
        if config.generation.backend == "vllm-server":
            vllm["vllm_server_base_url"] = config.generation.vllm_server_url
    args = GRPOConfig(
        output_dir=str(run.checkpoints_dir),
        # TRL counts completions, not prompts: batch_size prompts x group_size completions per micro-batch, so the
        # generation batch (this times grad_accum) is always divisible by num_generations.
        per_device_train_batch_size=batch * group,
        gradient_accumulation_steps=config.training.grad_accum,
        num_generations=group,
        learning_rate=config.training.learning_rate,
        num_train_epochs=config.training.epochs,
        max_steps=config.training.max_steps or -1,
        warmup_steps=config.training.warmup_ratio,  # transformers 5 reads a value below 1 as a ratio
        weight_decay=config.training.weight_decay,
        seed=config.training.seed,
        beta=config.grpo.beta,
        temperature=config.grpo.temperature,
        max_completion_length=config.grpo.max_new_tokens,
        loss_type=config.grpo.loss_type,
        scale_rewards=config.grpo.scale_rewards,
        **{name: getattr(config.grpo, name) for name in GRPO_VARIANTS},
        reward_weights=[training_weight(spec) for spec in config.rewards],  # a metric 0; TRL logs each unweighted
        max_tool_calling_iterations=config.grpo.max_tool_calling_iterations if config.tools else None,
        activation_checkpointing=config.training.gradient_checkpointing,
        logging_steps=1,
        save_strategy="steps",
        save_steps=config.training.save_steps,
        save_total_limit=PUBLIC_CHECKPOINTS_KEPT if policy.public else None,
        **trackers.training_arguments(config.logging, run),
        disable_tqdm=True,
        use_cpu=hardware.device == "cpu",
        bf16=hardware.dtype == "bfloat16",
        fp16=hardware.dtype == "float16",
        dataloader_pin_memory=hardware.device == "cuda",
        ddp_timeout=int(distributed.COLLECTIVE_TIMEOUT.total_seconds()),
        **vllm,
    )
    if hardware.device == "cuda" and hardware.gpu is not None and not distributed.is_distributed():
        _train_on_one_gpu(args, hardware.gpu)
    return args


def _train_on_one_gpu(args, gpu: int) -> None:
    """Make a single process train on GPU ``gpu`` alone.

    transformers (5.24, TrainingArguments._setup_devices) gives one process every visible GPU, to be used through
    nn.DataParallel, which TRL's GRPOTrainer refuses, and always puts that process on GPU 0. Its device setup runs
    first (it also builds accelerate's state); then the GPU count becomes 1 and the device the chosen GPU.
    """
    import torch

    if args.n_gpu <= 1 and args.device == torch.device("cuda", gpu):
        return
    args._n_gpu = 1
    args.__dict__["_setup_devices"] = torch.device("cuda", gpu)  # the cached_property behind args.device
    torch.cuda.set_device(gpu)


def build_trainer(config: RunConfig, args, model, tokenizer, train_rows: list[dict], rewards: list[Reward],
                  failures: RewardFailures, on_sampled: Callable[[list, list, list], None] | None = None,
                  should_stop: Callable[[], bool] | None = None, tools: ToolUse | None = None):
    """TRL's GRPOTrainer for this run, with Dragon's rewards, the ``tools`` the model may call (and the environments
    it plays, each scored by the run's environment reward, not by TRL: tool_calls.scoring_episodes) and the speed-ups
    that apply; ``on_sampled(prompts, completions, references)`` hears of each sampled batch before it is scored;
    ``should_stop`` (a stop, a time limit) is asked before each reply is scored."""
    import transformers
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import PrinterCallback

    peft_config = None
    if config.lora.enabled:
        peft_config = LoraConfig(r=config.lora.r, lora_alpha=config.lora.alpha, lora_dropout=config.lora.dropout,
                                 target_modules=config.lora.target_modules, task_type="CAUSAL_LM")
    transformers.set_seed(config.training.seed)  # the LoRA initialisation happens before Trainer seeds itself

    first_batch_seen: set[str] = set()

    def on_batch(name: str, n_scored: int, n_failed: int) -> None:
        """A reward that fails on every completion of its very first batch is broken, not unlucky: stop with its
        error instead of training for hours on a signal of zeros. Later failures only count (see progress rows)."""
        if name in first_batch_seen:
            return
        first_batch_seen.add(name)
        if n_scored and n_failed == n_scored:
            message = failures.first_errors().get(name, "unknown error")
            raise ConfigError(f"The reward '{name}' failed on all {n_scored} completions of the first step, so "
                              f"training stopped; fix the reward and resume. Its error: {message}")

    reward_funcs = trl_reward_functions(rewards, failures, on_batch=on_batch, should_stop=should_stop)
    reward_funcs[0] = _watching_batches(reward_funcs[0], on_sampled)
    environments = tools.trl_environments() if tools else None
    if environments is not None:
        reward_funcs = [scoring_episodes(function) for function in reward_funcs]
    trainer = speedups.grpo_trainer_class()(model=model, reward_funcs=reward_funcs, args=args,
                                            train_dataset=Dataset.from_list(train_rows), processing_class=tokenizer,
                                            peft_config=peft_config, tools=tools.functions if tools else None,
                                            environment_factory=environments)
    speedups.apply_to_trainer_model(trainer.model)
    trainer.remove_callback(PrinterCallback)  # it prints raw log dicts; RunStoreCallback writes readable lines
    # TRL writes a card of its own beside the checkpoints at every save ("fine-tuned version of None"): each
    # checkpoint and the final weights get this run's card instead (progress.finish_checkpoint, _write_card).
    trainer.create_model_card = lambda *args, **kwargs: None
    return trainer


def _watching_batches(reward_func, on_sampled: Callable[[list, list, list], None] | None):
    """Wrap the first reward function, which TRL calls once per sampled batch before any other: the batch's
    references reach TRL's rollout log (trainer._logs['extra']), and ``on_sampled`` sees the batch."""

    def wrapped(prompts, completions, **kwargs):
        references = list(kwargs.get("reference") or [])
        if "log_extra" in kwargs and "reference" in kwargs:
            kwargs["log_extra"]("reference", references)
        if on_sampled is not None:
            on_sampled(prompts, completions, references)
        return reward_func(prompts=prompts, completions=completions, **kwargs)

    wrapped.__name__ = reward_func.__name__
    return wrapped


# ---------------------------------------------------------------------------------------------------------------
# Small helpers.


def explain_failure(exc: BaseException) -> str:
    """One plain sentence for the status file and the UI; the traceback tail is kept separately."""
    if isinstance(exc, DragonError):
        return str(exc)
    name = type(exc).__name__
    if isinstance(exc, MemoryError) or "OutOfMemory" in name or "out of memory" in str(exc).lower():
        return ("The model ran out of memory. Lower training.batch_size, grpo.group_size or grpo.max_new_tokens, "
                "or turn on gradient checkpointing or 4-bit loading.")
    if isinstance(exc, KeyboardInterrupt):
        return "Interrupted by the user (Ctrl+C). Resume continues from the latest checkpoint."
    return describe(exc)


def _traceback_tail(exc: BaseException, lines: int = 12) -> str:
    return "\n".join("".join(traceback.format_exception(exc)).rstrip().splitlines()[-lines:])


def _attach_run_log(run: RunDir) -> logging.Handler:
    """Dragon's lines and the libraries' warnings go to log.txt; Python warnings are routed through logging so the
    real ones (a reward's, TRL's) land there too instead of only on a terminal nobody watches. The process trains
    this run alone: the app's requests (another visitor's, whose errors every visitor of a public demo could read
    here) log in the app's process."""
    handler = logging.FileHandler(run.log_path, encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s", "%H:%M:%S"))
    handler.setLevel(logging.INFO)
    handler.addFilter(lambda record: record.name.startswith(("dragon_ui", "trl", "transformers", "peft",
                                                             "py.warnings")))
    logging.getLogger().addHandler(handler)
    logging.captureWarnings(True)
    if log.getEffectiveLevel() > logging.INFO:
        log.setLevel(logging.INFO)
    return handler


def _detach_run_log(handler: logging.Handler) -> None:
    logging.captureWarnings(False)
    logging.getLogger().removeHandler(handler)
    handler.close()


def _use_hardware(hardware: ResolvedHardware, share: Share) -> None:
    """Set up the training's thread: its torch threads on the CPU; its GPU on CUDA, since a thread's current CUDA
    device starts at GPU 0 whatever accelerate chose for the process's main thread, and its share of that GPU's
    memory, so that it cannot take what the runs beside it were promised (engine/capacity.py)."""
    import torch

    if hardware.device == "cpu":
        torch.set_num_threads(hardware.cpu_threads)
    elif hardware.device == "cuda":
        torch.cuda.set_device(hardware.gpu)
        if share.gpu_memory_fraction is not None:
            torch.cuda.set_per_process_memory_fraction(share.gpu_memory_fraction, hardware.gpu)


def _free_accelerator_memory() -> None:
    import gc

    gc.collect()
    try:
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    except ImportError:
        pass
