"""Faster GRPO steps that learn the same thing: three fixes to how TRL 1.16 and transformers 5 run a step.

Each one was found with the profiler and is measured before and after by ``bench/speedups.py``; the README's
Performance section has the figures. They are on by default; ``DRAGON_UI_SPEEDUPS`` names the ones to use
(comma-separated, or ``none``), so a suspected speed-up can be ruled out without editing code.

- ``completion_logprobs``: TRL's fused log-prob head scores only completion tokens on CUDA/XPU, but on other devices
  it scores every prompt token too and throws the results away (fixed tile shapes suit graph compilers such as
  Neuron's). An eager CPU or Apple GPU has no such compiler, so Dragon scores completion tokens there as well; with
  prompts three times longer than completions that is three quarters of the LM head's work in the reference pass,
  the policy pass and the backward. The log-probs are the same numbers.
- ``contiguous_lm_head``: generation's first forward slices the last position of every prompt before the LM head.
  The slice is not contiguous, and with a frozen LM head ``torch.matmul`` then multiplies by one copy of the
  vocabulary matrix per sequence (24 copies, 1.4 GB in bf16) instead of a single matrix product. A contiguous
  input gives the same logits.
- ``sampling_without_dropout``: TRL samples completions with the model in training mode, so every token of every
  completion pays for adapter dropout masks, and the completions come from a randomly thinned policy rather than
  the one whose log-probs are trained. Dragon samples in eval mode, as TRL's vLLM path already does.
"""

from __future__ import annotations

import contextlib
import functools
import os

from .errors import ConfigError

ALL = ("completion_logprobs", "contiguous_lm_head", "sampling_without_dropout")
ENV = "DRAGON_UI_SPEEDUPS"


def enabled(name: str) -> bool:
    """Whether the speed-up ``name`` is on: all are, unless DRAGON_UI_SPEEDUPS lists others (or says ``none``)."""
    if name not in ALL:
        raise ValueError(f"unknown speed-up {name!r}; known: {', '.join(ALL)}")
    chosen = os.environ.get(ENV, "").strip()
    if not chosen or chosen == "all":
        return True
    names = {part.strip() for part in chosen.split(",") if part.strip()}
    unknown = names - set(ALL) - {"none"}
    if unknown:
        raise ConfigError(f"{ENV} names unknown speed-ups: {', '.join(sorted(unknown))}; known: {', '.join(ALL)}, "
                         "or none")
    return name in names


def score_completion_tokens_only() -> None:
    """Make TRL's fused log-prob head skip prompt positions on the CPU and MPS too, not only on Triton devices.

    TRL decides per call with ``trl.trainer.utils._use_triton(device)``; the Triton kernels themselves are chosen
    by the copy in ``trl.kernels.chunked_logprob``, which stays untouched, so off CUDA the torch fallback still runs.
    """
    if not enabled("completion_logprobs"):
        return
    from trl.kernels import chunked_logprob
    from trl.trainer import utils

    if getattr(utils._use_triton, "dragon_compact", False):
        return
    triton_device = chunked_logprob._use_triton

    @functools.wraps(triton_device)
    def compact_everywhere(device) -> bool:
        return device.type in ("cpu", "mps") or triton_device(device)

    compact_everywhere.dragon_compact = True
    utils._use_triton = compact_everywhere


def contiguous_lm_head_input(model) -> None:
    """Give the LM head contiguous inputs; see ``contiguous_lm_head`` above. Costs one small copy per forward."""
    if not enabled("contiguous_lm_head"):
        return
    head = model.get_output_embeddings()
    if head is None or getattr(head, "dragon_contiguous", False):
        return
    head.register_forward_pre_hook(lambda module, args: (args[0].contiguous(), *args[1:]) if args else None)
    head.dragon_contiguous = True


@contextlib.contextmanager
def sampling_mode(model):
    """The model in eval mode while it samples completions (see ``sampling_without_dropout``), then as it was."""
    was_training = model.training
    if enabled("sampling_without_dropout"):
        model.eval()
    try:
        yield
    finally:
        model.train(was_training)
