"""The Rewards tab's Tools section: adding and removing tools through the run config's validation, a tool shown as
the model sees it, Try it answering what the model would be answered, and hostile inputs answered in words."""

from __future__ import annotations

import json
import time

import gradio as gr
import pytest
from conftest import said, write_arithmetic_csv

from dragon_ui.public import LAPTOP, Limits, Policy
from dragon_ui.settings import plain
from dragon_ui.studio import tools as studio_tools
from dragon_ui.tools import TOOL_SETTINGS
from dragon_ui.ui import tools_section

PUBLIC = Policy(limits=Limits())
SETTINGS = {name: None for name in tools_section.SETTING_NAMES}


def add(tools, kind, name="", examples="", policy=LAPTOP, **settings):
    values = [settings.get(name_, SETTINGS[name_]) for name_ in tools_section.SETTING_NAMES]
    return tools_section.add_tool(tools, kind, name, examples, *values, policy=policy)


@pytest.fixture
def draft(tmp_path) -> dict:
    data = write_arithmetic_csv(tmp_path / "arithmetic.csv")
    return {"data": {"source": str(data), "prompt": "question", "reference": "answer"}, "rewards": [{"kind": "numeric"}]}


def test_tools_are_added_shown_tried_and_removed(draft):
    tools, table, chosen, status = add([], "calculator", examples='What is 12 × 34? → {"expression": "12 × 34"}')
    assert said(status) == [("ok", "Added the tool calculator.")]
    assert tools == [{"kind": "calculator", "name": "calculator", "examples": [
        {"question": "What is 12 × 34?", "arguments": {"expression": "12 × 34"}}]}]
    assert table.value["data"] == [["calculator", "calculator", "Work out an arithmetic expression exactly: + - * / ** "
                                    "and brackets.", 1]]
    assert chosen.value == "calculator"
    tools, _, chosen, _ = add(tools, "lookup", name="answer_of", key_column="question", value_column="answer")
    draft["tools"] = tools
    schema, arguments, problem = tools_section.show_tool(draft, "answer_of", policy=LAPTOP)
    assert json.loads(schema)["function"]["name"] == "answer_of" and json.loads(arguments) == {"key": ""}
    assert problem == ""
    question = draft_question(draft)
    answer = tools_section.call_tool(draft, "answer_of", json.dumps({"key": question["question"]}), policy=LAPTOP)
    assert answer == f"**answer_of answered:**\n\n```\n{question['answer']}\n```"
    schema, arguments, _ = tools_section.show_tool(draft, "calculator", policy=LAPTOP)
    assert json.loads(arguments) == {"expression": "12 × 34"}
    assert "```\n408\n```" in tools_section.call_tool(draft, "calculator", arguments, policy=LAPTOP)
    tools, table, chosen, status = tools_section.remove_tool(tools, "calculator", policy=LAPTOP)
    assert [tool["name"] for tool in tools] == ["answer_of"] and said(status) == [("ok", "Removed the tool calculator.")]


def draft_question(draft: dict) -> dict:
    import csv

    with open(draft["data"]["source"], encoding="utf-8") as handle:
        return next(csv.DictReader(handle))


@pytest.mark.parametrize("kind, settings, examples, words", [
    ("lookup", {"key_column": "question"}, "", "needs key_column"),
    ("calculator", {}, "What is 2 * 3? {\"expression\": \"2 * 3\"}", "line 1 is not `question → "),
    ("calculator", {}, "What is 2 * 3? → [1, 2]", "line 1 is not"),
    ("calculator", {}, "What is 2 * 3? → {\"expression\": \"2 / 0\"}\n", "calculator answers with an error: the "
                                                                         "expression divides by zero"),
    ("calculator", {}, "What is 2 * 3? → {\"expr\": \"2 * 3\"}", "arguments do not fit calculator"),
    ("calculator", {}, "q → " + "[" * 3000, "line 1 is not"),
    ("calculator", {}, "q → {\"expression\": " + "9" * 5000 + "}", "line 1 is not"),
    ("calculator", {}, "What " + " " * 30_000 + "x", "take at most 5,600"),
    ("lookup", {"key_column": "a", "value_column": "b", "description": "  "}, "", "must say in words"),
    ("lookup", {"key_column": "a", "value_column": "b", "description": "Look.\nArgs:\n  x: y"}, "", "without sections"),
    ("custom", {"code": "def tool(:"}, "", "syntax error"),
    ("shell", {}, "", "Choose a kind of tool"),
])
def test_a_tool_the_run_would_refuse_is_refused_here_and_the_list_stays(kind, settings, examples, words):
    before = [{"kind": "convert", "name": "convert_units"}]
    started = time.monotonic()
    answer = add(before, kind, examples=examples, **settings)
    assert time.monotonic() - started < 0.5  # linear in what was typed, however it was typed
    assert answer[:3] == [tools_section.gr.skip()] * 3 and words in said(answer[3])[0][1]


def test_a_public_demo_offers_no_custom_tool_and_refuses_one_sent_anyway(tmp_path):
    marker = tmp_path / "ran"
    assert "custom" not in tools_section.kinds(policy=PUBLIC) and "custom" in tools_section.kinds(policy=LAPTOP)
    answer = add([], "custom", policy=PUBLIC, code=f"open({str(marker)!r}, 'w')\ndef tool(x: str) -> str:\n    return x\n")
    assert said(answer[3]) == [("warn", "Choose a kind of tool: calculator, convert, lookup, search, guess_number, "
                                        "arithmetic.")]
    kept = tools_section.fill_tools({"tools": [{"kind": "custom", "code": "def tool(x: str) -> str:\n    return x\n"}]},
                                    policy=PUBLIC)
    assert kept[0] == [] and "custom Python tools and environments are turned off" in said(kept[3])[0][1]
    assert not marker.exists()


def test_the_form_has_a_field_for_every_setting_a_kind_takes_labelled_as_declared():
    every = {name for kind in studio_tools.TOOL_KINDS for name in studio_tools.form_settings(kind)}
    assert sorted(tools_section.SETTING_NAMES) == sorted(every)
    with gr.Blocks():
        fields = {name: tools_section.setting_field(name) for name in tools_section.SETTING_NAMES}
    for name, field in fields.items():
        declared = TOOL_SETTINGS[name].metadata
        assert field.label == declared["label"] and not field.visible
        assert isinstance(field, gr.Code) or field.info == plain(declared["help"])
    assert fields["function"].value == "tool" and fields["class_name"].value == "Environment"


@pytest.mark.parametrize("kind", studio_tools.TOOL_KINDS)
def test_a_kind_shows_its_help_its_settings_and_examples_unless_an_environment(kind):
    help_text, *settings, examples = tools_section.change_kind(kind)
    assert help_text == tools_section.KIND_HELP[kind]
    shown = {name for name, update in zip(tools_section.SETTING_NAMES, settings, strict=True) if update["visible"]}
    assert shown == set(studio_tools.form_settings(kind))
    assert examples["visible"] is (kind not in studio_tools.ENVIRONMENT_KINDS)


@pytest.mark.parametrize("chosen, arguments, words", [
    (None, "{}", "Add a tool first"),
    ("nosuch", "{}", "There is no tool named 'nosuch'"),
    ("calculator", "not json", "The arguments are not JSON"),
    ("calculator", "[1, 2]", "must be a JSON object"),
    ("calculator", '{"nothing": 1}', "calculator cannot be called with these arguments"),
    ("calculator", json.dumps({"expression": "9 ** 9 ** 9"}), "error: the result would have more than 100 digits"),
    ("calculator", "{" + " " * 10_000_000 + "}", "The arguments are not JSON"),  # cut to 2,000 characters first
])
def test_try_it_answers_what_the_model_would_read_or_says_why_not(draft, chosen, arguments, words):
    draft["tools"] = [{"kind": "calculator", "name": "calculator"}]
    assert words in tools_section.call_tool(draft, chosen, arguments, policy=LAPTOP)


def test_a_huge_cell_comes_back_cut_and_a_huge_corpus_is_refused(tmp_path):
    data = tmp_path / "facts.csv"
    data.write_text("key,fact\n" + "".join(f"k{i},{'x' * 5000}\n" for i in range(1100)))
    draft = {"data": {"source": str(data), "prompt": "key"},
             "tools": [{"kind": "lookup", "name": "fact_of", "key_column": "key", "value_column": "fact"},
                       {"kind": "search", "name": "search", "column": "fact"}]}
    answer = tools_section.call_tool(draft, "fact_of", '{"key": "k1"}', policy=LAPTOP)
    assert "… (cut: the answer had 5,000 characters)" in answer and len(answer) < 1100
    refused = tools_section.call_tool(draft, "search", '{"query": "x"}', policy=LAPTOP)
    assert "more than the 2,000,000 a search tool indexes" in refused


def test_the_table_and_the_rounds_follow_a_loaded_draft():
    tools, table, chosen, status, rounds, column = tools_section.fill_tools(
        {"tools": [{"kind": "calculator", "name": "calc"}], "grpo": {"max_tool_calling_iterations": 3},
         "data": {"environment_column": "game"}}, policy=LAPTOP)
    assert tools == [{"kind": "calculator", "name": "calc"}] and rounds == 3 and chosen.value == "calc"
    assert column == "game"
    assert studio_tools.tools_table([], policy=LAPTOP) == [] and tools_section.fill_tools({}, policy=LAPTOP)[0] == []


def test_an_environment_is_added_shown_and_played_by_hand(draft):
    """The guessing game: its tools' schemas, and a game played by hand against the data's first row, scored as
    the environment reward scores a conversation."""
    tools, table, chosen, status = add([], "guess_number", examples='Hi → {"number": 1}')
    assert "shows no worked examples" in said(status)[0][1]
    tools, table, chosen, status = add([], "guess_number")
    assert tools == [{"kind": "guess_number", "name": "guess_number"}]
    assert table.value["data"][0][:3] == ["guess_number", "guess_number", "A number-guessing game: the row's "
                                          "reference answer is the secret, a whole number. Its tools: guess."]
    draft["tools"] = tools
    schema, arguments, _ = tools_section.show_tool(draft, "guess_number", policy=LAPTOP)
    assert [tool["function"]["name"] for tool in json.loads(schema)] == ["guess"]
    assert json.loads(arguments) == [{"guess": {"number": ""}}]
    secret = int(draft_question(draft)["answer"])  # the first row's reference answer
    played = tools_section.call_tool(draft, "guess_number", json.dumps(
        [{"guess": {"number": secret + 1}}, {"guess": {"number": secret}}]), policy=LAPTOP)
    assert (f"guess({{\"number\": {secret + 1}}}) → The secret number is lower.\n"
            f"guess({{\"number\": {secret}}}) → Right: the secret number is {secret}.\n"
            "It scores the conversation 0.9 (the environment reward).") in played
    for hostile, words in [("[]", "Play guess_number with a list of at most 20 calls"),
                           ('{"shout": {}}', "guess_number has no tool 'shout'; its tools are: guess"),
                           (json.dumps([{"guess": {"number": 1}}] * 21), "at most 20 calls")]:
        answer = tools_section.call_tool(draft, "guess_number", hostile, policy=LAPTOP)
        assert words is None or words in answer, answer
    draft["data"]["reference"] = "question"
    assert "the GuessNumber environment cannot play it: the reference answer (the secret) must be a number" in \
        tools_section.call_tool(draft, "guess_number", '{"guess": {"number": 1}}', policy=LAPTOP)


def test_a_custom_environment_is_trusted_only_and_needs_a_class_with_tools(tmp_path):
    marker = tmp_path / "ran"
    code = f"open({str(marker)!r}, 'w')\n" + tools_section.STARTER_ENVIRONMENT
    answer = add([], "environment", policy=PUBLIC, code=code, class_name="Environment")
    assert "Choose a kind of tool" in said(answer[3])[0][1] and not marker.exists()
    tools, _, _, status = add([], "environment", code=tools_section.STARTER_ENVIRONMENT, class_name="Environment")
    assert said(status) == [("ok", "Added the tool Environment.")]
    for code, class_name, words in [
            ("x = 1", "Environment", "defines no function named 'Environment'"),
            ("def Environment(): pass", "Environment", "Environment must be a class with a reset method"),
            ("class Game:\n    def reset(self, **row): pass\n", "Game", "Game has no public method for the model"),
            ("class Game:\n    def reset(self, **row): pass\n    def go(self, x): return x\n", "Game",
             "the model cannot be shown the Game environment's tool 'go'")]:
        answer = add([], "environment", code=code, class_name=class_name)
        assert words in said(answer[3])[0][1], said(answer[3])
    assert tools_section.change_kind("environment")[-1]["visible"] is False  # no worked examples for an environment
    assert tools_section.change_kind("calculator")[-1]["visible"] is True
