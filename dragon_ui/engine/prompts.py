"""Prompts the model can read: every prompt's tokens counted with the starting model's tokenizer (its chat template
included, as generation sees it), and the prompts too long to train on dropped and counted before anything trains.

A prompt is too long when it has more tokens than ``data.max_prompt_tokens`` (by default 512 on the CPU, where a
long prompt makes every step crawl, and the model's context elsewhere), or when it and ``grpo.max_new_tokens``
together do not fit the model's context. If every prompt is too long, the run is refused with the longest length.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..config import RunConfig
from ..data import MappedData
from ..errors import ConfigError
from ..public import Policy
from .libraries import import_all

CPU_PROMPT_TOKENS = 512
NO_LIMIT = 1 << 40


@dataclass
class PromptFit:
    """What counting the prompts found: their lengths, the limit and why, and how many were dropped."""

    shortest: int
    mean: float
    longest: int
    limit: int
    limit_reason: str  # "data.max_prompt_tokens", "the default on the CPU" or "the model's context of N tokens"
    dropped: int

    @property
    def longest_kept(self) -> int:
        """At most this many tokens in any prompt the run trains or scores on (what its memory depends on)."""
        return min(self.longest, self.limit)

    def summary(self) -> str:
        text = f"Prompts are {self.shortest} to {self.longest} tokens long (mean {self.mean:.0f})."
        if self.dropped:
            text += (f" {self.dropped} prompt{'s' if self.dropped > 1 else ''} longer than {self.limit} tokens "
                     f"({self.limit_reason}) {'were' if self.dropped > 1 else 'was'} dropped.")
        return text


def prompt_limit(config: RunConfig, device: str, context: int | None,
                 *, policy: Policy) -> tuple[int, str]:
    """(the most tokens a prompt may have, why that many); a public demo's limit when ``policy`` has one."""
    room = None if context is None else context - config.grpo.max_new_tokens
    if room is not None and room < 1:
        raise ConfigError(f"grpo.max_new_tokens ({config.grpo.max_new_tokens}) leaves no room for a prompt in the "
                          f"model's context of {context} tokens; lower it.")
    chosen = config.data.max_prompt_tokens
    if policy.limits and chosen is None:
        chosen, why = policy.limits.prompt_tokens, "this public demo's limit of tokens per prompt"
    elif chosen is None and room is None and device != "cpu":
        return NO_LIMIT, "no limit: the model does not say its context"
    elif chosen is None and device == "cpu":
        chosen, why = CPU_PROMPT_TOKENS, "the default on the CPU; set data.max_prompt_tokens to change it"
    else:
        why = "data.max_prompt_tokens"
    if room is not None and (chosen is None or room < chosen):
        return room, (f"the model's context of {context} tokens less grpo.max_new_tokens "
                      f"({config.grpo.max_new_tokens})")
    return NO_LIMIT if chosen is None else chosen, why


def context_length(source) -> int | None:
    """The model's context in tokens, from its config.json (no weights are loaded); None where it does not say."""
    import_all()
    from transformers import AutoConfig

    model_config = AutoConfig.from_pretrained(source.path, revision=source.revision,
                                              trust_remote_code=source.trust_remote_code,
                                              local_files_only=source.local_files_only)
    model_config = getattr(model_config, "text_config", None) or model_config
    return getattr(model_config, "max_position_embeddings", None)


def token_counts(examples: list[dict], tokenizer, tools: list | None = None) -> list[int]:
    """Each example's prompt length in tokens, chat template, opened assistant turn and ``tools``' schemas
    included."""
    texts = [tokenizer.apply_chat_template(example["prompt"], tools=tools or None, add_generation_prompt=True,
                                           tokenize=False) for example in examples]
    return [len(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]] if texts else []


def fit_prompts(mapped: MappedData, tokenizer, limit: int, limit_reason: str,
                tools: list | None = None) -> tuple[MappedData, PromptFit]:
    """``mapped`` without the prompts longer than ``limit`` tokens (the schemas of ``tools`` counted), and what was
    found; ConfigError when none fits."""
    train_lengths = token_counts(mapped.train, tokenizer, tools)
    eval_lengths = token_counts(mapped.eval, tokenizer, tools)
    lengths = train_lengths + eval_lengths
    if not lengths:
        raise ConfigError("data.prompt gave no prompts to train on.")
    longest = max(lengths)
    train = [example for example, length in zip(mapped.train, train_lengths, strict=True) if length <= limit]
    held_out = [example for example, length in zip(mapped.eval, eval_lengths, strict=True) if length <= limit]
    if not train:
        raise ConfigError(f"data.max_prompt_tokens: every prompt is longer than {limit} tokens ({limit_reason}); the "
                          f"longest has {longest:,} tokens. Shorten the prompts, or allow longer ones if the model "
                          "and the machine can take them.")
    dropped = len(lengths) - len(train) - len(held_out)
    fit = PromptFit(min(lengths), sum(lengths) / len(lengths), longest, limit, limit_reason, dropped)
    notes = [*mapped.notes, fit.summary()]
    return replace(mapped, train=train, eval=held_out, notes=notes), fit
