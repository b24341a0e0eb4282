"""TRL's logs as the run directory's rows: a progress row and the sampled groups per step, checkpoints that say
what they are, and stops honoured between steps.

Its own module because the callback subclasses transformers' TrainerCallback: ``engine.training`` imports it when a
run starts, so the app's server answers before transformers and torch are loaded (they take seconds).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from typing import Any

from transformers import TrainerCallback

from ..config import RunConfig
from ..errors import Stopped
from ..grpo_math import no_spread_share, weighted_total
from ..chat import completion_text, last_user_text
from ..rewards import Reward, RewardFailures
from ..runstore import RunDir, excerpt, recorded_turns
from ..scaleout import distributed
from .evaluation import HeldOutChecks
from .model_card import write_model_card
from .weights import make_portable

log = logging.getLogger("dragon_ui")

# The run's phase through its first step, which also warms everything up: sampling, then scoring and learning.
FIRST_SAMPLING = "training: sampling the first step's completions"
FIRST_LEARNING = "training: scoring the first step's completions and learning from them"


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

    def __init__(self, run: RunDir, should_stop: Callable[[], bool], rewards: list[Reward],
                 failures: RewardFailures, config: RunConfig, checks: HeldOutChecks) -> None:
        self.run, self.should_stop = run, should_stop  # a stop asked for, or the time limit reached (training.Training)
        self.trainer: Any = None  # the trainer is built with this callback's ``sampled``; it is set right after
        self._sampled_once = False
        self.rewards, self.failures, self.config, self.checks = rewards, failures, config, checks
        self.stopped = False
        self._session_start = time.monotonic()
        self._pace = StepPace(0, self._session_start)
        self._elapsed_before = 0.0
        self._reported_errors: set[str] = set()
        self._batch: dict | None = None  # the metrics TRL logged with the last sampled batch

    def sampled(self, prompts: list, completions: list, references: list) -> None:
        """The batch TRL has just sampled, before it is scored and trained on (sampling.json): the Train tab shows
        the first step's completions while that step still runs, instead of only once it ends."""
        group_size = self.config.grpo.group_size
        groups = [{"prompt": excerpt(last_user_text(prompts[start])),
                   "reference": excerpt(references[start] if start < len(references) else ""),
                   "completions": [completion_text(c) for c in completions[start:start + group_size]],
                   **self._sampled_turns(completions[start:start + group_size])}
                  for start in range(0, len(prompts), group_size)]
        self.run.write_sampling({"step": self.trainer.state.global_step + 1, "groups": groups})
        if not self._sampled_once:  # the training set FIRST_SAMPLING; the rest of that step learns
            self._sampled_once = True
            self.run.update_status(phase=FIRST_LEARNING)

    @staticmethod
    def _sampled_turns(completions: list) -> dict:
        """sampling.json's turns of a group's completions, only where one called a tool (a list beside the texts)."""
        turns = [recorded_turns(completion) for completion in completions]
        return {"turns": turns} if any(turns) else {}

    def on_train_begin(self, args, state, control, **kwargs):
        self._pace = StepPace(state.global_step, self._session_start)
        self._elapsed_before = float(self.run.read_status().get("elapsed_s") or 0.0) if state.global_step else 0.0
        self.checks.begin(state.max_steps)
        if state.is_world_process_zero:
            self.run.update_status(step=state.global_step, total_steps=state.max_steps)

    def on_step_end(self, args, state, control, **kwargs):
        if distributed.any_process(self.should_stop()):  # all leave at the same step
            self.stopped = True
            control.should_training_stop = True
            control.should_save = True
        elif state.global_step >= state.max_steps:
            control.should_save = True  # the last step always leaves a checkpoint, whatever save_steps says

    def on_save(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            finish_checkpoint(self.run, self.config, state.global_step)

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
            "rewards": {r.name: finite_or_none(logs.get(f"rewards/{r.name}/mean")) for r in self.rewards},
            "completion_len": logs.get("completions/mean_length"),
            "clipped_ratio": logs.get("completions/clipped_ratio"),
            "no_spread_share": no_spread_share([c["total"] for c in g["completions"]] for g in groups),
            "step_time_s": logs.get("step_time"),
            "peak_gpu_mem_gb": peak_gpu_memory_gb(),
            "world_size": distributed.world_size(),
            "completions_per_step": self.config.completions_per_step * distributed.world_size(),
            **({"tool_calls": logs.get("tools/call_frequency"), "tool_failures": logs.get("tools/failure_frequency")}
               if self.config.tools else {}),
            "errors": {r.name: errors[r.name] for r in self.rewards},
        }
        if reused:
            row["reused_batch"] = True
        row = {k: finite_or_none(v) for k, v in row.items()}
        self.run.append_progress(row)
        if not reused:  # the viewer keeps showing the batch this step trained on
            self.run.append_rollouts({"step": step, "groups": groups})
        self.run.update_status(phase="training", step=step, total_steps=total, eta_s=row["eta_s"], elapsed_s=row["elapsed_s"],
                               reward=row["reward"], reward_errors={k: v for k, v in errors.items() if v})
        log.info("step %d/%d  reward %s  kl %s  len %s  (%.1f s/step, ETA %s)", step, total,
                 log_number(row["reward"]), log_number(row["kl"]), log_number(row["completion_len"]),
                 last_step_s, format_duration(eta))
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
        group_size, weights = self.config.grpo.group_size, {r.name: r.weight for r in self.rewards}
        groups = []
        for start in range(0, len(prompts), group_size):
            items = []
            for i in range(start, min(start + group_size, len(prompts))):
                scores = {name: finite_or_none(values[i]) if i < len(values) else None for name, values in per_reward.items()}
                total = weighted_total(scores, weights)
                item = {"text": completion_text(completions[i]), "scores": scores,
                        "total": None if total is None else round(total, 6),
                        "advantage": finite_or_none(advantages[i]) if i < len(advantages) else None}
                turns = recorded_turns(completions[i])
                items.append(item if turns is None else {**item, "turns": turns})
            groups.append({"prompt": excerpt(last_user_text(prompts[start])),
                           "reference": excerpt(references[start] if start < len(references) else ""),
                           "completions": items})
        return groups


def finish_checkpoint(run: RunDir, config: RunConfig, step: int) -> None:
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


def peak_gpu_memory_gb() -> float | None:
    import torch

    return round(torch.cuda.max_memory_allocated() / 2**30, 3) if torch.cuda.is_available() else None


def finite_or_none(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def log_number(value) -> str:
    """A score in a log line: three decimals, "-" when there is none."""
    return "-" if value is None else f"{value:.3f}"


def format_duration(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600}h{seconds // 60 % 60:02d}m" if seconds >= 3600 else f"{seconds // 60}m{seconds % 60:02d}s"
