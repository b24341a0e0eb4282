"""Tests for dragon_ui.engine.hardware: "auto" resolves to the right device, precision and threads, and impossible choices fail.

Every machine here is a hand-made HardwareInfo, so the CUDA and MPS paths are checked without a GPU.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import openmp_threads_around

from dragon_ui.config import HardwareSettings
from dragon_ui.engine import hardware
from dragon_ui.engine.hardware import (
    CudaDevice,
    HardwareInfo,
    ResolvedHardware,
    default_cpu_threads,
    detect_hardware,
    resolve_hardware,
)
from dragon_ui.engine.quantization import bitsandbytes_installed
from dragon_ui.system import memory
from dragon_ui.errors import ConfigError


def gpu(bf16: bool = True, index: int = 0, name: str = "Test GPU") -> CudaDevice:
    return CudaDevice(index=index, name=name, total_gb=80.0, free_gb=70.0, bf16=bf16)


# Named machines, reused across the tables below.
CPU_ONLY = HardwareInfo(cpu_cores=4)
CPU_BF16 = HardwareInfo(cpu_cores=4, cpu_bf16=True)
MAC = HardwareInfo(mps=True, cpu_cores=8)
CUDA_BF16 = HardwareInfo(cuda=[gpu(bf16=True)], cpu_cores=16, bitsandbytes=True)
CUDA_FP16 = HardwareInfo(cuda=[gpu(bf16=False)], cpu_cores=16, bitsandbytes=True)
CUDA_MIXED = HardwareInfo(cuda=[gpu(bf16=True), gpu(bf16=False, index=1)], cpu_cores=16)
CUDA_AND_MPS = HardwareInfo(cuda=[gpu()], mps=True, cpu_cores=8)
CUDA_NO_BNB = HardwareInfo(cuda=[gpu()], cpu_cores=16, bitsandbytes=False)

MACHINES = {"cpu": CPU_ONLY, "cpu_bf16": CPU_BF16, "mac": MAC, "cuda_bf16": CUDA_BF16, "cuda_fp16": CUDA_FP16,
            "cuda_mixed": CUDA_MIXED, "cuda_and_mps": CUDA_AND_MPS, "cuda_no_bnb": CUDA_NO_BNB}


@pytest.mark.parametrize("machine, device", [
    ("cuda_and_mps", "cuda"),
    ("cuda_bf16", "cuda"),
    ("mac", "mps"),
    ("cpu", "cpu"),
    ("cpu_bf16", "cpu"),
])
def test_auto_device_prefers_cuda_then_mps_then_cpu(machine, device):
    resolved = resolve_hardware(HardwareSettings(), MACHINES[machine])
    assert resolved.device == device
    assert any(reason.startswith(f"device {device}") for reason in resolved.reasons)


@pytest.mark.parametrize("machine, dtype", [
    ("cuda_bf16", "bfloat16"),
    ("cuda_fp16", "float16"),
    ("cuda_mixed", "bfloat16"),  # one process trains on the first GPU, which has bf16
    ("mac", "float32"),
    ("cpu", "float32"),
    ("cpu_bf16", "bfloat16"),
])
def test_auto_dtype_follows_the_device(machine, dtype):
    resolved = resolve_hardware(HardwareSettings(), MACHINES[machine])
    assert resolved.dtype == dtype
    assert any(reason.startswith(f"precision {dtype}") for reason in resolved.reasons)


@pytest.mark.parametrize("device, machine, dtype", [
    ("cpu", "cuda_bf16", "float32"),  # CPU asked for on a GPU machine: the CPU's own bf16 speed decides
    ("cpu", "mac", "float32"),
    ("mps", "cuda_and_mps", "float32"),
])
def test_explicit_device_on_a_machine_with_better_options(device, machine, dtype):
    resolved = resolve_hardware(HardwareSettings(device=device), MACHINES[machine])
    assert (resolved.device, resolved.dtype) == (device, dtype)
    assert f"device {device}: chosen in the settings" in resolved.reasons


@pytest.mark.parametrize("settings, machine, expected", [
    (HardwareSettings(device="cuda"), "cpu", "hardware.device is cuda"),
    (HardwareSettings(device="cuda"), "mac", "hardware.device is cuda"),
    (HardwareSettings(device="mps"), "cpu", "hardware.device is mps"),
    (HardwareSettings(device="mps"), "cuda_bf16", "hardware.device is mps"),
    (HardwareSettings(load_in_4bit=True), "cpu", "hardware.load_in_4bit"),
    (HardwareSettings(load_in_4bit=True), "mac", "hardware.load_in_4bit"),
    (HardwareSettings(device="cpu", load_in_4bit=True), "cuda_bf16", "hardware.load_in_4bit"),
    (HardwareSettings(load_in_4bit=True), "cuda_no_bnb", "bitsandbytes"),
    (HardwareSettings(dtype="float16"), "cpu", "hardware.dtype float16"),
    (HardwareSettings(device="cpu", dtype="float16"), "cuda_bf16", "hardware.dtype float16"),
    (HardwareSettings(dtype="bfloat16"), "cuda_fp16", "hardware.dtype is bfloat16"),
    (HardwareSettings(dtype="bfloat16", gpu=1), "cuda_mixed", "hardware.dtype is bfloat16"),
    (HardwareSettings(gpu=2), "cuda_mixed", "hardware.gpu is 2"),
    (HardwareSettings(gpu=1), "cuda_bf16", "hardware.gpu is 1"),
])
def test_impossible_choices_raise_config_error(settings, machine, expected):
    with pytest.raises(ConfigError) as caught:
        resolve_hardware(settings, MACHINES[machine])
    assert expected in str(caught.value)
    assert "\n" not in str(caught.value)


def test_load_in_4bit_on_cuda_with_bitsandbytes():
    resolved = resolve_hardware(HardwareSettings(load_in_4bit=True), CUDA_BF16)
    assert resolved.load_in_4bit is True
    assert any("4-bit" in reason for reason in resolved.reasons)
    assert resolve_hardware(HardwareSettings(), CUDA_BF16).load_in_4bit is False


@pytest.mark.parametrize("settings, machine, dtype", [
    (HardwareSettings(dtype="float32"), "cuda_bf16", "float32"),
    (HardwareSettings(dtype="float16"), "cuda_bf16", "float16"),
    (HardwareSettings(dtype="bfloat16"), "cuda_bf16", "bfloat16"),
    (HardwareSettings(dtype="bfloat16"), "cpu", "bfloat16"),  # allowed, just slow on CPUs without bf16
    (HardwareSettings(dtype="float32"), "cpu_bf16", "float32"),
    (HardwareSettings(dtype="float32"), "mac", "float32"),
])
def test_explicit_dtype_is_kept(settings, machine, dtype):
    resolved = resolve_hardware(settings, MACHINES[machine])
    assert resolved.dtype == dtype
    assert any(reason.startswith(f"precision {dtype}") for reason in resolved.reasons)


@pytest.mark.parametrize("cores, threads", [(1, 1), (2, 2), (3, 3), (4, 3), (8, 7), (16, 15)])
def test_default_cpu_threads(cores, threads):
    assert default_cpu_threads(cores) == threads
    resolved = resolve_hardware(HardwareSettings(device="cpu"), HardwareInfo(cpu_cores=cores))
    assert resolved.cpu_threads == threads
    thread_reasons = [r for r in resolved.reasons if "CPU thread" in r]
    assert len(thread_reasons) == 1 and thread_reasons[0].startswith(f"{threads} CPU thread")
    assert f"{cores} cores available" in thread_reasons[0]
    assert ("one left free" in thread_reasons[0]) == (threads < cores)


def test_default_cpu_threads_without_argument_uses_this_machine():
    assert 1 <= default_cpu_threads() <= max(1, detect_hardware().cpu_cores)


@pytest.mark.parametrize("explicit, cores", [(1, 16), (2, 2), (6, 4)])
def test_explicit_cpu_threads_win(explicit, cores):
    resolved = resolve_hardware(HardwareSettings(device="cpu", cpu_threads=explicit), HardwareInfo(cpu_cores=cores))
    assert resolved.cpu_threads == explicit
    assert f"{explicit} CPU thread{'s' if explicit > 1 else ''}: chosen in the settings" in resolved.reasons


EVERY_VALID_COMBINATION = [
    (HardwareSettings(device=device, dtype=dtype, cpu_threads=threads), machine)
    for machine in MACHINES
    for device in ("auto", "cuda", "mps", "cpu")
    for dtype in ("auto", "bfloat16", "float16", "float32")
    for threads in (None, 2)
]


@pytest.mark.parametrize("machine", list(MACHINES))
def test_every_resolved_result_explains_device_and_precision(machine):
    resolved_any = False
    for settings, name in EVERY_VALID_COMBINATION:
        if name != machine:
            continue
        try:
            resolved = resolve_hardware(settings, MACHINES[name])
        except ConfigError:
            continue
        resolved_any = True
        assert isinstance(resolved, ResolvedHardware)
        assert resolved.device in ("cuda", "mps", "cpu") and resolved.dtype in ("bfloat16", "float16", "float32")
        assert resolved.reasons and all(isinstance(r, str) and len(r) > 10 for r in resolved.reasons)
        assert any(r.startswith(f"device {resolved.device}:") for r in resolved.reasons), (settings, resolved.reasons)
        assert any(r.startswith(f"precision {resolved.dtype}:") for r in resolved.reasons), (settings, resolved.reasons)
        if resolved.device == "cpu":
            assert any("CPU thread" in r for r in resolved.reasons)
    assert resolved_any


def test_torch_dtype_maps_to_torch():
    torch = pytest.importorskip("torch")
    for name in ("bfloat16", "float16", "float32"):
        assert ResolvedHardware("cpu", name, False, 1).torch_dtype is getattr(torch, name)


def test_detect_hardware_on_this_machine():
    torch = pytest.importorskip("torch")
    info = detect_hardware()
    assert info.cpu_cores >= 1
    assert isinstance(info.cpu_bf16, bool)
    assert bool(info.cuda) == torch.cuda.is_available()  # no CUDA on the CPU-only test machines
    resolved = resolve_hardware(HardwareSettings(), info)
    assert resolved.reasons


@pytest.mark.parametrize("info, pieces", [
    (HardwareInfo(cpu_cores=2), ["CPU: 2 cores"]),
    (HardwareInfo(cpu_cores=4, cpu_bf16=True), ["CPU: 4 cores with fast bf16"]),
    (MAC, ["Apple MPS", "CPU: 8 cores"]),
    (CUDA_MIXED, ["CUDA 0: Test GPU, 70.0 of 80.0 GB free", "CUDA 1: Test GPU", "CPU: 16 cores"]),
])
def test_summary_is_one_readable_line(info, pieces):
    summary = info.summary()
    assert isinstance(summary, str) and summary and "\n" not in summary
    assert summary[0].isupper()
    for piece in pieces:
        assert piece in summary


def test_summary_of_this_machine():
    summary = detect_hardware().summary()
    assert "CPU:" in summary and "cores" in summary and "\n" not in summary


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="finds torch's OpenMP in /proc/self/maps")
def test_release_openmp_threads_ends_the_calling_threads_torch_workers():
    """A thread that ran a parallel torch op keeps OpenMP workers; releasing them is what keeps the trainer fast."""
    import torch

    from dragon_ui.engine import hardware

    assert Path(hardware._openmp_runtime()._name).is_relative_to(Path(torch.__file__).parent)  # not another copy
    busy, after, released = openmp_threads_around(hardware.release_openmp_threads)
    assert released is True
    assert after < busy  # its OpenMP worker has exited


# ----------------------------------------------------------------------------------------- bitsandbytes

REPO = Path(__file__).resolve().parents[1]
LOADED_BITSANDBYTES = "sorted(m for m, module in sys.modules.items() if m.split('.')[0] == 'bitsandbytes' and module)"


def run_python(code: str, tmp_path) -> list:
    """What ``code`` prints last, as JSON, run in a fresh interpreter (imports cannot be undone in this one)."""
    result = subprocess.run([sys.executable, "-c", "import json, sys\n" + code], cwd=REPO, capture_output=True,
                            text=True, timeout=240, env={**os.environ, "DRAGON_UI_RUNS_DIR": str(tmp_path)})
    assert result.returncode == 0, result.stderr[-2000:]
    return json.loads(result.stdout.splitlines()[-1])


@pytest.mark.timeout(250)
def test_starting_the_app_and_detecting_hardware_leave_bitsandbytes_unimported(tmp_path):
    """Its import prints "Failed to load CPU gemm_4bit_forward ..." on CPUs; only a 4-bit run needs it."""
    loaded, detected = run_python(
        "from dragon_ui.public import LAPTOP\n"
        "from dragon_ui.studio.backend import Studio\n"
        "from dragon_ui.ui import build_app\n"
        "import dragon_ui.engine.training, dragon_ui.engine.weights, dragon_ui.studio.compare\n"
        "studio = Studio('runs', policy=LAPTOP)\n"
        "build_app(studio)\n"
        "detected = studio.hardware().bitsandbytes\n"
        f"print(json.dumps([{LOADED_BITSANDBYTES}, detected]))\n", tmp_path)
    assert loaded == []
    assert detected == bitsandbytes_installed()


@pytest.mark.skipif(not bitsandbytes_installed(), reason="bitsandbytes is not installed here")
@pytest.mark.timeout(250)
def test_asking_for_4_bit_lets_transformers_and_peft_find_bitsandbytes_again(tmp_path):
    """They remember "not installed" from checks made before; 4-bit loading must not fail on that memory."""
    before, after, loaded = run_python(
        "import dragon_ui.engine.training\n"
        "from peft.import_utils import is_bnb_4bit_available\n"
        "from transformers.utils import is_bitsandbytes_available\n"
        "from dragon_ui.engine.quantization import allow_bitsandbytes\n"
        "before = [is_bitsandbytes_available(), is_bnb_4bit_available()]\n"
        "allow_bitsandbytes()\n"
        "after = [is_bitsandbytes_available(), is_bnb_4bit_available()]\n"
        f"print(json.dumps([before, after, {LOADED_BITSANDBYTES}[:1]]))\n", tmp_path)
    assert before == [False, False]
    assert after == [True, True] and loaded == ["bitsandbytes"]


@pytest.mark.parametrize("meminfo, expected_gb", [
    ("MemTotal:       24684000 kB\nMemFree:         1048576 kB\nMemAvailable:    8388608 kB\n", 8.0),  # caches count
    ("MemTotal:       24684000 kB\nMemFree:         1048576 kB\n", None),  # an old kernel: sysconf's free pages
    (None, None),  # no /proc/meminfo (macOS): sysconf
])
def test_free_memory_counts_what_the_kernel_can_hand_back(tmp_path, monkeypatch, meminfo, expected_gb):
    path = tmp_path / "meminfo"
    if meminfo is not None:
        path.write_text(meminfo)
    monkeypatch.setattr(memory, "MEMINFO", path)
    pages = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / memory.GB
    found = memory.system_memory_gb()
    assert found == pytest.approx(expected_gb if expected_gb is not None else pages, rel=0.05)
    assert memory.system_memory_gb(free=False) >= found


# --- one GPU per process, and native bf16 only --------------------------------------------------------------------


@pytest.mark.parametrize("settings, gpu, dtype, why", [
    (HardwareSettings(), 0, "bfloat16", "the first of 2 visible GPUs"),
    (HardwareSettings(gpu=1), 1, "float16", "chosen in the settings"),
    (HardwareSettings(gpu=0), 0, "bfloat16", "chosen in the settings"),
])
def test_one_process_trains_on_one_gpu_and_says_which(settings, gpu, dtype, why):
    resolved = resolve_hardware(settings, CUDA_MIXED)
    assert (resolved.gpu, resolved.dtype, resolved.torch_device) == (gpu, dtype, f"cuda:{gpu}")
    assert any(reason.startswith(f"GPU {gpu} (Test GPU): {why}") for reason in resolved.reasons)


@pytest.mark.parametrize("local_rank", [0, 1])
def test_a_launched_process_uses_the_gpu_of_its_local_rank_and_all_agree_on_the_precision(monkeypatch, local_rank):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", str(local_rank))
    resolved = resolve_hardware(HardwareSettings(gpu=1), CUDA_MIXED)
    assert resolved.torch_device == f"cuda:{local_rank}"
    assert resolved.dtype == "float16"  # GPU 1 has no bf16, so no process uses it
    assert any("LOCAL_RANK" in reason and "hardware.gpu applies to one process only" in reason
               for reason in resolved.reasons)


def test_a_launch_with_more_processes_than_gpus_is_refused(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_RANK", "3")
    with pytest.raises(ConfigError, match="LOCAL_RANK"):
        resolve_hardware(HardwareSettings(), CUDA_MIXED)


class FakeProperties:
    def __init__(self, name: str, capability: tuple[int, int]):
        self.name, (self.major, self.minor), self.total_memory = name, capability, 16 * 2**30


def fake_cuda(monkeypatch, gpus: list[tuple[str, tuple[int, int]]], failing: tuple[int, ...] = ()) -> list[int]:
    """torch.cuda answering as a machine with these GPUs; returns the GPUs asked for their free memory."""
    import torch

    asked: list[int] = []

    def mem_get_info(index):
        asked.append(index)
        if index in failing:
            raise RuntimeError("CUDA error: all CUDA-capable devices are busy or unavailable")
        return 8 * 2**30, 16 * 2**30

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: len(gpus))
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: FakeProperties(*gpus[index]))
    monkeypatch.setattr(torch.cuda, "mem_get_info", mem_get_info)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *args, **kwargs: True)  # what torch says of emulation
    return asked


@pytest.mark.parametrize("name, capability, bf16", [
    ("Tesla T4", (7, 5), False),
    ("Tesla V100-SXM2-16GB", (7, 0), False),
    ("NVIDIA GeForce RTX 2080", (7, 5), False),
    ("NVIDIA GeForce GTX 1080", (6, 1), False),
    ("NVIDIA A100-SXM4-40GB", (8, 0), True),
    ("NVIDIA GeForce RTX 3090", (8, 6), True),
    ("NVIDIA H100 80GB HBM3", (9, 0), True),
])
def test_bf16_is_chosen_only_on_gpus_that_compute_it_natively(monkeypatch, name, capability, bf16):
    fake_cuda(monkeypatch, [(name, capability)])
    info = detect_hardware()
    assert info.cuda[0].bf16 is bf16
    assert resolve_hardware(HardwareSettings(), info).dtype == ("bfloat16" if bf16 else "float16")


def test_a_launched_process_asks_only_its_own_gpu_for_free_memory(monkeypatch):
    asked = fake_cuda(monkeypatch, [("NVIDIA A100", (8, 0))] * 4)
    monkeypatch.setenv("WORLD_SIZE", "8")
    monkeypatch.setenv("LOCAL_RANK", "2")
    info = detect_hardware()
    assert asked == [2]  # asking creates a CUDA context on that GPU
    assert [d.free_gb for d in info.cuda] == [None, None, 8.0, None]
    assert "CUDA 0: NVIDIA A100, 16.0 GB" in info.summary()


def test_a_gpu_that_does_not_answer_leaves_its_free_memory_unknown(monkeypatch):
    fake_cuda(monkeypatch, [("NVIDIA A100", (8, 0)), ("NVIDIA A100", (8, 0))], failing=(1,))
    assert [d.free_gb for d in detect_hardware().cuda] == [8.0, None]


@pytest.mark.parametrize("dtype, lora, weights", [
    ("float16", False, "float32"),  # the gradient scaler needs fp32 master weights
    ("float16", True, "float16"),  # LoRA's own matrices are fp32
    ("bfloat16", False, "bfloat16"),
    ("float32", False, "float32"),
])
def test_fp16_full_fine_tuning_keeps_fp32_weights(dtype, lora, weights):
    assert ResolvedHardware("cuda", dtype, False, 1, gpu=0).weights_dtype(lora) == weights


@pytest.mark.parametrize("settings, machine, device, dtype", [
    (HardwareSettings(device="cuda", dtype="float16", load_in_4bit=True), "mac", "mps", "float32"),
    (HardwareSettings(device="cuda", dtype="bfloat16", load_in_4bit=True), "cpu", "cpu", "float32"),
    (HardwareSettings(load_in_4bit=True), "cuda_no_bnb", "cuda", "bfloat16"),
    (HardwareSettings(device="cpu", dtype="float32"), "cpu", "cpu", "float32"),  # its own settings work: kept
])
def test_a_run_trained_elsewhere_is_looked_at_with_what_this_machine_has(settings, machine, device, dtype):
    resolved = hardware.resolve_for_this_machine(settings, MACHINES[machine])
    assert (resolved.device, resolved.dtype, resolved.load_in_4bit) == (device, dtype, False)
    fell_back = settings.load_in_4bit
    assert any("not available here" in reason for reason in resolved.reasons) == fell_back


def test_a_gpu_number_on_a_machine_without_cuda_says_it_is_not_used():
    resolved = resolve_hardware(HardwareSettings(gpu=1), CPU_ONLY)
    assert resolved.gpu is None and "hardware.gpu 1 is not used: the run trains on cpu" in resolved.reasons


@pytest.mark.parametrize("files, cpus, memory_gb", [
    ({}, None, None),  # no control groups: the host's
    ({"cpu.max": "max 100000", "memory.max": "max"}, None, None),  # v2, no limit
    ({"cpu.max": "200000 100000", "memory.max": str(16 * 2**30)}, 2, 16.0),  # a 2-vCPU, 16 GB Space
    ({"cpu.max": "150000 100000"}, 2, None),  # 1.5 CPUs: both cores run, slower
    ({"cpu.max": "50000 100000"}, 1, None),
    ({"cpu/cpu.cfs_quota_us": "400000", "cpu/cpu.cfs_period_us": "100000",
      "memory/memory.limit_in_bytes": str(8 * 2**30)}, 4, 8.0),  # v1
    ({"cpu/cpu.cfs_quota_us": "-1", "cpu/cpu.cfs_period_us": "100000",
      "memory/memory.limit_in_bytes": "9223372036854771712"}, None, None),  # v1, no limit
    ({"cpu.max": "garbage", "memory.max": "-5"}, None, None),
])
def test_a_containers_cpu_quota_and_memory_limit_are_read(tmp_path, files, cpus, memory_gb):
    """A Space reports its host's cores and memory to the affinity API and /proc/meminfo: runs side by side and
    their threads count the container's."""
    from dragon_ui.system import cgroups

    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text + "\n")
    assert cgroups.cpu_quota(tmp_path) == cpus
    assert cgroups.memory_limit_gb(tmp_path) == memory_gb


def test_the_cores_and_memory_asked_are_no_more_than_the_containers(monkeypatch):
    from dragon_ui.engine import hardware
    from dragon_ui.system import cgroups, memory

    monkeypatch.setattr(cgroups, "cpu_quota", lambda root=cgroups.CGROUP: 1)
    monkeypatch.setattr(cgroups, "memory_limit_gb", lambda root=cgroups.CGROUP: 0.5)
    monkeypatch.setattr(cgroups, "memory_used_gb", lambda root=cgroups.CGROUP: 0.2)
    assert hardware.available_cpu_cores() == 1
    assert memory.system_memory_gb(free=False) == 0.5
    assert memory.system_memory_gb(free=True) == pytest.approx(0.3)
