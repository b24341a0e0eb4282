"""Overhead: the same GRPO steps through Dragon's engine (run store, rollouts, callbacks) and a plain TRL script.

Runs alternate (plain, dragon, dragon, plain, ...) as fresh processes so drift on a shared machine hits both
equally; the first step of every run is dropped (warm-up) and the medians of the rest are compared.

    python bench/overhead.py [--steps 4] [--repeats 2] [--dtype float32] [--threads 2]
"""

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

from common import REPO, bench_config_dict, median, table, write_result


def dragon_steps(config: dict, workdir: Path) -> list[float]:
    path = workdir / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    subprocess.run([sys.executable, "-m", "dragon_ui", "train", str(path)], cwd=REPO, check=True,
                   capture_output=True, text=True)
    (run,) = list(Path(config["runs_dir"]).iterdir())
    elapsed = [json.loads(line)["elapsed_s"] for line in (run / "progress.jsonl").read_text().splitlines()]
    return [b - a for a, b in zip([0.0] + elapsed, elapsed)]


def plain_steps(model_dir: str, steps: int, dtype: str, threads: int, workdir: Path) -> list[float]:
    out = workdir / "plain.json"
    subprocess.run([sys.executable, "bench/plain_trl.py", "--model-dir", model_dir, "--steps", str(steps),
                    "--dtype", dtype, "--threads", str(threads), "--out", str(out)], cwd=REPO, check=True,
                   capture_output=True, text=True)
    return json.loads(out.read_text())["step_seconds"]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    from dragon_ui.config import ModelConfig
    from dragon_ui.models import resolve_model

    model_dir = resolve_model(ModelConfig()).path
    measured = {"plain": [], "dragon": []}
    for repeat in range(args.repeats):
        order = ["plain", "dragon"] if repeat % 2 == 0 else ["dragon", "plain"]
        for variant in order:
            with tempfile.TemporaryDirectory() as tmp:
                tmp = Path(tmp)
                if variant == "plain":
                    steps = plain_steps(model_dir, args.steps, args.dtype, args.threads, tmp)
                else:
                    config = bench_config_dict(args.steps, tmp / "runs", dtype=args.dtype, threads=args.threads)
                    steps = dragon_steps(config, tmp)
            measured[variant].extend(steps[1:])
            print(f"repeat {repeat + 1} {variant:6s}: " + " ".join(f"{s:.2f}" for s in steps), flush=True)
    plain, dragon = median(measured["plain"]), median(measured["dragon"])
    result = {"settings": vars(args), "step_seconds": measured, "median_plain_s": plain, "median_dragon_s": dragon,
              "overhead_ratio": dragon / plain}
    path = write_result(f"overhead-{args.dtype}", result)
    print(table([["plain TRL", plain, len(measured["plain"])], ["Dragon engine", dragon, len(measured["dragon"])]],
                ["variant", "median s/step", "steps"]))
    print(f"overhead: {100 * (dragon / plain - 1):+.1f}% per step  ->  {path}")


if __name__ == "__main__":
    main()
