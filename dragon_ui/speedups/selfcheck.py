"""Each speed-up's self-check: the identity its tests prove, proved again on the libraries this machine has.

A check computes the same thing twice on a tiny Llama built in memory, once through the libraries' own code and once
through the speed-up (only that one on, in the checking thread: ``registry.checking``), and compares the two as
tests/test_speedups.py does: the same log-probs, entropies, logits, gradients and generations, or the same
distribution of draws. All eleven take a few seconds, run once per set of library versions (``registry.stack``),
and their results are kept in the cache folder. A speed-up whose check failed stays off, with the check's sentence;
one outside the versions CI verified is on once its check passed here.

``start`` runs them in the background (a run, while it loads its model); ``ensure`` waits for them (before a loaded
model gets its speed-ups, so also in the app's warm-up); ``run`` runs them now (``dragon speedups --verify``). A
caller in a thread of its own imports the libraries first (engine.libraries: transformers' lazy imports are not
thread-safe). The random number generator's state is put back after each check.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import threading
import time
from collections.abc import Callable

from ..errors import describe
from ..system.disk import cache_dir
from . import lm_head, lora_layers, sampling, shared_prompts
from .attention import short_sequence_attention
from .registry import ALL, checking, record_self_checks, self_checks, stack_key

log = logging.getLogger("dragon_ui.speedups")


class Mismatch(AssertionError):
    """The speed-up computed something else than the libraries' own code: its sentence says what."""


CHECKS: dict[str, Callable[[], None]] = {}


def _check(name: str):
    def register(check: Callable[[], None]) -> Callable[[], None]:
        CHECKS[name] = check
        return check

    return register


# merged_sampling merges the lean adapter layers' weights: it has nothing to merge without them.
CHECKED_TOGETHER = {"merged_sampling": ("lean_adapter_layers", "merged_sampling")}

def run(names: tuple[str, ...] = ALL) -> dict[str, dict]:
    """Run the checks of ``names`` now, keep and return {name: {"passed", "why", "seconds"}}."""
    import torch

    results = {}
    for name in names:
        started = time.perf_counter()
        try:
            with torch.random.fork_rng(devices=[]), checking(CHECKED_TOGETHER.get(name, (name,))):
                torch.manual_seed(0)
                CHECKS[name]()
            passed, why = True, None
        except Exception as exc:  # noqa: BLE001 - a library that moved fails the check in any way: that is the answer
            passed, why = False, _sentence(exc)
            log.warning("Speed-up %s failed its self-check (%s); it stays off.", name, why)
        results[name] = {"passed": passed, "why": why, "seconds": round(time.perf_counter() - started, 2)}
    record_self_checks(results)
    return results


LOCK_WAIT_S = 120  # for another process's checks of the same versions, then this one checks on its own
_lock = threading.Lock()
_running: threading.Thread | None = None


def start() -> None:
    """Run the checks in a background thread unless this machine has their results for these versions."""
    global _running
    with _lock:
        if _running is not None or not missing():
            return
        _running = threading.Thread(target=_run_missing, name="dragon-speedup-checks", daemon=True)
        _running.start()


def ensure() -> None:
    """Return once every speed-up's check has a result for these versions, running the missing ones if no other
    thread is; a few seconds once per set of versions, nothing afterwards."""
    start()
    thread = _running
    if thread is not None and thread is not threading.current_thread():
        thread.join()


def missing(reread: bool = False) -> tuple[str, ...]:
    results = self_checks(reread)
    return tuple(name for name in ALL if name not in results)


def _run_missing() -> None:
    global _running
    try:
        from filelock import Timeout

        try:  # one process checks; the others then read its results
            with _one_process_at_a_time():
                if names := missing(reread=True):
                    started = time.monotonic()
                    results = run(names)
                    log.info("Self-checked %d speed-ups on %s in %.1f s: %d passed.", len(results), stack_key(),
                             time.monotonic() - started, sum(r["passed"] for r in results.values()))
        except (Timeout, OSError) as exc:  # another process's checks hang, or the cache folder is read-only
            log.warning("The speed-ups' self-checks run without their lock (%s).", describe(exc))
            run(missing())
    except Exception:  # noqa: BLE001 - checking is a precaution; without results the unverified stay off
        log.exception("The speed-ups' self-checks could not run")
    finally:
        with _lock:
            _running = None


def _one_process_at_a_time():
    from filelock import FileLock

    cache_dir().mkdir(parents=True, exist_ok=True)
    return FileLock(str(cache_dir() / "speedup_checks.lock"), timeout=LOCK_WAIT_S)


def _sentence(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    first = text[0] if text else ""
    return first if isinstance(exc, Mismatch) else f"it raised {type(exc).__name__}: {first}"[:300]


def _same(got, want, what: str, rtol: float = 0.0, atol: float = 0.0) -> None:
    """``got`` equals ``want`` (within the tolerances), else a Mismatch naming ``what`` and by how much."""
    import torch

    if got.shape != want.shape:
        raise Mismatch(f"{what} have shape {tuple(got.shape)} instead of {tuple(want.shape)}")
    if rtol == atol == 0.0:
        if not torch.equal(got, want):
            raise Mismatch(f"{what} are not bit-identical (largest difference {_largest(got, want):.3g})")
        return
    if not torch.allclose(got.float(), want.float(), rtol=rtol, atol=atol, equal_nan=True):
        raise Mismatch(f"{what} differ by up to {_largest(got, want):.3g} (allowed {atol:g} + {rtol:g} x value)")


def _largest(got, want) -> float:
    return (got.float() - want.float()).abs().nan_to_num(float("inf")).max().item() if got.numel() else 0.0


def _expect(condition: bool, sentence: str) -> None:
    if not condition:
        raise Mismatch(sentence)


def _tiny_model(dtype=None, vocab_size: int = 101):
    """A two-layer Llama of hidden size 16 with random weights (tied head, as SmolLM2), on transformers' SDPA, in
    eval mode as a loaded model is."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=vocab_size, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=128, pad_token_id=0,
                         eos_token_id=1, bos_token_id=None, tie_word_embeddings=True,
                         attn_implementation="sdpa")  # type: ignore[call-arg]  # taken through **kwargs
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).to(dtype or torch.float32).eval()  # type: ignore[arg-type]  # as loaded
    model.generation_config.pad_token_id, model.generation_config.eos_token_id = 0, 1
    return model


def _ids(rows: int, length: int, vocab_size: int, seed: int):
    import torch

    return torch.randint(5, vocab_size, (rows, length), generator=torch.Generator().manual_seed(seed))


def _grouped_batch(vocab_size: int, prompt_len: int = 9, completion_len: int = 5, groups: int = 2, group_size: int = 3):
    """A GRPO batch: left-padded prompts, each repeated for ``group_size`` completions, one of them cut short."""
    import torch

    prompts = _ids(groups, prompt_len, vocab_size, 10)
    prompt_mask = torch.ones_like(prompts)
    prompt_mask[0, :3] = 0
    rows = groups * group_size
    input_ids = torch.cat([prompts.repeat_interleave(group_size, 0), _ids(rows, completion_len, vocab_size, 11)], 1)
    attention_mask = torch.cat([prompt_mask.repeat_interleave(group_size, 0),
                                torch.ones(rows, completion_len, dtype=torch.long)], dim=1)
    attention_mask[1, -2:] = 0
    labels = input_ids.masked_fill(attention_mask == 0, -100)
    labels[:, :prompt_len] = -100
    return input_ids, attention_mask, labels


def _scored(model, completion=slice(None), **inputs):
    """TRL's fused head's log-probs and entropies of the ``completion`` positions of ``inputs``, and the parameters'
    gradients of their sum, as TRL's loss takes them."""
    model.zero_grad(set_to_none=True)
    out = model(**inputs, fused_lm_head=True)
    (out.log_probs.sum() + out.entropy[:, completion].sum()).backward()
    return (out.log_probs[:, completion].detach(), out.entropy[:, completion].detach(),
            [p.grad for p in model.parameters() if p.grad is not None])


def _same_scores(got, want, what: str, rtol: float, atol: float) -> None:
    _same(got[0], want[0], f"{what}: log-probs", rtol, atol)
    _same(got[1], want[1], f"{what}: entropies", rtol, atol)
    _expect(len(got[2]) == len(want[2]), f"{what}: {len(got[2])} parameters got gradients instead of {len(want[2])}")
    for got_grad, want_grad in zip(got[2], want[2]):
        _same(got_grad, want_grad, f"{what}: gradients", rtol * 10, atol)


@_check("completion_logprobs")
def _completion_logprobs() -> None:
    from trl.trainer import utils
    from trl.trainer.utils import add_fused_lm_head

    model = _tiny_model()
    add_fused_lm_head(model, temperature=0.8, outputs=("log_probs", "entropy"))
    input_ids = _ids(3, 12, model.config.vocab_size, 0)
    attention_mask = input_ids.new_ones(input_ids.shape)
    attention_mask[0, :3] = 0
    labels = input_ids.masked_fill(attention_mask == 0, -100)
    labels[:, :-5] = -100
    inputs = dict(input_ids=input_ids, attention_mask=attention_mask, labels=labels, completion=slice(-5, None))
    trls = utils._use_triton
    every_position = _scored(model, **inputs)
    with lm_head.completion_tokens_only():
        completions_only = _scored(model, **inputs)
    _expect(utils._use_triton is trls, "TRL's _use_triton was not put back after the block")
    _same_scores(completions_only, every_position, "completion-only scoring", 1e-5, 1e-6)


@_check("contiguous_lm_head")
def _contiguous_lm_head() -> None:
    import torch

    model = _tiny_model().eval().requires_grad_(False)
    input_ids = _ids(4, 9, model.config.vocab_size, 1)
    hidden = torch.randn(4, 9, model.config.hidden_size)[:, -1:, :]  # the slice generation hands the head
    with torch.no_grad():
        logits, generated = model.lm_head(hidden), model.generate(input_ids=input_ids, max_new_tokens=6,
                                                                  do_sample=False)
        lm_head.contiguous_lm_head_input(model)
        _expect(bool(model.lm_head._forward_pre_hooks), "no hook was added to the LM head")
        _same(model.lm_head(hidden), logits, "the LM head's logits", 1e-6, 1e-6)
        _same(model.generate(input_ids=input_ids, max_new_tokens=6, do_sample=False), generated, "greedy replies")


@_check("sampling_without_dropout")
def _sampling_without_dropout() -> None:
    from .trainer_hooks import sampling_mode

    model = _tiny_model().train()
    with sampling_mode(model):
        _expect(not any(module.training for module in model.modules()), "the model samples in training mode")
    _expect(all(module.training for module in model.modules()), "the training mode was not put back")


@_check("sparse_dropout")
def _sparse_dropout() -> None:
    import torch

    dropout = lora_layers.sparse_dropout_class()(0.3).train()
    out = dropout(torch.ones(400, 500))
    dropped = (out == 0).float()
    _expect(abs(dropped.mean().item() - 0.3) < 0.005, f"it drops {dropped.mean().item():.3f} of the inputs, not 0.3")
    flat = dropped.flatten()
    neighbours = (flat[1:] * flat[:-1]).mean().item()
    _expect(abs(neighbours - 0.09) < 0.005, f"neighbours are both dropped {neighbours:.3f} of the time, not 0.09")
    kept = out[out != 0]
    _same(kept, torch.full_like(kept, 1 / 0.7), "the kept inputs' scaling", 1e-6, 1e-6)
    x = (torch.rand(6, 7, 9) + 0.5).transpose(0, 2).requires_grad_(True)  # not contiguous, as a slice can be
    weights = torch.randn(9, 7, 6)
    out = dropout(x)
    (out * weights).sum().backward()
    _same(x.grad, torch.where(out == 0, 0.0, weights / 0.7), "the gradients through dropout", 1e-5, 1e-6)


@_check("inverse_cdf_sampling")
def _inverse_cdf_sampling() -> None:
    import torch

    probs = torch.softmax(torch.randn(1, 50, generator=torch.Generator().manual_seed(0)) * 2, dim=-1)
    probs[0, [3, 17, 49]] = 0.0  # cut by top-k or top-p, the last token among them: never to be drawn
    probs /= probs.sum()
    draws = 100_000
    with sampling.inverse_cdf_sampler():
        tokens = torch.multinomial(probs.expand(draws, -1), num_samples=1)
    _expect(tokens.shape == (draws, 1) and tokens.dtype == torch.int64, "the draws have another shape or type")
    counts = torch.bincount(tokens.squeeze(1), minlength=50)
    _expect(counts[[3, 17, 49]].sum().item() == 0, "tokens of probability zero were drawn")
    expected = probs[0] * draws
    kept = expected > 0
    chi_square = (((counts - expected)[kept] ** 2) / expected[kept]).sum().item()
    # 46 degrees of freedom: a correct sampler exceeds 100 once in a million seeds (and this seed is fixed)
    _expect(chi_square < 100, f"the draws do not follow the distribution (chi-square {chi_square:.0f} > 100)")


@_check("short_sequence_attention")
def _short_sequence_attention() -> None:
    import torch

    sdpa = _tiny_model(torch.bfloat16)
    routed = copy.deepcopy(sdpa)
    short_sequence_attention(routed)
    _expect(routed.config._attn_implementation != sdpa.config._attn_implementation,
            "the model's attention was not routed")
    input_ids = _ids(3, 10, sdpa.config.vocab_size, 2)
    padded = torch.ones_like(input_ids)
    padded[0, :4] = 0
    for attention_mask in (None, padded):
        results = []
        for model in (sdpa, routed):
            model.zero_grad(set_to_none=True)
            logits = model(input_ids=input_ids, attention_mask=attention_mask).logits
            logits.float().square().mean().backward()
            results.append((logits.detach(), model.model.layers[0].self_attn.q_proj.weight.grad))
        keep = slice(None) if attention_mask is None else attention_mask.bool()
        _same(results[1][0][keep], results[0][0][keep], "logits through eager attention", 0.02, 0.02)
        _same(results[1][1], results[0][1], "gradients through eager attention", 0.05, 1e-3)


@_check("cache_sized_logprob_tiles")
def _cache_sized_logprob_tiles() -> None:
    from trl.trainer import utils
    from trl.trainer.utils import add_fused_lm_head

    model = _tiny_model(vocab_size=lm_head.CPU_LOGPROB_TILE + 37)  # two tiles, the second partly filled
    add_fused_lm_head(model, temperature=0.8, outputs=("log_probs", "entropy"))
    input_ids = _ids(2, 10, model.config.vocab_size, 4)
    trls = utils._ChunkedLogProbFunction
    one_tile = _scored(model, input_ids=input_ids, labels=input_ids)  # TRL's tile is wider than the vocabulary
    with lm_head.cpu_logprob_head():  # a trained head: TRL's function with Dragon's tiles
        tiles = _scored(model, input_ids=input_ids, labels=input_ids)
    _expect(utils._ChunkedLogProbFunction is trls, "TRL's log-prob function was not put back after the block")
    _same_scores(tiles, one_tile, "log-probs summed tile by tile", 1e-4, 1e-5)


@_check("lean_logprob_head")
def _lean_logprob_head() -> None:
    import torch
    from trl.trainer import utils

    generator = torch.Generator().manual_seed(3)
    vocab = lm_head.CPU_LOGPROB_TILE + 37
    for dtype in (torch.float32, torch.bfloat16):
        weight = torch.randn(vocab, 24, generator=generator).to(dtype)  # frozen, as under LoRA
        hidden = torch.randn(19, 24, generator=generator).to(dtype)
        targets = torch.randint(0, vocab, (19,), generator=generator)
        loss_weights = torch.randn(19, generator=generator)

        def head(function):
            x = hidden.clone().requires_grad_()
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == torch.bfloat16):
                logprobs, entropy = function(x)[:2]
            ((logprobs * loss_weights).sum() + entropy.sum() * 0.3).backward()
            return logprobs.detach(), entropy.detach(), x.grad


        def trls_head(x):  # TRL's own, in Dragon's tiles: the lean head folds them with the same operations
            return utils._ChunkedLogProbFunction.apply(x, weight, None, targets, 0.8, lm_head.CPU_LOGPROB_TILE, None,
                                                       1.0, ("log_probs", "entropy"))

        want = head(trls_head)
        with lm_head.cpu_logprob_head():
            got = head(trls_head)
        name = str(dtype).removeprefix("torch.")
        _same(got[0], want[0], f"{name} log-probs")  # the same operations on the same numbers
        _same(got[1], want[1], f"{name} entropies")
        # TRL sums the gradient in float32 and rounds to bf16 once; the lean head's matmul does too, in another order
        rtol, atol = (1e-5, 1e-7) if dtype == torch.float32 else (2**-7, 1e-6)
        _same(got[2], want[2], f"{name} gradients", rtol, atol)


def _lora_pair(dtype, dropout: float, alpha: int):
    """A PEFT LoRA model (B not zero, as after some training) and a copy with lean adapter layers."""
    import torch
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(_tiny_model(dtype), LoraConfig(r=4, lora_alpha=alpha, lora_dropout=dropout,
                                                          target_modules="all-linear"))
    for name, param in model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(param, std=0.5, generator=torch.Generator().manual_seed(len(name)))
    lean = copy.deepcopy(model)
    lora_layers.lean_adapter_layers(lean)
    _expect(any(type(m) is lora_layers.lean_lora_class() for m in lean.modules()), "no LoRA layer was made lean")
    return model, lean


@_check("lean_adapter_layers")
def _lean_adapter_layers() -> None:
    import torch

    for dtype, autocast, dropout, alpha in ((torch.float32, False, 0.1, 8), (torch.float32, False, 0.1, 6),
                                            (torch.bfloat16, True, 0.1, 8), (torch.bfloat16, True, 0.0, 8)):
        peft_model, lean = _lora_pair(dtype, dropout, alpha)
        input_ids = _ids(3, 12, peft_model.config.vocab_size, 1)
        results = []
        for model in (peft_model, lean.train()):
            model.train().zero_grad(set_to_none=True)
            torch.manual_seed(7)  # the same dropout masks for both
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                logits = model(input_ids=input_ids).logits
            logits.float().square().mean().backward()
            results.append((logits.detach(), {n: p.grad for n, p in model.named_parameters() if p.grad is not None}))
        what = f"{str(dtype).removeprefix('torch.')} LoRA (alpha {alpha}, dropout {dropout})"
        _same(results[1][0], results[0][0], f"{what}: logits")
        _expect(results[0][1].keys() == results[1][1].keys(), f"{what}: other parameters got gradients")
        for name, grad in results[0][1].items():
            _same(results[1][1][name], grad, f"{what}: gradients")


@_check("merged_sampling")
def _merged_sampling() -> None:
    import torch

    _, lean = _lora_pair(torch.float32, 0.1, 8)
    layers = [module for module in lean.modules() if type(module) is lora_layers.lean_lora_class()]
    input_ids = _ids(2, 6, lean.config.vocab_size, 2)
    with torch.no_grad():
        unmerged = lean.eval()(input_ids=input_ids).logits
        with lora_layers.merged_for_sampling(lean):
            _expect(all(layer.sampling_weight is not None for layer in layers), "the adapters were not merged")
            merged = lean(input_ids=input_ids).logits
    _expect(all(layer.sampling_weight is None for layer in layers), "the merged weights were kept after the block")
    _same(merged, unmerged, "logits through the merged weights", 1e-5, 1e-5)


@_check("shared_prompts")
def _shared_prompts() -> None:
    import torch
    from trl.trainer.utils import add_fused_lm_head

    model = _tiny_model()
    add_fused_lm_head(model, temperature=0.8, outputs=("log_probs", "entropy"))
    input_ids, attention_mask, labels = _grouped_batch(model.config.vocab_size)
    inputs = dict(input_ids=input_ids, attention_mask=attention_mask, labels=labels, completion=slice(9, None))
    with lm_head.completion_tokens_only():
        full = _scored(model, **inputs)
        with shared_prompts.scoring_shared_prompts(model, 9):
            shared = _scored(model, **inputs)
    _same_scores(shared, full, "scores with each prompt read once", 1e-5, 1e-6)
    prompts, prompt_mask = input_ids[:, :9], attention_mask[:, :9]
    for do_sample in (False, True):
        replies = []
        for block in (contextlib.nullcontext(), shared_prompts.sampling_shared_prompts(model)):
            torch.manual_seed(1)
            with torch.no_grad(), block:
                out = model.generate(input_ids=prompts, attention_mask=prompt_mask, max_new_tokens=8,
                                     do_sample=do_sample, pad_token_id=0, output_scores=True,
                                     return_dict_in_generate=True)
            replies.append((out.sequences, torch.stack(out.scores)))
        what = "sampled" if do_sample else "greedy"
        _same(replies[1][0], replies[0][0], f"{what} replies with each prompt read once")
        _same(replies[1][1], replies[0][1], f"{what} scores with each prompt read once", 1e-5, 1e-6)
    _expect("generate" not in vars(model), "the model's generate was not put back")
