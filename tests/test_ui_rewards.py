"""The Rewards tab's handlers, called directly: editing the reward list, public mode, and the playground.

The list is a field of the form (a gr.State at "rewards"); the editor handlers take it and return
(rewards, table, selector, status, *editor). ``Screen`` applies those outputs the way the browser does, so mixed
sequences of clicks can be checked against what the form shows after each one.
"""

from __future__ import annotations

import copy
import re
import threading
import time
from types import SimpleNamespace
from pathlib import Path

import gradio as gr
import pandas as pd
import pytest

from conftest import said
from dragon_ui.errors import BusyError, DragonError
from dragon_ui.public import LAPTOP, Policy
from dragon_ui.rewards import (EXTRACT_MODES, REWARD_KINDS, REWARD_SETTINGS, kind_fields, parse_rewards,
                               public_demo_refusal)
from dragon_ui.settings import plain
from dragon_ui.studio.backend import Studio
from dragon_ui.ui import build_app, common, rewards_tab
from dragon_ui.ui.common import message

SETTINGS = rewards_tab.SETTINGS
NEW = rewards_tab.NEW_REWARD
NUMERIC = {"kind": "numeric", "name": "numeric", "weight": 1.0}
LENGTH = {"kind": "length", "name": "length", "weight": 0.3, "max_chars": 12}


@pytest.fixture
def studio(tmp_path, monkeypatch):
    monkeypatch.delenv("SPACE_ID", raising=False)
    monkeypatch.delenv("DRAGON_UI_PUBLIC", raising=False)
    return Studio(runs_dir=tmp_path / "runs", policy=LAPTOP)


@pytest.fixture
def public_studio(tmp_path, monkeypatch):
    monkeypatch.setenv("DRAGON_UI_PUBLIC", "1")
    return Studio(runs_dir=tmp_path / "runs", policy=Policy.from_env(tmp_path / "runs"))


@pytest.fixture
def draft(studio):
    return studio.recipes.default()  # arithmetic: numeric (weight 1) + length (max 12 chars, weight 0.3)


@pytest.fixture
def recipe(draft) -> list[dict]:
    assert draft["rewards"] == [NUMERIC, LENGTH]
    return draft["rewards"]


@pytest.fixture(scope="module")
def labels(tmp_path_factory) -> dict[str, str]:
    """The form's labels (config path -> the words on the screen), which the playground's messages use."""
    return build_app(Studio(runs_dir=tmp_path_factory.mktemp("runs"), policy=LAPTOP)).form.labels


def settings(kind: str = "numeric", **values) -> list:
    """Form values for the settings fields, as the form shows a new reward of ``kind`` with some fields typed in."""
    form = rewards_tab.form_values({"kind": kind})
    for name, value in values.items():
        form[SETTINGS.index(name)] = value
    return form


def is_skip(value) -> bool:
    return isinstance(value, dict) and value == gr.skip()


def split_editor(editor: list) -> dict:
    """The editor outputs by name: kind, name, weight, help, settings (list of updates), add, save, remove, and
    the reward it shows (its name, or NEW)."""
    assert len(editor) == rewards_tab.EDITOR_SIZE
    kind, name, weight, help_text, *settings_, add, save, remove, editing = editor
    return {"kind": kind, "name": name, "weight": weight, "help": help_text, "settings": settings_, "add": add,
            "save": save, "remove": remove, "editing": editing}


def visible(editor: dict) -> set[str]:
    return {setting for setting, update in zip(SETTINGS, editor["settings"], strict=True) if update["visible"]}


def listing(result: list) -> dict:
    """A list handler's outputs by name: rewards, table, selector, status, and the editor's."""
    assert len(result) == 4 + rewards_tab.EDITOR_SIZE
    rewards, table, selector, status, *editor = result
    return {"rewards": rewards, "table": table, "selector": selector, "status": status, **split_editor(editor)}


class Screen:
    """The Rewards editor as the browser shows it: each handler's outputs land in the fields (a skip keeps what the
    field holds), and the next click sends what the fields hold, and which reward the form shows (``editing``)."""

    def __init__(self, rewards: list[dict], policy: Policy = LAPTOP):
        self.policy = policy
        self.status = ""
        self.values = settings("numeric")
        self._show_listing(rewards_tab.fill_rewards({"rewards": rewards}, policy=policy))

    # what the user does
    def select(self, name: str):
        self.selected = name  # the picker shows what was picked
        self._show_listing(rewards_tab.select_reward(self.rewards, name, policy=self.policy))

    def new(self):
        self.select(NEW)

    def kind_(self, kind: str):
        self.kind = kind
        self._show_editor(rewards_tab.change_kind(self.rewards, self.editing, kind, self.name, self.weight,
                                                  policy=self.policy))

    def type(self, field: str, value):
        if field in ("name", "weight"):
            setattr(self, field, value)
        else:
            self.values[SETTINGS.index(field)] = value

    def add(self):
        self._show_listing(rewards_tab.add_reward(self.rewards, self.kind, self.name, self.weight, *self.values,
                                                  policy=self.policy))

    def save(self):
        self._show_listing(rewards_tab.save_reward(self.rewards, self.editing, self.kind, self.name, self.weight,
                                                   *self.values, policy=self.policy))

    def remove(self):
        self._show_listing(rewards_tab.remove_reward(self.rewards, self.editing, policy=self.policy))

    def do(self, step: tuple):
        action, *args = step
        {"select": self.select, "new": self.new, "kind": self.kind_, "type": self.type, "add": self.add,
         "save": self.save, "remove": self.remove}[action](*args)

    # what the form shows
    def _show_listing(self, result: list):
        out = listing(result)
        if not is_skip(out["rewards"]):
            self.rewards = out["rewards"]
        if not is_skip(out["selector"]):
            self.selected, self.choices = out["selector"].value, out["selector"].choices
        if not is_skip(out["table"]):
            self.table = out["table"]
        self.status = out["status"]
        self._show_editor(result[4:])

    def _show_editor(self, editor: list):
        shown = split_editor(editor)
        for field in ("kind", "name", "weight", "editing"):
            if not is_skip(shown[field]):
                setattr(self, field, shown[field])
        for index, update in enumerate(shown["settings"]):
            if "value" in update:
                self.values[index] = update["value"]
        if not is_skip(shown["add"]):
            self.buttons = {button for button in ("add", "save", "remove") if shown[button].visible}

    def form_reward(self) -> dict:
        """The reward the form shows, validated as a run would store it."""
        spec = rewards_tab.form_to_dict(self.kind, self.name, self.weight, self.values)
        return parse_rewards([spec], policy=LAPTOP)[0].to_dict()

    def check_shows_the_selection(self):
        """The form shows exactly the selected reward, or a fresh new one; the buttons fit."""
        names = [spec["name"] for spec in self.rewards]
        assert self.editing == self.selected  # the edits that follow act on the reward the picker shows
        assert self.choices == [(name, name) for name in names] + [(rewards_tab.NEW_REWARD_LABEL, NEW)]
        assert self.table["name"].tolist() == names
        if self.selected == NEW:
            assert self.form_reward() == {"kind": "numeric", "name": rewards_tab.unique_name("numeric", names),
                                          "weight": 1.0}
            assert self.buttons == {"add"}
        else:
            assert self.form_reward() == self.rewards[names.index(self.selected)]
            assert self.buttons == {"save", "remove"}


# --------------------------------------------------------------------------------------------- the editor


def test_the_app_builds_with_the_rewards_list_in_its_form(studio):
    demo = build_app(studio)
    assert isinstance(demo, gr.Blocks)
    assert isinstance(demo.form.component("rewards"), gr.State) and demo.form.labels["rewards"] == "Rewards"


def component(demo: gr.Blocks, elem_id: str) -> dict:
    return next(c for c in demo.get_config_file()["components"] if c["props"].get("elem_id") == elem_id)


def test_public_app_hides_the_code_editor(studio, public_studio):
    assert component(build_app(studio), "rewards-kind")["props"].get("info") is None
    demo = build_app(public_studio)
    assert component(demo, "rewards-code")["props"]["visible"] is False
    assert "turned off in this public demo" in component(demo, "rewards-kind")["props"]["info"]


def test_fill_rewards_lists_the_draft_and_shows_the_first(draft):
    out = listing(rewards_tab.fill_rewards(draft, policy=LAPTOP))
    assert out["rewards"] == [NUMERIC, LENGTH] and out["rewards"] is not draft["rewards"]
    assert out["table"].values.tolist() == [
        ["numeric", "numeric", 1.0, "🎯 goal", "the number in the reply equals the reference", ""],
        ["length", "length", 0.3, "", "the reply has 0 to 12 characters", "max_chars: 12"]]
    assert out["selector"].value == "numeric"
    assert out["selector"].choices == [("numeric", "numeric"), ("length", "length"),
                                       (rewards_tab.NEW_REWARD_LABEL, NEW)]
    assert (out["kind"], out["name"], out["weight"]) == ("numeric", "numeric", 1.0)
    assert "number equals the reference" in out["help"]
    assert visible(out) == {"train", "goal", "only_when", "extract", "tolerance"}
    assert not out["add"].visible and out["save"].visible and out["remove"].visible
    assert out["status"] == ""


def test_fill_rewards_without_rewards_shows_a_new_one(draft):
    out = listing(rewards_tab.fill_rewards({**draft, "rewards": []}, policy=LAPTOP))
    assert out["rewards"] == [] and out["selector"].value == NEW
    assert (out["kind"], out["name"], out["weight"]) == ("numeric", "numeric", 1.0)
    assert out["add"].visible and not out["save"].visible and not out["remove"].visible


@pytest.mark.parametrize("kind", REWARD_KINDS)
def test_only_the_kinds_settings_are_shown(recipe, kind):
    shown = split_editor(rewards_tab.change_kind(recipe, NEW, kind, "numeric_2", 1.0, policy=LAPTOP))
    assert visible(shown) == {"train", "goal", "only_when", *kind_fields(kind)}
    assert shown["help"] == rewards_tab.KIND_HELP[kind]
    assert shown["kind"] == kind and shown["weight"] == 1.0
    # every setting is set, hidden ones to their defaults, so nothing of a reward shown before stays behind
    assert [update["value"] for update in shown["settings"]] == rewards_tab.form_values({"kind": kind})


@pytest.mark.parametrize("setting", SETTINGS)
def test_each_field_is_labelled_explained_and_filled_as_its_setting_is_declared(setting):
    declared = REWARD_SETTINGS[setting]
    with gr.Blocks():
        field = rewards_tab.setting_field(setting, visible=False)
    assert field.label == declared.metadata["label"] and not field.visible
    shown = rewards_tab.form_values({"kind": "numeric"})[SETTINGS.index(setting)]
    if isinstance(field, gr.Code):  # no help line (the reference shows it); gradio keeps no final newline
        assert field.value == shown.rstrip("\n")
    else:
        assert field.info.startswith(plain(declared.metadata["help"])) and field.value == shown


def test_a_list_is_typed_with_commas_and_a_choice_is_offered_as_declared():
    with gr.Blocks():
        words, extract, mode = (rewards_tab.setting_field(name, visible=True) for name in ("words", "extract", "mode"))
    assert words.info.endswith("Comma-separated.")
    assert [value for value, _ in extract.choices] == list(EXTRACT_MODES) and isinstance(extract, gr.Dropdown)
    assert [value for value, _ in mode.choices] == ["any", "all"] and isinstance(mode, gr.Radio)


def test_the_problem_line_says_what_stops_training_or_what_cannot_pay(draft, tmp_path):
    assert rewards_tab.problem_line(draft, policy=LAPTOP) == ""  # the arithmetic recipe: numbers, numeric
    assert "weight 0" in rewards_tab.problem_line({**draft, "rewards": [{**NUMERIC, "weight": 0}]}, policy=LAPTOP)
    capitals = tmp_path / "capitals.csv"
    capitals.write_text("question,answer\nThe capital of France?,Paris\nThe capital of Peru?,Lima\n", encoding="utf-8")
    words = with_setting(draft, "data.source", str(capitals))  # numeric on answers that are words
    assert "`numeric` (numeric) cannot pay on this data" in rewards_tab.problem_line(words, policy=LAPTOP)


def test_the_row_picker_is_made_anew_only_when_the_data_changes(draft, labels):
    picker, said, shown_for = rewards_tab.rows_for(draft, None, None, labels=labels, policy=LAPTOP)
    assert picker.value == 1 and "Reference:" in said and shown_for
    assert all(is_skip(value) for value in rewards_tab.rows_for(draft, 1, shown_for, labels=labels, policy=LAPTOP))
    moved = with_setting(draft, "data.reference", "question")
    picker, said, again = rewards_tab.rows_for(moved, 1, shown_for, labels=labels, policy=LAPTOP)
    assert again != shown_for and picker.value == 1


@pytest.mark.parametrize("kind, name, weight, values, stored", [
    ("regex", "digits", 0.5, {"pattern": r"^\d+$"},
     {"kind": "regex", "name": "digits", "weight": 0.5, "pattern": r"^\d+$"}),
    ("json", "", 1.0, {"keys": "name, age ,city"}, {"kind": "json", "name": "json", "weight": 1.0,
                                                    "keys": ["name", "age", "city"]}),
    ("numeric", "", 2.0, {"extract": "answer_tag"}, {"kind": "numeric", "name": "numeric_2", "weight": 2.0,
                                                    "extract": "answer_tag"}),
    ("keyword", "polite", None, {"words": "please, thanks", "mode": "all", "pattern": "ignored"},
     {"kind": "keyword", "name": "polite", "weight": 1.0, "words": ["please", "thanks"], "mode": "all"}),
    ("format", "", 1.0, {"tags": "reasoning, answer"}, {"kind": "format", "name": "format", "weight": 1.0,
                                                        "tags": ["reasoning", "answer"]}),
    ("command", "tests", 1.0, {"argv": "python check.py {completion_file}", "input": "file"},
     {"kind": "command", "name": "tests", "weight": 1.0, "argv": ["python", "check.py", "{completion_file}"],
      "input": "file"}),
    ("custom", "mine", 1.0, {}, {"kind": "custom", "name": "mine", "weight": 1.0, "code": rewards_tab.STARTER_CODE}),
    ("exact", "accuracy", 1.0, {"train": False}, {"kind": "exact", "name": "accuracy", "weight": 1.0, "train": False}),
])
def test_add_reward_appends_to_the_list_and_shows_it(recipe, kind, name, weight, values, stored):
    out = listing(rewards_tab.add_reward(recipe, kind, name, weight, *settings(kind, **values), policy=LAPTOP))
    assert out["rewards"] == [NUMERIC, LENGTH, stored]
    assert recipe == [NUMERIC, LENGTH]  # the list it was given is left alone
    assert out["table"].values.tolist()[-1][:3] == [stored["name"], kind, stored["weight"]]
    assert out["selector"].value == stored["name"] and "Added the reward " + stored["name"] in out["status"]
    assert (out["kind"], out["name"], out["weight"]) == (kind, stored["name"], stored["weight"])
    assert out["save"].visible and out["remove"].visible and not out["add"].visible


def test_save_and_remove(recipe):
    out = listing(rewards_tab.save_reward(recipe, "length", "length", "short", 0.5,
                                          *settings("length", max_chars=20, min_chars=2), policy=LAPTOP))
    assert out["rewards"] == [NUMERIC, {"kind": "length", "name": "short", "weight": 0.5, "min_chars": 2,
                                        "max_chars": 20}]
    assert out["selector"].value == "short" and "Saved the reward short" in out["status"]
    shown = listing(rewards_tab.select_reward(out["rewards"], "short", policy=LAPTOP))
    assert (shown["kind"], shown["name"], shown["weight"]) == ("length", "short", 0.5)
    max_chars = shown["settings"][SETTINGS.index("max_chars")]
    assert max_chars["value"] == "20" and max_chars["visible"]

    out = listing(rewards_tab.remove_reward(out["rewards"], "numeric", policy=LAPTOP))
    assert [spec["name"] for spec in out["rewards"]] == ["short"] and out["selector"].value == "short"
    assert "Removed the reward numeric" in out["status"]
    out = listing(rewards_tab.remove_reward(out["rewards"], "short", policy=LAPTOP))
    assert out["rewards"] == [] and out["selector"].value == NEW and "add at least one" in out["status"]
    assert out["add"].visible and not out["remove"].visible


def test_a_custom_reward_from_a_file_round_trips_through_the_form(recipe, tmp_path):
    script = tmp_path / "score.py"
    script.write_text("def reward(prompt, completion, reference, row):\n    return 0.5\n", encoding="utf-8")
    spec = {"kind": "custom", "name": "mine", "weight": 1.0, "file": str(script)}
    rewards = [*recipe, spec]
    shown = listing(rewards_tab.select_reward(rewards, "mine", policy=LAPTOP))
    values = [update["value"] for update in shown["settings"]]
    assert values[SETTINGS.index("code")] == "" and values[SETTINGS.index("file")] == str(script)
    out = listing(rewards_tab.save_reward(rewards, "mine", shown["kind"], shown["name"], shown["weight"], *values,
                                          policy=LAPTOP))
    assert out["rewards"][-1] == spec and "Saved the reward mine." in out["status"]


@pytest.mark.parametrize("handler, args, words", [
    ("add", ("regex", "bad", 1.0, {"pattern": "("}),
     ["The 3rd reward (bad)", "the regular expression is not a valid regular expression"]),
    ("add", ("regex", "", 1.0, {}), ["The 3rd reward (regex)", "the regular expression is missing"]),
    ("add", ("length", "length", 1.0, {"max_chars": 5}), ["The 3rd reward (length)", "two rewards are named 'length'"]),
    ("add", ("length", "", 1.0, {"min_chars": 9, "max_chars": 5}),
     ["The 3rd reward (length_2)", "the minimum length (9) is larger than"]),
    ("add", ("numeric", "has space", 1.0, {}), ["The 3rd reward (has space)",
                                                "may only use letters, digits and underscores"]),
    ("add", ("numeric", "neg", -1, {}), ["The 3rd reward (neg)", "the weight must be zero or more"]),
    ("add", ("custom", "broken", 1.0, {"code": "def reward(:\n"}),
     ["The 3rd reward (broken)", "the Python code has a syntax error on line 1"]),
    ("save", ("numeric", "length", 1.0, {}), ["two rewards are named 'length'"]),
    ("save_unselected", ("numeric", "numeric", 1.0, {}), ["Choose the reward to change first"]),
    ("save_new", ("numeric", "numeric_2", 1.0, {}), ["Choose the reward to change first"]),
    ("remove_unselected", ("numeric", "numeric", 1.0, {}), ["Choose the reward to remove first"]),
])
def test_bad_forms_show_the_error_and_leave_the_list(recipe, handler, args, words):
    kind, name, weight, values = args
    form = settings(kind, **values)
    if handler == "add":
        result = rewards_tab.add_reward(recipe, kind, name, weight, *form, policy=LAPTOP)
    elif handler == "remove_unselected":
        result = rewards_tab.remove_reward(recipe, "nothing", policy=LAPTOP)
    else:
        selected = {"save": "numeric", "save_unselected": "nothing", "save_new": NEW}[handler]
        result = rewards_tab.save_reward(recipe, selected, kind, name, weight, *form, policy=LAPTOP)
    rewards, table, selector, status, *editor = result
    assert rewards == [NUMERIC, LENGTH] and is_skip(table) and is_skip(selector)
    assert all(is_skip(update) for update in editor)  # the form keeps what was typed, to be corrected
    for fragment in words:
        assert fragment in status
    assert not re.match(r"\W*rewards\[", status)  # in the form's words, not a config path


def test_public_mode_hides_custom_code_and_refuses_code_rewards(public_studio):
    rewards = public_studio.recipes.default()["rewards"]
    for kind in ("custom", "command"):
        shown = split_editor(rewards_tab.change_kind(rewards, NEW, kind, "numeric_2", 1.0, policy=public_studio.policy))
        assert "turned off in this public demo" in shown["help"]
        assert visible(shown) == set()  # the code editor and every other field hidden
        values = {"argv": "python check.py"} if kind == "command" else {}
        result = rewards_tab.add_reward(rewards, kind, "mine", 1.0, *settings(kind, **values),
                                        policy=public_studio.policy)
        assert result[0] == rewards and "turned off in this public demo" in result[3]
    shown = split_editor(rewards_tab.change_kind(rewards, NEW, "regex", "numeric_2", 1.0, policy=public_studio.policy))
    assert shown["help"] == rewards_tab.KIND_HELP["regex"] and visible(shown) == {"train", "goal", "only_when",
                                                                               *kind_fields("regex")}
    assert [kind for kind in REWARD_KINDS if public_demo_refusal(kind)] == ["command", "custom"]


# Mixed orders of clicks, starting from the arithmetic recipe's list [numeric, length (weight 0.3, max 12 chars)].
# Each case: the steps, then the list, the selected reward and words of the status after the last step.
SEQUENCES = {
    "remove every reward, then json and Add": (
        [("select", "numeric"), ("remove",), ("remove",), ("kind", "json"), ("add",)],
        [{"kind": "json", "name": "json", "weight": 1.0}], "json", "Added the reward json"),
    "remove from the top: the next one is shown": (
        [("select", "numeric"), ("remove",)], [LENGTH], "length", "Removed the reward numeric"),
    "remove the last: the one before is shown": (
        [("select", "length"), ("remove",)], [NUMERIC], "numeric", "Removed the reward length"),
    "remove the only one: a new one is shown": (
        [("select", "length"), ("remove",), ("remove",)], [], NEW, "no rewards left"),
    "remove in the middle": (
        [("new",), ("kind", "json"), ("add",), ("select", "length"), ("remove",)],
        [NUMERIC, {"kind": "json", "name": "json", "weight": 1.0}], "json", "Removed the reward length"),
    "two of a kind get numbered names": (
        [("select", "numeric"), ("remove",), ("remove",), ("add",), ("new",), ("add",)],
        [{"kind": "numeric", "name": "numeric", "weight": 1.0}, {"kind": "numeric", "name": "numeric_2",
                                                                 "weight": 1.0}], "numeric_2",
        "Added the reward numeric_2"),
    "two json rewards get numbered names": (
        [("new",), ("kind", "json"), ("add",), ("new",), ("kind", "json"), ("add",)],
        [NUMERIC, LENGTH, {"kind": "json", "name": "json", "weight": 1.0},
         {"kind": "json", "name": "json_2", "weight": 1.0}], "json_2", "Added the reward json_2"),
    "select shows exactly it": (
        [("select", "length"), ("select", "numeric"), ("select", "length")], [NUMERIC, LENGTH], "length", ""),
    "select, edit, then select another: the edit is dropped": (
        [("select", "length"), ("type", "weight", 5.0), ("select", "numeric"), ("select", "length")],
        [NUMERIC, LENGTH], "length", ""),
    "save after select replaces that one only": (
        [("select", "numeric"), ("select", "length"), ("type", "weight", 0.5), ("type", "max_chars", 20),
         ("save",)],
        [NUMERIC, {"kind": "length", "name": "length", "weight": 0.5, "max_chars": 20}], "length",
        "Saved the reward length"),
    "save a rename": (
        [("select", "numeric"), ("type", "name", "correct"), ("save",)],
        [{"kind": "numeric", "name": "correct", "weight": 1.0}, LENGTH], "correct", "Saved the reward correct"),
    "save another kind: its automatic name follows": (
        [("select", "length"), ("kind", "regex"), ("type", "pattern", r"^\d+$"), ("save",)],
        [NUMERIC, {"kind": "regex", "name": "regex", "weight": 0.3, "pattern": r"^\d+$"}], "regex",
        "Saved the reward regex"),
    "save another kind under a typed name": (
        [("select", "length"), ("type", "name", "short"), ("kind", "regex"), ("type", "pattern", r"^\d+$"),
         ("save",)],
        [NUMERIC, {"kind": "regex", "name": "short", "weight": 0.3, "pattern": r"^\d+$"}], "short",
        "Saved the reward short"),
    "back to its own kind shows its own settings": (
        [("select", "length"), ("kind", "numeric"), ("kind", "length"), ("save",)], [NUMERIC, LENGTH], "length",
        "Saved the reward length"),
    "a new reward's automatic name follows its kind": (
        [("new",), ("kind", "regex"), ("kind", "numeric"), ("kind", "json"), ("type", "weight", 2.0), ("add",)],
        [NUMERIC, LENGTH, {"kind": "json", "name": "json", "weight": 2.0}], "json", "Added the reward json"),
    "a typed name stays when the kind changes": (
        [("new",), ("type", "name", "mine"), ("kind", "json"), ("add",)],
        [NUMERIC, LENGTH, {"kind": "json", "name": "mine", "weight": 1.0}], "mine", "Added the reward mine"),
    "a rejected add changes nothing": (
        [("new",), ("kind", "regex"), ("type", "pattern", "("), ("add",)], [NUMERIC, LENGTH], NEW,
        "The 3rd reward (regex): the regular expression is not a valid regular expression"),
    "a rejected add, corrected, is added": (
        [("new",), ("kind", "regex"), ("type", "pattern", "("), ("add",), ("type", "pattern", r"\d"), ("add",)],
        [NUMERIC, LENGTH, {"kind": "regex", "name": "regex", "weight": 1.0, "pattern": r"\d"}], "regex",
        "Added the reward regex"),
}


@pytest.mark.parametrize("steps, rewards, selected, status", SEQUENCES.values(), ids=SEQUENCES.keys())
def test_the_editor_in_mixed_orders(recipe, steps, rewards, selected, status):
    screen = Screen(copy.deepcopy(recipe))
    screen.check_shows_the_selection()
    for step in steps:
        screen.do(step)
        if step[0] in ("select", "new", "add", "save", "remove") and "error" not in {kind for kind, _ in said(screen.status)}:
            screen.check_shows_the_selection()
    assert screen.rewards == rewards
    assert screen.selected == selected
    assert status in screen.status


def test_the_editor_after_removing_everything_starts_from_the_kinds_defaults(recipe):
    """The bug: after removing the rewards the form kept the last one's name and weight, so Add made a json reward
    named "length" with weight 0.3."""
    screen = Screen(copy.deepcopy(recipe))
    screen.select("length")
    screen.remove()
    assert (screen.selected, screen.kind, screen.name, screen.weight) == ("numeric", "numeric", "numeric", 1.0)
    screen.remove()
    assert (screen.selected, screen.kind, screen.name, screen.weight) == (NEW, "numeric", "numeric", 1.0)
    assert screen.values == settings("numeric")  # length's max_chars 12 is not left behind
    screen.kind_("json")
    assert (screen.name, screen.weight) == ("json", 1.0)
    screen.add()
    assert screen.rewards == [{"kind": "json", "name": "json", "weight": 1.0}]


@pytest.mark.parametrize("rewards, selected, kind, name, shows", [
    ([], NEW, "json", "numeric", "json"),  # automatic: follows the kind
    ([NUMERIC, LENGTH], NEW, "numeric", "regex", "numeric_2"),  # automatic, made unique
    ([NUMERIC, {"kind": "json", "name": "json"}], NEW, "json", "numeric_2", "json_2"),
    ([NUMERIC, LENGTH], NEW, "json", "", "json"),  # an emptied name is automatic too
    ([NUMERIC, LENGTH], NEW, "json", "mine", "mine"),  # typed: kept
    ([NUMERIC, LENGTH], NEW, "json", "json_answers", "json_answers"),
    # A saved reward's automatic name follows its kind too: an `exact` reward called "numeric" misleads...
    ([NUMERIC, LENGTH], "numeric", "exact", "numeric", "exact"),
    ([NUMERIC, LENGTH], "length", "numeric", "length", "numeric_2"),  # ...made unique among the others
    ([NUMERIC, LENGTH], "numeric", "numeric", "exact", "numeric"),  # its own kind again: its own name back
    ([NUMERIC, {"kind": "length", "name": "short"}], "short", "numeric", "short", "short"),  # typed: kept
])
def test_change_kind_names_a_reward_after_its_kind_unless_typed(rewards, selected, kind, name, shows):
    shown = split_editor(rewards_tab.change_kind(rewards, selected, kind, name, 0.7, policy=LAPTOP))
    assert (shown["kind"], shown["name"], shown["weight"]) == (kind, shows, 0.7)  # the weight shown is kept
    editing = selected != NEW
    assert (shown["add"].visible, shown["save"].visible, shown["remove"].visible) == (not editing, editing, editing)


@pytest.mark.parametrize("rewards, words", [
    ([], "Add at least one reward"),
    ([{"kind": "numeric", "weight": 0.0}, {"kind": "length", "max_chars": 5, "weight": 0}],
     "Every reward has weight 0"),
    ([NUMERIC, {"kind": "regex", "name": "digits"}], "The 2nd reward (digits): the regular expression is missing"),
    ([NUMERIC, LENGTH], None),
])
def test_rewards_problem_says_what_stops_training(rewards, words):
    problem = rewards_tab.rewards_problem(rewards, policy=LAPTOP)
    if words is None:
        assert problem == ""
    else:
        assert words in problem


# --------------------------------------------------------------------------------------------- playground


def with_setting(draft: dict, path: str, value) -> dict:
    changed = copy.deepcopy(draft)
    section, key = path.split(".")
    changed[section][key] = value
    return changed


def test_playground_rows_and_scoring_a_typed_completion(draft, labels):
    picker, row_text = rewards_tab.playground_rows(draft, None, labels, policy=LAPTOP)
    assert len(picker.choices) == 20 and picker.value == 1
    assert picker.choices[0] == ("1: What is 66 + 24? Reply with just the number.", 1)
    assert row_text == "**Prompt:** What is 66 + 24? Reply with just the number.\n\n**Reference:** 90"
    assert rewards_tab.playground_rows(draft, 5, labels, policy=LAPTOP)[0].value == 5  # the chosen row is kept
    far, far_text = rewards_tab.playground_rows(draft, 250, labels, policy=LAPTOP)  # a pre-flight's prompt, beyond the first rows
    assert far.value == 250 and len(far.choices) == 21 and far.choices[-1][0].startswith("250: What is ")
    assert far_text.startswith("**Prompt:** What is ") and far_text.split("**Reference:** ")[1].isdigit()
    for missing in (401, 0, -3, "7", True, 10**12):  # past the data's 400 rows, or not a row a client may send
        assert rewards_tab.playground_rows(draft, missing, labels, policy=LAPTOP)[0].value == 1

    table, total = rewards_tab.score_typed(draft, 1, "90", policy=LAPTOP)
    assert isinstance(table, pd.DataFrame)
    assert table[["reward", "weight", "score", "weighted"]].values.tolist() == [["numeric", 1.0, 1.0, 1.0],
                                                                               ["length", 0.3, 1.0, 0.3]]
    assert "Total (weighted sum): 1.300" in total
    table, total = rewards_tab.score_typed(draft, 2, "The sum is 30, I think.", policy=LAPTOP)  # row 2 is 10 + 21 = 31
    assert table["score"].tolist() == [0.0, pytest.approx(1 - (23 - 12) / 12, abs=1e-4)]
    gated = {**draft, "rewards": [draft["rewards"][0], {**draft["rewards"][1], "only_when": "numeric"}]}
    table, total = rewards_tab.score_typed(gated, 2, "30", policy=LAPTOP)  # short, but wrong: the length reward pays nothing
    assert table[["reward", "score", "problem"]].values.tolist() == [
        ["numeric", 0.0, ""], ["length", 0.0, "pays only when numeric passes; it would pay 1.00"]]
    assert "Total (weighted sum): 0.000" in total


def test_the_playground_follows_a_change_of_the_rewards(draft):
    """A removed reward's row and its "Failed rewards score 0" line stayed after the rewards changed."""
    no_reference = with_setting(draft, "data.reference", None)
    scores, total = rewards_tab.score_typed(no_reference, 1, "90", policy=LAPTOP)
    assert "Failed rewards score 0" in total
    sampled = pd.DataFrame([[1, "90", 1.0, 1.0, 0.0]], columns=["row", "completion", "numeric", "total", "advantage"])
    fixed = {**draft, "rewards": [{"kind": "length", "name": "short", "max_chars": 12}]}
    new_scores, new_total, progress, groups, warnings, red_team, red_team_table = rewards_tab.rewards_changed(
        fixed, 1, "90", scores, sampled, "Flagged: …", policy=LAPTOP)
    assert new_scores["reward"].tolist() == ["short"] and "Failed" not in new_total  # the typed reply, scored anew
    assert said(progress) == [("info", rewards_tab.STALE_GROUPS)] and groups.empty and warnings == ""
    assert red_team == "" and not red_team_table.visible
    # A reply that cannot be scored now: said where its total was, and the rest still cleared.
    too_long = rewards_tab.rewards_changed(fixed, 1, "9" * (rewards_tab.REPLY_CHARS + 1), scores, sampled, "",
                                           policy=LAPTOP)
    assert too_long[0].empty and said(too_long[1])[0][0] == "warn" and "characters" in too_long[1]
    assert too_long[3].empty
    # Nothing scored yet: nothing to change.
    empty = pd.DataFrame(columns=rewards_tab.SCORE_COLUMNS)
    assert rewards_tab.rewards_changed(fixed, 1, "", empty, empty, "", policy=LAPTOP) == (gr.skip(),) * 7


@pytest.mark.parametrize("path, value", [
    ("training.learning_rate", -1),
    ("training.learning_rate", None),  # an emptied box
    ("training.learning_rate", "abc"),
    ("training.batch_size", 0),
])
def test_the_playground_ignores_settings_it_does_not_use(studio, draft, labels, path, value):
    bad = with_setting(draft, path, value)
    with pytest.raises(DragonError, match=path.replace(".", r"\.")):
        studio.recipes.validate(bad)  # Start would refuse it ...
    config = studio.recipes.validate_for_sampling(bad)  # ... sampling does not need it
    assert config.grpo.max_new_tokens == draft["grpo"]["max_new_tokens"] and len(config.rewards) == 2
    picker, row_text = rewards_tab.playground_rows(bad, None, labels, policy=LAPTOP)
    assert len(picker.choices) == 20 and "What is 66 + 24?" in row_text
    table, total = rewards_tab.score_typed(bad, 1, "90", policy=LAPTOP)
    assert "1.300" in total


def test_playground_explains_problems(draft, labels):
    no_reference = with_setting(draft, "data.reference", None)
    table, total = rewards_tab.score_typed(no_reference, 1, "90", policy=LAPTOP)
    assert "no reference answer" in table.loc[0, "problem"] and "Failed rewards score 0" in total
    picker, row_text = rewards_tab.playground_rows(with_setting(draft, "data.prompt", "{nope}"), 3, labels, policy=LAPTOP)
    assert picker.choices == [] and picker.value is None
    assert "No rows to try: Prompt uses the column 'nope'" in row_text and "(on the Data tab)" in row_text
    with pytest.raises(gr.Error, match="Choose a row"):
        rewards_tab.score_typed(draft, None, "90", policy=LAPTOP)


def test_a_public_demo_stops_scoring_a_typed_reply_at_its_time_limit(draft, monkeypatch):
    """42, item 7: twenty math rewards on a reply that keeps math-verify busy held a request for over 100 s."""
    from dragon_ui.rewards import Reward
    from dragon_ui.rewards.spec import NumericReward

    monkeypatch.setenv("DRAGON_UI_PUBLIC", "1")
    monkeypatch.setenv("DRAGON_UI_MAX_SCORING_SECONDS", "0.5")
    scored = []

    def slow(prompt, completion, reference, row):
        scored.append(1)
        time.sleep(0.3)
        return 1.0

    monkeypatch.setattr(rewards_tab, "playground_rewards", lambda draft, policy: [
        Reward(NumericReward(name=f"slow{n}"), slow) for n in range(20)])
    started = time.monotonic()
    with pytest.raises(gr.Error, match="Scoring stopped: the rewards took longer than this public demo's limit of 0.5 "
                                       "seconds on one reply"):
        rewards_tab.score_typed(draft, 1, "90", policy=Policy.from_env(Path("runs")))
    assert len(scored) == 2 and time.monotonic() - started < 2


@pytest.fixture
def tiny_draft(studio, tiny_model_dir):
    draft = studio.recipes.default()
    draft["model"]["id"] = str(tiny_model_dir)
    draft["grpo"]["max_new_tokens"] = 4
    draft["hardware"]["device"] = "cpu"
    return draft


@pytest.fixture
def no_model(studio, monkeypatch):
    """Fails a test that loads a model; records that a load was asked for."""
    asked = []

    def load(*args, **kwargs):
        asked.append(args)
        raise BusyError("A training is running on this machine's CPU; generating previews now would slow it down "
                        "badly. Wait for it to finish or stop it first.")

    monkeypatch.setattr(studio.previews, "load", load)
    return asked


@pytest.mark.parametrize("path, value, words, tab", [
    ("grpo.max_new_tokens", 0, "Max new tokens must be between 1 and 32768", "(on the Model & Hardware tab)"),
    ("grpo.max_new_tokens", None, "Max new tokens must be a whole number", "(on the Model & Hardware tab)"),
    ("grpo.temperature", 0, "Temperature must be above 0", "(on the Model & Hardware tab)"),
    ("data.prompt", "{nope}", "Prompt uses the column 'nope'", "(on the Data tab)"),
])
def test_generation_names_the_setting_and_its_tab_before_loading_a_model(studio, tiny_draft, labels, no_model, path,
                                                                         value, words, tab):
    updates = list(rewards_tab.generate_samples(studio, with_setting(tiny_draft, path, value), 1, 1, labels=labels))
    assert len(updates) == 1 and not no_model  # said at once, no model loaded
    (progress, table, warnings), = updates
    assert words in progress and progress.rstrip().endswith(tab)
    assert path not in progress and is_skip(table)


def test_a_reward_problem_in_generation_is_said_without_a_tab(studio, tiny_draft, labels, no_model):
    bad = {**tiny_draft, "rewards": [NUMERIC, {"kind": "regex", "name": "digits"}]}
    (progress, table, warnings), = rewards_tab.generate_samples(studio, bad, 1, 1, labels=labels)
    assert "The 2nd reward (digits): the regular expression is missing" in progress and "(on the" not in progress
    assert not no_model


def test_generation_goes_on_with_an_invalid_learning_rate(studio, tiny_draft, labels, no_model):
    bad = with_setting(tiny_draft, "training.learning_rate", -1)
    updates = list(rewards_tab.generate_samples(studio, bad, 1, 1, labels=labels))
    assert "Loading " in updates[0][0] and len(no_model) == 1  # got as far as loading the model
    assert "A training is running on this machine's CPU" in updates[-1][0]
    assert "earning rate" not in " ".join(update[0] for update in updates)


def test_generation_without_labels_keeps_the_config_paths(studio, tiny_draft, no_model):
    (progress, table, warnings), = rewards_tab.generate_samples(
        studio, with_setting(tiny_draft, "grpo.temperature", 0), 1, 1)
    assert "grpo.temperature must be above 0" in progress


def test_generate_a_group_with_the_tiny_model(studio, tiny_draft, labels):
    updates = list(rewards_tab.generate_samples(studio, tiny_draft, 1, 2, labels=labels))
    assert "Loading " in updates[0][0]
    progress, table, warnings = updates[-1]
    assert "Sampled 12 replies to 2 row(s)" in progress  # group_size 6 from the arithmetic recipe
    assert list(table.columns) == ["row", "completion", "numeric", "length", "total", "advantage"]
    assert table["row"].tolist() == [1] * 6 + [2] * 6
    same = []
    for row, group in table.groupby("row"):
        assert group["advantage"].sum() == pytest.approx(0.0, abs=0.05)  # rounded to 2 decimals per reply
        if group["total"].nunique() == 1:
            same.append(f"Row {row}: All 6 replies to this prompt scored {group['total'].iloc[0]:.2f}")
    if same:  # a no-signal warning for each row whose replies all scored the same, and only for those
        assert [line for line in warnings.split("\n\n") if "All 6 replies" in line] == [
            message(text + ": GRPO learns nothing from this group. Try a higher temperature, a larger group, "
                    "partial-credit rewards (length, format, json keys), or easier prompts.", "warn") for text in same]
    else:
        assert warnings == message("Every group has different scores, so GRPO can learn from each of them.", "ok")


@pytest.fixture
def paced_sampling(monkeypatch):
    """The playground's sampling thread waits, after each batch of replies it hands on, until the test lets it go
    on (``go.set()``): what the page is shown does not depend on how busy the machine is."""
    from dragon_ui.engine import evaluation

    monkeypatch.setattr(evaluation, "REPLIES_EVERY_S", 0.0)
    go, sampled = threading.Event(), rewards_tab.generate_groups

    def paced(*args, on_replies, **kwargs):
        def hand_on(replies):
            on_replies(replies)
            assert go.wait(timeout=60)

        return sampled(*args, on_replies=hand_on, **kwargs)

    monkeypatch.setattr(rewards_tab, "generate_groups", paced)
    return go


def first_table(generation) -> pd.DataFrame:
    for progress, table, warnings in generation:
        if isinstance(table, pd.DataFrame):
            return table
    raise AssertionError("no table was shown")


def sampling_threads() -> list[threading.Thread]:
    return [thread for thread in threading.enumerate() if thread.name == "playground-sampling"]


def test_a_group_shows_its_replies_as_they_are_sampled_and_cancel_stops_it(studio, tiny_draft, paced_sampling):
    request = SimpleNamespace(session_hash="session-1")
    generation = rewards_tab.generate_samples(studio, tiny_draft, 1, 3, request=request)
    table = first_table(generation)
    # The first row's replies as far as they go, not yet scored.
    assert set(table["row"]) == {1} and len(table) == 6 and set(table["total"]) == {""}
    assert "Cancelled" in rewards_tab.cancel_generation(request)
    paced_sampling.set()
    assert list(generation) == []  # nothing more: the sampling stopped within a token
    assert not sampling_threads() and not common.SAMPLING.locked()


def test_a_group_closed_by_gradio_stops_sampling_and_the_next_one_waits_for_it(studio, tiny_draft, paced_sampling):
    """Gradio closes the generator (on its event loop) when the page goes away or Cancel is pressed, and may start
    the next model event at once: closing does not wait for the thread, which stops within a token, and the next
    group's sampling waits for it."""
    generation = rewards_tab.generate_samples(studio, tiny_draft, 1, 3, request=SimpleNamespace(session_hash="s-2"))
    first_table(generation)
    generation.close()  # the thread is held in hand_on: closing returns at once
    assert sampling_threads() and common.SAMPLING.locked()
    paced_sampling.set()
    deadline = time.monotonic() + 60
    while sampling_threads() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not sampling_threads() and not common.SAMPLING.locked()
    progress, table, warnings = list(rewards_tab.generate_samples(studio, tiny_draft, 1, 1))[-1]
    assert "Sampled 6 replies to 1 row(s)" in progress


def test_a_row_whose_prompt_a_run_would_drop_is_not_sampled(studio, tiny_draft):
    tiny_draft["data"]["max_prompt_tokens"] = 5
    progress, table, warnings = list(rewards_tab.generate_samples(studio, tiny_draft, 2, 1))[-1]
    assert re.search(r"Row 2's prompt has [\d,]+ tokens, more than the 5 a run keeps \(data.max_prompt_tokens\), so a "
                     "run would drop it; try another row.", progress), progress
    assert is_skip(table) and not sampling_threads()


def test_a_public_demos_group_stops_at_its_time_limit(tiny_model_dir, paced_sampling, monkeypatch, runs_dir):
    """A long prompt, many replies or a slow reward would otherwise hold the machine for minutes (once, 342 s)."""
    monkeypatch.setenv("DRAGON_UI_PUBLIC", "1")
    monkeypatch.setenv("DRAGON_UI_PUBLIC_MODELS", str(tiny_model_dir))
    monkeypatch.setenv("DRAGON_UI_MAX_SAMPLING_SECONDS", "0.5")
    public = Studio(runs_dir=runs_dir, policy=Policy.from_env(runs_dir))
    draft = public.recipes.default()
    draft["model"]["id"], draft["grpo"]["max_new_tokens"] = str(tiny_model_dir), 4
    generation = rewards_tab.generate_samples(public, draft, 1, 3, request=SimpleNamespace(session_hash="s-3"))
    first_table(generation)  # the thread now waits in hand_on
    time.sleep(0.6)
    paced_sampling.set()
    progress, table, warnings = list(generation)[-1]
    assert progress == message("Stopped: sampling took longer than this public demo's limit of 0.5 seconds per "
                               "playground group; sample fewer rows, or lower the group size or max new tokens.",
                               "error")
    assert not sampling_threads() and not common.SAMPLING.locked()


def test_generation_shows_busy_errors_and_asks_for_a_row(studio, tiny_draft, no_model):
    progress, table, warnings = list(rewards_tab.generate_samples(studio, tiny_draft, 1, 1))[-1]
    assert "A training is running on this machine's CPU" in progress and is_skip(table)
    (progress, table, warnings), = rewards_tab.generate_samples(studio, tiny_draft, None, 1)
    assert "Choose a row" in progress


@pytest.mark.parametrize(("stored", "shown"), [(None, "automatic"), (True, "yes"), (False, "no")])
def test_the_goal_and_the_gate_go_through_the_form_and_back(stored, shown):
    spec = {"kind": "length", "name": "short", "weight": 0.3, "max_chars": 20, "only_when": "exact >= 1"}
    if stored is not None:
        spec["goal"] = stored
    values = rewards_tab.form_values(spec)
    by_setting = dict(zip(rewards_tab.SETTINGS, values))
    assert by_setting["goal"] == shown and by_setting["only_when"] == "exact >= 1"
    back = rewards_tab.form_to_dict("length", "short", 0.3, values)
    assert back.get("goal") == stored and back["only_when"] == "exact >= 1"
    assert ("goal" in back) is (stored is not None)
    rewards = [{"kind": "exact"}, back]
    assert parse_rewards(rewards, policy=LAPTOP)[1].only_when == "exact >= 1"
    unsaved = rewards_tab.form_to_dict("length", "short", 0.3, [value if setting != "only_when" else "" for
                                                                 setting, value in zip(rewards_tab.SETTINGS, values)])
    assert parse_rewards([{"kind": "exact"}, unsaved], policy=LAPTOP)[1].only_when is None  # an empty box: always pays
