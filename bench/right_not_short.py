"""The right-not-short lesson, measured: the pre-flight of the recipe as shipped, the fix it recommends, and a
training run of each, on the same CPU.

Runs the pre-flight of ``right_not_short`` (a goal, `exact`, that never pays while `contains` and `short` separate
the groups), applies its first fix the way its button does, runs the pre-flight again, then trains both
configurations through Dragon's engine, each in a fresh process. Reports each pre-flight's verdict and goal, and
each run's held-out pass rates before and after training (greedy replies, the same held-out prompts).

    python bench/right_not_short.py [--steps 30] [--keep FOLDER]
"""

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

from common import REPO, machine, table, write_result
from dragon_ui.public import LAPTOP

LESSON = REPO / "dragon_ui" / "assets" / "recipes" / "right_not_short.yaml"
PREFLIGHT_PROMPTS = 32


def preflight(config: dict) -> dict:
    from dragon_ui.config import RunConfig
    from dragon_ui.engine.models import ModelCache
    from dragon_ui.engine.preflight import preflight as check

    report = check(RunConfig.from_dict(config, base_dir=str(LESSON.parent), policy=LAPTOP), ModelCache().load,
                   prompts=PREFLIGHT_PROMPTS, policy=LAPTOP)
    return {"verdict": report.verdict, "good": report.good, "goal": report.goal and report.goal.to_dict(),
            "fixes": [fix.__dict__ for fix in report.fixes], "report": report}


def train(config: dict, workdir: Path) -> Path:
    path = workdir / f"{config['name']}.yaml"
    path.write_text(yaml.safe_dump(config))
    runs_dir = Path(config["runs_dir"])
    before = set(runs_dir.glob("*")) if runs_dir.is_dir() else set()
    subprocess.run([sys.executable, "-m", "dragon_ui", "train", str(path)], cwd=REPO, check=True,
                   capture_output=True, text=True, env=os.environ)
    (run,) = set(runs_dir.glob("*")) - before
    return run


def held_out(run_dir: Path) -> dict:
    """Each reward's mean over every held-out prompt before and after training (greedy replies; a 0/1 reward's mean
    is its pass rate), and the checks during training (a few of them each)."""
    from dragon_ui.runstore import RunDir

    run = RunDir(run_dir)
    evaluation = run.read_eval()
    return {"prompts": evaluation["n_prompts"], "before": evaluation["before"]["reward_breakdown"],
            "after": evaluation["after"]["reward_breakdown"],
            "checks": [{"step": check["step"], **check["rewards"]} for check in run.read_heldout()]}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--keep", type=Path, default=None, help="train into this folder and keep the runs")
    args = parser.parse_args()
    from dragon_ui.config import RunConfig

    workdir = args.keep or Path(tempfile.mkdtemp(prefix="dragon-right-not-short-"))
    workdir.mkdir(parents=True, exist_ok=True)
    shipped = RunConfig.from_file(LESSON, policy=LAPTOP).to_dict()
    shipped.update(runs_dir=str(workdir / "runs"), n_samples=0)
    shipped["data"]["source"] = str(LESSON.parent / shipped["data"]["source"])
    shipped["training"]["max_steps"] = args.steps
    first = preflight(shipped, policy=LAPTOP)
    fixed = first["report"].fixes[0].applied_to(shipped)
    fixed["name"] = "right-not-short-fixed"
    second = preflight(fixed, policy=LAPTOP)
    runs = {"shipped": shipped, "fixed": fixed}
    results = {}
    for label, config in runs.items():
        run = train(config, workdir)
        results[label] = {"run": str(run), "rewards": config["rewards"], "held_out": held_out(run)}
    for report in (first, second):
        report.pop("report")
    path = write_result("right-not-short", {"machine": machine(), "settings": {"steps": args.steps},
                                             "preflight": {"shipped": first, "fixed": second}, "runs": results})
    print(f"pre-flight as shipped: {first['verdict']}\n")
    print(f"fix applied: {first['fixes'][0]['label']}\npre-flight after it: {second['verdict']}\n")
    rows = [[label, name, result["held_out"]["before"][name], result["held_out"]["after"][name]]
            for label, result in results.items() for name in ("exact", "contains", "short")]
    prompts = results["shipped"]["held_out"]["prompts"]
    print(table(rows, ["run", "reward", f"held-out before ({prompts} prompts)", f"after {args.steps} steps"]))
    print(f"->  {path}")


if __name__ == "__main__":
    main()
