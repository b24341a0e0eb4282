"""The few collective operations a run needs when it is launched as several processes (accelerate launch, torchrun).

Every process trains its shard through TRL/accelerate; only the main process writes the run directory. The processes
must agree on three things, each done here with one tiny collective: which run directory they share, when the main
process has finished writing or evaluating (a barrier), and whether anyone has seen a stop request (so they all
leave the training loop at the same step instead of deadlocking in the next gradient all-reduce).
"""

from __future__ import annotations

import os
from datetime import timedelta

# How long a process waits at a collective for the others. NCCL's default of 10 minutes is shorter than the main
# process may take alone (writing the run folder, scoring held-out prompts), and a timeout kills the whole job.
COLLECTIVE_TIMEOUT = timedelta(hours=2)
SHARDED_STRATEGIES = ("zero3", "fsdp")


def world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def is_distributed() -> bool:
    return world_size() > 1


def is_main_process() -> bool:
    return int(os.environ.get("RANK", "0")) == 0


def local_world_size() -> int:
    """The processes of this run on this machine, which share its cores."""
    return max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))


def local_rank() -> int:
    """This process's number on its own machine, which is also the number of the GPU it owns."""
    return int(os.environ.get("LOCAL_RANK", "0"))


def shards_weights(config) -> bool:
    """True when the launch splits the weights themselves over the processes (ZeRO-3, FSDP): then no process may
    load or use a whole model on its own while the trainer holds the shards."""
    return is_distributed() and config.distributed.strategy in SHARDED_STRATEGIES


def _state():
    """accelerate's process state; the first call joins the process group (gloo on CPU, nccl on CUDA) with
    COLLECTIVE_TIMEOUT; transformers' own setup later finds the group made and keeps it."""
    from accelerate import PartialState

    return PartialState(timeout=COLLECTIVE_TIMEOUT)


def broadcast_from_main(value):
    """The main process's ``value`` on every process (used for the run directory path)."""
    if not is_distributed():
        return value
    import torch.distributed as dist

    holder = [value]
    # The device must be named: NCCL sends through this process's own GPU, and the calling thread's current CUDA
    # device is not it (a worker thread starts on GPU 0).
    dist.broadcast_object_list(holder, src=0, device=_state().device)
    return holder[0]


def barrier() -> None:
    if is_distributed():
        _state().wait_for_everyone()


def any_process(flag: bool) -> bool:
    """True on every process if it is True on any; a one-element all-reduce per call."""
    if not is_distributed():
        return flag
    import torch
    import torch.distributed as dist

    state = _state()
    tensor = torch.tensor([1.0 if flag else 0.0], device=state.device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return bool(tensor.item() > 0)


def sum_over_processes(values: list[int]) -> list[int]:
    """Element-wise sum of a list of counts across processes (reward error counts)."""
    if not is_distributed() or not values:
        return values
    import torch
    import torch.distributed as dist

    state = _state()
    tensor = torch.tensor(values, dtype=torch.float64 if state.device.type == "cpu" else torch.float32, device=state.device)
    dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return [int(round(v)) for v in tensor.tolist()]


def check_runnable_here(config, device: str) -> None:
    """Refuse, with a sentence, scale-out settings this machine or this launch cannot honour (raises ConfigError)."""
    import importlib.util

    from ..errors import ConfigError

    backend = config.generation.backend
    if backend != "transformers":
        if device != "cuda":
            raise ConfigError(f"generation.backend {backend} needs a CUDA GPU (vLLM does not run on {device}); "
                              "choose transformers here, or export the run for a GPU machine.")
        if importlib.util.find_spec("vllm") is None:
            raise ConfigError(f"generation.backend {backend} needs the vllm package (pip install vllm; TRL 1.16 "
                              "supports vLLM 0.22 to 0.31).")
    strategy = config.distributed.strategy
    if not is_distributed() or strategy == "ddp":
        return
    if device != "cuda":
        raise ConfigError(f"distributed.strategy {strategy} needs CUDA GPUs; use ddp to train on several CPU processes.")
    if strategy in SHARDED_STRATEGIES and config.hardware.load_in_4bit:
        raise ConfigError(f"hardware.load_in_4bit cannot be combined with distributed.strategy {strategy}: sharding "
                          "4-bit weights over GPUs is not supported here; use ddp or zero2 with 4-bit, or turn "
                          "4-bit off.")
    if strategy in ("zero2", "zero3"):
        if importlib.util.find_spec("deepspeed") is None:
            raise ConfigError(f"distributed.strategy {strategy} needs the deepspeed package (pip install deepspeed).")
        if os.environ.get("ACCELERATE_USE_DEEPSPEED", "").lower() != "true":
            raise ConfigError(f"distributed.strategy is {strategy}, but this was not launched with DeepSpeed; use the "
                              "exported launch.sh (or accelerate launch --config_file with its accelerate.yaml).")
    if strategy == "fsdp" and os.environ.get("ACCELERATE_USE_FSDP", "").lower() != "true":
        raise ConfigError("distributed.strategy is fsdp, but this was not launched with FSDP; use the exported "
                          "launch.sh (or accelerate launch --config_file with its accelerate.yaml).")
