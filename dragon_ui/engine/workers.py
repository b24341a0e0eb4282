"""The app's trainings, each in a process of its own: an out-of-memory kill, a native crash or a stuck library in a
run ends that process, and the web server goes on serving everyone. The run folder is how the two talk: the worker
writes the run's status, progress and checkpoints there, the app reads them, and a stop is the run folder's stop
request, which every process honours.

A worker is started *warm* (:class:`Workers`): it imports the training libraries, detects the hardware and loads the
app's default model, then waits on its standard input. Start hands it a run (one line of JSON: the run folder, the
checkpoint to resume from, the policy it trains under, its share of the machine: engine/capacity.py) and it trains at
once. Several runs may train side by side, each in a worker of its own: the warm one goes to the first, the others
start fresh. The next worker warms up once no run trains any more, so it never takes cores or memory from a
training. The app waits for each worker to end (:meth:`TrainingProcess.wait`): one that ends while its run still
reads as active has its run marked failed, with why.

``python -m dragon_ui.engine.worker_main`` is the worker itself; the command line and ``accelerate launch``
train in their own process already, with the same runner (``training.train_here``).

Our own settings (``DRAGON_UI_*``) are read when they are used, so they travel with each run (the job) and a warm
worker takes the app's values of now; the libraries read theirs as they import, so a worker warmed under other
ones is let go and a fresh one started.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO, TYPE_CHECKING

from ..config import HardwareSettings, ModelConfig
from ..public import Policy, without_secrets
from ..runstore import ACTIVE_STATES, RunDir, read_json
from ..system.processes import end_group

if TYPE_CHECKING:
    from .capacity import Need, Share
    from .hardware import HardwareInfo

log = logging.getLogger("dragon_ui")

WORKER_MODULE = "dragon_ui.engine.worker_main"
STOP_GRACE_S = 60  # how long a closing app waits for a stopped training to save its last step
# How long a training asked to stop (Stop, or a public demo's time limit) may take to end before it is ended: a
# stop acts at the next forward pass or reward, so only something that never returns (a reward, a library) is late.
WATCHDOG_GRACE_S = 60
END_GRACE_S = 10  # between asking a late worker to end (SIGTERM) and killing it (SIGKILL)


OWN_SETTINGS = "DRAGON_UI_"  # the environment variables of ours, which a job carries (see the module's docstring)


class TrainingProcess:
    """A run training in a worker process: what the app holds of it, and what it takes of the machine (``need``,
    engine/capacity.py)."""

    def __init__(self, run: RunDir, process: subprocess.Popen, time_limit_s: float | None = None,
                 need: Need | None = None) -> None:
        self.run, self.process, self.need = run, process, need
        self.ended = threading.Event()  # set once the process has ended and its run's state says so
        self.time_limit_s = time_limit_s  # a public demo's, counted from now
        self.started = time.monotonic()

    def stop(self) -> None:
        """Ask the training to stop at its next forward pass; it saves the last whole step."""
        self.run.request_stop()

    def is_alive(self) -> bool:
        return not self.ended.is_set()

    def asked_to_stop(self) -> bool:
        """Whether the training was asked to stop: Stop was pressed, or its time limit has passed."""
        out_of_time = self.time_limit_s is not None and time.monotonic() - self.started >= self.time_limit_s
        return out_of_time or self.run.stop_requested()

    def wait(self, timeout: float | None = None) -> str:
        self.ended.wait(timeout)
        return self.run.read_status().get("state", "unknown")


def _exit_reason(code: int) -> str:
    """Why a worker ended before its run did, in words (a negative code is the signal that ended it)."""
    if code == -signal.SIGKILL:
        return ("The training process was killed (SIGKILL), most often by the system because the machine ran out "
                "of memory; lower the batch size, the group size or max new tokens.")
    if code < 0:
        return f"The training process ended on signal {signal.Signals(-code).name}."
    return f"The training process ended with exit code {code} before its run was done."


class Workers:
    """The app's training processes (thread-safe): the one warm worker, and those training. ``env`` adds to the
    workers' environment; without ``hub_token`` (a public demo's) a worker has none of the app's Hugging Face tokens,
    nor its login's. ``side_by_side`` (a public demo's, a workshop's shared machine): runs train side by side where
    ``machine`` has room for them (engine/capacity.py; this machine's when not given, a test gives a simulated one);
    elsewhere one at a time, each with the whole machine."""

    def __init__(self, env: dict[str, str] | None = None, hub_token: bool = True,
                 machine: HardwareInfo | None = None, side_by_side: bool = False) -> None:
        self.env = env or {}
        self.hub_token = hub_token
        self.side_by_side = side_by_side
        self._machine = machine
        self.preload: tuple[ModelConfig, HardwareSettings] | None = None
        self._lock = threading.Lock()
        self._warm: subprocess.Popen | None = None
        self._training: set[TrainingProcess] = set()
        self._warm_libraries: dict[str, str] = {}  # the libraries' settings the warm worker started with
        self._closed = False

    @property
    def machine(self) -> HardwareInfo:
        from .hardware import this_machine

        return self._machine or this_machine()

    def warm(self, preload: tuple[ModelConfig, HardwareSettings] | None = None) -> None:
        """Start a worker warming up, unless one is, a run trains (the last to end warms it) or the app is closing.
        ``preload``: the model and hardware settings it (and every later one) loads while it waits, the app's
        default, so a Start of it trains at once."""
        with self._lock:
            self.preload = preload or self.preload
            if self._warm is None and not self._training and not self._closed:
                self._warm = self._spawn()

    def _environment(self) -> dict[str, str]:
        """A worker's environment: the app's, but the owner key, which no training needs (and the Hub tokens,
        without hub_token)."""
        return {**without_secrets(dict(os.environ), hub_token=self.hub_token), **self.env}

    def _spawn(self) -> subprocess.Popen:
        """A worker, started now with the environment of now."""
        preload = None if self.preload is None else {"model": vars(self.preload[0]), "hardware": vars(self.preload[1])}
        environment = self._environment()
        self._warm_libraries = _libraries_settings(environment)
        return subprocess.Popen([sys.executable, "-m", WORKER_MODULE, json.dumps(preload)], stdin=subprocess.PIPE,
                                env=environment, text=True,
                                start_new_session=True)  # a Ctrl+C in the app's terminal is for the app to handle

    def take(self, run: RunDir, resume_from: Path | None, *, policy: Policy, need: Need | None = None,
             share: Share | None = None) -> TrainingProcess:
        """Hand ``run`` to the warm worker (starting one if there is none, or if it warmed under other settings of
        the libraries) and return at once; the worker marks the run its own and trains it, held to ``share`` of
        the machine (taking ``need`` of it). The next worker warms up when no run trains any more."""
        environment = self._environment()
        stale = None
        with self._lock:
            process, self._warm = self._warm, None
            if process is not None and self._warm_libraries != _libraries_settings(environment):
                stale, process = process, None
            if process is None or process.poll() is not None:  # none yet, or it died warming up (its log says why)
                process = self._spawn()
            handle = TrainingProcess(run, process, policy.limits.run_minutes * 60 if policy.limits else None, need)
            self._training.add(handle)  # from now no worker warms up (warm) until it has ended
        if stale is not None:  # outside the lock: it ends once it has warmed up
            _let_go(stale)
        job = {"run_dir": str(run.path), "resume_from": str(resume_from) if resume_from else None,
               "policy": policy.to_json(), "share": share.to_json() if share is not None else None,
               "settings": {key: value for key, value in environment.items() if key.startswith(OWN_SETTINGS)}}
        run.mark_owner(process.pid)  # from now: the status the last worker left names a process that has ended
        try:
            _input(process).write(json.dumps(job) + "\n")
            _input(process).close()
        except OSError:  # it died while it waited: the watch below says how
            pass
        threading.Thread(target=self._watch, args=(handle,), name=f"dragon-watch-{run.id}", daemon=True).start()
        return handle

    def _watch(self, handle: TrainingProcess) -> None:
        """Wait for the worker to end (which also frees its process entry, so its pid reads as gone), ending it
        once it is WATCHDOG_GRACE_S late to stop; mark its run stopped if it was ended so, failed if it ended
        before its run did; and warm the next one once no run trains."""
        code, late = self._waited(handle)
        try:
            # The status as written: read_status would see the process gone and say so without knowing how.
            status = read_json(handle.run.status_path, default={}) or {}
            if status.get("state") in ACTIVE_STATES:
                checkpoint = handle.run.latest_checkpoint()
                after = (f"Resume continues from its {checkpoint.name}." if checkpoint is not None else
                         "It had saved no checkpoint yet, so Resume starts it again.")
                if late:
                    handle.run.update_status(state="cancelled", phase="done", finished_at=time.time(),
                                             stop_reason=f"It did not stop within {WATCHDOG_GRACE_S} s of being "
                                                         f"asked to (a reward or a library that never returned), "
                                                         f"so its training process was ended. {after}")
                    log.error("Run %s: its training process was ended, %d s late to stop.", handle.run.id,
                              WATCHDOG_GRACE_S)
                else:
                    handle.run.update_status(state="failed", phase="done", finished_at=time.time(),
                                             error=f"{_exit_reason(code)} {after}")
                    log.error("Run %s failed: its training process ended (%s).", handle.run.id, code)
        finally:
            handle.ended.set()
            with self._lock:
                self._training.discard(handle)
            self.warm()

    @staticmethod
    def _waited(handle: TrainingProcess) -> tuple[int, bool]:
        """(the worker's exit code, whether it was ended for being late to stop), once it has ended."""
        asked = None
        while True:
            with contextlib.suppress(subprocess.TimeoutExpired):
                return handle.process.wait(timeout=1), False
            if asked is None and handle.asked_to_stop():
                asked = time.monotonic()
            if asked is not None and time.monotonic() - asked > WATCHDOG_GRACE_S:
                end_group(handle.process, hard=False)  # the worker and what it started (its own session)
                try:
                    return handle.process.wait(END_GRACE_S), True
                except subprocess.TimeoutExpired:
                    end_group(handle.process, hard=True)
                    return handle.process.wait(), True

    def close(self) -> None:
        """The app is closing: let the warm worker go, and warm no other."""
        with self._lock:
            self._closed = True
            waiting, self._warm = self._warm, None
        if waiting is not None:
            _let_go(waiting)


def _libraries_settings(environment: dict[str, str]) -> dict[str, str]:
    """What of ``environment`` a worker reads as it warms up: everything but our own settings, which travel with
    each job."""
    return {key: value for key, value in environment.items() if not key.startswith(OWN_SETTINGS)}


def _input(process: subprocess.Popen) -> IO[str]:
    """A worker's input: every worker is spawned with a pipe there (Workers._spawn)."""
    assert process.stdin is not None
    return process.stdin


def _let_go(process: subprocess.Popen) -> None:
    """End a warm worker that will train nothing. It holds no run, so it is ended at once, in the middle of its
    warm-up too: an empty line on its input would be read only once that is done (seconds more on a busy machine)."""
    with contextlib.suppress(OSError):
        _input(process).close()
    end_group(process, hard=False)
    try:
        process.wait(END_GRACE_S)
    except subprocess.TimeoutExpired:
        end_group(process, hard=True)
        process.wait()
