"""Where TRL's GRPO trainer enters the speed-ups: a block around its sampling and a block around its scoring.

Everything that changes a library function for every thread (``torch.multinomial``, TRL's log-prob head) is
installed by these blocks and undone when they end, so outside a training step every library runs its own code.
"""

from __future__ import annotations

import contextlib
import functools

from . import lm_head, lora_layers, sampling, shared_prompts
from .registry import enter_or_switch_off


@contextlib.contextmanager
def sampling_mode(model):
    """While the trainer samples completions with ``model``: eval mode (``sampling_without_dropout``), each token
    drawn by inverse CDF (``inverse_cdf_sampling``), the adapters merged (``merged_sampling``) and each distinct
    prompt read once (``shared_prompts``); then all as they were, in reverse order, whatever happens inside."""
    with contextlib.ExitStack() as stack:
        enter_or_switch_off(stack, ("sampling_without_dropout",), lambda: sampling.eval_mode(model))
        enter_or_switch_off(stack, ("inverse_cdf_sampling",), sampling.inverse_cdf_sampler)
        enter_or_switch_off(stack, ("merged_sampling",), lambda: lora_layers.merged_for_sampling(model))
        enter_or_switch_off(stack, ("shared_prompts",), lambda: shared_prompts.sampling_shared_prompts(model))
        yield


@contextlib.contextmanager
def scoring_mode(model, prompt_length: int):
    """While TRL scores ``prompt_length`` prompt tokens plus completions with ``model`` (reference, old-policy and
    policy passes): its fused log-prob head skips the prompt positions (``completion_logprobs``) and runs Dragon's
    CPU head (``lean_logprob_head``, ``cache_sized_logprob_tiles``), and each distinct prompt is run once
    (``shared_prompts``)."""
    with contextlib.ExitStack() as stack:
        enter_or_switch_off(stack, ("completion_logprobs",), lm_head.completion_tokens_only)
        enter_or_switch_off(stack, ("cache_sized_logprob_tiles", "lean_logprob_head"), lm_head.cpu_logprob_head)
        enter_or_switch_off(stack, ("shared_prompts",),
                            lambda: shared_prompts.scoring_shared_prompts(model, prompt_length))
        yield


@functools.cache
def grpo_trainer_class():
    """TRL's GRPOTrainer, sampling in ``sampling_mode`` and scoring in ``scoring_mode``; built on first use, since
    TRL imports slowly."""
    from trl import GRPOTrainer

    class StudioGRPOTrainer(GRPOTrainer):
        # Not ``_generate``: TRL reads ``model.training`` there to file the step's metrics under train or eval.
        def _generate_single_turn(self, *args, **kwargs):
            with sampling_mode(self.model):
                return super()._generate_single_turn(*args, **kwargs)

        def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep, *args,
                                               **kwargs):
            with scoring_mode(model, input_ids.size(1) - logits_to_keep):
                return super()._get_per_token_logps_and_entropies(model, input_ids, attention_mask, logits_to_keep,
                                                                  *args, **kwargs)

    return StudioGRPOTrainer
