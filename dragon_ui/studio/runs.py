"""The app's runs: start, queue, stop and resume them, find one by id, and say whose each is.

Which runs a visitor may change is the policy's rule (public.Policy.owns); this is where the app asks it.
"""

from __future__ import annotations

import functools

import math
import re
from collections.abc import Callable

from ..config import DEFAULT_MODEL_ID, Draft
from ..data import is_bundled, is_hub_dataset_id
from ..engine import public_checks, queue, retention, training
from ..engine.estimate import estimate_run
from ..engine.hardware import HardwareInfo, resolve_hardware
from ..engine.workers import Workers
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


class Runs:
    """The runs in ``recipes.runs_dir``; each trains in a process of ``workers``."""

    def __init__(self, recipes: Recipes, previews: Previews, files: Files, hardware: Callable[..., HardwareInfo],
                 workers: Workers) -> None:
        self.recipes = recipes
        self.previews = previews
        self.files = files
        self.hardware = hardware
        self.workers = workers

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
        """Start the draft, or queue it while another run trains (engine.queue)."""
        config = self.recipes.validate(draft)
        if queue.training_run_id(self.folder) is None:
            self.previews.release()  # training needs the memory more than a preview does
        return queue.submit_start(config, policy=self.policy, workers=self.workers)

    def resume(self, run_id: str) -> RunDir:
        run = self.owned(run_id, "resume it")
        if queue.training_run_id(self.folder) is None:
            self.previews.release()
        return queue.submit_resume(run.path, policy=self.policy, workers=self.workers)

    def stop(self, run_id: str) -> None:
        """Ask a run to stop after its current step, whichever process trains it; a waiting run leaves the queue."""
        run = self.owned(run_id, "stop it")
        if run.read_status().get("waiting"):
            queue.take_out(run)
            return
        handle = training.active_run()
        if handle is not None and handle.run.id == run_id:
            handle.stop()
        else:
            run.request_stop()

    def start_queue(self) -> queue.Scheduler:
        """Start the waiting runs one after another, from now on (the app does this once, when it starts); in a
        public demo the same thread removes old runs, uploads and download copies (engine.retention)."""
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
        waiting = self.waiting()
        place = next((number for number, run in enumerate(waiting, start=1) if run.id == run_id), None)
        if place is None:
            return ""
        ahead = [self.get(active)] if (active := self.active_id()) else []
        ahead += waiting[:place - 1]
        seconds = [self._seconds_left(other) for other in ahead]
        known = [left for left in seconds if left is not None]
        when = (f"expected to start in about {format_seconds(sum(known))}" if len(known) == len(seconds)
                else "its start time is not known yet")
        return f"{ordinal(place)} in line; {when}"

    def _seconds_left(self, run: RunDir) -> float | None:
        """How long ``run`` should still train: its own ETA once it trains, else its estimate; never more than a
        public demo's time limit."""
        status = run.read_status()
        limit = self.policy.limits.run_minutes * 60 if self.policy.limits else None
        seconds = status.get("eta_s") if status.get("state") == "running" and status.get("step") else None
        if seconds is None:
            try:
                config = run.read_config()
                estimate = estimate_run(config, resolve_hardware(config.hardware, self.hardware()), self.hardware())
                steps = config.training.max_steps or math.ceil(
                    config.training.epochs * (status.get("n_train") or 0)
                    / (config.training.batch_size * config.training.grad_accum))
                seconds = estimate.step.total_s * steps + ESTIMATED_START_S
            except DragonError:
                seconds = None
        if limit is not None:  # an unknown length is the whole limit
            seconds = min(limit + ESTIMATED_START_S, math.inf if seconds is None else seconds)
        return seconds

    def training(self):
        """The training this app started that is still going (engine.workers.TrainingProcess), or None."""
        return training.active_run()

    def waiting(self) -> list[RunDir]:
        """The runs waiting in the queue, first in line first."""
        return queue.waiting_runs(self.folder)

    def active_id(self) -> str | None:
        """The run training right now, in this process or (seen through the run store) in another one."""
        return queue.training_run_id(self.folder)

    def summaries(self) -> list[dict]:
        return list_runs(self.folder)
