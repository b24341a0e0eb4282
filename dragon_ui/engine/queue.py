"""The run queue: one training at a time per machine, and every other run waiting its turn in the runs folder.

A run started (or resumed) while another trains is prepared at once, so its mistakes are found while its owner is
there to read them, and then waits in state ``queued`` with ``"waiting": "start"`` (or ``"resume"``) and the time it
joined (``queued_at``) in its status.json. A :class:`Scheduler` thread starts the oldest waiting run whenever
nothing trains, with nobody's browser open; the queue is the runs folder itself, so it survives a restart of the
app. A workshop's shared machine and a public Space use it alike.
"""

from __future__ import annotations

import contextlib
import logging
import math
import threading
import time
from collections.abc import Callable
from pathlib import Path

from ..config import RunConfig
from ..errors import BusyError
from ..public import Policy, Visitor
from ..runstore import RunDir, list_runs
from . import public_checks, training
from .workers import Workers

log = logging.getLogger("dragon_ui")

_lock = threading.Lock()  # one decision at a time between "start it now" and "queue it"
_preparing: list[Visitor] = []  # the visitors whose runs are being prepared (_place)


def training_run_id(runs_dir: Path) -> str | None:
    """The run training on this machine now: in this process, or (seen through the runs folder) in another one."""
    handle = training.active_run()
    if handle is not None:
        return handle.run.id
    for summary in list_runs(runs_dir):
        if summary["state"] == "running" or (summary["state"] == "queued" and not summary.get("waiting")):
            return summary["id"]
    return None


def waiting_runs(runs_dir: Path) -> list[RunDir]:
    """The runs waiting their turn, first in line first."""
    waiting = [summary for summary in list_runs(runs_dir) if summary["state"] == "queued" and summary.get("waiting")]
    return [RunDir(Path(summary["dir"])) for summary in sorted(waiting, key=lambda s: s.get("queued_at") or 0)]


def _free(runs_dir: Path) -> bool:
    """Nothing trains and nobody waits: a new run may start at once."""
    return training_run_id(runs_dir) is None and not waiting_runs(runs_dir)


def submit_start(config: RunConfig, *, policy: Policy, workers: Workers) -> RunDir:
    """Start ``config`` now if nothing trains and nobody waits, or else put it in the queue; either way its mistakes
    are raised here and its folder exists when this returns.

    Preparing it (reading the data, counting its prompts in tokens) happens outside the queue's lock, so a slow one
    holds up nobody else's Start or Stop: it holds a place while it is prepared (_place), joins the queue as it is
    written, and starts at once if it is first in line with nothing training.
    """
    runs_dir = config.resolved_runs_dir()
    with _place(runs_dir, policy=policy):
        run = training.prepare(config, waiting=True, policy=policy)
    with _lock:
        waiting = waiting_runs(runs_dir)
        if training_run_id(runs_dir) is None and waiting and waiting[0].id == run.id:
            return training.start_prepared(run, policy=policy, workers=workers).run
    return run


def submit_resume(run_dir: Path, *, policy: Policy, workers: Workers) -> RunDir:
    """Resume the run now if nothing trains and nobody waits, or else put it back in the queue."""
    run = training.check_resumable(run_dir, policy=policy)
    with _lock:
        _refuse_if_full(run.path.parent, policy=policy)
        public_checks.take_start(run.path.parent, _preparing, policy=policy)
        if _free(run.path.parent):
            return training.resume(run.path, policy=policy, workers=workers).run
        run.update_status(state="queued", waiting="resume", queued_at=time.time(), phase="waiting for its turn",
                          error=None, traceback=None, finished_at=None, stop_reason=None)
        return run


@contextlib.contextmanager
def _place(runs_dir: Path, *, policy: Policy):
    """A place in line for the asking visitor's run while it is prepared: the limits count it from the moment it
    is checked (under the lock), so starts sent at the same moment cannot all pass. It counts as a start at once,
    whether its preparation succeeds or not: reading the visitor's data is most of what a start costs."""
    who = policy.visitor
    with _lock:
        _refuse_if_full(runs_dir, policy=policy)
        public_checks.take_start(runs_dir, _preparing, policy=policy)
        _preparing.append(who)
    try:
        yield
    finally:
        with _lock:
            _preparing.remove(who)


def take_out(run: RunDir) -> None:
    """Take a waiting run out of the queue; it stays, stopped, to be resumed (queued again) later."""
    with _lock:
        if run.read_status().get("waiting"):
            run.update_status(state="cancelled", waiting=None, phase="done", finished_at=time.time(),
                              stop_reason="It was taken out of the queue before its turn came.")


def start_next(runs_dir: Path, before_start: Callable[[], object] | None = None, *, policy: Policy,
               workers: Workers) -> RunDir | None:
    """Start the first waiting run if nothing trains (after ``before_start``: the app lets go of its preview model);
    a run that cannot start is marked failed with the reason, and the next one gets its turn at the next call."""
    with _lock:
        if training_run_id(runs_dir) is not None:
            return None
        waiting = waiting_runs(runs_dir)
        if not waiting:
            return None
        run = waiting[0]
        resume = run.read_status().get("waiting") == "resume"
        if before_start is not None:
            before_start()
        try:
            return training.start_waiting(run, resume=resume, policy=policy, workers=workers).run
        except Exception as exc:  # a waiting run must never block the queue
            log.error("The queued run %s could not start: %s", run.id, exc)
            run.update_status(state="failed", waiting=None, phase="done", finished_at=time.time(),
                              error=f"It could not start when its turn came: {exc}")
            return None


def _refuse_if_full(runs_dir: Path, *, policy: Policy) -> None:
    """In a public demo, refuse to queue one run more than its limit of runs waiting (those being prepared count).
    A class's runs wait within the class's own total instead (public_checks.take_start), so a class of 25 fills the
    queue of nobody without a seat."""
    if policy.limits is None or policy.visitor.seat:
        return
    limit = policy.limits.queue_length
    waiting = [run for run in waiting_runs(runs_dir) if not run.read_status().get("seat")]
    if len(waiting) + sum(not other.seat for other in _preparing) >= limit:
        raise BusyError(f"The queue is full: {limit} runs are already waiting, this public demo's limit of runs "
                        "waiting in the queue. Try again when one of them has started, or run Dragon GRPO Studio on "
                        "your own machine (make run).")


class Scheduler:
    """A daemon thread that starts the next waiting run whenever nothing trains (every ``interval_s`` seconds, after
    ``before_start``), under ``policy``, in a process of ``workers``, and runs ``housekeeping`` (a public
    demo's clean-up of old runs and files) every ``housekeeping_every_s``."""

    def __init__(self, runs_dir: Path, interval_s: float = 2.0, housekeeping: Callable[[], object] | None = None,
                 housekeeping_every_s: float = 600.0, before_start: Callable[[], object] | None = None, *,
                 policy: Policy, workers: Workers) -> None:
        self.runs_dir, self.interval_s, self.policy, self.workers = runs_dir, interval_s, policy, workers
        self.housekeeping, self.housekeeping_every_s = housekeeping, housekeeping_every_s
        self.before_start = before_start
        self.rounds = 0  # times it has looked at the queue (tests wait for it instead of for the clock)
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="dragon-queue", daemon=True)

    def start(self) -> Scheduler:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopped.set()
        self._thread.join(timeout=10)

    def _loop(self) -> None:
        kept_house = -math.inf
        while not self._stopped.wait(self.interval_s):
            try:
                start_next(self.runs_dir, self.before_start, policy=self.policy, workers=self.workers)
            except Exception:  # the queue must outlive any one bad run folder
                log.exception("The run queue could not start the next run")
            self.rounds += 1
            if self.housekeeping is not None and time.monotonic() - kept_house >= self.housekeeping_every_s:
                kept_house = time.monotonic()
                try:
                    self.housekeeping()
                except Exception:
                    log.exception("Cleaning up old runs and files failed")
