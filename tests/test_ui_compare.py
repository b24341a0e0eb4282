"""The Compare tab, through the handlers its buttons are wired to (found by api_name in the built app)."""

from __future__ import annotations

import zipfile
from pathlib import Path

import gradio as gr
import pandas as pd
import plotly.graph_objects as go
import pytest
from conftest import handler
from conftest import stop_after_last_checkpoint

from dragon_ui.engine import weights
from dragon_ui.studio import compare
from dragon_ui.studio.backend import Studio
from dragon_ui.ui import build_app
from dragon_ui.public import LAPTOP
from dragon_ui.runstore import format_seconds

pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def app(runs_dir, finished_run):
    """The whole app over a runs folder holding one finished tiny run."""
    return build_app(Studio(runs_dir=runs_dir, policy=LAPTOP))


def test_selecting_a_run_shows_chart_and_table(app, finished_run):
    summary, figure, table, evaluate_row, free_prompt = handler(app, "compare_show")(finished_run.id)
    assert "before" in summary and "after" in summary
    assert isinstance(figure, go.Figure) and figure.layout.height and figure.layout.uirevision
    assert [trace.name for trace in figure.data] == ["before training", "after training"]
    assert list(figure.data[0].x) == ["total", "numeric", "length"]
    assert list(figure.data[1].y)[0] == pytest.approx(finished_run.read_eval()["after"]["reward_mean"])
    assert isinstance(table, pd.DataFrame) and list(table.columns) == compare.TABLE_HEADERS and len(table) == 3
    assert evaluate_row.visible is False
    assert free_prompt.placeholder == finished_run.read_samples()[0]["prompt"]  # the run's own task, not arithmetic


def test_refresh_lists_runs_and_keeps_the_shown_one(app, finished_run):
    dropdown, summary, figure, table, *_ = handler(app, "compare_runs")("", finished_run.id)
    assert dropdown.value == finished_run.id
    assert [value for _, value in dropdown.choices] == [finished_run.id]
    assert isinstance(figure, go.Figure) and len(table) == 3


def test_free_prompt_is_answered_by_both_models(app, finished_run, tiny_model_dir):
    """Each side is the reply its own model gives, computed here without the app: the base alone, and the base with
    the run's adapter (strengthened, so that the two differ)."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from conftest import strengthen_adapter

    strengthen_adapter(finished_run)
    before, after = handler(app, "compare_ask")(finished_run.id, "What is 3 + 4?", 12, 0.0)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "What is 3 + 4?"}], add_generation_prompt=True,
                                           return_tensors="pt", return_dict=True)

    def greedy(model) -> str:
        with torch.inference_mode():
            out = model.generate(**prompt, max_new_tokens=12, do_sample=False, pad_token_id=tokenizer.pad_token_id)
        return tokenizer.decode(out[0, prompt["input_ids"].shape[1]:], skip_special_tokens=True)

    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    assert before == greedy(base)
    assert after == greedy(PeftModel.from_pretrained(base, finished_run.adapter_dir).eval()) != before
    with pytest.raises(gr.Error, match="Type a prompt"):
        handler(app, "compare_ask")(finished_run.id, "", 12, 0.0)


def test_download_and_merge(app, finished_run):
    path = handler(app, "compare_zip")(finished_run.id)
    assert path.endswith(".zip") and zipfile.is_zipfile(path)
    archive, folder, status = handler(app, "compare_merge")(finished_run.id)
    assert (Path(folder) / "config.json").is_file() and folder in status
    with zipfile.ZipFile(archive) as zipped:  # the merged model as a download, not only a folder on the server
        assert f"{finished_run.id}-merged/config.json" in zipped.namelist()
    assert Path(archive).name in status and weights.format_size(Path(archive).stat().st_size) in status


def test_evaluate_now_streams_progress_and_can_be_cancelled(app, finished_run):
    stop_after_last_checkpoint(finished_run)
    assert handler(app, "compare_show")(finished_run.id)[3].visible is True

    evaluation = handler(app, "compare_evaluate")(finished_run.id)
    first = next(evaluation)
    assert "Loading the model" in first[0]
    assert "Cancelling" in handler(app, "compare_cancel")(finished_run.id)
    *_, last = evaluation
    assert "Cancelled" in last[0] and "after" not in finished_run.read_eval()

    outputs = list(handler(app, "compare_evaluate")(finished_run.id))
    status, summary, figure, table, evaluate_row, _ = outputs[-1]
    assert "Done" in status and "checkpoint-2" in summary
    assert figure.data[1].y[0] == pytest.approx(finished_run.read_eval()["after"]["reward_mean"])
    assert evaluate_row.visible is False
    assert any("answered" in output[0] for output in outputs[:-1])


def test_a_stopped_run_is_scored_as_it_is_shown_saying_how_long_it_takes(runs_dir, finished_run, monkeypatch):
    """A stopped run had no "after" in Compare until Evaluate now was found and pressed (62 s). Shown, one's own run
    becomes the page's run due for scoring, whose change starts it: once, not again at every look after a cancel."""
    from dragon_ui.ui import compare_tab

    studio = Studio(runs_dir=runs_dir, policy=LAPTOP)
    stop_after_last_checkpoint(finished_run)
    before_took = finished_run.read_eval()["before"]["seconds"]
    summary = compare_tab.comparison_outputs(studio, finished_run.id)[0]
    assert "is scored on them by itself" in summary and "Press Evaluate now" not in summary

    monkeypatch.setattr(studio.runs, "owns", lambda owner: False)  # another visitor's run: not due, left as it is
    assert compare_tab.scoring_due(studio, finished_run.id) == gr.skip()
    assert list(compare_tab.evaluate_unscored(studio, finished_run.id)) == [(gr.skip(),) * 6]
    assert "Press Evaluate now" in compare_tab.comparison_outputs(studio, finished_run.id)[0]
    monkeypatch.undo()

    assert compare_tab.scoring_due(studio, finished_run.id) == finished_run.id
    outputs = list(compare_tab.evaluate_unscored(studio, finished_run.id))
    assert f"It takes about {format_seconds(before_took)}" in outputs[0][0]
    assert "Done" in outputs[-1][0] and "after" in finished_run.read_eval()
    assert compare_tab.scoring_due(studio, finished_run.id) == gr.skip()  # scored: nothing due
    assert list(compare_tab.evaluate_unscored(studio, finished_run.id)) == [(gr.skip(),) * 6]
    assert compare_tab.scoring_due(studio, "") == gr.skip()


def test_scoring_right_after_stop_waits_for_the_training_to_exit(runs_dir, finished_run, monkeypatch):
    """A stopped training writes "stopped" a moment before its process exits: Compare opened at once was refused
    ("A training is running on this machine's CPU") and its automatic scoring was not tried again."""
    from dragon_ui.engine import training
    from dragon_ui.ui import compare_tab

    waited: list[float] = []

    class Ending:
        run = finished_run

        def is_alive(self) -> bool:
            return not waited

        def wait(self, timeout: float) -> str:
            waited.append(timeout)
            return "cancelled"

    stop_after_last_checkpoint(finished_run)
    monkeypatch.setattr(training, "_active", [Ending()])
    outputs = list(compare_tab.evaluate_unscored(Studio(runs_dir=runs_dir, policy=LAPTOP), finished_run.id))
    assert waited == [training.ENDING_S] and "Done" in outputs[-1][0]

    finished_run.update_status(state="running")  # one still training is not waited for
    waited.clear()
    training.wait_while_ending()
    assert waited == []


def test_the_scoring_starts_on_a_change_of_the_run_due_in_its_turns(app):
    """Showing the tab asks only whether a run is due (no turn of the model); the scoring runs on the change of
    the run due, one model at a time."""
    from dragon_ui.ui import compare_tab

    checks = [fn for fn in app.fns.values() if getattr(fn.fn, "func", None) is compare_tab.scoring_due]
    (scoring,) = [fn for fn in app.fns.values() if getattr(fn.fn, "func", None) is compare_tab.evaluate_unscored]
    assert len(checks) == 2  # the tab opened, a run picked
    ((due,),) = {tuple(check.outputs) for check in checks}
    assert isinstance(due, gr.State) and scoring.targets == [(due._id, "change")]
    assert scoring.concurrency_id == "models" and all(check.concurrency_id != "models" for check in checks)


def test_unknown_or_missing_runs_give_sentences(app, runs_dir):
    with pytest.raises(gr.Error, match="There is no run called 'nope'"):
        handler(app, "compare_show")("nope")
    for name, args in [("compare_ask", ("", "hi", 8, 0.0)), ("compare_zip", ("",)), ("compare_merge", ("",))]:
        with pytest.raises(gr.Error, match="Choose a run first"):
            handler(app, name)(*args)
    (status, *_), = list(handler(app, "compare_evaluate")("nope"))
    assert "There is no run called 'nope'" in status

    summary, figure, *_ = handler(app, "compare_show")("")
    assert "No run to compare yet" in summary and figure is None


def test_the_app_builds_with_no_runs(tmp_path):
    app = build_app(Studio(runs_dir=tmp_path / "empty", policy=LAPTOP))
    dropdown, summary, *_ = handler(app, "compare_runs")("", "")
    assert dropdown.choices == [] and dropdown.value is None and "No run to compare yet" in summary
