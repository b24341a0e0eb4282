"""The Tools section's backend: the draft's tools as a table, edited as a list the run config validates, each shown
as the model will see it (its JSON schema), and called on arguments the person types ("Try it").

Tools are built exactly as a run builds them (tools.build_tools over the rows of the draft's data, as
engine.tool_calls.tool_use does), so what Try it answers is what the model would be answered.
"""

from __future__ import annotations

import json
from typing import Any

from ..config import Draft
from ..errors import ConfigError
from ..public import Policy
from ..engine.tool_calls import EPISODE_TOOLS, ToolUse
from ..rewards import EPISODE_SCORE
from ..tools import (DEFAULT_NAMES, ENVIRONMENT_KINDS, TOOL_KINDS, ToolSpec, build_environments, build_tools,
                     demonstration, described, environment_tools, form_settings, parse_tools, tool_schema)
from .playground import data_config, every_row, load_rows, map_rows

TABLE_COLUMNS = ["name", "kind", "what the model is told", "worked examples"]
# What the model is asked with when a tool has no worked example yet: a call that shows the tool working.
SAMPLE_ARGUMENTS = {"calculator": {"expression": "347 * 862"},
                    "convert": {"value": 5, "from_unit": "mile", "to_unit": "kilometer"}}
EXAMPLES_CHARS = 4 * 1_400  # MOST_EXAMPLES lines, each a question and its arguments


def tools_table(tools: list[dict], *, policy: Policy) -> list[list]:
    """One row per tool of a validated list: its name, kind, what the model is told of it, and how many worked
    examples every prompt shows."""
    specs = parse_tools(tools, policy=policy)
    return [[spec.name, spec.kind, described(spec), len(spec.examples)] for spec in specs]


def parse_examples(text: str | None) -> list[dict]:
    """Worked examples typed one a line as ``question → {"argument": "value"}`` (or ``=>``); ConfigError naming
    the line that is not."""
    text = text or ""
    if len(text) > EXAMPLES_CHARS:
        raise ConfigError(f"tools.examples has {len(text):,} characters; a tool's worked examples take at most "
                          f"{EXAMPLES_CHARS:,}.")
    examples = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        question, arrow, arguments = line.partition("→")
        if not arrow:
            question, arrow, arguments = line.partition("=>")
        try:
            parsed = json.loads(arguments) if arrow else None
        except (ValueError, RecursionError):  # JSONDecodeError is a ValueError; so is a number of 5,000 digits
            parsed = None
        if not isinstance(parsed, dict) or not question.strip():
            raise ConfigError(f"tools.examples: line {number} is not `question → {{\"argument\": \"value\"}}`, for "
                              "example `What is 12 × 34? → {\"expression\": \"12 × 34\"}`.")
        examples.append({"question": question.strip(), "arguments": parsed})
    return examples


def validated(tools, *, policy: Policy) -> list[dict]:
    """A tool list as a run validates it, stored as ToolSpec.to_dict dicts: each tool that needs no data built (a
    custom one's code loaded, where the policy allows one) and its worked examples called; ConfigError saying what is
    wrong."""
    specs = parse_tools(tools, policy=policy)
    tools = build_tools([spec for spec in specs if spec.kind not in ("lookup", "search")], [], policy=policy)
    demonstration([spec for spec in specs if spec.kind not in ("lookup", "search")], tools)  # the data's at Start
    build_environments(specs, policy=policy)
    return [spec.to_dict() for spec in specs]


def added(tools: list[dict], spec: dict, *, policy: Policy) -> list[dict]:
    """The list with ``spec`` appended, :func:`validated`; ConfigError saying what is wrong, the list unchanged."""
    return validated([*tools, spec], policy=policy)


def removed(tools: list[dict], name: str) -> list[dict]:
    return [spec for spec in tools if spec.get("name") != name]


def draft_tool(draft: Draft, name: str, *, policy: Policy):
    """The draft's tool ``name`` as the run would build it: (its spec, the function the model calls)."""
    specs = parse_tools(draft.get("tools"), policy=policy)
    chosen = [spec for spec in specs if spec.name == name]
    if not chosen:
        raise ConfigError(f"There is no tool named {str(name)[:40]!r}; choose one of the list.")
    if chosen[0].is_environment:
        (factory,) = build_environments(chosen, draft.get("base_dir") or None, policy=policy).values()
        return chosen[0], factory
    rows = [json.loads(example["row"]) for example in _data_examples(draft, policy=policy)] \
        if chosen[0].kind in ("lookup", "search") else []
    (function,) = build_tools(chosen, rows, draft.get("base_dir") or None, policy=policy)
    return chosen[0], function


def _data_examples(draft: Draft, *, policy: Policy) -> list[dict]:
    """Every row of the draft's data, mapped (each its prompt, reference and row, every column as text: what a run's
    lookups and searches read, and what an environment is reset with)."""
    data = data_config(draft)
    data.validate()
    mapped = map_rows(load_rows(data, draft.get("base_dir") or None, policy=policy).rows, every_row(data), policy=policy)
    return mapped.train + mapped.eval


def shown_schema(draft: Draft, name: str, *, policy: Policy) -> tuple[str, str]:
    """(the tool's JSON schema as the model reads it, arguments to try it with: its first worked example's, or a
    call that shows it working). An environment's: each of its tools' schemas, and a call of its first tool to
    play against the data's first row."""
    spec, function = draft_tool(draft, name, policy=policy)
    if spec.is_environment:
        methods = environment_tools(function)
        schema = json.dumps([tool_schema(method) for method in methods], indent=2, ensure_ascii=False)
        first = tool_schema(methods[0])["function"]
        return schema, json.dumps([{first["name"]: _blank_arguments(first)}], ensure_ascii=False)
    schema = json.dumps(tool_schema(function), indent=2, ensure_ascii=False)
    arguments = spec.examples[0].arguments if spec.examples else SAMPLE_ARGUMENTS.get(spec.kind) or \
        _blank_arguments(tool_schema(function)["function"])
    return schema, json.dumps(arguments, ensure_ascii=False)


def _blank_arguments(schema: dict) -> dict:
    return {parameter: "" for parameter in schema["parameters"].get("properties", {})}


def try_tool(draft: Draft, name: str, arguments_text: str, *, policy: Policy) -> str:
    """What the tool answers these arguments (JSON), as the model would read it; a sentence when it cannot."""
    try:
        arguments = json.loads(arguments_text or "{}")
    except (ValueError, RecursionError):
        raise ConfigError("The arguments are not JSON; write them like {\"expression\": \"2 * 3\"}.") from None
    spec, function = draft_tool(draft, name, policy=policy)
    if spec.is_environment:
        return _play(draft, spec, function, arguments, policy=policy)
    if not isinstance(arguments, dict):
        raise ConfigError("The arguments must be a JSON object of each argument's value, like "
                          "{\"expression\": \"2 * 3\"}.")
    return _called(function, name, arguments)


def _called(function, name: str, arguments: dict) -> str:
    try:
        return function(**arguments)
    except TypeError as error:
        raise ConfigError(f"{name} cannot be called with these arguments: {error}.") from None
    except Exception as error:  # noqa: BLE001 - what the model would read back, as TRL hands it any failure
        return f"error: {error}"


MOST_PLAYED_CALLS = 20


def _play(draft: Draft, spec: ToolSpec, factory, calls, *, policy: Policy) -> str:
    """Play the environment by hand: reset with the data's first row as a run resets it, the ``calls`` made in
    order (a list of {tool: arguments}), each answer, and what the environment says the conversation earned."""
    if isinstance(calls, dict):
        calls = [calls]
    if not isinstance(calls, list) or not calls or len(calls) > MOST_PLAYED_CALLS or not all(
            isinstance(call, dict) and len(call) == 1 and isinstance(next(iter(call.values())), dict)
            for call in calls):
        raise ConfigError(f"Play {spec.name} with a list of at most {MOST_PLAYED_CALLS} calls, each its tool and "
                          "arguments, like [{\"guess\": {\"number\": 50}}, {\"guess\": {\"number\": 25}}].")
    examples = _data_examples(draft, policy=policy)
    use = ToolUse([], environments={spec.name: factory})
    (episode,) = use.episodes(use.shown(examples[:1]))
    tools = {function.__name__: function for function in episode[EPISODE_TOOLS]}
    first = examples[0]
    lines = [f"Reset with row {first.get('number', 1)} (reference answer: {first.get('reference') or '—'})."]
    for call in calls:
        (tool, arguments), = call.items()
        if tool not in tools:
            raise ConfigError(f"{spec.name} has no tool {str(tool)[:40]!r}; its tools are: {', '.join(tools)}.")
        lines.append(f"{tool}({json.dumps(arguments, ensure_ascii=False)}) → {_called(tools[tool], tool, arguments)}")
    try:
        lines.append(f"It scores the conversation {episode[EPISODE_SCORE]():g} (the environment reward).")
    except Exception as error:  # noqa: BLE001 - a custom environment's get_reward may raise anything
        lines.append(f"It cannot score the conversation: {error}")
    return "\n".join(lines)


def new_spec(kind: str, name: str, settings: dict, examples: str) -> dict:
    """The tool the Tools section's form describes: its kind, name, the kind's settings, its worked examples."""
    spec: dict[str, Any] = {"kind": kind, "name": (name or "").strip() or DEFAULT_NAMES.get(kind) or None}
    allowed = form_settings(kind)
    spec.update({key: value for key, value in settings.items() if key in allowed and value not in (None, "")})
    spec["examples"] = parse_examples(examples)
    return spec


__all__ = ["ENVIRONMENT_KINDS", "SAMPLE_ARGUMENTS", "TABLE_COLUMNS", "TOOL_KINDS", "ToolSpec", "added", "draft_tool",
           "form_settings", "new_spec", "parse_examples", "removed", "shown_schema", "tools_table", "try_tool",
           "validated"]
