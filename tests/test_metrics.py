"""Metrics (``train: false``): a reward that training never sees, trained end to end on the tiny model. It is logged
each step and scored in the held-out checks, the model card, Compare, ``dragon eval`` and the leaderboard, and it
adds nothing to any total: not TRL's reward, not the sampled groups' totals (so not the advantages), not the
held-out total."""

from __future__ import annotations

import json

import pytest
from huggingface_hub import ModelCard

from dragon_ui import experiments
from dragon_ui.cli import main
from dragon_ui.config import RunConfig
from dragon_ui.engine import training
from dragon_ui.public import LAPTOP
from dragon_ui.engine.model_card import CARD_FILE
from dragon_ui.runstore import list_runs
from dragon_ui.rewards import stored_metrics
from dragon_ui.studio.compare import comparison
from dragon_ui.ui import plots

pytestmark = pytest.mark.timeout(300)

METRIC = {"kind": "contains", "name": "mentions_answer", "weight": 5.0, "train": False}


@pytest.fixture(scope="module")
def metric_run(tiny_model_dir, tmp_path_factory):
    from conftest import tiny_config

    folder = tmp_path_factory.mktemp("metric")
    config = tiny_config(tiny_model_dir, folder, folder / "runs")
    config["rewards"].append(METRIC)
    config["hardware"]["dtype"] = "float32"
    run = training.train_config(RunConfig.from_dict(config, policy=LAPTOP), policy=LAPTOP)
    assert run.read_status()["state"] == "succeeded", run.read_status().get("error")
    return run


def trained_total(scores: dict) -> float:
    """The tiny config's training total: numeric (weight 1) and length (weight 0.3); the metric's weight 5 unused."""
    return scores["numeric"] + 0.3 * scores["length"]


def test_training_logs_the_metric_and_leaves_it_out_of_every_total(metric_run):
    rows = metric_run.read_progress()
    assert len(rows) == 2
    for row in rows:
        assert set(row["rewards"]) == {"numeric", "length", "mentions_answer"}
        assert row["reward"] == pytest.approx(trained_total(row["rewards"]), abs=1e-5)  # TRL's own total
    completions = [c for rollout in metric_run.read_rollouts() for group in rollout["groups"]
                   for c in group["completions"]]
    assert completions and all("mentions_answer" in c["scores"] for c in completions)
    assert all(c["total"] == pytest.approx(trained_total(c["scores"]), abs=1e-5) for c in completions)


def test_the_held_out_checks_score_it_apart_from_the_total(metric_run):
    evaluation = metric_run.read_eval()
    for side in ("before", "after"):
        scored = evaluation[side]
        assert scored["metrics"] == ["mentions_answer"] and "mentions_answer" in scored["reward_breakdown"]
        assert scored["reward_mean"] == pytest.approx(trained_total(scored["reward_breakdown"]), abs=1e-6)
    assert all("mentions_answer" in check["rewards"] for check in metric_run.read_heldout())
    status = metric_run.read_status()
    assert status["heldout_after_scores"] == evaluation["after"]["reward_breakdown"]


def test_the_card_compare_the_cli_and_the_leaderboard_show_it_as_a_metric(metric_run, capsys):
    text = ModelCard.load(metric_run.adapter_dir / CARD_FILE).text
    assert "It was rewarded for: numeric, length. It was also measured by mentions_answer, which training never saw" \
        in text
    assert "| mentions_answer | metric, not trained on | the reply contains the reference" in text
    assert "| mentions_answer (metric) |" in text

    shown = comparison(metric_run)
    assert [bar["reward"] for bar in shown.bars] == ["total", "numeric", "length", "mentions_answer (metric)"]
    assert "mentions_answer is a metric: scored, but not part of the total and never trained on." in shown.summary

    assert main(["eval", str(metric_run.path)]) == 0
    assert "mentions_answer (metric)" in capsys.readouterr().out

    figure = plots.reward_figure(metric_run.read_progress(), ["numeric", "length", "mentions_answer"],
                                 metrics=stored_metrics(json.loads(metric_run.config_path.read_text())))
    assert [trace.name for trace in figure.data] == ["total", "numeric", "length", "mentions_answer (metric)"]

    summaries = list_runs(metric_run.path.parent)
    assert "mentions_answer" in experiments.rank_choices(summaries)
    (entry,) = experiments.leaderboard(summaries, by="mentions_answer")
    evaluation = metric_run.read_eval()
    assert entry.heldout_after == pytest.approx(evaluation["after"]["reward_breakdown"]["mentions_answer"], abs=1e-6)
