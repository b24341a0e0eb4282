"""Overhead: the same GRPO steps through Dragon's engine (run store, rollouts, callbacks) and a plain TRL script.

Both train on the same rows in the same order with the same seed, so they sample the same prompts (the table
shows each side's mean completion length, which sets the work per step). Two pairs are compared. With the
speed-ups off (``DRAGON_UI_SPEEDUPS=none``) Dragon does exactly plain TRL's work plus its own code; as shipped,
Dragon is compared with the plain script given the same speed-ups (``plain_trl.py --speedups``). In each pair the
difference is the engine's overhead. Runs alternate in a rotating order as fresh processes so drift on a shared
machine hits every side equally; the first step of every run is dropped (warm-up) and the medians of the rest are
compared.

    python bench/overhead.py [--steps 4] [--repeats 2] [--dtype float32] [--threads 2] [--pairs as-shipped]
                             [--label torch2.13]

``--label`` names the results file (overhead-<dtype>-<label>.json), to keep a run on another stack beside this one.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

from common import REPO, bench_config_dict, median, table, write_result
from dragon_ui.public import LAPTOP


SIDES = {"plain": "plain TRL script", "dragon-none": "Dragon, speed-ups off",
         "plain-speedups": "plain TRL script + Dragon's speed-ups", "dragon": "Dragon as shipped"}
PAIRS = {"speedups-off": ("dragon-none", "plain"), "as-shipped": ("dragon", "plain-speedups")}  # (Dragon, plain)


def run_steps(command: list[str], repo: Path, runs_dir: Path, speedups: str = "all") -> tuple[list[float], list[float]]:
    """Step times and completion lengths of ``python -m dragon_ui COMMAND`` run with the code in ``repo``, which
    trains one run into ``runs_dir``."""
    subprocess.run([sys.executable, "-m", "dragon_ui", *command], cwd=repo, check=True, capture_output=True,
                   text=True, env={**os.environ, "DRAGON_UI_SPEEDUPS": speedups, "PYTHONPATH": str(repo)})
    (run,) = list(runs_dir.iterdir())
    rows = [json.loads(line) for line in (run / "progress.jsonl").read_text().splitlines()]
    elapsed = [row["elapsed_s"] for row in rows]
    return [b - a for a, b in zip([0.0] + elapsed, elapsed)], [row["completion_len"] for row in rows]


def dragon_steps(config: dict, workdir: Path, speedups: str) -> tuple[list[float], list[float]]:
    path = workdir / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return run_steps(["train", str(path)], REPO, Path(config["runs_dir"]), speedups)


def plain_steps(model_dir: str, prompts: Path, config: dict, steps: int, dtype: str, threads: int, workdir: Path,
                speedups: bool):
    out, settings = workdir / "plain.json", workdir / "config.json"
    settings.write_text(json.dumps(config))
    subprocess.run([sys.executable, "bench/plain_trl.py", "--model-dir", model_dir, "--prompts", str(prompts),
                    "--config", str(settings), "--steps", str(steps), "--dtype", dtype, "--threads", str(threads),
                    "--out", str(out)] + (["--speedups"] if speedups else []),
                   cwd=REPO, check=True, capture_output=True, text=True)
    result = json.loads(out.read_text())
    return result["step_seconds"], result["completion_len"]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--pairs", nargs="+", choices=list(PAIRS), default=list(PAIRS),
                        help="which comparisons to run (default: both)")
    parser.add_argument("--label", default="", help="added to the results file's name")
    args = parser.parse_args()
    from dragon_ui.config import ModelConfig, RunConfig
    from dragon_ui.data import load_and_map, write_jsonl
    from dragon_ui.engine.models import resolve_model

    model_dir = resolve_model(ModelConfig()).path
    config = RunConfig.from_dict(bench_config_dict(args.steps, Path("unused"), dtype=args.dtype, threads=args.threads), policy=LAPTOP)
    prompts = Path(tempfile.mkdtemp()) / "train.jsonl"
    write_jsonl(prompts, load_and_map(config.data, base_dir=config.base_dir, policy=LAPTOP).train)  # Dragon's exact training rows
    sides = [side for pair in args.pairs for side in PAIRS[pair]]
    measured = {side: [] for side in sides}
    lengths = {side: [] for side in sides}
    for repeat in range(args.repeats):
        order = sides[repeat % len(sides):] + sides[:repeat % len(sides)]
        for side in order:
            with tempfile.TemporaryDirectory() as tmp:
                tmp = Path(tmp)
                if side.startswith("plain"):
                    steps, length = plain_steps(model_dir, prompts, config.to_dict(), args.steps, args.dtype,
                                                args.threads, tmp, speedups=side == "plain-speedups")
                else:
                    # No held-out checks between steps: the plain script scores nothing of the kind, and the
                    # step times are read off the progress rows, which would count them in.
                    run_config = bench_config_dict(args.steps, tmp / "runs", dtype=args.dtype, threads=args.threads,
                                                   training__eval_every=0)
                    steps, length = dragon_steps(run_config, tmp, "none" if side == "dragon-none" else "all")
            measured[side].extend(steps[1:])
            lengths[side].extend(length[1:])
            print(f"repeat {repeat + 1} {side:14s}: " + " ".join(f"{s:.2f}" for s in steps), flush=True)
    medians = {side: median(measured[side]) for side in sides}
    overheads = {}
    for pair in args.pairs:
        dragon, plain = PAIRS[pair]
        paired = paired_ratios(measured[dragon], measured[plain], args.steps - 1)
        overheads[pair] = {"ratio": medians[dragon] / medians[plain], "paired_ratios": paired,
                           "paired_median": median(paired)}
    name = f"overhead-{args.dtype}" + (f"-{args.label}" if args.label else "")
    path = write_result(name, {"settings": vars(args), "step_seconds": measured, "completion_len": lengths,
                               "median_s": medians, "overhead": overheads})
    print(table([[SIDES[side], medians[side], median(lengths[side]), len(measured[side])] for side in sides],
                ["variant", "median s/step", "median completion tokens", "steps"]))
    for pair, found in overheads.items():
        dragon, plain = PAIRS[pair]
        print(f"engine overhead ({pair}): {100 * (found['ratio'] - 1):+.1f}% per step over all steps, "
              f"{100 * (found['paired_median'] - 1):+.1f}% as the median of the repeats' own ratios "
              f"({', '.join(f'{100 * (r - 1):+.1f}%' for r in found['paired_ratios'])})")
    if "plain" in medians and "dragon" in medians:
        print(f"Dragon as shipped: {medians['plain'] / medians['dragon']:.2f}x the speed of the plain TRL script")
    print(f"->  {path}")


def paired_ratios(dragon: list[float], plain: list[float], per_run: int) -> list[float]:
    """Dragon over plain TRL within each repeat: robust to a repeat the machine slowed down."""
    def runs(values: list[float]) -> list[list[float]]:
        return [values[i:i + per_run] for i in range(0, len(values), per_run)]

    return [median(d) / median(p) for d, p in zip(runs(dragon), runs(plain))]


if __name__ == "__main__":
    main()
