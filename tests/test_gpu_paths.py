"""The CUDA and launcher paths, checked on a CPU machine: torch.cuda answers as a GPU machine would, the libraries'
entry points are spied on where a GPU would be needed, and the exported SLURM script runs under bash with stub
cluster commands. Each test fails without the fix it guards (see docs/reference.md, "Hardware choices")."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
import yaml

from dragon_ui.config import HardwareSettings, ModelConfig, RunConfig
from dragon_ui.engine import models, training
from dragon_ui.engine.capacity import Share
from dragon_ui.engine.hardware import CudaDevice, HardwareInfo, ResolvedHardware
from dragon_ui.errors import BusyError, ConfigError
from dragon_ui.scaleout import distributed
from dragon_ui.scaleout.launch_folder import export_launch_folder
from dragon_ui.public import LAPTOP

CUDA_1 = ResolvedHardware("cuda", "bfloat16", False, 1, gpu=1)


@pytest.fixture
def two_gpus(monkeypatch) -> list:
    """torch.cuda of a machine with two GPUs; returns the devices set_device was called with."""
    chosen: list = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "set_device", chosen.append)
    return chosen


def new_run(tmp_path: Path):
    from dragon_ui.runstore import RunDir

    return RunDir.create(tmp_path / "runs", "gpu-paths")


# --- one process, one GPU ---------------------------------------------------------------------------------------


def test_one_process_on_a_two_gpu_machine_trains_on_the_chosen_gpu_alone(two_gpus, tiny_config_dict, tmp_path):
    """transformers hands a single process every visible GPU (nn.DataParallel), which TRL's GRPOTrainer refuses."""
    hardware = ResolvedHardware("cuda", "float32", False, 1, gpu=1)  # bf16 would ask the (absent) GPU about it
    args = training.grpo_args(RunConfig.from_dict(tiny_config_dict, policy=LAPTOP), new_run(tmp_path), hardware, policy=LAPTOP)
    assert args.n_gpu == 1
    assert args.device == torch.device("cuda", 1)
    assert two_gpus[-1] in (1, torch.device("cuda", 1))


def test_the_worker_thread_selects_its_own_gpu(two_gpus):
    """A new thread's current CUDA device is GPU 0, whatever the main thread chose."""
    thread = threading.Thread(target=training._use_hardware, args=(CUDA_1, Share()))
    thread.start()
    thread.join()
    assert two_gpus == [1]


def test_a_run_beside_others_holds_itself_to_its_share_of_its_gpu(two_gpus, monkeypatch):
    held: list = []
    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction", lambda share, gpu: held.append((share, gpu)))
    training._use_hardware(CUDA_1, Share(gpu_memory_fraction=0.25))
    training._use_hardware(CUDA_1, Share())  # alone on its GPU, or of a size unknown: the whole GPU
    assert two_gpus == [1, 1] and held == [(0.25, 1)]


def test_collectives_name_the_process_device_and_wait_long_enough(monkeypatch):
    import accelerate
    import torch.distributed as dist

    made: list[dict] = []

    class State:
        device = torch.device("cuda", 3)

        def __init__(self, **kwargs):
            made.append(kwargs)

    sent: list[dict] = []
    monkeypatch.setattr(accelerate, "PartialState", State)
    monkeypatch.setattr(dist, "broadcast_object_list", lambda holder, src, device=None: sent.append({"device": device}))
    monkeypatch.setenv("WORLD_SIZE", "4")
    distributed.broadcast_from_main("runs/x")
    assert sent == [{"device": torch.device("cuda", 3)}]  # NCCL sends through this process's GPU, not GPU 0
    assert made[0]["timeout"] >= distributed.COLLECTIVE_TIMEOUT  # NCCL's own default is 10 minutes


def test_the_training_arguments_keep_the_collective_timeout(tiny_config_dict, tmp_path):
    args = training.grpo_args(RunConfig.from_dict(tiny_config_dict, policy=LAPTOP), new_run(tmp_path),
                              ResolvedHardware("cpu", "float32", False, 1), policy=LAPTOP)
    assert args.ddp_timeout == distributed.COLLECTIVE_TIMEOUT.total_seconds()


# --- loading ----------------------------------------------------------------------------------------------------


@pytest.fixture
def loading(monkeypatch) -> list[dict]:
    """AutoModelForCausalLM.from_pretrained's keyword arguments, with a tiny stand-in model returned."""
    import transformers

    calls: list[dict] = []

    def from_pretrained(path, **kwargs):
        calls.append(kwargs)
        return torch.nn.Linear(2, 2)

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", from_pretrained)
    monkeypatch.setattr(models, "allow_bitsandbytes", lambda: None)
    monkeypatch.setattr(models.speedups, "apply_to_loaded_model", lambda model: None)
    return calls


SOURCE = models.ModelSource("local", "/models/tiny", "tiny")


@pytest.mark.parametrize("hardware, placement, device_map", [
    (CUDA_1, models.ON_DEVICE, {"": "cuda:1"}),  # straight to the GPU, never a whole copy in host memory first
    (ResolvedHardware("cuda", "bfloat16", True, 1, gpu=1), models.ON_DEVICE, {"": 1}),  # 4-bit: this process's GPU
    (ResolvedHardware("mps", "float32", False, 1), models.ON_DEVICE, {"": "mps"}),
    (ResolvedHardware("cpu", "float32", False, 1), models.ON_DEVICE, None),
    (CUDA_1, models.BY_LAUNCHER, None),  # ZeRO-3 / FSDP place the shards themselves
])
def test_weights_load_where_the_process_trains(loading, hardware, placement, device_map):
    models.load_model(SOURCE, hardware, placement=placement)
    assert loading[0].get("device_map") == device_map


def test_the_weights_dtype_can_differ_from_the_compute_dtype(loading):
    models.load_model(SOURCE, ResolvedHardware("cuda", "float16", False, 1, gpu=0), dtype="float32")
    assert loading[0]["dtype"] is torch.float32


class Sentinel(Exception):
    pass


@pytest.mark.parametrize("sharded, lora, dtype, placement, weights_dtype", [
    (True, True, "bfloat16", models.BY_LAUNCHER, "bfloat16"),
    (False, True, "float16", models.ON_DEVICE, "float16"),
    (False, False, "float16", models.ON_DEVICE, "float32"),  # fp16 full fine-tuning: fp32 master weights
])
def test_the_run_builds_its_arguments_before_it_loads_the_model(monkeypatch, tiny_config_dict, sharded, lora, dtype,
                                                                  placement, weights_dtype):
    """ZeRO-3 shards the weights as they load only once the training arguments exist."""
    tiny_config_dict["lora"]["enabled"] = lora
    config = RunConfig.from_dict(tiny_config_dict, policy=LAPTOP)
    run = training.prepare(config, policy=LAPTOP)
    order: list = []
    monkeypatch.setattr(training, "resolve_hardware", lambda settings: ResolvedHardware("cuda", dtype, False, 1, gpu=0))
    monkeypatch.setattr(training, "_use_hardware", lambda hardware, share: order.append("gpu selected"))
    monkeypatch.setattr(training, "_gpu_name", lambda hardware: "NVIDIA H100 80GB HBM3")  # no CUDA to ask here
    monkeypatch.setattr(training, "grpo_args", lambda *args, **kwargs: order.append("arguments"))
    monkeypatch.setattr(distributed, "shards_weights", lambda config: sharded)

    def load_model(source, hardware, dtype=None, placement=models.ON_DEVICE):
        order.append(("model", dtype, placement))
        raise Sentinel

    monkeypatch.setattr(training, "load_model", load_model)
    with pytest.raises(Sentinel):
        training._train(training.Training(run, policy=LAPTOP), config, None)
    assert order == ["gpu selected", "arguments", ("model", weights_dtype, placement)]


@pytest.mark.timeout(300)
def test_with_sharded_weights_both_sides_are_scored_from_the_saved_weights(monkeypatch, tiny_config_dict):
    """Under ZeRO-3/FSDP the main process cannot generate alone with its shard while the others wait: the before
    and after scores come from the saved weights, loaded whole once the trainer is gone."""
    monkeypatch.setattr(distributed, "shards_weights", lambda config: True)
    run = training.train_config(RunConfig.from_dict(tiny_config_dict, policy=LAPTOP), policy=LAPTOP)
    assert run.read_status()["state"] == "succeeded", run.read_status().get("error")
    evaluation = run.read_eval()
    assert {"before", "after"} <= set(evaluation) and evaluation["after"]["weights"] == "the final adapter"
    log = run.log_path.read_text()
    assert log.index("Saved the trained adapter") < log.index("Held-out reward before")


def test_the_offline_copy_is_converted_once_across_processes(monkeypatch, tmp_path):
    """The processes of a launch on an offline machine all reach the conversion at once; one converts, the others
    wait for it and use its folder."""
    monkeypatch.setenv("DRAGON_UI_CACHE", str(tmp_path))
    monkeypatch.setattr(models, "offline_gguf_path", lambda: tmp_path / "model.gguf")
    import transformers

    def convert(*args, **kwargs):
        raise AssertionError("converted a second time")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", convert)
    target = tmp_path / "models" / "SmolLM2-135M-Instruct-Q4_1"
    other_process = subprocess.Popen([sys.executable, "-c", f"""
import pathlib, time
from filelock import FileLock
target = pathlib.Path({str(target)!r})
target.parent.mkdir(parents=True, exist_ok=True)
with FileLock(str(target.parent / f".{{target.name}}.lock")):
    print("converting", flush=True)
    time.sleep(2)
    target.mkdir()
    (target / "model.safetensors").write_bytes(b"weights")
"""], stdout=subprocess.PIPE, text=True)
    assert other_process.stdout.readline().strip() == "converting"
    assert models.offline_default_dir() == target
    other_process.wait(timeout=30)


# --- previews beside a training ---------------------------------------------------------------------------------


@pytest.fixture
def training_elsewhere(monkeypatch):
    """training.active_runs() as while a run trains in this process, until the test ends (before the studio
    fixture checks that no training is left)."""
    with monkeypatch.context() as patch:
        patch.setattr(training, "active_runs", lambda: ["a training"])
        yield


@pytest.mark.parametrize("free_gb, refused", [(0.2, True), (70.0, False), (None, True)])
def test_previews_beside_a_gpu_training_need_room_on_its_gpu(studio, training_elsewhere, monkeypatch, free_gb,
                                                             refused):
    gpu_machine = HardwareInfo(cuda=[CudaDevice(0, "NVIDIA A100", 80.0, free_gb, True)], cpu_cores=16)
    monkeypatch.setattr(studio, "hardware", lambda refresh=False: gpu_machine)
    loaded: list = []
    monkeypatch.setattr(studio.previews.cache, "load", lambda *args: loaded.append(args) or ("model", "tokenizer"))
    model = RunConfig().model  # SmolLM2-135M: its size is known
    if refused:
        with pytest.raises(BusyError, match=r"A training is using GPU 0, and a preview of .* needs about \d"):
            studio.previews.load(model, settings=HardwareSettings(device="cuda"))
        assert loaded == []
    else:
        assert studio.previews.load(model, settings=HardwareSettings(device="cuda")) == ("model", "tokenizer")


def test_previews_beside_a_cpu_training_are_refused(studio, training_elsewhere, monkeypatch):
    monkeypatch.setattr(studio, "hardware", lambda refresh=False: HardwareInfo(cpu_cores=2))
    with pytest.raises(BusyError, match="this machine's CPU"):
        studio.previews.load(RunConfig().model)


@pytest.mark.skipif(torch.cuda.is_available(), reason="with a GPU here, the preview runs on it")
def test_a_4bit_cuda_run_is_previewed_on_this_cpu_in_full_precision(tiny_model_dir):
    cache = models.ModelCache()
    model, _ = cache.load(ModelConfig(id=str(tiny_model_dir)),
                          settings=HardwareSettings(device="cuda", dtype="float16", load_in_4bit=True))
    parameter = next(model.parameters())
    assert parameter.device.type == "cpu" and parameter.dtype in (torch.float32, torch.bfloat16)
    cache.release()


# --- launching --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("strategy", ["zero3", "fsdp"])
def test_4bit_weights_are_not_sharded(tiny_config_dict, monkeypatch, strategy):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED" if strategy == "zero3" else "ACCELERATE_USE_FSDP", "true")
    tiny_config_dict["distributed"] = {"strategy": strategy}
    tiny_config_dict["hardware"] = {"load_in_4bit": True}
    with pytest.raises(ConfigError, match=f"load_in_4bit cannot be combined with distributed.strategy {strategy}"):
        distributed.check_runnable_here(RunConfig.from_dict(tiny_config_dict, policy=LAPTOP), "cuda")


@pytest.mark.parametrize("dtype, mixed_precision", [("float32", "no"), ("bfloat16", "bf16"), ("auto", "no")])
def test_an_exported_run_trains_in_the_precision_it_asks_for(tiny_config_dict, tmp_path, monkeypatch, dtype,
                                                              mixed_precision):
    """accelerate launch exports the YAML's mixed_precision, which transformers uses when bf16 and fp16 are off."""
    tiny_config_dict["hardware"]["dtype"] = dtype
    folder = export_launch_folder(RunConfig.from_dict(tiny_config_dict, policy=LAPTOP), tmp_path / "export", gpus=2, policy=LAPTOP)
    launcher = yaml.safe_load((folder / "accelerate.yaml").read_text())
    exported = RunConfig.from_file(folder / "config.yaml", policy=LAPTOP)
    assert exported.hardware.dtype == dtype  # a precision chosen in the settings travels with the run
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", launcher["mixed_precision"])
    resolved = ResolvedHardware("cpu", "float32" if dtype == "auto" else dtype, False, 1)  # as a GPU would resolve it
    args = training.grpo_args(exported, new_run(tmp_path), resolved, policy=LAPTOP)
    assert args.mixed_precision == mixed_precision


def stub(folder: Path, name: str, body: str) -> None:
    path = folder / name
    path.write_text("#!/usr/bin/env bash\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)


def test_the_slurm_script_points_the_trainers_at_the_vllm_node(tiny_config_dict, tmp_path):
    tiny_config_dict["generation"] = {"backend": "vllm-server", "vllm_server_url": "http://placeholder:8000"}
    folder = export_launch_folder(RunConfig.from_dict(tiny_config_dict, policy=LAPTOP), tmp_path / "export", gpus=8, nodes=2, policy=LAPTOP)
    bin_dir, calls = tmp_path / "bin", tmp_path / "calls.txt"
    bin_dir.mkdir()
    stub(bin_dir, "scontrol", 'printf "node1\\nnode2\\nnode3\\n"\n')
    # srun runs its command as task 0 of the job, as SLURM would on the node.
    stub(bin_dir, "srun", 'while [[ "$1" == --* ]]; do shift; done; SLURM_PROCID=0 "$@"\n')
    for command in ("trl", "accelerate", "curl"):
        stub(bin_dir, command, f'echo "{command} $*" >> {calls}\n')
    done = subprocess.run(["bash", str(folder / "slurm.sbatch")], cwd=folder, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_SUBMIT_DIR": str(folder),
                               "SLURM_JOB_NODELIST": "node[1-3]", "SLURM_JOB_ID": "42"})
    assert done.returncode == 0, done.stderr
    deadline = time.monotonic() + 30  # the server's srun runs in the background
    while "trl vllm-serve" not in calls.read_text() and time.monotonic() < deadline:
        time.sleep(0.05)
    lines = calls.read_text().splitlines()
    serve = next(line for line in lines if line.startswith("trl vllm-serve"))
    train = next(line for line in lines if line.startswith("accelerate launch"))
    assert "--data_parallel_size 8" in serve and "--tensor_parallel_size" not in serve  # SmolLM2 has 9 heads
    assert "generation.vllm_server_url=http://node3:8000" in train
    assert "--main_process_ip node1" in train and "--machine_rank 0" in train
    assert "curl -sf http://node3:8000/health" in lines
