"""The app's training in a worker process (engine/workers.py) against the command line's, which runs the same runner
in its own main thread (``dragon train``): the arithmetic recipe as the app ships it, alternating between the two
ways in a rotating order so drift on a shared machine hits both equally. The first step of every run is dropped
(warm-up) and the medians of the rest are compared, with the completions' mean length beside them: a step's time
follows the tokens it samples, and the two ways need not sample the same ones.

    python bench/apart.py [--steps 6] [--repeats 3]

It reports; it does not assert.
"""

import argparse
import tempfile
import time
from pathlib import Path

from common import median, table, write_result

from dragon_ui.engine import training
from dragon_ui.public import LAPTOP
from dragon_ui.studio.backend import Studio

WAYS = {"command line": False, "worker process": True}


def step_times(processes: bool, steps: int, runs_dir: Path) -> tuple[list[float], list[float]]:
    """Step times and mean completion lengths of one run of the default recipe: started as a click on Start does,
    or as ``dragon train`` does."""
    studio = Studio(runs_dir=runs_dir, policy=LAPTOP)
    draft = studio.recipes.default()
    draft["training"].update(max_steps=steps, save_steps=10_000, eval_every=0)
    draft["data"]["eval_frac"] = 0  # only the steps
    config = studio.recipes.validate(draft)
    if processes:
        studio.workers.warm((config.model, config.hardware))
        time.sleep(20)  # warm, as the app's worker is by the time anyone presses Start
        run = studio.runs.start(draft)
        (handle,) = training.active_runs()
        state = handle.wait(1800)
    else:
        run = training.train_config(config, policy=LAPTOP)
        state = run.read_status()["state"]
    studio.close()
    assert state == "succeeded", run.read_status().get("error")
    rows = run.read_progress()[1:]
    return [row["step_time_s"] for row in rows], [row["completion_len"] for row in rows]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    times: dict[str, list[float]] = {way: [] for way in WAYS}
    lengths: dict[str, list[float]] = {way: [] for way in WAYS}
    per_repeat: list[dict[str, float]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(args.repeats):
            order = list(WAYS) if repeat % 2 == 0 else list(reversed(WAYS))
            medians = {}
            for way in order:
                measured, sampled = step_times(WAYS[way], args.steps, Path(tmp) / f"{way}-{repeat}")
                times[way] += measured
                lengths[way] += sampled
                medians[way] = median(measured)
            per_repeat.append(medians)
            print(f"repeat {repeat + 1}: " + ", ".join(f"{way} {value:.3f} s" for way, value in medians.items()),
                  flush=True)
    ratio = median(times["worker process"]) / median(times["command line"])
    path = write_result("apart", {"settings": vars(args), "step_times_s": times, "completion_lens": lengths,
                                  "per_repeat": per_repeat, "ratio": ratio})
    print(table([[way, len(values), median(values), median(lengths[way])] for way, values in times.items()],
                ["where the run trains", "steps", "median step s", "median completion tokens"]))
    print(f"worker process / command line: {ratio:.3f}  ->  {path}")


if __name__ == "__main__":
    main()
