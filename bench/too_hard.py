"""The too-hard lesson, measured: the recipe as shipped, then with the pre-flight's own partial-credit fix, on the
same CPU.

For each, the pre-flight (``--prompts`` of the training prompts, as the app's button samples them), then a training
of the recipe's steps through Dragon's engine. The fix is the one the first pre-flight offers, applied as its button
applies it (``Fix.applied_to``). It reports each pre-flight's verdict and its share of groups with no spread, and for
each run the share of groups with no spread over its steps, the exact ``answer`` reward over the first and last
steps, and each reward on the held-out prompts before and after. Writes bench/results/too-hard.json.

    python bench/too_hard.py [--prompts 32] [--steps 24]
"""

from __future__ import annotations

import argparse
import statistics
import time

from common import REPO, lesson_draft, table, write_result
from dragon_ui.public import LAPTOP

from dragon_ui.config import RunConfig

LESSON = REPO / "dragon_ui" / "assets" / "recipes" / "too_hard.yaml"
WINDOW = 4  # steps at each end of a run whose mean says where it started and where it ended


def measured(config: RunConfig, prompts: int) -> dict:
    """The pre-flight of ``config``, then its training."""
    from dragon_ui.engine import training
    from dragon_ui.engine.models import ModelCache
    from dragon_ui.engine.preflight import preflight

    started = time.monotonic()
    report = preflight(config, ModelCache().load, prompts=prompts, policy=LAPTOP)
    preflight_s = time.monotonic() - started
    run = training.train_config(config, policy=LAPTOP)
    state = run.read_status()["state"]
    rows = run.read_progress()
    answer = [(row.get("rewards") or {}).get("answer") for row in rows]
    no_spread = [row.get("no_spread_share") for row in rows]
    evaluation = run.read_eval()
    held_out = {side: (evaluation.get(side) or {}).get("reward_breakdown", {}) for side in ("before", "after")}
    return {"run": run.id, "state": state, "preflight_seconds": round(preflight_s, 1), "verdict": report.verdict,
            "learns": report.learns, "preflight_no_spread": report.share("no spread"),
            "preflight_all_fail": report.share("all fail"), "fixes": [fix.label for fix in report.fixes],
            "steps": [{"step": row["step"], "answer": value, "no_spread": share,
                       "close_number": (row.get("rewards") or {}).get("close_number"),
                       "minutes": round(row["elapsed_s"] / 60, 2)} for row, value, share in zip(rows, answer,
                                                                                                 no_spread)],
            "train_no_spread": statistics.fmean(share for share in no_spread if share is not None),
            "answer_first": statistics.fmean(answer[:WINDOW]), "answer_last": statistics.fmean(answer[-WINDOW:]),
            "heldout": held_out, "n_heldout": evaluation.get("n_prompts"),
            "minutes": round(rows[-1]["elapsed_s"] / 60, 1) if rows else None, "_report": report}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--steps", type=int)
    args = parser.parse_args()

    draft = lesson_draft(LESSON, "bench-too-hard-", args.steps)

    as_set = measured(RunConfig.from_dict(draft, policy=LAPTOP), args.prompts)
    (fix,) = [fix for fix in as_set["_report"].fixes if fix.label.startswith("Add partial credit")]
    fixed = measured(RunConfig.from_dict({**fix.applied_to(draft), "name": "too-hard-fixed"}, policy=LAPTOP), args.prompts)

    rows = []
    for label, result in (("as shipped", as_set), (f"with the fix ({fix.label})", fixed)):
        rows.append([label, f"{100 * result['preflight_no_spread']:.0f} %",
                     "yes" if result["learns"] else "no", f"{100 * result['train_no_spread']:.0f} %",
                     f"{result['answer_first']:.3f} → {result['answer_last']:.3f}",
                     " · ".join(f"{name} {result['heldout']['before'][name]:.3f} → {result['heldout']['after'][name]:.3f}"
                                for name in result["heldout"]["after"])])
    print(table(rows, ["run", "pre-flight: no spread", "learns?", "training: no spread", "answer, first → last "
                       f"{WINDOW} steps", f"held-out, before → after ({as_set['n_heldout']} prompts)"]))
    for result in (as_set, fixed):
        result.pop("_report")
    write_result("too-hard", {"prompts": args.prompts, "steps": draft["training"]["max_steps"], "fix": fix.label,
                              "fix_settings": fix.add_rewards, "as_shipped": as_set, "fixed": fixed})


if __name__ == "__main__":
    main()
