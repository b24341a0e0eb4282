"""TRL's own reward functions (``trl.rewards``) as reward kinds: think_format, overlong, repetition, cosine_length.

TRL's functions score batches of chat messages and token ids; here each scores one reply like every other kind, so
the weight, the failure counting, the playground and evaluation work for them unchanged. The tokens of a reply are
counted with the starting model's tokenizer, from its text (``add_special_tokens=False``: the end-of-text token is
not part of the reply), the same way in training, evaluation and the playground, so the three always agree.
"""

from __future__ import annotations

from ..errors import ConfigError, RewardError
from .builtin import Scorer
from .math_answers import MathChecker
from .spec import CosineLengthReward, OverlongReward, RepetitionReward, RewardSpec
from .text import require_reference

# DAPO's buffer: the last fifth of the length limit (4,096 of 20,480 tokens in the paper).
BUFFER_SHARE = 0.2


class TokenCounter:
    """The tokens of a reply, counted by the starting model's tokenizer; without one, a reward that counts tokens
    fails on each reply with a sentence saying so (a validation needs no tokenizer)."""

    def __init__(self, tokenizer=None):
        self._tokenizer = tokenizer

    def __call__(self, text: str) -> list[int]:
        if self._tokenizer is None:
            raise RewardError("counting the reply's tokens needs the starting model's tokenizer, which is not loaded")
        return list(self._tokenizer(text, add_special_tokens=False)["input_ids"])


def _message(completion: str) -> list[list[dict[str, str]]]:
    """One reply in the shape TRL's reward functions take: a batch of one conversation of one message."""
    return [[{"role": "assistant", "content": completion}]]


def think_format_scorer(spec: RewardSpec) -> Scorer:
    from trl.rewards import think_format_reward

    def score(prompt, completion, reference, row):
        return think_format_reward(_message(completion))[0]
    return score


def _length_limit(spec: OverlongReward | CosineLengthReward, max_new_tokens: int | None, where: str) -> int:
    if spec.max_tokens is not None:
        return spec.max_tokens
    if max_new_tokens is None:
        raise ConfigError(f"{where}.max_tokens is missing, and there is no run's max new tokens to take instead.")
    return max_new_tokens


def overlong_window(spec: OverlongReward, max_new_tokens: int | None, where: str) -> tuple[int, int]:
    """(the length limit, the buffer before it where the penalty grows) of an overlong reward. A buffer longer than
    its own max_tokens is refused with the settings; here, one longer than the run's max new tokens it falls back on."""
    limit = _length_limit(spec, max_new_tokens, where)
    buffer = spec.buffer_tokens or max(1, round(BUFFER_SHARE * limit))
    if buffer > limit:
        raise ConfigError(f"{where}.buffer_tokens ({buffer}) is larger than grpo.max_new_tokens ({limit}), the length "
                          "limit the penalty counts back from; lower it or set max_tokens.")
    return limit, buffer


def overlong_scorer(spec: OverlongReward, count: TokenCounter, max_new_tokens: int | None, where: str) -> Scorer:
    from trl.rewards import get_soft_overlong_punishment

    limit, buffer = overlong_window(spec, max_new_tokens, where)
    punish = get_soft_overlong_punishment(max_completion_len=limit, soft_punish_cache=buffer)

    def score(prompt, completion, reference, row):
        return punish([count(completion)])[0]
    return score


def repetition_scorer(spec: RepetitionReward, count: TokenCounter) -> Scorer:
    from trl.rewards import get_repetition_penalty_reward

    penalty = get_repetition_penalty_reward(ngram_size=spec.ngram_size, max_penalty=-1.0)  # the weight scales it

    def score(prompt, completion, reference, row):
        return penalty([count(completion)])[0]
    return score


def cosine_length_scorer(spec: CosineLengthReward, count: TokenCounter, max_new_tokens: int | None, where: str,
                         checker: MathChecker) -> Scorer:
    limit = _length_limit(spec, max_new_tokens, where)

    def score(prompt, completion, reference, row):
        reference = require_reference(reference)
        return checker.ask("cosine_length", reference, completion, len(count(completion)), limit)
    return score


def trl_scorer(spec: RewardSpec, where: str, tokenizer, max_new_tokens: int | None,
               checker: MathChecker) -> Scorer:
    """The scorer of one of TRL's kinds (RewardSpec.from_trl)."""
    count = TokenCounter(tokenizer)
    if isinstance(spec, OverlongReward):
        return overlong_scorer(spec, count, max_new_tokens, where)
    if isinstance(spec, RepetitionReward):
        return repetition_scorer(spec, count)
    if isinstance(spec, CosineLengthReward):
        return cosine_length_scorer(spec, count, max_new_tokens, where, checker)
    return think_format_scorer(spec)
