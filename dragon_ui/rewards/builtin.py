"""The built-in reward kinds that only read the reply (exact, contains, numeric, regex, json, length, keyword,
format) or what the environment the model played said of it (environment).

Each is a function of its spec returning a scorer ``(prompt, completion, reference, row) -> score``; a score is
checked to be a finite number by :class:`Reward`."""

from __future__ import annotations

import json
import math
import numbers
import re
from collections.abc import Callable

from ..errors import RewardError
from .code import compile_pattern
from .spec import (ContainsReward, EnvironmentReward, ExactReward, FormatReward, JsonReward, KeywordReward,
                   LengthReward, NumericReward, RegexReward, RewardSpec, training_weight)
from .text import extract_answer, last_number, normalise, require_reference

Scorer = Callable[[str, str, "str | None", dict], object]
# The key of a scored row that holds, for a reply played in an environment (tools.environments), what gives the
# environment's own score of it: the environment reward reads it; a typed reply has none.
EPISODE_SCORE = "__environment_score__"


class Reward:
    """A built reward: call it with (prompt, completion, reference, row) to get a finite float; it may raise."""

    def __init__(self, spec: RewardSpec, scorer: Scorer):
        self.spec = spec
        self.name = spec.name or spec.kind
        self.weight = training_weight(spec)  # 0 for a metric: every total (training's, held-out, playground) skips it
        self.metric = not spec.train
        self._scorer = scorer

    def __call__(self, prompt: str, completion: str, reference: str | None, row: dict) -> float:
        return _as_score(self._scorer(prompt, completion, reference, row))

    def prepare(self, completions: list[str]) -> None:
        """Score a batch of replies ahead of the calls for each, where the scorer does that faster (a classifier)."""
        prepare = getattr(self._scorer, "prepare", None)
        if prepare is not None:
            prepare(completions)

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


def _normalised_reference(reference: str | None, case_sensitive: bool) -> str:
    """An empty reference would match every reply (and be contained in every reply), so it is a failure."""
    expected = normalise(require_reference(reference), case_sensitive)
    if not expected:
        raise RewardError("the reference answer is empty")
    return expected


def _exact(spec: ExactReward) -> Scorer:
    def score(prompt, completion, reference, row):
        expected = _normalised_reference(reference, spec.case_sensitive)
        return float(normalise(extract_answer(completion, spec.extract), spec.case_sensitive) == expected)
    return score


def _contains(spec: ContainsReward) -> Scorer:
    def score(prompt, completion, reference, row):
        expected = _normalised_reference(reference, spec.case_sensitive)
        return float(expected in normalise(extract_answer(completion, spec.extract), spec.case_sensitive))
    return score


def _numeric(spec: NumericReward) -> Scorer:
    def score(prompt, completion, reference, row):
        expected = last_number(require_reference(reference))
        if expected is None:
            raise RewardError("the reference answer contains no number")
        got = last_number(extract_answer(completion, spec.extract))
        if got is None:
            return 0.0
        return float(got == expected or abs(got - expected) <= max(1e-6, spec.tolerance * abs(expected)))
    return score


REGEX_TIMEOUT_S = 0.25  # one reply: a pattern that takes longer scores it 0, counted as a failure


def regex_scorer(spec: RegexReward, where: str) -> Scorer:
    pattern = compile_pattern(spec.pattern, spec.case_sensitive, where)

    def score(prompt, completion, reference, row):
        try:
            return float(pattern.search(completion, timeout=REGEX_TIMEOUT_S) is not None)
        except TimeoutError:
            raise RewardError(f"the regular expression took longer than {REGEX_TIMEOUT_S:g} s on this reply") from None
    return score


_FENCE_LANGUAGE = re.compile(r"\A[\w+-]*[ \t]*\n?")  # what may follow an opening fence: ```json, then a newline


def _fenced_content(text: str) -> str | None:
    """The content of a text that is one fenced block (```json ... ``` or plain ```), fence lines removed; None
    for any other text. String operations and one anchored match: linear in the text, whatever it holds."""
    if len(text) < 6 or not (text.startswith("```") and text.endswith("```")):
        return None
    inner = text[3:-3]
    inner = _FENCE_LANGUAGE.sub("", inner, count=1)
    body = inner.rstrip(" \t")
    return body[:-1] if body.endswith("\n") else body


def _json(spec: JsonReward) -> Scorer:
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


def _length(spec: LengthReward) -> Scorer:
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


def _keyword(spec: KeywordReward) -> Scorer:
    """Case-insensitive substring search; "any" is 1/0, "all" is the fraction of words found."""
    words = [word.casefold() for word in spec.words or []]

    def score(prompt, completion, reference, row):
        text = completion.casefold()
        found = sum(word in text for word in words)
        return float(found > 0) if spec.mode == "any" else found / len(words)
    return score


def _format(spec: FormatReward) -> Scorer:
    """Reward the tag layout, e.g. ``<think>…</think><answer>…</answer>`` for the preset ``think_answer``.

    With n tags the rule is:

    * 1.0 only for the whole shape: the completion is exactly the tags in the given order, each once, each as
      ``<tag>content</tag>``, with nothing but whitespace before, between and after them. Contents may be anything
      (also empty) except another opening or closing tag of the listed names.
    * otherwise k / (n + 1), where k is the number of tags that appear somewhere as a well-formed pair (``<tag>``
      followed later by ``</tag>``). So the best partial score, n / (n + 1), is always below the full shape's 1.0.

    Tags are matched case-sensitively and without attributes.
    """
    tags = spec.tag_names()
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


def _environment(spec: EnvironmentReward) -> Scorer:
    def score(prompt, completion, reference, row):
        scored = row.get(EPISODE_SCORE)
        if scored is None:
            raise RewardError("only a reply the model wrote while playing the run's environment has an environment "
                              "score (Generate a group plays it); a typed reply has none")
        return scored()
    return score


BUILTIN_SCORERS: dict[str, Callable[..., Scorer]] = {  # by kind, each a function of its kind's spec
    "exact": _exact, "contains": _contains, "numeric": _numeric, "json": _json,
    "length": _length, "keyword": _keyword, "format": _format, "environment": _environment,
}
