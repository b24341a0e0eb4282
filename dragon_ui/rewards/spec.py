"""The reward settings: one class per kind, which declares the settings it takes (settings.setting: label, help,
default, and how a stored value is read and checked) and says what it scores. The validation, the Rewards tab's
fields and docs/reference.md's tables of rewards are all made from these classes."""

from __future__ import annotations

import math
import numbers
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, ClassVar

from ..errors import ConfigError, check_unique_names
from ..public import LIFT, Policy
from ..settings import kind_settings_table, kinds_table, own_settings, read_kind_settings, setting
from .code import compile_pattern, load_custom_function
from .text import EXTRACT_MODES

FORMAT_PRESETS: dict[str, tuple[str, ...]] = {"think_answer": ("think", "answer")}  # a format reward's tag sets
_NAME_RE = re.compile(r"[A-Za-z0-9_]+")
_TAG_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]*")
_GATE_RE = re.compile(r"\s*([A-Za-z0-9_]+)\s*(?:>=\s*([-+0-9.eE]+)\s*)?")


# The longest a text setting may be unless it says (any client can send megabytes); list settings: each item, and
# how many.
_LONGEST_ITEM, MOST_REWARDS = 200, 20
MOST_NGRAM, MOST_TOKENS = 32, 32768  # MOST_TOKENS: the largest grpo.max_new_tokens


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


class Choice:
    """A setting that is one of ``choices`` (the Rewards tab offers them)."""

    def __init__(self, *choices: str):
        self.choices = choices

    def __call__(self, value: object, label: str) -> str:
        if not isinstance(value, str) or value not in self.choices:
            raise ConfigError(f"{label} {value!r} is not one of: {', '.join(self.choices)}.")
        return value


def _as_function_name(value: object, label: str) -> str:
    if not isinstance(value, str) or not value.isidentifier():
        raise ConfigError(f"{label} must be a Python function name like 'reward', not {value!r}.")
    return value


# --------------------------------------------------------------------------------------------------------------------
# The kinds
# --------------------------------------------------------------------------------------------------------------------

@dataclass
class RewardSpec:
    """One reward as the run config stores it: the settings every kind takes. Each kind is a subclass that declares
    its own and says what it scores; build one with :meth:`from_dict`, which validates everything."""

    kind: ClassVar[str]
    help: ClassVar[str]  # what it scores, in a sentence or two of Markdown (the Rewards tab, the reference)
    details: ClassVar[str] = ""  # what only the reference adds to that
    # Whether it says the answer is right: where no reward is marked the goal, it is inferred among them (goal_names).
    # The others shape the reply (its length, layout, words, repetition) or score what a model or program thinks of it.
    checks_answer: ClassVar[bool] = False
    # Whether it compares the reply with the row's reference answer, and so fails on a reference it cannot read.
    reads_reference: ClassVar[bool] = False
    # Whether it only takes away (scores from -1 to 0): a mean of 0 then means "no penalty was needed", not a broken
    # reward.
    penalty: ClassVar[bool] = False
    # Whether it counts the reply's tokens with the starting model's tokenizer, as TRL's functions do.
    counts_tokens: ClassVar[bool] = False
    # Whether it is one of TRL's own reward functions (trl.rewards), scored with our weight, failure counting and
    # playground around it.
    from_trl: ClassVar[bool] = False
    refused_in_public: ClassVar[str | None] = None  # why a public demo refuses it (it runs code on the server)

    name: str = setting("", label="Name", shown_default="its kind", read=_as_name, help=(
        "Letters, digits and `_`; it names the reward's column, its chart line and its values in `progress.jsonl`."))
    weight: float = setting(1.0, label="Weight", read=_non_negative, help=(
        "What its score counts for in the total that training maximizes."))
    train: bool = setting(True, label="Train on it", read=_as_bool, help=(
        "Off: a metric. It is scored in the held-out checks, Compare, the model card and the leaderboard, and watched "
        "for falling, but adds nothing to what training maximizes."))
    goal: bool | None = setting(None, label="The goal: says the answer is right", shown_default="automatic",
                                read=_as_bool, help=(
        "automatic: the heaviest of the rewards that check the answer (exact, contains, numeric, math, json, …); "
        "yes (`true`) or no (`false`) says it. The pre-flight asks whether training teaches the goal."))
    only_when: str | None = setting(None, label="Pays only when", shown_default="always", read=_as_gate, help=(
        "Another reward's name (`exact`), or a name and a score (`exact >= 0.5`): this reward then pays only where "
        "that one passes, so a wrong reply earns nothing for its length or layout."))

    @staticmethod
    def from_dict(data: object, where: str = "rewards[0]", *, policy: Policy, load_code: bool = True) -> RewardSpec:
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
        cls = KINDS[kind]
        values = read_kind_settings(data, where, cls, REWARD_CLASSES, RewardSpec, noun="reward",
                                    longest=_LONGEST_ITEM)
        reward = cls(**values)
        reward.name = reward.name or kind
        reward.check(where, load_code)
        return reward

    def check(self, where: str, load_code: bool) -> None:
        """The checks that involve several settings of the kind (required settings, bounds, compiling code)."""

    def pays_for(self) -> str:
        """What it pays for, in a sentence fragment (reward_rule)."""
        raise NotImplementedError

    def to_dict(self) -> dict[str, Any]:
        """kind, name and weight, plus every setting that differs from its default; round-trips via from_dict."""
        out: dict[str, Any] = {"kind": self.kind, "name": self.name or self.kind, "weight": self.weight}
        for spec in fields(self):
            value = getattr(self, spec.name)
            if spec.name not in out and value != spec.default:
                out[spec.name] = list(value) if isinstance(value, list) else value
        return out


def _case_sensitive() -> Any:
    return setting(False, label="Case-sensitive", read=_as_bool,
                   help="On: case counts when the reply is compared.")


def _max_tokens() -> Any:
    return setting(None, label="Length limit in tokens", shown_default="the run's max new tokens", read=_token_count,
                   help="Counted in the starting model's tokens; empty: the run's max new tokens "
                        "(`grpo.max_new_tokens`).")


@dataclass
class AnswerReward(RewardSpec):
    """A reward that compares the answer, the part of the reply ``extract`` takes, with the reference."""

    checks_answer: ClassVar[bool] = True
    reads_reference: ClassVar[bool] = True

    extract: str = setting("whole", label="Compare which part of the reply", read=Choice(*EXTRACT_MODES), help=(
        "`whole`; `last_number`; `after_hashes` (text after `####`); `boxed` (`\\boxed{…}`); `answer_tag` "
        "(`<answer>…</answer>`)."))

    def answer(self) -> str:
        return "the reply" if self.extract == "whole" else f"the answer ({self.extract.replace('_', ' ')})"

    def compared(self) -> str:
        return "ignoring " + ("" if getattr(self, "case_sensitive", False) else "case, ") + \
            "extra spaces and trailing . , ; : ! ?"


@dataclass
class ExactReward(AnswerReward):
    kind: ClassVar[str] = "exact"
    help: ClassVar[str] = ("1 when the (extracted) reply equals the reference answer, else 0; case (unless "
                           "case-sensitive), extra spaces and trailing . , ; : ! ? do not count.")

    case_sensitive: bool = _case_sensitive()

    def pays_for(self) -> str:
        return f"{self.answer()} equals the reference, {self.compared()}"


@dataclass
class ContainsReward(AnswerReward):
    kind: ClassVar[str] = "contains"
    help: ClassVar[str] = ("1 when the reference answer appears in the (extracted) reply, else 0; case (unless "
                           "case-sensitive) and extra spaces do not count.")

    case_sensitive: bool = _case_sensitive()

    def pays_for(self) -> str:
        return f"{self.answer()} contains the reference, {self.compared()}"


@dataclass
class NumericReward(AnswerReward):
    kind: ClassVar[str] = "numeric"
    help: ClassVar[str] = "1 when the reply's number equals the reference's number (within the tolerance), else 0."
    details: ClassVar[str] = ("The last number of each counts: signs, decimals and thousands separators (\"1,234.5\") "
                              "are understood, scientific notation is not.")

    tolerance: float = setting(1e-6, label="Tolerance", read=_non_negative,
                               help="Relative: 0.01 accepts numbers within 1% of the reference.")

    def pays_for(self) -> str:
        return f"the number in {self.answer()} equals the reference"


@dataclass
class MathReward(AnswerReward):
    kind: ClassVar[str] = "math"
    help: ClassVar[str] = (
        "1 when the reply's final answer equals the reference mathematically, else 0, as "
        "[math-verify](https://github.com/huggingface/Math-Verify) checks it: `\\frac{1}{2}`, `0.5` and `50\\%` agree, "
        "and so do sets, intervals, equations (`x = 3`), units and symbolic forms like `\\sqrt{8}` and `2\\sqrt{2}`. "
        "It finds the answer itself (`\\boxed{}` first, then the last formula or number), or takes the part an "
        "extraction mode picks.")
    details: ClassVar[str] = ("A reference without `$…$` is read as LaTeX. Each check runs in a worker process and "
                              "fails (scores 0, counted) after 10 s.")

    def pays_for(self) -> str:
        answer = self.answer() if self.extract != "whole" else "the final answer"
        return f"{answer} equals the reference mathematically (math-verify)"


@dataclass
class RegexReward(RewardSpec):
    kind: ClassVar[str] = "regex"
    help: ClassVar[str] = "1 when the regular expression matches anywhere in the reply, else 0."
    details: ClassVar[str] = "A broken pattern is refused when the settings are checked."

    pattern: str = setting("", label="Regular expression", read=_as_text, longest=1000,
                                  help="Python syntax, e.g. `^\\d+$` for a reply that is only digits.")
    case_sensitive: bool = _case_sensitive()

    def check(self, where: str, load_code: bool) -> None:
        if not self.pattern:
            raise ConfigError(f"{where}.pattern is missing; a regex reward needs a regular expression to look for.")
        compile_pattern(self.pattern, self.case_sensitive, where)

    def pays_for(self) -> str:
        return f"the reply matches `{self.pattern}`"


@dataclass
class JsonReward(RewardSpec):
    kind: ClassVar[str] = "json"
    help: ClassVar[str] = "1 when the reply is valid JSON; with keys, the share of those keys it has (partial credit)."
    details: ClassVar[str] = "Fences like ```` ```json ```` are stripped first; with keys, a reply that is not an object scores 0."
    checks_answer: ClassVar[bool] = True

    keys: list[str] | None = setting(None, label="Required keys", read=_as_keys, help=(
        "The keys the reply's JSON object must have, e.g. name, age, city; none only checks that the reply is JSON."))

    def pays_for(self) -> str:
        return "the reply is JSON" + (f" with the keys {', '.join(self.keys)}" if self.keys else "")


@dataclass
class LengthReward(RewardSpec):
    kind: ClassVar[str] = "length"
    help: ClassVar[str] = "1 inside the character bounds, less the further outside them (partial credit)."
    details: ClassVar[str] = ("Below `min_chars`: n/min; above `max_chars`: falling linearly to 0 at twice "
                              "`max_chars`.")

    min_chars: int | None = setting(None, label="At least this many characters", shown_default="no minimum",
                                    read=_char_count, help="The fewest characters a reply may have for full marks.")
    max_chars: int | None = setting(None, label="At most this many characters", shown_default="no maximum",
                                    read=_char_count, help="The most characters a reply may have for full marks.")

    def check(self, where: str, load_code: bool) -> None:
        if self.min_chars is None and self.max_chars is None:
            raise ConfigError(f"{where}.min_chars and {where}.max_chars are both missing; "
                              f"a length reward needs at least one bound.")
        if self.min_chars is not None and self.max_chars is not None and self.min_chars > self.max_chars:
            raise ConfigError(f"{where}.min_chars ({self.min_chars}) is larger than "
                              f"{where}.max_chars ({self.max_chars}).")

    def pays_for(self) -> str:
        return f"the reply has {self.min_chars or 0} to {self.max_chars or 'any number of'} characters"


@dataclass
class KeywordReward(RewardSpec):
    kind: ClassVar[str] = "keyword"
    help: ClassVar[str] = "`any`: 1 when one of the words appears, else 0; `all`: the share of the words that appear."

    words: list[str] | None = setting(None, label="Words", read=_as_text_list,
                                      help="The words to look for; case does not matter.")
    mode: str = setting("any", label="Needs", read=Choice("any", "all"),
                        help="`any`: one of the words; `all`: the share found.")

    def check(self, where: str, load_code: bool) -> None:
        if self.words is None:
            raise ConfigError(f"{where}.words is missing; a keyword reward needs a list of words to look for.")

    def pays_for(self) -> str:
        return f"the reply contains {self.mode} of: {', '.join(self.words or [])}"


@dataclass
class FormatReward(RewardSpec):
    kind: ClassVar[str] = "format"
    help: ClassVar[str] = ("1 for exactly the tag layout, e.g. `<think>…</think><answer>…</answer>` with nothing "
                           "around it; partial credit per tag pair.")
    details: ClassVar[str] = "Otherwise 1/(n+1) for each well-formed pair of its n tags."

    preset: str | None = setting(None, label="Preset", shown_default="`think_answer`, without tags",
                                 read=Choice(*FORMAT_PRESETS),
                                 help="`think_answer`: `<think>…</think>` then `<answer>…</answer>`.")
    tags: list[str] | None = setting(None, label="…or your own tags", read=_as_tags,
                                     help="Tag names in order, e.g. reasoning, answer; instead of a preset.")

    def check(self, where: str, load_code: bool) -> None:
        if self.preset is not None and self.tags is not None:
            raise ConfigError(f"{where}.preset and {where}.tags are both set; use one of them.")
        if self.tags is None:
            self.preset = self.preset or "think_answer"

    def tag_names(self) -> list[str]:
        """The tags, in order: its own, or its preset's."""
        return list(self.tags or FORMAT_PRESETS.get(self.preset or "", ()))

    def pays_for(self) -> str:
        return f"the reply is laid out in the tags {', '.join(self.tag_names())}"


@dataclass
class ThinkFormatReward(RewardSpec):
    kind: ClassVar[str] = "think_format"
    help: ClassVar[str] = (
        "[TRL's `think_format_reward`](https://huggingface.co/docs/trl/main/en/rewards): 1 when the reply starts with "
        "`<think>…</think>` (one `<think>` only), whatever follows, else 0. The `format` kind asks for the whole "
        "`<think>…</think><answer>…</answer>` layout and gives partial credit.")
    from_trl: ClassVar[bool] = True

    def pays_for(self) -> str:
        return "the reply starts with one <think>…</think> block (TRL's think_format_reward)"


@dataclass
class OverlongReward(RewardSpec):
    kind: ClassVar[str] = "overlong"
    help: ClassVar[str] = (
        "[TRL's soft overlong punishment](https://huggingface.co/papers/2503.14476) (DAPO): 0 for a reply well under "
        "the length limit, falling to -1 over the last tokens before it; it only takes away. Lengths are counted in "
        "the starting model's tokens.")
    details: ClassVar[str] = ("As DAPO's Eq. 13: 0 up to `max_tokens − buffer_tokens` tokens, then falling linearly "
                              "to -1 at `max_tokens`, -1 beyond.")
    penalty: ClassVar[bool] = True
    counts_tokens: ClassVar[bool] = True
    from_trl: ClassVar[bool] = True

    max_tokens: int | None = _max_tokens()
    buffer_tokens: int | None = setting(None, label="Penalty starts this many tokens before the limit",
                                        shown_default="the last fifth of the limit", read=_token_count,
                                        help="Empty: the last fifth of the limit, as in DAPO.")

    def check(self, where: str, load_code: bool) -> None:
        if self.max_tokens is not None and self.buffer_tokens is not None and self.buffer_tokens > self.max_tokens:
            raise ConfigError(f"{where}.buffer_tokens ({self.buffer_tokens}) is larger than {where}.max_tokens "
                              f"({self.max_tokens}); the penalty starts that many tokens before the limit.")

    def pays_for(self) -> str:
        return (f"nothing, and takes up to 1 away as the reply nears {_tokens(self.max_tokens)} (TRL's soft "
                "overlong punishment)")


@dataclass
class RepetitionReward(RewardSpec):
    kind: ClassVar[str] = "repetition"
    help: ClassVar[str] = (
        "[TRL's repetition penalty](https://huggingface.co/papers/2502.03373): 0 when no sequence of tokens repeats, "
        "down to -1 for a reply that only repeats itself; it only takes away.")
    details: ClassVar[str] = "It is minus the share of the reply's token n-grams that repeat an earlier one."
    penalty: ClassVar[bool] = True
    counts_tokens: ClassVar[bool] = True
    from_trl: ClassVar[bool] = True

    ngram_size: int = setting(3, label="Repeated sequences of this many tokens", read=_ngram_size,
                              help=f"3: the same three tokens in a row again; at most {MOST_NGRAM}.")

    def pays_for(self) -> str:
        return (f"nothing, and takes up to 1 away for repeated {self.ngram_size}-token sequences (TRL's repetition "
                "penalty)")


@dataclass
class CosineLengthReward(RewardSpec):
    kind: ClassVar[str] = "cosine_length"
    help: ClassVar[str] = (
        "[TRL's cosine-scaled reward](https://huggingface.co/papers/2502.03373): a correct answer (math-verify, in "
        "`\\boxed{}` or `$…$`) earns 1 when short down to 0.5 at the length limit; a wrong one -1 when short, -0.5 "
        "when long.")
    details: ClassVar[str] = "Correct is TRL's `accuracy_reward`. It runs in the math worker, like `math`."
    checks_answer: ClassVar[bool] = True
    reads_reference: ClassVar[bool] = True
    counts_tokens: ClassVar[bool] = True
    from_trl: ClassVar[bool] = True

    max_tokens: int | None = _max_tokens()

    def pays_for(self) -> str:
        return ("a correct answer (math-verify), more when short; a wrong one loses less when long "
                f"(TRL's cosine-scaled reward over {_tokens(self.max_tokens)})")


@dataclass
class ClassifierReward(RewardSpec):
    kind: ClassVar[str] = "classifier"
    help: ClassVar[str] = ("A classifier model reads each reply and the score is one label's probability (or logit), "
                           "e.g. POSITIVE of a sentiment model. It is loaded once and scores replies in batches.")
    details: ClassVar[str] = (
        "It reads up to 512 tokens of the reply; the probability is a softmax (a sigmoid for a multi-label model). "
        "Check reads the model's labels (a typo is found before the run) and refuses a model that is not a sequence "
        "classifier (a language model would load with a random head). It is loaded on the run's device (the "
        "playground's typed replies: the CPU), once for every reward that names it, and counted in the memory "
        "estimate. A public demo accepts only the models listed in `DRAGON_UI_PUBLIC_CLASSIFIERS`, one per run.")

    model: str = setting("", label="Classifier model", read=_as_text, longest=1000, help=(
        "A sequence-classification model: a Hub id (e.g. distilbert/distilbert-base-uncased-finetuned-sst-2-english) "
        "or a local folder."))
    label: str = setting("", label="Label", read=_as_label,
                                help="The label whose score pays: its name (POSITIVE) or its index (1).")
    output: str = setting("probability", label="Score", read=Choice("probability", "logit"),
                          help="`probability`: from 0 to 1; `logit`: the raw number (any size).")

    def check(self, where: str, load_code: bool) -> None:
        if not self.model:
            raise ConfigError(f"{where}.model is missing; a classifier reward needs a sequence-classification model "
                              "(a Hub id or a folder).")
        if not self.label:
            raise ConfigError(f"{where}.label is missing; a classifier reward needs the label to score, by name "
                              "(POSITIVE) or index (1).")

    def pays_for(self) -> str:
        return f"{self.model} says {self.label}" + (" (its logit)" if self.output == "logit" else " (its probability)")


@dataclass
class CommandReward(RewardSpec):
    kind: ClassVar[str] = "command"
    help: ClassVar[str] = "Runs a program for each reply; the score comes from its exit code or the last number it prints."
    details: ClassVar[str] = (
        "For example unit tests against generated code. `{reference_file}` is replaced the same way, by a file that "
        "holds the reference answer; `DRAGON_PROMPT` and `DRAGON_REFERENCE` hold the prompt and the reference. It "
        "runs in the config's folder, never through a shell, and is stopped with its whole process group at the "
        "timeout.")
    refused_in_public: ClassVar[str | None] = (
        f"command rewards are turned off in this public demo because they run arbitrary programs on the server; "
        f"{LIFT} to use them.")

    argv: list[str] | None = setting(None, label="Command", read=_as_argv, longest=4000,
                                     help="The program and its arguments, e.g. `python check.py {completion_file}`.")
    input: str = setting("stdin", label="The reply goes to", read=Choice("stdin", "file"),
                         help="`stdin`, or a temporary `file` whose path replaces `{completion_file}`.")
    score_from: str = setting("exit_code", label="Score from", read=Choice("exit_code", "stdout"),
                              help="`exit_code`: 1 when it exits with 0; `stdout`: the last number it prints.")
    min_score: float = setting(0.0, label="Printed number that means 0", read=_as_float,
                               help="With `stdout`: the number rescaled to a score of 0 (and anything below it).")
    max_score: float = setting(1.0, label="Printed number that means 1", read=_as_float,
                               help="With `stdout`: the number rescaled to a score of 1 (and anything above it).")
    timeout: float = setting(30.0, label="Timeout in seconds", read=_positive,
                             help="A run of the program that takes longer fails: it scores 0, counted.")

    def check(self, where: str, load_code: bool) -> None:
        if self.argv is None:
            raise ConfigError(f"{where}.argv is missing; a command reward needs the program to run.")
        if self.max_score <= self.min_score:
            raise ConfigError(f"{where}.max_score ({self.max_score:g}) must be larger than "
                              f"{where}.min_score ({self.min_score:g}).")

    def pays_for(self) -> str:
        return f"the command `{' '.join(self.argv or [])}` passes on the reply"


@dataclass
class CustomReward(RewardSpec):
    kind: ClassVar[str] = "custom"
    help: ClassVar[str] = ("Your own Python function `reward(prompt, completion, reference, row)` that returns a "
                           "number.")
    details: ClassVar[str] = ("Any finite number; `row` holds every column of the data row as text. The code is "
                              "compiled when the settings are checked, so a syntax error is said before anything "
                              "loads.")
    refused_in_public: ClassVar[str | None] = (
        f"custom Python rewards are turned off in this public demo because they run arbitrary code on the server; "
        f"{LIFT} to use them.")

    code: str | None = setting(None, label="Python code", read=_as_text, longest=100_000, help=(
        "The source that defines the function; `row` holds every column of the data row as text."))
    file: str | None = setting(None, label="…or a .py file", read=_as_text, longest=1000,
                               help="A .py file that defines it, read instead of the code.")
    function: str = setting("reward", label="Function name", read=_as_function_name,
                            help="The function of the code (or file) that scores a reply.")

    def check(self, where: str, load_code: bool) -> None:
        if (self.code is None) == (self.file is None):
            raise ConfigError(f"{where}.code and {where}.file: give exactly one of them (the Python source, "
                              f"or the path of a .py file).")
        if self.code is not None and load_code:
            load_custom_function(self.code, None, self.function, self.name or self.kind, None, where)

    def pays_for(self) -> str:
        return f"the Python function `{self.function}` scores it"


@dataclass
class EnvironmentReward(RewardSpec):
    kind: ClassVar[str] = "environment"
    help: ClassVar[str] = ("What the environment the model played says the conversation earned (its `get_reward`): "
                           "add an environment on the Tools section first.")
    details: ClassVar[str] = ("It needs an environment among the tools ([Environments](#environments)). A typed reply "
                              "has no environment score, and fails.")
    checks_answer: ClassVar[bool] = True

    def pays_for(self) -> str:
        return "the environment it played says it earned (its get_reward)"


def _tokens(count: int | None) -> str:
    return f"{count} tokens" if count else "the run's max new tokens"


REWARD_CLASSES: tuple[type[RewardSpec], ...] = (
    ExactReward, ContainsReward, NumericReward, MathReward, RegexReward, JsonReward, LengthReward, KeywordReward,
    FormatReward, ThinkFormatReward, OverlongReward, RepetitionReward, CosineLengthReward, ClassifierReward,
    CommandReward, CustomReward, EnvironmentReward)
KINDS: dict[str, type[RewardSpec]] = {cls.kind: cls for cls in REWARD_CLASSES}
REWARD_KINDS: tuple[str, ...] = tuple(KINDS)
GOAL_KINDS = tuple(kind for kind, cls in KINDS.items() if cls.checks_answer)
PENALTY_KINDS = tuple(kind for kind, cls in KINDS.items() if cls.penalty)
# Every setting a reward may have, by name, as its kind declares it: every kind's first, then each kind's own.
REWARD_SETTINGS = {spec.name: spec for cls in REWARD_CLASSES for spec in fields(cls)}


def kind_fields(kind: str) -> tuple[str, ...]:
    """The settings a reward of this kind takes besides those every reward takes (what an editor should show)."""
    return tuple(spec.name for spec in own_settings(KINDS[kind], RewardSpec))


def reward_kinds_table() -> str:
    """docs/reference.md's table of reward kinds (make reference)."""
    return kinds_table(REWARD_CLASSES, RewardSpec, "score")


def reward_settings_table() -> str:
    """docs/reference.md's table of the rewards' settings (make reference)."""
    return kind_settings_table(REWARD_CLASSES, RewardSpec)


def reward_rule(spec: RewardSpec) -> str:
    """What one reward pays for, in a sentence fragment (the Rewards tab's table, the model card)."""
    gate = gate_of(spec)
    return spec.pays_for() + (f", paid only when {gate.describe()}" if gate else "")


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
    """What a reply that does all a reward asks scores: 0 for a penalty, 1 for every other kind (a custom reward is
    taken to score up to 1, as the built-in ones do)."""
    return 0.0 if spec.penalty else 1.0


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


def public_demo_refusal(kind: str) -> str | None:
    """Why a public demo refuses rewards of this kind (they run code on the server), or None when it allows them."""
    return KINDS[kind].refused_in_public if kind in KINDS else None


def public_refusal(spec: RewardSpec, where: str, *, policy: Policy) -> str | None:
    """Why ``policy`` refuses this reward (its kind runs code on the server, or its classifier is not offered), as
    the sentence to show; None when it allows it (always, outside public mode)."""
    return _refusal(spec.kind, getattr(spec, "model", None), where, policy=policy)


def _refusal(kind: str, model: str | None, where: str, *, policy: Policy) -> str | None:
    if not policy.public:
        return None
    if public_demo_refusal(kind):
        return f"{where}.kind: {public_demo_refusal(kind)}"
    refusal = policy.classifier_refusal(model if isinstance(model, str) else "") if kind == "classifier" else None
    return refusal and f"{where}.model {refusal}"


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
