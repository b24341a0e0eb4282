"""Does the pre-flight predict training? Its share of groups with no spread against the mean of the same share over
the first training steps, on a newcomer's task: data and rewards no test or recipe uses.

    python bench/preflight.py [--steps 10] [--prompts N] [--set KEY=VALUE ...] [--tag NAME]

The task: "Convert N minutes to seconds", with a numeric reward and a short-answer reward, on the offline
SmolLM2-135M-Instruct and the arithmetic recipe's sampling and training settings. It runs the pre-flight (its
default size unless --prompts), then trains --steps steps and reads each step's no_spread_share from the run's
progress (grpo_math.no_spread_share, the pre-flight's definition). Writes bench/results/preflight-<tag>.json.
"""

from __future__ import annotations

import argparse
import csv
import random
import statistics
import tempfile
import time
from pathlib import Path

from common import RECIPE, machine, write_result

from dragon_ui.config import RunConfig, apply_overrides


def newcomer_task(folder: Path, rows: int = 400, seed: int = 7) -> dict:
    """The task's data file and rewards, as a newcomer would map them."""
    rng = random.Random(seed)
    path = folder / "minutes.csv"
    with open(path, "w", newline="", encoding="utf-8") as file:
        writer = csv.writer(file)
        writer.writerow(["task", "seconds"])
        for _ in range(rows):
            minutes = rng.randint(2, 40)
            writer.writerow([f"Convert {minutes} minutes to seconds. Reply with just the number.", minutes * 60])
    return {"data": {"source": str(path), "prompt": "task", "reference": "seconds", "eval_frac": 0.05},
            "rewards": [{"kind": "numeric", "name": "seconds", "extract": "last_number"},
                        {"kind": "length", "name": "short", "max_chars": 10, "weight": 0.3}]}


def main() -> None:
    from dragon_ui.public import LAPTOP
    from dragon_ui.engine import training
    from dragon_ui.engine.models import ModelCache
    from dragon_ui.engine.preflight import preflight

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--prompts", type=int)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--tag", default="minutes")
    args = parser.parse_args()

    folder = Path(tempfile.mkdtemp(prefix="bench-preflight-"))
    data = RunConfig.from_file(RECIPE, policy=LAPTOP).to_dict()
    data.update(newcomer_task(folder), name="preflight-bench", runs_dir=str(folder / "runs"))
    data["training"].update(max_steps=args.steps, save_steps=10_000)
    data["hardware"].update(device="cpu")
    config = RunConfig.from_dict(apply_overrides(data, args.set), policy=LAPTOP)

    started = time.monotonic()
    report = preflight(config, ModelCache().load, prompts=args.prompts, policy=LAPTOP)
    preflight_s = time.monotonic() - started
    print(report.verdict)

    run = training.train_config(config, policy=LAPTOP)
    state = run.read_status()["state"]
    rows = run.read_progress()
    shares = [row["no_spread_share"] for row in rows if row.get("no_spread_share") is not None][:args.steps]
    trained = statistics.fmean(shares) if shares else None
    points = None if trained is None else round(100 * abs(report.share("no spread") - trained), 1)
    print(f"pre-flight: {len(report.prompts)} prompts in {preflight_s:.0f} s, no spread "
          f"{100 * report.share('no spread'):.0f} % (all fail {100 * report.share('all fail'):.0f} %, all pass "
          f"{100 * report.share('all pass'):.0f} %)")
    print(f"training ({state}): {len(shares)} steps, mean no spread "
          f"{'–' if trained is None else f'{100 * trained:.0f} %'}; difference {points} points")
    write_result(f"preflight-{args.tag}", {
        "machine": machine(), "settings": config.to_dict(), "preflight_seconds": round(preflight_s, 1),
        "preflight": report.to_dict(), "training_state": state, "step_no_spread": shares,
        "training_mean_no_spread": trained, "difference_points": points})


if __name__ == "__main__":
    main()
