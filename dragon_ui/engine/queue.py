"""The run queue: every run waiting its turn in the runs folder, and on a shared machine (a public demo's) as many
training side by side as the machine has room for (engine/capacity.py: one at a time under 8 cores, and on your own
machine).

A run started (or resumed) while the machine is full is prepared at once, so its mistakes are found while its owner
is there to read them, and then waits in state ``queued`` with ``"waiting": "start"`` (or ``"resume"``) and the time
it joined (``queued_at``) in its status.json. A :class:`Scheduler` thread starts the waiting runs, first in line
first, whenever the machine has room for the next (one that does not fit holds up those behind it: nobody jumps the
line), with nobody's browser open; the queue is the runs folder itself, so it survives a restart of the app, and so
does a pause (a teacher's: :func:`pause`), a file there. A workshop's shared machine and a public Space use it alike.
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
from . import capacity, public_checks, training
from .workers import Workers

log = logging.getLogger("dragon_ui")

PAUSED_FILE = ".queue_paused"  # in the runs folder, while the queue is paused

_lock = threading.Lock()  # one decision at a time between "start it now" and "queue it"
_preparing: list[Visitor] = []  # the visitors whose runs are being prepared (_place)


def training_run_ids(runs_dir: Path) -> list[str]:
    """The runs training on this machine now: in this process, or (seen through the runs folder) in another one."""
    return [run.id for run in _line(runs_dir)[0]]


def waiting_runs(runs_dir: Path) -> list[RunDir]:
    """The runs waiting their turn, first in line first."""
    return _line(runs_dir)[1]


def _line(runs_dir: Path, summaries: list[dict] | None = None) -> tuple[list[RunDir], list[RunDir]]:
    """(the runs training on this machine, the runs waiting first in line first), from one reading of the runs
    folder (``summaries``, where the caller has read it). A run handed to a training process that has not marked it
    running yet trains already."""
    summaries = list_runs(runs_dir) if summaries is None else summaries
    training_now = [handle.run for handle in training.active_runs()]
    ids = {run.id for run in training_now}
    training_now += [RunDir(Path(summary["dir"])) for summary in summaries if summary["id"] not in ids and (
        summary["state"] == "running" or (summary["state"] == "queued" and not summary.get("waiting")))]
    waiting = [summary for summary in summaries if _is_waiting(summary)]
    return training_now, [RunDir(Path(summary["dir"])) for summary in sorted(waiting, key=lambda s: s.get("queued_at") or 0)]


def _is_waiting(summary: dict) -> bool:
    """Whether a run (list_runs's summary of it) waits in the queue."""
    return summary["state"] == "queued" and bool(summary.get("waiting"))


def _needs(runs: list[RunDir], workers: Workers) -> list[capacity.Need]:
    """What each of ``runs`` (training) takes of the machine: as handed to its process, for this app's."""
    handed = {handle.run.id: handle.need for handle in training.active_runs()}
    return [handed.get(run.id) or training.need_of(run, workers.machine) for run in runs]


def _room_for(run: RunDir, training_now: list[RunDir], workers: Workers) -> bool:
    """Whether the machine has room for ``run`` beside the runs ``training_now``, the queue not being paused."""
    if paused(run.path.parent):
        return False
    machine = workers.machine
    return capacity.fits(machine, _needs(training_now, workers), training.need_of(run, machine), workers.side_by_side)


def submit_start(config: RunConfig, before_start: Callable[[], object] | None = None, *, policy: Policy,
                 workers: Workers) -> RunDir:
    """Start ``config`` now if nobody waits and the machine has room for it (after ``before_start``: the app lets
    go of its preview model), or else put it in the queue; either way its mistakes are raised here and its folder
    exists when this returns.

    Preparing it (reading the data, counting its prompts in tokens) happens outside the queue's lock, so a slow one
    holds up nobody else's Start or Stop: it holds a place while it is prepared (_place), joins the queue as it is
    written, and starts at once if it is first in line with room for it.
    """
    runs_dir = config.resolved_runs_dir()
    with _place(runs_dir, policy=policy):
        run = training.prepare(config, waiting=True, policy=policy)
    with _lock:
        training_now, waiting = _line(runs_dir)
        if waiting and waiting[0].id == run.id and _room_for(run, training_now, workers):
            if before_start is not None:
                before_start()
            return training.start_prepared(run, policy=policy, workers=workers).run
    return run


def submit_resume(run_dir: Path, before_start: Callable[[], object] | None = None, *, policy: Policy,
                  workers: Workers) -> RunDir:
    """Resume the run now if nobody waits and the machine has room for it (after ``before_start``), or else put it
    back in the queue."""
    run = training.check_resumable(run_dir, policy=policy)
    with _lock:
        _refuse_if_full(run.path.parent, policy=policy)
        public_checks.take_start(run.path.parent, _preparing, policy=policy)
        if policy.public and run.read_status().get("owner") == policy.visitor.key:  # its starter's, counted as now:
            run.update_status(seat=policy.visitor.seat or None,  # their seat (within the class's total), or
                              owner_address=policy.visitor.address)  # their network address, seat or none
        training_now, waiting = _line(run.path.parent)
        if not waiting and _room_for(run, training_now, workers):
            if before_start is not None:
                before_start()
            return training.resume(run.path, policy=policy, workers=workers).run
        run.update_status(state="queued", waiting="resume", queued_at=time.time(), phase="waiting for its turn",
                          error=None, traceback=None, finished_at=None, stop_reason=None)
        return run


def expected_starts(runs_dir: Path, seconds_left: Callable[[RunDir], float | None], summaries: list[dict] | None = None,
                    *, workers: Workers) -> dict[str, tuple[int, float | None]]:
    """Every waiting run's (place in line, seconds until it should start; None: not known, or the queue is paused),
    by id: the queue played forward by the rule it starts runs by (capacity.expected_starts), with each run's
    ``seconds_left`` (a run training: what it has left; a waiting one: all it should train). ``summaries``: the runs
    folder as the caller read it (list_runs)."""
    training_now, waiting = _line(runs_dir, summaries)
    if not waiting:
        return {}
    if paused(runs_dir):
        return {run.id: (place, None) for place, run in enumerate(waiting, start=1)}
    machine = workers.machine
    starts = capacity.expected_starts(
        machine, [(need, seconds_left(run)) for run, need in zip(training_now, _needs(training_now, workers))],
        [(run.id, training.need_of(run, machine), seconds_left(run)) for run in waiting], workers.side_by_side)
    return {run.id: (place, starts[run.id]) for place, run in enumerate(waiting, start=1)}


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
        _take_out(run)


def _take_out(run: RunDir) -> None:
    if run.read_status().get("waiting"):
        run.update_status(state="cancelled", waiting=None, phase="done", finished_at=time.time(),
                          stop_reason="It was taken out of the queue before its turn came.")


def start_next(runs_dir: Path, before_start: Callable[[], object] | None = None, *, policy: Policy,
               workers: Workers) -> list[RunDir]:
    """Start the waiting runs, first in line first, while the machine has room for the next (after ``before_start``:
    the app lets go of its preview model); the runs started. One that does not fit holds up those behind it, and a
    paused queue starts none. A run that cannot start is marked failed with the reason, and the next one gets its
    turn at the next call."""
    started: list[RunDir] = []
    with _lock:
        training_now, waiting = _line(runs_dir)
        if not waiting or paused(runs_dir):
            return started
        machine = workers.machine
        needs = _needs(training_now, workers)
        for run in waiting:
            need = training.need_of(run, machine)
            if not capacity.fits(machine, needs, need, workers.side_by_side):
                break
            resume = run.read_status().get("waiting") == "resume"
            if before_start is not None and not started:
                before_start()
            try:
                started.append(training.start_waiting(run, resume=resume, policy=policy, workers=workers).run)
            except Exception as exc:  # a waiting run must never block the queue
                log.error("The queued run %s could not start: %s", run.id, exc)
                run.update_status(state="failed", waiting=None, phase="done", finished_at=time.time(),
                                  error=f"It could not start when its turn came: {exc}")
                break
            needs.append(need)
    return started


def pause(runs_dir: Path) -> None:
    """Start no waiting run until resume_queue, the running ones going on: a teacher holds the queue (a file in the
    runs folder, so the pause outlasts a restart of the app)."""
    runs_dir.mkdir(parents=True, exist_ok=True)
    (runs_dir / PAUSED_FILE).touch()


def resume_queue(runs_dir: Path) -> None:
    """End a pause: the waiting runs start again, first in line first, as the machine has room for them."""
    (runs_dir / PAUSED_FILE).unlink(missing_ok=True)


def paused(runs_dir: Path) -> bool:
    """Whether the queue is paused (pause): a Start then queues even on an idle machine."""
    return (runs_dir / PAUSED_FILE).is_file()


def stop_all(runs_dir: Path) -> list[str]:
    """Take every waiting run of ``runs_dir`` out of the queue and ask every one training to stop (each keeps its
    checkpoints, to be resumed): a teacher ends the session at once. The ids of the runs it stopped or took out."""
    with _lock:
        training_now, waiting = _line(runs_dir)
        for run in waiting:
            _take_out(run)
        folder = runs_dir.resolve()
        stopping = [run for run in training_now if run.path.parent.resolve() == folder]
        for run in stopping:
            run.request_stop()  # what Stop does, whichever process trains it (TrainingProcess.stop)
    return [run.id for run in [*waiting, *stopping]]


def _refuse_if_full(runs_dir: Path, *, policy: Policy) -> None:
    """In a public demo, refuse to queue one run more than its limit of runs waiting (those being prepared count).
    A class's runs wait within the class's own total instead (public_checks.take_start), so a class of 25 fills the
    queue of nobody without a seat."""
    if policy.limits is None or policy.visitor.seat:
        return
    limit = policy.limits.queue_length
    waiting = [summary for summary in list_runs(runs_dir) if _is_waiting(summary) and not summary.get("seat")]
    if len(waiting) + sum(not other.seat for other in _preparing) >= limit:
        raise BusyError(f"The queue is full: {limit} runs are already waiting, this public demo's limit of runs "
                        "waiting in the queue. Try again when one of them has started, or run Dragon GRPO Studio on "
                        "your own machine (make run).")


class Scheduler:
    """A daemon thread that starts the waiting runs whenever the machine has room for them (start_next, every
    ``interval_s`` seconds, after ``before_start``), under ``policy``, in processes of ``workers``, and runs
    ``housekeeping`` (a public demo's clean-up of old runs and files) every ``housekeeping_every_s``."""

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
