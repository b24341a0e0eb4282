"""The tool settings: one class per kind of tool the model may call, which declares the settings it takes
(settings.setting: label, help, default, and how a stored value is read and checked) and says what the model calls;
and the worked examples a run shows the model before each prompt. The validation, the Tools section's fields and
docs/reference.md's tables of tools are all made from these classes."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, ClassVar

from ..errors import ConfigError, check_length, check_unique_names
from ..public import LIFT, Policy
from ..settings import kind_settings_table, kinds_table, own_settings, read_kind_settings, setting

_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,39}")
_SECTION_RE = re.compile(r"^\s*(Args|Arguments|Returns|Raises|Yields)\s*:", re.MULTILINE)  # a docstring's own
MOST_TOOLS, MOST_EXAMPLES = 8, 4
_LONGEST_TEXT = 200
PUBLIC_REFUSAL = (f"custom Python tools and environments are turned off in this public demo because they run "
                  f"arbitrary code on the server; {LIFT} to use them.")


@dataclass
class ToolExample:
    """A worked exchange shown to the model before every prompt: ``question`` asked, the tool called with
    ``arguments``, its real answer, and that answer given back. Small models copy a shown call far more readily
    than they follow a description of the format."""

    question: str
    arguments: dict[str, object]


def _as_text(value: object, label: str) -> str:
    if not isinstance(value, str):
        raise ConfigError(f"{label} must be text, not {type(value).__name__}.")
    return value


def _as_python_name(value: object, label: str) -> str:
    text = _as_text(value, label)
    if not _NAME_RE.fullmatch(text):
        raise ConfigError(f"{label} {text[:40]!r} must be a Python name.")
    return text


def _as_description(value: object, label: str) -> str:
    text = _as_text(value, label).strip()
    if not text or _SECTION_RE.search(text):
        raise ConfigError(f"{label} must say in words what the tool does (the model reads it), without sections like "
                          "Args: or Returns:.")
    return text


def _listed(items: object, where: str, most: int, what: str, each: str, holder: str) -> list[Any]:
    """``items`` as a list of at most ``most`` (none when not given); ConfigError in words otherwise."""
    if items in (None, ""):
        return []
    if not isinstance(items, list):
        raise ConfigError(f"{where} must be a list of {what}, each {each}.")
    if len(items) > most:
        raise ConfigError(f"{where} has {len(items)} {what}, more than the {most} {holder}.")
    return items


def _examples(items: object, where: str) -> list[ToolExample]:
    items = _listed(items, where, MOST_EXAMPLES, "examples", "with a question and the call's arguments",
                    "a tool may show")
    examples = []
    for index, item in enumerate(items):
        at = f"{where}[{index}]"
        if not isinstance(item, Mapping) or set(item) - {"question", "arguments"}:
            raise ConfigError(f"{at} must be a mapping of a question and the call's arguments, like "
                              "{question: 'What is 12 * 34?', arguments: {expression: '12 * 34'}}.")
        question, arguments = item.get("question"), item.get("arguments")
        if not isinstance(question, str) or not question.strip():
            raise ConfigError(f"{at}.question must be the text of a question the tool helps answer.")
        check_length(f"{at}.question", question, 1000)
        if not isinstance(arguments, Mapping) or not all(isinstance(k, str) for k in arguments):
            raise ConfigError(f"{at}.arguments must map each of the tool's arguments to its value.")
        for key, value in arguments.items():
            if not isinstance(value, str | int | float) or isinstance(value, bool) or (
                    isinstance(value, float) and not math.isfinite(value)):
                raise ConfigError(f"{at}.arguments.{key[:40]} must be text or a finite number.")
            check_length(f"{at}.arguments.{key[:40]}", str(value), _LONGEST_TEXT)
        examples.append(ToolExample(question, dict(arguments)))
    return examples


@dataclass
class ToolSpec:
    """One tool as the run config stores it: the settings every kind takes. Each kind is a subclass that declares
    its own and says what the model calls; build one with :meth:`from_dict`, which validates everything."""

    kind: ClassVar[str]
    help: ClassVar[str]  # what the model calls, in a sentence or two of Markdown (the Tools section, the reference)
    details: ClassVar[str] = ""  # what only the reference adds to that
    # An environment: one instance per conversation, whose methods are the tools (tools.environments).
    is_environment: ClassVar[bool] = False
    runs_code: ClassVar[bool] = False  # its Python code runs on the server
    called: ClassVar[str] = ""  # the name the model calls a built-in kind by (an environment: the data's rows pick it by)

    name: str = setting("", label="Name", shown_default="the kind's own", read=_as_text, help=(
        "What the model calls it: letters, digits and `_`, at most 40 and not starting with a digit."))
    examples: list[ToolExample] = setting(label="Worked examples", factory=list, shown_default="none",
                                          read=_examples, help=(
        f"Up to {MOST_EXAMPLES} exchanges the run puts before every question, each a `question` and the call's "
        "`arguments`: the tool is called for real and its answer shown. An environment shows none."))

    @staticmethod
    def from_dict(data: object, where: str = "tools[0]", *, policy: Policy) -> ToolSpec:
        if not isinstance(data, Mapping):
            raise ConfigError(f"{where} must be a mapping of settings like {{'kind': 'calculator'}}, "
                              f"not {type(data).__name__}.")
        kind = data.get("kind")
        if kind not in TOOL_KINDS:
            said = "has no kind" if kind is None else f".kind {str(kind)[:40]!r} is not a known tool kind"
            raise ConfigError(f"{where}{' ' if kind is None else ''}{said}; choose one of: {', '.join(TOOL_KINDS)}.")
        refusal = public_refusal(kind, policy=policy)
        if refusal is not None:
            raise ConfigError(f"{where}.kind: {refusal}")
        cls = KINDS[kind]
        values = read_kind_settings(data, where, cls, TOOL_CLASSES, ToolSpec, noun="tool", longest=_LONGEST_TEXT)
        tool = cls(**values)
        tool.name = tool.name or tool.own_name()
        if not _NAME_RE.fullmatch(tool.name):
            raise ConfigError(f"{where}.name {tool.name[:40]!r} must be a Python name of at most 40 letters, digits "
                              "and underscores, not starting with a digit: the model calls the tool by it.")
        tool.check(where)
        return tool

    def own_name(self) -> str:
        """The name the model calls it by when it names none."""
        return self.called

    def check(self, where: str) -> None:
        """The checks that involve several settings of the kind."""
        if self.examples and self.is_environment:
            raise ConfigError(f"{where}.examples: an environment shows no worked examples (its tools answer only "
                              "within a conversation it was reset for); describe the game in the prompt instead.")

    def to_dict(self) -> dict[str, Any]:
        """kind and name, plus every setting that differs from its default; round-trips via from_dict."""
        out: dict[str, Any] = {"kind": self.kind, "name": self.name}
        for spec in fields(self):
            value = getattr(self, spec.name)
            if spec.name == "examples":
                if value:
                    out["examples"] = [{"question": e.question, "arguments": dict(e.arguments)} for e in value]
            elif spec.name not in out and value != spec.default:
                out[spec.name] = value
        return out


def _description() -> Any:
    return setting(None, label="What the model is told it does", shown_default="made from the settings",
                   read=_as_description, longest=500, help=(
                       "A sentence or two in words (the model reads it), without sections like Args: or Returns:."))


@dataclass
class CodeTool(ToolSpec):
    """A tool whose Python code (``code``, or the ``file`` it is in) runs on the server."""

    runs_code: ClassVar[bool] = True
    details: ClassVar[str] = "Refused in a public demo."

    code: str | None = setting(None, label="Python code", read=_as_text, longest=100_000, help=(
        "The Python source: a function for a custom tool, a class for an environment."))
    file: str | None = setting(None, label="…or a .py file", read=_as_text, longest=1000,
                               help="A .py file that holds the source, read instead of the code.")

    def check(self, where: str) -> None:
        super().check(where)
        if (self.code is None) == (self.file is None):
            raise ConfigError(f"{where} needs exactly one of code (the Python source) or file (a .py file).")


@dataclass
class CalculatorTool(ToolSpec):
    kind: ClassVar[str] = "calculator"
    called: ClassVar[str] = "calculator"
    help: ClassVar[str] = ("Works out arithmetic exactly: `calculator(expression)` with `+ - * / // % **` and "
                           "brackets (`×`, `÷` and `^` are read as `*`, `/` and `**`).")
    details: ClassVar[str] = ("Over exact fractions; no names or functions; at most 200 characters and 100 digits in "
                              "any number.")


@dataclass
class ConvertTool(ToolSpec):
    kind: ClassVar[str] = "convert"
    called: ClassVar[str] = "convert_units"
    help: ClassVar[str] = ("Converts amounts between units: miles to km, degC to degF, km/h to m/s "
                           "(`convert_units(value, from_unit, to_unit)`).")
    details: ClassVar[str] = "With [pint](https://pint.readthedocs.io)'s units (\"mile\", \"km/h\", \"degC\")."


@dataclass
class LookupTool(ToolSpec):
    kind: ClassVar[str] = "lookup"
    called: ClassVar[str] = "lookup"
    help: ClassVar[str] = ("Answers the value column of the data row whose key column matches what the model asks "
                           "(`lookup(key)`).")
    details: ClassVar[str] = "The key is compared without case, extra spaces or trailing punctuation."

    key_column: str | None = setting(None, label="Key column", read=_as_text,
                                     help="The data column the model looks up by (e.g. country).")
    value_column: str | None = setting(None, label="Value column", read=_as_text,
                                       help="The data column it gets back (e.g. capital).")
    description: str | None = _description()

    def check(self, where: str) -> None:
        super().check(where)
        if not (self.key_column and self.value_column):
            raise ConfigError(f"{where} needs key_column (the column the model looks up by) and value_column (the "
                              "column it gets back).")


@dataclass
class SearchTool(ToolSpec):
    kind: ClassVar[str] = "search"
    called: ClassVar[str] = "search"
    help: ClassVar[str] = ("Answers the three passages of a column of the data that best match the model's words "
                           "(`search(query)`).")
    details: ClassVar[str] = "The passages are ranked by BM25 and each cut to 300 characters."

    column: str | None = setting(None, label="Column to search", read=_as_text,
                                 help="The data column holding the passages to search.")
    description: str | None = _description()

    def check(self, where: str) -> None:
        super().check(where)
        if not self.column:
            raise ConfigError(f"{where}.column is missing: name the column holding the documents to search.")


@dataclass
class CustomTool(CodeTool):
    kind: ClassVar[str] = "custom"
    help: ClassVar[str] = "Your own Python function: type hints and a docstring with Args (the model is shown them)."

    function: str = setting("tool", label="Function name", read=_as_python_name,
                            help="The function of the code that the model calls.")

    def own_name(self) -> str:
        return self.function


@dataclass
class GuessNumberTool(ToolSpec):
    kind: ClassVar[str] = "guess_number"
    called: ClassVar[str] = "guess_number"
    is_environment: ClassVar[bool] = True
    help: ClassVar[str] = ("An environment: a game per conversation whose secret is the row's reference answer (a "
                           "whole number); the model calls `guess(number)` and hears higher or lower. It scores "
                           "itself (the environment reward).")
    details: ClassVar[str] = ("1 for finding it at the first guess, 0.1 less for each guess after (at least 0.5), 0 "
                              "for never finding it.")


@dataclass
class ArithmeticTool(ToolSpec):
    kind: ClassVar[str] = "arithmetic"
    called: ClassVar[str] = "arithmetic"
    is_environment: ClassVar[bool] = True
    help: ClassVar[str] = ("An environment: the model works with its calculator, then submits one result, scored 1 "
                           "when it equals the row's reference answer (the environment reward).")
    details: ClassVar[str] = ("It calls `calculator(expression)` as often as it needs, then `submit(answer)` once; a "
                              "wrong or missing answer scores 0.")


@dataclass
class EnvironmentTool(CodeTool):
    kind: ClassVar[str] = "environment"
    is_environment: ClassVar[bool] = True
    help: ClassVar[str] = ("Your own environment: a class with `reset(self, question, reference, row)`; its other "
                           "methods are the tools, and `get_reward(self)` scores the conversation (the environment "
                           "reward).")
    details: ClassVar[str] = (
        "`reset` is handed the last user message, the reference answer and the file's row as a mapping, and returns "
        "text the model reads after the question, or None; the tools need type hints and docstrings. Refused in a "
        "public demo.")

    class_name: str = setting("Environment", label="Class name", read=_as_python_name,
                              help="The class of the code that is the environment.")

    def own_name(self) -> str:
        return self.class_name


TOOL_CLASSES: tuple[type[ToolSpec], ...] = (CalculatorTool, ConvertTool, LookupTool, SearchTool, CustomTool,
                                            GuessNumberTool, ArithmeticTool, EnvironmentTool)
KINDS: dict[str, type[ToolSpec]] = {cls.kind: cls for cls in TOOL_CLASSES}
TOOL_KINDS = tuple(KINDS)
ENVIRONMENT_KINDS = tuple(kind for kind, cls in KINDS.items() if cls.is_environment)
CODE_KINDS = tuple(kind for kind, cls in KINDS.items() if cls.runs_code)
DEFAULT_NAMES = {kind: cls.called for kind, cls in KINDS.items() if cls.called}
# Every setting a tool may have, by name, as its kind declares it: every kind's first, then each kind's own.
TOOL_SETTINGS = {spec.name: spec for cls in TOOL_CLASSES for spec in fields(cls)}


def _own_names(cls: type[ToolSpec]) -> list[str]:
    return [spec.name for spec in own_settings(cls, ToolSpec)]


def form_settings(kind: str) -> tuple[str, ...]:
    """The settings of a tool kind that the Tools section's form sets (all but ``file``: there, code is typed)."""
    return tuple(name for name in _own_names(KINDS[kind]) if name != "file") if kind in KINDS else ()


def public_refusal(kind: str, *, policy: Policy) -> str | None:
    """Why ``policy`` refuses a tool of this kind (its code would run on the server); None where it allows it."""
    return PUBLIC_REFUSAL if policy.public and kind in CODE_KINDS else None


def tool_kinds_table() -> str:
    """docs/reference.md's table of the tools that are not environments (make reference)."""
    return kinds_table([cls for cls in TOOL_CLASSES if not cls.is_environment], ToolSpec, "what the model calls")


def environment_kinds_table() -> str:
    """docs/reference.md's table of environments (make reference)."""
    return kinds_table([cls for cls in TOOL_CLASSES if cls.is_environment], ToolSpec,
                       "what the model calls; what it scores")


def tool_settings_table() -> str:
    """docs/reference.md's table of the tools' settings (make reference)."""
    return kind_settings_table(TOOL_CLASSES, ToolSpec)


def parse_tools(items: object, where: str = "tools", *, policy: Policy) -> list[ToolSpec]:
    """Validate a run's tool list (empty: the run calls no tools): each entry valid and allowed by ``policy``, at
    most MOST_TOOLS, names unique (the model calls each by its name; the data's rows pick an environment by it)."""
    items = _listed(items, where, MOST_TOOLS, "tools", f"with a kind ({', '.join(TOOL_KINDS)})", "a run may have")
    specs = [ToolSpec.from_dict(item, f"{where}[{index}]", policy=policy) for index, item in enumerate(items)]
    check_unique_names(where, [spec.name for spec in specs], "tools")
    return specs
