"""The Rewards tab's handlers, called directly: editing the reward list, public mode, and the playground."""

from __future__ import annotations

from types import SimpleNamespace

import gradio as gr
import pandas as pd
import pytest

from dragon_ui.errors import BusyError
from dragon_ui.rewards import REWARD_KINDS, kind_fields, public_demo_refusal
from dragon_ui.studio import Studio
from dragon_ui.ui import build_app, rewards_tab

SETTINGS = rewards_tab.SETTINGS


@pytest.fixture
def studio(tmp_path, monkeypatch):
    monkeypatch.delenv("SPACE_ID", raising=False)
    monkeypatch.delenv("DRAGON_UI_PUBLIC", raising=False)
    return Studio(runs_dir=tmp_path / "runs")


@pytest.fixture
def public_studio(tmp_path, monkeypatch):
    monkeypatch.setenv("DRAGON_UI_PUBLIC", "1")
    return Studio(runs_dir=tmp_path / "runs")


@pytest.fixture
def draft(studio):
    return studio.default_draft()  # arithmetic: numeric (weight 1) + length (max 12 chars, weight 0.3)


def settings(kind: str = "numeric", **values) -> list:
    """Form values for the settings fields, as the form shows a new reward of ``kind`` with some fields typed in."""
    form = rewards_tab.form_values({"kind": kind})
    for name, value in values.items():
        form[SETTINGS.index(name)] = value
    return form


def test_the_app_builds(studio):
    assert isinstance(build_app(studio), gr.Blocks)


def component(demo: gr.Blocks, elem_id: str) -> dict:
    return next(c for c in demo.get_config_file()["components"] if c["props"].get("elem_id") == elem_id)


def test_public_app_hides_the_code_editor(studio, public_studio):
    assert component(build_app(studio), "rewards-kind")["props"].get("info") is None
    demo = build_app(public_studio)
    assert component(demo, "rewards-code")["props"]["visible"] is False
    assert "turned off in this public demo" in component(demo, "rewards-kind")["props"]["info"]


def test_fill_rewards_lists_the_draft_and_loads_the_first(draft):
    table, selector, kind, name, weight, help_text, *fields = rewards_tab.fill_rewards(draft, public=False)
    assert table.values.tolist() == [["numeric", "numeric", 1.0, ""], ["length", "length", 0.3, "max_chars: 12"]]
    assert selector.value == "numeric" and selector.choices == [("numeric", "numeric"), ("length", "length")]
    assert (kind, name, weight) == ("numeric", "numeric", 1.0)
    assert "number equals the reference" in help_text
    shown = {setting for setting, update in zip(SETTINGS, fields, strict=True) if update["visible"]}
    assert shown == {"extract", "tolerance"}


@pytest.mark.parametrize("kind", REWARD_KINDS)
def test_only_the_kinds_settings_are_shown(kind):
    help_text, *updates = rewards_tab.show_kind(kind, public=False)
    assert {s for s, u in zip(SETTINGS, updates, strict=True) if u["visible"]} == set(kind_fields(kind))
    assert help_text == rewards_tab.KIND_HELP[kind]


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
])
def test_add_reward_appends_to_the_draft(draft, kind, name, weight, values, stored):
    new, table, selector, status = rewards_tab.add_reward(draft, kind, name, weight, *settings(kind, **values))
    assert new["rewards"] == [*draft["rewards"], stored]
    assert len(draft["rewards"]) == 2  # the input draft is left alone
    assert table.values.tolist()[-1][:3] == [stored["name"], kind, stored["weight"]]
    assert selector.value == stored["name"] and status.startswith("✅ Added the reward")


def test_save_and_remove(draft):
    new, table, selector, status = rewards_tab.save_reward(draft, "length", "length", "short", 0.5,
                                                           *settings("length", max_chars=20, min_chars=2))
    assert new["rewards"][1] == {"kind": "length", "name": "short", "weight": 0.5, "min_chars": 2, "max_chars": 20}
    assert selector.value == "short" and "Saved the reward short" in status
    kind, name, weight, help_text, *fields = rewards_tab.select_reward(new, "short", public=False)
    assert (kind, name, weight) == ("length", "short", 0.5)
    assert fields[SETTINGS.index("max_chars")]["value"] == 20 and fields[SETTINGS.index("max_chars")]["visible"]

    new, table, selector, status = rewards_tab.remove_reward(new, "numeric")
    assert [spec["name"] for spec in new["rewards"]] == ["short"] and selector.value == "short"
    new, table, selector, status = rewards_tab.remove_reward(new, "short")
    assert new["rewards"] == [] and selector.value is None and "add at least one" in status


def test_a_custom_reward_from_a_file_round_trips_through_the_form(draft, tmp_path):
    script = tmp_path / "score.py"
    script.write_text("def reward(prompt, completion, reference, row):\n    return 0.5\n", encoding="utf-8")
    spec = {"kind": "custom", "name": "mine", "weight": 1.0, "file": str(script)}
    draft = {**draft, "rewards": [*draft["rewards"], spec]}
    kind, name, weight, help_text, *fields = rewards_tab.select_reward(draft, "mine", public=False)
    values = [field["value"] for field in fields]
    assert values[SETTINGS.index("code")] == "" and values[SETTINGS.index("file")] == str(script)
    new, table, selector, status = rewards_tab.save_reward(draft, "mine", kind, name, weight, *values)
    assert new["rewards"][-1] == spec and status == "✅ Saved the reward mine."


@pytest.mark.parametrize("handler, args, fragment", [
    ("add", ("regex", "bad", 1.0, {"pattern": "("}), "rewards[2].pattern is not a valid regular expression"),
    ("add", ("regex", "", 1.0, {}), "rewards[2].pattern is missing"),
    ("add", ("length", "length", 1.0, {"max_chars": 5}), "two rewards are named 'length'"),
    ("add", ("length", "", 1.0, {"min_chars": 9, "max_chars": 5}), "min_chars (9) is larger than"),
    ("add", ("numeric", "has space", 1.0, {}), "may only use letters, digits and underscores"),
    ("add", ("numeric", "neg", -1, {}), "weight must be zero or more"),
    ("add", ("custom", "broken", 1.0, {"code": "def reward(:\n"}), "has a syntax error on line 1"),
    ("save", ("numeric", "length", 1.0, {}), "two rewards are named 'length'"),
    ("save_unselected", ("numeric", "numeric", 1.0, {}), "Select a reward to change"),
])
def test_bad_forms_show_the_error_and_leave_the_draft(draft, handler, args, fragment):
    kind, name, weight, values = args
    form = settings(kind, **values)
    if handler == "add":
        result = rewards_tab.add_reward(draft, kind, name, weight, *form)
    else:
        selected = "numeric" if handler == "save" else "nothing"
        result = rewards_tab.save_reward(draft, selected, kind, name, weight, *form)
    new, table, selector, status = result
    assert new is draft and table == selector == gr.skip()
    assert fragment in status


def test_public_mode_hides_custom_code_and_refuses_code_rewards(public_studio):
    draft = public_studio.default_draft()
    for kind in ("custom", "command"):
        help_text, *updates = rewards_tab.show_kind(kind, public=True)
        assert "turned off in this public demo" in help_text
        assert not any(update["visible"] for update in updates)  # the code editor and every other field hidden
        values = {"argv": "python check.py"} if kind == "command" else {}
        new, table, selector, status = rewards_tab.add_reward(draft, kind, "mine", 1.0, *settings(kind, **values))
        assert new is draft and "turned off in this public demo" in status
    help_text, *updates = rewards_tab.show_kind("regex", public=True)
    assert help_text == rewards_tab.KIND_HELP["regex"] and updates[SETTINGS.index("pattern")]["visible"]
    assert [kind for kind in REWARD_KINDS if public_demo_refusal(kind)] == ["command", "custom"]


# --------------------------------------------------------------------------------------------- playground


def test_playground_rows_and_scoring_a_typed_completion(draft):
    picker, row_text = rewards_tab.playground_rows(draft, None)
    assert len(picker.choices) == 20 and picker.value == 0
    assert picker.choices[0] == ("1: What is 66 + 24? Reply with just the number.", 0)
    assert row_text == "**Prompt:** What is 66 + 24? Reply with just the number.\n\n**Reference:** 90"

    table, total = rewards_tab.score_typed(draft, 0, "90")
    assert isinstance(table, pd.DataFrame)
    assert table[["reward", "weight", "score", "weighted"]].values.tolist() == [["numeric", 1.0, 1.0, 1.0],
                                                                               ["length", 0.3, 1.0, 0.3]]
    assert total == "**Total (weighted sum): 1.300**"
    table, total = rewards_tab.score_typed(draft, 1, "The sum is 30, I think.")  # row 2 is 10 + 21 = 31
    assert table["score"].tolist() == [0.0, pytest.approx(1 - (23 - 12) / 12, abs=1e-4)]


def test_playground_explains_problems(draft):
    no_reference = {**draft, "data": {**draft["data"], "reference": None}}
    table, total = rewards_tab.score_typed(no_reference, 0, "90")
    assert "no reference answer" in table.loc[0, "problem"] and "Failed rewards score 0" in total
    picker, row_text = rewards_tab.playground_rows({**draft, "data": {**draft["data"], "prompt": "{nope}"}}, 3)
    assert picker.choices == [] and "No rows to try: data.prompt uses the column 'nope'" in row_text
    with pytest.raises(gr.Error, match="Choose a row"):
        rewards_tab.score_typed(draft, None, "90")


@pytest.fixture
def tiny_draft(studio, tiny_model_dir):
    draft = studio.default_draft()
    draft["model"]["id"] = str(tiny_model_dir)
    draft["grpo"]["max_new_tokens"] = 4
    draft["hardware"]["device"] = "cpu"
    return draft


def test_generate_a_group_with_the_tiny_model(studio, tiny_draft):
    updates = list(rewards_tab.generate_samples(studio, tiny_draft, 0, 2))
    assert updates[0][0].startswith("ℹ️ Loading ")
    progress, table, warnings = updates[-1]
    assert progress.startswith("✅ Sampled 12 replies to 2 row(s)")  # group_size 6 from the arithmetic recipe
    assert list(table.columns) == ["row", "completion", "numeric", "length", "total", "advantage"]
    assert table["row"].tolist() == [1] * 6 + [2] * 6
    for _, group in table.groupby("row"):
        assert group["advantage"].sum() == pytest.approx(0.0, abs=0.05)  # rounded to 2 decimals per reply
    assert warnings  # either "every group has different scores" or a no-signal warning per row


def test_generation_can_be_cancelled_between_prompts(studio, tiny_draft):
    request = SimpleNamespace(session_hash="session-1")
    generation = rewards_tab.generate_samples(studio, tiny_draft, 0, 3, request=request)
    for progress, table, warnings in generation:
        if isinstance(table, pd.DataFrame):
            break
    assert rewards_tab.cancel_generation(request) == "ℹ️ Cancelled."
    assert list(generation) == []  # the second row never started
    assert set(table["row"]) == {1}


def test_generation_shows_busy_and_config_errors(studio, tiny_draft, monkeypatch):
    def busy(*args, **kwargs):
        raise BusyError("A training is running on this machine's CPU; generating previews now would slow it down "
                        "badly. Wait for it to finish or stop it first.")

    monkeypatch.setattr(studio, "inference_model", busy)
    progress, table, warnings = list(rewards_tab.generate_samples(studio, tiny_draft, 0, 1))[-1]
    assert progress.startswith("❌ A training is running on this machine's CPU") and table == gr.skip()

    bad = {**tiny_draft, "grpo": {**tiny_draft["grpo"], "temperature": 0}}
    (progress, table, warnings), = rewards_tab.generate_samples(studio, bad, 0, 1)
    assert "grpo.temperature must be above 0" in progress
    (progress, table, warnings), = rewards_tab.generate_samples(studio, tiny_draft, None, 1)
    assert "Choose a row" in progress
