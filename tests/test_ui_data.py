"""The Data tab's handlers, called directly with good and bad inputs (no browser needed).

The handlers get the draft the form composes from what the screen shows (common.Form.compose); these tests compose
it the same way, from the app's own form, so empty boxes mean what they mean on the screen.
"""

from __future__ import annotations

import json
from pathlib import Path

import gradio as gr
import pandas as pd
import pytest

from dragon_ui import ASSETS_DIR
from dragon_ui.studio.backend import Studio
from dragon_ui.ui import build_app, data_tab
from dragon_ui.ui.common import Form, message
from dragon_ui.public import LAPTOP

DATASETS = ASSETS_DIR / "datasets"
ARITHMETIC = str(DATASETS / "arithmetic.csv")


@pytest.fixture
def studio(tmp_path):
    return Studio(runs_dir=tmp_path / "runs", policy=LAPTOP)


@pytest.fixture(scope="module")
def form(tmp_path_factory) -> Form:
    """The app's form: its fields, their config paths and their labels."""
    return build_app(Studio(runs_dir=tmp_path_factory.mktemp("runs"), policy=LAPTOP)).form


@pytest.fixture(scope="module")
def labels(form) -> dict[str, str]:
    return form.labels


@pytest.fixture
def draft(studio, tiny_model_dir):
    """The default draft (arithmetic recipe) on the tiny model, whose chat template is <|user|>...<|assistant|>."""
    draft = studio.recipes.default()
    draft["model"]["id"] = str(tiny_model_dir)
    return draft


def value_at(draft: dict, path: str):
    for part in path.split("."):
        draft = draft.get(part) if isinstance(draft, dict) else None
    return draft


def on_screen(form: Form, draft: dict, shown: dict | None = None) -> dict:
    """The draft handlers get when the form shows ``draft`` with some fields typed in (``shown``: path -> what the
    field holds, "" for an empty box)."""
    shown = shown or {}
    return form.compose(draft, *(shown.get(f.path, value_at(draft, f.path)) for f in form.fields))


def shown_table(draft: dict) -> list:
    """The shown_table state after the draft's data was previewed: the table it reads."""
    return data_tab.table_identity(data_tab.data_config(draft))


def outputs(values: tuple) -> dict:
    """update_data / use_source results by name."""
    assert len(values) == len(data_tab.UPDATED)
    return dict(zip(data_tab.UPDATED, values, strict=True))


def last(answers):
    """The last of a generator handler's answers."""
    *_, answer = answers
    return answer


def is_skip(value) -> bool:
    return isinstance(value, dict) and value == gr.skip()


def homework(tmp_path, rows: int = 30):
    """A JSONL file whose columns fit none of the arithmetic recipe's mapping."""
    path = tmp_path / "homework.jsonl"
    path.write_text("".join(json.dumps({"problem": f"What is {i} * 2?", "solution": str(2 * i)}) + "\n"
                            for i in range(rows)), encoding="utf-8")
    return path


def test_the_app_builds_with_the_data_fields_in_its_form(studio):
    demo = build_app(studio)
    assert isinstance(demo, gr.Blocks)
    labels = demo.form.labels
    assert {path: labels[path] for path in data_tab.MAPPING_PATHS} == {
        "data.prompt": "Prompt", "data.reference": "Reference answer", "data.system": "System message"}
    assert labels["data.source"] == "Data source"


def test_the_form_composes_the_draft_from_what_it_shows(form, draft):
    assert on_screen(form, draft) == draft  # a loaded draft shown unedited composes back to itself
    composed = on_screen(form, draft, {"data.source": f"  {ARITHMETIC} ", "data.reference": "", "data.system": "",
                                       "data.hub_config": "", "data.hub_split": "", "data.eval_frac": 0.5})
    assert composed["data"] == {**draft["data"], "source": ARITHMETIC, "reference": None, "system": None,
                                "hub_config": None, "hub_split": "train", "eval_frac": 0.5}
    assert draft["data"]["eval_frac"] == 0.05  # the loaded draft is left alone


@pytest.mark.parametrize("shown, max_rows", [("", None), (None, None), (" ", None), ("30", 30), (" 30 ", 30),
                                             ("3e1", 30.0), ("thirty", "thirty")])
def test_max_rows_is_empty_for_all_and_otherwise_what_was_typed(form, draft, shown, max_rows):
    """Whatever is not a number goes on as typed, for the check to refuse in words."""
    assert on_screen(form, draft, {"data.max_rows": shown})["data"]["max_rows"] == max_rows


def test_bundled_datasets_are_the_data_files():
    names = [name for name, _ in data_tab.bundled_datasets()]
    assert names == ["arithmetic.csv", "big_products.csv", "json_answers.jsonl", "opposites.csv", "products.csv",
                     "small_sums.csv", "think_answer.jsonl"]


def test_a_loaded_draft_shows_at_once_and_its_preview_follows(draft, labels):
    """fill_fields puts the draft in the fields without reading the data (the form appears at once); show_preview
    then reads it, writing no field the user may be typing in."""
    source, example, hub_config, hub_split, prompt, prompt_column, reference, system, eval_frac, max_rows, sheet = \
        data_tab.fill_fields(draft, policy=LAPTOP)
    assert not sheet.visible  # a CSV has no sheets
    assert source == example == Path(ARITHMETIC).name  # a bundled dataset shown by its name, not the package's folder
    assert (hub_config, hub_split, eval_frac, max_rows) == ("", "train", 0.05, "")
    assert (prompt, reference.value, system.value) == ("question", "answer", "")
    out = outputs(last(data_tab.show_preview(draft, labels, policy=LAPTOP)))
    assert all(is_skip(out[name]) for name in ("source", "hub_config", "hub_split", "prompt"))
    assert out["prompt_column"].choices == [("question", "question"), ("answer", "answer")]
    assert out["source_status"] == out["mapping_status"] == ""
    table = out["table"]
    assert isinstance(table, pd.DataFrame) and list(table.columns) == ["question", "answer"] and len(table) == 20
    assert "400 rows: 380 for training, 20 held out, 0 skipped." in out["counts"]
    assert "<|user|>What is 66 + 24? Reply with just the number.<|end|><|assistant|>" in out["rendered"]
    assert "Rendered with the chat template of local model" in out["rendered"]
    assert out["lengths"].startswith("Prompt length in tokens: min ")
    assert out["shown_table"] == [ARITHMETIC, None, "train"]
    assert out["previewed_model"] == f"{draft['model']['id']}@"


def test_upload_a_file_shows_its_columns_and_fits_the_mapping(form, labels, draft, tmp_path):
    upload = homework(tmp_path)
    before = json.dumps(draft, sort_keys=True)
    out = outputs(data_tab.use_source(on_screen(form, draft), str(upload), shown_table(draft), labels, policy=LAPTOP))
    assert json.dumps(draft, sort_keys=True) == before  # the draft it was given is left alone
    assert out["source"] == str(upload) and out["example"] is None
    assert (out["hub_config"], out["hub_split"]) == ("", "train")
    assert list(out["table"].columns) == ["problem", "solution"] and len(out["table"]) == 20
    # the mapping fields show the fitted columns, with the new choices
    assert out["prompt"] == "problem" and out["reference"].value == "solution"
    assert out["prompt_column"].choices == [("problem", "problem"), ("solution", "solution")]
    assert out["system"].value == ""
    assert "The prompt now uses the column 'problem'" in out["mapping_status"]
    assert "30 rows: " in out["counts"] and "0 skipped" in out["counts"]  # the held-out share is the engine's
    assert "<|user|>What is 0 * 2?<|end|><|assistant|>" in out["rendered"]
    assert out["shown_table"] == [str(upload), None, "train"]


def test_pick_an_example_resets_the_hub_settings(form, labels, draft):
    shown = on_screen(form, draft, {"data.hub_config": "main", "data.hub_split": "test"})
    path = str(DATASETS / "think_answer.jsonl")
    out = outputs(data_tab.use_source(shown, path, shown_table(shown), labels, policy=LAPTOP))
    assert out["source"] == out["example"] == Path(path).name
    assert (out["hub_config"], out["hub_split"]) == ("", "train")
    assert out["shown_table"] == [path, None, "train"]
    assert "200 rows" in out["counts"] and out["source_status"] == ""
    assert data_tab.use_source(shown, None, shown_table(shown), labels, policy=LAPTOP) == (gr.skip(),) * len(data_tab.UPDATED)


@pytest.mark.parametrize("typed, refits", [
    ("same table", False),  # the table previewed: a mapping that does not fit is explained, not replaced
    ("other table", True),  # a newly typed path: the mapping is fitted to it and the fields show the new values
    ("nothing shown yet", True),
])
def test_the_mapping_is_fitted_only_when_the_table_changes(form, labels, draft, tmp_path, typed, refits):
    upload = str(homework(tmp_path))
    shown = on_screen(form, draft, {"data.source": upload})
    before = {"same table": [upload, None, "train"], "other table": [ARITHMETIC, None, "train"],
              "nothing shown yet": []}[typed]
    out = outputs(data_tab.update_data(shown, before, labels, policy=LAPTOP))
    assert is_skip(out["source"])  # typed by the user: never written back
    assert out["shown_table"] == [upload, None, "train"]
    if refits:
        assert out["prompt"] == "problem" and out["reference"].value == "solution"
        assert "The prompt now uses the column 'problem'" in out["mapping_status"]
        assert "30 rows" in out["counts"]
    else:
        assert is_skip(out["prompt"])  # what is typed there stays
        assert out["prompt_column"].choices[0] == ("problem", "problem")
        assert "Prompt 'question' is neither a column" in out["mapping_status"]
        assert out["counts"] == ""


@pytest.mark.parametrize("shown, where, words", [
    ({"data.prompt": "Q: {nope}"}, "mapping_status", ["Prompt uses the column 'nope' in its template"]),
    ({"data.reference": "solution"}, "mapping_status", ["Reference answer 'solution' is neither a column"]),
    ({"data.system": "Be {tone}."}, "mapping_status", ["System message uses the column 'tone'"]),
    ({"data.prompt": "Q: {question"}, "mapping_status", ["Prompt has an unmatched '{' or '}'"]),
    ({"data.source": "/no/such/file.csv"}, "source_status", ["Data source: no file at /no/such/file.csv."]),
    ({"data.source": "someone/dataset"}, "source_status",
     ["the Hugging Face Hub could not be reached", "set “Data source” to that file"]),
])
def test_bad_settings_give_a_sentence_in_the_forms_words_next_to_the_field(form, labels, draft, shown, where,
                                                                              words):
    composed = on_screen(form, draft, shown)
    out = outputs(data_tab.update_data(composed, shown_table(composed), labels, policy=LAPTOP))
    for fragment in words:
        assert fragment in out[where]
    assert "data." not in out[where]  # no config paths: the labels on the screen
    if where == "mapping_status":  # the data could be read: the sentence says which columns it has, once
        assert out[where].count("question, answer") == 1
    other = "source_status" if where == "mapping_status" else "mapping_status"
    assert out[other] == ""
    assert out["counts"] == out["rendered"] == out["lengths"] == ""


def test_a_mapping_problem_lists_the_columns_when_the_engine_does_not(form, labels, draft, tmp_path):
    data = tmp_path / "blank.csv"
    data.write_text("question,answer\n,1\n,2\n", encoding="utf-8")
    composed = on_screen(form, draft, {"data.source": str(data)})
    out = outputs(data_tab.update_data(composed, shown_table(composed), labels, policy=LAPTOP))
    assert "Prompt gave empty text for all 2 rows" in out["mapping_status"]
    assert "The columns of this data are: question, answer." in out["mapping_status"]
    assert out["source_status"] == ""


def test_without_labels_the_messages_keep_the_config_paths(draft):
    draft["data"]["prompt"] = "Q: {nope}"
    out = outputs(data_tab.update_data(draft, shown_table(draft), policy=LAPTOP))
    assert "data.prompt uses the column 'nope'" in out["mapping_status"]


def test_template_and_system_message_and_held_out_fraction(form, labels, draft):
    composed = on_screen(form, draft, {"data.prompt": "Q: {question}", "data.system": "Answer briefly.",
                                       "data.eval_frac": 0.5})
    out = outputs(data_tab.update_data(composed, shown_table(composed), labels, policy=LAPTOP))
    assert out["mapping_status"] == out["source_status"] == ""
    assert "400 rows: 200 for training, 200 held out" in out["counts"]
    assert "<|system|>Answer briefly.<|end|><|user|>Q: What is 66 + 24?" in out["rendered"]
    # fields the user may still be typing in are not overwritten: the source is skipped, the mappings get choices only
    assert is_skip(out["source"]) and is_skip(out["hub_config"]) and is_skip(out["hub_split"])
    assert is_skip(out["prompt"])
    for field in ("reference", "system"):
        assert "value" not in out[field].constructor_args
    assert out["prompt_column"].choices[0] == ("question", "question")


def test_empty_reference_and_system_mean_not_used(form, labels, draft):
    composed = on_screen(form, draft, {"data.reference": "", "data.system": ""})
    assert composed["data"]["reference"] is None and composed["data"]["system"] is None
    out = outputs(data_tab.update_data(composed, shown_table(composed), labels, policy=LAPTOP))
    assert "<|user|>" in out["rendered"] and "<|system|>" not in out["rendered"]
    assert out["mapping_status"] == ""


def test_without_a_tokenizer_prompts_are_plain_text_with_the_reason(form, labels, draft):
    composed = on_screen(form, draft, {"model.id": "/no/such/model"})
    out = outputs(data_tab.update_data(composed, shown_table(composed), labels, policy=LAPTOP))
    assert "could not be loaded: model.id: no folder at /no/such/model" in out["rendered"]
    assert "user: What is 66 + 24?" in out["rendered"]
    assert out["lengths"].startswith("Prompt length in words: min 11")
    assert out["previewed_model"] == "/no/such/model@"


def test_while_the_tokenizer_loads_the_table_and_counts_show_first_and_the_prompts_follow(draft, labels,
                                                                                           monkeypatch):
    """A page opened as the app starts: its libraries are still being imported, so the starting model's tokenizer
    is not there yet. The preview shows what needs no tokenizer at once, and no lengths in words that a moment later
    become lengths in tokens."""
    from dragon_ui.studio import playground

    playground.preview_tokenizer(playground.ModelConfig(id=draft["model"]["id"]), policy=LAPTOP)  # loaded: answers from now on
    loading = {"yes": True}
    waits = []

    def tokenizer_of(draft_, wait=True, *, policy):
        waits.append(wait)
        return None if loading["yes"] and not wait else playground.draft_tokenizer(draft_, wait, policy=policy)

    monkeypatch.setattr(data_tab, "draft_tokenizer", tokenizer_of)
    first, then = (outputs(answer) for answer in data_tab.show_preview(draft, labels, policy=LAPTOP))
    assert waits == [False, True]
    assert first["table"].equals(then["table"]) and first["counts"] == then["counts"]
    assert "400 rows: 380 for training, 20 held out" in first["counts"]
    assert first["rendered"] == f"ℹ️ Loading the tokenizer of {draft['model']['id']} to show the prompts as it reads " \
                                "them…"
    assert first["lengths"] == "" and then["lengths"].startswith("Prompt length in tokens")
    assert "<|user|>What is 66 + 24?" in then["rendered"]
    assert first["previewed_model"] == then["previewed_model"]  # a new model is rendered anew either way

    loading["yes"] = False
    waits.clear()
    assert len(list(data_tab.show_preview(draft, labels, policy=LAPTOP))) == 1 and waits == [False]  # no half step


def test_a_new_starting_model_refreshes_the_preview(draft, labels):
    previewed = last(data_tab.show_preview(draft, labels, policy=LAPTOP))[-1]
    assert data_tab.refresh_for_model(draft, previewed, labels, policy=LAPTOP) == (gr.skip(),) * 8  # nothing changed
    assert data_tab.refresh_for_model(draft, "", labels, policy=LAPTOP) == (gr.skip(),) * 8  # no preview yet: show_preview makes it
    other = {**draft, "model": {**draft["model"], "id": "/no/such/model"}}
    source_status, table, mapping_status, counts, rendered, lengths, _, now = data_tab.refresh_for_model(
        other, previewed, labels, policy=LAPTOP)
    assert now == "/no/such/model@" and "plain system:/user: text" in rendered and "in words" in lengths
    assert source_status == mapping_status == "" and "400 rows" in counts


def test_refreshing_for_a_model_words_a_mapping_problem_with_the_labels(draft, labels):
    previewed = last(data_tab.show_preview(draft, labels, policy=LAPTOP))[-1]
    other = {**draft, "model": {**draft["model"], "id": "/no/such/model"},
             "data": {**draft["data"], "reference": "solution"}}
    source_status, table, mapping_status, *_ = data_tab.refresh_for_model(other, previewed, labels, policy=LAPTOP)
    assert "Reference answer 'solution' is neither a column" in mapping_status and source_status == ""


def test_an_empty_prompt_suggests_the_files_own_columns(draft, tmp_path):
    """The issue's case: a file with columns text, name, city and no prompt chosen yet names those columns."""
    people = tmp_path / "people.csv"
    people.write_text("text,name,city\n" + "Hana moved to Riga last spring.,Hana,Riga\n" * 30, encoding="utf-8")
    labels = build_app(Studio(runs_dir=tmp_path / "runs", policy=LAPTOP)).form.labels
    draft["data"].update(source=str(people), prompt="", reference=None)
    out = outputs(data_tab.update_data(draft, data_tab.table_identity(data_tab.data_config(draft)), labels, policy=LAPTOP))
    assert "Prompt is empty" in out["mapping_status"] and "question" not in out["mapping_status"]
    assert out["mapping_status"].count("text, name, city") == 1, out["mapping_status"]


def test_an_upload_becomes_the_source_and_says_which_file_it_is(studio, form, labels, draft, tmp_path):
    """The handler the upload event runs, called alone: the file where the web server put it is the source, and the
    source's line names the file, as it does again once the previews queued before it have answered."""
    studio.files.serve_from(tmp_path)  # where uploads arrive on your own machine
    upload = homework(tmp_path)
    shown = on_screen(form, draft)
    out = outputs(data_tab.take_upload(studio, shown, str(upload), shown_table(draft), labels))
    assert out["source"] == str(upload) and out["prompt"] == "problem"  # the mapping fitted to its columns
    assert out["source_status"] == message("Your file homework.jsonl.", "ok")
    shown["data"].update(source=str(upload), prompt="problem", reference="solution")
    again = outputs(data_tab.reshow_upload(shown, out["shown_table"], labels, policy=LAPTOP))
    assert again["source_status"] == message("Your file homework.jsonl.", "ok") and len(again["table"]) == 20
    assert data_tab.take_upload(studio, shown, None, shown_table(draft), labels) == (gr.skip(),) * len(data_tab.UPDATED)


@pytest.mark.parametrize("where, said", [
    ("elsewhere", "That file was not uploaded here; upload it again."),
    ("unreadable", "broken.xlsx"),
])
def test_an_upload_that_cannot_be_used_is_explained_next_to_the_source_alone(studio, labels, draft, tmp_path, where,
                                                                              said):
    studio.files.serve_from(tmp_path / "uploads")
    if where == "elsewhere":  # a path an event may name, outside where uploads arrive
        path = ARITHMETIC
    else:
        path = tmp_path / "uploads" / "broken.xlsx"
        path.parent.mkdir()
        path.write_bytes(b"not a spreadsheet")
    out = outputs(data_tab.take_upload(studio, draft, str(path), shown_table(draft), labels))
    assert {name for name, value in out.items() if not is_skip(value)} == {"source_status"}
    assert out["source_status"].startswith(message("", "error")) and said in out["source_status"]


def test_a_picked_example_is_the_source_it_shows(form, labels, draft):
    path = str(DATASETS / "opposites.csv")
    out = outputs(data_tab.use_picked_source(on_screen(form, draft), path, shown_table(draft), labels, policy=LAPTOP))
    assert out["source"] == out["example"] == Path(path).name and out["shown_table"] == [path, None, "train"]
    assert data_tab.use_picked_source(draft, None, shown_table(draft), labels, policy=LAPTOP) == (
        (gr.skip(),) * len(data_tab.UPDATED))


def test_the_difficulty_filter_shows_with_its_clear_button_only_when_set(draft):
    said, button = data_tab.show_difficulty(draft)
    assert said == "" and button.visible is False
    draft["data"].update(pass_rates={"1": 0.0, "2": 0.5, "3": 1.0}, min_pass_rate=0.1, max_pass_rate=0.9)
    said, button = data_tab.show_difficulty(draft)
    assert "leaves out the 2 of 3 rows" in said and button.visible is True
