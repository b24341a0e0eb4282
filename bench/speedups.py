"""Before and after each speed-up: the breakdown benchmark with the speed-ups switched on one at a time.

Every variant runs ``bench/breakdown.py`` in its own process (some speed-ups patch TRL for the whole process), with
``DRAGON_UI_SPEEDUPS`` naming the speed-ups on so far, and the rounds alternate (none, +1, +2, ..., none, +1, ...)
so that a machine getting slower or faster over the run does not favour one variant. Reported per variant: the
median step, its parts, the step over the floor (each run over its own, then the median), and the mean sampled
reward of the steps, which must stay the same within noise (same seed; a speed-up must not change what is learned).
A last, separate row switches off LoRA dropout as well: that one does change training, so it is reported for
information and is not a default.

    python bench/speedups.py [--dtype bfloat16] [--rounds 2] [--steps 4] [--start merged_sampling]

``--start NAME`` runs only the rows from the one that adds NAME on (a check of the latest speed-ups; the whole table
takes about 25 minutes in bf16) and writes ``speedups-<dtype>-from-<NAME>.json``.
"""

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from common import RESULTS, median, table, write_result

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from dragon_ui.speedups import ALL

PARTS = ["generation", "reference_pass", "policy_forward", "backward"]


def variants() -> list[tuple[str, str, list[str]]]:
    """(label, DRAGON_UI_SPEEDUPS, --set options), each adding one speed-up to the one before."""
    chosen = [("none", "none", [])]
    chosen += [(f"+ {name}", ",".join(ALL[:count + 1]), []) for count, name in enumerate(ALL)]
    chosen.append(("+ lora.dropout 0 (changes training)", "all", ["lora.dropout=0"]))
    return chosen


def run_breakdown(index: int, label: str, setting: str, sets: list[str], args, round_: int) -> dict:
    tag = f"speedups-v{index}-r{round_}"
    command = [sys.executable, str(Path(__file__).with_name("breakdown.py")), "--steps", str(args.steps),
               "--dtype", args.dtype, "--threads", str(args.threads), "--tag", tag]
    for item in sets:
        command += ["--set", item]
    print(f"round {round_}: {label}", flush=True)
    subprocess.run(command, check=True, env={**os.environ, "DRAGON_UI_SPEEDUPS": setting},
                   stdout=subprocess.DEVNULL)
    path = RESULTS / f"breakdown-{args.dtype}-{tag}.json"
    result = json.loads(path.read_text())
    path.unlink()
    return result


def step_over_floor(runs: list[dict]) -> float:
    """The median over runs of each run's median step over the floor measured in the same process.

    This 2-vCPU machine runs some processes 10-20 % slower than others (the matmul floor moves with it, 1.65 to
    2.04 s in bf16 in one session), so a run is compared with its own floor rather than with one pooled over runs.
    """
    return median([median([step["total"] for step in run["per_step"]]) / run["floor_step_s"] for run in runs])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--start", choices=ALL, help="run only the rows from the one that adds this speed-up on")
    args = parser.parse_args()

    chosen = variants()
    if args.start:
        chosen = chosen[[label for label, _, _ in chosen].index(f"+ {args.start}"):]
    results: dict[str, list[dict]] = {label: [] for label, _, _ in chosen}
    for round_ in range(1, args.rounds + 1):
        for index, (label, setting, sets) in enumerate(chosen):
            results[label].append(run_breakdown(index, label, setting, sets, args, round_))

    summary, rows = {}, []
    baseline = None
    for label, _, _ in chosen:
        runs = results[label]
        steps = [step for run in runs for step in run["per_step"]]
        step_s = median([step["total"] for step in steps])
        baseline = baseline or step_s
        parts = {part: median([step.get(part, 0.0) for step in steps]) for part in PARTS}
        reward = sum(step["reward"] for step in steps) / len(steps)
        over_floor = step_over_floor(runs)
        summary[label] = {"step_s": step_s, "floor_s": median([run["floor_step_s"] for run in runs]),
                          "run_floors_s": [run["floor_step_s"] for run in runs], "step_over_floor": over_floor,
                          "speedup_vs_first_row": baseline / step_s, "parts_s": parts, "mean_sampled_reward": reward,
                          "step_times": [step["total"] for step in steps], "rewards": [step["reward"] for step in steps]}
        rows.append([label, step_s, *parts.values(), f"{over_floor:.2f}", f"{baseline / step_s:.2f}x", reward])
    print(f"\ndtype {args.dtype}, {args.threads} threads, {args.rounds} alternating rounds x {args.steps - 1} "
          "timed steps")
    print(table(rows, ["speed-ups", "step s", *PARTS, "x floor", "vs first row", "mean reward"]))
    name = f"speedups-{args.dtype}" + (f"-from-{args.start}" if args.start else "")
    path = write_result(name, {"settings": vars(args), "variants": summary})
    print(f"-> {path}")


if __name__ == "__main__":
    main()
