"""The app's runs: start, queue, stop and resume them, find one by id, and say whose each is.

Which runs a visitor may change is the policy's rule (public.Policy.owns); this is where the app asks it.
"""

from __future__ import annotations

import functools
import math
import re
import threading
import time
from collections.abc import Callable

from ..config import DEFAULT_MODEL_ID, Draft
from ..data import is_bundled, is_hub_dataset_id
from ..engine import public_checks, queue, retention, training
from ..engine.estimate import estimate_run
from ..engine.hardware import HardwareInfo, resolve_hardware
from ..engine.workers import TrainingProcess, Workers
from ..errors import ConfigError, DragonError, NotYoursError
from ..public import Policy
from ..rewards import public_refusal
from ..runstore import RunDir, format_seconds, list_runs
from .draft import ordinal
from .files import Files
from .previews import Previews
from .recipes import Recipes

RUN_ID = re.compile(r"[A-Za-z0-9._-]{1,120}")  # a run folder's name (runstore.RunDir.create makes them so)
ESTIMATED_START_S = 60  # loading the model and scoring it on the held-out prompts, before a run's first step
EXPECTED_STARTS_S = 2.0  # how long the queue's expected starts are shown before they are worked out again


class Runs:
    """The runs in ``recipes.runs_dir``; each trains in a process of ``workers``."""

    def __init__(self, recipes: Recipes, previews: Previews, files: Files, hardware: Callable[..., HardwareInfo],
                 workers: Workers) -> None:
        self.recipes = recipes
        self.previews = previews
        self.files = files
        self.hardware = hardware
        self.workers = workers
        self._starts_lock = threading.Lock()
        self._changes = 0  # Starts, Resumes and Stops here so far: each makes the expected starts out of date
        self._starts: tuple[int, float, dict[str, tuple[int, float | None]]] | None = None  # (_changes, when, them)

    @property
    def folder(self):
        return self.recipes.runs_dir

    @property
    def policy(self) -> Policy:
        return self.recipes.policy

    # --- one run -------------------------------------------------------------------------------------------------
    def get(self, run_id: str) -> RunDir:
        """The run folder called ``run_id`` in the runs folder; an id that names anything else is no run."""
        if not isinstance(run_id, str) or not RUN_ID.fullmatch(run_id) or run_id.strip(".") == "":
            raise ConfigError("There is no run with that id; choose one from the list of runs.")
        path = self.folder / run_id
        if not (path / "config.json").is_file():
            raise ConfigError(f"There is no run called {run_id!r} in the runs folder.")
        return RunDir(path)

    def owns(self, run_owner: str | None) -> bool:
        """Whether the current visitor may change or take a run that ``run_owner`` started (public.Policy.owns)."""
        return self.policy.owns(run_owner)

    def owned(self, run_id: str, action: str) -> RunDir:
        """The run, if the current visitor may change or take it (its starter; everyone outside public mode)."""
        run = self.get(run_id)
        if not self.owns(run.read_status().get("owner")):
            raise NotYoursError(f"The run {run_id} belongs to another visitor: only the browser that started it can "
                                f"{action} (or this demo's owner, with the owner key).")
        return run

    def whose(self, summary: dict) -> str:
        """"yours" or "another visitor's" in a public demo, for the runs list; "" elsewhere."""
        if not self.policy.public:
            return ""
        return "yours" if self.owns(summary.get("owner")) else "another visitor's"

    def settings_of(self, run_id: str) -> tuple[dict, str]:
        """(draft, what it is): a past run's settings as a draft, to train them again or change them. In a public
        demo another visitor's run lends its settings but not its data or its model when those are theirs alone
        (an upload, a run folder): the draft then leaves them to be chosen, and says so."""
        if not run_id:
            raise ConfigError("Choose a run first.")
        run = self.get(run_id)
        config = run.read_config()
        config.runs_dir = str(self.folder)
        label = f"the settings of run {run_id}"
        for index, spec in enumerate(config.rewards):  # a run made outside this demo may use what it refuses
            if (refusal := public_refusal(spec, f"rewards[{index}]", policy=self.policy)) is not None:
                raise ConfigError(f"The settings of run {run_id} cannot be used here: {refusal}")
        if not self.owns(run.read_status().get("owner")):
            withheld = []
            source = config.data.source
            if not (is_hub_dataset_id(source, look_on_disk=False) or is_bundled(source)):
                config.data.source, config.data.sheet = "", None
                withheld.append("its data (choose yours on the Data tab)")
            if config.model.id not in public_checks.allowed_models(policy=self.policy):
                config.model.id = DEFAULT_MODEL_ID
                withheld.append(f"its starting model, a run of theirs ({DEFAULT_MODEL_ID} instead)")
            if config.notes and config.notes not in self.recipes.notes():  # their words, shown as if the app's
                config.notes = ""
                withheld.append("its notes")
            if withheld:
                label += f", without what was another visitor's: {' and '.join(withheld)}"
        return config.to_dict(), label

    # --- training and the queue ------------------------------------------------------------------------------------
    def start(self, draft: Draft) -> RunDir:
        """Start the draft, or queue it while the machine has no room for it (engine.queue); the preview model makes
        room for a run that starts now."""
        config = self.recipes.validate(draft)
        try:
            return queue.submit_start(config, self.previews.release, policy=self.policy, workers=self.workers)
        finally:
            self._changes += 1

    def resume(self, run_id: str) -> RunDir:
        run = self.owned(run_id, "resume it")
        try:
            return queue.submit_resume(run.path, self.previews.release, policy=self.policy, workers=self.workers)
        finally:
            self._changes += 1

    def stop(self, run_id: str) -> None:
        """Ask a run to stop after its current step, whichever process trains it; a waiting run leaves the queue."""
        run = self.owned(run_id, "stop it")
        if run.read_status().get("waiting"):
            queue.take_out(run)
        else:
            run.request_stop()  # what TrainingProcess.stop does, and what a training in another process hears
        self._changes += 1

    def start_queue(self) -> queue.Scheduler:
        """Start the waiting runs as the machine has room for them, from now on (the app does this once, when it
        starts); in a public demo the same thread removes old runs, uploads and download copies (engine.retention)."""
        limits = self.policy.limits
        housekeeping = functools.partial(self._clean_up, limits.keep_hours) if limits else None
        return queue.Scheduler(self.folder, housekeeping=housekeeping, policy=self.policy, workers=self.workers,
                               before_start=self.previews.release).start()

    def _clean_up(self, keep_hours: float) -> list:
        """Remove what a public demo keeps no longer: its owner's retention (``keep_hours``) for runs and uploads, an
        hour for downloads and for uploads nobody claimed."""
        return retention.clean_up(self.folder, keep_hours,
                                  passing=[self.files.downloads_dir, self.files.arrivals])

    def place(self, run_id: str) -> str:
        """Where a waiting run is in the queue and when it should start: "2nd in line; expected to start in
        about 20 min"; "" for a run that is not waiting."""
        place, seconds = self.expected_starts().get(run_id, (None, None))
        if place is None:
            return ""
        when = ("the queue is paused" if queue.paused(self.folder) else "its start time is not known yet"
                if seconds is None else f"expected to start in about {format_seconds(seconds)}")
        return f"{ordinal(place)} in line; {when}"

    def expected_starts(self) -> dict[str, tuple[int, float | None]]:
        """Every waiting run's (place in line, seconds until it should start; None: not known, or the queue is
        paused), by id (engine.queue.expected_starts). Worked out once every EXPECTED_STARTS_S, however many pages
        ask on their timers, and again after a Start, Resume or Stop here."""
        with self._starts_lock:
            changes, now = self._changes, time.monotonic()
            if self._starts is None or self._starts[0] != changes or now - self._starts[1] >= EXPECTED_STARTS_S:
                summaries = list_runs(self.folder)
                seconds = functools.partial(self._seconds_left, summaries)
                self._starts = (changes, now, queue.expected_starts(self.folder, seconds, summaries,
                                                                   workers=self.workers))
            return self._starts[2]

    def _seconds_left(self, summaries: list[dict], run: RunDir) -> float | None:
        """How long ``run`` should still train: its own ETA once it trains; else its steps left at the measured pace
        of the latest run here of the same model and completions per step (``summaries``: the runs folder), or at
        its estimate's; never more than a public demo's time limit."""
        status = run.read_status()
        limit = self.policy.limits.run_minutes * 60 if self.policy.limits else None
        seconds = status.get("eta_s") if status.get("state") == "running" and status.get("step") else None
        if seconds is None:
            try:
                config = run.read_config()
                steps = config.training.max_steps or math.ceil(
                    config.training.epochs * (status.get("n_train") or 0)
                    / (config.training.batch_size * config.training.grad_accum))
                per_step = measured_step_s(summaries, config.model.id, config.completions_per_step)
                if per_step is None:
                    hardware = self.hardware()
                    per_step = estimate_run(config, resolve_hardware(config.hardware, hardware), hardware).step.total_s
                seconds = per_step * max(0, steps - (status.get("step") or 0)) + ESTIMATED_START_S
            except DragonError:
                seconds = None
        if limit is not None:  # an unknown length is the whole limit
            seconds = min(limit + ESTIMATED_START_S, math.inf if seconds is None else seconds)
        return seconds

    def trainings(self) -> list[TrainingProcess]:
        """The trainings this app started that are still going, first started first."""
        return training.active_runs()

    def waiting(self) -> list[RunDir]:
        """The runs waiting in the queue, first in line first."""
        return queue.waiting_runs(self.folder)

    def active_ids(self) -> list[str]:
        """The runs training right now, in this process or (seen through the run store) in another one."""
        return queue.training_run_ids(self.folder)

    def summaries(self) -> list[dict]:
        return list_runs(self.folder)


def measured_step_s(summaries: list[dict], model_id: str, completions_per_step: int) -> float | None:
    """The mean time of a step measured here for this model and this many completions a step: that of the latest
    run of ``summaries`` (newest first) that has trained steps of them (running, or done); None if none has."""
    for summary in summaries:
        if (summary.get("model") == model_id and summary.get("completions_per_step") == completions_per_step
                and summary.get("step") and summary.get("elapsed_s")):
            return summary["elapsed_s"] / summary["step"]
    return None
