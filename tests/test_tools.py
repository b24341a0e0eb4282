"""The tools a model may call: the built-in tools' answers and refusals (table-driven), the settings, the bounds on
what a call hands back, and the worked examples shown before each question."""

from __future__ import annotations

import dataclasses
import time

import pytest

from dragon_ui.config import DEFAULT_MODEL_ID, RunConfig
from dragon_ui.errors import ConfigError, Stopped
from dragon_ui.public import LAPTOP, Limits, Policy
from dragon_ui.tools import (ANSWER_CHARS, TOOL_CLASSES, TOOL_SETTINGS, ToolError, ToolSpec, build_tools, demonstration,
                             parse_tools, tool_schema, with_demonstration)
from dragon_ui.tools.builtin import calculator, convert_units, make_lookup, make_search

PUBLIC = Policy(limits=Limits())


@pytest.mark.parametrize("expression, answer", [
    ("347 * 862", "299114"),
    ("347 × 862", "299114"),
    (" 2^10 ", "1024"),
    ("(1 + 2) * 3 - 4 / 2", "7"),
    ("1/3", "0.333333333333"),
    ("0.1 + 0.2", "0.3"),
    ("7 // 2 + 7 % 2", "4"),
    ("-3 ** 2", "-9"),
    ("2 ** -2", "0.25"),
    ("2 ** 0.5", "1.41421356237"),
    ("2 ** 0.5 * 2 ** 60", "1.63047722817e+18"),  # not exact, so not shown as a whole number
    ("2 ** 200", str(2 ** 200)),
    ("10 ** 99", str(10 ** 99)),
    ("1 ** (10 ** 99)", "1"),
    ("99999999999 ** 9", str(99999999999 ** 9)),  # 99 digits: within the bound
])
def test_the_calculator_works_out_arithmetic_exactly(expression, answer):
    assert calculator(expression) == answer


@pytest.mark.parametrize("expression, said", [
    ("10 ** 10 ** 10", "more than 100 digits"),
    ("9" * 101, "more than 100 digits"),
    ("(10 ** 60) * (10 ** 60)", "more than 100 digits"),
    ("7 / 0", "divides by zero"),
    ("0 ** -1", "divides by zero"),
    ("(-8) ** 0.5", "fractional exponent"),
    ("__import__('os').system('id')", "only takes numbers"),
    ("abs(-2)", "only takes numbers"),
    ("[1] * 10", "only takes numbers"),
    ("'a' * 10", "only takes numbers"),
    ("True + 1", "only takes numbers"),
    ("1e400 * 1", "finite"),
    ("0 ** -0.5", "divides by zero"),
    ("(2 ** 0.5) ** 700", "more than 100 digits"),
    ("10 ** 100", "more than 100 digits"),
    ("347 x 862", "not arithmetic"),
    ("1 + " * 60 + "1", "at most 200"),
])
def test_the_calculator_refuses_what_is_not_bounded_arithmetic(expression, said):
    started = time.monotonic()
    with pytest.raises(ToolError, match=said):
        calculator(expression)
    assert time.monotonic() - started < 0.5


@pytest.mark.parametrize("arguments, answer", [
    ((5, "mile", "kilometer"), "8.04672 kilometer"),
    ((30, "degC", "degF"), "86 degF"),
    (("2", "km/h", "m/s"), "0.5555555556 m/s"),
    ((1, "kg", "g"), "1000 g"),
    ((2, "m^2", "cm^2"), "20000 cm^2"),
    ((1, "kg*m/s^2", "N"), "1 N"),
])
def test_the_converter_converts_units(arguments, answer):
    assert convert_units(*arguments) == answer


@pytest.mark.parametrize("arguments, said", [
    ((5, "mile", "kg"), "measure different things"),
    ((5, "__import__('os')", "m"), "not a unit"),
    ((5, "m" * 41, "km"), "not a unit"),
    ((5, "furlongs_of_doom", "m"), "not a unit"),
    ((1e301, "m", "km"), "below 1e300"),
    ((10 ** 400, "m", "km"), "below 1e300"),
    ((1, "9^9^9", "m"), "not a unit"),  # pint computes the numbers in a unit: none but small exponents get through
    ((1, "2**2**2**2 m", "m"), "not a unit"),
    ((1, "m/0", "m"), "not a unit"),
    ((1, "m^0", "1"), "not a unit"),
    (("five", "m", "km"), "must be a number"),
    ((True, "m", "km"), "must be a number"),
])
def test_the_converter_refuses_in_words(arguments, said):
    started = time.monotonic()
    with pytest.raises(ToolError, match=said):
        convert_units(*arguments)
    assert time.monotonic() - started < 0.5


def test_a_lookup_answers_by_key_whatever_its_case_and_spacing():
    lookup = make_lookup("capital_of", "Look up a country's capital.", "The country.", {"France": "Paris",
                                                                                        "New Zealand": "Wellington"})
    assert lookup("france") == "Paris"
    assert lookup("  new   ZEALAND. ") == "Wellington"
    with pytest.raises(ToolError, match="no entry for 'Spain'; entries look like 'France', 'New Zealand'"):
        lookup("Spain")
    assert tool_schema(lookup)["function"] == {
        "name": "capital_of", "description": "Look up a country's capital.",
        "parameters": {"type": "object", "properties": {"key": {"type": "string", "description": "The country."}},
                       "required": ["key"]},
        "return": {"type": "string"}}


def test_a_search_ranks_the_documents_that_share_the_rarest_words_first():
    search = make_search("search_notes", "Search the notes.", ["The cat sat on the mat.", "Dogs bark at night.",
                                                               "A cat and a dog.", "", "walrus " * 1000])
    assert search("cat dog").splitlines() == ["1. A cat and a dog.", "2. The cat sat on the mat."]
    assert search("walrus").endswith("…") and len(search("walrus")) < 320  # a long document comes back cut
    with pytest.raises(ToolError, match="no document mentions"):
        search("zebra")
    with pytest.raises(ToolError, match="some words"):
        search("  ?! ")


ROWS = [{"country": "France", "capital": "Paris", "notes": "Paris is on the Seine."},
        {"country": "Japan", "capital": "Tokyo", "notes": "Tokyo was called Edo."}]


def test_every_built_in_kind_builds_from_the_data_and_shows_its_schema():
    specs = parse_tools([{"kind": "calculator"}, {"kind": "convert"},
                         {"kind": "lookup", "key_column": "country", "value_column": "capital", "name": "capital"},
                         {"kind": "search", "column": "notes"}], policy=LAPTOP)
    tools = build_tools(specs, ROWS, policy=LAPTOP)
    assert [tool_schema(tool)["function"]["name"] for tool in tools] == ["calculator", "convert_units", "capital",
                                                                         "search"]
    calculate, convert, capital, search = tools
    assert (calculate(expression="6 * 7"), convert(value=1, from_unit="km", to_unit="m"), capital(key="japan"),
            search(query="Edo")) == ("42", "1000 m", "Tokyo", "1. Tokyo was called Edo.")


def test_a_tool_answer_is_cut_and_a_stopped_run_calls_no_tool(tmp_path):
    source = ('def shout(text: str) -> str:\n    """Say it loudly.\n\n    Args:\n        text: What to say.\n    """\n'
              '    return text.upper() * 1000\n')
    stopping = []
    (tool,) = build_tools(parse_tools([{"kind": "custom", "code": source, "function": "shout"}], policy=LAPTOP), [],
                          should_stop=lambda: bool(stopping), policy=LAPTOP)
    answer = tool(text="hi")
    assert len(answer) < ANSWER_CHARS + 60 and answer.endswith("(cut: the answer had 2,000 characters)")
    (lookup,) = build_tools(parse_tools([{"kind": "lookup", "key_column": "k", "value_column": "v"}], policy=LAPTOP),
                            [{"k": "a" * 5000, "v": "1"}, {"k": "b" * 5000, "v": "2"}], policy=LAPTOP)
    with pytest.raises(ToolError) as refused:
        lookup(key="c")
    assert len(str(refused.value)) < 200  # its error quotes the keys cut short
    stopping.append(True)
    with pytest.raises(Stopped):
        tool(text="hi")


@pytest.mark.parametrize("tools, said", [
    ([{"kind": "shell"}], "not a known tool kind"),
    ([{}], "has no kind"),
    ("calculator", "must be a list"),
    ([{"kind": "lookup", "key_column": "country"}], "needs key_column .* and value_column"),
    ([{"kind": "search"}], "column is missing"),
    ([{"kind": "calculator", "column": "notes"}], "does not apply to a calculator tool"),
    ([{"kind": "calculator", "colour": "red"}], "unknown setting 'colour'"),
    ([{"kind": "calculator"}, {"kind": "calculator"}], "two tools are named 'calculator'"),
    ([{"kind": "calculator", "name": "2fast"}], "must be a Python name"),
    ([{"kind": "custom"}], "exactly one of code"),
    ([{"kind": "calculator", "examples": [{"question": "?"}]}], "arguments must map"),
    ([{"kind": "calculator", "examples": "12 * 34"}], "must be a list of examples"),
    ([{"kind": "calculator"}] * 9, "more than the 8"),
])
def test_bad_tool_settings_are_refused_naming_the_setting(tools, said):
    with pytest.raises(ConfigError, match=said):
        parse_tools(tools, policy=LAPTOP)


@pytest.mark.parametrize("tool", [
    {"kind": "lookup", "name": "capital_of", "key_column": "country", "value_column": "capital",
     "description": "Give the capital of a country.", "examples": [{"question": "Peru?", "arguments": {"key": "Peru"}}]},
    {"kind": "search", "column": "notes"},
    {"kind": "custom", "code": "def ask(x: str) -> str:\n    return x\n", "function": "ask"},
    {"kind": "environment", "file": "game.py", "class_name": "Game"},
    {"kind": "guess_number"},
])
def test_a_tool_round_trips_through_its_dict(tool):
    spec = ToolSpec.from_dict(tool, policy=LAPTOP)
    assert ToolSpec.from_dict(spec.to_dict(), policy=LAPTOP) == spec
    assert {key: value for key, value in spec.to_dict().items() if key != "name"} == \
        {key: value for key, value in tool.items() if key != "name"}


def test_a_setting_several_kinds_take_is_declared_alike_in_each():
    """The Tools section has one field for it and the reference one row, made from its first declaration."""
    for cls in TOOL_CLASSES:
        for spec in dataclasses.fields(cls):
            first = TOOL_SETTINGS[spec.name]
            assert (spec.default, dict(spec.metadata)) == (first.default, dict(first.metadata)), (cls.kind, spec.name)
            assert spec.metadata["label"] and spec.metadata["help"] and callable(spec.metadata["read"])
    assert [cls.kind for cls in TOOL_CLASSES if cls.is_environment] == ["guess_number", "arithmetic", "environment"]
    assert [cls.kind for cls in TOOL_CLASSES if cls.runs_code] == ["custom", "environment"]


def test_a_public_demo_refuses_custom_tools_before_running_their_code(tmp_path):
    marker = tmp_path / "ran"
    code = f"open({str(marker)!r}, 'w').close()\ndef tool(x: str) -> str:\n    return x\n"
    with pytest.raises(ConfigError, match="custom Python tools and environments are turned off in this public demo"):
        parse_tools([{"kind": "custom", "code": code}], policy=PUBLIC)
    trusted = parse_tools([{"kind": "custom", "code": code}], policy=LAPTOP)  # as a run folder's config is read back
    with pytest.raises(ConfigError, match=r"tools\[0\].kind: custom Python tools and environments are turned off"):
        build_tools(trusted, [], policy=PUBLIC)
    assert not marker.exists()
    assert parse_tools([{"kind": "calculator"}], policy=PUBLIC)[0].kind == "calculator"


@pytest.mark.parametrize("code, said", [
    ("def tool(x):\n    return x\n", "cannot be shown 'tool'"),
    ("def tool(x: str) -> str:\n    return x\n", "cannot be shown 'tool'"),
    ("x = 1\n", "defines no function named 'tool'"),
    ("def tool(:\n", "syntax error"),
])
def test_a_custom_tool_must_be_one_the_model_can_be_shown(code, said):
    with pytest.raises(ConfigError, match=said):
        build_tools(parse_tools([{"kind": "custom", "code": code}], policy=LAPTOP), [], policy=LAPTOP)


def test_a_lookup_over_a_missing_column_is_refused_with_the_columns():
    with pytest.raises(ConfigError, match=r"tools\[0\].value_column 'city' is not a column of the data; its columns "
                                          "are: capital, country, notes"):
        build_tools(parse_tools([{"kind": "lookup", "key_column": "country", "value_column": "city"}], policy=LAPTOP), ROWS, policy=LAPTOP)


def test_worked_examples_call_the_tool_for_real_and_sit_before_the_question():
    specs = parse_tools([{"kind": "calculator", "examples": [
        {"question": "What is 12 * 34?", "arguments": {"expression": "12 * 34"}}]}], policy=LAPTOP)
    messages = demonstration(specs, build_tools(specs, [], policy=LAPTOP))
    assert messages == [
        {"role": "user", "content": "What is 12 * 34?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": "calculator", "arguments": {"expression": "12 * 34"}}}]},
        {"role": "tool", "name": "calculator", "content": "408"},
        {"role": "assistant", "content": "408"}]
    system, question = {"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 3 * 4?"}
    assert with_demonstration([system, question], messages) == [system, *messages, question]
    assert with_demonstration([question], []) == [question]
    bad = parse_tools([{"kind": "calculator", "examples": [{"question": "?", "arguments": {"expression": "1/0"}}]}], policy=LAPTOP)
    with pytest.raises(ConfigError, match=r"tools\[0\].examples\[0\]: calculator answers with an error: .*zero"):
        demonstration(bad, build_tools(bad, [], policy=LAPTOP))


def test_the_run_config_keeps_its_tools(tiny_config_dict):
    plain = RunConfig.from_dict(tiny_config_dict, policy=LAPTOP)
    assert plain.tools == [] and plain.to_dict()["tools"] == [] and "tools: []" in plain.to_yaml()
    with_tools = RunConfig.from_dict({**tiny_config_dict, "tools": [{"kind": "calculator"}],
                                      "grpo": {**tiny_config_dict["grpo"], "max_tool_calling_iterations": 3}}, policy=LAPTOP)
    again = RunConfig.from_dict(with_tools.to_dict(), policy=LAPTOP)
    assert again.tools == with_tools.tools and again.grpo.max_tool_calling_iterations == 3
    with pytest.raises(ConfigError, match="max_tool_calling_iterations"):
        RunConfig.from_dict({**tiny_config_dict, "grpo": {"max_tool_calling_iterations": 0}}, policy=LAPTOP)
    with pytest.raises(ConfigError, match="custom Python tools and environments are turned off"):
        RunConfig.from_dict({**tiny_config_dict, "tools": [{"kind": "custom", "code": "x"}]}, policy=PUBLIC)
    assert LAPTOP.public is False


def test_a_public_demos_run_check_refuses_a_custom_tool_in_a_config_read_back(tiny_config_dict):
    from dragon_ui.engine import public_checks

    config = RunConfig.from_dict({**tiny_config_dict, "runs_dir": "", "model": {"id": DEFAULT_MODEL_ID}, "tools": [
        {"kind": "custom", "code": "def tool(x: str) -> str:\n    return x\n"}]}, load_code=False, policy=LAPTOP)
    with pytest.raises(ConfigError, match=r"tools\[0\].kind: custom Python tools and environments are turned off"):
        public_checks.check_run(config, reads_data=False, policy=PUBLIC)


def test_the_calculator_lesson_fits_a_free_space_with_its_own_prompts():
    """Its prompts are about 416 tokens (the tool's schema and two worked exchanges): without gradient checkpointing
    a step peaked at 15.4 GB and the estimate said 36 GB, which a public demo refuses (docs/performance.md)."""
    from dragon_ui import ASSETS_DIR
    from dragon_ui.engine.estimate import estimate_memory, model_dims

    config = RunConfig.from_file(ASSETS_DIR / "recipes" / "calculator.yaml", policy=LAPTOP)
    dims, _ = model_dims(config.model.id)
    assert config.training.gradient_checkpointing
    assert estimate_memory(config, dims, "bfloat16", False, "cpu", 416).total_gb < 8
