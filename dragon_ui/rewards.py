"""Reward functions: validate reward settings, build callables, and score completions without ever crashing training.

A reward scores one completion. The built-in kinds return a value in [0, 1]; ``custom`` may return any finite
float. Every failure (an exception, a timeout, a value that is not a finite number) scores 0 for that completion and
is counted in :class:`RewardFailures`, so one bad row cannot stop a training run but a broken reward is still visible.

This module is pure Python on purpose (no torch, trl or gradio): the CLI, the UI playground, evaluation and the
TRL wrappers all score through :func:`score_completion` / :func:`safe_score`, and they must agree exactly.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import json
import math
import numbers
import os
import re
import shlex
import signal
import subprocess
import tempfile
import threading
import types
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields

import regex

from dragon_ui.errors import ConfigError, DragonError, check_length
from dragon_ui.public import LIFT, is_public_demo

REWARD_KINDS: tuple[str, ...] = (
    "exact", "contains", "numeric", "regex", "json", "length", "keyword", "format", "command", "custom",
)
EXTRACT_MODES: tuple[str, ...] = ("whole", "last_number", "after_hashes", "boxed", "answer_tag")
FORMAT_PRESETS: dict[str, tuple[str, ...]] = {"think_answer": ("think", "answer")}

# Settings every reward has, then the ones that only make sense for one kind (anything else is rejected).
_COMMON_FIELDS = ("kind", "name", "weight")
_KIND_FIELDS: dict[str, tuple[str, ...]] = {
    "exact": ("extract", "case_sensitive"),
    "contains": ("extract", "case_sensitive"),
    "numeric": ("extract", "tolerance"),
    "regex": ("pattern", "case_sensitive"),
    "json": ("keys",),
    "length": ("min_chars", "max_chars"),
    "keyword": ("words", "mode"),
    "format": ("preset", "tags"),
    "command": ("argv", "input", "score_from", "min_score", "max_score", "timeout"),
    "custom": ("code", "file", "function"),
}
_NAME_RE = re.compile(r"[A-Za-z0-9_]+")
_TAG_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]*")
# Environment strings are capped by the kernel (128 KiB each); 32,000 characters stay below that even in UTF-8.
_ENV_TEXT_LIMIT = 32_000

_PUBLIC_REFUSALS = {
    "custom": f"custom Python rewards are turned off in this public demo because they run arbitrary code on the "
              f"server; {LIFT} to use them.",
    "command": f"command rewards are turned off in this public demo because they run arbitrary programs on the "
               f"server; {LIFT} to use them.",
}


class RewardError(DragonError):
    """An expected reward failure (timeout, missing reference, ...) whose message is already readable as is."""


def kind_fields(kind: str) -> tuple[str, ...]:
    """The settings a reward of this kind takes besides kind, name and weight (what an editor form should show)."""
    return _KIND_FIELDS[kind]


def public_demo_refusal(kind: str) -> str | None:
    """Why a public demo refuses rewards of this kind (they run code on the server), or None when it allows them."""
    return _PUBLIC_REFUSALS.get(kind)


# --------------------------------------------------------------------------------------------------------------------
# Numbers and answer extraction
# --------------------------------------------------------------------------------------------------------------------

# A number: optional sign, digits with optional thousands separators ("1,234"), optional decimals; ".5" too.
# The sign only counts when it is not glued to a word or number, so "3-5" reads as 3 and 5 (not 3 and -5), and a
# number never starts in the middle of another one. Scientific notation is not recognised ("1e-5" reads as 1, 5).
_NUMBER_RE = re.compile(
    r"(?:(?<![\w.])[-+\u2212])?(?<![\d.])(?:(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.\d+)?|\.\d+)"
)


def _last_number_text(text: str) -> str | None:
    """The last number in ``text`` in plain form (no thousands separators, ASCII minus, no plus), or None."""
    last = deque(_NUMBER_RE.finditer(text), maxlen=1)
    if not last:
        return None
    return last[0].group().replace(",", "").replace("\u2212", "-").lstrip("+")


def _last_number(text: str) -> float | None:
    number = _last_number_text(text)
    return None if number is None else float(number)


def _boxed(text: str) -> str:
    """Content of the last ``\\boxed{...}``, braces balanced; "" when there is none or it is cut off."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return ""
    start += len("\\boxed{")
    depth = 1
    for index in range(start, len(text)):
        char = text[index]
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                return text[start:index]
    return ""


def _answer_tag(text: str) -> str:
    """Content of the last ``<answer>...</answer>`` (case-sensitive tags, like the format reward)."""
    end = text.rfind("</answer>")
    start = text.rfind("<answer>", 0, end) if end >= 0 else -1
    return text[start + len("<answer>"):end] if start >= 0 else ""


def extract_answer(text: str, mode: str = "whole") -> str:
    """Apply an extraction mode (see ``EXTRACT_MODES``); "" when the mode finds nothing.

    ``last_number`` returns the number in plain form ("1,234" -> "1234") so that ``exact`` can compare it.
    """
    if mode == "whole":
        return text
    if mode == "last_number":
        return _last_number_text(text) or ""
    if mode == "after_hashes":
        index = text.rfind("####")
        return text[index + 4:].strip() if index >= 0 else ""
    if mode == "boxed":
        return _boxed(text)
    if mode == "answer_tag":
        return _answer_tag(text)
    raise ValueError(f"unknown extract mode {mode!r}")


def _normalise(text: str, case_sensitive: bool) -> str:
    """Strip, collapse whitespace, lowercase (casefold) unless case-sensitive, drop trailing ``.,;:!?``."""
    text = " ".join(text.split())
    if not case_sensitive:
        text = text.casefold()
    return text.rstrip(" .,;:!?")


# --------------------------------------------------------------------------------------------------------------------
# The spec: one flat, typed, validated reward setting
# --------------------------------------------------------------------------------------------------------------------


@dataclass
class RewardSpec:
    """One reward as it is stored in the run config; build it with :meth:`from_dict`, which validates everything."""

    kind: str
    name: str = ""
    weight: float = 1.0
    extract: str = "whole"
    case_sensitive: bool = False
    tolerance: float = 1e-6
    pattern: str | None = None
    keys: list[str] | None = None
    min_chars: int | None = None
    max_chars: int | None = None
    words: list[str] | None = None
    mode: str = "any"
    preset: str | None = None
    tags: list[str] | None = None
    argv: list[str] | None = None
    input: str = "stdin"
    score_from: str = "exit_code"
    min_score: float = 0.0
    max_score: float = 1.0
    timeout: float = 30.0
    code: str | None = None
    file: str | None = None
    function: str = "reward"

    @classmethod
    def from_dict(cls, data: dict, where: str = "rewards[0]") -> RewardSpec:
        """Validate and coerce one reward's settings; every problem is a ConfigError that names the field.

        A setting whose value is None or "" counts as not given (YAML ``pattern:`` with nothing after it, an empty UI
        text box), so it falls back to its default and is not reported as not applying to the kind.
        """
        if not isinstance(data, Mapping):
            raise ConfigError(f"{where} must be a mapping of settings like {{'kind': 'numeric'}}, "
                              f"not {type(data).__name__}.")
        kind = data.get("kind")
        if kind is None:
            raise ConfigError(f"{where} has no kind; choose one of: {', '.join(REWARD_KINDS)}.")
        if kind not in REWARD_KINDS:
            raise ConfigError(f"{where}.kind {kind!r} is not a known reward kind; "
                              f"choose one of: {', '.join(REWARD_KINDS)}.")
        if is_public_demo() and kind in _PUBLIC_REFUSALS:
            raise ConfigError(f"{where}.kind: {_PUBLIC_REFUSALS[kind]}")
        allowed = _COMMON_FIELDS + _KIND_FIELDS[kind]
        every = {f.name for f in fields(cls)}
        for key, value in data.items():
            if key not in every:
                raise ConfigError(f"{where} has an unknown setting {key!r}; known settings for {_a(kind)} reward "
                                  f"are: {', '.join(allowed)}.")
            if key not in allowed and _given(value):
                owners = [k for k, names in _KIND_FIELDS.items() if key in names]
                raise ConfigError(f"{where}.{key} does not apply to {_a(kind)} reward; it is a setting of "
                                  f"{' and '.join(owners)} rewards.")
        spec = cls(kind=kind)
        for key in allowed[1:]:
            if _given(data.get(key)):
                _check_size(data[key], f"{where}.{key}", _LONGEST.get(key, _LONGEST_ITEM))
                setattr(spec, key, _PARSERS[key](data[key], f"{where}.{key}"))
        spec.name = spec.name or kind
        _check_kind(spec, where)
        return spec

    def to_dict(self) -> dict:
        """kind, name and weight, plus every setting that differs from its default; round-trips via from_dict."""
        out = {"kind": self.kind, "name": self.name or self.kind, "weight": self.weight}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name not in out and value != f.default:
                out[f.name] = list(value) if isinstance(value, list) else value
        return out


def reward_rule(spec: RewardSpec) -> str:
    """What one reward pays for, in a sentence fragment (the Rewards tab's table, the model card)."""
    answer = "the reply" if spec.extract == "whole" else f"the answer ({spec.extract.replace('_', ' ')})"
    compared = ("ignoring extra spaces and trailing . , ; : ! ?" if spec.case_sensitive else
                "ignoring case, extra spaces and trailing . , ; : ! ?")
    rules = {
        "exact": f"{answer} equals the reference, {compared}",
        "contains": f"{answer} contains the reference, {compared}",
        "numeric": f"the number in {answer} equals the reference",
        "regex": f"the reply matches `{spec.pattern}`",
        "json": "the reply is JSON" + (f" with the keys {', '.join(spec.keys)}" if spec.keys else ""),
        "length": f"the reply has {spec.min_chars or 0} to {spec.max_chars or 'any number of'} characters",
        "keyword": f"the reply contains {spec.mode} of: {', '.join(spec.words or [])}",
        "format": f"the reply is laid out in the tags {', '.join(spec.tags or FORMAT_PRESETS.get(spec.preset, ()))}",
        "command": f"the command `{' '.join(spec.argv or [])}` passes on the reply",
        "custom": f"the Python function `{spec.function}` scores it",
    }
    return rules[spec.kind]


# The longest a text setting may be (any client can send megabytes); list settings: each item, and how many.
_LONGEST = {"code": 100_000, "file": 1000, "pattern": 1000, "argv": 4000}
_LONGEST_ITEM, _MOST_ITEMS, MOST_REWARDS = 200, 100, 20


def _check_size(value, label: str, longest: int) -> None:
    """Refuse a text longer than ``longest``, or a list of more than _MOST_ITEMS items or with a longer item."""
    items = value if isinstance(value, (list, tuple)) else [value]
    if len(items) > _MOST_ITEMS:
        raise ConfigError(f"{label} has {len(items)} items, more than the {_MOST_ITEMS} it may have.")
    for item in items:
        check_length(label, item, longest)


def _a(kind: str) -> str:
    """"an exact reward", "a numeric reward"."""
    return f"an {kind}" if kind[0] in "aeiou" else f"a {kind}"


def _given(value) -> bool:
    return value is not None and value != ""


def _as_float(value, label: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (numbers.Real, str)):
        raise ConfigError(f"{label} must be a number, not {value!r}.")
    try:
        number = float(value)
    except ValueError:
        raise ConfigError(f"{label} must be a number, not {value!r}.") from None
    if not math.isfinite(number):
        raise ConfigError(f"{label} must be a finite number, not {value!r}.")
    return number


def _non_negative(value, label: str) -> float:
    number = _as_float(value, label)
    if number < 0:
        raise ConfigError(f"{label} must be zero or more, not {value!r}.")
    return number


def _positive(value, label: str) -> float:
    number = _as_float(value, label)
    if number <= 0:
        raise ConfigError(f"{label} must be more than zero, not {value!r}.")
    return number


def _char_count(value, label: str) -> int:
    """A non-negative whole number; integral floats are accepted because UI number boxes return floats."""
    number = _as_float(value, label)
    if number != int(number) or number < 0:
        raise ConfigError(f"{label} must be a whole number of characters, zero or more, not {value!r}.")
    return int(number)


def _as_bool(value, label: str) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"{label} must be true or false, not {value!r}.")
    return value


def _as_text(value, label: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"{label} must be a non-empty text, not {value!r}.")
    return value


def _as_name(value, label: str) -> str:
    if not isinstance(value, str) or not _NAME_RE.fullmatch(value):
        raise ConfigError(f"{label} {value!r} may only use letters, digits and underscores, because it becomes the "
                          f"column name reward_<name>.")
    return value


def _as_text_list(value, label: str) -> list[str]:
    """A list of non-empty texts; a single text is taken as a one-item list."""
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, (list, tuple)) or not items:
        raise ConfigError(f"{label} must be a non-empty list of texts, not {value!r}.")
    for item in items:
        if not isinstance(item, str) or not item.strip():
            raise ConfigError(f"{label} must contain only non-empty texts, not {item!r}.")
    return list(items)


def _as_keys(value, label: str) -> list[str] | None:
    """JSON keys are optional, so an empty list means "just check that it parses"."""
    return _as_text_list(value, label) if value != [] else None


def _as_tags(value, label: str) -> list[str]:
    tags = _as_text_list(value, label)
    for tag in tags:
        if not _TAG_RE.fullmatch(tag):
            raise ConfigError(f"{label} entries are plain tag names like 'think' (no angle brackets), not {tag!r}.")
    if len(set(tags)) != len(tags):
        raise ConfigError(f"{label} names the same tag twice: {tags!r}.")
    return tags


def _as_argv(value, label: str) -> list[str]:
    """A list of arguments; a single text is split like a shell would (but no shell ever runs)."""
    if isinstance(value, str):
        try:
            value = shlex.split(value)
        except ValueError as error:
            raise ConfigError(f"{label} cannot be split into arguments: {error}.") from None
    if not isinstance(value, (list, tuple)) or not value or not all(isinstance(a, str) for a in value):
        raise ConfigError(f"{label} must be a non-empty list of texts (the program and its arguments), "
                          f"not {value!r}.")
    if not value[0].strip():
        raise ConfigError(f"{label}[0] (the program to run) is empty.")
    return list(value)


def _choice(*choices: str) -> Callable[[object, str], str]:
    def parse(value, label: str) -> str:
        if value not in choices:
            raise ConfigError(f"{label} {value!r} is not one of: {', '.join(choices)}.")
        return value
    return parse


def _as_function_name(value, label: str) -> str:
    if not isinstance(value, str) or not value.isidentifier():
        raise ConfigError(f"{label} must be a Python function name like 'reward', not {value!r}.")
    return value


_PARSERS: dict[str, Callable[[object, str], object]] = {
    "name": _as_name,
    "weight": _non_negative,
    "extract": _choice(*EXTRACT_MODES),
    "case_sensitive": _as_bool,
    "tolerance": _non_negative,
    "pattern": _as_text,
    "keys": _as_keys,
    "min_chars": _char_count,
    "max_chars": _char_count,
    "words": _as_text_list,
    "mode": _choice("any", "all"),
    "preset": _choice(*FORMAT_PRESETS),
    "tags": _as_tags,
    "argv": _as_argv,
    "input": _choice("stdin", "file"),
    "score_from": _choice("exit_code", "stdout"),
    "min_score": _as_float,
    "max_score": _as_float,
    "timeout": _positive,
    "code": _as_text,
    "file": _as_text,
    "function": _as_function_name,
}


def _check_kind(spec: RewardSpec, where: str) -> None:
    """Checks that involve several settings of one kind (required settings, bounds, compiling code)."""
    kind = spec.kind
    if kind == "regex":
        if spec.pattern is None:
            raise ConfigError(f"{where}.pattern is missing; a regex reward needs a regular expression to look for.")
        _compile_pattern(spec, where)
    elif kind == "length":
        if spec.min_chars is None and spec.max_chars is None:
            raise ConfigError(f"{where}.min_chars and {where}.max_chars are both missing; "
                              f"a length reward needs at least one bound.")
        if spec.min_chars is not None and spec.max_chars is not None and spec.min_chars > spec.max_chars:
            raise ConfigError(f"{where}.min_chars ({spec.min_chars}) is larger than "
                              f"{where}.max_chars ({spec.max_chars}).")
    elif kind == "keyword" and spec.words is None:
        raise ConfigError(f"{where}.words is missing; a keyword reward needs a list of words to look for.")
    elif kind == "format":
        if spec.preset is not None and spec.tags is not None:
            raise ConfigError(f"{where}.preset and {where}.tags are both set; use one of them.")
        if spec.tags is None:
            spec.preset = spec.preset or "think_answer"
    elif kind == "command":
        if spec.argv is None:
            raise ConfigError(f"{where}.argv is missing; a command reward needs the program to run.")
        if spec.max_score <= spec.min_score:
            raise ConfigError(f"{where}.max_score ({spec.max_score:g}) must be larger than "
                              f"{where}.min_score ({spec.min_score:g}).")
    elif kind == "custom":
        if (spec.code is None) == (spec.file is None):
            raise ConfigError(f"{where}.code and {where}.file: give exactly one of them (the Python source, "
                              f"or the path of a .py file).")
        if spec.code is not None:
            _load_custom_function(spec, None, where)


def parse_rewards(items: list, where: str = "rewards") -> list[RewardSpec]:
    """Validate a whole reward list: not empty, each entry valid, names unique (they become column names)."""
    if not isinstance(items, (list, tuple)) or not items:
        raise ConfigError(f"{where} must be a non-empty list of rewards; add at least one reward.")
    if len(items) > MOST_REWARDS:
        raise ConfigError(f"{where} has {len(items)} rewards, more than the {MOST_REWARDS} a run may have.")
    specs = [RewardSpec.from_dict(item, f"{where}[{index}]") for index, item in enumerate(items)]
    seen: dict[str, int] = {}
    for index, spec in enumerate(specs):
        if spec.name in seen:
            raise ConfigError(f"{where}[{index}].name: two rewards are named {spec.name!r} ({where}[{seen[spec.name]}] "
                              f"and {where}[{index}]); give one of them a different name.")
        seen[spec.name] = index
    return specs


# --------------------------------------------------------------------------------------------------------------------
# Built rewards
# --------------------------------------------------------------------------------------------------------------------

Scorer = Callable[[str, str, "str | None", dict], object]


class Reward:
    """A built reward: call it with (prompt, completion, reference, row) to get a finite float; it may raise."""

    def __init__(self, spec: RewardSpec, scorer: Scorer):
        self.spec = spec
        self.name = spec.name or spec.kind
        self.weight = spec.weight
        self._scorer = scorer

    def __call__(self, prompt: str, completion: str, reference: str | None, row: dict) -> float:
        return _as_score(self._scorer(prompt, completion, reference, row))

    def __repr__(self) -> str:
        return f"Reward({self.name!r}, kind={self.spec.kind!r}, weight={self.weight:g})"


def _as_score(value) -> float:
    """Accept any real number (bools as 0/1); anything else, nan or inf is a failure, not a silent 0."""
    if isinstance(value, numbers.Real):
        number = float(value)
        if math.isfinite(number):
            return number
        raise RewardError(f"returned {number}, not a finite number")
    shown = repr(value)
    shown = shown if len(shown) <= 40 else shown[:37] + "..."
    raise RewardError(f"returned {shown} ({type(value).__name__}), not a number")


def _require_reference(reference: str | None) -> str:
    if reference is None:
        raise RewardError("this row has no reference answer to compare against")
    return reference


def _normalised_reference(reference: str | None, case_sensitive: bool) -> str:
    """An empty reference would match every reply (and be contained in every reply), so it is a failure."""
    expected = _normalise(_require_reference(reference), case_sensitive)
    if not expected:
        raise RewardError("the reference answer is empty")
    return expected


def _exact(spec: RewardSpec) -> Scorer:
    def score(prompt, completion, reference, row):
        expected = _normalised_reference(reference, spec.case_sensitive)
        return float(_normalise(extract_answer(completion, spec.extract), spec.case_sensitive) == expected)
    return score


def _contains(spec: RewardSpec) -> Scorer:
    def score(prompt, completion, reference, row):
        expected = _normalised_reference(reference, spec.case_sensitive)
        return float(expected in _normalise(extract_answer(completion, spec.extract), spec.case_sensitive))
    return score


def _numeric(spec: RewardSpec) -> Scorer:
    def score(prompt, completion, reference, row):
        expected = _last_number(_require_reference(reference))
        if expected is None:
            raise RewardError("the reference answer contains no number")
        got = _last_number(extract_answer(completion, spec.extract))
        if got is None:
            return 0.0
        return float(got == expected or abs(got - expected) <= max(1e-6, spec.tolerance * abs(expected)))
    return score


def _compile_pattern(spec: RewardSpec, where: str) -> regex.Pattern:
    """The pattern, compiled by the ``regex`` package (Python's syntax; it releases the GIL while it matches and
    takes a timeout), refused with a sentence when it is not valid or takes too long on some texts."""
    flags = 0 if spec.case_sensitive else regex.IGNORECASE
    try:
        pattern = regex.compile(spec.pattern, flags)
    except regex.error as error:
        raise ConfigError(f"{where}.pattern is not a valid regular expression: {error}.") from None
    slow_on = _slow_text(spec.pattern, flags)
    if slow_on is not None:
        shown = slow_on if len(slow_on) <= 24 else f"{slow_on[:12]}…{slow_on[-6:]}"
        raise ConfigError(f"{where}.pattern takes too long on some replies (over {PROBE_TIMEOUT_S:g} s on "
                          f"{shown!r}): repetition that can match the same text in many ways, such as (a|aa)+ or "
                          "(a+)+, takes exponential time; rewrite it so each character can be matched one way only.")
    return pattern


# Texts that make backtracking patterns slow: a character (or pair) repeated, then one that does not fit.
_PROBE_PIECES = ("a", "0", " ", "ab", "a ", "a1", "\n", ".", ",", "<>", "-")
PROBE_REPEATS, PROBE_TIMEOUT_S = 40, 0.05
REGEX_TIMEOUT_S = 0.25  # one reply: a pattern that takes longer scores it 0, counted as a failure


@functools.lru_cache(maxsize=256)
def _slow_text(pattern_text: str, flags: int) -> str | None:
    """A short text on which the pattern takes more than PROBE_TIMEOUT_S (checked when a reward is saved, so a
    pattern that backtracks exponentially is refused before a run meets it), or None."""
    pattern = regex.compile(pattern_text, flags)
    pieces = dict.fromkeys([*_PROBE_PIECES, *(char for char in pattern_text if char.isalnum())][:24])
    for piece in pieces:
        for end in ("!", "\x00", ""):
            text = piece * PROBE_REPEATS + end
            try:
                pattern.search(text, timeout=PROBE_TIMEOUT_S)
            except TimeoutError:
                return text
    return None


def _regex(spec: RewardSpec, where: str) -> Scorer:
    pattern = _compile_pattern(spec, where)

    def score(prompt, completion, reference, row):
        try:
            return float(pattern.search(completion, timeout=REGEX_TIMEOUT_S) is not None)
        except TimeoutError:
            raise RewardError(f"the regular expression took longer than {REGEX_TIMEOUT_S:g} s on this reply") from None
    return score


_FENCE_LANGUAGE = re.compile(r"[\w+-]*[ \t]*\n?")  # what may follow an opening fence: ```json, then a newline


def _fenced_content(text: str) -> str | None:
    """The content of a text that is one fenced block (```json ... ``` or plain ```), fence lines removed; None
    for any other text. String operations and one anchored match: linear in the text, whatever it holds."""
    if len(text) < 6 or not (text.startswith("```") and text.endswith("```")):
        return None
    inner = text[3:-3]
    inner = inner[_FENCE_LANGUAGE.match(inner).end():]
    body = inner.rstrip(" \t")
    return body[:-1] if body.endswith("\n") else body


def _json(spec: RewardSpec) -> Scorer:
    """1 if the completion (stripped, one optional code fence around it) parses; with keys, the fraction present.

    Text around a fenced block is not ignored: "Here it is: ```{...}```" does not parse and scores 0.
    """
    def score(prompt, completion, reference, row):
        text = completion.strip()
        fenced = _fenced_content(text)
        try:
            value = json.loads(fenced if fenced is not None else text)
        except (ValueError, RecursionError):
            return 0.0
        if not spec.keys:
            return 1.0
        if not isinstance(value, dict):
            return 0.0
        return sum(key in value for key in spec.keys) / len(spec.keys)
    return score


def _length(spec: RewardSpec) -> Scorer:
    """1 inside [min_chars, max_chars]; n/min below; falls linearly from 1 at max to 0 at twice max above."""
    low, high = spec.min_chars, spec.max_chars

    def score(prompt, completion, reference, row):
        n = len(completion.strip())
        if low is not None and n < low:
            return n / low
        if high is not None and n > high:
            return max(0.0, 1.0 - (n - high) / high) if high else 0.0
        return 1.0
    return score


def _keyword(spec: RewardSpec) -> Scorer:
    """Case-insensitive substring search; "any" is 1/0, "all" is the fraction of words found."""
    words = [word.casefold() for word in spec.words]

    def score(prompt, completion, reference, row):
        text = completion.casefold()
        found = sum(word in text for word in words)
        return float(found > 0) if spec.mode == "any" else found / len(words)
    return score


def _format(spec: RewardSpec) -> Scorer:
    """Reward the tag layout, e.g. ``<think>…</think><answer>…</answer>`` for the preset ``think_answer``.

    With n tags the rule is:

    * 1.0 only for the whole shape: the completion is exactly the tags in the given order, each once, each as
      ``<tag>content</tag>``, with nothing but whitespace before, between and after them. Contents may be anything
      (also empty) except another opening or closing tag of the listed names.
    * otherwise k / (n + 1), where k is the number of tags that appear somewhere as a well-formed pair (``<tag>``
      followed later by ``</tag>``). So the best partial score, n / (n + 1), is always below the full shape's 1.0.

    Tags are matched case-sensitively and without attributes.
    """
    tags = spec.tags or list(FORMAT_PRESETS[spec.preset])
    any_tag = "|".join(re.escape(tag) for tag in tags)
    content = rf"(?:(?!</?(?:{any_tag})>).)*"
    shape = re.compile(
        r"\s*" + r"\s*".join(rf"<{re.escape(tag)}>{content}</{re.escape(tag)}>" for tag in tags) + r"\s*",
        re.DOTALL,
    )

    def has_pair(text: str, tag: str) -> bool:
        start = text.find(f"<{tag}>")
        return start >= 0 and text.find(f"</{tag}>", start + len(tag) + 2) >= 0

    def score(prompt, completion, reference, row):
        if shape.fullmatch(completion):
            return 1.0
        return sum(has_pair(completion, tag) for tag in tags) / (len(tags) + 1)
    return score


def _env_text(text: str | None) -> str:
    """Environment values cannot hold NUL bytes and are size-capped by the kernel; keep them safe to pass."""
    return (text or "").replace("\0", "")[:_ENV_TEXT_LIMIT]


def _command(spec: RewardSpec, base_dir: str | None) -> Scorer:
    """Run a program per completion (no shell); score from its exit code or the last number it prints.

    input "stdin" sends the completion on standard input. input "file" writes it to a temporary file whose path
    replaces ``{completion_file}`` in argv (appended as the last argument when argv has no placeholder);
    ``{reference_file}`` works the same way in both modes. The program runs in ``base_dir`` (the config's folder)
    in its own session, so at the timeout the whole process group, grandchildren included, is killed.
    DRAGON_PROMPT and DRAGON_REFERENCE hold the prompt and reference (cut to 32,000 characters).
    """
    def score(prompt, completion, reference, row):
        with tempfile.TemporaryDirectory(prefix="dragon_reward_") as tmp:
            argv = list(spec.argv)
            if spec.input == "file" and not any("{completion_file}" in arg for arg in argv):
                argv.append("{completion_file}")
            for placeholder, filename, text in (("{completion_file}", "completion.txt", completion),
                                                ("{reference_file}", "reference.txt", reference or "")):
                if any(placeholder in arg for arg in argv):
                    path = os.path.join(tmp, filename)
                    with open(path, "w", encoding="utf-8") as handle:
                        handle.write(text)
                    argv = [arg.replace(placeholder, path) for arg in argv]
            env = dict(os.environ, DRAGON_PROMPT=_env_text(prompt), DRAGON_REFERENCE=_env_text(reference))
            stdin = completion.encode("utf-8") if spec.input == "stdin" else None
            try:
                proc = subprocess.Popen(
                    argv, stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=base_dir, env=env, start_new_session=True,
                )
            except FileNotFoundError:
                raise RewardError(f"command not found: {argv[0]!r} (is it installed and on the PATH?)") from None
            except PermissionError:
                raise RewardError(f"command is not executable: {argv[0]!r}") from None
            with proc:
                try:
                    out, err = proc.communicate(stdin, timeout=spec.timeout)
                except subprocess.TimeoutExpired:
                    _kill_group(proc)
                    raise RewardError(f"timed out after {spec.timeout:g} s") from None
        if spec.score_from == "exit_code":
            return 1.0 if proc.returncode == 0 else 0.0
        if proc.returncode != 0:
            last_line = next((line for line in reversed(err.decode("utf-8", "replace").splitlines()) if line.strip()),
                             "")
            raise RewardError(f"exited with code {proc.returncode}: {last_line}".rstrip(": "))
        value = _last_number(out.decode("utf-8", "replace"))
        if value is None:
            raise RewardError("printed no number on standard output")
        return min(1.0, max(0.0, (value - spec.min_score) / (spec.max_score - spec.min_score)))
    return score


def _kill_group(proc: subprocess.Popen) -> None:
    """Kill the child and everything it started; it is not reaped yet, so its group id cannot have been reused."""
    if hasattr(os, "killpg"):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    else:  # Windows has no process groups in this sense
        proc.kill()


def _load_custom_function(spec: RewardSpec, base_dir: str | None, where: str) -> Callable:
    """Compile and run the custom source in a fresh module namespace and return its reward function."""
    if spec.code is not None:
        source, label, filename = spec.code, f"{where}.code", f"<{where}.code>"
    else:
        filename = spec.file if os.path.isabs(spec.file) or not base_dir else os.path.join(base_dir, spec.file)
        label = f"{where}.file ({filename})"
        try:
            with open(filename, encoding="utf-8") as handle:
                source = handle.read()
        except OSError as error:
            raise ConfigError(f"{label} cannot be read: {error.strerror or error}.") from None
    try:
        compiled = compile(source, filename, "exec")
    except SyntaxError as error:
        raise ConfigError(f"{label} has a syntax error on line {error.lineno}: {error.msg}.") from None
    module = types.ModuleType(f"dragon_reward_{spec.name or spec.kind}")
    module.__file__ = filename
    try:
        exec(compiled, module.__dict__)
    except Exception as error:
        raise ConfigError(f"{label} failed while loading: {_describe(error)}.") from None
    function = module.__dict__.get(spec.function)
    if function is None:
        raise ConfigError(f"{label} defines no function named {spec.function!r}; define "
                          f"def {spec.function}(prompt, completion, reference, row) returning a number.")
    if not callable(function):
        raise ConfigError(f"{label} defines {spec.function!r}, but it is a {type(function).__name__}, "
                          f"not a function.")
    try:
        inspect.signature(function).bind("", "", None, {})
    except TypeError:
        raise ConfigError(f"{label} defines {spec.function!r}, but it cannot be called as "
                          f"{spec.function}(prompt, completion, reference, row).") from None
    except ValueError:  # some builtins have no inspectable signature; they are called as is
        pass
    return function


_BUILTIN_SCORERS: dict[str, Callable[[RewardSpec], Scorer]] = {
    "exact": _exact, "contains": _contains, "numeric": _numeric, "json": _json,
    "length": _length, "keyword": _keyword, "format": _format,
}


def build_rewards(specs: list[RewardSpec], base_dir: str | None = None) -> list[Reward]:
    """Turn validated specs into callables; base_dir resolves relative custom files and is the commands' folder.

    The public-demo refusal is checked again here because this is where code actually gets loaded.
    """
    rewards = []
    for index, spec in enumerate(specs):
        where = f"rewards[{index}]"
        if is_public_demo() and spec.kind in _PUBLIC_REFUSALS:
            raise ConfigError(f"{where}.kind: {_PUBLIC_REFUSALS[spec.kind]}")
        if spec.kind == "custom":
            scorer = _load_custom_function(spec, base_dir, where)
        elif spec.kind == "command":
            scorer = _command(spec, base_dir)
        elif spec.kind == "regex":
            scorer = _regex(spec, where)
        elif spec.kind in _BUILTIN_SCORERS:
            scorer = _BUILTIN_SCORERS[spec.kind](spec)
        else:
            raise ConfigError(f"{where}.kind {spec.kind!r} is not a known reward kind; "
                              f"choose one of: {', '.join(REWARD_KINDS)}.")
        rewards.append(Reward(spec, scorer))
    return rewards


# --------------------------------------------------------------------------------------------------------------------
# Scoring safely
# --------------------------------------------------------------------------------------------------------------------


def _describe(error: BaseException | str) -> str:
    """One short line: our own messages as they are, anything else as "ZeroDivisionError: division by zero"."""
    if isinstance(error, str):
        text = error
    elif isinstance(error, DragonError):
        text = str(error)
    else:
        text = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
    line = next((line.strip() for line in text.splitlines() if line.strip()), "unknown error")
    return line if len(line) <= 200 else line[:197] + "..."


class RewardFailures:
    """Thread-safe failure counts per reward, plus the first message of each (what the user needs to fix it)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._counts: dict[str, int] = {}
        self._first: dict[str, str] = {}

    def record(self, name: str, error: BaseException | str) -> None:
        message = _describe(error)
        with self._lock:
            self._counts[name] = self._counts.get(name, 0) + 1
            self._first.setdefault(name, message)

    def counts(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)

    def first_errors(self) -> dict[str, str]:
        with self._lock:
            return dict(self._first)

    def total(self) -> int:
        with self._lock:
            return sum(self._counts.values())


@dataclass
class ScoreResult:
    """Scores of one completion: per reward (unweighted, 0 where it failed), the weighted total, and failures."""

    scores: dict[str, float]
    total: float
    errors: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"scores": dict(self.scores), "total": self.total, "errors": dict(self.errors)}


def safe_score(reward: Reward, prompt, completion, reference, row,
               failures: RewardFailures | None = None) -> tuple[float, str | None]:
    """Score with one reward and never raise: (score, None), or (0.0, message) with the failure recorded.

    SystemExit is caught too, so a custom reward calling exit() cannot end a training run.
    """
    try:
        return reward(prompt, completion, reference, row), None
    except (Exception, SystemExit) as error:
        message = _describe(error)
        if failures is not None:
            failures.record(reward.name, message)
        return 0.0, message


def score_completion(rewards: list[Reward], completion: str, reference: str | None = None, prompt: str = "",
                     row: dict | None = None, failures: RewardFailures | None = None) -> ScoreResult:
    """THE way to score one completion with all rewards (CLI, playground, evaluation and training share it)."""
    row = {} if row is None else row
    scores: dict[str, float] = {}
    errors: dict[str, str] = {}
    for reward in rewards:
        scores[reward.name], error = safe_score(reward, prompt, completion, reference, row, failures)
        if error is not None:
            errors[reward.name] = error
    total = sum(reward.weight * scores[reward.name] for reward in rewards)
    return ScoreResult(scores=scores, total=total, errors=errors)


# --------------------------------------------------------------------------------------------------------------------
# TRL adapter
# --------------------------------------------------------------------------------------------------------------------


def _message_text(content) -> str:
    """Message content as text: a plain string, or the text parts of a multimodal content list."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return ""


def last_user_text(prompt) -> str:
    """The last user message of a conversational prompt (what the reward calls "the prompt"), or a plain string."""
    if isinstance(prompt, str):
        return prompt
    for message in reversed(prompt or []):
        if message.get("role") == "user":
            return _message_text(message.get("content"))
    return ""


def completion_text(completion) -> str:
    """The last assistant message's text of a conversational completion, or a plain string."""
    if isinstance(completion, str):
        return completion
    for message in reversed(completion or []):
        if message.get("role", "assistant") == "assistant":
            return _message_text(message.get("content"))
    return ""


def trl_reward_functions(rewards: list[Reward], failures: RewardFailures,
                         on_batch: Callable[[str, int, int], None] | None = None) -> list[Callable]:
    """One TRL reward function per reward, named after it (TRL logs ``rewards/<name>/mean``).

    Scores are unweighted: the trainer passes the weights to TRL (``reward_weights``). Each function reads the
    dataset columns ``reference`` and ``row`` (a JSON string) from TRL's keyword arguments and ignores the rest;
    an empty reference becomes None, as in evaluation, so a reward sees the same inputs in training and evaluation.
    ``on_batch(name, n_scored, n_failed)`` runs after each call; its exceptions propagate so that the trainer can
    stop a run whose reward is completely broken.
    """
    return [_trl_function(reward, failures, on_batch) for reward in rewards]


def _trl_function(reward: Reward, failures: RewardFailures, on_batch) -> Callable:
    def reward_function(prompts, completions, **kwargs) -> list[float]:
        count = len(completions)
        references = kwargs.get("reference") or [None] * count
        rows = kwargs.get("row") or [None] * count
        parsed: dict[str, dict] = {}  # each row repeats once per generation; parse it once
        scores: list[float] = []
        failed = 0
        for prompt, completion, reference, row in zip(prompts, completions, references, rows, strict=True):
            if isinstance(row, str):
                if row not in parsed:
                    parsed[row] = json.loads(row)
                row = parsed[row]
            score, error = safe_score(reward, last_user_text(prompt), completion_text(completion), reference or None,
                                      row or {}, failures)
            scores.append(score)
            failed += error is not None
        if on_batch is not None:
            on_batch(reward.name, count, failed)
        return scores

    reward_function.__name__ = reward_function.__qualname__ = reward.name
    return reward_function
