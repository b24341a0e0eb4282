"""On a CUDA machine: the scale-out paths that cannot run on a CPU, each as a short real training.

For every combination asked for (strategy x generation backend) it exports the arithmetic recipe with
`python -m dragon_ui export`, runs the folder's own `launch.sh` for a few steps on all visible GPUs, and reports
whether it succeeded, the median seconds per step, completions per second and the peak GPU memory the main process
saw. Combinations whose packages are missing (deepspeed, vllm) are reported as skipped with the reason. Each
combination has its own time limit; one that fails or runs out of time is recorded with its reason and the next one
runs, so one broken path never hides the others' figures.

    python bench/scaleout_gpu.py [--steps 6] [--timeout 900] [--strategies ddp zero2 zero3 fsdp]
                                 [--backends transformers vllm-colocate]
"""

import argparse
import importlib.util
import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from common import REPO, RECIPE, median, table, write_result

NEEDS = {"zero2": "deepspeed", "zero3": "deepspeed", "vllm-colocate": "vllm"}


def run_combination(strategy: str, backend: str, steps: int, gpus: int, workdir: Path, timeout_s: float) -> dict:
    """One combination's figures, or its state ("skipped", "failed", "timed out") with the reason."""
    missing = [NEEDS[x] for x in (strategy, backend) if x in NEEDS and importlib.util.find_spec(NEEDS[x]) is None]
    if missing:
        return {"state": "skipped", "reason": f"{', '.join(sorted(set(missing)))} not installed"}
    folder = workdir / f"{strategy}-{backend}"
    commands = [([sys.executable, "-m", "dragon_ui", "export", str(RECIPE), "--to", str(folder), "--gpus", str(gpus),
                  "--set", f"distributed.strategy={strategy}", "--set", f"generation.backend={backend}"], REPO),
                (["./launch.sh", "--set", f"training.max_steps={steps}"], folder)]
    for command, cwd in commands:
        # A session of its own, so that a timeout ends the launcher's training processes too.
        process = subprocess.Popen(command, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                   env={**os.environ, "GPUS": str(gpus), "PYTHON": sys.executable},
                                   start_new_session=True)
        try:
            _, stderr = process.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.communicate()
            return {"state": "timed out", "reason": f"{Path(command[0]).name} ran over {timeout_s:g} s"}
        if process.returncode != 0:
            lines = stderr.strip().splitlines()
            return {"state": "failed", "reason": lines[-1] if lines else f"exit status {process.returncode}"}
    runs = list((folder / "runs").glob("*/status.json"))
    if not runs:
        return {"state": "failed", "reason": "no run folder was written"}
    run = runs[0].parent
    status = json.loads((run / "status.json").read_text())
    rows = [json.loads(line) for line in (run / "progress.jsonl").read_text().splitlines()]
    elapsed = [row["elapsed_s"] for row in rows]
    seconds = median([b - a for a, b in zip(elapsed, elapsed[1:])])
    return {"state": status["state"], "error": status.get("error"), "s_per_step": seconds,
            "completions_per_s": rows[-1]["completions_per_step"] / seconds if seconds else None,
            "peak_gpu_mem_gb": max((row.get("peak_gpu_mem_gb") or 0.0) for row in rows)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--timeout", type=float, default=900, help="seconds each combination may take")
    parser.add_argument("--strategies", nargs="+", default=["ddp", "zero2", "zero3", "fsdp"])
    parser.add_argument("--backends", nargs="+", default=["transformers", "vllm-colocate"])
    args = parser.parse_args()
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("This benchmark needs CUDA GPUs; on the CPU, tests/test_distributed.py covers 2-process runs.")
    gpus = torch.cuda.device_count()
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for strategy in args.strategies:
            for backend in args.backends:
                try:
                    result = run_combination(strategy, backend, args.steps, gpus, Path(tmp), args.timeout)
                except Exception as exc:  # an unreadable run folder, a missing progress file: record it, go on
                    result = {"state": "failed", "reason": f"{type(exc).__name__}: {exc}"}
                results[f"{strategy}/{backend}"] = result
                print(f"{strategy}/{backend}: {results[f'{strategy}/{backend}']}", flush=True)
    path = write_result("scaleout-gpu", {"settings": vars(args), "gpus": gpus, "results": results})
    print(table([[name, r["state"], r.get("s_per_step", "-"), r.get("completions_per_s", "-"),
                  r.get("peak_gpu_mem_gb", "-"), r.get("reason") or r.get("error") or ""] for name, r in results.items()],
                ["strategy/backend", "state", "s/step", "completions/s", "peak GB", "note"]))
    print(f"-> {path}")


if __name__ == "__main__":
    main()
