"""The tool settings: one typed spec per tool the model may call, validated field by field with sentences that name
the field, and the worked examples a run shows the model before each prompt."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from ..errors import ConfigError, check_length, check_unique_names
from ..public import LIFT, Policy

TOOL_KINDS = ("calculator", "convert", "lookup", "search", "custom", "guess_number", "arithmetic", "environment")
# Kinds that are environments (tools.environments): one instance per conversation, whose methods are the tools.
ENVIRONMENT_KINDS = ("guess_number", "arithmetic", "environment")
CODE_KINDS = ("custom", "environment")  # kinds whose Python code runs on the server
# The name the model calls each built-in kind by (an environment: the name the data's rows pick it by).
DEFAULT_NAMES = {"calculator": "calculator", "convert": "convert_units", "lookup": "lookup", "search": "search",
                 "guess_number": "guess_number", "arithmetic": "arithmetic"}
# Settings every tool has, then those of one kind (anything else is refused).
_COMMON_FIELDS = ("kind", "name", "examples")
_KIND_FIELDS: dict[str, tuple[str, ...]] = {
    "calculator": (),
    "convert": (),
    "lookup": ("key_column", "value_column", "description"),
    "search": ("column", "description"),
    "custom": ("code", "file", "function"),
    "guess_number": (),
    "arithmetic": (),
    "environment": ("code", "file", "class_name"),
}
_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,39}")
_SECTION_RE = re.compile(r"^\s*(Args|Arguments|Returns|Raises|Yields)\s*:", re.MULTILINE)  # a docstring's own
MOST_TOOLS, MOST_EXAMPLES = 8, 4
_LONGEST = {"code": 100_000, "file": 1000, "description": 500}
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


@dataclass
class ToolSpec:
    """One tool as the run config stores it; build it with :meth:`from_dict`, which validates everything."""

    kind: str
    name: str = ""
    examples: list[ToolExample] = field(default_factory=list)
    key_column: str | None = None
    value_column: str | None = None
    column: str | None = None
    description: str | None = None
    code: str | None = None
    file: str | None = None
    function: str = "tool"
    class_name: str = "Environment"

    @classmethod
    def from_dict(cls, data: object, where: str = "tools[0]", *, policy: Policy) -> ToolSpec:
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
        allowed = _COMMON_FIELDS + _KIND_FIELDS[kind]
        every = {f.name for f in fields(cls)}
        for key, value in data.items():
            if key not in every:
                raise ConfigError(f"{where} has an unknown setting {str(key)[:40]!r}; known settings for a {kind} "
                                  f"tool are: {', '.join(allowed)}.")
            if key not in allowed and value not in (None, ""):
                owners = [k for k, names in _KIND_FIELDS.items() if key in names]
                raise ConfigError(f"{where}.{key} does not apply to a {kind} tool; it is a setting of "
                                  f"{' and '.join(owners)} tools.")
        spec = cls(kind=kind)
        for key in ("name", *_KIND_FIELDS[kind]):
            value = data.get(key)
            if value in (None, ""):
                continue
            if not isinstance(value, str):
                raise ConfigError(f"{where}.{key} must be text, not {type(value).__name__}.")
            check_length(f"{where}.{key}", value, _LONGEST.get(key, _LONGEST_TEXT))
            setattr(spec, key, value.strip() if key == "description" else value)
        if spec.description is not None and (not spec.description or _SECTION_RE.search(spec.description)):
            raise ConfigError(f"{where}.description must say in words what the tool does (the model reads it), "
                              "without sections like Args: or Returns:.")
        spec.examples = _examples(data.get("examples"), f"{where}.examples")
        if spec.examples and kind in ENVIRONMENT_KINDS:
            raise ConfigError(f"{where}.examples: an environment shows no worked examples (its tools answer only "
                              "within a conversation it was reset for); describe the game in the prompt instead.")
        spec.name = spec.name or DEFAULT_NAMES.get(kind) or (spec.class_name if kind == "environment" else
                                                            spec.function)
        if not _NAME_RE.fullmatch(spec.name):
            raise ConfigError(f"{where}.name {spec.name[:40]!r} must be a Python name of at most 40 letters, digits "
                              "and underscores, not starting with a digit: the model calls the tool by it.")
        _check_kind(spec, where)
        return spec

    @property
    def is_environment(self) -> bool:
        return self.kind in ENVIRONMENT_KINDS

    def to_dict(self) -> dict[str, Any]:
        """kind and name, plus every setting that differs from its default; round-trips via from_dict."""
        out: dict[str, Any] = {"kind": self.kind, "name": self.name}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "examples":
                if value:
                    out["examples"] = [{"question": e.question, "arguments": dict(e.arguments)} for e in value]
            elif f.name not in out and value != f.default:
                out[f.name] = value
        return out


def form_settings(kind: str) -> tuple[str, ...]:
    """The settings of a tool kind that the Tools section's form sets (all but ``file``: there, code is typed)."""
    return tuple(setting for setting in _KIND_FIELDS.get(kind, ()) if setting != "file")


def public_refusal(kind: str, *, policy: Policy) -> str | None:
    """Why ``policy`` refuses a tool of this kind (its code would run on the server); None where it allows it."""
    return PUBLIC_REFUSAL if policy.public and kind in CODE_KINDS else None


def _check_kind(spec: ToolSpec, where: str) -> None:
    if spec.kind == "lookup" and not (spec.key_column and spec.value_column):
        raise ConfigError(f"{where} needs key_column (the column the model looks up by) and value_column (the column "
                          "it gets back).")
    if spec.kind == "search" and not spec.column:
        raise ConfigError(f"{where}.column is missing: name the column holding the documents to search.")
    if spec.kind in CODE_KINDS and (spec.code is None) == (spec.file is None):
        raise ConfigError(f"{where} needs exactly one of code (the Python source) or file (a .py file).")
    for kind, setting in (("custom", "function"), ("environment", "class_name")):
        if spec.kind == kind and not _NAME_RE.fullmatch(getattr(spec, setting)):
            raise ConfigError(f"{where}.{setting} {getattr(spec, setting)[:40]!r} must be a Python name.")


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


def parse_tools(items: object, where: str = "tools", *, policy: Policy) -> list[ToolSpec]:
    """Validate a run's tool list (empty: the run calls no tools): each entry valid and allowed by ``policy``, at
    most MOST_TOOLS, names unique (the model calls each by its name; the data's rows pick an environment by it)."""
    items = _listed(items, where, MOST_TOOLS, "tools", f"with a kind ({', '.join(TOOL_KINDS)})", "a run may have")
    specs = [ToolSpec.from_dict(item, f"{where}[{index}]", policy=policy) for index, item in enumerate(items)]
    check_unique_names(where, [spec.name for spec in specs], "tools")
    return specs
