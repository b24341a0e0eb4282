"""logging.report_to: validated with the config, a missing package refused before a run exists, nothing sent outside
a public demo, and TensorBoard for real: a tiny run writes its event files into its own folder, offline."""

from __future__ import annotations

from pathlib import Path

import pytest

from dragon_ui import public
from dragon_ui.config import RunConfig
from dragon_ui.engine import trackers, training
from dragon_ui.errors import ConfigError
from dragon_ui.public import LAPTOP

pytestmark = pytest.mark.timeout(300)


@pytest.mark.parametrize("given, expected", [
    (None, []),
    ([], []),
    ("tensorboard", ["tensorboard"]),
    ("", []),
    (["TensorBoard", "wandb"], ["tensorboard", "wandb"]),
    (["trackio"], ["trackio"]),
    ("mlflow", "logging.report_to[0] must be one of trackio, tensorboard, wandb; got 'mlflow'"),
    (["wandb", "wandb"], "names a tracker twice"),
    (3, "logging.report_to[0] must be one of trackio, tensorboard, wandb; got '3'"),
])
def test_report_to_is_validated_with_the_config(tiny_config_dict, given, expected):
    if given is not None:
        tiny_config_dict["logging"] = {"report_to": given}
    if isinstance(expected, list):
        assert RunConfig.from_dict(tiny_config_dict, policy=LAPTOP).logging.report_to == expected
    else:
        with pytest.raises(ConfigError, match=expected.replace("[", r"\[").replace("]", r"\]")):
            RunConfig.from_dict(tiny_config_dict, policy=LAPTOP)


def test_a_tracker_that_is_not_installed_is_refused_before_a_run_folder_exists(tiny_config_dict, runs_dir, monkeypatch):
    monkeypatch.setattr("transformers.integrations.is_wandb_available", lambda: False)
    tiny_config_dict["logging"] = {"report_to": ["wandb"]}
    with pytest.raises(ConfigError, match=r"lists wandb, which is not installed here: run `pip install wandb`"):
        training.train_config(RunConfig.from_dict(tiny_config_dict, policy=LAPTOP), policy=LAPTOP)
    assert not runs_dir.exists() or not any(runs_dir.iterdir())


@pytest.mark.parametrize("tracker", ["wandb", "trackio"])
def test_a_public_demo_sends_metrics_nowhere_outside_it(tiny_config_dict, monkeypatch, tracker):
    monkeypatch.setenv(public.PUBLIC_ENV, "1")
    config = RunConfig.from_dict({**tiny_config_dict, "logging": {"report_to": [tracker]}}, policy=LAPTOP)
    with pytest.raises(ConfigError, match="outside this public demo"):
        trackers.check(config.logging, policy=public.Policy.from_env(Path("runs")))
    trackers.check(RunConfig.from_dict({**tiny_config_dict, "logging": {"report_to": ["tensorboard"]}}, policy=LAPTOP).logging,
                   policy=public.Policy.from_env(Path("runs")))


def test_tensorboard_event_files_land_in_the_run_folder(tiny_config_dict):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tiny_config_dict["logging"] = {"report_to": ["tensorboard"]}
    run = training.train_config(RunConfig.from_dict(tiny_config_dict, policy=LAPTOP), policy=LAPTOP)
    assert run.read_status()["state"] == "succeeded", run.read_status().get("error")
    events = list(run.tensorboard_dir.glob("events.out.tfevents.*"))
    assert events, sorted(p.name for p in run.path.iterdir())
    assert not list(run.checkpoints_dir.glob("runs"))  # not transformers' default place
    accumulator = EventAccumulator(str(events[0].parent)).Reload()
    scalars = accumulator.Tags()["scalars"]
    assert {"train/reward", "train/kl", "train/rewards/numeric/mean"} <= set(scalars), scalars
    assert [event.step for event in accumulator.Scalars("train/reward")] == [1, 2]


def test_the_model_tab_says_a_tracker_is_missing_next_to_its_boxes(studio, monkeypatch):
    from dragon_ui.ui import model_tab

    monkeypatch.setattr("transformers.integrations.is_trackio_available", lambda: False)
    draft = studio.recipes.default()
    draft["logging"] = {"report_to": ["trackio"]}
    preview = model_tab.build_preview(studio, draft, {"logging.report_to": "Also log to"})
    assert "Also log to lists trackio, which is not installed here: run `pip install trackio`" in preview.check
    assert "not installed" in preview.problems["training"]  # shown under the Training column, where the boxes are
    draft["logging"] = {"report_to": ["tensorboard"]}
    assert "The settings are valid" in model_tab.build_preview(studio, draft).check
