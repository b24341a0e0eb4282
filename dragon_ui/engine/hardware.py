"""Detect the machine and turn the hardware settings into concrete choices, each with the reason for it.

Why the CPU defaults are what they are (see docs/performance.md): on CPUs without native bf16, bf16
matmuls run ~50x slower than fp32; on a 2-vCPU AMD EPYC with AVX512-BF16, a SmolLM2-135M forward pass ran 3.8x
faster in bf16 than fp32, yet single matmuls of some shapes still ran 13x slower. A CPU flag therefore decides
nothing: a 0.1 s probe of a transformer-MLP-shaped forward and backward does. And torch's thread pool collapses
(~30x slower small matmuls) when it has more threads than idle cores, so the default leaves one core free for the
UI once there are cores to spare.
"""

from __future__ import annotations

import functools
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from ..config import HardwareSettings
from ..errors import ConfigError
from ..system.disk import cache_dir
from ..system import cgroups
from ..system.memory import system_memory_gb
from ..scaleout import distributed
from .libraries import import_all
from .quantization import bitsandbytes_installed

# bf16 runs natively from compute capability 8.0 (Ampere) on. torch.cuda.is_bf16_supported() also says yes for
# older GPUs (T4, V100, RTX 20xx, GTX 10xx), which only emulate it, many times slower than their fp16.
NATIVE_BF16_CAPABILITY = (8, 0)


@dataclass
class CudaDevice:
    index: int
    name: str
    total_gb: float
    free_gb: float | None  # None: not asked (another process's GPU under a launcher) or not answering
    bf16: bool  # native bf16 (see NATIVE_BF16_CAPABILITY)


@dataclass
class HardwareInfo:
    """What this machine offers, for the UI's hardware panel and for resolving "auto"."""

    cuda: list[CudaDevice] = field(default_factory=list)
    mps: bool = False
    cpu_cores: int = 1
    cpu_bf16: bool = False
    bitsandbytes: bool = False
    memory_gb: float | None = None  # the machine's whole memory (None: the platform does not tell)

    def summary(self) -> str:
        parts = [f"CUDA {d.index}: {d.name}, " + (f"{d.free_gb:.1f} of {d.total_gb:.1f} GB free" if d.free_gb is not None
                                                 else f"{d.total_gb:.1f} GB") for d in self.cuda]
        if self.mps:
            parts.append("Apple MPS")
        parts.append(f"CPU: {self.cpu_cores} cores{' with fast bf16' if self.cpu_bf16 else ''}")
        return "; ".join(parts)


@dataclass
class ResolvedHardware:
    """The concrete device, precision and threads a run uses, and why (shown in the UI and the run log)."""

    device: str
    dtype: str
    load_in_4bit: bool
    cpu_threads: int
    reasons: list[str] = field(default_factory=list)
    gpu: int | None = None  # the CUDA GPU this process uses

    @property
    def torch_dtype(self):
        import torch

        return getattr(torch, self.dtype)

    @property
    def torch_device(self) -> str:
        """Where this process's tensors go: "cuda:N" names the GPU, since a thread's default CUDA device is GPU 0."""
        return f"cuda:{self.gpu}" if self.device == "cuda" else self.device

    def weights_dtype(self, lora: bool) -> str:
        """The precision the weights are loaded in for training. fp16 full fine-tuning keeps fp32 weights and
        computes in fp16 (mixed precision): PyTorch's gradient scaler refuses fp16 gradients ("Attempting to unscale
        FP16 gradients"). LoRA trains its own fp32 matrices, so the frozen weights may stay fp16."""
        return "float32" if self.dtype == "float16" and not lora else self.dtype


def available_cpu_cores() -> int:
    """The cores this process may use: those it may run on, no more than its container's CPU quota."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # macOS and Windows have no affinity API
        cores = os.cpu_count() or 1
    return min(cores, cgroups.cpu_quota() or cores)


def release_openmp_threads() -> bool:
    """Let the OpenMP worker threads of the calling thread exit; True if the OpenMP runtime did so.

    Why: torch's CPU ops run on OpenMP, which keeps a pool of worker threads for every thread that ever ran a
    parallel op. GNU OpenMP counts the workers of all pools, and once they outnumber the cores it stops
    spin-waiting at the barriers that end each parallel op and sleeps there instead, so the training thread's many
    small ops each pay a wake-up: after 50 matmuls on the main thread, a step on this 2-vCPU machine took 6.0 s
    instead of 4.0 s. OpenMP 5's ``omp_pause_resource_all`` frees the calling thread's pool, so a thread that has
    done torch work calls this before handing the machine to the trainer.
    """
    runtime = _openmp_runtime()
    return runtime is not None and runtime.omp_pause_resource_all(1) == 0  # 1: omp_pause_soft


@functools.cache
def _openmp_runtime():
    """torch's OpenMP library (GNU libgomp or LLVM libomp), found in this process's memory map.

    Other packages bring their own copies (sentencepiece has a libgomp of its own), so the one inside torch's
    folder wins; pausing another copy would free nothing of torch's.
    """
    import ctypes

    import torch

    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:  # not Linux: macOS and Windows use their own runtimes, left alone
        return None
    torch_dir = str(Path(torch.__file__).parent)
    runtimes = {line.split()[-1] for line in maps.splitlines()
                if Path(line.split()[-1]).name.startswith(("libgomp", "libomp", "libiomp"))}
    ranked = sorted(runtimes, key=lambda path: not path.startswith((torch_dir + os.sep, torch_dir + ".libs" + os.sep)))
    if not ranked:
        return None
    try:
        runtime = ctypes.CDLL(ranked[0])
        runtime.omp_pause_resource_all.argtypes = [ctypes.c_int]
        return runtime
    except (OSError, AttributeError):  # an OpenMP before version 5 has no pause
        return None


_BF16_PROBE: dict[str, bool] = {}


def cpu_bf16_is_fast() -> bool:
    """True when this CPU runs an MLP block (forward + backward) at least 1.5x faster in bf16 than in fp32.

    Measured once per CPU model and torch version and remembered on disk, so the precision a run picks does not
    flip with the machine's load; the rounds alternate between the two precisions and keep each one's best time,
    which a busy core slows down for both alike.
    """
    import platform

    import torch

    key = f"{cpu_model()}|{platform.machine()}|torch {torch.__version__}"
    if key not in _BF16_PROBE:
        path = cache_dir() / "cpu_bf16.json"
        try:
            known = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            known = {}
        if key not in known:
            ratio = _fp32_over_bf16_time()
            known[key] = {"fast": ratio >= 1.5, "fp32_over_bf16": round(ratio, 2)}
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(json.dumps(known, indent=1), encoding="utf-8")
            except OSError:
                pass  # a read-only home: measure again next time
        _BF16_PROBE[key] = bool(known[key]["fast"])
    return _BF16_PROBE[key]


def _fp32_over_bf16_time(rounds: int = 7) -> float:
    import time

    import torch

    def tensors(dtype):
        return (torch.randn(64, 576, dtype=dtype), torch.randn(1536, 576, dtype=dtype, requires_grad=True),
                torch.randn(576, 1536, dtype=dtype, requires_grad=True))

    def once(x, up, down) -> float:
        start = time.perf_counter()
        torch.nn.functional.linear(torch.nn.functional.silu(torch.nn.functional.linear(x, up)), down).sum().backward()
        return time.perf_counter() - start

    fp32, bf16 = tensors(torch.float32), tensors(torch.bfloat16)
    best = {"fp32": float("inf"), "bf16": float("inf")}
    for _ in range(rounds):
        best["fp32"] = min(best["fp32"], once(*fp32))
        best["bf16"] = min(best["bf16"], once(*bf16))
    return best["fp32"] / best["bf16"]


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or "unknown CPU"


def detect_hardware() -> HardwareInfo:
    """What this machine offers. Under a launcher a process asks only its own GPU for its free memory: asking
    creates a CUDA context on that GPU (memory lost to training, and an error on a GPU in exclusive-process mode)."""
    import_all()  # the first use of transformers and torch waits for an import under way
    import torch

    info = HardwareInfo(cpu_cores=available_cpu_cores(), cpu_bf16=cpu_bf16_is_fast(),
                        memory_gb=system_memory_gb(free=False))
    if torch.cuda.is_available():
        own = distributed.local_rank() if distributed.is_distributed() else None
        for index in range(torch.cuda.device_count()):
            properties = torch.cuda.get_device_properties(index)
            free = None
            if own is None or index == own:
                try:
                    free = torch.cuda.mem_get_info(index)[0] / 2**30
                except RuntimeError:  # busy in exclusive-process mode, or failing
                    pass
            info.cuda.append(CudaDevice(index, properties.name, properties.total_memory / 2**30, free,
                                        (properties.major, properties.minor) >= NATIVE_BF16_CAPABILITY))
    info.mps = bool(getattr(torch.backends, "mps", None) and torch.backends.mps.is_available())
    info.bitsandbytes = bitsandbytes_installed()
    return info


@functools.cache
def this_machine() -> HardwareInfo:
    """This machine's hardware, asked once: what a public demo admits, and how many runs train side by side, must
    not move while runs use it (its totals do not; its free memory, asked once here, is not for reading)."""
    return detect_hardware()


def default_cpu_threads(cores: int | None = None) -> int:
    """All cores on small machines (2 threads: 36-39 s/step vs 53-67 s on 1), one spare from 4 cores up.

    Under torchrun/accelerate the cores are shared by the processes on this machine (LOCAL_WORLD_SIZE): giving each
    of 2 processes both cores of a 2-core machine made a step about 5x slower.
    """
    cores = (cores or available_cpu_cores()) // distributed.local_world_size()
    return max(1, cores if cores <= 3 else cores - 1)


def resolve_hardware(settings: HardwareSettings, info: HardwareInfo | None = None) -> ResolvedHardware:
    """Turn "auto" into real choices and refuse impossible ones with a sentence that says what to pick instead."""
    info = info or detect_hardware()
    reasons: list[str] = []
    device = settings.device
    if device == "auto":
        device = "cuda" if info.cuda else "mps" if info.mps else "cpu"
        reasons.append(f"device {device}: " + {"cuda": "a CUDA GPU was found",
                                               "mps": "no CUDA GPU, but Apple MPS is available",
                                               "cpu": "no CUDA GPU or Apple MPS was found"}[device])
    elif device == "cuda" and not info.cuda:
        raise ConfigError("hardware.device is cuda, but no CUDA GPU is visible to PyTorch on this machine; choose auto or cpu.")
    elif device == "mps" and not info.mps:
        raise ConfigError("hardware.device is mps, but Apple MPS is not available here (it needs a Mac with Apple silicon); choose auto or cpu.")
    else:
        reasons.append(f"device {device}: chosen in the settings")
    gpu = None
    if device == "cuda":
        gpu, used = _choose_gpu(settings, info, reasons)
    elif settings.gpu is not None:
        reasons.append(f"hardware.gpu {settings.gpu} is not used: the run trains on {device}")

    dtype = settings.dtype
    if dtype == "auto":
        if device == "cuda":
            dtype = "bfloat16" if all(d.bf16 for d in used) else "float16"
            reasons.append(f"precision {dtype}: " + ("the GPU computes bf16 natively" if dtype == "bfloat16" else
                                                     "the GPU has no native bf16 (it needs compute capability 8.0), "
                                                     "so fp16"))
        elif device == "cpu" and info.cpu_bf16:
            dtype = "bfloat16"
            reasons.append("precision bfloat16: this CPU computes bf16 natively (measured faster than fp32)")
        else:
            dtype = "float32"
            reasons.append("precision float32: " + ("MPS trains reliably only in fp32" if device == "mps" else
                                                    "bf16 is not faster than fp32 on this CPU (measured)"))
    elif dtype == "float16" and device == "cpu":
        raise ConfigError("hardware.dtype float16 is not supported for training on the CPU; choose auto or float32.")
    elif dtype == "bfloat16" and device == "cuda" and not all(d.bf16 for d in used):
        raise ConfigError("hardware.dtype is bfloat16, but this GPU has no native bf16 (it needs compute capability "
                          "8.0, an A100, RTX 30xx or newer) and would emulate it slowly; choose auto or float16.")
    else:
        reasons.append(f"precision {dtype}: chosen in the settings")

    if settings.load_in_4bit:
        if device != "cuda":
            raise ConfigError("hardware.load_in_4bit needs a CUDA GPU (bitsandbytes 4-bit training); turn it off on CPU and Apple MPS.")
        if not info.bitsandbytes:
            raise ConfigError("hardware.load_in_4bit needs the bitsandbytes package; install it with `pip install bitsandbytes`.")
        reasons.append("4-bit weights (QLoRA): chosen in the settings")

    threads = settings.cpu_threads or default_cpu_threads(info.cpu_cores)
    if device == "cpu":
        reasons.append(f"{threads} CPU thread{'s' if threads > 1 else ''}: "
                       + ("chosen in the settings" if settings.cpu_threads else
                          f"{info.cpu_cores} cores available" + (", one left free for the app" if threads < info.cpu_cores else "")))
    return ResolvedHardware(device=device, dtype=dtype, load_in_4bit=settings.load_in_4bit, cpu_threads=threads,
                            reasons=reasons, gpu=gpu)


def resolve_for_this_machine(settings: HardwareSettings, info: HardwareInfo | None = None) -> ResolvedHardware:
    """A run's hardware settings for generating with it here, on a machine that may not be the one it trained on.

    A run trained in 4-bit on a CUDA GPU, or in fp16, is still compared, previewed and evaluated on a Mac or a CPU:
    where its own settings cannot work, the device and precision are chosen as "auto" would, with full-precision
    weights (a QLoRA adapter applies to them as well: that is how QLoRA adapters are shared).
    """
    info = info or detect_hardware()
    try:
        return resolve_hardware(settings, info)
    except ConfigError as refusal:
        gpu = settings.gpu if settings.gpu is not None and settings.gpu < len(info.cuda) else None
        resolved = resolve_hardware(HardwareSettings(cpu_threads=settings.cpu_threads, gpu=gpu), info)
        resolved.reasons.insert(0, f"the run's training hardware is not available here ({refusal.args[0]}), "
                                   "so the settings below are used instead, with full-precision weights")
        return resolved


def _choose_gpu(settings: HardwareSettings, info: HardwareInfo, reasons: list[str]) -> tuple[int, list[CudaDevice]]:
    """The GPU this process trains on, and the GPUs whose abilities decide the precision.

    One process uses one GPU: transformers would spread a single process over every visible GPU with
    nn.DataParallel, which TRL refuses. Under a launcher each process owns the GPU of its LOCAL_RANK, and the
    precision is decided from all of this machine's GPUs so that every process picks the same.
    """
    if distributed.is_distributed():
        own = distributed.local_rank()
        if own >= len(info.cuda):
            raise ConfigError(f"This process is number {own} on its machine (LOCAL_RANK), but only {len(info.cuda)} "
                              "CUDA GPUs are visible; start as many processes per machine as it has GPUs.")
        reasons.append(f"GPU {own} ({info.cuda[own].name}): each launched process uses the GPU of its LOCAL_RANK"
                       + ("; hardware.gpu applies to one process only" if settings.gpu is not None else ""))
        return own, info.cuda
    if settings.gpu is not None and settings.gpu >= len(info.cuda):
        raise ConfigError(f"hardware.gpu is {settings.gpu}, but PyTorch sees {len(info.cuda)} CUDA GPU"
                          f"{'s' if len(info.cuda) != 1 else ''} here (numbered from 0); choose one of them, or leave "
                          "it empty for the first.")
    index = settings.gpu or 0
    chosen = info.cuda[index]
    if settings.gpu is not None:
        why = "chosen in the settings"
    elif len(info.cuda) > 1:
        why = (f"the first of {len(info.cuda)} visible GPUs (one process trains on one GPU; hardware.gpu or "
               "CUDA_VISIBLE_DEVICES picks another, and the exported launch folder uses them all)")
    else:
        why = "the only visible GPU"
    reasons.append(f"GPU {index} ({chosen.name}): {why}")
    return index, [chosen]
