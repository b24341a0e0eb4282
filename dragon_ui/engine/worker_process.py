"""A training process of the app (engine/worker.py starts it): it warms up, then trains the one run the app hands
it on standard input, and ends."""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
import time
from pathlib import Path

from ..config import HardwareSettings, ModelConfig
from ..public import Policy
from ..runstore import RunDir

log = logging.getLogger("dragon_ui")

WORKER_NICENESS = 10  # the web server's handlers get ~90% of a core they contend for (see training._yield_to_the_app)


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
    from . import training
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    app = os.getppid()
    try:
        _warm_up(json.loads(argv[0]) if argv else None)
    except Exception:  # noqa: BLE001 - warming up is an optimisation: the run loads what it needs itself
        log.exception("Warming up a training process failed; the run loads what it needs")
    line = sys.stdin.readline()  # empty: the app let this worker go, or has ended
    if not line.strip():
        return 0
    job = json.loads(line)
    run = RunDir(Path(job["run_dir"]))
    handle = training.RunHandle(run, Policy.from_json(job["policy"]))
    threading.Thread(target=_stop_when_orphaned, args=(app, handle), name="dragon-orphaned", daemon=True).start()
    training.train_here(handle, Path(job["resume_from"]) if job["resume_from"] else None)
    return 0


def _stop_when_orphaned(app: int, handle) -> None:
    """The app ended (closed, killed or crashed) while this trained: stop as Stop does, saving the last whole step,
    so no training goes on unseen and Resume continues from there."""
    while os.getppid() == app:
        time.sleep(1)
    log.info("The app has ended: stopping the training at its next step.")
    handle.stop()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
