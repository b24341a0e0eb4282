"""A one-step dry run: one real training step of a run's own settings, on its longest prompts, in a process of its
own, which says how long the step took and how much memory the process needed at its peak.

An estimate counts; a dry run measures. It uses the run's model, LoRA, precision, gradient checkpointing, group size
and new tokens, and the prompts of one step, the longest the data has (its memory is their worst case). It trains
that step twice and times the second: a process's first step also pays, once, for what every later step reuses
(the first step of the arithmetic recipe took 11.7 s where the run's steps took 5.0); with ``num_iterations`` μ, twice
μ steps, and the time is the mean of the last μ (one of which samples). The process is niced, as a training
process is, and ends with everything it started when the caller stops it, when time runs out, or when the app
that started it ends. It trains in
a temporary folder that is gone when it ends, with no held-out scoring and no trackers, so it touches no run folder
and leaves nothing behind. The peak is what the device's own books say: the process's peak resident memory on the
CPU, ``torch.cuda.max_memory_allocated`` plus the CUDA context on a GPU, the MPS driver's figure on a Mac.

``python -m dragon_ui.engine.dry_run`` is the process; :func:`dry_run` starts it and reads its answer.
"""

from __future__ import annotations

import json
import logging
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import speedups
from ..config import RunConfig
from ..errors import BusyError, DragonError
from ..public import Policy, without_secrets
from ..runstore import RunDir, format_seconds
from ..data import read_jsonl, write_jsonl
from ..system.processes import end_group
from .worker_main import WORKER_NICENESS, stop_when_orphaned

GB = 1024**3
ANSWER = "dry run: "  # the line of the process's output that holds its answer (JSON), after the libraries' logs
STEPS_PER_ITERATION = 2  # the steps that warm up, then the timed ones: each num_iterations steps long


@dataclass(frozen=True)
class DryRun:
    """What one measured step of a run's settings took."""

    step_s: float
    peak_gb: float
    device: str
    peak_is: str  # what the peak counts, in words
    prompts: int  # the step's prompts
    longest_prompt_chars: int
    completion_tokens: float  # the step's completions' mean length: a step's time follows the tokens it samples

    def describe(self) -> str:
        return (f"Dry run: one step of {self.prompts} prompt{'s' if self.prompts != 1 else ''} (the longest, up to "
                f"{self.longest_prompt_chars} characters; replies of {self.completion_tokens:.0f} tokens on average) "
                f"took {format_seconds(self.step_s)} on the {self.device}, after a first step to warm up; peak "
                f"memory {self.peak_gb:.2f} GB ({self.peak_is}).")


def dry_run(config: RunConfig, *, policy: Policy, timeout_s: float = 3600,
            interrupted: Callable[[], str | None] = lambda: None) -> DryRun:
    """Train one step of ``config`` in a process of its own and say what it took; DragonError with the run's own
    sentence where the step could not be trained. ``interrupted``: asked every second, a sentence when the dry run
    must stop now (BusyError with it).

    The run's folder is prepared here, under ``policy`` (its data read as the visitor who asks may read it); the
    process only trains it, and measures."""
    from . import training

    trial = one_step_of(config, policy=policy)
    with tempfile.TemporaryDirectory(prefix="dragon-dry-run-") as folder:
        run = training.prepare(trial, Path(folder) / "run", policy=policy)
        rows = _longest(read_jsonl(run.train_data_path), trial.training.batch_size * trial.training.grad_accum)
        write_jsonl(run.train_data_path, rows * (trial.training.max_steps or 1))  # each step: the longest prompts
        request = json.dumps({"run_dir": str(run.path), "policy": policy.to_json()})
        stdout, stderr, code = _run_measuring(request, without_secrets(dict(os.environ), hub_token=not policy.public),
                                              timeout_s, interrupted)
    answers = [line[len(ANSWER):] for line in stdout.splitlines() if line.startswith(ANSWER)]
    if not answers:
        tail = (stderr or stdout).strip().splitlines()[-3:]
        raise DragonError(f"The dry run's process ended (code {code}) without an answer: " + " ".join(tail))
    answer = json.loads(answers[-1])
    if "error" in answer:
        raise DragonError(f"The dry run's step failed: {answer['error']}")
    return DryRun(**answer, prompts=len(rows),
                  longest_prompt_chars=max((len(_prompt_text(row)) for row in rows), default=0))


def _run_measuring(request: str, environment: dict[str, str], timeout_s: float,
                   interrupted: Callable[[], str | None]) -> tuple[str, str, int]:
    """The measuring process's output and exit code, once it has ended; it and all it started end at once when
    ``interrupted`` says why or the time runs out."""
    process = subprocess.Popen([sys.executable, "-m", __name__], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, env=environment, start_new_session=True)
    deadline = time.monotonic() + timeout_s
    given: str | None = request  # written once: a later call only goes on reading the output
    while True:
        try:
            stdout, stderr = process.communicate(given, timeout=1)
            return stdout, stderr, process.returncode
        except subprocess.TimeoutExpired:
            given = None
            why = (f"The dry run took more than {format_seconds(timeout_s)}; the step is longer than that, or it hung."
                   if time.monotonic() > deadline else interrupted())
            if why:
                end_group(process, hard=True)
                process.communicate()
                raise BusyError(why) from None


def one_step_of(config: RunConfig, *, policy: Policy) -> RunConfig:
    """``config`` as a dry run trains it: the timed steps and as many before them that warm up, no checkpoint before
    it ends, no held-out prompts, no trackers."""
    data = config.to_dict()
    data["training"].update(max_steps=STEPS_PER_ITERATION * config.grpo.num_iterations, save_steps=10**7,
                            eval_every=0)
    data["data"]["eval_frac"] = 0
    data["logging"]["report_to"] = []
    return RunConfig.from_dict(data, base_dir=config.base_dir or None, policy=policy, load_code=False)


def measure(run: RunDir, *, policy: Policy) -> dict[str, Any]:
    """The prepared run's steps, trained in this process (which it should have to itself: its peak is the answer):
    the timed step's time, its replies' mean length, and the peak memory."""
    from . import training

    job = training.Training(run, policy=policy)
    threading.Thread(target=stop_when_orphaned, args=(os.getppid(), job), name="dragon-orphaned", daemon=True).start()
    training.train_here(job, None)
    status = run.read_status()
    if status.get("state") != "succeeded":
        raise DragonError(status.get("error") or f"the step ended {status.get('state')}")
    progress = run.read_progress()
    timed = progress[len(progress) // 2:]  # after as many steps that warmed up
    times = [seconds for row in timed if (seconds := row.get("step_time_s")) is not None]
    if not times or len(times) < len(timed):
        raise DragonError("the step logged no time")
    device = str(status.get("device", "cpu"))
    peak_gb, peak_is = peak_memory(device)
    return {"step_s": sum(times) / len(times), "peak_gb": peak_gb, "device": device, "peak_is": peak_is,
            "completion_tokens": float(timed[-1].get("completion_len") or 0.0)}


def _longest(rows: list[dict[str, Any]], wanted: int) -> list[dict[str, Any]]:
    """The ``wanted`` rows with the longest prompts, in their order."""
    chosen = sorted(range(len(rows)), key=lambda index: -len(_prompt_text(rows[index])))[:max(1, wanted)]
    return [rows[index] for index in sorted(chosen)]


def _prompt_text(row: dict[str, Any]) -> str:
    prompt = row.get("prompt")
    if isinstance(prompt, list):
        return "".join(str(message.get("content", "")) for message in prompt if isinstance(message, dict))
    return str(prompt or "")


def peak_memory(device: str) -> tuple[float, str]:
    """This process's peak memory in GB, as the device's own books keep it, and what that counts in words."""
    if device == "cuda":
        import torch

        free, total = torch.cuda.mem_get_info()
        context = max(0, total - free - torch.cuda.memory_reserved())  # and whatever else uses the GPU
        return ((torch.cuda.max_memory_allocated() + context) / GB,
                "torch.cuda.max_memory_allocated plus the CUDA context")
    if device == "mps":
        import torch

        return torch.mps.driver_allocated_memory() / GB, "the MPS driver's allocated memory at the end"
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    peak_bytes = peak if sys.platform == "darwin" else peak * 1024  # macOS says bytes, Linux kilobytes
    return peak_bytes / GB, "the process's peak resident memory"


def main() -> int:
    """The dry run's process: the request (the prepared run's folder, the policy) on standard input, the answer on
    a line of standard output that starts with ANSWER."""
    if sys.platform.startswith("linux"):
        os.nice(WORKER_NICENESS)  # as a training process: the app's server stays responsive
    speedups.choose(os.environ.get(speedups.ENV, ""))  # the app's choice, as its training processes make it
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S", stream=sys.stderr)
    request = json.loads(sys.stdin.read())
    try:
        answer = measure(RunDir(Path(request["run_dir"])), policy=Policy.from_json(request["policy"]))
    except DragonError as error:
        answer = {"error": str(error)}
    print(ANSWER + json.dumps(answer), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
