"""The estimate and the dry run against a real run, for every bundled recipe (and any config given): the step's time
and the peak memory each says, beside what a short run of the same settings measured.

For each config, in one sitting: the estimate (`dragon check`'s, on the config's mean prompt length), the one-step
dry run (`dragon check --dry-run`), then a run of ``--steps`` steps through the command line with no held-out
prompts, in a process of its own whose peak resident memory the kernel reports (wait4). The run's step time is the
median of its steps after the first. The CPU probe the estimate uses is kept with the results, so ``--report``
works the estimates out again from them (after a change to the estimate) without measuring anything.
docs/performance.md's table of estimates is this benchmark's; bench/configs/ holds its own three configurations.

    python bench/estimates.py [--steps 4] [--configs more.yaml ...] [--recipes arithmetic calculator]
    python bench/estimates.py --report

It reports; it does not assert.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import REPO, RESULTS, median, off_by, write_result

from dragon_ui import ASSETS_DIR
from dragon_ui.config import RunConfig
from dragon_ui.engine import training
from dragon_ui.engine.dry_run import dry_run
from dragon_ui.engine.estimate import Estimate, cpu_flops_per_thread, estimate_run
from dragon_ui.engine.hardware import detect_hardware
from dragon_ui.public import LAPTOP

GB = 1024**3
RECIPES_DIR = ASSETS_DIR / "recipes"


def measured_run(config_path: Path, steps: int, folder: Path) -> tuple[float, float, float]:
    """(median step time after the first, peak RSS in GB, the same steps' median completion length) of a run of
    ``steps`` steps."""
    run_dir = folder / "run"
    command = [sys.executable, "-m", "dragon_ui", "train", str(config_path), "--run-dir", str(run_dir),
               "--set", f"training.max_steps={steps}", "--set", "training.eval_every=0", "--set", "data.eval_frac=0",
               "--set", "logging.report_to=[]", "--set", "training.save_steps=10000"]
    log_path = folder / "train.log"
    with log_path.open("wb") as log:  # a file, not a pipe: nobody reads a pipe while wait4 waits, and it fills
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=log)
        _, status, usage = os.wait4(process.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"{config_path.name}: the run failed: {log_path.read_text(errors='replace')[-800:]}")
    rows = [json.loads(line) for line in (run_dir / "progress.jsonl").read_text().splitlines()]
    timed = rows[1:] or rows
    return (median([row["step_time_s"] for row in timed]), usage.ru_maxrss * 1024 / GB,
            median([row["completion_len"] or 0.0 for row in timed]))


def estimated(path: Path, probe: dict[str, float]) -> tuple[Estimate, int]:
    """The estimate of the config at ``path`` with the stored probe, and the prompt length it assumed."""
    config = RunConfig.from_file(path, policy=LAPTOP)
    found = training.inspect(config, policy=LAPTOP)
    prompt_tokens = max(1, round(found.prompts.mean))
    return estimate_run(config, found.hardware, detect_hardware(), probe=probe.__getitem__,
                        prompt_tokens=prompt_tokens), prompt_tokens


def one_config(path: Path, steps: int, probe: dict[str, float]) -> dict:
    config = RunConfig.from_file(path, policy=LAPTOP)
    estimate, _ = estimated(path, probe)
    started = time.monotonic()
    dry = dry_run(config, policy=LAPTOP)
    dry_s = time.monotonic() - started
    with tempfile.TemporaryDirectory(prefix="dragon-bench-estimates-") as folder:
        step_s, peak_gb, completion_tokens = measured_run(path, steps, Path(folder))
    return {"config": path.stem, "path": str(path.resolve().relative_to(REPO)),
            "estimate_step_s": estimate.step.total_s, "estimate_gb": estimate.memory.total_gb,
            "dry_step_s": dry.step_s, "dry_peak_gb": dry.peak_gb, "dry_run_s": dry_s,
            "dry_completion_tokens": dry.completion_tokens, "run_step_s": step_s, "run_peak_gb": peak_gb,
            "run_completion_tokens": completion_tokens, "run_steps": steps,
            "device": dry.device, "max_new_tokens": config.grpo.max_new_tokens,
            "completions_per_step": config.completions_per_step,
            "gradient_checkpointing": config.training.gradient_checkpointing}


def report(results: list[dict], probe: dict[str, float]) -> None:
    """The table docs/performance.md shows (Markdown), the estimate worked out with the stored probe."""
    print("| config | new tokens | run: step, peak | dry run: step, peak | estimate: step, memory |\n|---|---|---|---|---|")
    for row in results:
        estimate, _ = estimated(REPO / row["path"], probe)
        step, memory = estimate.step.total_s, estimate.memory.total_gb
        checkpointing = " (checkpointing)" if row["gradient_checkpointing"] else ""
        print(f"| {row['config']}{checkpointing} | {row['max_new_tokens']} | {row['run_step_s']:.1f} s, "
              f"{row['run_peak_gb']:.2f} GB | {row['dry_step_s']:.1f} s ({off_by(row['dry_step_s'], row['run_step_s'])}), "
              f"{row['dry_peak_gb']:.2f} GB ({off_by(row['dry_peak_gb'], row['run_peak_gb'])}) | {step:.1f} s "
              f"({off_by(step, row['run_step_s'])}), {memory:.2f} GB ({off_by(memory, row['run_peak_gb'])}) |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=4, help="steps of each measured run (the first is not timed)")
    parser.add_argument("--recipes", nargs="*", help="bundled recipes by name (default: all of them)")
    parser.add_argument("--configs", nargs="*", default=[], help="more run configs (YAML) to measure")
    parser.add_argument("--report", action="store_true", help="report on the stored results; measure nothing")
    args = parser.parse_args()
    if args.report:
        stored = json.loads((RESULTS / "estimates.json").read_text())
        report(stored["results"], stored["probe"])
        return
    recipes = sorted(RECIPES_DIR.glob("*.yaml"))
    if args.recipes:
        recipes = [RECIPES_DIR / f"{name}.yaml" for name in args.recipes]
    probe = {dtype: cpu_flops_per_thread(dtype) for dtype in ("float32", "bfloat16")}
    results = [one_config(path, args.steps, probe) for path in [*recipes, *map(Path, args.configs)]]
    report(results, probe)
    settings = {key: value for key, value in vars(args).items() if key != "report"}
    print(f"wrote {write_result('estimates', {'settings': settings, 'probe': probe, 'results': results})}")


if __name__ == "__main__":
    main()
