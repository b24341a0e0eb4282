"""The reward settings: one flat, typed spec per reward, validated field by field with sentences that name the field."""

from __future__ import annotations

import math
import numbers
import re
import shlex
from collections.abc import Callable, Mapping
from typing import Any
from dataclasses import dataclass, fields


from ..errors import ConfigError, check_length, check_unique_names
from ..public import LIFT, Policy
from .code import compile_pattern, load_custom_function
from .text import EXTRACT_MODES

FORMAT_PRESETS: dict[str, tuple[str, ...]] = {"think_answer": ("think", "answer")}  # a format reward's tag sets

REWARD_KINDS: tuple[str, ...] = (
    "exact", "contains", "numeric", "math", "regex", "json", "length", "keyword", "format", "think_format", "overlong",
    "repetition", "cosine_length", "classifier", "command", "custom", "environment",
)
# TRL's own reward functions (trl.rewards), scored with our weight, failure counting and playground around them.
TRL_KINDS = ("think_format", "overlong", "repetition", "cosine_length")
# Kinds that count the reply's tokens with the starting model's tokenizer, as TRL's functions do.
TOKEN_KINDS = ("overlong", "repetition", "cosine_length")
# Kinds that only take away (scores from -1 to 0): a mean of 0 means "no penalty was needed", not a broken reward.
PENALTY_KINDS = ("overlong", "repetition")

# Kinds that say whether the answer is right: a run's goal is inferred among them (goal_names). The others shape the
# reply (its length, layout, words, repetition) or score what a model or program thinks of it.
GOAL_KINDS = ("exact", "contains", "numeric", "math", "json", "cosine_length", "command", "environment")
# Kinds that compare the reply with the row's reference answer: each fails on a reference it cannot read.
REFERENCE_KINDS = ("exact", "contains", "numeric", "math", "cosine_length")

# Settings every reward has, then the ones that only make sense for one kind (anything else is rejected).
_COMMON_FIELDS = ("kind", "name", "weight", "train", "goal", "only_when")
_KIND_FIELDS: dict[str, tuple[str, ...]] = {
    "exact": ("extract", "case_sensitive"),
    "contains": ("extract", "case_sensitive"),
    "numeric": ("extract", "tolerance"),
    "math": ("extract",),
    "regex": ("pattern", "case_sensitive"),
    "json": ("keys",),
    "length": ("min_chars", "max_chars"),
    "keyword": ("words", "mode"),
    "format": ("preset", "tags"),
    "think_format": (),
    "overlong": ("max_tokens", "buffer_tokens"),
    "repetition": ("ngram_size",),
    "cosine_length": ("max_tokens",),
    "classifier": ("model", "label", "output"),
    "command": ("argv", "input", "score_from", "min_score", "max_score", "timeout"),
    "custom": ("code", "file", "function"),
    "environment": (),
}
_NAME_RE = re.compile(r"[A-Za-z0-9_]+")
_TAG_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]*")

PUBLIC_REFUSALS = {
    "custom": f"custom Python rewards are turned off in this public demo because they run arbitrary code on the "
              f"server; {LIFT} to use them.",
    "command": f"command rewards are turned off in this public demo because they run arbitrary programs on the "
               f"server; {LIFT} to use them.",
}


@dataclass(frozen=True)
class Gate:
    """``only_when``: a reward pays only where the reward ``name`` passes, at ``threshold`` or above (None: half
    that reward's full marks, the pre-flight's pass)."""

    name: str
    threshold: float | None = None

    def opens(self, score: float, spec: RewardSpec) -> bool:
        return passes(score, spec) if self.threshold is None else score >= self.threshold - 1e-9

    def describe(self) -> str:
        return f"{self.name} passes" if self.threshold is None else f"{self.name} scores {self.threshold:g} or more"


_GATE_RE = re.compile(r"\s*([A-Za-z0-9_]+)\s*(?:>=\s*([-+0-9.eE]+)\s*)?")


def gate_of(spec: RewardSpec | Mapping[str, Any]) -> Gate | None:
    """The gate ``only_when`` sets (of a spec, or of a stored config's reward dict), or None for a reward that
    always pays."""
    text = spec.get("only_when") if isinstance(spec, Mapping) else spec.only_when
    found = _GATE_RE.fullmatch(text) if isinstance(text, str) else None
    return None if found is None else Gate(found[1], None if found[2] is None else float(found[2]))


def is_goal(spec: RewardSpec, specs: list[RewardSpec]) -> bool:
    return spec.name in goal_names(specs)


def goal_names(specs: list[RewardSpec] | list[Mapping[str, Any]]) -> list[str]:
    """The rewards (specs, or a stored config's reward dicts) that say the answer is right: those marked ``goal:
    true``; where none is, the heaviest (by training weight) of the GOAL_KINDS not marked ``goal: false``. [] when
    no reward says so (a run of format or length rewards alone): the whole total stands for the goal."""
    def read(spec: RewardSpec | Mapping[str, Any], key: str) -> Any:
        return spec.get(key) if isinstance(spec, Mapping) else getattr(spec, key)

    def name(spec: RewardSpec | Mapping[str, Any]) -> str:
        return str(read(spec, "name") or read(spec, "kind"))

    marked = [name(spec) for spec in specs if read(spec, "goal") is True]
    if marked:
        return marked
    candidates = [spec for spec in specs if read(spec, "goal") is None and read(spec, "kind") in GOAL_KINDS]
    if not candidates:
        return []
    heaviest = max(training_weight(spec) for spec in candidates)
    return [name(spec) for spec in candidates if training_weight(spec) == heaviest]


def passes(score: float, spec: RewardSpec) -> bool:
    """Whether a reward's score passes: half its full marks or more (a penalty: nothing taken away). The
    pre-flight's pass, a gate's, and a right answer by the goal."""
    return score >= full_marks(spec) / 2 - 1e-9


def right_by_goal(scores: Mapping[str, float], goal: list[RewardSpec]) -> bool:
    """Whether a reply's scores (by reward name) pass every reward of ``goal`` (those goal_names names): a right
    answer."""
    return all(passes(scores.get(spec.name, 0.0), spec) for spec in goal)


def full_marks(spec: RewardSpec) -> float:
    """What a reply that does all a reward asks scores: 0 for a penalty (PENALTY_KINDS), 1 for every other kind
    (a custom reward is taken to score up to 1, as the built-in ones do)."""
    return 0.0 if spec.kind in PENALTY_KINDS else 1.0


def training_weight(reward: RewardSpec | Mapping[str, Any]) -> float:
    """What a reward (a spec, or a stored config's dict) adds to the total that training maximizes: its weight, or
    0 for a metric (``train: false``), which is scored and shown everywhere but never trained on."""
    if isinstance(reward, Mapping):
        return 0.0 if reward.get("train", True) is False else float(reward.get("weight", 1.0))
    return reward.weight if reward.train else 0.0


def stored_metrics(config: Mapping[str, Any]) -> set[str]:
    """The names of the rewards of a stored run config (config.json) that are metrics (``train: false``)."""
    return {str(reward.get("name") or reward.get("kind")) for reward in config.get("rewards") or []
            if isinstance(reward, Mapping) and reward.get("train") is False}


def kind_fields(kind: str) -> tuple[str, ...]:
    """The settings a reward of this kind takes besides kind, name, weight and train (what an editor should show)."""
    return _KIND_FIELDS[kind]


def public_demo_refusal(kind: str) -> str | None:
    """Why a public demo refuses rewards of this kind (they run code on the server), or None when it allows them."""
    return PUBLIC_REFUSALS.get(kind)


def public_refusal(spec: RewardSpec, where: str, *, policy: Policy) -> str | None:
    """Why ``policy`` refuses this reward (its kind runs code on the server, or its classifier is not offered), as
    the sentence to show; None when it allows it (always, outside public mode)."""
    return _refusal(spec.kind, spec.model, where, policy=policy)


def _refusal(kind: str, model: str | None, where: str, *, policy: Policy) -> str | None:
    if not policy.public:
        return None
    if kind in PUBLIC_REFUSALS:
        return f"{where}.kind: {PUBLIC_REFUSALS[kind]}"
    refusal = policy.classifier_refusal(model if isinstance(model, str) else "") if kind == "classifier" else None
    return refusal and f"{where}.model {refusal}"


@dataclass
class RewardSpec:
    """One reward as it is stored in the run config; build it with :meth:`from_dict`, which validates everything."""

    kind: str
    name: str = ""
    weight: float = 1.0
    train: bool = True  # False: a metric, scored in held-out checks, Compare and the model card, never trained on
    goal: bool | None = None  # whether it says the answer is right; None: inferred from the kinds (goal_names)
    only_when: str | None = None  # "exact" or "exact >= 0.5": pays only where that reward passes (gate_of)
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
    max_tokens: int | None = None
    buffer_tokens: int | None = None
    ngram_size: int = 3
    model: str | None = None
    label: str | None = None
    output: str = "probability"
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
    def from_dict(cls, data: dict[str, Any], where: str = "rewards[0]", *, policy: Policy,
                  load_code: bool = True) -> RewardSpec:
        """Validate and coerce one reward's settings; every problem is a ConfigError that names the field. What
        ``policy`` refuses is refused first, before a custom reward's code is run to check it (``load_code``; off
        for settings that were checked when they were saved).

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
        refusal = _refusal(kind, data.get("model"), where, policy=policy)
        if refusal is not None:
            raise ConfigError(refusal)
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
        _check_kind(spec, where, load_code)
        return spec

    def to_dict(self) -> dict[str, Any]:
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
        "math": f"{answer if spec.extract != 'whole' else 'the final answer'} equals the reference mathematically "
                "(math-verify)",
        "regex": f"the reply matches `{spec.pattern}`",
        "json": "the reply is JSON" + (f" with the keys {', '.join(spec.keys)}" if spec.keys else ""),
        "length": f"the reply has {spec.min_chars or 0} to {spec.max_chars or 'any number of'} characters",
        "keyword": f"the reply contains {spec.mode} of: {', '.join(spec.words or [])}",
        "format": f"the reply is laid out in the tags {', '.join(spec.tags or FORMAT_PRESETS.get(spec.preset or '', ()))}",
        "think_format": "the reply starts with one <think>…</think> block (TRL's think_format_reward)",
        "overlong": f"nothing, and takes up to 1 away as the reply nears {_tokens(spec.max_tokens)} (TRL's soft "
                    "overlong punishment)",
        "repetition": f"nothing, and takes up to 1 away for repeated {spec.ngram_size}-token sequences (TRL's "
                      "repetition penalty)",
        "cosine_length": "a correct answer (math-verify), more when short; a wrong one loses less when long "
                         f"(TRL's cosine-scaled reward over {_tokens(spec.max_tokens)})",
        "classifier": f"{spec.model} says {spec.label}" + (" (its logit)" if spec.output == "logit" else
                                                           " (its probability)"),
        "command": f"the command `{' '.join(spec.argv or [])}` passes on the reply",
        "custom": f"the Python function `{spec.function}` scores it",
        "environment": "the environment it played says it earned (its get_reward)",
    }
    gate = gate_of(spec)
    return rules[spec.kind] + (f", paid only when {gate.describe()}" if gate else "")


def _tokens(count: int | None) -> str:
    return f"{count} tokens" if count else "the run's max new tokens"


# The longest a text setting may be (any client can send megabytes); list settings: each item, and how many.
_LONGEST = {"code": 100_000, "file": 1000, "pattern": 1000, "argv": 4000, "model": 1000}
_LONGEST_ITEM, MOST_ITEMS, MOST_REWARDS = 200, 100, 20
MOST_NGRAM, MOST_TOKENS = 32, 32768  # MOST_TOKENS: the largest grpo.max_new_tokens


def _check_size(value: object, label: str, longest: int) -> None:
    """Refuse a text longer than ``longest``, or a list of more than MOST_ITEMS items or with a longer item."""
    items = value if isinstance(value, (list, tuple)) else [value]
    if len(items) > MOST_ITEMS:
        raise ConfigError(f"{label} has {len(items)} items, more than the {MOST_ITEMS} it may have.")
    for item in items:
        check_length(label, item, longest)


def _a(kind: str) -> str:
    """"an exact reward", "a numeric reward"."""
    return f"an {kind}" if kind[0] in "aeiou" else f"a {kind}"


def _given(value: object) -> bool:
    return value is not None and value != ""


def _as_float(value: object, label: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (numbers.Real, str)):
        raise ConfigError(f"{label} must be a number, not {value!r}.")
    try:
        number = float(value)
    except (ValueError, OverflowError):  # OverflowError: an integer beyond any float (10**400)
        raise ConfigError(f"{label} must be a number, not {value!r}.") from None
    if not math.isfinite(number):
        raise ConfigError(f"{label} must be a finite number, not {value!r}.")
    return number


def _non_negative(value: object, label: str) -> float:
    number = _as_float(value, label)
    if number < 0:
        raise ConfigError(f"{label} must be zero or more, not {value!r}.")
    return number


def _positive(value: object, label: str) -> float:
    number = _as_float(value, label)
    if number <= 0:
        raise ConfigError(f"{label} must be more than zero, not {value!r}.")
    return number


def _char_count(value: object, label: str) -> int:
    """A non-negative whole number; integral floats are accepted because UI number boxes return floats."""
    number = _as_float(value, label)
    if number != int(number) or number < 0:
        raise ConfigError(f"{label} must be a whole number of characters, zero or more, not {value!r}.")
    return int(number)


def _token_count(value: object, label: str) -> int:
    """A whole number of tokens, at least 1 (integral floats accepted, as for characters), at most a reply's cap."""
    number = _as_float(value, label)
    if number != int(number) or not 1 <= number <= MOST_TOKENS:
        raise ConfigError(f"{label} must be a whole number of tokens from 1 to {MOST_TOKENS}, not {value!r}.")
    return int(number)


def _ngram_size(value: object, label: str) -> int:
    number = _token_count(value, label)
    if number > MOST_NGRAM:
        raise ConfigError(f"{label} must be at most {MOST_NGRAM} tokens; repeats of longer sequences are rare.")
    return number


def _as_label(value: object, label: str) -> str:
    """A label name, or its index (a whole number, also typed as text)."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return str(value)
    return _as_text(value, label).strip()


def _as_gate(value: object, label: str) -> str:
    """``only_when``: a reward's name, optionally ``>= threshold``; kept in one spelling ("exact >= 0.5")."""
    found = _GATE_RE.fullmatch(value) if isinstance(value, str) else None
    if found is None:
        raise ConfigError(f"{label} must name another reward, optionally with a threshold, like 'exact' or "
                          f"'exact >= 0.5', not {value!r}.")
    if found[2] is None:
        return found[1]
    return f"{found[1]} >= {_as_float(found[2], label):g}"


def _as_bool(value: object, label: str) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"{label} must be true or false, not {value!r}.")
    return value


def _as_text(value: object, label: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"{label} must be a non-empty text, not {value!r}.")
    return value


def _as_name(value: object, label: str) -> str:
    if not isinstance(value, str) or not _NAME_RE.fullmatch(value):
        raise ConfigError(f"{label} {value!r} may only use letters, digits and underscores, because it becomes the "
                          f"column name reward_<name>.")
    return value


def _as_text_list(value: object, label: str) -> list[str]:
    """A list of non-empty texts; a single text is taken as a one-item list."""
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, (list, tuple)) or not items:
        raise ConfigError(f"{label} must be a non-empty list of texts, not {value!r}.")
    for item in items:
        if not isinstance(item, str) or not item.strip():
            raise ConfigError(f"{label} must contain only non-empty texts, not {item!r}.")
    return list(items)


def _as_keys(value: object, label: str) -> list[str] | None:
    """JSON keys are optional, so an empty list means "just check that it parses"."""
    return _as_text_list(value, label) if value != [] else None


def _as_tags(value: object, label: str) -> list[str]:
    tags = _as_text_list(value, label)
    for tag in tags:
        if not _TAG_RE.fullmatch(tag):
            raise ConfigError(f"{label} entries are plain tag names like 'think' (no angle brackets), not {tag!r}.")
    if len(set(tags)) != len(tags):
        raise ConfigError(f"{label} names the same tag twice: {tags!r}.")
    return tags


def _as_argv(value: object, label: str) -> list[str]:
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
    def parse(value: object, label: str) -> str:
        if not isinstance(value, str) or value not in choices:
            raise ConfigError(f"{label} {value!r} is not one of: {', '.join(choices)}.")
        return value
    return parse


def _as_function_name(value: object, label: str) -> str:
    if not isinstance(value, str) or not value.isidentifier():
        raise ConfigError(f"{label} must be a Python function name like 'reward', not {value!r}.")
    return value


_PARSERS: dict[str, Callable[[object, str], object]] = {
    "name": _as_name,
    "weight": _non_negative,
    "train": _as_bool,
    "goal": _as_bool,
    "only_when": _as_gate,
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
    "max_tokens": _token_count,
    "buffer_tokens": _token_count,
    "ngram_size": _ngram_size,
    "model": _as_text,
    "label": _as_label,
    "output": _choice("probability", "logit"),
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


def _check_kind(spec: RewardSpec, where: str, load_code: bool) -> None:
    """Checks that involve several settings of one kind (required settings, bounds, compiling code)."""
    kind = spec.kind
    if kind == "regex":
        if spec.pattern is None:
            raise ConfigError(f"{where}.pattern is missing; a regex reward needs a regular expression to look for.")
        compile_pattern(spec.pattern, spec.case_sensitive, where)
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
    elif kind == "overlong" and spec.max_tokens is not None and spec.buffer_tokens is not None \
            and spec.buffer_tokens > spec.max_tokens:
        raise ConfigError(f"{where}.buffer_tokens ({spec.buffer_tokens}) is larger than {where}.max_tokens "
                          f"({spec.max_tokens}); the penalty starts that many tokens before the limit.")
    elif kind == "classifier":
        for needed, what in (("model", "a sequence-classification model (a Hub id or a folder)"),
                             ("label", "the label to score, by name (POSITIVE) or index (1)")):
            if getattr(spec, needed) is None:
                raise ConfigError(f"{where}.{needed} is missing; a classifier reward needs {what}.")
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
        if spec.code is not None and load_code:
            load_custom_function(spec.code, None, spec.function, spec.name or spec.kind, None, where)


def check_some_weight(specs: list[RewardSpec], where: str = "") -> None:
    """A list whose every weight is 0, or that holds only metrics, trains on a total that is always 0: nothing to
    learn from. ``where``: the list's name in a configuration file ("rewards"); the Rewards tab, which shows the
    list, names none."""
    if not any(training_weight(spec) > 0 for spec in specs):
        every = f"Every reward{f' in {where}' if where else ''}"
        if any(not spec.train for spec in specs):
            raise ConfigError(f"{every} is a metric (not trained on) or has weight 0, so the total training maximizes "
                              "is always 0 and nothing can be learned; train on one with a weight above 0.")
        raise ConfigError(f"{every} has weight 0, so the total is always 0 and nothing can be learned; give one a "
                          "weight above 0.")


def parse_rewards(items: list[Any], where: str = "rewards", *, policy: Policy,
                  load_code: bool = True) -> list[RewardSpec]:
    """Validate a whole reward list: not empty, each entry valid (and allowed by ``policy``), names unique (they
    become column names)."""
    if not isinstance(items, (list, tuple)) or not items:
        raise ConfigError(f"{where} must be a non-empty list of rewards; add at least one reward.")
    if len(items) > MOST_REWARDS:
        raise ConfigError(f"{where} has {len(items)} rewards, more than the {MOST_REWARDS} a run may have.")
    specs = [RewardSpec.from_dict(item, f"{where}[{index}]", policy=policy, load_code=load_code)
             for index, item in enumerate(items)]
    check_unique_names(where, [spec.name for spec in specs], "rewards")
    check_gates(specs, where)
    return specs


def check_gates(specs: list[RewardSpec], where: str = "rewards") -> None:
    """Each ``only_when`` names another reward of the list, one that is not gated itself (a gate is scored as it
    is, so the order of scoring never matters)."""
    by_name = {spec.name: spec for spec in specs}
    for index, spec in enumerate(specs):
        gate = gate_of(spec)
        if gate is None:
            continue
        label = f"{where}[{index}].only_when"
        if gate.name == spec.name:
            raise ConfigError(f"{label} names the reward itself ({spec.name}); name the reward that must pass first.")
        if gate.name not in by_name:
            raise ConfigError(f"{label} names {gate.name!r}, which is not one of the rewards "
                              f"({', '.join(by_name)}).")
        if gate_of(by_name[gate.name]) is not None:
            raise ConfigError(f"{label} names {gate.name}, which pays only when {by_name[gate.name].only_when} "
                              "itself; gate on a reward that always pays.")
