"""UI responsiveness: how long the Train tab's once-a-second refresh takes while a run trains in the same process.

Starts the arithmetic recipe through the Studio (as the app does), then calls the Train tab's refresh handler once
a second, exactly as its gr.Timer would, and reports p50/p95/max latency: separately for ticks where nothing
changed (the common case, which must be nearly free) and ticks that redraw plots and rollouts.

    python bench/ui_latency.py [--seconds 120] [--dtype auto]
"""

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from common import bench_config_dict, percentile, table, write_result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=120)
    parser.add_argument("--dtype", default="auto")
    args = parser.parse_args()

    from dragon_ui.public import LAPTOP
    from dragon_ui.studio.backend import Studio
    from dragon_ui.ui import train_tab

    with tempfile.TemporaryDirectory() as tmp:
        studio = Studio(runs_dir=Path(tmp) / "runs", policy=LAPTOP)
        draft = bench_config_dict(100_000, studio.runs_dir, dtype=args.dtype)
        run = studio.runs.start(draft)
        watch: dict = {}
        quiet, redraw = [], []
        deadline = time.monotonic() + args.seconds
        while time.monotonic() < deadline:
            started = time.perf_counter()
            view = train_tab.refresh(studio, run.id, watch)
            elapsed = time.perf_counter() - started
            changed = any(not _is_skip(getattr(view, part)) for part in ("status", "reward_plot", "rollouts", "log"))
            (redraw if changed else quiet).append(elapsed)
            watch = view.watch
            time.sleep(max(0.0, 1.0 - elapsed))
        studio.runs.stop(run.id)
        steps = len(run.read_progress())
        from dragon_ui.engine import training

        for handle in training.active_runs():
            handle.wait()

    def stats(values):
        return [len(values), 1000 * percentile(values, 0.5), 1000 * percentile(values, 0.95),
                1000 * max(values) if values else float("nan")]

    result = {"settings": vars(args), "steps_trained": steps,
              "quiet_ms": [1000 * v for v in quiet], "redraw_ms": [1000 * v for v in redraw],
              "quiet_p50_ms": stats(quiet)[1], "quiet_p95_ms": stats(quiet)[2],
              "redraw_p50_ms": stats(redraw)[1], "redraw_p95_ms": stats(redraw)[2],
              "all_p50_ms": 1000 * statistics.median(quiet + redraw), "all_p95_ms": 1000 * percentile(quiet + redraw, 0.95)}
    path = write_result("ui-latency", result)
    print(table([["nothing changed", *stats(quiet)], ["redraw (status/plots/rollouts)", *stats(redraw)]],
                ["tick", "count", "p50 ms", "p95 ms", "max ms"]))
    print(f"{steps} training steps during the measurement  ->  {path}")


def _is_skip(value) -> bool:
    return isinstance(value, dict) and value.get("__type__") == "update" and len(value) == 1


if __name__ == "__main__":
    main()
