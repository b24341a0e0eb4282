"""The backend the Gradio UI talks to: one Studio per app, made of a few objects with one job each.

- ``recipes``: the recipes, and drafts made into checked configs (studio/recipes.py);
- ``runs``: start, queue, stop and resume runs, and whose each is (studio/runs.py);
- ``previews``: the one cached model for previews, kept out of a training's way (studio/previews.py);
- ``files``: downloads, uploads and the paths the app shows (studio/files.py).

The Studio itself holds what they share: the policy it serves under, the machine's hardware, the warm-up, and the
training processes (engine/workers.py: every run trains in a process of its own). The UI receives a Studio as an argument, so tests can give it one pointed at a temporary runs
folder and a tiny model.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import secrets
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from ..config import Draft
from .. import ASSETS_DIR
from ..engine import public_checks, queue
from ..engine.dry_run import DryRun, dry_run
from ..engine.estimate import estimate_run
from ..engine.hardware import HardwareInfo, detect_hardware, resolve_hardware
from ..engine.libraries import import_all
from ..engine.preflight import MOST_PROMPTS, Preflight, preflight
from ..errors import BusyError, ConfigError
from ..engine.workers import STOP_GRACE_S, Workers
from ..public import Policy, RequestPolicy
from ..runstore import read_json, write_json_atomic
from .classroom import Classroom, Teacher
from .files import Files
from .previews import Previews
from .recipes import Recipes
from .runs import Runs
from .visitors import CLASS_CODE, Visitors

log = logging.getLogger("dragon_ui")
DRY_RUN_BESIDE_A_TRAINING = ("A training is running on this machine; a step measured beside it would take longer than "
                             "it will, and slow the training down. Wait for it to finish or stop it first.")


class Studio:
    """One per app process, serving under one ``policy`` (the app builds it from the environment: a public demo's
    limits, or the laptop's none). Thread-safe: Gradio calls it from several worker threads at once."""

    policy = RequestPolicy()  # asked by the visitor of the request being served

    def __init__(self, runs_dir: str | Path, recipes_dir: str | Path | None = None,
                 *, policy: Policy, workers: Workers | None = None) -> None:
        self.runs_dir = Path(runs_dir).expanduser().resolve()
        if policy.public and policy.runs_dir != self.runs_dir:
            raise ValueError(f"a public demo's policy keeps its runs in {policy.runs_dir}, not in {self.runs_dir}")
        self.policy = policy
        self._hardware: HardwareInfo | None = None
        self._hardware_lock = threading.Lock()  # the warm-up and a page's first request may both ask at once
        self.classroom = Classroom(self.runs_dir, policy.class_code, policy.limits) if policy.limits else None
        self.visitors = Visitors(policy.owner_key, self.classroom)
        self._page_opened = threading.Event()  # see warm_up
        # Held by the one pre-flight or dry run running (Studio.preflight, Studio.measure_step): each measures or
        # samples on the CPU, and one beside the other would give both wrong times.
        self._measuring = threading.Lock()
        # Each part asks for the hardware through this Studio, so that one detection (or a test's) serves all.
        machine = lambda refresh=False: self.hardware(refresh)  # noqa: E731
        self.recipes = Recipes(Path(recipes_dir or ASSETS_DIR / "recipes").resolve(), self.runs_dir, policy=policy)
        self.previews = Previews(machine, policy=policy)
        self.files = Files(self.runs_dir, policy=policy)
        # ``workers``: a test's, shared between the Studios it makes, which closes it itself.
        self._own_workers = workers is None
        self.runs = Runs(self.recipes, self.previews, self.files, machine,
                         Workers(hub_token=not policy.public, side_by_side=policy.public) if workers is None else workers)
        self.teacher = None if self.classroom is None else Teacher(
            self.classroom, self.runs, functools.partial(self.visitors.forgive, CLASS_CODE), policy=policy)

    @property
    def public(self) -> bool:
        return self.policy.public

    @property
    def workers(self) -> Workers:
        """The training processes (engine/workers.py), which the runs own."""
        return self.runs.workers

    def allowed_models(self) -> list[str]:
        """The models this demo offers (engine.public_checks.allowed_models)."""
        return public_checks.allowed_models(policy=self.policy)

    def browser_storage_key(self) -> str:
        """The key gradio's BrowserState encodes what a browser keeps with (the draft, the visitor's token), kept
        beside the runs so that a restarted app still reads what browsers kept (gradio would make a new one each
        start). It is no secret: gradio sends it to every page in its config, so it hides nothing from anyone."""
        path = self.runs_dir / ".browser-secret.json"
        secret = read_json(path)
        if not isinstance(secret, str) or not secret:
            secret = secrets.token_urlsafe(24)
            write_json_atomic(path, secret)
        return secret

    # --- the machine and the warm-up -----------------------------------------------------------------------------
    def hardware(self, refresh: bool = False) -> HardwareInfo:
        with self._hardware_lock:
            if self._hardware is None or refresh:
                self._hardware = detect_hardware()
            return self._hardware

    def warm_up(self, page_wait_s: float = 0.0) -> threading.Thread:
        """In a background thread, once the server answers: what the first page, the first Start and the first
        playground group would otherwise each wait for. See _warm.

        It first lets a page that is opening show itself (until its load event: page_opened), for at most
        ``page_wait_s``: on 2 CPUs, importing the libraries beside the browser building the page made the page's
        first paint 0.7 s later. With no page coming (no browser, an API client) it only starts that much later."""
        thread = threading.Thread(target=self._warm, args=(page_wait_s,), name="dragon-warm-up", daemon=True)
        thread.start()
        return thread

    def page_opened(self) -> None:
        """A page's load event came (the page is painted by then): the warm-up need not wait any longer."""
        self._page_opened.set()

    def _warm(self, page_wait_s: float) -> None:
        """Import the libraries (engine.libraries: whatever needs them meanwhile waits, rather than racing the
        import), detect the hardware, measure the CPU for the estimate while nothing else runs, and load the default
        recipe's model and tokenizer for previews; then warm a training process with that model
        (engine/workers.py). Nothing is loaded beside a training, and a failure here only means the first use loads
        what it needs."""
        self._page_opened.wait(page_wait_s)
        started = time.monotonic()
        try:
            import_all()
            info = self.hardware()
            config = self.recipes.validate(self.recipes.default())
            estimate_run(config, resolve_hardware(config.hardware, info), info)
            if not queue.training_run_ids(self.runs_dir):
                self.previews.cache.load(config.model, settings=config.hardware)
        except Exception:  # noqa: BLE001 - warming up is an optimisation; the first use reports its own errors
            log.exception("Warming up failed; the first use loads what it needs")
        else:
            log.info("Warmed up in %.1f s: the hardware, the training libraries and %s", time.monotonic() - started,
                     config.model.id)
            self.workers.warm((config.model, config.hardware))

    def preflight(self, draft: Draft, prompts=None, should_stop: Callable[[], bool] | None = None,
                  on_progress: Callable[[int, int], None] | None = None) -> Preflight:
        """Will the draft learn? (engine.preflight) With the preview model, so it is refused while a training uses
        this machine's CPU, as previews are. ``prompts``: how many to sample, as anyone may send it."""
        config = self.recipes.validate(draft)
        if prompts is not None and (isinstance(prompts, bool) or not isinstance(prompts, int)
                                    or not 1 <= prompts <= MOST_PROMPTS):
            raise ConfigError(f"The number of prompts to sample must be a whole number from 1 to {MOST_PROMPTS}.")
        self.previews.refuse_while_training("a pre-flight")  # before its data is read
        # One at a time in this process, whoever asks: a request gradio cancelled may still be sampling (its thread
        # ends at its next token once told to stop), and a new one must not start beside it.
        with self._one_measure("a pre-flight"):
            public_checks.take_preflight(policy=self.policy)
            return preflight(config, self.previews.load, policy=self.policy, prompts=prompts, should_stop=should_stop, on_progress=on_progress)

    def measure_step(self, draft: Draft, should_stop: Callable[[], bool] = lambda: False) -> DryRun:
        """One real training step of the draft, timed and its peak memory measured (engine.dry_run), in a process
        of its own, which ends at once when ``should_stop`` (the page went away) or a training starts. Refused
        beside a training (each would slow the other, and the time would be wrong), and on a public demo unless
        its owner allows dry runs (public_checks.take_dry_run). The preview model makes room for it, as for a
        training."""
        config = self.recipes.validate(draft)
        if queue.training_run_ids(self.runs_dir):
            raise BusyError(DRY_RUN_BESIDE_A_TRAINING)

        def interrupted() -> str | None:
            if queue.training_run_ids(self.runs_dir):
                return DRY_RUN_BESIDE_A_TRAINING
            return "The page went away, so the dry run stopped." if should_stop() else None

        with self._one_measure("a dry run"):
            public_checks.take_dry_run(policy=self.policy)
            self.previews.release()
            return dry_run(config, policy=self.policy, interrupted=interrupted,
                           timeout_s=60 * self.policy.limits.run_minutes if self.policy.limits else 3600)

    @contextlib.contextmanager
    def _one_measure(self, what: str) -> Iterator[None]:
        if not self._measuring.acquire(blocking=False):
            raise BusyError(f"A pre-flight or a dry run is running on this machine already; {what} beside it would "
                            "slow both down. Try again when it has finished.")
        try:
            yield
        finally:
            self._measuring.release()

    def close(self) -> None:
        """The app is closing: the trainings in worker processes are asked to stop and save their last step, and
        the warm worker goes (unless the workers were given: their owner closes them)."""
        if self._own_workers:
            self.workers.close()
        trainings = self.runs.trainings()
        for handle in trainings:
            handle.stop()
        deadline = time.monotonic() + STOP_GRACE_S  # time for them to save their last step
        for handle in trainings:
            handle.wait(max(0.0, deadline - time.monotonic()))
