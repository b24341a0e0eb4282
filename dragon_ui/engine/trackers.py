"""Experiment trackers (``logging.report_to``): TRL's own integrations, pointed at the run. Nothing is logged
twice by hand; this module only checks the package is there before a run starts, names the run and the project,
and puts TensorBoard's event files into the run folder, where they travel with it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..config import LoggingSettings
from ..errors import ConfigError
from ..public import Policy
from ..runstore import RunDir
from .libraries import import_all

PROJECT = "dragon-grpo-studio"
# What a tracker reads from the environment only, where the user has not set it: W&B takes its project from
# $WANDB_PROJECT alone. The processes that train (the command line's, the app's training processes) set it as they
# start (missing_environment), so nothing below them writes the environment.
ENVIRONMENT = {"WANDB_PROJECT": PROJECT}
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


def missing_environment(environment: Mapping[str, str]) -> dict[str, str]:
    """What of ENVIRONMENT ``environment`` (a training process's, as it starts) does not set yet."""
    return {key: value for key, value in ENVIRONMENT.items() if key not in environment}


def training_arguments(settings: LoggingSettings, run: RunDir) -> dict[str, Any]:
    """The GRPOConfig arguments: the trackers, the run's id as their run name, and the project trackio logs to
    (W&B's comes from the environment: ENVIRONMENT)."""
    return {"report_to": list(settings.report_to) or "none", "run_name": run.id, "project": PROJECT}


def point_at_run(trainer, run: RunDir) -> None:
    """TensorBoard's default folder is under the checkpoints, with a timestamp and host name; the run folder's
    ``tensorboard/`` is where a person looks (``tensorboard --logdir runs``), and a resume keeps writing there."""
    from transformers.integrations import TensorBoardCallback

    for callback in trainer.callback_handler.callbacks:
        if isinstance(callback, TensorBoardCallback):
            callback.logging_dir = str(run.tensorboard_dir)
