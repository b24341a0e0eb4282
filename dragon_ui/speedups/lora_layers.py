"""PEFT's LoRA layers: their dropout, their forward, and their weights while the trainer samples.

- ``sparse_dropout``: PEFT's adapter dropout draws one Bernoulli number per input element, for every adapted layer
  (210 times per forward pass of SmolLM2), and the CPU's ``bernoulli_`` is slow: it was a tenth of the step. With a
  dropout rate of 5 %, Dragon draws only the dropped positions, as geometric gaps between them: the same iid
  Bernoulli mask, from 20 times fewer random numbers, and it keeps 8-byte positions of 5 % of the elements for the
  backward instead of a byte per element.
- ``lean_adapter_layers``: PEFT's LoRA layer keeps fp32 adapters next to a bf16 model, so under autocast every
  adapted layer copies its input to fp32, drops it out in fp32, and autocast copies it back to bf16 for the
  matmul; the backward repeats the copies, and each layer goes through four module calls. Dragon's layer drops the
  bf16 input out directly (the same numbers: torch multiplies bf16 in fp32 and rounds once) and calls the matmuls
  itself: a layer's forward and backward are a third faster, with bit-identical outputs and gradients. Where LoRA's
  scaling is a power of two (alpha = 2r, the usual choice) it scales the rank-r middle rather than the layer's wide
  output, forward and backward: again the same bits, from r numbers per token (16 in the recipes) instead of up to
  1,536. Anything unusual (several active adapters, DoRA and other variants, hooks, GPUs, extra arguments) goes
  through PEFT.
- ``merged_sampling``: while the trainer samples, each lean LoRA layer multiplies by a copy of its weight with the
  adapter merged in (W + scaling * B @ A, computed in float32 and rounded once), made when sampling starts and
  dropped when it ends: one matmul per layer per token instead of three, and none of the adapters' casts and adds.
  It is the same policy up to rounding (in bf16, the merged weight's), as TRL's vLLM path samples from merged
  weights too; the log-probs that are trained still come from the unmerged layers. The copy takes the adapted
  weights' size again (214 MB for SmolLM2-135M in bf16), so it is made only where that is at most a quarter of the
  free memory.

The dropout modules and the layers' class belong to the trainer's model (its adapter file is PEFT's, unchanged);
the merged weights last while the trainer samples.
"""

from __future__ import annotations

import contextlib
import functools
import math

from ..system.memory import system_memory_gb
from .registry import enabled, falls_back

MERGED_SAMPLING_MEMORY_SHARE = 0.25  # of the machine's free memory, at most, for the merged copy of the weights


@contextlib.contextmanager
def merged_for_sampling(model):
    """Each lean LoRA layer of ``model`` samples through its weight with the adapter merged in, for the no-grad
    eval-mode forwards of the block (``merged_sampling``); the merged weights are dropped when it ends. Nothing is
    merged where the copies would take more than ``MERGED_SAMPLING_MEMORY_SHARE`` of the free memory, or in
    training mode, where the adapters' dropout must apply."""
    import torch

    layers = []
    if not model.training and enabled("lean_adapter_layers"):
        layers = [module for module in model.modules() if type(module) is lean_lora_class()
                  and module._lean_applies(module.base_layer.weight) and not module.disable_adapters]
    needed_gb = sum(layer.base_layer.weight.nbytes for layer in layers) / 2**30
    free_gb = system_memory_gb() if layers else None
    if free_gb is None or needed_gb > MERGED_SAMPLING_MEMORY_SHARE * free_gb:
        layers = []
    try:
        with torch.no_grad():
            for layer in layers:
                name = layer.active_adapters[0]
                weight, a, b = layer.base_layer.weight, layer.lora_A[name].weight, layer.lora_B[name].weight
                # W + scaling * B @ A in float32 (adapters train in float32), rounded once to the weight's dtype
                layer.sampling_weight = torch.addmm(weight.float(), b.float(), a.float(), alpha=layer.scaling[name]) \
                    .to(weight.dtype)
        yield
    finally:
        for layer in layers:
            layer.sampling_weight = None


@falls_back("sparse_dropout")
def sparse_adapter_dropout(model) -> None:
    """Swap every adapter dropout of a PEFT model for a ``SparseDropout`` of the same rate; see ``sparse_dropout``."""
    if not enabled("sparse_dropout"):
        return
    import torch

    for module in model.modules():
        dropouts = getattr(module, "lora_dropout", None)
        if isinstance(dropouts, torch.nn.ModuleDict):
            for name, dropout in dropouts.items():
                if type(dropout) is torch.nn.Dropout and dropout.p > 0:
                    dropouts[name] = sparse_dropout_class()(dropout.p)


def dropped_positions(count: int, p: float, generator=None):
    """Flat indices of an iid Bernoulli(p) subset of ``range(count)``, drawn as geometric gaps between them.

    A geometric gap is the number of trials up to the next success, so successive sums of gaps are exactly the
    positions a Bernoulli draw per element would drop. Enough gaps for nearly every case are drawn at once (mean
    plus six standard deviations); the rare shortfall draws more, continuing from the last position. Each gap is
    ceil(ln V / ln(1-p)) for a uniform V in (0, 1], so that P(gap >= k) = (1-p)^(k-1): torch's vectorised float64
    uniforms and logarithm make this twice as fast as its one-at-a-time ``geometric_``.
    """
    import torch

    expected = count * p
    batch = int(expected + 6 * math.sqrt(expected) + 16)
    found, start = [], 0
    while True:
        uniform = torch.rand(batch, dtype=torch.float64, generator=generator).neg_().add_(1.0)  # (0, 1], never 0
        gaps = uniform.log_().div_(math.log1p(-p)).ceil_().clamp_min_(1.0)
        positions = gaps.to(torch.int64).cumsum_(0).add_(start - 1)
        if positions[-1] >= count:
            found.append(positions[positions < count])
            return found[0] if len(found) == 1 else torch.cat(found)
        found.append(positions)
        start = int(positions[-1]) + 1


@functools.cache
def sparse_dropout_class():
    """The ``SparseDropout`` module class (made on first use: importing torch would slow ``import dragon_ui``)."""
    import torch

    class DropPositions(torch.autograd.Function):
        """Scale by 1/(1-p) and zero the dropped positions; the backward zeroes the same positions."""

        @staticmethod
        def forward(ctx, x, p):
            positions = dropped_positions(x.numel(), p)
            out = (x * (1.0 / (1.0 - p))).contiguous()
            out.view(-1).index_fill_(0, positions, 0)
            ctx.save_for_backward(positions)
            ctx.p = p
            return out

        @staticmethod
        def backward(ctx, grad):
            (positions,) = ctx.saved_tensors
            grad = (grad * (1.0 / (1.0 - ctx.p))).contiguous()
            grad.view(-1).index_fill_(0, positions, 0)
            return grad, None

    class SparseDropout(torch.nn.Dropout):
        """``nn.Dropout`` that draws only the dropped positions on the CPU; elsewhere, or in eval mode, the usual."""

        def forward(self, x):
            if not self.training or not self.p or x.device.type != "cpu" or not x.numel():
                return super().forward(x)
            return DropPositions.apply(x, self.p)

    return SparseDropout


@falls_back("lean_adapter_layers")
def lean_adapter_layers(model) -> None:
    """Give every PEFT LoRA ``Linear`` of ``model`` the forward of ``lean_lora_class``; see ``lean_adapter_layers``."""
    if not enabled("lean_adapter_layers"):
        return
    from peft.tuners.lora.layer import Linear

    for module in model.modules():
        if type(module) is Linear:
            module.__class__ = lean_lora_class()


@functools.cache
def lean_lora_class():
    """PEFT's LoRA ``Linear`` with a forward that computes its usual formula without PEFT's per-call overhead."""
    import torch
    import torch.nn.functional as F
    from peft.tuners.lora.layer import Linear

    def exact_in_low_precision(dropout) -> bool:
        """Dropping a bf16/fp16 input out gives the numbers of PEFT's fp32 round trip only where the dropout is
        the identity or Dragon's ``SparseDropout`` (which multiplies by a Python float: computed in fp32, rounded
        once). torch's own dropout draws its mask per dtype, so it keeps the round trip."""
        return not dropout.training or isinstance(dropout, (torch.nn.Identity, sparse_dropout_class()))

    def exact_power_of_two(scaling) -> bool:
        """Multiplying by a power of two changes only the exponent, so it commutes exactly with a matmul's sums and
        roundings (LoRA's usual alpha = 2r gives 2)."""
        return isinstance(scaling, (int, float)) and scaling > 0 and math.frexp(scaling)[0] == 0.5

    class LeanLoraLinear(Linear):
        sampling_weight = None  # set by merged_for_sampling while the trainer samples

        def forward(self, x, *args, **kwargs):
            if self.sampling_weight is not None and not (args or kwargs or self.disable_adapters
                                                         or torch.is_grad_enabled()):
                # merged_for_sampling checked _lean_applies when it made the weight; skipping it per token
                return F.linear(x, self.sampling_weight, self.base_layer.bias)
            if args or kwargs or not self._lean_applies(x):
                return super().forward(x, *args, **kwargs)
            base = self.base_layer
            result = F.linear(x, base.weight, base.bias)
            if self.disable_adapters:
                return result
            name = self.active_adapters[0]
            a, b = self.lora_A[name].weight, self.lora_B[name].weight
            dropout, scaling = self.lora_dropout[name], self.scaling[name]
            autocast = torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else None
            if autocast is not None and x.dtype == autocast != a.dtype and exact_in_low_precision(dropout):
                # PEFT casts x to a's fp32, drops it out, and autocast casts it back to bf16 for the matmul
                x, a, b = dropout(x), a.to(autocast), b.to(autocast)
            else:
                x = dropout(x.to(a.dtype))
            if exact_power_of_two(scaling):
                # the same bits, scaling the rank-r middle instead of the layer's wide output (forward and backward)
                return (result + F.linear(F.linear(x, a) * scaling, b)).to(result.dtype)
            return (result + F.linear(F.linear(x, a), b) * scaling).to(result.dtype)

        def _lean_applies(self, x) -> bool:
            """The plain case this forward reproduces: one vanilla adapter (or none) on a CPU ``nn.Linear``."""
            if x.device.type != "cpu" or self.merged or type(self.base_layer) is not torch.nn.Linear:
                return False
            if not getattr(self, "cast_input_dtype_enabled", True) or _has_hooks(self.base_layer):
                return False
            if self.disable_adapters:
                return True
            names = self.active_adapters
            if len(names) != 1 or names[0] not in self.lora_A or names[0] in self.lora_variant:
                return False
            name = names[0]
            return not (_has_hooks(self.lora_A[name]) or _has_hooks(self.lora_B[name])
                        or self.lora_A[name].bias is not None or self.lora_B[name].bias is not None)

    return LeanLoraLinear


def _has_hooks(module) -> bool:
    return bool(module._forward_hooks or module._forward_pre_hooks or module._backward_hooks
                or module._backward_pre_hooks)
