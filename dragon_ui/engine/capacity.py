"""How many runs this machine trains side by side, and each one's share of it: the rule the queue starts runs by.

Runs share the machine only where they train on the same device:

- on the CPU, while each has at least ``CORES_PER_RUN`` cores: ``max(1, cores // 4)`` runs, so a machine of under 8
  cores trains one at a time; and while their memory estimates, each with the estimate's margin, add up to the
  machine's memory less ``APP_GB`` (the app, its warm worker and the system). A run whose size is not known, or
  a machine whose memory is not, trains one at a time. Cores and memory are the container's where it is held to
  less than the host's (system/cgroups.py). Where several fit, every run gets its share of threads, ``(cores - 1) // slots``
  (one core stays free for the app, as hardware.default_cpu_threads leaves it), whether others train beside it yet
  or not: a run's threads cannot change once it trains, and more threads than idle cores make torch's thread pool
  collapse. A run's own ``hardware.cpu_threads`` above its share is lowered to it;
- on a CUDA GPU, while the memory estimates of the runs on it, each with the estimate's margin (the estimate
  a public demo admits a run by, estimate.admitted_gb) and ``CUDA_CONTEXT_GB`` for its process's CUDA context
  (which the cap below does not hold), add up to no more than the GPU's memory. Each run is held to
  its estimate there (torch.cuda.set_per_process_memory_fraction), so that one that outgrows it ends out of memory
  itself instead of ending its neighbours; a run whose size is not known trains alone on its GPU, uncapped;
- on Apple MPS, or where a run's device cannot be told (its config cannot be read), one at a time.

Only a shared machine (a public demo, a workshop's: ``side_by_side``) trains runs side by side. On your own machine
runs train one at a time, each with the whole machine (its threads, its GPU uncapped), as they always did: the run
you started is the one you wait for. A run alone always trains, whatever its estimate. The machine's facts are
an argument everywhere (hardware.HardwareInfo: its cores, its GPUs' memory), so tests give a simulated one.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from ..config import RunConfig
from ..errors import ConfigError
from .estimate import PROMPT_TOKENS, admitted_gb, model_dims
from .hardware import HardwareInfo, ResolvedHardware, resolve_hardware

CORES_PER_RUN = 4
APP_GB = 2.0  # kept for the app, its warm worker and the system when CPU runs share the memory
CUDA_CONTEXT_GB = 1.0  # what each process's CUDA context takes beside what torch allocates (0.3-0.9 GB measured)
SHARING_DEVICES = ("cpu", "cuda")  # every other device (mps, or one unknown) trains one run at a time


@dataclass(frozen=True)
class Need:
    """What one run takes of the machine: the device it trains on, its GPU, and the memory it is admitted by
    (None: its model's size is unknown)."""

    device: str
    gpu: int | None = None
    gb: float | None = None


UNKNOWN = Need("unknown")  # a run whose config cannot be read: it takes its turn alone (and fails there, saying why)


@dataclass(frozen=True)
class Share:
    """What a run's training process holds itself to (None: no limit of ours, as for a run alone): torch's CPU
    threads, and the share of its GPU's memory."""

    cpu_threads: int | None = None
    gpu_memory_fraction: float | None = None

    def to_json(self) -> dict:
        return {"cpu_threads": self.cpu_threads, "gpu_memory_fraction": self.gpu_memory_fraction}

    @classmethod
    def from_json(cls, data: dict | None) -> Share:
        return cls(**(data or {}))

    def apply(self, hardware: ResolvedHardware) -> None:
        """Train with this share's threads, saying why in the reasons (the run's log and status): the machine's
        share where the run's settings leave them empty, or lower."""
        if self.cpu_threads is not None and hardware.device == "cpu" and hardware.cpu_threads != self.cpu_threads:
            hardware.cpu_threads = self.cpu_threads
            hardware.reasons.append(f"{self.cpu_threads} CPU thread{'s' if self.cpu_threads > 1 else ''}: this "
                                    "run's share of the cores, beside the runs that may train with it")


def cpu_slots(machine: HardwareInfo) -> int:
    """How many CPU runs train side by side here: each with at least CORES_PER_RUN cores, and always one."""
    return max(1, machine.cpu_cores // CORES_PER_RUN)


def need_of(config: RunConfig, machine: HardwareInfo, longest_prompt: int | None = None) -> Need:
    """What ``config``'s run takes of ``machine``; ``longest_prompt``: its longest prompt in tokens, once its data
    was read."""
    try:
        hardware = resolve_hardware(config.hardware, machine)
    except ConfigError:
        return UNKNOWN
    gpu = hardware.gpu if hardware.device == "cuda" else None
    if hardware.device not in SHARING_DEVICES:
        return Need(hardware.device)
    try:
        dims, _ = model_dims(config.model.id)
    except ConfigError:
        return Need(hardware.device, gpu)
    return Need(hardware.device, gpu, admitted_gb(config, dims, hardware, longest_prompt or PROMPT_TOKENS))


def share_of(config: RunConfig, need: Need, machine: HardwareInfo, side_by_side: bool = True) -> Share:
    """What the run of ``config`` holds itself to on ``machine`` (see the module's docstring); nothing of ours
    where runs do not train ``side_by_side``."""
    if not side_by_side:
        return Share()
    if need.device == "cpu" and (slots := cpu_slots(machine)) > 1:
        share = max(1, (machine.cpu_cores - 1) // slots)
        return Share(cpu_threads=min(config.hardware.cpu_threads or share, share))
    if need.device == "cuda" and need.gb is not None and need.gpu is not None:
        total = machine.cuda[need.gpu].total_gb
        if need.gb < total:
            return Share(gpu_memory_fraction=need.gb / total)
    return Share()


def fits(machine: HardwareInfo, training: Sequence[Need], new: Need, side_by_side: bool = True) -> bool:
    """Whether a run that takes ``new`` may start beside the runs ``training`` now (without ``side_by_side``, only
    when none trains)."""
    if not training:
        return True
    if not side_by_side:
        return False
    if new.device not in SHARING_DEVICES or any(need.device != new.device for need in training):
        return False
    if new.device == "cpu":
        return len(training) < cpu_slots(machine) and _within(
            [*training, new], None if machine.memory_gb is None else machine.memory_gb - APP_GB, 0.0)
    on_its_gpu = [need for need in training if need.gpu == new.gpu]
    if not on_its_gpu:
        return True
    return new.gpu is not None and _within([*on_its_gpu, new], machine.cuda[new.gpu].total_gb, CUDA_CONTEXT_GB)


def _within(needs: Sequence[Need], memory_gb: float | None, each_gb: float) -> bool:
    """Whether runs of ``needs``, each with ``each_gb`` more, fit in ``memory_gb`` together: never where the memory
    or a run's size is not known (it trains alone)."""
    sizes = [need.gb for need in needs]
    if memory_gb is None or any(size is None for size in sizes):
        return False
    return sum(size + each_gb for size in sizes if size is not None) <= memory_gb


def expected_starts(machine: HardwareInfo, training: Sequence[tuple[Need, float | None]],
                    waiting: Sequence[tuple[str, Need, float | None]], side_by_side: bool = True,
                    ) -> dict[str, float | None]:
    """In how many seconds each waiting run should start, by id (None: not known): the runs ``training`` (each with
    the seconds it has left) and the runs ``waiting`` (first in line first, each with the seconds it should train)
    played forward by the rule the queue starts runs by, first in line first, none jumping the line."""
    ends = [(math.inf if left is None else left, need) for need, left in training]
    now, starts = 0.0, {}
    for run_id, need, seconds in waiting:
        ends = [(end, other) for end, other in ends if end > now]
        while not fits(machine, [other for _, other in ends], need, side_by_side):
            first = min(ends, key=lambda pair: pair[0])
            now = first[0]
            ends.remove(first)
        starts[run_id] = None if math.isinf(now) else now
        ends.append((now + (math.inf if seconds is None else seconds), need))
    return starts
