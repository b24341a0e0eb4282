"""How the trainer samples completions: in eval mode, and with a faster draw of each token.

- ``sampling_without_dropout``: TRL samples completions with the model in training mode, so every token of every
  completion pays for adapter dropout masks, and the completions come from a randomly thinned policy rather than
  the one whose log-probs are trained. Dragon samples in eval mode, as TRL's vLLM path already does.
- ``inverse_cdf_sampling``: ``torch.multinomial`` on the CPU draws one exponential random number per vocabulary
  entry per sequence per token (49,152 x 24 each time for SmolLM2). While the trainer samples, Dragon draws one
  uniform number per sequence and looks it up in the cumulative distribution (float64, so even the rarest token keeps
  its probability): the same distribution, 30 times faster.

Both last while the trainer samples (``trainer_hooks.sampling_mode``): the model's mode is put back, and
``torch.multinomial`` is torch's own again once no thread samples.
"""

from __future__ import annotations

import contextlib
import functools
import threading

from .registry import replaced_while_open

_sampling = threading.local()  # .active: this thread is inside inverse_cdf_sampler


@contextlib.contextmanager
def eval_mode(model):
    """``model`` in eval mode inside the block (``sampling_without_dropout``), in the mode it had after."""
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)


@contextlib.contextmanager
def inverse_cdf_sampler():
    """``torch.multinomial`` routed through :func:`inverse_cdf_multinomial` while the block runs, torch's own again
    after the last such block ends (in any thread). The replacement only acts on the threads inside such a block;
    every other call gets torch's own function."""
    import torch

    def routed(torch_multinomial):
        return functools.wraps(torch_multinomial)(functools.partial(inverse_cdf_multinomial,
                                                                    torch_multinomial=torch_multinomial))

    was_sampling = getattr(_sampling, "active", False)
    with replaced_while_open(torch, "multinomial", routed):
        _sampling.active = True
        try:
            yield
        finally:
            _sampling.active = was_sampling



def inverse_cdf_multinomial(input, num_samples, replacement=False, *, generator=None, out=None, torch_multinomial):
    """One draw per row of a CPU probability table: a uniform number looked up in the float64 cumulative sums.

    Only the case generation needs (one sample, no ``out=``) on the sampling thread takes this path; anything else,
    including a row that is not a distribution (NaN, infinite or all zero), goes to ``torch_multinomial``, which
    keeps torch's own error messages.
    """
    import torch

    if getattr(_sampling, "active", False) and num_samples == 1 and out is None and input.device.type == "cpu" \
            and input.dim() in (1, 2) and input.is_floating_point():
        cumulative = input.to(torch.float64).cumsum(-1)
        totals = cumulative[..., -1:]
        if bool(torch.isfinite(totals).all()) and bool((totals > 0).all()):
            targets = torch.rand(totals.shape, dtype=torch.float64, generator=generator) * totals
            # right=True: a token of probability zero has an empty interval and is never drawn
            return torch.searchsorted(cumulative, targets, right=True).clamp_(max=input.shape[-1] - 1)
    return torch_multinomial(input, num_samples, replacement, generator=generator, out=out)
