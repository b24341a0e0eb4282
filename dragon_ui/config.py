"""The one run configuration: typed sections, loaded from YAML/JSON, validated once, saved into every run.

Defaults follow the GRPO reference API the product is built from (``dragon_reinforce``): group of 4 completions,
beta 0.04, temperature 1.0, 128 new tokens, LoRA r16/alpha32, learning rate 1e-5, one epoch of 4 prompts per step.
Every check raises :class:`ConfigError` with one sentence that names the field, so a mistake surfaces before a model
is loaded, never as a TRL traceback twenty minutes later.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import types
import typing
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypedDict, TypeGuard

from .data import DataConfig
from .settings import is_described, setting, shown_default
from .errors import ConfigError, check_length, check_seed, first_line
from .grpo_math import AGGREGATIONS, SCALE_REWARDS
from .public import Policy
from .rewards import RewardSpec, check_some_weight, parse_rewards
from .rewards.spec import OverlongReward
from .rewards.trl_rewards import overlong_window
from .tools import ToolSpec, parse_tools

DEFAULT_MODEL_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo", "luspo", "vespo")
IMPORTANCE_SAMPLING_LEVELS = ("token", "sequence")
# GRPOSettings fields that are TRL GRPOConfig fields of the same name and meaning (passed to TRL as they are).
GRPO_VARIANTS = ("importance_sampling_level", "epsilon", "epsilon_high", "mask_truncated_completions", "num_iterations",
                 "multi_objective_aggregation", "top_entropy_quantile", "entropy_coef", "top_p", "top_k", "min_p",
                 "repetition_penalty")
# Loss types that clip the probability ratio at 1 ± epsilon (cispo clips at epsilon_high alone, and from the first
# pass; sapo and vespo weigh the ratio their own way).
CLIPPED_LOSSES = ("grpo", "bnpo", "dr_grpo", "dapo", "luspo")
# Loss types that add up per-token shares, which TRL warns turns GSPO's sequence ratio into a length weighting.
TOKEN_SUM_LOSSES = ("bnpo", "dr_grpo", "dapo", "cispo")
DEVICES = ("auto", "cuda", "mps", "cpu")
DTYPES = ("auto", "bfloat16", "float16", "float32")
STRATEGIES = ("ddp", "zero2", "zero3", "fsdp")
GENERATION_BACKENDS = ("transformers", "vllm-colocate", "vllm-server")
# What works for GRPO, said wherever a learning rate is explained (the field, its error, the KL alert): an adapter
# takes far larger steps than the whole model (the recipes train SmolLM2-135M with LoRA at 1e-4).
LEARNING_RATES = ("LoRA on a model under 1B parameters usually trains well from 5e-5 to 5e-4, larger models from "
                  "1e-5 to 2e-4; training every weight wants 1e-6 to 2e-5")


def usual_learning_rates(lora: bool, params: float | None) -> str:
    """The part of LEARNING_RATES that fits one run: with or without LoRA, on a model of ``params`` parameters
    (None: unknown, and all of it is said)."""
    if not lora:
        return "training every weight usually wants 1e-6 to 2e-5"
    if params is None:
        return LEARNING_RATES
    if params < 1e9:
        return "LoRA on a model under 1B parameters usually trains well from 5e-5 to 5e-4"
    return "LoRA on a model of 1B parameters or more usually trains well from 1e-5 to 2e-4"
# The longest texts settings may hold: a path or Hub id, a short name (revision, split, layer), a run's name.
PATH_CHARS, NAME_CHARS, RUN_NAME_CHARS, NOTES_CHARS = 1000, 200, 100, 4000


@dataclass
class ModelConfig:
    """Which weights to start from: a Hub id, a local model folder, or a finished run (its adapter is folded in)."""

    id: str = setting(DEFAULT_MODEL_ID, label="Starting model", help=(
        "A preset from the table, any Hub id (owner/name), the path of a local model folder, or a finished run's "
        "folder (its adapter is merged in first, so stages chain)."))
    revision: str | None = setting(None, label="Revision", help="The Hub branch, tag or commit to load.")
    trust_remote_code: bool = setting(False, label="Trust remote code",
                                      help="Let the model's repository run its own code while loading.")

    def validate(self, where: str = "model") -> None:
        check_length(f"{where}.id", self.id, PATH_CHARS)
        check_length(f"{where}.revision", self.revision, NAME_CHARS)
        if not self.id.strip():
            raise ConfigError(f"{where}.id is empty; give a Hub id like {DEFAULT_MODEL_ID}, a model folder or a run folder.")


@dataclass
class GRPOSettings:
    """The reinforcement-learning knobs: how many completions per prompt and how far the model may drift."""

    group_size: int = setting(4, label="Group size", help=(
        "Completions sampled per prompt (2–64). GRPO compares them with each other, so more gives a clearer signal "
        "but costs time."))
    beta: float = setting(0.04, label="Beta (KL penalty)", help=(
        "How strongly the model is held near where it started (0–10): higher is more conservative; 0 skips the "
        "reference model's pass."))
    temperature: float = setting(1.0, label="Temperature", help=(
        "Sampling randomness, above 0 (so a group varies) and at most 3: higher gives more varied completions, too "
        "high gives nonsense."))
    max_new_tokens: int = setting(128, label="Max new tokens", help=(
        "The length cap of each completion; answers cut off here usually score badly."))
    loss_type: str = setting("dapo", label="Loss type", help=(
        "How token losses are averaged: `grpo`, `bnpo`, `dr_grpo`, `dapo` (TRL 1.16's default: over all tokens of "
        "the batch), `cispo`, `sapo`, `luspo`, `vespo`."))
    scale_rewards: str = setting("group", label="Scale rewards", help=(
        "Divide advantages by the reward spread of the `group`, of the `batch`, or not at all (`none`)."))
    # The variants below are TRL 1.16's, with TRL's defaults: a run that sets none of them trains as TRL does.
    importance_sampling_level: str = setting("token", label="Importance sampling", help=(
        "`token`: one probability ratio per token (GRPO); `sequence`: one per completion, "
        "[GSPO](https://huggingface.co/papers/2507.18071) (with loss type `grpo`, or `luspo`)."))
    epsilon: float = setting(0.2, label="Clip range (epsilon)", help=(
        "PPO's clip: how far one update may move a token's probability ratio from 1. It acts only when a batch is "
        "trained on more than once, because on the first pass every ratio is exactly 1."))
    epsilon_high: float | None = setting(None, label="Upper clip (epsilon high)", help=(
        "[DAPO](https://huggingface.co/papers/2503.14476)'s clip-higher: a wider upper bound (0.28 in the paper) "
        "lets rare good tokens grow; for `cispo`, the ratio's cap (5.0 recommended). Empty: epsilon."))
    mask_truncated_completions: bool = setting(False, label="Leave cut-off completions out of the loss", help=(
        "DAPO: a completion cut off at max new tokens teaches nothing, instead of being punished for being "
        "unfinished."))
    num_iterations: int = setting(1, label="Updates per batch", help=(
        "μ in the GRPO paper (1–16): train on each sampled batch this many times, at the cost of a forward and "
        "backward pass each, with no new sampling. The steps in between say `reused_batch`; clipping and GSPO act "
        "only from the second update."))
    multi_objective_aggregation: str = setting("sum_then_normalize", label="Combine rewards", help=(
        "`sum_then_normalize` (TRL's default), or `normalize_then_sum`: "
        "[GDPO](https://huggingface.co/papers/2601.05242), each reward normalised within its group before the "
        "weighted sum, so a reward with a small range is not drowned out."))
    top_entropy_quantile: float = setting(1.0, label="Train on the most uncertain tokens", help=(
        "Train only on this share of tokens, the highest-entropy ones: 1 is every token, 0.2 in "
        "[Beyond the 80/20 rule](https://huggingface.co/papers/2506.01939)."))
    entropy_coef: float = setting(0.0, label="Entropy bonus", help=(
        "Above 0 pays the model for staying uncertain, to keep it exploring; 0 is TRL's default."))
    # How completions are sampled (Hugging Face generate's meanings; the defaults leave the distribution as is).
    # The Rewards tab's "Generate a group" samples with them too.
    top_p: float = setting(1.0, label="Sampling: top-p", help=(
        "Sample from the likeliest tokens that make up this share of the probability; 1 keeps all."))
    top_k: int = setting(0, label="Sampling: top-k", help="Sample from this many likeliest tokens; 0 keeps all.")
    min_p: float | None = setting(None, label="Sampling: min-p", help=(
        "Leave out tokens less likely than this share of the likeliest one's probability; empty: off."))
    repetition_penalty: float = setting(1.0, label="Sampling: repetition penalty", help=(
        "Above 1 holds back tokens already used; 1 is off."))
    max_tool_calling_iterations: int = setting(2, label="Tool rounds per completion", help=(
        "With tools: how many times (1–10) one completion may call tools and go on with their answers before it "
        "must stop; its tokens, the tools' answers included, stay within max new tokens."))

    def validate(self, where: str = "grpo") -> None:
        _check_range(f"{where}.group_size", self.group_size, 2, 64, "completions per prompt; GRPO compares them, so at least 2")
        _check_range(f"{where}.beta", self.beta, 0.0, 10.0, "the KL penalty weight")
        if not (0.0 < self.temperature <= 3.0):
            raise ConfigError(f"{where}.temperature must be above 0 and at most 3 (got {self.temperature}); "
                              "at 0 every completion in a group is the same and nothing is learned.")
        if self.temperature < MIN_TEMPERATURE:
            raise ConfigError(f"{where}.temperature must be at least {MIN_TEMPERATURE:g} (got {self.temperature:g}): "
                              "below it the scores overflow when they are divided by it, and sampling fails.")
        _check_range(f"{where}.max_new_tokens", self.max_new_tokens, 1, 32768, "the length cap of each completion")
        _check_range(f"{where}.max_tool_calling_iterations", self.max_tool_calling_iterations, 1, 10,
                     "rounds of tool calls per completion")
        _check_choice(f"{where}.loss_type", self.loss_type, LOSS_TYPES)
        _check_choice(f"{where}.scale_rewards", self.scale_rewards, SCALE_REWARDS)
        self._validate_variants(where)

    def check_on_policy(self, backend: str, where: str = "grpo") -> None:
        """Refuse clip and GSPO settings that cannot act: with one update per batch and transformers sampling, TRL
        takes the log-probabilities the clip compares with from the very pass it trains, so every ratio is exactly 1
        (vLLM sampling has its own log-probabilities, so there they act)."""
        if self.num_iterations > 1 or backend != "transformers" or self.loss_type not in CLIPPED_LOSSES:
            return
        clip_settings = [name for name, value, default in (
            ("epsilon", self.epsilon, GRPOSettings.epsilon), ("epsilon_high", self.epsilon_high, None)) if value != default]
        if self.importance_sampling_level == "sequence" and self.loss_type == "grpo":
            clip_settings.append("importance_sampling_level")
        if clip_settings:
            raise ConfigError(f"{where}.{clip_settings[0]} only changes training when each batch is trained on more "
                              f"than once: with {where}.num_iterations 1 every probability ratio is exactly 1, so "
                              "nothing is clipped (and GSPO's ratio equals GRPO's). Set "
                              f"{where}.num_iterations to 2 or more, or leave it at TRL's default.")

    def changed_variants(self) -> dict[str, Any]:
        """The variants set away from TRL's defaults (what a model card lists), in field order."""
        defaults = GRPOSettings()
        return {name: getattr(self, name) for name in GRPO_VARIANTS if getattr(self, name) != getattr(defaults, name)}

    def _validate_variants(self, where: str) -> None:
        """TRL's variants: each in its range, and no combination that TRL only warns about or that changes nothing."""
        _check_choice(f"{where}.importance_sampling_level", self.importance_sampling_level, IMPORTANCE_SAMPLING_LEVELS)
        _check_range(f"{where}.epsilon", self.epsilon, 1e-6, 1.0, "the clip range of the probability ratio")
        if self.epsilon_high is not None:
            _check_range(f"{where}.epsilon_high", self.epsilon_high, 1e-6, 10.0, "the upper clip range")
        _check_range(f"{where}.num_iterations", self.num_iterations, 1, 16, "passes over each sampled batch")
        _check_choice(f"{where}.multi_objective_aggregation", self.multi_objective_aggregation, AGGREGATIONS)
        _check_range(f"{where}.top_entropy_quantile", self.top_entropy_quantile, 0.01, 1.0,
                     "the share of tokens trained on")
        _check_range(f"{where}.entropy_coef", self.entropy_coef, 0.0, 1.0, "the weight of the entropy bonus")
        _check_range(f"{where}.top_p", self.top_p, 0.01, 1.0, "the probability mass sampled from; 1 keeps all")
        _check_range(f"{where}.top_k", self.top_k, 0, 100_000, "the most likely tokens sampled from; 0 keeps all")
        if self.min_p is not None:
            _check_range(f"{where}.min_p", self.min_p, 0.0, 0.99, "the least probability, relative to the likeliest")
        _check_range(f"{where}.repetition_penalty", self.repetition_penalty, 0.5, 3.0,
                     "how much a token already used is held back; 1 is none")
        sequence = self.importance_sampling_level == "sequence"
        if self.loss_type == "luspo" and not sequence:
            raise ConfigError(f"{where}.loss_type luspo scales GSPO's sequence-level loss, so it needs "
                              f"{where}.importance_sampling_level sequence.")
        if self.loss_type == "vespo" and sequence:
            raise ConfigError(f"{where}.loss_type vespo computes its sequence weights itself, so it needs "
                              f"{where}.importance_sampling_level token.")
        if sequence and self.loss_type in TOKEN_SUM_LOSSES:
            raise ConfigError(f"{where}.importance_sampling_level sequence (GSPO) with {where}.loss_type "
                              f"{self.loss_type} adds up every token's share, which weighs each completion by its "
                              f"length instead of following GSPO; choose loss type grpo (GSPO's setup) or luspo.")
        if self.epsilon != GRPOSettings.epsilon and self.loss_type not in CLIPPED_LOSSES:
            how = "caps the ratio at epsilon_high alone" if self.loss_type == "cispo" else "weighs the ratio its own way"
            raise ConfigError(f"{where}.epsilon is not used by {where}.loss_type {self.loss_type}, which {how}; "
                              "leave it at TRL's default.")
        if self.multi_objective_aggregation == "normalize_then_sum" and self.scale_rewards != "group":
            raise ConfigError(f"{where}.scale_rewards {self.scale_rewards} is not used with "
                              f"{where}.multi_objective_aggregation normalize_then_sum, which normalises each reward in "
                              "its group and the sum over the batch; leave scale_rewards at group.")


@dataclass
class TrainingSettings:
    """Optimiser and schedule. ``batch_size`` counts prompts, so a step samples batch_size * group_size completions."""

    learning_rate: float = setting(1e-5, label="Learning rate", help=(
        f"The size of each update: {LEARNING_RATES}; the recipes use 1e-4. The Train tab warns of a high KL only "
        "while the reward falls."))
    epochs: float = setting(1.0, label="Epochs", help=(
        "Passes over the training prompts (fractions allowed); max steps, when set, wins."))
    max_steps: int | None = setting(None, label="Max steps", help=(
        "Stop after this many steps, whatever the epochs say; empty: train for the epochs."))
    batch_size: int = setting(4, label="Batch size (prompts per step)", help=(
        "Prompts per step: each step samples batch size × group size completions."))
    grad_accum: int = setting(1, label="Gradient accumulation", help="Micro-batches per optimiser step.")
    save_steps: int = setting(20, label="Save every (steps)", help=(
        "The checkpoint interval. A checkpoint is also saved at the end and on Stop, and Resume starts from the "
        "latest."))
    warmup_ratio: float = setting(0.0, label="Warm-up share", help="The share of steps spent warming up the learning rate.")
    weight_decay: float = setting(0.0, label="Weight decay", help="AdamW's weight decay.")
    gradient_checkpointing: bool = setting(False, label="Gradient checkpointing", help=(
        "Recompute activations in the backward pass: much less memory on big models, slower steps."))
    seed: int = setting(42, label="Seed", help="The seed of sampling and of the adapter's initial weights.")
    # A few fixed prompts keep each held-out check cheap (the whole held-out set is scored before and after).
    eval_every: int | None = setting(None, label="Held-out check every (steps)", help=(
        "The model answers a few held-out prompts greedily, drawn beside the training reward (`heldout.jsonl`): it "
        "tells learning the task from gaming the training prompts. Empty: about ten checks a run (about 3% of its "
        "time on a CPU); 0: none. One process only (not under `accelerate launch`)."))
    eval_prompts: int = setting(8, label="Held-out prompts per check", help=(
        "How many held-out prompts each check answers: the first ones of the held-out set, the same every time."))

    def validate(self, where: str = "training") -> None:
        if not (0.0 < self.learning_rate <= 1.0):
            raise ConfigError(f"{where}.learning_rate must be above 0 and at most 1 (got {self.learning_rate}); "
                              f"{LEARNING_RATES}.")
        if self.learning_rate < MIN_LEARNING_RATE:
            raise ConfigError(f"{where}.learning_rate must be at least {MIN_LEARNING_RATE:g} (got "
                              f"{self.learning_rate:g}): a smaller one changes no weight; {LEARNING_RATES}.")
        check_seed(f"{where}.seed", self.seed)
        if not (0.0 < self.epochs <= 1000):
            raise ConfigError(f"{where}.epochs must be above 0 (got {self.epochs}).")
        if self.max_steps is not None:
            _check_range(f"{where}.max_steps", self.max_steps, 1, 10_000_000, "the number of optimiser steps")
        _check_range(f"{where}.batch_size", self.batch_size, 1, 4096, "prompts per step")
        _check_range(f"{where}.grad_accum", self.grad_accum, 1, 1024, "micro-batches per optimiser step")
        _check_range(f"{where}.save_steps", self.save_steps, 1, 10_000_000, "steps between checkpoints")
        _check_range(f"{where}.warmup_ratio", self.warmup_ratio, 0.0, 0.99, "the fraction of steps spent warming up")
        _check_range(f"{where}.weight_decay", self.weight_decay, 0.0, 1.0, "AdamW weight decay")
        if self.eval_every is not None:
            _check_range(f"{where}.eval_every", self.eval_every, 0, 10_000_000,
                         "steps between held-out checks (0: none)")
        _check_range(f"{where}.eval_prompts", self.eval_prompts, 1, 256, "held-out prompts scored at each check")

    def checks_at(self, total_steps: int) -> int:
        """Steps between held-out checks for a run of ``total_steps`` (0: none)."""
        if self.eval_every is not None:
            return self.eval_every
        return max(1, round(total_steps / 10))


@dataclass
class LoraSettings:
    """LoRA adapter; ``enabled: false`` trains every weight instead (needs far more memory)."""

    enabled: bool = setting(True, label="Train a LoRA adapter", help=(
        "A small add-on instead of every weight: far less memory, and the starting model stays intact. Off trains "
        "every weight."))
    r: int = setting(16, label="Rank r", help="The adapter's capacity; 8–32 is plenty for RL.")
    alpha: int = setting(32, label="Alpha", help="The adapter's scale; usually 2 × r.")
    dropout: float = setting(0.05, label="Dropout", help=(
        "Dropout on the adapter's input while training. At 0 a CPU step is about a third shorter, because each "
        "prompt is read once per group, but it changes what is learned."),
        see="[performance](performance.md#the-speed-ups)")
    target_modules: str | list[str] = setting("all-linear", label="Target modules", help=(
        "The layers that get an adapter: `all-linear`, or names like `q_proj, v_proj` (never `lm_head`)."))

    def validate(self, where: str = "lora") -> None:
        _check_range(f"{where}.r", self.r, 1, 1024, "the adapter rank")
        _check_range(f"{where}.alpha", self.alpha, 1, 4096, "the adapter scale")
        _check_range(f"{where}.dropout", self.dropout, 0.0, 0.99, "adapter dropout")
        targets = [self.target_modules] if isinstance(self.target_modules, str) else self.target_modules
        if len(targets) > 64:
            raise ConfigError(f"{where}.target_modules names {len(targets)} layers; name at most 64, or use all-linear.")
        for target in targets:
            check_length(f"{where}.target_modules", target, NAME_CHARS)
        if not targets or any(not t.strip() for t in targets):
            raise ConfigError(f"{where}.target_modules is empty; use \"all-linear\" or a list of layer names like [q_proj, v_proj].")
        if "lm_head" in targets:
            raise ConfigError(f"{where}.target_modules must not include lm_head: TRL reads the output layer's weights directly.")


@dataclass
class HardwareSettings:
    """Where and in what precision to train; "auto" picks CUDA, then Apple MPS, then CPU (see engine/hardware.py)."""

    device: str = setting("auto", label="Device", help=(
        "`auto` picks a CUDA GPU, then Apple MPS, then the CPU; `cuda`, `mps` and `cpu` ask for one (an absent "
        "device is an error)."))
    dtype: str = setting("auto", label="Precision", help=(
        "`auto`: bf16 where it is fast, else fp32 (fp16 on GPUs without bf16); or `bfloat16`, `float16`, "
        "`float32`."), see="[Hardware choices](#hardware-choices)")
    load_in_4bit: bool = setting(False, label="4-bit weights (QLoRA)", help=(
        "About 4× less memory for the weights, with bitsandbytes; needs a CUDA GPU and LoRA."))
    cpu_threads: int | None = setting(None, label="CPU threads", help=(
        "Torch threads on the CPU; empty: automatic (all cores on small machines, one spare from 4)."),
        shown_default="automatic", see="[Hardware choices](#hardware-choices)")
    # A launcher (accelerate, torchrun) gives each process its own GPU instead.
    gpu: int | None = setting(None, label="GPU number", help=(
        "Which CUDA GPU one process trains on, on a machine with several: 0 is the first among those "
        "`CUDA_VISIBLE_DEVICES` shows; empty: the first. A launched run uses every GPU."), shown_default="the first")

    def validate(self, where: str = "hardware") -> None:
        _check_choice(f"{where}.device", self.device, DEVICES)
        _check_choice(f"{where}.dtype", self.dtype, DTYPES)
        if self.gpu is not None:
            _check_range(f"{where}.gpu", self.gpu, 0, 1023, "the number of the CUDA GPU to train on, 0 for the first")
        if self.cpu_threads is not None:
            _check_range(f"{where}.cpu_threads", self.cpu_threads, 1, 1024, "torch threads on the CPU")


@dataclass
class DistributedSettings:
    """How several GPUs share the work when the run is launched with accelerate/torchrun (see `export`).

    ddp copies the model to every GPU; zero2 shards optimiser state and gradients (DeepSpeed); zero3 and fsdp also
    shard the weights as they load, for models whose training does not fit on one GPU (the before/after scores are
    then taken after training, with the model loaded whole on the main process's GPU). A single plain process
    ignores this setting.
    """

    strategy: str = setting("ddp", label="Multi-GPU strategy", help=(
        "How several GPUs share the work under a multi-process launch. `ddp`: a model copy per GPU; `zero2`: "
        "shard the optimiser state; `zero3` and `fsdp`: shard the weights too, for models too big for one GPU."),
        see="[scaling out](scaling.md)")

    def validate(self, where: str = "distributed") -> None:
        _check_choice(f"{where}.strategy", self.strategy, STRATEGIES)


@dataclass
class GenerationSettings:
    """Who writes the completions: transformers' generate (everywhere), or vLLM on CUDA (much faster sampling).

    vllm-colocate runs vLLM inside each training process, sharing the GPU (``vllm_gpu_memory_utilization`` of it);
    vllm-server sends prompts to a separate `trl vllm-serve` / `vllm serve` process at ``vllm_server_url``.
    """

    backend: str = setting("transformers", label="Generation", help=(
        "Who samples the completions: `transformers` works everywhere; vLLM (CUDA only) samples much faster, inside "
        "each process (`vllm-colocate`) or on a server (`vllm-server`)."), see="[scaling out](scaling.md)")
    vllm_server_url: str | None = setting(None, label="vLLM server URL", help=(
        "The `trl vllm-serve` server, like `http://10.0.0.5:8000`; only with `vllm-server`."))
    vllm_gpu_memory_utilization: float = setting(0.3, label="vLLM's share of the GPU", help=(
        "The share of each GPU vLLM may take in colocate mode (0.05–0.95)."))

    def validate(self, where: str = "generation") -> None:
        _check_choice(f"{where}.backend", self.backend, GENERATION_BACKENDS)
        check_length(f"{where}.vllm_server_url", self.vllm_server_url, PATH_CHARS)
        if self.backend == "vllm-server":
            url = (self.vllm_server_url or "").strip()
            if not url.startswith(("http://", "https://")):
                raise ConfigError(f"{where}.vllm_server_url must be the vLLM server's address, like http://10.0.0.5:8000, "
                                  "when generation.backend is vllm-server.")
        elif self.vllm_server_url:
            raise ConfigError(f"{where}.vllm_server_url is only used with generation.backend vllm-server.")
        if not (0.05 <= self.vllm_gpu_memory_utilization <= 0.95):
            raise ConfigError(f"{where}.vllm_gpu_memory_utilization must be between 0.05 and 0.95 (the share of GPU "
                              f"memory vLLM may take); got {self.vllm_gpu_memory_utilization}.")


TRACKERS = ("trackio", "tensorboard", "wandb")


@dataclass
class LoggingSettings:
    """Where else the metrics go: the run folder always has them (the app and the CLI read it); ``report_to`` adds
    the experiment trackers people already use, through TRL's own ``report_to``. TensorBoard writes event files
    into the run folder (``tensorboard/``); trackio and W&B log to the project "dragon-grpo-studio" under the
    run's id. A single name is taken as a list of one."""

    report_to: list[str] | str = setting(label="Also log to", factory=list, help=(
        "Experiment trackers that also get the metrics, through TRL's `report_to`; the Train tab always shows the "
        "run. `tensorboard` writes event files into the run's `tensorboard/` (`tensorboard --logdir runs`); "
        "`trackio` and `wandb` log to the project `dragon-grpo-studio` under the run's id (W&B keeps your "
        "`$WANDB_PROJECT`). A tracker that is not installed is refused before the run starts, with the "
        "`pip install` to run; a public demo allows only `tensorboard`."))

    def validate(self, where: str = "logging") -> None:
        if isinstance(self.report_to, str):
            self.report_to = [self.report_to] if self.report_to.strip() else []
        self.report_to = [name.strip().lower() for name in self.report_to]
        for i, name in enumerate(self.report_to):
            _check_choice(f"{where}.report_to[{i}]", name, TRACKERS)
        if len(set(self.report_to)) < len(self.report_to):
            raise ConfigError(f"{where}.report_to names a tracker twice: {', '.join(self.report_to)}.")


Section = dict[str, Any]  # one section of a draft: its settings by name


class Draft(TypedDict, total=False):
    """A run's settings as the form, a kept browser draft or an API client holds them: RunConfig.to_dict's shape,
    not validated yet (RunConfig.from_dict validates it). Its keys are RunConfig's fields."""

    model: Section
    data: Section
    rewards: list[Section]
    tools: list[Section]
    grpo: Section
    training: Section
    lora: Section
    hardware: Section
    distributed: Section
    generation: Section
    logging: Section
    n_samples: int
    name: str
    notes: str
    runs_dir: str
    base_dir: str


@dataclass
class RunConfig:
    """Everything one GRPO run needs. ``RunConfig.from_dict`` is the only way in, so every instance is valid."""

    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    rewards: list[RewardSpec] = setting(label="Rewards", factory=list, shown_default="–", help=(
        "The list of rewards: at least one, and at least one with a weight above 0."), see="[Rewards](#rewards)")
    tools: list[ToolSpec] = setting(label="Tools", factory=list, shown_default="none", help=(
        "Tools the model may call while it answers (multi-turn GRPO): a calculator, a unit converter, a lookup or "
        "a search over the data, or your own Python function."), see="[Tools](#tools)")
    grpo: GRPOSettings = field(default_factory=GRPOSettings)
    training: TrainingSettings = field(default_factory=TrainingSettings)
    lora: LoraSettings = field(default_factory=LoraSettings)
    hardware: HardwareSettings = field(default_factory=HardwareSettings)
    distributed: DistributedSettings = field(default_factory=DistributedSettings)
    generation: GenerationSettings = field(default_factory=GenerationSettings)
    logging: LoggingSettings = field(default_factory=LoggingSettings)
    n_samples: int = setting(10, label="Sample replies kept", help=(
        "Held-out prompts kept as side-by-side replies before and after training (`samples.json`)."))
    name: str = setting("", label="Run name", help=(
        "Names the run's folder; empty: named after the model."),
        shown_default="model name + `-grpo`")
    notes: str = setting("", label="Notes", help=(
        "What these settings are for, in Markdown (up to 4,000 characters): shown above the tabs when they are "
        "loaded. The lesson recipes say there what to try and what to look for."))
    runs_dir: str = setting("", label="Runs folder", help="Where run folders are created.",
                            shown_default="`$DRAGON_UI_RUNS_DIR` or `./runs`")
    # Folder the config file was read from: relative data and reward-file paths are looked up there too.
    base_dir: str = ""

    @classmethod
    def from_dict(cls, data: dict[str, Any], base_dir: str | os.PathLike[str] | None = None,
                  *, policy: Policy, load_code: bool = True) -> RunConfig:
        """The settings, validated; the rewards ``policy`` refuses are refused before any of their code runs.
        ``load_code`` False reads settings checked when they were saved without running a custom reward's code."""
        if not isinstance(data, dict):
            raise ConfigError("The configuration must be a mapping of settings (model, data, rewards, ...).")
        data = dict(data)
        if isinstance(data.get("model"), str):  # `model: some/id` is the common short form
            data["model"] = {"id": data["model"]}
        rewards = data.pop("rewards", None)
        tools = data.pop("tools", None)
        config: RunConfig = _build(cls, data, "config", skip={"rewards", "tools"})
        if rewards is None:
            raise ConfigError("rewards is missing; add at least one reward, for example `- kind: numeric`.")
        if not isinstance(rewards, list):
            raise ConfigError("rewards must be a list of rewards, each with a kind (numeric, exact, length, ...).")
        config.rewards = parse_rewards(rewards, policy=policy, load_code=load_code)
        config.tools = parse_tools(tools, policy=policy)
        if base_dir is not None and not config.base_dir:
            config.base_dir = str(Path(base_dir).resolve())
        config.validate()
        return config

    @classmethod
    def from_file(cls, path: str | os.PathLike[str], *, policy: Policy) -> RunConfig:
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"No configuration file at {path}.")
        is_json = path.suffix.lower() == ".json"
        try:
            text = path.read_text(encoding="utf-8")  # inside the try: a binary file is "not readable" too
            if is_json:
                data = json.loads(text)
            else:
                import yaml

                data = yaml.safe_load(text)
        except Exception as exc:  # yaml and json raise many different types; all mean "not readable"
            raise ConfigError(f"{path.name} is not valid {'JSON' if is_json else 'YAML'}: {first_line(exc) or type(exc).__name__}") from None
        return cls.from_dict(data or {}, base_dir=path.parent, policy=policy)

    def validate(self) -> None:
        check_length("name", self.name, RUN_NAME_CHARS)
        check_length("notes", self.notes, NOTES_CHARS)
        check_length("runs_dir", self.runs_dir, PATH_CHARS)
        check_length("base_dir", self.base_dir, PATH_CHARS)
        self.model.validate()
        self.data.validate()
        if not self.rewards:
            raise ConfigError("rewards is empty; add at least one reward, for example `- kind: numeric`.")
        self.grpo.validate()
        self.training.validate()
        self.lora.validate()
        self.hardware.validate()
        self.distributed.validate()
        self.generation.validate()
        self.grpo.check_on_policy(self.generation.backend)
        self.logging.validate()
        _check_range("n_samples", self.n_samples, 0, 10_000, "held-out prompts kept as sample replies")
        if self.hardware.load_in_4bit and not self.lora.enabled:
            raise ConfigError("hardware.load_in_4bit needs LoRA (lora.enabled: true): 4-bit weights cannot be trained directly.")
        check_some_weight(self.rewards, "rewards")
        self._check_environments()
        for index, spec in enumerate(self.rewards):
            if isinstance(spec, OverlongReward):
                overlong_window(spec, self.grpo.max_new_tokens, f"rewards[{index}]")

    def _check_environments(self) -> None:
        """The environment reward needs an environment to read; two or more environments need the data column
        that picks each row's."""
        environments = [spec.name for spec in self.tools if spec.is_environment]
        for index, spec in enumerate(self.rewards):
            if spec.kind == "environment" and not environments:
                raise ConfigError(f"rewards[{index}]: an environment reward reads the score of the environment the "
                                  "model played, and no tool is an environment; add one (guess_number, arithmetic "
                                  "or your own) or remove this reward.")
        column = self.data.environment_column
        if len(environments) > 1 and not column:
            raise ConfigError(f"data.environment_column is missing: with {len(environments)} environments "
                              f"({', '.join(environments)}), each row must say which one it plays, in a column.")
        if column and len(environments) < 2:
            raise ConfigError("data.environment_column picks one of several environments per row, and the tools "
                              f"have {len(environments) or 'no'} environment{'s' if not environments else ''}; "
                              "clear it.")

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["rewards"] = [spec.to_dict() for spec in self.rewards]
        out["tools"] = [spec.to_dict() for spec in self.tools]
        return out

    def to_yaml(self) -> str:
        """The config as a YAML file a person can read: sections in order, multi-line code as literal blocks."""
        import yaml

        class Dumper(yaml.SafeDumper):  # type: ignore[misc]  # PyYAML ships no types
            pass

        def text(dumper: Any, value: str) -> Any:
            return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|" if "\n" in value else None)

        Dumper.add_representer(str, text)
        data = self.to_dict()
        data.pop("base_dir")
        return str(yaml.dump(data, Dumper=Dumper, sort_keys=False, allow_unicode=True))

    def resolved_runs_dir(self) -> Path:
        """The folder this config's run goes in: ``runs_dir``, else ./runs. The command line and the app fill an
        empty one with their own choice first (system.disk.resolve_runs_dir: --runs-dir, $DRAGON_UI_RUNS_DIR), so that
        nothing below them reads the environment."""
        return Path(self.runs_dir or "runs").expanduser().resolve()

    @property
    def completions_per_step(self) -> int:
        return self.training.batch_size * self.grpo.group_size * self.training.grad_accum


@dataclass(frozen=True)
class SettingHelp:
    """One setting as the form, the command line and the reference explain it (from its field's metadata)."""

    path: str  # as --set and error messages name it: training.max_steps
    label: str
    help: str  # Markdown, absolute links only
    default: str  # as the reference writes it
    see: str | None  # a link into the reference, shown there only


def _is_section(hint: object) -> TypeGuard[type]:
    """Whether a setting's annotated type is a section of settings (a dataclass), not a value."""
    return isinstance(hint, type) and dataclasses.is_dataclass(hint)


def documented_settings(section: type = RunConfig, prefix: str = "") -> list[SettingHelp]:
    """Every setting a config file may hold, in the order of the reference: a section's own settings before its
    subsections, each in field order."""
    own, nested = [], []
    for spec in dataclasses.fields(section):
        hint = typing.get_type_hints(section)[spec.name]
        if _is_section(hint):
            nested += documented_settings(hint, f"{prefix}{spec.name}.")
        elif is_described(spec):
            own.append(SettingHelp(prefix + spec.name, spec.metadata["label"], spec.metadata["help"],
                                   shown_default(spec), spec.metadata["see"]))
    return own + nested


_HELP_AT = {item.path: item for item in documented_settings()}


def setting_help(path: str) -> SettingHelp:
    """The label and help of the setting at ``path`` (training.max_steps); KeyError for no such setting."""
    return _HELP_AT[path]


def settings_table() -> str:
    """docs/reference.md's table of settings, in Markdown."""
    rows = ["| setting | default | meaning |", "|---|---|---|"]
    for item in documented_settings():
        meaning = item.help + (f" See {item.see}." if item.see else "")
        rows.append(f"| `{item.path}` | {item.default} | {meaning.replace('|', '&#124;')} |")
    return "\n".join(rows) + "\n"


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``section.key=value`` overrides to a config dict, before it is validated. A text setting takes the
    value as typed (``data.prompt=Q: {question}`` is that text; empty is none where the setting may be empty);
    any other setting is read as YAML (``5``, ``1e-5``, ``true``, ``[q_proj, v_proj]``)."""
    import yaml

    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"--set expects KEY=VALUE, like training.max_steps=5; got {item!r}.")
        target = data
        *parents, leaf = key.split(".")
        for part in parents:
            if not isinstance(target.get(part), dict):
                raise ConfigError(f"--set {key}: there is no section '{part}' in the configuration.")
            target = target[part]
        kind = _setting_type(parents, leaf)
        if kind in (str, str | None):
            target[leaf] = None if raw == "" and kind is not str else raw
        else:
            target[leaf] = yaml.safe_load(raw)
    return data


def _setting_type(sections: list[str], name: str) -> Any:
    """The annotated type of the setting at ``sections`` + ``name`` (None when there is no such setting: the
    validation that follows says so in its own words)."""
    owner: type = RunConfig
    for section in sections:
        hint = typing.get_type_hints(owner).get(section)
        if not _is_section(hint):
            return None
        owner = hint
    return typing.get_type_hints(owner).get(name)


# ----------------------------------------------------------------------------------------------------------------
# Generic, strict loading of the dataclass sections from plain dicts.


def _build(cls: type, data: Any, where: str, skip: Collection[str] = ()) -> Any:
    if not isinstance(data, dict):
        raise ConfigError(f"{where} must be a mapping of settings, not {type(data).__name__}.")
    hints = typing.get_type_hints(cls)
    known = [f.name for f in dataclasses.fields(cls) if f.name not in skip]
    for key in data:
        if key not in known:
            raise ConfigError(f"{where} has an unknown setting '{key}'; known settings are: {', '.join(known)}.")
    kwargs = {}
    for name in known:
        if name not in data:
            continue
        path = name if where == "config" else f"{where}.{name}"
        hint = hints[name]
        if _is_section(hint):
            kwargs[name] = _build(hint, data[name], path)
        else:
            kwargs[name] = _coerce(data[name], hint, path)
    return cls(**kwargs)


def _coerce(value: Any, hint: Any, where: str) -> Any:
    """Convert a YAML/JSON value to the annotated type, accepting only lossless conversions."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(hint)
        if value is None and type(None) in options:
            return None
        errors = []
        for option in options:
            if option is type(None):
                continue
            try:
                return _coerce(value, option, where)
            except ConfigError as exc:
                errors.append(exc)
        raise errors[-1]
    if origin is dict:
        key_type, item_type = typing.get_args(hint)
        if not isinstance(value, dict):
            raise ConfigError(f"{where} must be a mapping, not {_describe(value)}.")
        return {_coerce(key, key_type, f"{where} (a key)"): _coerce(item, item_type, f"{where}[{key!r}]")
                for key, item in value.items()}
    if origin is list:
        (item_type,) = typing.get_args(hint)
        if not isinstance(value, list):
            raise ConfigError(f"{where} must be a list, not {_describe(value)}.")
        return [_coerce(item, item_type, f"{where}[{i}]") for i, item in enumerate(value)]
    if hint is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{where} must be true or false, not {_describe(value)}.")
    if hint is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise ConfigError(f"{where} must be a whole number, not {_describe(value)}.")
    if hint is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if not math.isfinite(value):
                raise ConfigError(f"{where} must be a finite number, not {value}.")
            return float(value)
        if isinstance(value, str):  # YAML reads "1e-5" (no dot) as a string
            try:
                return _coerce(float(value), float, where)
            except ValueError:
                pass
        raise ConfigError(f"{where} must be a number, not {_describe(value)}.")
    if hint is str:
        if isinstance(value, str):
            return value
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return str(value)
        raise ConfigError(f"{where} must be text, not {_describe(value)}.")
    raise TypeError(f"unsupported config type {hint!r} for {where}")  # a programming error, not a user one


def _describe(value: Any) -> str:
    if isinstance(value, str):
        return f"the text {value!r}"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (list, dict)):
        return f"a {'list' if isinstance(value, list) else 'mapping'}"
    return repr(value)


MIN_TEMPERATURE = 0.01  # logits are divided by it: a tiny one makes them infinite
MIN_LEARNING_RATE = 1e-10  # far below any that trains (the usual ones are 1e-6 to 1e-4)


def _check_range(where: str, value: float, low: float, high: float, meaning: str) -> None:
    if not (low <= value <= high):
        raise ConfigError(f"{where} must be between {low:g} and {high:g} ({meaning}); got {value}.")


def _check_choice(where: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ConfigError(f"{where} must be one of {', '.join(choices)}; got {value!r}.")
