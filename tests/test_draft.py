"""The draft the app edits (dragon_ui.studio.draft): composed from the form, compared, named after the data, and the
engine's problems with it said in the form's words and placed with the fields they concern.

The messages are the engine's own, produced by validating real bad configs, and the labels are the app's own
(``build_app(studio).form.labels``), so a reworded check or a renamed field shows up here.
"""

from __future__ import annotations

import copy
from pathlib import Path

import gradio as gr
import pytest

from dragon_ui.config import RunConfig, setting_help
from dragon_ui.errors import DragonError
from dragon_ui.studio import draft as drafts
from dragon_ui import ASSETS_DIR
from dragon_ui.studio.backend import Studio
from dragon_ui.studio.draft import Problem, compose, ordinal, place_problem, renamed, run_name_for, same_settings, set_path
from dragon_ui.ui import build_app, model_tab
from dragon_ui.ui.common import message
from dragon_ui.public import LAPTOP

MODEL_TAB_PATHS = [f"{section}.{setting.key}" for section, settings in model_tab.SECTIONS.items()
                   for setting in settings] + ["name"]


@pytest.fixture(scope="module")
def form(tmp_path_factory):
    """The app's form (built once for this module: its labels and conversions do not depend on the runs)."""
    return build_app(Studio(runs_dir=tmp_path_factory.mktemp("runs"), policy=LAPTOP)).form


@pytest.fixture(scope="module")
def labels(form) -> dict[str, str]:
    return form.labels


def engine_message(config: dict) -> str:
    """What the engine says about a config it refuses."""
    with pytest.raises(DragonError) as refused:
        RunConfig.from_dict(copy.deepcopy(config), policy=LAPTOP)
    return str(refused.value)


def get_path(draft: dict, path: str):
    value = draft
    for part in path.split("."):
        value = (value or {}).get(part)
    return value


# ----------------------------------------------------------------------------------------------------------------
# Problems in the form's words.

SYNTAX_ERROR = {"kind": "custom", "name": "my_check", "function": "my_check",
                "code": "def my_check(prompt, completion, reference, row) return 1.0"}
NO_FUNCTION = {"kind": "custom", "name": "my_check", "function": "my_check", "code": "score = 1.0"}

# (what is changed in the tiny config, section, path, the sentence's start, other words it must contain)
PROBLEMS = [
    ({"training.learning_rate": 0}, "training", "training.learning_rate",
     "Learning rate must be above 0 and at most 1 (got 0", ["LoRA on a model under 1B parameters usually trains well"]),
    ({"training.max_steps": "many"}, "training", "training.max_steps", "Max steps must be a whole number", ["'many'"]),
    ({"grpo.group_size": 1}, "grpo", "grpo.group_size", "Group size must be between 2 and 64", ["got 1"]),
    ({"grpo.temperature": 0.0}, "grpo", "grpo.temperature", "Temperature must be above 0 and at most 3", []),
    ({"model.id": ""}, "model", "model.id", "Starting model is empty", ["a Hub id like"]),
    ({"lora.target_modules": []}, "lora", "lora.target_modules", "Target modules is empty", ["all-linear"]),
    ({"lora.target_modules": ["lm_head"]}, "lora", "lora.target_modules", "Target modules must not include lm_head",
     []),
    ({"hardware.device": "tpu"}, "hardware", "hardware.device", "Device must be one of auto, cuda, mps, cpu", ["'tpu'"]),
    ({"hardware.load_in_4bit": True, "lora.enabled": False}, "hardware", "hardware.load_in_4bit",
     "4-bit weights (QLoRA) needs LoRA (“Train a LoRA adapter” ticked)", ["cannot be trained directly"]),
    ({"data.prompt": ""}, "data", "data.prompt", "Prompt is empty", ["the column that holds the prompts"]),
    ({"data.source": ""}, "data", "data.source", "Data source is empty", ["Hub dataset id"]),
    ({"data.eval_frac": 0.9}, "data", "data.eval_frac", "Held-out fraction must be a number from 0 to 0.5", ["0.9"]),
    ({"distributed.strategy": "tp"}, "distributed", "distributed.strategy", "Multi-GPU strategy must be one of", []),
    ({"generation.vllm_server_url": "http://10.0.0.5:8000"}, "generation", "generation.vllm_server_url",
     "vLLM server URL is only used with “Generation” vllm-server", []),
    ({"rewards": []}, "rewards", "rewards", "Rewards must be a non-empty list of rewards", []),
    ({"rewards[+]": [{"kind": "exact"}, SYNTAX_ERROR]}, "rewards", "rewards[3].code",
     "The 4th reward (my_check): the Python code has a syntax error on line 1: ", []),
    ({"rewards[+]": [{"kind": "exact"}, NO_FUNCTION]}, "rewards", "rewards[3].code",
     "The 4th reward (my_check): the Python code defines no function named 'my_check'", []),
    ({"rewards[+]": [{"kind": "regex", "name": "shape", "pattern": "("}]}, "rewards", "rewards[2].pattern",
     "The 3rd reward (shape): the regular expression is not a valid regular expression", []),
    ({"rewards[+]": [{"kind": "nope"}]}, "rewards", "rewards[2].kind",
     "The 3rd reward (nope): the kind 'nope' is not a known reward kind", ["numeric"]),
    ({"rewards[1].weight": -1}, "rewards", "rewards[1].weight", "The 2nd reward (length): the weight must be zero "
     "or more", []),
    ({"training.foo": 1}, "training", "training", "training has an unknown setting 'foo'", ["learning_rate"]),
    ({"foo": 1}, None, None, "config has an unknown setting 'foo'", []),
]


def bad_config(base: dict, edits: dict) -> dict:
    config = copy.deepcopy(base)
    for path, value in edits.items():
        if path == "rewards[+]":
            config["rewards"] += value
        elif path.startswith("rewards["):
            index, key = int(path[len("rewards["):path.index("]")]), path.split(".", 1)[1]
            config["rewards"][index][key] = value
        else:
            set_path(config, path, value)
    return config


@pytest.mark.parametrize(("edits", "section", "path", "start", "words"), PROBLEMS,
                         ids=[",".join(edits) for edits, *_ in PROBLEMS])
def test_engine_problems_are_placed_and_said_with_the_forms_labels(tiny_config_dict, labels, edits, section, path,
                                                                    start, words):
    RunConfig.from_dict(copy.deepcopy(tiny_config_dict), policy=LAPTOP)  # the base is valid: the edit is the problem
    config = bad_config(tiny_config_dict, edits)
    problem = place_problem(engine_message(config), labels, config["rewards"])
    assert (problem.section, problem.path) == (section, path)
    assert problem.text.startswith(start), problem.text
    assert all(word in problem.text for word in words), problem.text
    # No dotted config path of a field on the screen is left in the sentence: each became its label.
    assert not [p for p in labels if "." in p and p in problem.text], problem.text


def test_every_label_starts_a_message_about_its_setting(labels):
    for path, label in labels.items():
        section = path.split(".")[0]
        assert section in drafts.SECTIONS, path  # a problem about any field can be placed
        assert place_problem(f"{path} must be something else.", labels) == Problem(
            section, path, f"{label} must be something else.")


def test_placing_without_labels_or_without_a_path():
    assert place_problem("training.learning_rate must be above 0.", {}) == Problem(
        "training", "training.learning_rate", "training.learning_rate must be above 0.")
    assert place_problem("rewards[0].pattern is not valid.", {}, []) == Problem(
        "rewards", "rewards[0].pattern", "The 1st reward: the regular expression is not valid.")
    assert place_problem("rewards[0] must be a mapping.", {}, [{"kind": "exact", "name": "same"}]) == Problem(
        "rewards", "rewards[0]", "The 1st reward (same) must be a mapping.")
    general = place_problem("Something went wrong: ValueError: boom", {"training.learning_rate": "Learning rate"})
    assert general == Problem(None, None, "Something went wrong: ValueError: boom")
    assert place_problem("", {}) == Problem(None, None, "")


def test_other_paths_in_a_sentence_become_quoted_labels(labels):
    text = place_problem("grpo.beta is too high for training.learning_rate 1.", labels).text
    assert text == "Beta (KL penalty) is too high for “Learning rate” 1."
    text = place_problem("Try lora.enabled: false, or hardware.load_in_4bit: true.", labels).text
    assert text == "Try “Train a LoRA adapter” unticked, or “4-bit weights (QLoRA)” ticked."
    # Single words that are also sections stay words; longer paths are not cut by shorter ones.
    assert place_problem("Give every reward a name.", labels).text == "Give every reward a name."
    assert "training.learning_rates" in place_problem("See training.learning_rates.", labels).text


@pytest.mark.parametrize(("section", "tab"), [("data", "Data"), ("rewards", "Rewards"), ("training", "Model & Hardware"),
                                              ("hardware", "Model & Hardware"), ("generation", "Model & Hardware"),
                                              (None, None)])
def test_a_problem_names_its_tab_when_seen_from_another(section, tab):
    problem = Problem(section, None, "Something is wrong")
    assert problem.tab == tab
    for shown_on in ("Data", "Rewards", "Model & Hardware"):
        expected = "Something is wrong" if tab in (None, shown_on) else f"Something is wrong (on the {tab} tab)"
        assert problem.seen_from(shown_on) == expected


@pytest.mark.parametrize(("number", "words"), [(1, "1st"), (2, "2nd"), (3, "3rd"), (4, "4th"), (10, "10th"),
                                               (11, "11th"), (12, "12th"), (13, "13th"), (20, "20th"), (21, "21st"),
                                               (22, "22nd"), (23, "23rd"), (101, "101st"), (111, "111th"),
                                               (112, "112th"), (0, "0th")])
def test_ordinal(number, words):
    assert ordinal(number) == words


# ----------------------------------------------------------------------------------------------------------------
# Composing and comparing drafts.


def test_set_path_creates_missing_sections():
    draft = {"training": {"epochs": 1.0}}
    set_path(draft, "training.learning_rate", 1e-5)
    set_path(draft, "generation.backend", "transformers")
    set_path(draft, "name", "run")
    set_path(draft, "a.b.c", 1)
    assert draft == {"training": {"epochs": 1.0, "learning_rate": 1e-5}, "generation": {"backend": "transformers"},
                     "name": "run", "a": {"b": {"c": 1}}}


def test_compose_writes_every_value_over_the_loaded_draft_without_changing_it():
    loaded = {"training": {"epochs": 1.0, "grad_accum": 3}, "rewards": [{"kind": "numeric"}], "name": "old"}
    original = copy.deepcopy(loaded)
    new = compose(loaded, {"training.epochs": 2.0, "name": "new", "rewards": [{"kind": "exact"}], "lora.r": 8})
    assert new == {"training": {"epochs": 2.0, "grad_accum": 3}, "rewards": [{"kind": "exact"}], "name": "new",
                   "lora": {"r": 8}}
    assert loaded == original
    new["training"]["grad_accum"] = 9
    assert loaded == original  # a deep copy: editing the result leaves the loaded draft alone
    assert compose({}, {"model.id": "x"}) == compose(None, {"model.id": "x"}) == {"model": {"id": "x"}}


def test_same_settings_compares_what_the_run_would_use(tiny_config_dict):
    one = copy.deepcopy(tiny_config_dict)
    one["training"]["learning_rate"] = 1e-5
    other = copy.deepcopy(one)
    other["training"]["learning_rate"] = 0.00001
    assert same_settings(one, other, policy=LAPTOP)
    other["training"]["learning_rate"] = "1e-5"  # how YAML 1.1 reads it: still the same setting
    assert same_settings(one, other, policy=LAPTOP)
    other["training"]["epochs"] = 1  # a whole number where a float is expected, and defaults spelled out
    other["generation"] = {"backend": "transformers"}
    assert same_settings(one, other, policy=LAPTOP)

    more_steps = copy.deepcopy(one)
    more_steps["training"]["max_steps"] = 3
    assert not same_settings(one, more_steps, policy=LAPTOP)
    renamed_run = copy.deepcopy(one)
    renamed_run["name"] = "other"
    assert not same_settings(one, renamed_run, policy=LAPTOP)

    broken = copy.deepcopy(one)
    broken["grpo"]["group_size"] = 1  # invalid drafts are compared as they are
    assert same_settings(broken, copy.deepcopy(broken), policy=LAPTOP)
    also_broken = copy.deepcopy(broken)
    also_broken["grpo"]["group_size"] = 0
    assert not same_settings(broken, also_broken, policy=LAPTOP) and not same_settings(broken, one, policy=LAPTOP)


@pytest.mark.parametrize(("source", "name"), [("/data/arithmetic.csv", "arithmetic"),
                                              ("/data/My File (v2).jsonl", "My-File-v2"),
                                              ("openai/gsm8k", "gsm8k"), ("/data/folder/", "folder"),
                                              ("", ""), ("/d/" + "x" * 60 + ".csv", "x" * 48)])  # run folder names keep 48 characters
def test_run_name_for_a_data_source(source, name):
    assert run_name_for(source) == name


@pytest.mark.parametrize(("current", "auto", "source", "expected"), [
    ("arithmetic", "arithmetic", "/data/sums.csv", ("sums", "sums")),  # the app's name follows the data
    ("my-run", "arithmetic", "/data/sums.csv", ("my-run", "arithmetic")),  # a typed name is kept
    (" my-run ", "arithmetic", "/data/sums.csv", ("my-run", "arithmetic")),
    ("", "arithmetic", "/data/sums.csv", ("sums", "sums")),  # an emptied name follows again
    ("   ", "", "openai/gsm8k", ("gsm8k", "gsm8k")),
    (None, "", "/data/sums.csv", ("sums", "sums")),
    ("arithmetic", "arithmetic", "", ("arithmetic", "arithmetic")),  # nothing to name it after: unchanged
])
def test_the_run_name_follows_the_data_unless_typed(current, auto, source, expected):
    assert renamed(current, auto, source) == expected


def test_renaming_twice_keeps_following():
    name, auto = renamed("arithmetic", "arithmetic", "/data/first.csv")
    name, auto = renamed(name, auto, "/data/second.csv")
    assert (name, auto) == ("second", "second")
    name, auto = renamed("typed", auto, "/data/third.csv")
    assert (name, auto) == ("typed", "second")


# ----------------------------------------------------------------------------------------------------------------
# The form and the draft.


def test_the_form_has_a_field_for_every_model_tab_setting_explained_by_the_setting_itself(form):
    labels = form.labels
    for section, settings in model_tab.SECTIONS.items():
        for setting in settings:
            path = f"{section}.{setting.key}"
            assert labels.get(path) == setting_help(path).label, path
            assert form.component(path).info == setting_help(path).help, path
    for path in ("name", "data.source", "data.prompt", "data.eval_frac", "data.max_rows"):  # other tabs' too
        assert labels[path] == setting_help(path).label
        assert form.component(path).info.startswith(setting_help(path).help), path
    assert {"data.source", "data.prompt", "rewards"} <= set(labels)  # the other tabs' fields are in it too
    assert len(labels) == len(form.fields)  # one field per path
    assert form.inputs[0] is form.loaded and form.inputs[1:] == [f.component for f in form.fields]


def test_form_compose_writes_every_fields_path(form, tmp_path):
    draft = Studio(runs_dir=tmp_path / "runs", policy=LAPTOP).recipes.default()
    shown = dict(zip(MODEL_TAB_PATHS, model_tab.field_values(draft, MODEL_TAB_PATHS), strict=True))
    values = [shown[f.path] if f.path in shown else get_path(draft, f.path) for f in form.fields]
    composed = form.compose({}, *values)  # nothing loaded: everything comes from the fields
    for f, value in zip(form.fields, values):
        assert get_path(composed, f.path) == f.to_draft(value), f.path
    assert set(composed) <= set(drafts.SECTIONS)


@pytest.mark.parametrize("recipe", sorted(path.stem for path in (ASSETS_DIR / "recipes").glob("*.yaml")))
def test_the_model_tab_fields_round_trip_a_recipe(form, tmp_path, recipe):
    draft = Studio(runs_dir=tmp_path / "runs", policy=LAPTOP).recipes.load(recipe)
    fields = [next(f for f in form.fields if f.path == path) for path in MODEL_TAB_PATHS]  # one field per path
    stale = copy.deepcopy(draft)  # the settings last loaded, before the fields were filled
    for path in MODEL_TAB_PATHS:
        set_path(stale, path, None)
    assert not same_settings(stale, draft, policy=LAPTOP)
    values = model_tab.field_values(draft, MODEL_TAB_PATHS)
    composed = compose(stale, {f.path: f.to_draft(value) for f, value in zip(fields, values, strict=True)})
    assert same_settings(composed, draft, policy=LAPTOP)
    RunConfig.from_dict(copy.deepcopy(composed), policy=LAPTOP)


# ----------------------------------------------------------------------------------------------------------------
# Loading a whole draft (a recipe) asks first when the form was edited since the last load.


def wired(app, elem_id: str, event: str = "click", named: str | None = None):
    """The server function ``event`` of ``elem_id`` runs (``named`` so, where it runs several)."""
    ids = {block_id for block_id, block in app.blocks.items() if getattr(block, "elem_id", None) == elem_id}
    (fn,) = [f.fn for f in app.fns.values() if f.fn is not None  # not a step run in the page alone
             and any(target in ids and name == event for target, name in f.targets)
             and named in (None, getattr(f.fn, "__name__", None))]
    return fn


def form_inputs(app, draft: dict, **edits) -> list:
    shown = dict(zip(MODEL_TAB_PATHS, model_tab.field_values(draft, MODEL_TAB_PATHS), strict=True))
    shown.update({path.replace("__", "."): value for path, value in edits.items()})
    return [draft, *(shown[f.path] if f.path in shown else get_path(draft, f.path) for f in app.form.fields)]


def test_every_server_event_keeps_its_loading_status_on_a_few_components(app):
    """The page updates the loading status of every component any event ever showed progress on, at each status
    change of any event (common.progress_shown_quietly): the events that show none share one component never shown,
    and those that do show it on a few."""
    nowhere = {block._id for block in app.blocks.values() if getattr(block, "elem_id", None) == "no-progress"}
    server_events = [block_fn for block_fn in app.fns.values() if block_fn.fn is not None]
    quiet = [block_fn for block_fn in server_events if block_fn.show_progress == "hidden"]
    assert len(nowhere) == 1 and len(quiet) > 40
    assert all({block._id for block in block_fn.show_progress_on} == nowhere for block_fn in quiet)
    (page_load,) = [block_fn for block_fn in server_events if any(name == "load" for _, name in block_fn.targets)]
    assert page_load in quiet and len(page_load.outputs) > 50  # it fills in every tab
    shown = {block_fn.name: len(block_fn.show_progress_on or block_fn.outputs) for block_fn in server_events
             if block_fn not in quiet}
    assert shown and max(shown.values()) <= 6, shown


def test_loading_a_recipe_replaces_an_unedited_draft_and_asks_about_an_edited_one(app, studio):
    load = wired(app, "load-recipe")
    current = studio.recipes.default()
    wanted = studio.recipes.load("json_answers")

    confirm, question, pending, status, new_draft, pristine, auto_name, opening, *filled = load(
        current, *form_inputs(app, current), "json_answers")
    assert new_draft == pristine == wanted and auto_name == wanted["name"]
    assert repr(opening) == repr(gr.skip())  # the "Opening…" line is the page's load's to empty (it shows the form)
    assert not confirm.visible and pending is None and "json_answers" in status
    # Every tab shows the loaded draft from this one answer: the Data tab's source among the fills, a bundled
    # dataset by its name (the folder the package lies in is nobody's business, nor in a screenshot).
    texts = [value for value in filled if isinstance(value, str)]
    assert Path(wanted["data"]["source"]).name in texts and wanted["data"]["source"] not in texts

    # The same value shown differently (a whole number in a number field) is no edit.
    epochs = current["training"]["epochs"]
    assert isinstance(epochs, float) and epochs == int(epochs)
    unchanged = load(current, *form_inputs(app, current, training__epochs=int(epochs)), "json_answers")
    assert unchanged[4] == wanted

    edited = load(current, *form_inputs(app, current, training__max_steps=7), "json_answers")
    skip = edited[4]
    assert set(map(repr, edited[4:])) == {repr(skip)}  # nothing replaced or filled yet
    assert edited[0].visible and "json_answers" in edited[1] and edited[2] == {"draft": wanted,
                                                                               "label": "the json_answers recipe"}
    replaced = wired(app, "replace-draft-yes")(edited[2])
    assert replaced[4] == wanted and not replaced[0].visible and repr(replaced[7]) == repr(gr.skip())
    kept = wired(app, "replace-draft-no", named="keep_settings")()
    assert wired(app, "replace-draft-no", named="recipe_kept")("your own settings") == "your own settings"
    assert not kept[0].visible and kept[2] is None and kept[3] == message("Kept your settings.", "info")

    nothing_loaded = load({}, *form_inputs(app, current, training__max_steps=7), "json_answers")
    assert nothing_loaded[4] == wanted  # the page's first load never asks

    unknown = load(current, *form_inputs(app, current), "nope")
    assert unknown[3].startswith(message("", "error")) and "There is no recipe called 'nope'" in unknown[3]


def test_the_recipe_box_says_your_own_settings_once_the_form_holds_no_recipe(studio):
    from dragon_ui.ui.app import OWN_SETTINGS, recipe_held, recipe_offered

    skip = (gr.skip(), gr.skip())
    arithmetic, lesson = studio.recipes.default(), studio.recipes.load("json_answers")
    assert recipe_held(studio, arithmetic, "arithmetic") == skip  # it says the truth: left as it is
    edited = copy.deepcopy(arithmetic)
    edited["training"]["max_steps"] = 7
    assert recipe_held(studio, edited, "arithmetic") == (OWN_SETTINGS, OWN_SETTINGS)
    assert recipe_held(studio, edited, OWN_SETTINGS) == skip  # a recipe picked meanwhile, not loaded, stays picked
    assert recipe_held(studio, lesson, OWN_SETTINGS) == ("json_answers", "json_answers")  # edited back, or loaded
    assert recipe_held(studio, lesson, None) == ("json_answers", "json_answers")
    with pytest.raises(DragonError, match="already holds your own settings"):
        recipe_offered(studio, OWN_SETTINGS)


def test_the_page_first_paints_the_default_recipe_and_nothing_else(app, studio):
    """Every page starts from the app's config: it holds the default recipe in every tab (common.show_at_first),
    with the Data tab's table and counts, so a browser that kept no draft shows real values before any event is
    answered; the form itself is hidden in it (a browser that kept a draft shows "Opening…" until its own is in).
    The updates worked out for it are not placed in the page as components of their own (common.made_apart)."""
    draft = studio.recipes.default()
    assert app.form.loaded.value == draft  # the settings no field shows come from it
    shown = app.form.compose(app.form.loaded.value, *(field.component.value for field in app.form.fields))
    assert same_settings(shown, draft, policy=LAPTOP), shown
    props = {component["props"]["elem_id"]: component["props"] for component in app.config["components"]
             if component["props"].get("elem_id")}
    assert props["data-source"]["value"] == Path(draft["data"]["source"]).name
    assert props["data-preview"]["value"]["headers"] == ["question", "answer"]
    assert props["data-preview"]["value"]["data"][0][0] == "What is 66 + 24? Reply with just the number."
    assert "400 rows: 380 for training, 20 held out" in props["data-counts"]["value"]
    assert [name for name, *_ in props["rewards-table"]["value"]["data"]] == [r["name"] for r in draft["rewards"]]
    assert "What is 66 + 24?" in props["rewards-row-text"]["value"]
    assert props["form-area"]["visible"] is False and "Opening your settings" in props["form-opening"]["value"]

    layouts = (gr.Row, gr.Column, gr.Accordion, gr.Tab, gr.Group)
    assert all(block.children for block in app.blocks.values() if isinstance(block, layouts))
    unnamed = [block for block in app.blocks.values() if isinstance(block, gr.components.Component)
               and not isinstance(block, (gr.Markdown, gr.State, gr.BrowserState, gr.Timer, gr.components.api_component.Api))
               and not block.elem_id]
    assert not unnamed


def test_the_first_paint_loads_no_tokenizer_and_says_the_prompts_are_coming(studio, monkeypatch):
    """Building the app must stay quick (the server answers once it is built): the first paint's Data tab shows the
    table and counts, and says the prompts follow once the tokenizer is in (the page's refresh renders them)."""
    from dragon_ui.engine import models
    from dragon_ui.studio import playground

    def no_load(*_):
        raise AssertionError("the first paint loaded a tokenizer")

    monkeypatch.setattr(playground, "_tokenizers", {})
    monkeypatch.setattr(models, "load_tokenizer", no_load)
    monkeypatch.setattr(models, "resolve_model", no_load)
    app = build_app(studio)
    (rendered,) = [c["props"]["value"] for c in app.config["components"]
                   if c["props"].get("elem_id") == "data-rendered"]
    model = studio.recipes.default()["model"]["id"]
    assert rendered == message(f"Loading the tokenizer of {model} to show the prompts as it reads them…")


def test_a_generator_handler_that_fails_midway_says_so_in_a_sentence():
    from dragon_ui.errors import ConfigError
    from dragon_ui.ui.common import shows_errors

    def steps():
        yield "the table"
        raise ConfigError("The data could not be read.")

    answers = shows_errors(steps)()
    assert next(answers) == "the table"
    with pytest.raises(gr.Error, match="The data could not be read."):
        next(answers)


TOOLS = [{"kind": "calculator", "name": "calculator"}, {"kind": "lookup", "name": "capital", "key_column": "country",
                                                         "value_column": "capital"}]


@pytest.mark.parametrize("engine, said", [
    ("tools[1].key_column 'land' is not a column of the data; its columns are: a, b.",
     "The 2nd tool (capital): the key column 'land' is not a column of the data; its columns are: a, b."),
    ("tools[0].examples[1]: calculator answers with an error: the expression divides by zero.",
     "The 1st tool (calculator): its 2nd worked example: calculator answers with an error: the expression divides by "
     "zero."),
    ("tools[0].examples[0].arguments do not fit calculator: bad.",
     "The 1st tool (calculator): its 1st worked example's arguments do not fit calculator: bad."),
    ("tools[4] needs key_column.", "The 5th tool needs key_column."),
])
def test_a_tools_problem_names_the_tool_as_the_rewards_tab_lists_it(engine, said):
    problem = place_problem(engine, {}, [], TOOLS)
    assert (problem.text, problem.section, problem.tab) == (said, "tools", "Rewards")
