"""Shared pieces of the benchmarks: the benchmark config, machine facts, matmul throughput, and result files.

Benchmarks report; they do not assert. Each script writes ``bench/results/<name>.json`` (machine, settings, raw
numbers) and prints a short table. Run them on an otherwise idle machine: two cores are easily disturbed.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"
RECIPE = REPO / "assets" / "recipes" / "arithmetic.yaml"
sys.path.insert(0, str(REPO))
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # benchmarks use the offline SmolLM2 copy unless told otherwise


def bench_config_dict(steps: int, runs_dir: Path, dtype: str = "float32", threads: int | None = None, **overrides) -> dict:
    """The arithmetic recipe on the CPU with a fixed number of steps: the issue's 4 prompts x 6 completions x 16 tokens."""
    from dragon_ui.config import RunConfig

    data = RunConfig.from_file(RECIPE).to_dict()
    data["training"].update(max_steps=steps, save_steps=10_000)
    data["hardware"].update(device=device(), dtype=dtype, cpu_threads=threads)
    data["runs_dir"] = str(runs_dir)
    data["n_samples"] = 0
    for dotted, value in overrides.items():
        section, _, key = dotted.partition("__")
        (data[section] if key else data).__setitem__(key or section, value)
    return data


def device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def machine() -> dict:
    import torch

    from dragon_ui.hardware import available_cpu_cores, cpu_model

    info = {"python": platform.python_version(), "torch": torch.__version__, "platform": platform.platform(),
            "cpu": cpu_model(), "cores": available_cpu_cores()}
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
    import transformers
    import trl

    info.update(trl=trl.__version__, transformers=transformers.__version__)
    return info


def matmul_gflops(m: int, k: int, n: int, dtype: str = "float32", seconds: float = 0.5) -> float:
    """Measured throughput of ``x[m,k] @ w[k,n]`` on this machine with the current torch thread setting."""
    import torch

    dt = getattr(torch, dtype)
    dev = device()
    x, w = torch.randn(m, k, dtype=dt, device=dev), torch.randn(n, k, dtype=dt, device=dev)
    for _ in range(3):
        torch.nn.functional.linear(x, w)
    _sync()
    count, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        torch.nn.functional.linear(x, w)
        count += 1
    _sync()
    return 2 * m * k * n * count / (time.perf_counter() - start) / 1e9


def _sync() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def write_result(name: str, payload: dict) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}{'-cuda' if device() == 'cuda' else ''}.json"
    payload = {"benchmark": name, "when": time.strftime("%Y-%m-%d %H:%M:%S"), "machine": machine(), **payload}
    path.write_text(json.dumps(payload, indent=1, default=str), encoding="utf-8")
    return path


def table(rows: list[list], headers: list[str]) -> str:
    cells = [headers] + [[f"{c:.3f}" if isinstance(c, float) else str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)) for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
