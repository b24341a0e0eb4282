"""The cost of the held-out checks during training: the same steps with the checks off and on.

The arithmetic recipe on the offline SmolLM2 copy, through Dragon's engine: ``--steps`` steps with the checks off
(training.eval_every 0) and on (a check every ``--every`` steps), in alternating fresh processes. Reported: each
side's median step time (the first step dropped: warm-up), which says whether the training step itself changed; the
seconds each check took (heldout.jsonl); and what the checks add to a default run of the recipe, which makes about
ten of them.

    python bench/heldout.py [--steps 10] [--every 5] [--repeats 2] [--dtype auto] [--threads 2]
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

from common import RECIPE, REPO, bench_config_dict, median, table, write_result
from dragon_ui.public import LAPTOP

SIDES = {"off": "held-out checks off", "on": "held-out checks on"}


def one_run(steps: int, every: int, dtype: str, threads: int, workdir: Path) -> tuple[list[float], list[float]]:
    """(seconds of each step, seconds of each check after step 0) of one run in a fresh process."""
    config = bench_config_dict(steps, workdir / "runs", dtype=dtype, threads=threads)
    config["training"]["eval_every"] = every
    path = workdir / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    subprocess.run([sys.executable, "-m", "dragon_ui", "train", str(path)], cwd=REPO, check=True,
                   capture_output=True, text=True, env=os.environ)
    (run,) = list((workdir / "runs").iterdir())
    rows = [json.loads(line) for line in (run / "progress.jsonl").read_text().splitlines()]
    elapsed = [row["elapsed_s"] for row in rows]
    steps_s = [b - a for a, b in zip([0.0] + elapsed, elapsed)]
    checks = run / "heldout.jsonl"
    check_s = [json.loads(line)["seconds"] for line in checks.read_text().splitlines()] if checks.is_file() else []
    # A check runs right after its step is logged, so its time lands in the next step's elapsed: take it back out,
    # leaving the training steps alone.
    if every:
        for index in range(every, len(steps_s), every):
            steps_s[index] -= check_s[index // every] if index // every < len(check_s) else 0.0
    return steps_s, [s for s in check_s if s > 0]


def default_run_steps() -> int:
    """The number of steps of the arithmetic recipe as shipped (one epoch over its training prompts)."""
    from dragon_ui.config import RunConfig
    from dragon_ui.data import load_and_map


    config = RunConfig.from_file(RECIPE, policy=LAPTOP)
    prompts = len(load_and_map(config.data, base_dir=config.base_dir, policy=LAPTOP).train)
    return -(-prompts // config.training.batch_size)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--every", type=int, default=5, help="steps between checks on the 'on' side")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    step_s = {side: [] for side in SIDES}
    check_s: list[float] = []
    for repeat in range(args.repeats):
        for side in (["off", "on"] if repeat % 2 == 0 else ["on", "off"]):
            with tempfile.TemporaryDirectory() as tmp:
                steps, checks = one_run(args.steps, args.every if side == "on" else 0, args.dtype, args.threads,
                                        Path(tmp))
            step_s[side].extend(steps[1:])
            check_s.extend(checks)
            print(f"repeat {repeat + 1} {side:3s}: steps " + " ".join(f"{s:.2f}" for s in steps)
                  + ("; checks " + " ".join(f"{s:.2f}" for s in checks) if checks else ""), flush=True)
    medians = {side: median(values) for side, values in step_s.items()}
    total_steps = default_run_steps()
    share = 10 * median(check_s) / (total_steps * medians["off"]) if check_s else None
    path = write_result(f"heldout-{args.dtype}", {"settings": vars(args), "step_seconds": step_s,
                                                  "check_seconds": check_s, "median_s": medians,
                                                  "default_run_steps": total_steps, "default_run_share": share})
    print(table([[SIDES[side], medians[side], len(step_s[side])] for side in SIDES],
                ["variant", "median s/step", "steps"]))
    if share is not None:
        print(f"a check of 8 held-out prompts: median {median(check_s):.2f} s; ten of them add {100 * share:.1f}% to "
              f"a default run of the recipe ({total_steps} steps of {medians['off']:.2f} s)")
    print(f"->  {path}")


if __name__ == "__main__":
    main()
