"""Faster GRPO steps that learn the same thing: eleven changes to how TRL 1.16, PEFT and transformers 5 run a step.

Each was found with the profiler and is measured before and after by ``bench/speedups.py`` (docs/performance.md has
the figures); each family's module explains its speed-ups. ``registry`` lists them with what each changes, how long
the change lasts and the library versions CI verified it with, and says which are on: all, unless
``DRAGON_UI_SPEEDUPS`` names others (comma-separated, or ``none``), one raised, its self-check failed on this
machine's libraries, or a library is outside the verified versions and no self-check has passed on them
(``selfcheck``). An entry point applies them at these places:

- ``apply_to_loaded_model`` as a model is loaded (training, evaluation and chat alike), once the self-checks have
  results for the installed libraries (a few seconds, once per set of versions);
- ``apply_to_trainer_model`` once TRL has added the adapters;
- ``trainer_hooks.grpo_trainer_class``, the trainer that samples and scores inside the blocks that install the rest
  and undo them afterwards;
- ``generate``, for the app's own replies (the playground's groups, the held-out scoring).
"""

from __future__ import annotations

import contextlib

from .attention import short_sequence_attention
from .lm_head import contiguous_lm_head_input
from .lora_layers import lean_adapter_layers, sparse_adapter_dropout
from .registry import (ALL, ENV, LIBRARIES, SPEEDUPS, choose, enabled, enter_or_switch_off, library_versions,
                       status)
from .sampling import inverse_cdf_sampler
from .selfcheck import ensure as ensure_checked, start as start_checking
from .shared_prompts import generate_sharing_prompts
from .trainer_hooks import grpo_trainer_class, sampling_mode, scoring_mode

__all__ = ["ALL", "ENV", "LIBRARIES", "SPEEDUPS", "apply_to_loaded_model", "apply_to_trainer_model", "choose", "enabled",
           "ensure_checked", "generate", "grpo_trainer_class", "library_versions", "sampling_mode", "scoring_mode",
           "start_checking", "status"]


def apply_to_loaded_model(model) -> None:
    """The speed-ups that belong to a model as it is loaded, for its life (``contiguous_lm_head``,
    ``short_sequence_attention``), once the self-checks have said which may run here."""
    ensure_checked()
    contiguous_lm_head_input(model)
    short_sequence_attention(model)


def apply_to_trainer_model(model) -> None:
    """The speed-ups for the adapters TRL has just added to the model (``trainer.model``), for its life
    (``sparse_dropout``, ``lean_adapter_layers``)."""
    sparse_adapter_dropout(model)
    lean_adapter_layers(model)


def generate(model, sampled: bool, **inputs):
    """``model.generate(**inputs)`` for the app's own replies, with the sampling speed-ups that are safe on a model
    other threads may be using (the app's previews share one): each distinct prompt read once (``shared_prompts``,
    handed to generate as a cache, nothing replaced), and when ``sampled``, each token drawn by inverse CDF
    (``inverse_cdf_sampling``, which acts on this thread only). A playground group so samples as a training step
    does, and sooner."""
    with contextlib.ExitStack() as stack:
        if sampled:
            enter_or_switch_off(stack, ("inverse_cdf_sampling",), inverse_cdf_sampler)
        return generate_sharing_prompts(model, model.generate, **inputs)
