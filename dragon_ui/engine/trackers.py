"""Experiment trackers (``logging.report_to``): TRL's own integrations, pointed at the run. Nothing is logged
twice by hand; this module only checks the package is there before a run starts, names the run and the project,
and puts TensorBoard's event files into the run folder, where they travel with it.
"""

from __future__ import annotations

import os

from ..config import LoggingSettings
from ..errors import ConfigError
from ..public import Policy
from ..runstore import RunDir
from .libraries import import_all

PROJECT = "dragon-grpo-studio"
# What to install for each tracker; transformers' own availability checks decide (they are what TRL consults).
INSTALL = {"trackio": "pip install trackio", "tensorboard": "pip install tensorboard", "wandb": "pip install wandb"}


def check(settings: LoggingSettings, *, policy: Policy) -> None:
    """Refuse, before a run is created, a tracker that is not installed, or one that would leave a public demo."""
    if not settings.report_to:
        return  # transformers' integrations take seconds to import: the app's first page does not wait for them
    import_all()
    from transformers.integrations import is_tensorboard_available, is_trackio_available, is_wandb_available

    available = {"trackio": is_trackio_available, "tensorboard": is_tensorboard_available, "wandb": is_wandb_available}
    for name in settings.report_to:
        if policy.public and name != "tensorboard":
            raise ConfigError(f"logging.report_to: {name} would send this run's metrics outside this public demo "
                              "(to an account that is not yours); only tensorboard, which writes into the run "
                              "folder, is allowed here.")
        if not available[name]():
            raise ConfigError(f"logging.report_to lists {name}, which is not installed here: run `{INSTALL[name]}` "
                              "(or take it out of the list).")


def training_arguments(settings: LoggingSettings, run: RunDir) -> dict:
    """The GRPOConfig arguments: the trackers, the run's id as their run name, and the project trackio logs to
    (W&B reads its project from $WANDB_PROJECT, set here only when the user has not chosen one)."""
    if "wandb" in settings.report_to:
        os.environ.setdefault("WANDB_PROJECT", PROJECT)
    return {"report_to": list(settings.report_to) or "none", "run_name": run.id, "project": PROJECT}


def point_at_run(trainer, run: RunDir) -> None:
    """TensorBoard's default folder is under the checkpoints, with a timestamp and host name; the run folder's
    ``tensorboard/`` is where a person looks (``tensorboard --logdir runs``), and a resume keeps writing there."""
    from transformers.integrations import TensorBoardCallback

    for callback in trainer.callback_handler.callbacks:
        if isinstance(callback, TensorBoardCallback):
            callback.logging_dir = str(run.tensorboard_dir)
