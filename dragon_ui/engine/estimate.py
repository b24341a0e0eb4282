"""An estimate of a run's memory and time per step, before anything is loaded.

The model's size comes from its shape (a preset, or the numbers in a local ``config.json``: weights are never
loaded). Memory adds the runtime, the weights (by precision, or 4-bit), the trainable parameters with their
gradients and AdamW states, and the larger of the generation KV cache and what the training keeps for its backward
pass (``training_terms``) for ``batch_size * group_size`` sequences of prompt + ``max_new_tokens``. Time per step
adds:

- generation: the prompts' forward pass, then ``max_new_tokens`` decoding steps, each latency-bound: a fixed cost
  per layer plus the larger of reading the weights and the compute for all sequences (~2 * params * sequences);
- the policy's forward and backward, ~6 * params * tokens FLOPs (~4 with LoRA: no weight gradients for the frozen
  base; 2 more with gradient checkpointing), and the reference forward when beta > 0, ~2 * params * tokens.

On the CPU the speeds are this machine's, measured when the app starts (a matmul probe, ``cpu_flops_per_thread``),
and the factors that turn the counts into seconds and bytes are fitted to one measured step of 32 settings
(``bench/estimate_grid.py``: two model shapes, 16-256 new tokens, groups of 4 and 8, gradient checkpointing on and
off, bf16 and fp32, LoRA and full fine-tuning). There the estimate came within 33 % of every measured step time
(17 % rms) and within 20 % of every peak but one (12 % rms), and it says so. On a GPU nothing was
measured: it assumes a conservative fraction of the GPU's peak by name (30 TFLOP/s when the name is unknown) and the
CPU's factors for the tensors the training keeps, and says it is rough.
"""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ..config import RunConfig
from ..system.memory import system_memory_gb
from .hardware import HardwareInfo, ResolvedHardware
from ..errors import ConfigError
from ..rewards.spec import ClassifierReward
from ..runstore import format_seconds
from .presets import ModelDims, find_preset

GB = 1024**3
# Prompt length assumed when the data is not read: a short question with its chat template and default system
# message (the bundled recipes' prompts are 45-70 tokens).
PROMPT_TOKENS = 56
BYTES_PER_VALUE = {"float32": 4, "bfloat16": 2, "float16": 2}
NF4_BYTES_PER_PARAM = 4.13 / 8  # 4-bit NF4 with double-quantized block scales
ADAMW_LORA_BYTES = 16  # LoRA parameters stay fp32: weight, gradient and two AdamW moments
# The memory model's factors, fitted to the peak resident memory of one step of 32 settings on the CPU
# (bench/estimate_grid.py): the runtime (Python, torch, the libraries; on CUDA the context, not fitted), the weights'
# factor (the weights file's pages stay resident while it loads), and each training term's (copies, the
# allocator's slack). The attention matrices are counted as held (their factor is not fitted: they are too small a
# part of any measured step to tell apart). On a GPU the training terms keep the CPU's factors: autograd keeps the
# same tensors on any device.
RUNTIME_GB = {"cpu": 0.73, "mps": 0.73, "cuda": 0.8}
WEIGHTS_FACTOR = {"cpu": 1.26, "mps": 1.26, "cuda": 1.0}
ACTIVATION_FACTORS = {"layers": 1.17, "checkpoints": 9.21, "attention": 1.0}
# What a public demo adds to the estimate before it admits a run (public_checks.check_memory). With it the estimate
# is above every peak measured: the recipes' runs (up to 16 % under without it, bench/estimates.py) and the grid's
# steps but one (a float32 step with gradient checkpointing and 256 new tokens peaked 42 % higher).
MEMORY_MARGIN = 0.25

# CPU, fitted (bench/estimate_grid.py): the share of the matmul probe the training's forward and backward achieve,
# and generation's (a decoding step multiplies a few rows at a time); the fixed cost of one layer in one decoding
# step (Python, small ops, thread wake-ups) as the time one thread takes for this many FLOPs in the fp32 probe, so
# that it follows this machine's speed.
CPU_TRAIN_EFFICIENCY = 1.02
CPU_GENERATION_EFFICIENCY = 0.43
CPU_LAYER_LATENCY_FLOP = 2.32e8
CPU_TIME_SPREAD = "within about a third"  # the fit's largest error on the grid: 33 %
CPU_MEMORY_BANDWIDTH = 20e9  # bytes/s, a conservative single-socket figure
# GPUs: peak dense 16-bit tensor FLOP/s and memory bandwidth by name; small-model RL reaches a fraction of it.
GPU_SPECS = (  # (name fragment, peak FLOP/s, bytes/s); checked in order, so "A100" comes before "A10"
    ("H200", 989e12, 4.8e12), ("H100", 756e12, 2.0e12), ("A100", 312e12, 1.6e12), ("L40S", 362e12, 0.86e12),
    ("L40", 181e12, 0.86e12), ("A10G", 70e12, 0.6e12), ("A10", 125e12, 0.6e12), ("L4", 121e12, 0.3e12),
    ("T4", 65e12, 0.32e12), ("V100", 125e12, 0.9e12), ("4090", 165e12, 1.0e12), ("3090", 71e12, 0.94e12),
)
GPU_EFFICIENCY = 0.3
GPU_DEFAULT_FLOPS = 30e12
GPU_DEFAULT_BANDWIDTH = 0.5e12
GPU_LAYER_LATENCY_S = 0.5e-3  # kernel launches and Python per layer per decoding step in transformers' generate
GPU_FP32_SLOWDOWN = 8  # fp32 runs without tensor cores
MPS_FLOPS, MPS_BANDWIDTH, MPS_LAYER_LATENCY_S = 2e12, 100e9, 1.0e-3
QUANTIZED_SLOWDOWN = 1.5  # bitsandbytes dequantizes the 4-bit weights in every matmul


# ----------------------------------------------------------------------------------------------------------------
# The model's shape.


def dims_from_config(config: dict) -> ModelDims:
    """The shape from a Hugging Face ``config.json`` (multimodal configs keep it under ``text_config``)."""
    config = config.get("text_config") or config

    def first(*keys, default=None):
        for key in keys:
            if config.get(key) is not None:
                return config[key]
        if default is None:
            raise ConfigError(f"The model's config.json has no {keys[0]}, so its size cannot be estimated.")
        return default

    hidden = int(first("hidden_size", "n_embd", "d_model"))
    heads = int(first("num_attention_heads", "n_head"))
    return ModelDims(
        hidden_size=hidden, num_layers=int(first("num_hidden_layers", "n_layer")),
        intermediate_size=int(first("intermediate_size", "n_inner", default=4 * hidden)),
        vocab_size=int(first("vocab_size")), num_heads=heads,
        num_kv_heads=int(first("num_key_value_heads", default=heads)),
        head_dim=config.get("head_dim"), tied_embeddings=bool(config.get("tie_word_embeddings", True)),
    )


def generic_dims(params: float) -> ModelDims:
    """A typical shape of a given size (24 layers, 50k vocabulary, MLP 8/3 wide) when only the size is known."""
    layers, vocab = 24, 50_000
    # params ~= vocab * h + layers * 12 h^2  ->  solve for h, rounded up to a multiple of 64
    hidden = (-vocab + math.sqrt(vocab**2 + 4 * layers * 12 * params)) / (2 * layers * 12)
    hidden = max(64, math.ceil(hidden / 64) * 64)
    return ModelDims(hidden, layers, hidden * 8 // 3, vocab, hidden // 64, hidden // 64)


_SIZE_IN_NAME = re.compile(r"(?<![\w.])(\d+(?:\.\d+)?)\s*([mb])(?![a-z])", re.IGNORECASE)


def model_dims(model_id: str) -> tuple[ModelDims, str]:
    """The shape of ``model.id`` and where it came from; ConfigError when the size cannot be known here."""
    model_id = model_id.strip()
    preset = find_preset(model_id)
    if preset is not None:
        return preset.dims, "preset"
    path = Path(model_id).expanduser()
    if path.is_dir():
        return _local_dims(path)
    cached = _hub_cache_config(model_id)
    if cached is not None:
        return dims_from_config(json.loads(cached.read_text(encoding="utf-8"))), "config.json in the Hugging Face cache"
    match = _SIZE_IN_NAME.search(model_id.rsplit("/", 1)[-1])
    if match:
        params = float(match.group(1)) * (1e6 if match.group(2).lower() == "m" else 1e9)
        size = f"{match.group(1)}{match.group(2).upper()}"
        return generic_dims(params), f"size read from the name ({size}), typical shape assumed"
    raise ConfigError(f"The size of {model_id} is unknown here (not a preset, not downloaded, no size in its name), "
                      "so no estimate can be made; it may still train fine.")


def _local_dims(path: Path) -> tuple[ModelDims, str]:
    config_path = path / "config.json"
    if not config_path.is_file():
        raise ConfigError(f"The folder {path} holds no config.json, so the model's size is unknown.")
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        raise ConfigError(f"{config_path} is not readable JSON, so the model's size is unknown.") from None
    if (path / "status.json").is_file() and isinstance(config.get("model"), dict):  # a run folder: a RunConfig
        if (path / "model" / "config.json").is_file():
            return _local_dims(path / "model")
        dims, source = model_dims(str(config["model"].get("id", "")))
        return dims, f"the starting model of run {path.name} ({source})"
    return dims_from_config(config), "config.json of the local folder"


def _hub_cache_config(model_id: str) -> Path | None:
    if model_id.count("/") != 1:
        return None
    try:
        from huggingface_hub import try_to_load_from_cache

        found = try_to_load_from_cache(model_id, "config.json")
    except Exception:  # a malformed id is simply "not cached"
        return None
    return Path(found) if isinstance(found, str) else None


# ----------------------------------------------------------------------------------------------------------------
# Memory.


def lora_params(dims: ModelDims, r: int, target_modules: str | list[str]) -> int:
    """Adapter parameters: r * (in + out) for each targeted projection of every block ("all-linear": all seven)."""
    shapes = dims.projection_shapes()
    targets = list(shapes) if target_modules == "all-linear" else [t for t in target_modules if t in shapes]
    return dims.num_layers * sum(r * sum(shapes[t]) for t in targets)


@dataclass
class MemoryEstimate:
    weights_gb: float
    trainable_gb: float  # trainable weights, their gradients and AdamW states (and a reference copy without LoRA)
    activations_gb: float  # training forward/backward for one micro-batch
    generation_gb: float  # KV cache while sampling the completions
    overhead_gb: float
    reward_models_gb: float = 0.0  # the classifier rewards' models, in fp32

    @property
    def total_gb(self) -> float:
        return (self.weights_gb + self.trainable_gb + max(self.activations_gb, self.generation_gb) + self.overhead_gb
                + self.reward_models_gb)


def weights_bytes(dims: ModelDims, value: int, load_in_4bit: bool) -> float:
    """The weights in memory, ``value`` bytes each; with 4-bit loading the blocks' linear layers take NF4's bytes."""
    if load_in_4bit:
        return dims.linear_params * NF4_BYTES_PER_PARAM + (dims.params - dims.linear_params) * value
    return dims.params * value


def estimate_memory(config: RunConfig, dims: ModelDims, dtype: str, load_in_4bit: bool, device: str,
                    prompt_tokens: int = PROMPT_TOKENS) -> MemoryEstimate:
    value = 2 if load_in_4bit else BYTES_PER_VALUE[dtype]  # 4-bit weights compute in 16 bits
    weights = weights_bytes(dims, value, load_in_4bit)
    if config.lora.enabled:
        trainable = lora_params(dims, config.lora.r, config.lora.target_modules) * ADAMW_LORA_BYTES
    else:  # gradients and two AdamW moments in the weights' precision, plus a frozen reference copy if beta > 0
        trainable = dims.params * value * (3 + (1 if config.grpo.beta > 0 else 0))
    terms = training_terms(config, dims, dtype, load_in_4bit, device, prompt_tokens)
    activations = sum(ACTIVATION_FACTORS[name] * held for name, held in terms.items())

    tokens = prompt_tokens + config.grpo.max_new_tokens
    generation_batch = config.completions_per_step  # TRL samples every micro-batch of a step at once
    kv_cache = generation_batch * tokens * dims.num_layers * 2 * dims.kv_width * value
    generation = kv_cache + generation_batch * dims.vocab_size * 4 * 2  # each decoding step's logits, in fp32
    runtime = RUNTIME_GB[device] + (WEIGHTS_FACTOR[device] - 1) * weights / GB
    return MemoryEstimate(weights / GB, trainable / GB, activations / GB, generation / GB, runtime,
                          classifier_memory(config)[0])


def admitted_gb(config: RunConfig, dims: ModelDims, hardware: ResolvedHardware,
                prompt_tokens: int = PROMPT_TOKENS) -> float:
    """The memory a run is admitted by, in a public demo and beside other runs on a GPU: its estimate with the
    estimate's margin (MEMORY_MARGIN)."""
    return estimate_memory(config, dims, hardware.dtype, hardware.load_in_4bit, hardware.device,
                           prompt_tokens).total_gb * (1 + MEMORY_MARGIN)


def training_terms(config: RunConfig, dims: ModelDims, dtype: str, load_in_4bit: bool, device: str,
                   prompt_tokens: int = PROMPT_TOKENS) -> dict[str, float]:
    """Bytes one micro-batch's forward keeps for its backward, by term, before ACTIVATION_FACTORS scale them:

    - ``layers``: each block's values per token (norms, q/k/v/o, the MLP's four, each LoRA adapter's input and A x),
      in the compute precision; with gradient checkpointing one block's, recomputed at a time;
    - ``checkpoints``: with gradient checkpointing, what each checkpointed block keeps a token (its input, and more:
      its fitted factor makes it about nine values of the hidden size);
    - ``attention``: the attention matrices, where the attention implementation keeps them: Dragon's eager formula
      for short bf16 sequences on the CPU (speedups/attention.py) keeps every one, and its float32 softmax;
      transformers' SDPA (everywhere else) keeps none, only a log-sum-exp per row.

    The LM head's logits are never held whole: TRL's fused log-prob head folds the vocabulary in tiles."""
    from ..speedups.attention import EAGER_MAX_SCORES
    from ..speedups.registry import enabled

    value = 2 if load_in_4bit else BYTES_PER_VALUE[dtype]
    tokens = prompt_tokens + config.grpo.max_new_tokens
    micro_batch = config.training.batch_size * config.grpo.group_size
    h, i = dims.hidden_size, dims.intermediate_size
    per_token_layer = 6 * h + 4 * i + dims.attention_width + 2 * dims.kv_width
    if config.lora.enabled:
        shapes = dims.projection_shapes()
        targets = list(shapes) if config.lora.target_modules == "all-linear" else config.lora.target_modules
        per_token_layer += sum(shapes[t][0] + config.lora.r for t in targets if t in shapes)
    checkpointing = config.training.gradient_checkpointing
    layers_held = 1 if checkpointing else dims.num_layers
    scores = micro_batch * dims.num_heads * tokens * tokens
    eager = (device == "cpu" and value == 2 and scores <= EAGER_MAX_SCORES
             and enabled("short_sequence_attention"))
    return {
        "layers": micro_batch * tokens * per_token_layer * layers_held * value,
        "checkpoints": micro_batch * tokens * h * dims.num_layers * value if checkpointing else 0.0,
        "attention": scores * layers_held * (4 + value) if eager else 0.0,
    }


def classifier_memory(config: RunConfig) -> tuple[float, list[str]]:
    """GB of the classifier rewards' models (each loaded once, in fp32), and the models whose size is unknown."""
    gigabytes, unknown = 0.0, []
    for model in dict.fromkeys(spec.model for spec in config.rewards if isinstance(spec, ClassifierReward)):
        try:
            gigabytes += model_dims(model)[0].params * BYTES_PER_VALUE["float32"] / GB
        except ConfigError:
            unknown.append(model)
    return gigabytes, unknown


PREVIEW_REPLIES, PREVIEW_TOKENS = 16, 512  # the Compare tab's generation batch, and a generous reply with its prompt
ALLOCATOR_MARGIN = 1.2  # CUDA's caching allocator rounds blocks up and fragments


def preview_memory_gb(model_id: str, dtype: str, load_in_4bit: bool) -> float:
    """GPU memory a second copy of a model takes to generate previews beside a training: its weights and the KV
    cache and logits of one batch of replies (the CUDA context is the training's). ConfigError if the size is
    unknown here."""
    dims, _ = model_dims(model_id)
    value = BYTES_PER_VALUE[dtype]
    weights = weights_bytes(dims, value, load_in_4bit)
    kv_cache = PREVIEW_REPLIES * PREVIEW_TOKENS * dims.num_layers * 2 * dims.kv_width * value
    logits = PREVIEW_REPLIES * dims.vocab_size * 4 * 2
    return (weights + kv_cache + logits) * ALLOCATOR_MARGIN / GB


MINIMUM_SETTINGS = "LoRA on 16-bit weights, 2 prompts x 4 completions of up to 64 tokens"


def minimum_memory_gb(dims: ModelDims) -> float:
    """Memory for a small but useful run (see MINIMUM_SETTINGS): what the presets table shows."""
    config = RunConfig()
    config.training.batch_size, config.grpo.group_size, config.grpo.max_new_tokens = 2, 4, 64
    return estimate_memory(config, dims, "bfloat16", load_in_4bit=False, device="cpu").total_gb


# ----------------------------------------------------------------------------------------------------------------
# Speed.


@dataclass(frozen=True)
class DeviceSpeed:
    """What one device achieves on this workload (not its peak)."""

    description: str
    flops: float  # FLOP/s in forward and backward passes
    bandwidth: float  # bytes/s for reading the weights
    layer_latency_s: float  # fixed cost of one layer in one decoding step
    generation_flops: float  # FLOP/s in generation's passes
    measured: bool = False  # this machine's own speed, with the fitted factors (else assumed from a name)


# dtype -> FLOP/s per thread, measured once per process (when the app builds its page, before anything else runs):
# the same settings then always give the same estimate. "Detect again" on the Model tab measures again.
_CPU_PROBE: dict[str, float] = {}


def cpu_flops_per_thread(dtype: str) -> float:
    """FLOP/s per torch thread of a transformer-sized matmul on this CPU (~0.05 s, the first time it is asked)."""
    if dtype not in _CPU_PROBE:
        _CPU_PROBE[dtype] = _measure_matmul(dtype)
    return _CPU_PROBE[dtype]


def forget_cpu_speed() -> None:
    """Measure the CPU again at the next estimate (the machine changed, or it was busy when it was measured)."""
    _CPU_PROBE.clear()


def _measure_matmul(dtype: str) -> float:
    import torch

    torch_dtype = getattr(torch, dtype)
    a, b = torch.randn(512, 576, dtype=torch_dtype), torch.randn(576, 1536, dtype=torch_dtype)
    a @ b  # the first call sets up kernels and threads
    best = math.inf
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(4):
            a @ b
        best = min(best, (time.perf_counter() - start) / 4)
    return 2 * 512 * 576 * 1536 / best / torch.get_num_threads()


def device_speed(hardware: ResolvedHardware, info: HardwareInfo,
                 probe: Callable[[str], float] = cpu_flops_per_thread) -> DeviceSpeed:
    """The throughput of the resolved device. ``probe``: the CPU's matmul FLOP/s per thread, by precision (measured
    here when not given)."""
    if hardware.device == "cuda":
        name = info.cuda[hardware.gpu or 0].name if info.cuda else ""
        spec = next(((f, b) for key, f, b in GPU_SPECS if key in name.upper()), None)
        flops, bandwidth = (spec[0] * GPU_EFFICIENCY, spec[1]) if spec else (GPU_DEFAULT_FLOPS, GPU_DEFAULT_BANDWIDTH)
        if hardware.dtype == "float32":
            flops /= GPU_FP32_SLOWDOWN
        described = f"{name or 'a CUDA GPU'}, assuming {flops / 1e12:.0f} TFLOP/s" + ("" if spec else " (unknown GPU)")
        return DeviceSpeed(described, flops, bandwidth, GPU_LAYER_LATENCY_S, flops)
    if hardware.device == "mps":
        return DeviceSpeed(f"Apple MPS, assuming {MPS_FLOPS / 1e12:.0f} TFLOP/s", MPS_FLOPS, MPS_BANDWIDTH,
                           MPS_LAYER_LATENCY_S, MPS_FLOPS)
    cpu_flops = probe(hardware.dtype) * hardware.cpu_threads
    threads = f"{hardware.cpu_threads} CPU thread{'s' if hardware.cpu_threads > 1 else ''}"
    return DeviceSpeed(f"{threads}, measured {cpu_flops / 1e9:.0f} GFLOP/s in {hardware.dtype} when the app started; "
                       "Detect again measures again",
                       cpu_flops * CPU_TRAIN_EFFICIENCY, CPU_MEMORY_BANDWIDTH,
                       CPU_LAYER_LATENCY_FLOP / probe("float32"), cpu_flops * CPU_GENERATION_EFFICIENCY, measured=True)


@dataclass
class StepTime:
    generation_s: float
    training_s: float  # policy forward and backward
    reference_s: float  # reference model forward (beta > 0)

    @property
    def total_s(self) -> float:
        return self.generation_s + self.training_s + self.reference_s


@dataclass(frozen=True)
class StepWork:
    """What one step does, counted (per step: with num_iterations μ, sampling and the reference model's scoring
    happen once every μ steps)."""

    decode_layers: float  # layer passes of the decoding steps: each pays a layer's fixed cost
    generation_flop: float  # the prompts' forward passes and the decoding steps' matmuls and attention
    weight_reads: float  # bytes of weights the decoding steps read
    training_flop: float  # the policy's forward and backward passes (and the recomputed forward)
    reference_flop: float  # the reference model's forward pass (beta > 0)


def step_work(config: RunConfig, dims: ModelDims, dtype: str, load_in_4bit: bool,
              prompt_tokens: int = PROMPT_TOKENS) -> StepWork:
    params, width, layers = dims.params, dims.attention_width, dims.num_layers
    sequences = config.completions_per_step
    new_tokens = config.grpo.max_new_tokens
    length = prompt_tokens + new_tokens
    tokens = sequences * length
    # Attention's two matmuls per layer, for every query against the keys before it: ~2 * length * width FLOPs a
    # token in a forward pass, on average over a sequence (the decoding steps read a cache that grows to length).
    attention = 2 * length * width * layers
    forward = 2 * params + attention  # FLOPs a token in one forward pass
    # A backward pass is one forward's FLOPs for the inputs' gradients and one more for the weights' (none with LoRA:
    # the base is frozen); with gradient checkpointing every block's forward runs twice.
    passes = 1 + (1 if config.lora.enabled else 2) + (1 if config.training.gradient_checkpointing else 0)
    training = float(passes * forward * tokens)
    every = config.grpo.num_iterations
    # With num_iterations μ, a batch is sampled, and scored by the reference model, once every μ steps; the steps in
    # between train on it again, after one more forward pass for the log-probs that the clip compares with.
    if every > 1:
        training += forward * tokens / every
    # With tools, each round of calls reads the prompt and the reply so far again, and decodes on from there (the
    # whole reply, the tools' answers included, stays within max new tokens): at most a prompt's pass and, on
    # average, half the new tokens' decoding steps more a round.
    rounds = config.grpo.max_tool_calling_iterations if config.tools else 0
    decoded = new_tokens * (1 + rounds / 2)
    return StepWork(decode_layers=decoded * layers / every, generation_flop=forward * tokens * (1 + rounds) / every,
                    weight_reads=decoded * weights_bytes(dims, 2 if load_in_4bit else BYTES_PER_VALUE[dtype],
                                                            load_in_4bit) / every,
                    training_flop=training,
                    reference_flop=forward * tokens / every if config.grpo.beta > 0 else 0.0)


def estimate_step_time(config: RunConfig, dims: ModelDims, speed: DeviceSpeed, dtype: str, load_in_4bit: bool,
                       prompt_tokens: int = PROMPT_TOKENS) -> StepTime:
    work = step_work(config, dims, dtype, load_in_4bit, prompt_tokens)
    slowdown = QUANTIZED_SLOWDOWN if load_in_4bit else 1.0  # bitsandbytes dequantizes in every matmul
    # Each decoding step is latency-bound: a fixed cost a layer, then the larger of its compute and its reading of
    # the weights.
    generation = work.decode_layers * speed.layer_latency_s + max(work.generation_flop / speed.generation_flops,
                                                                  work.weight_reads / speed.bandwidth)
    return StepTime(generation * slowdown, work.training_flop / speed.flops * slowdown,
                    work.reference_flop / speed.flops * slowdown)


# ----------------------------------------------------------------------------------------------------------------
# Both, for the UI.


@dataclass
class Estimate:
    model_id: str
    params: int
    dims_source: str
    device: str
    memory: MemoryEstimate
    step: StepTime
    speed: DeviceSpeed
    max_steps: int | None
    available_gb: float | None
    prompt_tokens: int = PROMPT_TOKENS
    notes: list[str] = field(default_factory=list)

    @property
    def fits(self) -> bool | None:
        return None if self.available_gb is None else self.memory.total_gb <= self.available_gb

    def describe(self) -> str:
        """Markdown lines for the UI, starting with how sure the estimate is: measured speeds with fitted factors on
        the CPU, speeds assumed from a name (rough) elsewhere."""
        m, s = self.memory, self.step
        reference = f", reference model {format_seconds(s.reference_s)}" if s.reference_s else ""
        lines = [
            f"**{'Estimate' if self.speed.measured else 'Rough estimate'}** for {self.model_id} "
            f"({format_params(self.params)} parameters, {self.dims_source}), "
            f"assuming prompts of ~{self.prompt_tokens} tokens and completions that use every new token:",
            f"- **Memory ≈ {m.total_gb:.1f} GB**: weights {m.weights_gb:.2f} GB, trainable + optimizer "
            f"{m.trainable_gb:.2f} GB, activations {max(m.activations_gb, m.generation_gb):.2f} GB, "
            f"runtime {m.overhead_gb:.1f} GB" + (f", reward models {m.reward_models_gb:.2f} GB" if m.reward_models_gb
                                                  else ""),
            f"- **Time per step ≈ {format_seconds(s.total_s)}**: generation {format_seconds(s.generation_s)}, "
            f"forward + backward {format_seconds(s.training_s)}{reference} ({self.speed.description})",
        ]
        if self.max_steps:
            lines.append(f"- **{self.max_steps} steps ≈ {format_seconds(s.total_s * self.max_steps)}**, plus model "
                         "loading and the before/after scoring")
        if self.fits is False:
            lines.append(f"- ⚠️ That is more than the {self.available_gb:.1f} GB available on the {self.device}: "
                         "lower batch size, group size or max new tokens, turn on gradient checkpointing, or use "
                         "4-bit weights.")
        lines += [f"- {note}" for note in self.notes]
        if self.speed.measured:
            lines.append(f"\n*On the CPU settings it was fitted to, the estimate came {CPU_TIME_SPREAD} of a measured "
                         "step's time, and within 20 % of its peak memory in all but one. **Measure one step** "
                         "measures these settings here.*")
        else:
            lines.append("\n*Assumed, not measured: real runs often differ by 2x either way. **Measure one step** "
                         "measures these settings here; the Train tab shows the measured time per step.*")
        return "\n".join(lines)


def estimate_run(config: RunConfig, hardware: ResolvedHardware, info: HardwareInfo,
                 probe: Callable[[str], float] = cpu_flops_per_thread, prompt_tokens: int = PROMPT_TOKENS) -> Estimate:
    """Memory and time per step of ``config`` on the resolved hardware (ConfigError when the size is unknown);
    ``probe`` as device_speed takes it."""
    dims, source = model_dims(config.model.id)
    speed = device_speed(hardware, info, probe)
    memory = estimate_memory(config, dims, hardware.dtype, hardware.load_in_4bit, hardware.device, prompt_tokens)
    step = estimate_step_time(config, dims, speed, hardware.dtype, hardware.load_in_4bit, prompt_tokens)
    result = Estimate(config.model.id, dims.params, source, hardware.device, memory, step, speed,
                      config.training.max_steps, available_memory_gb(hardware, info), prompt_tokens)
    result.notes += [f"The size of the classifier {model} is not known here, so its memory is not counted."
                     for model in classifier_memory(config)[1]]
    if config.generation.backend != "transformers":
        result.notes.append("vLLM generation is usually several times faster than the generation time assumed here.")
    return result


def available_memory_gb(hardware: ResolvedHardware, info: HardwareInfo) -> float | None:
    """Free memory on the device that will hold the model: the GPU's free memory, else the machine's (for Apple
    MPS, which shares the machine's memory, all of it)."""
    if hardware.device == "cuda":
        return info.cuda[hardware.gpu or 0].free_gb if info.cuda else None
    return system_memory_gb(free=hardware.device == "cpu")


def format_params(params: float) -> str:
    if params >= 1e9:
        return f"{params / 1e9:.2f}B"
    return f"{params / 1e6:.0f}M" if params >= 1e6 else f"{params / 1e3:.0f}K"


