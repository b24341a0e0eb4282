"""The LM head: TRL's fused log-prob head, and the head's input during generation.

- ``completion_logprobs``: TRL's fused log-prob head scores only completion tokens on CUDA/XPU, but on other devices
  it scores every prompt token too and throws the results away (fixed tile shapes suit graph compilers such as
  Neuron's). An eager CPU or Apple GPU has no such compiler, so Dragon scores completion tokens there as well; with
  prompts three times longer than completions that is three quarters of the LM head's work in the reference pass,
  the policy pass and the backward. The log-probs are the same numbers.
- ``contiguous_lm_head``: generation's first forward slices the last position of every prompt before the LM head.
  The slice is not contiguous, and with a frozen LM head ``torch.matmul`` then multiplies by one copy of the
  vocabulary matrix per sequence (24 copies, 1.4 GB in bf16) instead of a single matrix product. A contiguous
  input gives the same logits.
- ``cache_sized_logprob_tiles``: TRL's fused log-prob head folds the vocabulary into a running log-sum-exp in tiles
  of 32,768 columns. On the CPU each tile (40 MB for 311 tokens in float32) then goes through a dozen elementwise
  passes in main memory, each on freshly allocated pages. Tiles of 4,096 columns stay in the cache: the head's
  forward and backward take 40 % less time, with the same arithmetic in a different order.
- ``lean_logprob_head``: TRL's CPU fold of the log-prob head (written for devices without Triton) makes a dozen
  passes over every tile, each into a fresh tensor, and its backward copies every tile of logit gradients and of the
  head to float32 for a float32 matmul, so that no tile's product is rounded to bf16 before the sum. Dragon's
  version folds into reused buffers with the same operations (log-probs and entropy bit-identical), and in bf16 the
  backward collects the gradients of a block of rows over the whole vocabulary and multiplies once: the matmul
  accumulates all of it in float32 and rounds once, like TRL's float32 sum rounded to the bf16 the model gets
  back. In bf16 the head's forward plus backward takes half the time. With a trained LM head (full fine-tuning),
  a bias, soft-capping or other outputs, TRL's function runs.

The TRL replacements last while TRL scores (``trainer_hooks.scoring_mode``); the hook belongs to the loaded model.
"""

from __future__ import annotations

import functools
import math

from .registry import enabled, falls_back, replaced_while_open

CPU_LOGPROB_TILE = 4096  # vocabulary columns per tile of the fused log-prob head on the CPU
LOGIT_GRADIENT_BLOCK_BYTES = 64 << 20  # the lean head's low-precision logit gradients held at once (rows x vocabulary)


def completion_tokens_only():
    """A block in which TRL's fused log-prob head skips prompt positions on the CPU and MPS too, not only on Triton
    devices (``completion_logprobs``).

    TRL decides per call with ``trl.trainer.utils._use_triton(device)``; the Triton kernels themselves are chosen
    by the copy in ``trl.kernels.chunked_logprob``, which stays untouched, so off CUDA the torch fallback still runs.
    """
    from trl.trainer import utils

    def compact_everywhere(triton_device):
        @functools.wraps(triton_device)
        def compact(device) -> bool:
            return device.type in ("cpu", "mps") or triton_device(device)

        return compact

    return replaced_while_open(utils, "_use_triton", compact_everywhere)


def cpu_logprob_head():
    """A block in which TRL's fused log-prob head on CPU tensors runs through ``lean_logprob_head`` or
    ``cache_sized_logprob_tiles``; GPUs, and whatever the lean head does not cover, keep TRL's function.

    TRL passes its tile width to ``_ChunkedLogProbFunction.apply`` on every call, so the function is wrapped rather
    than the module constant changed: a CUDA run in the same process still gets TRL's own tiles. Which speed-ups
    apply is read on each call, so ``speedups.choose`` can rule either out in a running process.
    """
    from trl.trainer import utils

    def on_the_cpu(trl_function):
        class CpuLogProbHead:
            @staticmethod
            def apply(hidden, weight, bias, targets, temperature, chunk_size, softcap=None, logit_scale=1.0,
                      outputs=("log_probs",)):
                if hidden.device.type == "cpu":
                    if enabled("lean_logprob_head") and bias is None and softcap is None and not weight.requires_grad \
                            and set(outputs) <= {"log_probs", "entropy"}:
                        factor = logit_scale * (1 / temperature)  # TRL's two factors: exact when logit_scale is 1
                        logprobs, entropy = lean_logprob_head_class().apply(hidden, weight, targets, factor,
                                                                            "entropy" in outputs)
                        return logprobs, entropy, None, None, None
                    if enabled("cache_sized_logprob_tiles"):
                        chunk_size = min(chunk_size, CPU_LOGPROB_TILE)
                return trl_function.apply(hidden, weight, bias, targets, temperature, chunk_size, softcap,
                                          logit_scale, outputs)

        return CpuLogProbHead

    return replaced_while_open(utils, "_ChunkedLogProbFunction", on_the_cpu)


@falls_back("contiguous_lm_head")
def contiguous_lm_head_input(model) -> None:
    """Give the LM head of ``model`` contiguous inputs (``contiguous_lm_head``), for the model's life: one small copy
    per forward."""
    if not enabled("contiguous_lm_head"):
        return
    head = model.get_output_embeddings()
    if head is None or getattr(head, "dragon_contiguous", False):
        return
    head.register_forward_pre_hook(lambda module, args: (args[0].contiguous(), *args[1:]) if args else None)
    head.dragon_contiguous = True


@functools.cache
def lean_logprob_head_class():
    """The ``LeanLogProbHead`` autograd function (made on first use, like the other torch classes here)."""
    import torch

    def tile_logits(hidden, weight, start, cols, factor, product, logits):
        """``hidden @ weight[start:start+cols].T`` in the compute dtype, as float32 ``logits`` times ``factor``."""
        out = product[:, :cols]
        torch.mm(hidden, weight[start:start + cols].to(hidden.dtype).t(), out=out)
        z = logits[:, :cols]
        if logits is not product:
            z.copy_(out)
        if factor != 1.0:
            z.mul_(factor)
        return z

    class LeanLogProbHead(torch.autograd.Function):
        """Log-probabilities of ``targets`` (and the entropy) under ``softmax(factor * hidden @ weight.T)``, folded
        over cache-sized tiles of the vocabulary into reused buffers: TRL's CPU fold with its arithmetic, in fewer
        passes. In bf16/fp16 the backward writes the logits' gradients of a block of rows into one buffer and
        multiplies it by the head once, accumulating over the whole vocabulary in the matmul's float32 (no rounding
        per tile), instead of TRL's float32 copies and float32 matmul per tile."""

        @staticmethod
        def forward(ctx, hidden, weight, targets, factor, with_entropy):
            compute = torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else hidden.dtype
            h = hidden.to(compute)
            n, vocab = h.shape[0], weight.shape[0]
            width = min(CPU_LOGPROB_TILE, vocab)
            running_max = torch.full((n,), -math.inf)
            sum_exp, x_sum_exp, target_logit = torch.zeros(n), torch.zeros(n), torch.zeros(n)
            product = torch.empty(n, width, dtype=compute)
            logits = product if compute == torch.float32 else torch.empty(n, width)
            exps, rows = torch.empty(n, width), torch.arange(n)
            for start in range(0, vocab, width):
                cols = min(width, vocab - start)
                z = tile_logits(h, weight, start, cols, factor, product, logits)
                new_max = torch.maximum(running_max, z.amax(-1))
                rescale = (running_max - new_max).exp_()
                e = torch.sub(z, new_max.unsqueeze(-1), out=exps[:, :cols]).exp_()
                sum_exp.mul_(rescale).add_(e.sum(-1))
                if with_entropy:
                    x_sum_exp.mul_(rescale).add_(e.mul_(z).sum(-1))
                running_max = new_max
                local = targets - start
                inside = (local >= 0) & (local < cols)
                target_logit[inside] = z[rows[inside], local[inside]]
            log_z = running_max + sum_exp.log()
            entropy = log_z - x_sum_exp / sum_exp if with_entropy else None
            ctx.save_for_backward(hidden, weight, targets, log_z, log_z if entropy is None else entropy)
            ctx.factor, ctx.compute = factor, compute
            ctx.set_materialize_grads(False)  # an entropy logged but not trained on brings no gradient work
            return target_logit - log_z, entropy

        @staticmethod
        def backward(ctx, grad_logprobs, grad_entropy):
            hidden, weight, targets, log_z, entropy = ctx.saved_tensors
            if grad_logprobs is None and grad_entropy is None:
                return None, None, None, None, None
            factor, compute = ctx.factor, ctx.compute
            h = hidden.to(compute)
            n, vocab = h.shape[0], weight.shape[0]
            width = min(CPU_LOGPROB_TILE, vocab)
            g = None if grad_logprobs is None else grad_logprobs.float() * factor
            g_entropy = None if grad_entropy is None else grad_entropy.float() * factor
            low = compute != torch.float32
            block = max(1, min(n, LOGIT_GRADIENT_BLOCK_BYTES // (vocab * h.element_size())) if low else n)
            product = torch.empty(block, width, dtype=compute)
            logits = torch.empty(block, width) if low else product
            probs = torch.empty(block, width)
            logit_grads = torch.empty(block, vocab, dtype=compute) if low else None
            grad_hidden = torch.zeros(n, h.shape[1], dtype=compute)
            for first in range(0, n, block):
                last = min(first + block, n)
                m, rows = last - first, torch.arange(last - first)
                for start in range(0, vocab, width):
                    cols = min(width, vocab - start)
                    log_p = tile_logits(h[first:last], weight, start, cols, factor, product[:m], logits[:m])
                    log_p.sub_(log_z[first:last].unsqueeze(-1))
                    p = torch.exp(log_p, out=probs[:m, :cols])
                    if g_entropy is not None:  # d entropy / dz = -p (log p + entropy)
                        log_p.add_(entropy[first:last].unsqueeze(-1)).mul_(p).mul_(-g_entropy[first:last].unsqueeze(-1))
                    if g is None:
                        grad = log_p
                    else:  # d log p(target) / dz = 1[target] - p
                        grad = p.mul_(-g[first:last].unsqueeze(-1))
                        if g_entropy is not None:
                            grad.add_(log_p)
                        local = targets[first:last] - start
                        inside = (local >= 0) & (local < cols)
                        grad[rows[inside], local[inside]] += g[first:last][inside]
                    if low:
                        logit_grads[:m, start:start + cols].copy_(grad)
                    else:
                        grad_hidden[first:last].addmm_(grad, weight[start:start + cols])
                if low:
                    torch.mm(logit_grads[:m], weight.to(compute), out=grad_hidden[first:last])
            return grad_hidden.to(hidden.dtype), None, None, None, None

    return LeanLogProbHead


