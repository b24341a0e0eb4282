"""The backend the Gradio UI talks to: recipes, drafts, run control, and one cached model for previews.

It holds the little state the UI needs across requests (where runs live, which model is loaded for previews) and
delegates everything else to the engine modules. The UI receives a Studio as an argument, so tests can give it one
pointed at a temporary runs folder and a tiny model.
"""

from __future__ import annotations

import copy
import logging
import math
import os
import re
import secrets
import shutil
import tempfile
import threading
import time
from pathlib import Path

from .. import ASSETS_DIR
from ..config import DEFAULT_MODEL_ID, HardwareSettings, ModelConfig, RunConfig
from ..data import is_bundled, is_hub_dataset_id
from ..engine import public_checks, queue, retention, training
from ..engine.estimate import estimate_run, preview_memory_gb
from ..engine.hardware import (HardwareInfo, ResolvedHardware, detect_hardware, resolve_for_this_machine,
                               resolve_hardware)
from ..engine.libraries import import_all
from ..engine.models import ModelCache
from ..engine.worker import WorkerRun, Workers
from ..errors import BusyError, ConfigError, DragonError, NotYoursError
from ..files import resolve_runs_dir
from ..public import LAPTOP, Policy, is_own_upload, own_uploads_dir, visitor
from ..rewards import public_refusal
from ..runstore import RunDir, format_seconds, list_runs, read_json, write_json_atomic
from .draft import ordinal
from .visitors import Visitors

log = logging.getLogger("dragon_ui")

DEFAULT_RECIPE = "arithmetic"
UPLOADS_KEPT = 3  # a visitor's newest uploads in a public demo; an older one goes when a new one arrives
RUN_ID = re.compile(r"[A-Za-z0-9._-]{1,120}")  # a run folder's name (runstore.RunDir.create makes them so)
ESTIMATED_START_S = 60  # loading the model and scoring it on the held-out prompts, before a run's first step
# What sampling a group in the playground reads from a draft: the model, where it runs, the data and rewards, GRPO's
# sampling settings, and LoRA (4-bit loading needs it).
SAMPLING_SETTINGS = ("model", "data", "rewards", "grpo", "hardware", "lora", "base_dir", "runs_dir")


class Studio:
    """One per app process, serving under one ``policy`` (the app builds it from the environment: a public demo's
    limits, or the laptop's none). Thread-safe: Gradio calls it from several worker threads at once."""

    def __init__(self, runs_dir: str | Path | None = None, recipes_dir: str | Path | None = None,
                 policy: Policy = LAPTOP, training_processes: bool = False) -> None:
        self.runs_dir = resolve_runs_dir(runs_dir)
        self.recipes_dir = Path(recipes_dir or ASSETS_DIR / "recipes").resolve()
        self.policy = policy
        # The app's way: each run trains in a process of its own (engine/worker.py); else in a thread of this one.
        self.workers = Workers() if training_processes else None
        self._hardware: HardwareInfo | None = None
        self._hardware_lock = threading.Lock()  # the warm-up and a page's first request may both ask at once
        self.models = ModelCache(self.hardware)
        self.visitors = Visitors(policy.owner_key)
        self._page_opened = threading.Event()  # see warm_up

    @property
    def public(self) -> bool:
        return self.policy.public

    # --- recipes and drafts --------------------------------------------------------------------------------------
    def recipe_names(self) -> list[str]:
        return sorted(p.stem for p in self.recipes_dir.glob("*.yaml"))

    def load_recipe(self, name: str) -> dict:
        """A recipe as a draft: the config dict the UI edits, with paths made absolute so they survive any cwd. The
        name must be one of the recipes listed (it is never joined to a folder as it was sent)."""
        names = self.recipe_names()
        if not name:
            raise ConfigError(f"Choose a recipe first: {', '.join(names)}.")
        if name not in names:
            shown = name if isinstance(name, str) and len(name) <= 60 else "that"
            raise ConfigError(f"There is no recipe called {shown!r}; choose one of: {', '.join(names)}.")
        config = RunConfig.from_file(self.recipes_dir / f"{name}.yaml", self.policy)
        # A recipe's data file lies beside it (the bundled datasets): the recipe's own folder, never a visitor's,
        # resolves it; a Hub id stays as it is.
        beside = Path(config.base_dir, config.data.source.strip())
        if beside.exists():
            config.data.source = os.path.normpath(beside)
        config.runs_dir = str(self.runs_dir)
        return config.to_dict()

    def default_draft(self) -> dict:
        return self.load_recipe(DEFAULT_RECIPE)

    def run_settings(self, run_id: str) -> tuple[dict, str]:
        """(draft, what it is): a past run's settings as a draft, to train them again or change them. In a public
        demo another visitor's run lends its settings but not its data or its model when those are theirs alone
        (an upload, a run folder): the draft then leaves them to be chosen, and says so."""
        if not run_id:
            raise ConfigError("Choose a run first.")
        run = self.run(run_id)
        config = run.read_config()
        config.runs_dir = str(self.runs_dir)
        label = f"the settings of run {run_id}"
        for index, spec in enumerate(config.rewards):  # a run made outside this demo may use what it refuses
            if (refusal := public_refusal(spec, self.policy, f"rewards[{index}]")) is not None:
                raise ConfigError(f"The settings of run {run_id} cannot be used here: {refusal}")
        if not self.owns(run.read_status().get("owner")):
            withheld = []
            source = config.data.source
            if not (is_hub_dataset_id(source, look_on_disk=False) or is_bundled(source)):
                config.data.source, config.data.sheet = "", None
                withheld.append("its data (choose yours on the Data tab)")
            if config.model.id not in self.allowed_models():
                config.model.id = DEFAULT_MODEL_ID
                withheld.append(f"its starting model, a run of theirs ({DEFAULT_MODEL_ID} instead)")
            if config.notes and config.notes not in self._recipe_notes():  # words of theirs, shown as if the app's
                config.notes = ""
                withheld.append("its notes")
            if withheld:
                label += f", without what was another visitor's: {' and '.join(withheld)}"
        return config.to_dict(), label

    def _recipe_notes(self) -> set[str]:
        """The bundled recipes' notes: a lesson's, in a run of another visitor, are still the app's own words."""
        return {RunConfig.from_file(self.recipes_dir / f"{name}.yaml", self.policy).notes
                for name in self.recipe_names()}

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

    def validate(self, draft: dict) -> RunConfig:
        """The draft as a validated RunConfig that this demo allows (raises ConfigError with the sentence to show).

        The app keeps runs in its own folder, whatever a draft says; in a public demo no folder of a draft is used
        at all (``base_dir`` would make relative paths read files of the server's choosing of the visitor's)."""
        config = RunConfig.from_dict(copy.deepcopy(draft), policy=self.policy)
        config.runs_dir = str(self.runs_dir)
        if self.public:
            config.base_dir = ""
        public_checks.check_run(config, self.policy)
        return config

    def check(self, draft: dict) -> RunConfig:
        """What ``dragon check`` checks: the settings, then the data, prompts and rewards read as a Start reads them
        (a Hub dataset that cannot be reached is refused here, not at Start). A public demo checks the settings and
        its limits only: reading a visitor's data takes the demo's one reading slot, and a Start, which reads it,
        counts against the visitor's starts (public_checks.check_start), where a check would count against
        nothing."""
        config = self.validate(draft)
        if not self.public:
            training.inspect(config, self.policy)
        return config

    def check_sampling(self, replies: int) -> None:
        """Refuse a playground group larger than a public demo's limit of completions per step: sampling it takes
        the machine from everyone like a training step does."""
        most = self.policy.limits and self.policy.limits.completions_per_step
        if most is not None and replies > most:
            raise ConfigError(f"That samples {replies} replies, more than this public demo's limit of {most} "
                              "completions per step; sample fewer rows or lower the group size.")

    def validate_for_sampling(self, draft: dict) -> RunConfig:
        """The settings the playground's sampling uses, validated; the others are left at their defaults, so a
        learning rate half typed on the Model tab does not stop anyone trying rewards."""
        return self.validate({key: value for key, value in draft.items() if key in SAMPLING_SETTINGS})

    # --- hardware ------------------------------------------------------------------------------------------------
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
        (engine/worker.py), or, training in a thread, let a Start take this one over (engine.models.take_set_aside).
        Nothing is loaded beside a training, and a failure here only means the first use loads what it needs."""
        self._page_opened.wait(page_wait_s)
        started = time.monotonic()
        try:
            import_all()
            if self.workers is None:
                from ..engine import progress  # noqa: F401 - the training's callback and its imports: not at Start
            info = self.hardware()
            config = self.validate(self.default_draft())
            estimate_run(config, resolve_hardware(config.hardware, info), info)
            if queue.training_run_id(self.runs_dir) is None:
                self.models.load(config.model, settings=config.hardware)
        except Exception:  # noqa: BLE001 - warming up is an optimisation; the first use reports its own errors
            log.exception("Warming up failed; the first use loads what it needs")
        else:
            log.info("Warmed up in %.1f s: the hardware, the training libraries and %s", time.monotonic() - started,
                     config.model.id)
            if self.workers is not None:
                self.workers.warm((config.model, config.hardware))

    def resolve_hardware(self, draft: dict) -> ResolvedHardware:
        return resolve_hardware(self.validate(draft).hardware, self.hardware())

    # --- runs ----------------------------------------------------------------------------------------------------
    def start(self, draft: dict) -> RunDir:
        """Start the draft, or queue it while another run trains (engine.queue)."""
        config = self.validate(draft)
        if queue.training_run_id(self.runs_dir) is None:
            self.release_model(for_training=True)  # training needs the memory more than a preview does
        return queue.submit_start(config, self.policy, self.workers)

    def resume(self, run_id: str) -> RunDir:
        run = self.owned_run(run_id, "resume it")
        if queue.training_run_id(self.runs_dir) is None:
            self.release_model(for_training=True)
        return queue.submit_resume(run.path, self.policy, self.workers)

    def stop(self, run_id: str) -> None:
        """Ask a run to stop after its current step, whichever process trains it; a waiting run leaves the queue."""
        run = self.owned_run(run_id, "stop it")
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
        housekeeping = self.clean_up if self.public else None
        return queue.Scheduler(self.runs_dir, housekeeping=housekeeping, policy=self.policy, workers=self.workers,
                               before_start=lambda: self.release_model(for_training=True)).start()

    def clean_up(self) -> list[Path]:
        """Remove what a public demo keeps no longer: its owner's retention for runs and uploads, an hour for
        download copies."""
        return retention.clean_up(self.runs_dir, self.policy.limits.keep_hours, downloads=[self.downloads_dir])

    def queue_place(self, run_id: str) -> str:
        """Where a waiting run is in the queue and when it should start: "2nd in line; expected to start in
        about 20 min"; "" for a run that is not waiting."""
        waiting = queue.waiting_runs(self.runs_dir)
        place = next((number for number, run in enumerate(waiting, start=1) if run.id == run_id), None)
        if place is None:
            return ""
        ahead = [self.run(active)] if (active := queue.training_run_id(self.runs_dir)) else []
        ahead += waiting[:place - 1]
        seconds = [self._seconds_left(other) for other in ahead]
        when = (f"expected to start in about {format_seconds(sum(seconds))}" if None not in seconds
                else "its start time is not known yet")
        return f"{ordinal(place)} in line; {when}"

    def _seconds_left(self, run: RunDir) -> float | None:
        """How long ``run`` should still train: its own ETA once it trains, else its estimate; never more than a
        public demo's time limit."""
        status = run.read_status()
        limit = self.policy.limits.run_minutes * 60 if self.public else None
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
        """The training this app started that is still going (a WorkerRun, or a thread's RunHandle), or None."""
        return training.active_run()

    def waiting_runs(self) -> list[RunDir]:
        """The runs waiting in the queue, first in line first."""
        return queue.waiting_runs(self.runs_dir)

    def active_run_id(self) -> str | None:
        """The run training right now, in this process or (seen through the run store) in another one."""
        return queue.training_run_id(self.runs_dir)

    def runs(self) -> list[dict]:
        return list_runs(self.runs_dir)

    def owns(self, run_owner: str | None) -> bool:
        """Whether the current visitor may change or take a run that ``run_owner`` started (public.Policy.owns)."""
        return self.policy.owns(visitor(), run_owner)

    def allowed_models(self) -> list[str]:
        """The models this demo offers (engine.public_checks.allowed_models)."""
        return public_checks.allowed_models(self.policy)

    def owned_run(self, run_id: str, action: str) -> RunDir:
        """The run, if the current visitor may change or take it (its starter; everyone outside public mode)."""
        run = self.run(run_id)
        if not self.owns(run.read_status().get("owner")):
            raise NotYoursError(f"The run {run_id} belongs to another visitor: only the browser that started it can "
                                f"{action} (or this demo's owner, with the owner key).")
        return run

    @property
    def downloads_dir(self) -> Path:
        """Where files made to be downloaded go (configs, exports, copies of a run's files), each in a folder of
        its own; a public demo removes them after an hour."""
        folder = Path(tempfile.gettempdir()) / "dragon-downloads"
        folder.mkdir(exist_ok=True)
        return folder

    def download_folder(self) -> Path:
        """A new, empty folder for one download."""
        return Path(tempfile.mkdtemp(dir=self.downloads_dir))

    def handed_out(self, path: Path) -> str:
        """A file of a run to hand to its owner's browser: the file itself where the runs folder is served (your
        own machine); in a public demo, where it is not, a link to it (or a copy) in a new temporary folder, which
        the server then hands to that browser alone."""
        if not self.public:
            return str(path)
        target = self.download_folder() / Path(path).name
        try:
            os.link(path, target)  # no copy of a large model where the folders share a disk
        except OSError:
            shutil.copy2(path, target)
        return str(target)

    def whose(self, summary: dict) -> str:
        """"yours" or "another visitor's" in a public demo, for the runs list; "" elsewhere."""
        if not self.public:
            return ""
        return "yours" if self.owns(summary.get("owner")) else "another visitor's"

    def keep_upload(self, uploaded: str | Path, upload_folder: str | Path) -> str:
        """The data source an upload becomes. In a public demo the file moves out of gradio's upload folder (which
        gradio serves to anyone who knows a file's address) into the visitor's own folder, which nothing serves
        and only that visitor's runs may read (public.is_own_upload); elsewhere it stays where gradio put it.

        ``uploaded`` must lie in ``upload_folder``: an event can be sent with any path."""
        uploaded = Path(uploaded).resolve()
        folder = Path(upload_folder).resolve()
        if not uploaded.is_file() or not uploaded.is_relative_to(folder):
            raise ConfigError("That file was not uploaded here; upload it again.")
        if not self.public:
            return str(uploaded)
        own = own_uploads_dir()
        if own is None:
            raise ConfigError("This page could not be told apart from other visitors' pages; reload it and upload "
                              "the file again.")
        if own.is_dir():  # a visitor keeps their newest uploads only: the disk is everyone's
            earlier = sorted(own.iterdir(), key=lambda folder: folder.stat().st_mtime)
            for folder in earlier[:max(0, len(earlier) - (UPLOADS_KEPT - 1))]:
                shutil.rmtree(folder, ignore_errors=True)
        target = own / secrets.token_hex(8) / uploaded.name
        target.parent.mkdir(parents=True)
        shutil.move(uploaded, target)
        if uploaded.parent != folder:  # gradio keeps each upload in a folder of its own
            shutil.rmtree(uploaded.parent, ignore_errors=True)
        return str(target)

    def discard_upload(self, source: str) -> None:
        """Remove an upload kept in a public demo that turned out unreadable: it is no use, and takes room."""
        path = Path(source)
        if self.public and is_own_upload(path.resolve()) and path.parent.parent == own_uploads_dir():
            shutil.rmtree(path.parent, ignore_errors=True)

    def run(self, run_id: str) -> RunDir:
        """The run folder called ``run_id`` in the runs folder; an id that names anything else is no run."""
        if not isinstance(run_id, str) or not RUN_ID.fullmatch(run_id) or run_id.strip(".") == "":
            raise ConfigError("There is no run with that id; choose one from the list of runs.")
        path = self.runs_dir / run_id
        if not (path / "config.json").is_file():
            raise ConfigError(f"There is no run called {run_id!r} in the runs folder.")
        return RunDir(path)

    # --- one cached model for previews (playground and compare) ----------------------------------------------------
    def inference_model(self, model: ModelConfig, adapter_dir: Path | None = None, settings: HardwareSettings | None = None):
        """(model, tokenizer) for previews from the one cached load (engine.models.ModelCache); refused while a
        training uses this machine's CPU."""
        public_checks.check_model(model, self.policy)
        settings = settings or HardwareSettings()
        if training.active_run() is not None:
            self._refuse_unless_room_beside_training(model, settings, self.models.holds(model, adapter_dir, settings))
        return self.models.load(model, adapter_dir, settings)

    def _refuse_unless_room_beside_training(self, model: ModelConfig, settings: HardwareSettings, held: bool) -> None:
        """Previews beside a running training only on a GPU with room for the model (or with it there already,
        ``held``): on the CPU (or a Mac's shared memory) they would slow the training badly, however the model got
        loaded, and on a full GPU they would end it out of memory."""
        info = self.hardware(refresh=True)  # the free memory of now, with the training's share taken
        hardware = resolve_for_this_machine(settings, info)
        if hardware.device != "cuda":
            where = "this Mac's GPU" if hardware.device == "mps" else "this machine's CPU"
            raise BusyError(f"A training is running on {where}; generating previews now would slow it down badly. "
                            "Wait for it to finish or stop it first.")
        if held:
            return
        free = info.cuda[hardware.gpu].free_gb
        try:
            needed = preview_memory_gb(model.id, hardware.dtype, hardware.load_in_4bit)
        except ConfigError:
            needed = None
        if needed is None or free is None or needed > free:
            need = f"about {needed:.1f} GB" if needed is not None else "an amount of memory unknown here"
            have = f"{free:.1f} GB are free" if free is not None else "its free memory is unknown"
            raise BusyError(f"A training is using GPU {hardware.gpu}, and a preview of {model.id} beside it needs "
                            f"{need} while {have}; wait for the training to finish or stop it first.")

    def refuse_while_training_on_the_cpu(self, doing: str) -> None:
        """BusyError while a training uses this machine's CPU (or a Mac's GPU): ``doing`` something as heavy as
        loading a whole model beside it would slow it down badly."""
        if training.active_run() is None:
            return
        device = resolve_for_this_machine(HardwareSettings(), self.hardware()).device
        if device != "cuda":
            raise BusyError(f"A training is running on this machine; {doing} now would slow it down badly. Wait "
                            "for it to finish or stop it first.")

    def shown_path(self, path: Path) -> str:
        """A path of the runs folder as the app shows it: whole on your own machine; in a public demo from the runs
        folder on, since where the server keeps its files is nobody's business."""
        if not self.public:
            return str(path)
        return str(Path(path).resolve().relative_to(self.runs_dir)) if Path(path).resolve().is_relative_to(
            self.runs_dir) else Path(path).name

    def release_model(self, for_training: bool = False) -> None:
        """Let go of the preview model; ``for_training`` in a thread of this process: set it aside for the training
        about to start, which takes it if it is the model and precision it would load
        (engine.models.ModelCache.release). A worker process has its own (engine/worker.py)."""
        self.models.release(for_training and self.workers is None)

    def close(self) -> None:
        """The app is closing: a training in a worker process is asked to stop and save its last step, and the warm
        worker goes."""
        if self.workers is not None:
            active = training.active_run()
            self.workers.close(active if isinstance(active, WorkerRun) else None)
