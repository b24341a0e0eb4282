"""A training process of the app (engine/workers.py starts it): it warms up, then trains the one run the app hands
it on standard input, held to the share of the machine the job gives it (engine/capacity.py), and ends."""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
import time
from pathlib import Path

from .. import speedups
from ..config import HardwareSettings, ModelConfig
from ..public import Policy
from ..runstore import RunDir
from .workers import OWN_SETTINGS

log = logging.getLogger("dragon_ui")

# Linux nice of a worker and what it starts (torch's threads, the reward processes): on a laptop's or a Space's few
# cores the web server's handlers then run as soon as they have something to do, instead of queueing behind the
# training, which still gets every cycle they leave (~90% of a core they contend for).
WORKER_NICENESS = 10


def _warm_up(preload: dict | None) -> None:
    """What a Start would otherwise wait for: the libraries, the hardware and the default model, loaded and set
    aside for the training to take (engine.models.take_set_aside)."""
    from .hardware import resolve_hardware
    from .libraries import import_all
    from .models import ModelCache

    started = time.monotonic()
    import_all()
    from . import progress  # noqa: F401 - the training's callback and what it imports
    if preload is not None:
        settings = HardwareSettings(**preload["hardware"])
        resolve_hardware(settings)
        cache = ModelCache()
        cache.load(ModelConfig(**preload["model"]), settings=settings)
        cache.release(for_training=True)
    log.info("A training process is ready (%.1f s).", time.monotonic() - started)


def main(argv: list[str]) -> int:
    """A worker: warm up, then train the run the app hands over on standard input (none: exit)."""
    if sys.platform.startswith("linux"):
        os.nice(WORKER_NICENESS)  # before any thread starts: torch's and the reward workers inherit it
    from . import trackers, training
    os.environ.update(trackers.missing_environment(os.environ))
    speedups.choose(os.environ.get(speedups.ENV, ""))  # the app's, as it started this worker: for the warm-up
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    app = os.getppid()
    try:
        _warm_up(json.loads(argv[0]) if argv else None)
    except Exception:  # noqa: BLE001 - warming up is an optimisation: the run loads what it needs itself
        log.exception("Warming up a training process failed; the run loads what it needs")
    line = sys.stdin.readline()  # empty: the app let this worker go, or has ended
    if not line.strip():
        return 0
    from .capacity import Share

    job = json.loads(line)
    _take_settings(job["settings"])
    run = RunDir(Path(job["run_dir"]))
    training_job = training.Training(run, policy=Policy.from_json(job["policy"]), share=Share.from_json(job["share"]))
    threading.Thread(target=stop_when_orphaned, args=(app, training_job), name="dragon-orphaned",
                     daemon=True).start()
    training.train_here(training_job, Path(job["resume_from"]) if job["resume_from"] else None)
    return 0


def _take_settings(settings: dict[str, str]) -> None:
    """Our own settings as the app has them now (engine/workers.py): this worker may have warmed up before they
    changed."""
    for key in [key for key in os.environ if key.startswith(OWN_SETTINGS)]:
        del os.environ[key]
    os.environ.update(settings)
    speedups.choose(os.environ.get(speedups.ENV, ""))


def stop_when_orphaned(app: int, training_job) -> None:
    """The app ended (closed, killed or crashed) while this trained: stop as Stop does, saving the last whole step,
    so no training goes on unseen and Resume continues from there."""
    while os.getppid() == app:
        time.sleep(1)
    log.info("The app has ended: stopping the training at its next step.")
    training_job.stop()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
