"""The Data tab's handlers, called directly with good and bad inputs (no browser needed)."""

from __future__ import annotations

import json

import gradio as gr
import pandas as pd
import pytest

from dragon_ui.studio import ASSETS_DIR, Studio
from dragon_ui.ui import build_app, data_tab

DATASETS = ASSETS_DIR / "datasets"


@pytest.fixture
def studio(tmp_path):
    return Studio(runs_dir=tmp_path / "runs")


@pytest.fixture
def draft(studio, tiny_model_dir):
    """The default draft (arithmetic recipe) on the tiny model, whose chat template is <|user|>...<|assistant|>."""
    draft = studio.default_draft()
    draft["model"]["id"] = str(tiny_model_dir)
    return draft


def form(draft: dict, **changes) -> list:
    """The Data tab's form values for update_data, as the browser would send them (empty boxes as "")."""
    data = {**draft["data"], **changes}
    return [draft, data["source"], data["hub_config"] or "", data["hub_split"], data["prompt"],
            data["reference"] or "", data["system"] or "", data["eval_frac"]]


def outputs(values: tuple) -> dict:
    """update_data / pick_example / upload_file results by name."""
    assert len(values) == len(data_tab.UPDATED)
    return dict(zip(data_tab.UPDATED, values, strict=True))


def test_the_app_builds(studio):
    assert isinstance(build_app(studio), gr.Blocks)


def test_bundled_datasets_are_the_data_files():
    names = [name for name, _ in data_tab.bundled_datasets()]
    assert names == ["arithmetic.csv", "json_answers.jsonl", "think_answer.jsonl"]


def test_fill_fields_shows_the_draft_and_its_preview(draft):
    (source, example, hub_config, hub_split, prompt, reference, system, eval_frac, source_status, table,
     mapping_status, counts, rendered, lengths, previewed) = data_tab.fill_fields(draft)
    assert source == example == str(DATASETS / "arithmetic.csv")
    assert (hub_config, hub_split, eval_frac) == ("", "train", 0.05)
    assert (prompt.value, reference.value, system.value) == ("question", "answer", "")
    assert prompt.choices == [("question", "question"), ("answer", "answer")]
    assert source_status == mapping_status == ""
    assert isinstance(table, pd.DataFrame) and list(table.columns) == ["question", "answer"] and len(table) == 20
    assert "400 rows: 380 for training, 20 held out, 0 skipped." in counts
    assert "<|user|>What is 66 + 24? Reply with just the number.<|end|><|assistant|>" in rendered
    assert "Rendered with the chat template of local model" in rendered
    assert lengths.startswith("Prompt length in tokens: min ")
    assert previewed == f"{draft['model']['id']}@"


def test_upload_a_file_shows_its_columns_and_fits_the_mapping(draft, tmp_path):
    upload = tmp_path / "homework.jsonl"
    upload.write_text("".join(json.dumps({"problem": f"What is {i} * 2?", "solution": str(2 * i)}) + "\n"
                              for i in range(30)), encoding="utf-8")
    out = outputs(data_tab.upload_file(draft, str(upload), "question", "answer", "", 0.05))
    assert out["draft"]["data"] == {**draft["data"], "source": str(upload), "prompt": "problem",
                                    "reference": "solution"}
    assert draft["data"]["source"] == str(DATASETS / "arithmetic.csv")  # the input draft is left alone
    assert out["source"] == str(upload) and out["example"] is None
    assert list(out["table"].columns) == ["problem", "solution"] and len(out["table"]) == 20
    assert out["prompt"].value == "problem" and out["reference"].value == "solution"
    assert "The prompt now uses the column 'problem'" in out["mapping_status"]
    assert "30 rows: 28 for training, 2 held out, 0 skipped." in out["counts"]
    assert "<|user|>What is 0 * 2?<|end|><|assistant|>" in out["rendered"]


def test_pick_an_example_resets_the_hub_settings(draft):
    hub_draft = {**draft, "data": {**draft["data"], "hub_config": "main", "hub_split": "test"}}
    path = str(DATASETS / "think_answer.jsonl")
    out = outputs(data_tab.pick_example(hub_draft, path, "question", "answer", "", 0.05))
    assert out["draft"]["data"]["source"] == out["source"] == out["example"] == path
    assert (out["hub_config"], out["hub_split"]) == ("", "train")
    assert out["draft"]["data"]["hub_config"] is None and out["draft"]["data"]["hub_split"] == "train"
    assert "200 rows" in out["counts"] and out["mapping_status"] == ""
    assert data_tab.pick_example(draft, None, "question", "answer", "", 0.05) == (gr.skip(),) * len(data_tab.UPDATED)


@pytest.mark.parametrize("changes, where, fragment", [
    ({"prompt": "Q: {nope}"}, "mapping_status", "data.prompt uses the column 'nope' in its template"),
    ({"reference": "solution"}, "mapping_status", "data.reference 'solution' is neither a column"),
    ({"source": "/no/such/file.csv"}, "source_status", "data.source: no file at /no/such/file.csv."),
    ({"source": "someone/dataset"}, "source_status", "the Hugging Face Hub could not be reached"),
])
def test_bad_settings_give_a_sentence_next_to_the_field(draft, changes, where, fragment):
    out = outputs(data_tab.update_data(*form(draft, **changes)))
    assert fragment in out[where] and out[where].startswith("❌")
    other = "source_status" if where == "mapping_status" else "mapping_status"
    assert out[other] == ""
    assert out["counts"] == out["rendered"] == out["lengths"] == ""
    for key, value in changes.items():  # the draft records what was typed; validation at Start says the same
        assert out["draft"]["data"][key] == value


def test_template_and_system_message_and_held_out_fraction(draft):
    out = outputs(data_tab.update_data(*form(draft, prompt="Q: {question}", system="Answer briefly.",
                                             eval_frac=0.5)))
    assert out["draft"]["data"]["prompt"] == "Q: {question}"
    assert out["draft"]["data"]["system"] == "Answer briefly."
    assert out["draft"]["data"]["eval_frac"] == 0.5
    assert "400 rows: 200 for training, 200 held out" in out["counts"]
    assert "<|system|>Answer briefly.<|end|><|user|>Q: What is 66 + 24?" in out["rendered"]
    # fields the user may still be typing in are not overwritten: the source is skipped, the mappings get choices only
    assert out["source"] == out["hub_config"] == gr.skip()
    assert "value" not in out["prompt"].constructor_args and out["prompt"].choices[0] == ("question", "question")


def test_empty_reference_and_system_mean_not_used(draft):
    out = outputs(data_tab.update_data(*form(draft, reference="", system="")))
    assert out["draft"]["data"]["reference"] is None and out["draft"]["data"]["system"] is None
    assert "<|user|>" in out["rendered"] and "<|system|>" not in out["rendered"]


def test_without_a_tokenizer_prompts_are_plain_text_with_the_reason(draft):
    draft["model"]["id"] = "/no/such/model"
    out = outputs(data_tab.update_data(*form(draft)))
    assert "could not be loaded: model.id: no folder at /no/such/model" in out["rendered"]
    assert "user: What is 66 + 24?" in out["rendered"]
    assert out["lengths"].startswith("Prompt length in words: min 11")


def test_a_new_starting_model_refreshes_the_preview(draft):
    previewed = data_tab.fill_fields(draft)[-1]
    assert data_tab.refresh_for_model(draft, previewed) == (gr.skip(),) * 7  # nothing changed
    assert data_tab.refresh_for_model(draft, "") == (gr.skip(),) * 7  # no preview yet: fill_fields makes it
    other = {**draft, "model": {**draft["model"], "id": "/no/such/model"}}
    source_status, table, mapping_status, counts, rendered, lengths, now = data_tab.refresh_for_model(other, previewed)
    assert now == "/no/such/model@" and "plain system:/user: text" in rendered and "in words" in lengths
