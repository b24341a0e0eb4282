"""The functions TRL's GRPOTrainer is handed (``tools=``, ``environment_factory=``), built from a run's tool
settings: each bounded in what it may return, refused where the policy refuses it, and stopped with the run."""

from __future__ import annotations

import functools
from collections.abc import Callable

from ..errors import ConfigError
from ..public import Policy
from .bounds import answered, cut
from .builtin import ToolError, calculator, convert_units, make_lookup, make_search
from .environments import Played, environment_class, environment_factory, environment_tools, tool_methods
from .spec import CustomTool, EnvironmentTool, LookupTool, SearchTool, ToolSpec, public_refusal

BUILT_IN: dict[str, Callable[..., str]] = {"calculator": calculator, "convert": convert_units}  # one function of ours


def build_tools(specs: list[ToolSpec], rows: list[dict], base_dir: str | None = None,
                should_stop: Callable[[], bool] | None = None, *, policy: Policy) -> list[Callable]:
    """The run's tools as the functions the model calls: ``rows`` (the data's rows, every column as text) fill the
    lookups and searches; every answer and error is cut to ANSWER_CHARS; once ``should_stop()`` (a stop, a time
    limit), a call raises Stopped, which TRL hands back as a failed call before the run's next forward pass ends the
    step. A tool ``policy`` refuses is refused here too, before its code is loaded, whatever validated it before.
    Environments are left out (:func:`build_environments` builds them)."""
    tools = []
    for index, spec in enumerate(specs):
        if spec.is_environment:
            continue
        where = f"tools[{index}]"
        _refuse(spec, where, policy=policy)
        function = _function(spec, rows, base_dir, where)
        try:
            tool_schema(function)
        except Exception as error:  # transformers' schema errors name what is missing; said with the setting
            raise ConfigError(f"{where}: the model cannot be shown {spec.name!r}: {error}") from None
        tools.append(_bounded(function, should_stop))
    return tools


def build_environments(specs: list[ToolSpec], base_dir: str | None = None,
                       should_stop: Callable[[], bool] | None = None,
                       *, policy: Policy) -> dict[str, type[Played]]:
    """The environments among ``specs``, by name: what TRL's ``environment_factory`` takes (each a class whose
    instances are Played environments, their tools bounded as build_tools' are). A tool of the environment that
    shares the name of another tool the conversation may call, or that the model cannot be shown, is refused."""
    factories = {}
    names = {spec.name: f"tools[{index}]" for index, spec in enumerate(specs) if not spec.is_environment}
    for index, spec in enumerate(specs):
        if not spec.is_environment:
            continue
        where = f"tools[{index}]"
        _refuse(spec, where, policy=policy)
        factory = environment_factory(spec, base_dir, should_stop, where)
        for method in environment_tools(factory):
            if method.__name__ in names:
                raise ConfigError(f"{where}: the {spec.name} environment's tool {method.__name__!r} has the name of "
                                  f"{names[method.__name__]}; rename that tool.")
            try:
                tool_schema(method)
            except Exception as error:  # transformers' schema errors name what is missing; said with the setting
                raise ConfigError(f"{where}: the model cannot be shown the {spec.name} environment's tool "
                                  f"{method.__name__!r}: {error}") from None
        factories[spec.name] = factory
    return factories


def _refuse(spec: ToolSpec, where: str, *, policy: Policy) -> None:
    refusal = public_refusal(spec.kind, policy=policy)
    if refusal is not None:
        raise ConfigError(f"{where}.kind: {refusal}")


def _function(spec: ToolSpec, rows: list[dict], base_dir: str | None, where: str) -> Callable:
    if isinstance(spec, LookupTool):
        _check_columns(rows, (spec.key_column, spec.value_column), where, ("key_column", "value_column"))
        table = {row[spec.key_column]: row[spec.value_column] for row in rows
                 if row.get(spec.key_column) and spec.value_column in row}
        return make_lookup(spec.name, described(spec), f"The {spec.key_column} to look up.", table)
    if isinstance(spec, SearchTool):
        _check_columns(rows, (spec.column,), where, ("column",))
        try:
            return make_search(spec.name, described(spec), [row.get(spec.column, "") for row in rows])
        except ToolError as error:
            raise ConfigError(f"{where}.column {spec.column!r}: {error}") from None
    if isinstance(spec, CustomTool):
        from ..rewards.code import load_function

        function, _ = load_function(spec.code, spec.file, spec.function, f"dragon_tool_{spec.name}", base_dir,
                                    where, f"def {spec.function}(argument: str) -> str with a docstring that says what "
                                    "it does and, under Args:, what each argument is")
        return _renamed(function, spec.name)
    return _renamed(BUILT_IN[spec.kind], spec.name)


def described(spec: ToolSpec) -> str:
    """What the model is told a tool does (its schema's description), known without building it."""
    if isinstance(spec, LookupTool):
        return spec.description or f"Look up the {spec.value_column} of a {spec.key_column}."
    if isinstance(spec, SearchTool):
        return spec.description or f"Search the {spec.column} for the passages that best match some words."
    if isinstance(spec, CustomTool):
        return f"Your function {spec.function}, as its docstring says."
    if isinstance(spec, EnvironmentTool):  # its code is not run to say so
        return f"Your environment {spec.class_name}: its methods are the tools."
    if spec.is_environment:
        kind = environment_class(spec, None, "")
        return f"{' '.join((kind.__doc__ or '').split()).split('. ')[0]}. Its tools: {', '.join(tool_methods(kind))}."
    return (BUILT_IN[spec.kind].__doc__ or "").strip().splitlines()[0]


def _check_columns(rows: list[dict], columns: tuple, where: str, settings: tuple[str, ...]) -> None:
    present = {key for row in rows for key in row}
    for column, setting in zip(columns, settings, strict=True):
        if column not in present:
            shown = ", ".join(sorted(present)[:20]) or "none"
            raise ConfigError(f"{where}.{setting} {column!r} is not a column of the data; its columns are: {shown}.")


def _renamed(function: Callable, name: str) -> Callable:
    """``function`` as the model will call it, by ``name`` (a copy when that differs: the built-ins are shared)."""
    if function.__name__ == name:
        return function

    @functools.wraps(function)
    def renamed(*args, **kwargs):
        return function(*args, **kwargs)

    renamed.__name__ = renamed.__qualname__ = name
    return renamed


def _bounded(function: Callable, should_stop: Callable[[], bool] | None) -> Callable:
    """``function`` as the model calls it (bounds.answered)."""
    @functools.wraps(function)
    def bounded(**arguments):
        return answered(function, arguments, should_stop)

    return bounded


def tool_schema(function: Callable) -> dict:
    """The JSON schema the model is shown for ``function`` (from its name, type hints and docstring), as TRL and
    the chat template make it."""
    from transformers.utils import get_json_schema

    return get_json_schema(function)


def demonstration(specs: list[ToolSpec], tools: list[Callable]) -> list[dict]:
    """The worked examples of every tool as chat messages: each question, the call, the tool's real answer, and that
    answer given back. A call the tool cannot answer is refused here, where the example is set."""
    messages: list[dict] = []
    plain = [(index, spec) for index, spec in enumerate(specs) if not spec.is_environment]
    for (index, spec), tool in zip(plain, tools, strict=True):
        for number, example in enumerate(spec.examples):
            try:
                answer = tool(**example.arguments)
            except TypeError as error:
                raise ConfigError(f"tools[{index}].examples[{number}].arguments do not fit {spec.name}: {error}.") \
                    from None
            except Exception as error:  # noqa: BLE001 - a custom tool may raise anything; the example is refused
                raise ConfigError(f"tools[{index}].examples[{number}]: {spec.name} answers with an error: "
                                  f"{cut(str(error), 'error')}") from None
            call = {"type": "function", "function": {"name": spec.name, "arguments": dict(example.arguments)}}
            messages += [{"role": "user", "content": example.question},
                         {"role": "assistant", "content": "", "tool_calls": [call]},
                         {"role": "tool", "name": spec.name, "content": answer},
                         {"role": "assistant", "content": answer}]
    return messages


def with_demonstration(prompt: list[dict], messages: list[dict]) -> list[dict]:
    """A chat prompt with the worked examples between its system message (if any) and its question."""
    if not messages:
        return prompt
    system = 1 if prompt and prompt[0].get("role") == "system" else 0
    return [*prompt[:system], *messages, *prompt[system:]]
