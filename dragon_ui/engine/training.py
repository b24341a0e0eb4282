"""GRPO training in a background thread, writing everything it does into the run directory.

``start(config)`` returns a :class:`RunHandle` at once; a worker thread loads data and model, scores the starting
model on held-out prompts, runs TRL's ``GRPOTrainer`` (the algorithm is TRL's, not ours) and scores the trained
model. A :class:`RunStoreCallback` turns TRL's logs into ``progress.jsonl`` / ``rollouts.jsonl`` rows and honours
stop requests. Only one training runs per process: a model this size already takes the whole machine.

Failure policy: every exception ends the run as ``failed`` with a readable reason; checkpoints already written stay;
``resume(run_dir)`` continues from the latest one with step count, optimiser and schedule intact.
"""

from __future__ import annotations

import contextlib
import logging
import math
import threading
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

from transformers import PrinterCallback, TrainerCallback

from .. import speedups
from ..config import GRPO_VARIANTS, RunConfig
from .reward_models import check_labels, classifiers_on
from ..data import MappedData, load_and_map, read_jsonl, write_jsonl
from ..errors import BusyError, ConfigError, DragonError, Stopped, describe
from ..public import Limits, is_public_demo, visitor
from ..rewards import Reward, RewardFailures, build_rewards, completion_text, last_user_text, trl_reward_functions
from ..runstore import ACTIVE_STATES, RunDir
from ..scaleout import distributed
from . import policy, trackers
from .evaluation import HeldOutChecks, evaluate_model, evaluate_now, record_eval
from .hardware import ResolvedHardware, release_openmp_threads, resolve_hardware
from .model_card import write_model_card
from .weights import make_portable
from .models import BY_LAUNCHER, ON_DEVICE, ModelCache, load_model, load_tokenizer, resolve_model
from .prompts import PromptFit, context_length, fit_prompts, prompt_limit

log = logging.getLogger("dragon_ui")

_ACTIVE_LOCK = threading.Lock()
_active: RunHandle | None = None


PUBLIC_CHECKPOINTS_KEPT = 2  # a public demo keeps a run's newest checkpoints only: the disk is everyone's


class RunHandle:
    """A training started in this process: its run directory, its thread, a thread-safe stop, and (in a public
    demo) the time limit that ends it, counted from the moment its thread starts."""

    def __init__(self, run: RunDir, time_limit_s: float | None = None) -> None:
        self.run = run
        self.stop_event = threading.Event()
        self.thread: threading.Thread | None = None
        self.time_limit_s = time_limit_s
        self.started = time.monotonic()  # set again when the worker starts

    @property
    def run_dir(self) -> Path:
        return self.run.path

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

    def is_alive(self) -> bool:
        return self.thread is not None and self.thread.is_alive()

    def wait(self, timeout: float | None = None) -> str:
        if self.thread is not None:
            self.thread.join(timeout)
        return self.run.read_status().get("state", "unknown")


def active_run() -> RunHandle | None:
    """The training running in this process, if any (the UI re-attaches to it after a page reload)."""
    return _active if _active is not None and _active.is_alive() else None


def start(config: RunConfig, run_dir: str | Path | None = None) -> RunHandle:
    """Check the data, rewards and hardware, create the run directory and train in a background thread.

    Mistakes that can be found without loading a model raise ConfigError here, before any folder is created; so
    does a setting a public demo refuses. The returned handle's thread does the slow part (model loading, baseline
    scoring, training).
    """
    _refuse_if_busy()
    run = prepare(config, run_dir)
    return _launch(run, config, resume_from=None)


@dataclass
class Inspection:
    """What a run would train on, found without loading any weights: the data (the prompts the model cannot read
    already dropped), what counting the prompts found, and the hardware it would use."""

    mapped: MappedData
    prompts: PromptFit
    hardware: ResolvedHardware


def inspect(config: RunConfig) -> Inspection:
    """Every check a run passes before it trains (the public demo's, the data's, the prompts', the rewards'), with
    what they found; ConfigError with the sentence to show at the first that fails. ``check`` prints it."""
    policy.check_run(config)
    hardware = resolve_hardware(config.hardware)
    distributed.check_runnable_here(config, hardware.device)
    mapped = load_and_map(config.data, base_dir=config.base_dir or None)
    source = resolve_model(config.model)
    limit, why = prompt_limit(config, hardware.device, context_length(source))
    mapped, prompts = fit_prompts(mapped, load_tokenizer(source), limit, why)
    if len(mapped.train) < config.training.batch_size:
        held_out = (f" ({len(mapped.eval)} more are held out for the before/after comparison; data.eval_frac 0 "
                    "trains on them too)") if mapped.eval else ""
        raise ConfigError(f"Only {len(mapped.train)} training prompts{held_out}, fewer than training.batch_size "
                          f"({config.training.batch_size}); add rows or lower the batch size.")
    build_rewards(config.rewards, base_dir=config.base_dir or None, max_new_tokens=config.grpo.max_new_tokens)
    for index, spec in enumerate(config.rewards):
        if spec.kind == "classifier":
            check_labels(spec, f"rewards[{index}]")
    trackers.check(config.logging)
    return Inspection(mapped, prompts, hardware)


def prepare(config: RunConfig, run_dir: str | Path | None = None, waiting: bool = False) -> RunDir:
    """Everything of ``start`` but the training: the checks, then the run folder with its config and its mapped
    data, in state queued; ``waiting``: in the queue (``queue.py``), from the moment its status is written, which is
    the last thing done here."""
    mapped = inspect(config).mapped
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
        in_line = {"waiting": "start", "queued_at": time.time()} if waiting else {}
        run.update_status(state="queued", step=0, total_steps=None, created_at=time.time(),
                          phase="waiting for its turn" if waiting else "waiting to start",
                          owner=visitor().key, owner_address=visitor().address, **in_line,
                          reward_names=[spec.name for spec in config.rewards], data_summary=mapped.summary(),
                          n_train=len(mapped.train), n_eval=len(mapped.eval), n_skipped=mapped.n_skipped,
                          world_size=distributed.world_size())
        path = str(run.path)
    path = distributed.broadcast_from_main(path)
    return RunDir(Path(path), read_only=not distributed.is_main_process())


def resume(run_dir: str | Path) -> RunHandle:
    """Continue a stopped, failed or interrupted run from its latest checkpoint (or from the start if it has none)."""
    run = check_resumable(run_dir)
    _refuse_if_busy()
    checkpoint = run.latest_checkpoint()
    distributed.barrier()  # every process has read the state before the main one changes it
    run.clear_stop_request()
    run.update_status(state="queued", phase="waiting to resume", error=None, traceback=None, finished_at=None,
                      stop_reason=None)
    return _launch(run, run.read_config(), resume_from=checkpoint)


def check_resumable(run_dir: str | Path) -> RunDir:
    """The run, if it can be resumed (raises BusyError or ConfigError with the reason otherwise)."""
    run = RunDir(Path(run_dir), read_only=not distributed.is_main_process())
    policy.check_run(run.read_config(), reads_data=False)  # its data was read (and checked) when it started
    state = run.read_status().get("state")
    if state in ACTIVE_STATES:
        raise BusyError(f"The run {run.id} is still {state}; stop it before resuming.")
    if state == "succeeded":
        raise ConfigError(f"The run {run.id} already finished; start a new run from it instead (use it as the model).")
    return run


def start_waiting(run: RunDir, resume: bool) -> RunHandle:
    """Train a run that waited in the queue: from its start, or (``resume``) from its latest checkpoint."""
    _refuse_if_busy()
    run.clear_stop_request()
    run.update_status(waiting=None, phase="waiting to resume" if resume else "waiting to start", stop_reason=None)
    return _launch(run, run.read_config(), resume_from=run.latest_checkpoint() if resume else None)


def _refuse_if_busy() -> None:
    running = active_run()
    if running is not None:
        raise BusyError(f"A training is already running ({running.run.id}); stop it or wait for it to finish first.")


def _launch(run: RunDir, config: RunConfig, resume_from: Path | None) -> RunHandle:
    global _active
    release_openmp_threads()  # this thread's idle torch workers would slow every step (see the function)
    handle = RunHandle(run, Limits.from_env().run_minutes * 60 if is_public_demo() else None)
    with _ACTIVE_LOCK:
        _refuse_if_busy()
        handle.thread = threading.Thread(target=_worker, args=(handle, config, resume_from), name=f"dragon-train-{run.id}",
                                         daemon=True)
        _active = handle
        run.mark_owner()
        handle.thread.start()
    return handle


# ---------------------------------------------------------------------------------------------------------------
# The worker thread.


def _worker(handle: RunHandle, config: RunConfig, resume_from: Path | None) -> None:
    run = handle.run
    handle.started = time.monotonic()
    log_handler = None if run.read_only else _attach_run_log(run)
    now = time.time()
    first_run = not run.read_status().get("started_at")  # a resume keeps the first start: the runs list shows it
    run.update_status(state="running", phase="starting", **{"started_at" if first_run else "resumed_at": now})
    try:
        if resume_from is not None:
            log.info("Resuming %s from %s", run.id, resume_from.name)
        outcome = _train(handle, config, resume_from)
        # A speed-up that raised while training was switched off: the final status says so.
        run.update_status(state=outcome, phase="done", finished_at=time.time(), eta_s=0, speedups=speedups.status())
        log.info("Run %s %s.", run.id, outcome)
        if outcome == "succeeded" and not run.read_only:
            _write_card(run, config)
    except Stopped:
        log.info("Run %s stopped before training began.", run.id)
        run.update_status(state="cancelled", phase="done", finished_at=time.time(), **_time_limit_reason(handle))
    except BaseException as exc:  # the thread must never die without saying why
        reason = explain_failure(exc)
        log.error("Run %s failed: %s", run.id, reason)
        run.update_status(state="failed", phase="done", finished_at=time.time(), error=reason,
                          traceback=_traceback_tail(exc))
    finally:
        run.clear_stop_request()
        if log_handler is not None:
            _detach_run_log(log_handler)
        _free_accelerator_memory()


def _train(handle: RunHandle, config: RunConfig, resume_from: Path | None) -> str:
    """Everything a run does, in order; returns the final state."""
    run = handle.run

    def phase(text: str) -> None:
        if distributed.any_process(handle.should_stop()):
            raise Stopped("stopped before training began")
        run.update_status(phase=text)
        log.info("%s", text[0].upper() + text[1:] + "...")

    phase("checking the hardware")
    hardware = resolve_hardware(config.hardware)
    _use_hardware(hardware)
    run.update_status(device=hardware.device, dtype=hardware.dtype, cpu_threads=hardware.cpu_threads,
                      hardware_reasons=hardware.reasons, gpu_name=_gpu_name(hardware))
    for reason in hardware.reasons:
        log.info("Hardware: %s", reason)

    train_rows = read_jsonl(run.train_data_path)
    eval_rows = read_jsonl(run.eval_data_path)
    log.info("Data: %s", run.read_status().get("data_summary") or f"{len(train_rows)} training prompts")
    # Before the model: under ZeRO-3 the training arguments make transformers shard the weights as they load.
    args = grpo_args(config, run, hardware)
    sharded = distributed.shards_weights(config)

    phase("loading the model")
    source = resolve_model(config.model)
    run.update_status(model_label=source.label)
    log.info("Model: %s", source.label)
    tokenizer = load_tokenizer(source)
    rewards = build_rewards(config.rewards, base_dir=config.base_dir or None, training=True, tokenizer=tokenizer,
                            max_new_tokens=config.grpo.max_new_tokens, classifiers=classifiers_on(hardware.device))
    model = load_model(source, hardware, dtype=hardware.weights_dtype(config.lora.enabled),
                       placement=BY_LAUNCHER if sharded else ON_DEVICE)

    checks = HeldOutChecks(run, config, [] if sharded else eval_rows, rewards, tokenizer, handle.should_stop,
                           distributed.world_size())
    # With sharded weights no process holds the whole model, so both sides are scored after training instead.
    if not sharded and distributed.broadcast_from_main(bool(eval_rows) and "before" not in run.read_eval()):
        phase(f"scoring the starting model on {len(eval_rows)} held-out prompts")
        if not run.read_only:  # the main process evaluates; the others wait for it
            result = evaluate_model(model, tokenizer, eval_rows, rewards, config.grpo.max_new_tokens,
                                    should_stop=handle.should_stop)
            record_eval(run, "before", result, eval_rows, config.n_samples)
            checks.record_start(result)
        distributed.barrier()

    phase("building the trainer")
    failures = RewardFailures()
    trainer = build_trainer(config, args, model, tokenizer, train_rows, rewards, failures)
    trackers.point_at_run(trainer, run)
    callback = RunStoreCallback(run, trainer, handle, rewards, failures, config, checks)
    trainer.add_callback(callback)
    if resume_from is not None:
        run.truncate_after_step(int(resume_from.name.split("-")[-1]))

    run.update_status(phase="training", speedups=speedups.status(), versions=speedups.library_versions())
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
            run.update_status(**said)
            log.info("%s", said["stop_reason"])
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
            _evaluate_saved_weights(run)
    elif eval_rows and not run.read_only:
        run.update_status(phase=f"scoring the trained model on {len(eval_rows)} held-out prompts")
        try:
            result = evaluate_model(trainer.model, tokenizer, eval_rows, rewards, config.grpo.max_new_tokens,
                                    should_stop=handle.should_stop)
            record_eval(run, "after", result, eval_rows, config.n_samples)
        except Stopped:  # the trained weights are saved: the run is done, its held-out score can be taken later
            why = "the time limit" if handle.out_of_time() else "a stop"
            log.info("The held-out scoring of the trained model ended early (%s); Evaluate now on the Compare tab "
                     "scores it.", why)
    distributed.barrier()
    return "succeeded"


def _time_limit_reason(handle: RunHandle) -> dict:
    """The status's stop_reason when a public demo's time limit ended the run; {} when something else did."""
    if not handle.out_of_time():
        return {}
    return {"stop_reason": f"It reached this public demo's limit of {handle.time_limit_s / 60:g} minutes per run "
                           "(held-out scoring included); Resume trains it further (after any runs waiting before "
                           "it)."}


@contextlib.contextmanager
def _stoppable_forward_passes(model, handle: RunHandle):
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
    trainer._save_checkpoint(trainer.model, trial=None)
    _finish_checkpoint(run, config, step)


def _finish_checkpoint(run: RunDir, config: RunConfig, step: int) -> None:
    """Make a saved checkpoint what it claims to be, since people upload checkpoints too: its adapter config names
    the starting model by Hub id (not this machine's folder) and its README is this run's model card, not PEFT's
    blank template. Then the status names it as the latest."""
    folder = run.checkpoints_dir / f"checkpoint-{step}"
    try:
        make_portable(folder, config.model)
        write_model_card(run, folder, curve=False)
    except Exception as exc:  # noqa: BLE001 - the weights are saved; a card that cannot be written is a warning
        log.warning("The model card of checkpoint-%d could not be written: %s", step, exc)
    run.update_status(latest_checkpoint=f"checkpoint-{step}")


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


def _evaluate_saved_weights(run: RunDir) -> None:
    """Score the starting and the trained model from the saved weights, loaded whole on the main process's GPU once
    the sharded trainer has let go of every GPU (the others wait at a barrier).

    A model sharded because it is too big for one GPU may not fit there even to generate; the trained weights are
    saved by then, so that ends with a warning naming the command that scores them elsewhere, not a failed run.
    """
    cache = ModelCache()
    try:
        for message in evaluate_now(cache.load, run, rescore_before="before" not in run.read_eval(),
                                    while_training=True):
            run.update_status(phase=message[0].lower() + message[1:].rstrip("."))
            log.info("%s", message)
    except Exception as exc:
        log.warning("The held-out prompts could not be scored with the model whole on one GPU (%s); the trained "
                    "weights are saved: score them with `python -m dragon_ui eval %s` where there is more memory.",
                    explain_failure(exc), run.path)
    finally:
        cache.release()


def grpo_args(config: RunConfig, run: RunDir, hardware: ResolvedHardware):
    """The RunConfig as TRL's GRPOConfig; TRL's constraints are met here by construction."""
    from trl import GRPOConfig

    group, batch = config.grpo.group_size, config.training.batch_size
    vllm = {}
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
        reward_weights=[spec.weight for spec in config.rewards],  # TRL's per-reward metrics stay unweighted
        activation_checkpointing=config.training.gradient_checkpointing,
        logging_steps=1,
        save_strategy="steps",
        save_steps=config.training.save_steps,
        save_total_limit=PUBLIC_CHECKPOINTS_KEPT if is_public_demo() else None,
        **trackers.training_arguments(config.logging, run),
        disable_tqdm=True,
        use_cpu=hardware.device == "cpu",
        bf16=hardware.dtype == "bfloat16",
        fp16=hardware.dtype == "float16",
        dataloader_pin_memory=hardware.device == "cuda",
        ddp_timeout=int(distributed.COLLECTIVE_TIMEOUT.total_seconds()),
        **vllm,
    )
    if hardware.device == "cuda" and not distributed.is_distributed():
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
                  failures: RewardFailures):
    """TRL's GRPOTrainer for this run, with Dragon's rewards and the speed-ups that apply."""
    import transformers
    from datasets import Dataset
    from peft import LoraConfig

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

    reward_funcs = trl_reward_functions(rewards, failures, on_batch=on_batch)
    reward_funcs[0] = _logging_references(reward_funcs[0])
    trainer = speedups.grpo_trainer_class()(model=model, reward_funcs=reward_funcs, args=args,
                                            train_dataset=Dataset.from_list(train_rows), processing_class=tokenizer,
                                            peft_config=peft_config)
    speedups.apply_to_trainer_model(trainer.model)
    trainer.remove_callback(PrinterCallback)  # it prints raw log dicts; RunStoreCallback writes readable lines
    # TRL writes a card of its own beside the checkpoints at every save ("fine-tuned version of None"): each
    # checkpoint and the final weights get this run's card instead (_finish_checkpoint, _write_card).
    trainer.create_model_card = lambda *args, **kwargs: None
    return trainer


def _logging_references(reward_func):
    """Wrap one reward function so each batch's references reach TRL's rollout log (trainer._logs['extra'])."""

    def wrapped(prompts, completions, **kwargs):
        if "log_extra" in kwargs and "reference" in kwargs:
            kwargs["log_extra"]("reference", list(kwargs["reference"]))
        return reward_func(prompts=prompts, completions=completions, **kwargs)

    wrapped.__name__ = reward_func.__name__
    return wrapped


# ---------------------------------------------------------------------------------------------------------------
# The callback: TRL's logs -> run directory, and cooperative stopping.


class StepPace:
    """How long steps take, from the times their rows are logged. The log shows the latest step, not a running
    average that the slow first step (loading, warm-up) keeps high for the whole run; the ETA goes by the steps after
    the first one logged, once there are any."""

    def __init__(self, start_step: int, started_at: float) -> None:
        self._first: tuple[int, float] | None = None
        self._last = (start_step, started_at)

    def logged(self, step: int, now: float) -> tuple[float, float]:
        """(seconds each step since the last row took, seconds a step takes for the ETA)."""
        last_step, last_at = self._last
        latest = (now - last_at) / max(1, step - last_step)
        self._first, self._last = self._first or (step, now), (step, now)
        first_step, first_at = self._first
        return latest, (now - first_at) / (step - first_step) if step > first_step else latest


# What TRL logs about a sampled batch (its rewards, lengths and spread), only on the step that samples it.
BATCH_METRICS = ("reward", "rewards/", "completions/", "frac_reward_zero_std")


class RunStoreCallback(TrainerCallback):
    """Writes one progress row and the sampled groups per step; ends training between steps on a stop that arrives
    between forward passes (one inside a step ends it sooner: _stoppable_forward_passes).

    Only the main process writes (under ``accelerate launch`` every process runs this callback), and the rollouts
    are read from ``trainer._logs``, which TRL fills with the batch it just trained on before calling ``on_log``.
    """

    def __init__(self, run: RunDir, trainer, handle: RunHandle, rewards: list[Reward], failures: RewardFailures,
                 config: RunConfig, checks: HeldOutChecks) -> None:
        self.run, self.trainer, self.handle = run, trainer, handle
        self.rewards, self.failures, self.config, self.checks = rewards, failures, config, checks
        self.stopped = False
        self._session_start = time.monotonic()
        self._pace = StepPace(0, self._session_start)
        self._elapsed_before = 0.0
        self._reported_errors: set[str] = set()
        self._batch: dict | None = None  # the metrics TRL logged with the last sampled batch

    def on_train_begin(self, args, state, control, **kwargs):
        self._pace = StepPace(state.global_step, self._session_start)
        self._elapsed_before = float(self.run.read_status().get("elapsed_s") or 0.0) if state.global_step else 0.0
        self.checks.begin(state.max_steps)
        if state.is_world_process_zero:
            self.run.update_status(step=state.global_step, total_steps=state.max_steps)

    def on_step_end(self, args, state, control, **kwargs):
        if distributed.any_process(self.handle.should_stop()):  # all leave at the same step
            self.stopped = True
            control.should_training_stop = True
            control.should_save = True
        elif state.global_step >= state.max_steps:
            control.should_save = True  # the last step always leaves a checkpoint, whatever save_steps says

    def on_save(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            _finish_checkpoint(self.run, self.config, state.global_step)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not logs or ("reward" not in logs and ("loss" not in logs or self._batch is None)):
            return  # the end-of-training summary and eval logs carry no step
        reused = "reward" not in logs  # with num_iterations > 1: a step trained again on the last sampled batch
        if reused:  # TRL logs a batch's rewards and lengths where it samples it; they are this step's batch too
            logs = {**self._batch, **logs}
        else:
            self._batch = {key: value for key, value in logs.items() if key.startswith(BATCH_METRICS)}
        local_errors = [self.failures.counts().get(r.name, 0) for r in self.rewards]
        errors = dict(zip((r.name for r in self.rewards), distributed.sum_over_processes(local_errors)))
        if not state.is_world_process_zero:
            return
        step, total = state.global_step, state.max_steps
        groups = self._groups()
        now = time.monotonic()
        elapsed_session = now - self._session_start
        last_step_s, per_step = self._pace.logged(step, now)
        eta = per_step * max(0, total - step)
        row = {
            "step": step,
            "epoch": round(state.epoch or 0.0, 4),
            "elapsed_s": round(self._elapsed_before + elapsed_session, 2),
            "eta_s": round(eta, 1),
            "loss": logs.get("loss"),
            "lr": logs.get("learning_rate"),
            "kl": logs.get("kl"),
            "reward": logs.get("reward"),
            "reward_std": logs.get("reward_std"),
            **{f"reward_{r.name}": logs.get(f"rewards/{r.name}/mean") for r in self.rewards},
            "completion_len": logs.get("completions/mean_length"),
            "clipped_ratio": logs.get("completions/clipped_ratio"),
            "frac_reward_zero_std": zero_spread_share(groups),
            "step_time_s": logs.get("step_time"),
            "peak_gpu_mem_gb": _peak_gpu_memory_gb(),
            "world_size": distributed.world_size(),
            "completions_per_step": self.config.completions_per_step * distributed.world_size(),
            **{f"errors_{r.name}": errors[r.name] for r in self.rewards},
        }
        if reused:
            row["reused_batch"] = True
        row = {k: _finite_or_none(v) for k, v in row.items()}
        self.run.append_progress(row)
        if not reused:  # the viewer keeps showing the batch this step trained on
            self.run.append_rollouts({"step": step, "groups": groups})
        self.run.update_status(step=step, total_steps=total, eta_s=row["eta_s"], elapsed_s=row["elapsed_s"],
                               reward=row["reward"], reward_errors={k: v for k, v in errors.items() if v})
        log.info("step %d/%d  reward %s  kl %s  len %s  (%.1f s/step, ETA %s)", step, total,
                 _log_number(row["reward"]), _log_number(row["kl"]), _log_number(row["completion_len"]),
                 last_step_s, _fmt_duration(eta))
        for name, message in self.failures.first_errors().items():
            if name not in self._reported_errors:
                self._reported_errors.add(name)
                log.warning("Reward '%s' failed on some completions (scored 0); first error: %s", name, message)
        if self.checks.due(step, total):
            try:
                self.checks.check(self.trainer.model, step)
            except Stopped:  # a stop or the time limit during the check: the step itself is done, so it is saved
                self.stopped = True
                control.should_training_stop = control.should_save = True

    def _groups(self) -> list[dict]:
        logs = self.trainer._logs
        prompts, completions, advantages = list(logs["prompt"]), list(logs["completion"]), list(logs["advantages"])
        references = list(logs["extra"].get("reference", []))
        per_reward = {r.name: list(logs["rewards"].get(r.name, [])) for r in self.rewards}
        group_size = self.config.grpo.group_size
        groups = []
        for start in range(0, len(prompts), group_size):
            items = []
            for i in range(start, min(start + group_size, len(prompts))):
                scores = {name: _finite_or_none(values[i]) if i < len(values) else None for name, values in per_reward.items()}
                total = sum((scores[r.name] or 0.0) * r.weight for r in self.rewards)
                items.append({"text": completion_text(completions[i]), "scores": scores, "total": round(total, 6),
                              "advantage": _finite_or_none(advantages[i]) if i < len(advantages) else None})
            groups.append({"prompt": last_user_text(prompts[start]),
                           "reference": references[start] if start < len(references) else "",
                           "completions": items})
        return groups


def zero_spread_share(groups: list[dict]) -> float | None:
    """The share of a step's groups whose completions all scored the same weighted total: GRPO learns nothing from
    them. Read from the totals the run wrote, to a relative tolerance: TRL's own frac_reward_zero_std compares the
    float32 spread with zero at an absolute 1e-8, so rounding in a weighted total (1.0 + 0.3) hides such groups."""
    spreads = []
    for group in groups:
        totals = [item["total"] for item in group["completions"] if isinstance(item.get("total"), (int, float))]
        if len(totals) > 1:
            spreads.append(max(totals) - min(totals) <= 1e-6 * max(1.0, *(abs(total) for total in totals)))
    return sum(spreads) / len(spreads) if spreads else None


# ---------------------------------------------------------------------------------------------------------------
# Small helpers.


def explain_failure(exc: BaseException) -> str:
    """One plain sentence for the status file and the UI; the traceback tail is kept separately."""
    if isinstance(exc, DragonError):
        return str(exc)
    name = type(exc).__name__
    if "OutOfMemory" in name or "out of memory" in str(exc).lower():
        return ("The model ran out of memory. Lower training.batch_size, grpo.group_size or grpo.max_new_tokens, "
                "or turn on gradient checkpointing or 4-bit loading.")
    if isinstance(exc, KeyboardInterrupt):
        return "Interrupted by the user (Ctrl+C). Resume continues from the latest checkpoint."
    return describe(exc)


def _traceback_tail(exc: BaseException, lines: int = 12) -> str:
    return "\n".join("".join(traceback.format_exception(exc)).rstrip().splitlines()[-lines:])


def _attach_run_log(run: RunDir) -> logging.Handler:
    """Dragon's lines and the libraries' warnings go to log.txt; Python warnings are routed through logging so the
    real ones (a reward's, TRL's) land there too instead of only on a terminal nobody watches.

    Only what the training's own thread logs: every visitor of a public demo can read a run's log, and the app's
    other threads (another visitor's request, the queue) log their errors to the server's log alone."""
    handler = logging.FileHandler(run.log_path, encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s", "%H:%M:%S"))
    handler.setLevel(logging.INFO)
    training_thread = threading.get_ident()
    handler.addFilter(lambda record: record.thread == training_thread and record.name.startswith(
        ("dragon_ui", "trl", "transformers", "peft", "py.warnings")))
    logging.getLogger().addHandler(handler)
    logging.captureWarnings(True)
    if log.getEffectiveLevel() > logging.INFO:
        log.setLevel(logging.INFO)
    return handler


def _detach_run_log(handler: logging.Handler) -> None:
    logging.captureWarnings(False)
    logging.getLogger().removeHandler(handler)
    handler.close()


def _use_hardware(hardware: ResolvedHardware) -> None:
    """Set up the worker thread: its torch threads on the CPU; its GPU on CUDA, since a thread's current CUDA
    device starts at GPU 0 whatever accelerate chose for the process's main thread."""
    import torch

    if hardware.device == "cpu":
        torch.set_num_threads(hardware.cpu_threads)
    elif hardware.device == "cuda":
        torch.cuda.set_device(hardware.gpu)


def _peak_gpu_memory_gb() -> float | None:
    import torch

    return round(torch.cuda.max_memory_allocated() / 2**30, 3) if torch.cuda.is_available() else None


def _free_accelerator_memory() -> None:
    import gc

    gc.collect()
    try:
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    except ImportError:
        pass


def _finite_or_none(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _log_number(value) -> str:
    """A score in a log line: three decimals, "-" when there is none."""
    return "-" if value is None else f"{value:.3f}"


def _fmt_duration(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600}h{seconds // 60 % 60:02d}m" if seconds >= 3600 else f"{seconds // 60}m{seconds % 60:02d}s"
