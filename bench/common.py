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

from dragon_ui.public import LAPTOP

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"
RECIPE = REPO / "dragon_ui" / "assets" / "recipes" / "arithmetic.yaml"
sys.path.insert(0, str(REPO))
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # benchmarks use the offline SmolLM2 copy unless told otherwise


def bench_config_dict(steps: int, runs_dir: Path, dtype: str = "float32", threads: int | None = None, **overrides) -> dict:
    """The arithmetic recipe on the CPU with a fixed number of steps: the issue's 4 prompts x 6 completions x 16 tokens."""
    from dragon_ui.config import RunConfig

    data = RunConfig.from_file(RECIPE, policy=LAPTOP).to_dict()
    data["training"].update(max_steps=steps, save_steps=10_000)
    data["hardware"].update(device=device(), dtype=dtype, cpu_threads=threads)
    data["runs_dir"] = str(runs_dir)
    data["n_samples"] = 0
    for dotted, value in overrides.items():
        section, _, key = dotted.partition("__")
        (data[section] if key else data).__setitem__(key or section, value)
    return data


def lesson_draft(recipe: Path, prefix: str, steps: int | None = None) -> dict:
    """A lesson recipe as it ships, on the CPU, its runs in a new temporary folder, keeping no sample replies;
    ``steps`` instead of its own number of steps, where given."""
    import tempfile

    from dragon_ui.config import RunConfig

    draft = RunConfig.from_file(recipe, policy=LAPTOP).to_dict()
    draft.update(runs_dir=str(Path(tempfile.mkdtemp(prefix=prefix)) / "runs"), n_samples=0)
    draft["hardware"].update(device="cpu")
    if steps:
        draft["training"]["max_steps"] = steps
    return draft


def device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def machine() -> dict:
    import torch

    from dragon_ui.engine.hardware import available_cpu_cores, cpu_model

    info = {"python": platform.python_version(), "torch": torch.__version__, "platform": platform.platform(),
            "cpu": cpu_model(), "cores": available_cpu_cores()}
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
    import transformers
    import trl

    info.update(trl=trl.__version__, transformers=transformers.__version__)
    return info


def matmul_gflops(m: int, k: int, n: int, dtype: str = "float32", seconds: float = 0.5,
                  weights_mib: float = 0) -> float:
    """Measured throughput of ``x[m,k] @ w[k,n]`` on this machine with the current torch thread setting.

    With ``weights_mib``, each call multiplies by the next of as many different ``w`` as fill that much memory, as
    a pass over a model does: every layer's weight then comes from main memory, not from the cache the previous
    call filled. For a few rows (one decoding step) that is what the machine can really do; a single reused
    ``w`` would measure the cache instead. For hundreds of rows it makes no difference.
    """
    import torch

    dt = getattr(torch, dtype)
    dev = device()
    x = torch.randn(m, k, dtype=dt, device=dev)
    size = k * n
    count = max(1, int(weights_mib * 2**20 / (size * x.element_size())))
    pool = _weight_pool(count * size, dtype, dev)
    weights = [pool[i * size:(i + 1) * size].view(n, k) for i in range(count)]
    for w in weights[:3]:
        torch.nn.functional.linear(x, w)
    _sync()
    calls, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        torch.nn.functional.linear(x, weights[calls % count])
        calls += 1
    _sync()
    return 2 * m * k * n * calls / (time.perf_counter() - start) / 1e9


_pools: dict = {}


def _weight_pool(elements: int, dtype: str, dev: str):
    """One buffer of random values per dtype, grown as needed, that the weights of ``matmul_gflops`` are views of."""
    import torch

    pool = _pools.get((dtype, dev))
    if pool is None or pool.numel() < elements:
        pool = _pools[(dtype, dev)] = torch.empty(elements, dtype=getattr(torch, dtype), device=dev).uniform_(-1, 1)
    return pool


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


def off_by(estimated: float, measured: float) -> str:
    """How far an estimate is from a measurement, as the docs' tables write it: "+12 %", "−8 %", "±0 %"."""
    points = round(100 * (estimated / measured - 1))
    return f"{'+' if points > 0 else '−' if points < 0 else '±'}{abs(points)} %"


def percentile(values: list[float], q: float) -> float:
    """The value ``q`` of the way up the sorted values (the nearest one); NaN when there are none."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def table(rows: list[list], headers: list[str]) -> str:
    cells = [headers] + [[f"{c:.3f}" if isinstance(c, float) else str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)) for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
