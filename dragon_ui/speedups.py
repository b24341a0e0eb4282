"""Faster GRPO steps that learn the same thing: eleven fixes to how TRL 1.16, PEFT and transformers 5 run a step.

Each one was found with the profiler and is measured before and after by ``bench/speedups.py``; docs/performance.md
has the figures. They are on by default; ``DRAGON_UI_SPEEDUPS`` names the ones to use
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
- ``sparse_dropout``: PEFT's adapter dropout draws one Bernoulli number per input element, for every adapted layer
  (210 times per forward pass of SmolLM2), and the CPU's ``bernoulli_`` is slow: it was a tenth of the step. With a
  dropout rate of 5 %, Dragon draws only the dropped positions, as geometric gaps between them: the same iid
  Bernoulli mask, from 20 times fewer random numbers, and it keeps 8-byte positions of 5 % of the elements for the
  backward instead of a byte per element.
- ``inverse_cdf_sampling``: ``torch.multinomial`` on the CPU draws one exponential random number per vocabulary
  entry per sequence per token (49,152 x 24 each time for SmolLM2). While the trainer samples, Dragon draws one
  uniform number per sequence and looks it up in the cumulative distribution (float64, so even the rarest token keeps
  its probability): the same distribution, 30 times faster.
- ``short_sequence_attention``: torch's fused CPU attention (SDPA) is slow in bf16 at GRPO's short lengths: its
  backward alone took 14 ms per layer for 24 sequences of 60 tokens. The plain formula (the model's own "eager"
  attention, two matmuls and a float32 softmax) is 2-3.5 times faster there, but it keeps every attention matrix
  for the backward, so Dragon uses it only for bf16/fp16 on the CPU while those matrices stay small (up to 4 M
  entries per layer: 24 sequences of 130 tokens with SmolLM2's 9 heads); longer sequences keep SDPA. Decoding one
  token at a time keeps SDPA too, but with an explicit all-true mask whenever transformers passes none: torch's
  kernel then takes a path 5 times faster in bf16 (0.14 instead of 0.7 ms per layer for 24 sequences). The same
  attention either way.
- ``cache_sized_logprob_tiles``: TRL's fused log-prob head folds the vocabulary into a running log-sum-exp in tiles
  of 32,768 columns. On the CPU each tile (40 MB for 311 tokens in float32) then goes through a dozen elementwise
  passes in main memory, each on freshly allocated pages. Tiles of 4,096 columns stay in the cache: the head's
  forward and backward take 40 % less time, with the same arithmetic in a different order.
- ``lean_adapter_layers``: PEFT's LoRA layer keeps fp32 adapters next to a bf16 model, so under autocast every
  adapted layer copies its input to fp32, drops it out in fp32, and autocast copies it back to bf16 for the
  matmul; the backward repeats the copies, and each layer goes through four module calls. Dragon's layer drops the
  bf16 input out directly (the same numbers: torch multiplies bf16 in fp32 and rounds once) and calls the matmuls
  itself: a layer's forward and backward are a third faster, with bit-identical outputs and gradients. Where LoRA's
  scaling is a power of two (alpha = 2r, the usual choice) it scales the rank-r middle rather than the layer's wide
  output, forward and backward: again the same bits, from r numbers per token (16 in the recipes) instead of up to
  1,536. Anything unusual (several active adapters, DoRA and other variants, hooks, GPUs, extra arguments) goes
  through PEFT.
- ``lean_logprob_head``: TRL's CPU fold of the log-prob head (written for devices without Triton) makes a dozen
  passes over every tile, each into a fresh tensor, and its backward copies every tile of logit gradients and of the
  head to float32 for a float32 matmul, so that no tile's product is rounded to bf16 before the sum. Dragon's
  version folds into reused buffers with the same operations (log-probs and entropy bit-identical), and in bf16 the
  backward collects the gradients of a block of rows over the whole vocabulary and multiplies once: the matmul
  accumulates all of it in float32 and rounds once, like TRL's float32 sum rounded to the bf16 the model gets
  back. In bf16 the head's forward plus backward takes half the time. With a trained LM head (full fine-tuning),
  a bias, soft-capping or other outputs, TRL's function runs.
- ``merged_sampling``: while the trainer samples, each lean LoRA layer multiplies by a copy of its weight with the
  adapter merged in (W + scaling * B @ A, computed in float32 and rounded once), made when sampling starts and
  dropped when it ends: one matmul per layer per token instead of three, and none of the adapters' casts and adds.
  It is the same policy up to rounding (in bf16, the merged weight's), as TRL's vLLM path samples from merged
  weights too; the log-probs that are trained still come from the unmerged layers. The copy takes the adapted
  weights' size again (214 MB for SmolLM2-135M in bf16), so it is made only where that is at most a quarter of the
  free memory.
- ``shared_prompts``: TRL gives each completion of a group its own copy of the group's prompt, so sampling's first
  forward and the reference pass run every prompt through the model once per completion (6 times in the recipes),
  although the copies compute the same keys and values each time: a prompt's tokens never see the completions, and
  nothing drops out in those passes. Dragon runs each distinct prompt once, hands its keys and values to every
  completion of the group, and runs only the rest on top: the same attention over the same keys, positions and
  masks, for a third of the rows in the recipes (prompts are three times longer than completions). The policy pass
  shares prompts the same way when nothing in the model drops out (``lora.dropout: 0``), gradients included; with
  dropout every copy of a prompt draws masks of its own, so it keeps its copies.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.metadata
import inspect
import logging
import math
import os
import sys
import threading

from .engine.hardware import system_memory_gb
from .errors import ConfigError, describe

log = logging.getLogger(__name__)

# What each speed-up replaces, and the library versions it was verified against (bit-identity and distribution tests,
# bench/speedups.py). Outside them it stays off and the library's own code runs: an internal renamed upstream would
# otherwise fail every run, or silently change what a speed-up does.
TORCH, TRL, TRANSFORMERS, PEFT = (("torch", ">=2.13,<2.14"), ("trl", ">=1.16,<1.17"),
                                  ("transformers", ">=5.24,<5.25"), ("peft", ">=0.21,<0.22"))
VERIFIED: dict[str, dict[str, str]] = {
    "completion_logprobs": dict([TRL]),  # trl.trainer.utils._use_triton
    "contiguous_lm_head": dict([TORCH, TRANSFORMERS]),  # a pre-hook on the output embeddings
    "sampling_without_dropout": dict([TRL]),  # GRPOTrainer._generate_single_turn
    "sparse_dropout": dict([TORCH, PEFT]),  # LoRA layers' lora_dropout entries
    "inverse_cdf_sampling": dict([TORCH, TRANSFORMERS]),  # torch.multinomial while generate samples
    "short_sequence_attention": dict([TORCH, TRANSFORMERS]),  # the model's attention functions
    "cache_sized_logprob_tiles": dict([TRL]),  # trl.trainer.utils._ChunkedLogProbFunction
    "lean_adapter_layers": dict([TORCH, PEFT]),  # the class of LoRA Linear layers
    "lean_logprob_head": dict([TORCH, TRL]),  # trl.trainer.utils._ChunkedLogProbFunction
    "merged_sampling": dict([TORCH, PEFT]),  # the lean LoRA layers' weights while sampling
    "shared_prompts": dict([TORCH, TRANSFORMERS, TRL]),  # cache internals, generate with a pre-filled cache
}
ALL = tuple(VERIFIED)
ENV = "DRAGON_UI_SPEEDUPS"
LIBRARIES = ("torch", "trl", "transformers", "peft", "accelerate", "gradio")
_failed: dict[str, str] = {}  # speed-up -> why it was switched off in this process (it raised while installing)


def enabled(name: str) -> bool:
    """Whether the speed-up ``name`` is on: all are, unless DRAGON_UI_SPEEDUPS lists others (or says ``none``), or
    an installed library is outside the versions it was verified against, or it failed to install."""
    return _chosen(name) and off_reason(name) is None


def _chosen(name: str) -> bool:
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


def off_reason(name: str) -> str | None:
    """Why a chosen speed-up is off anyway (None when it is on); said once in the log."""
    reason = _failed.get(name) or _version_reason(name)
    if reason:
        _say_off(name, reason)
    return reason


@functools.cache
def _say_off(name: str, reason: str) -> None:
    log.info("Speed-up %s is off (%s); the libraries' own code runs instead.", name, reason)


@functools.cache
def _version_reason(name: str) -> str | None:
    from packaging.specifiers import SpecifierSet
    from packaging.version import Version

    for package, verified in VERIFIED[name].items():
        installed = library_version(package)
        if installed is None:
            return f"{package} is not installed"
        if Version(Version(installed).base_version) not in SpecifierSet(verified):  # 2.13.0+cpu counts as 2.13.0
            return f"verified with {package}{verified}, found {installed}"
    return None


@functools.cache
def library_version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def library_versions() -> dict[str, str | None]:
    """The versions a run trained with, for its status.json."""
    return {package: library_version(package) for package in LIBRARIES}


def status() -> dict:
    """{"active": [...], "disabled": {name: reason}} for status.json and the Model & Hardware tab."""
    active, disabled = [], {}
    for name in ALL:
        if not _chosen(name):
            disabled[name] = f"not chosen in {ENV}"
        elif (reason := off_reason(name)) is not None:
            disabled[name] = reason
        else:
            active.append(name)
    return {"active": active, "disabled": disabled}


def switch_off(name: str, exc: BaseException) -> None:
    """A speed-up raised while installing or running: off for the rest of the process, said once, the run goes on."""
    _failed.setdefault(name, f"it raised {describe(exc)}")
    log.warning("Speed-up %s raised %s; it is off from now on and the libraries' own code runs.", name,
                type(exc).__name__, exc_info=exc)


def falls_back(*names: str):
    """An installer that, if it raises, switches its speed-ups off instead of failing the run."""
    def decorate(install):
        @functools.wraps(install)
        def guarded(*args, **kwargs):
            try:
                return install(*args, **kwargs)
            except Exception as exc:  # a library moved: run without this speed-up, never fail the run
                for name in names:
                    switch_off(name, exc)
                return None

        return guarded

    return decorate


def apply_to_loaded_model(model) -> None:
    """The speed-ups that belong to a model as it is loaded (used for evaluation and chat as well as training)."""
    contiguous_lm_head_input(model)
    short_sequence_attention(model)


def apply_to_trl() -> None:
    """The speed-ups that patch TRL itself; call before building a ``GRPOTrainer``."""
    score_completion_tokens_only()
    cpu_logprob_head()


def apply_to_trainer_model(model) -> None:
    """The speed-ups for the adapters TRL has just added to the model (``trainer.model``)."""
    sparse_adapter_dropout(model)
    lean_adapter_layers(model)


@falls_back("completion_logprobs")
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


@falls_back("contiguous_lm_head")
def contiguous_lm_head_input(model) -> None:
    """Give the LM head contiguous inputs; see ``contiguous_lm_head`` above. Costs one small copy per forward."""
    if not enabled("contiguous_lm_head"):
        return
    head = model.get_output_embeddings()
    if head is None or getattr(head, "dragon_contiguous", False):
        return
    head.register_forward_pre_hook(lambda module, args: (args[0].contiguous(), *args[1:]) if args else None)
    head.dragon_contiguous = True


CPU_LOGPROB_TILE = 4096  # vocabulary columns per tile of the fused log-prob head on the CPU
LOGIT_GRADIENT_BLOCK_BYTES = 64 << 20  # the lean head's low-precision logit gradients held at once (rows x vocabulary)


@falls_back("cache_sized_logprob_tiles", "lean_logprob_head")
def cpu_logprob_head() -> None:
    """Route TRL's fused log-prob head on CPU tensors through ``cache_sized_logprob_tiles`` and
    ``lean_logprob_head``; GPUs, and whatever the lean head does not cover, keep TRL's function.

    TRL passes its tile width to ``_ChunkedLogProbFunction.apply`` on every call, so the function is wrapped rather
    than the module constant changed: a CUDA run in the same process still gets TRL's own tiles. Which speed-ups
    apply is read on each call, so ``DRAGON_UI_SPEEDUPS`` can rule either out in a running process.
    """
    if not (enabled("cache_sized_logprob_tiles") or enabled("lean_logprob_head")):
        return
    from trl.trainer import utils

    if getattr(utils._ChunkedLogProbFunction, "dragon_cpu_head", False):
        return

    class CpuLogProbHead:
        dragon_cpu_head = True
        wrapped = utils._ChunkedLogProbFunction

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
            return CpuLogProbHead.wrapped.apply(hidden, weight, bias, targets, temperature, chunk_size, softcap,
                                                logit_scale, outputs)

    utils._ChunkedLogProbFunction = CpuLogProbHead


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


_sampling = threading.local()  # .active: this thread is sampling completions inside sampling_mode


@contextlib.contextmanager
def sampling_mode(model):
    """The model in eval mode while it samples completions (see ``sampling_without_dropout``), this thread's
    ``torch.multinomial`` calls drawing by inverse CDF (see ``inverse_cdf_sampling``), the adapters merged (see
    ``merged_sampling``) and each distinct prompt read once (see ``shared_prompts``); then all as they were."""
    was_training, was_sampling = model.training, getattr(_sampling, "active", False)
    with contextlib.ExitStack() as restore:  # undone in reverse order, whatever happens inside
        if enabled("sampling_without_dropout"):
            model.eval()
        restore.callback(model.train, was_training)
        if enabled("inverse_cdf_sampling"):
            try:
                restore.enter_context(inverse_cdf_sampler())
                _sampling.active = True
            except Exception as exc:  # torch moved: sample with its own multinomial
                switch_off("inverse_cdf_sampling", exc)
        restore.callback(setattr, _sampling, "active", was_sampling)
        for module in (merge_adapters_for_sampling(model) or []) if enabled("merged_sampling") else []:
            restore.callback(setattr, module, "sampling_weight", None)
        restore.enter_context(shared_prompt_prefill(model))
        yield


MERGED_SAMPLING_MEMORY_SHARE = 0.25  # of the machine's free memory, at most, for the merged copy of the weights


@falls_back("merged_sampling")
def merge_adapters_for_sampling(model) -> list:
    """Give each lean LoRA layer of ``model`` a ``sampling_weight``, its weight with the adapter merged in, for the
    no-grad eval-mode forwards of sampling (see ``merged_sampling``); returns the layers, whose weights the caller
    drops afterwards. Nothing is merged where the copies would take more than ``MERGED_SAMPLING_MEMORY_SHARE`` of
    the free memory, or in training mode, where the adapters' dropout must apply."""
    import torch

    if model.training or not enabled("lean_adapter_layers"):
        return []
    layers = [module for module in model.modules() if type(module) is lean_lora_class()
              and module._lean_applies(module.base_layer.weight) and not module.disable_adapters]
    needed_gb = sum(layer.base_layer.weight.nbytes for layer in layers) / 2**30
    free_gb = system_memory_gb()
    if not layers or free_gb is None or needed_gb > MERGED_SAMPLING_MEMORY_SHARE * free_gb:
        return []
    with torch.no_grad():
        for layer in layers:
            name = layer.active_adapters[0]
            weight, a, b = layer.base_layer.weight, layer.lora_A[name].weight, layer.lora_B[name].weight
            # W + scaling * B @ A in float32 (adapters train in float32), rounded once to the weight's dtype
            layer.sampling_weight = torch.addmm(weight.float(), b.float(), a.float(), alpha=layer.scaling[name]) \
                .to(weight.dtype)
    return layers


@contextlib.contextmanager
def shared_prompts(model, prompt_length: int):
    """While TRL scores ``prompt_length`` prompt tokens plus completions with ``model``, its backbone runs each
    distinct prompt once; see ``shared_prompts``. Nothing changes where anything drops out, since each copy of a
    prompt would draw masks of its own, nor under gradient checkpointing with gradients on."""
    backbone = _backbone_of(model)
    if not enabled("shared_prompts") or backbone is None or prompt_length < 1 or _drops_out(model) \
            or _checkpoints_with_gradients(backbone):
        yield
        return
    original = backbone.forward

    def forward(input_ids=None, attention_mask=None, use_cache=None, **kwargs):
        shared = None
        if input_ids is not None and attention_mask is not None and input_ids.device.type == "cpu" \
                and input_ids.size(1) > prompt_length and not any(value is not None for value in kwargs.values()) \
                and enabled("shared_prompts"):  # off once it raised, for the rest of this pass too
            try:
                shared = forward_sharing_prompts(backbone, original, input_ids, attention_mask, prompt_length)
            except Exception as exc:  # transformers' cache moved: every row runs its own prompt, as in TRL
                switch_off("shared_prompts", exc)
        if shared is None:
            shared = original(input_ids=input_ids, attention_mask=attention_mask, use_cache=use_cache, **kwargs)
        return shared

    with _replaced(backbone, "forward", forward):
        yield


@contextlib.contextmanager
def shared_prompt_prefill(model):
    """While the trainer samples, ``model.generate`` reads each distinct prompt once (all but its last token, whose
    logits start the sampling) and gives every completion of the group those keys and values; see
    ``shared_prompts``."""
    import torch

    backbone = _backbone_of(model)
    if not enabled("shared_prompts") or backbone is None or _drops_out(model):
        yield
        return
    original = model.generate

    def generate(*args, input_ids=None, attention_mask=None, **kwargs):
        settings = kwargs.get("generation_config") or model.generation_config
        plain_text = not any(torch.is_tensor(value) for value in kwargs.values()) \
            and not {"cache", "past_key_values", "cache_implementation", "use_cache"} & set(kwargs)
        if plain_text and not args and input_ids is not None and attention_mask is not None \
                and input_ids.device.type == "cpu" and input_ids.size(1) > 1 and settings.use_cache is not False \
                and settings.cache_implementation is None:
            try:
                cache = prefill_sharing_prompts(backbone, input_ids, attention_mask)
            except Exception as exc:  # transformers' cache or generate moved: generate reads every row's prompt
                switch_off("shared_prompts", exc)
                cache = None
            if cache is not None:
                kwargs[_cache_keyword(backbone)] = cache
        return original(*args, input_ids=input_ids, attention_mask=attention_mask, **kwargs)

    with _replaced(model, "generate", generate):
        yield


def prefill_sharing_prompts(backbone, input_ids, attention_mask):
    """A key-value cache of every row's prompt but its last token, each distinct prompt computed once, at the
    positions transformers' ``generate`` gives a left-padded prompt; None where every row has a prompt of its own."""
    distinct_rows = _distinct_prompts(input_ids, attention_mask)
    if distinct_rows is None:
        return None
    positions = (attention_mask.long().cumsum(-1) - 1).masked_fill(attention_mask == 0, 0)
    _, cache = _run_prompts_once(backbone, backbone, *distinct_rows, input_ids=input_ids[:, :-1],
                                 attention_mask=attention_mask[:, :-1], position_ids=positions[:, :-1])
    return cache


def _run_prompts_once(backbone, forward, first_row, row_prompt, **inputs):
    """Run ``forward`` on the first row of each distinct prompt into a new cache, then give every row its prompt's
    keys and values: (the prompts' output, the cache)."""
    from transformers import DynamicCache

    cache = DynamicCache(config=backbone.config)
    output = forward(**{name: value[first_row] for name, value in inputs.items()}, use_cache=True,
                     **{_cache_keyword(backbone): cache})
    for layer in cache.layers:
        layer.batch_select_indices(row_prompt)
    return output, cache


def _distinct_prompts(input_ids, attention_mask):
    """(the first row of each distinct prompt, tokens and padding alike; each row's prompt index), or None where
    every row has a prompt of its own."""
    import torch

    rows = torch.cat([input_ids, attention_mask.to(input_ids.dtype)], dim=1)
    distinct, index = torch.unique(rows, dim=0, return_inverse=True)
    if distinct.size(0) == rows.size(0):
        return None
    first = torch.full((distinct.size(0),), rows.size(0), dtype=torch.long, device=rows.device)
    return first.scatter_reduce_(0, index, torch.arange(rows.size(0), device=rows.device), "amin"), index


def _cache_keyword(backbone) -> str:
    """transformers 5 renamed ``past_key_values`` to ``cache`` (the old name still works until 5.40)."""
    return "cache" if "cache" in inspect.signature(type(backbone).forward).parameters else "past_key_values"


def forward_sharing_prompts(backbone, forward, input_ids, attention_mask, prompt_length: int):
    """``backbone``'s output (from its original ``forward``) for ``input_ids``, with each distinct prompt (tokens
    and padding) run once; None where every row has a prompt of its own.

    The prompts' keys and values go to every row that shares them, and the rest of each row runs on top of them, at
    the positions and under the masks the full rows would have had. Only the hidden states that score the
    completions are returned: the last prompt position's and the completion's; the earlier prompt positions, which
    TRL never scores, are zero.
    """
    import torch
    from transformers.modeling_outputs import BaseModelOutputWithPast

    rows = input_ids.size(0)
    distinct_rows = _distinct_prompts(input_ids[:, :prompt_length], attention_mask[:, :prompt_length])
    if distinct_rows is None:
        return None
    first_row, row_prompt = distinct_rows
    prompt, cache = _run_prompts_once(backbone, forward, first_row, row_prompt, input_ids=input_ids[:, :prompt_length],
                                      attention_mask=attention_mask[:, :prompt_length])
    rest = forward(input_ids=input_ids[:, prompt_length:], attention_mask=attention_mask, use_cache=True,
                   **{_cache_keyword(backbone): cache})
    last_prompt = prompt.last_hidden_state[row_prompt, -1:]
    unscored = last_prompt.new_zeros(rows, prompt_length - 1, last_prompt.size(-1))
    return BaseModelOutputWithPast(last_hidden_state=torch.cat([unscored, last_prompt, rest.last_hidden_state], dim=1))


def _backbone_of(model):
    """The transformer under the LM head that TRL's fused head calls (``base_model``), through PEFT and DDP."""
    model = getattr(model, "module", model)
    if hasattr(model, "get_base_model"):
        model = model.get_base_model()
    backbone = getattr(model, "base_model", None)
    return None if backbone is None or backbone is model else backbone


def _checkpoints_with_gradients(backbone) -> bool:
    """Gradient checkpointing with gradients on: transformers then drops a layer's cache, so a completion run on top
    of its prompt's keys and values would lose them."""
    import torch

    return torch.is_grad_enabled() and any(getattr(module, "gradient_checkpointing", False) and module.training
                                           for module in backbone.modules())


@contextlib.contextmanager
def _replaced(owner, name: str, replacement):
    """``owner.name`` is ``replacement`` inside the block, then what it was (its class's method, or its own)."""
    had_own, original = name in vars(owner), getattr(owner, name)
    setattr(owner, name, replacement)
    try:
        yield
    finally:
        if had_own:
            setattr(owner, name, original)
        else:
            delattr(owner, name)


def _drops_out(model) -> bool:
    """Whether a forward of ``model`` would drop anything out: in training mode, attention dropout or a dropout
    module with a rate, other than the dropouts of switched-off adapters (TRL's reference pass)."""
    import torch

    if not model.training:
        return False
    if getattr(getattr(model, "config", None), "attention_dropout", 0.0):
        return True
    idle = {id(dropout) for module in model.modules() if getattr(module, "disable_adapters", False)
            for dropout in getattr(module, "lora_dropout", {}).values()}
    return any(module.training and module.p > 0 and id(module) not in idle for module in model.modules()
               if isinstance(module, torch.nn.modules.dropout._DropoutNd))


_samplers_lock = threading.Lock()
_samplers = 0  # sampling_mode blocks open now, in any thread: torch.multinomial is replaced while there are any
_torch_multinomial = None  # torch's own function, while it is replaced


@contextlib.contextmanager
def inverse_cdf_sampler():
    """``torch.multinomial`` routed through :func:`inverse_cdf_multinomial` while the block runs, torch's own again
    after the last such block ends. The replacement only acts on the thread that entered ``sampling_mode``; every
    other call, and every other thread, gets torch's own function."""
    import torch

    global _samplers, _torch_multinomial
    with _samplers_lock:
        if _samplers == 0:
            _torch_multinomial = torch.multinomial
            torch.multinomial = functools.wraps(_torch_multinomial)(
                functools.partial(inverse_cdf_multinomial, torch_multinomial=_torch_multinomial))
        _samplers += 1
    try:
        yield
    finally:
        with _samplers_lock:
            _samplers -= 1
            if _samplers == 0:
                torch.multinomial, _torch_multinomial = _torch_multinomial, None


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
        sampling_weight = None  # set by merge_adapters_for_sampling while the trainer samples

        def forward(self, x, *args, **kwargs):
            if self.sampling_weight is not None and not (args or kwargs or self.disable_adapters
                                                         or torch.is_grad_enabled()):
                # merge_adapters_for_sampling checked _lean_applies when it made the weight; skipping it per token
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


SHORT_ATTENTION = "dragon_short_sequence"
EAGER_MAX_SCORES = 1 << 22  # attention scores per layer (batch x heads x queries x keys) the eager formula may keep


@falls_back("short_sequence_attention")
def short_sequence_attention(model) -> None:
    """Route a model's attention through :func:`short_sequence_attention_forward`; see ``short_sequence_attention``.

    Only models on SDPA (transformers' default) change; one that asked for eager or flash attention keeps it.
    """
    if not enabled("short_sequence_attention") or getattr(model.config, "_attn_implementation", None) != "sdpa":
        return
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(SHORT_ATTENTION, short_sequence_attention_forward)
    AttentionMaskInterface.register(SHORT_ATTENTION, sdpa_mask)  # SDPA's boolean masks; converted when eager runs
    model.set_attn_implementation(SHORT_ATTENTION)


def short_sequence_attention_forward(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """Attention for bf16/fp16 on the CPU as fast as torch allows there; transformers' SDPA for everything else."""
    import torch
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    batch, heads, queries, _ = query.shape
    keys = key.shape[2]

    def fused(mask):
        return sdpa_attention_forward(module, query, key, value, mask, scaling=scaling, dropout=dropout, **kwargs)

    if query.device.type != "cpu" or query.dtype not in (torch.bfloat16, torch.float16):
        return fused(attention_mask)
    if queries == 1:
        if attention_mask is None:  # torch's CPU kernel decodes one token 5x faster in bf16 when given a mask
            attention_mask = torch.ones(batch, 1, 1, keys, dtype=torch.bool, device=query.device)
        return fused(attention_mask)
    eager = getattr(sys.modules.get(type(module).__module__), "eager_attention_forward", None)
    if eager is None or scaling is None or batch * heads * queries * keys > EAGER_MAX_SCORES:
        return fused(attention_mask)
    if attention_mask is None:  # SDPA's masks leave out a plain causal one
        attention_mask = torch.ones(queries, keys, dtype=torch.bool, device=query.device).tril(keys - queries)
    if attention_mask.dtype == torch.bool:  # eager attention adds its mask to the scores
        attention_mask = torch.zeros(attention_mask.shape, dtype=query.dtype, device=query.device).masked_fill_(
            ~attention_mask, torch.finfo(query.dtype).min)
    return eager(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs)
