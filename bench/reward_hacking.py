"""The reward-hacking lesson, measured: the recipe as shipped, then the fix its notes give, on the same CPU.

Trains the ``reward_hacking`` recipe (a length reward that pays for "showing the working") and the fix (the same
reward turned into a brevity one: at most 12 characters, weight 0.3), each in a fresh process through Dragon's
engine. Then replays the Train tab's alerts step by step over what each run wrote, and reports when the
reward-hacking watch first fired and what it said, with each run's rewards, lengths and held-out checks.
``--analyse RUN_DIR...`` replays runs already trained; ``--screenshots FOLDER`` then opens the app on them in
Debian's chromium (the lesson loaded, its notes shown) and saves the Train tab of the first run (``hacking.png``)
and both runs on the Experiments tab (``experiments.png``), as the README shows them.

    python bench/reward_hacking.py [--steps 16] [--keep FOLDER] [--analyse RUN_DIR RUN_DIR] [--screenshots FOLDER]
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

from common import REPO, table, write_result
from dragon_ui.public import LAPTOP

LESSON = REPO / "dragon_ui" / "assets" / "recipes" / "reward_hacking.yaml"
HACKING = {"padding", "heldout_gap", "reward_trade_off", "same_reply", "repetition", "empty_replies"}


def lesson_config(fixed: bool, steps: int, runs_dir: Path) -> dict:
    from dragon_ui.config import RunConfig

    config = RunConfig.from_file(LESSON, policy=LAPTOP).to_dict()
    if fixed:  # the notes' step 2: show_working pays for a short reply instead of a long one
        (reward,) = [r for r in config["rewards"] if r["name"] == "show_working"]
        reward.pop("min_chars")
        reward.update(max_chars=12, weight=0.3)
        config["name"] = "reward-hacking-fixed"
    config["training"]["max_steps"] = steps
    config["runs_dir"] = str(runs_dir)
    return config


def train(config: dict, workdir: Path) -> Path:
    path = workdir / f"{config['name']}.yaml"
    path.write_text(yaml.safe_dump(config))
    before = set((Path(config["runs_dir"])).glob("*")) if Path(config["runs_dir"]).is_dir() else set()
    subprocess.run([sys.executable, "-m", "dragon_ui", "train", str(path)], cwd=REPO, check=True,
                   capture_output=True, text=True, env=os.environ)
    (run,) = set(Path(config["runs_dir"]).glob("*")) - before
    return run


def replay(run_dir: Path) -> dict:
    """What the Train tab would have said after each step: the first step at which each alert showed."""
    from dragon_ui.runstore import RunDir
    from dragon_ui.studio.monitor import health_alerts

    run = RunDir(run_dir)
    rows, rollouts, heldout = run.read_progress(), {r["step"]: r for r in run.read_rollouts()}, run.read_heldout()
    config = json.loads(run.config_path.read_text())
    first: dict[str, dict] = {}
    for index, row in enumerate(rows):
        step = row["step"]
        checks = [check for check in heldout if check["step"] <= step]
        for alert in health_alerts(rows[:index + 1], {}, config, "", rollouts.get(step), checks):
            first.setdefault(alert.kind, {"step": step, "minutes": round(row["elapsed_s"] / 60, 1),
                                          "title": alert.title, "fix": alert.fix})
    names = [r["name"] for r in config["rewards"]]
    return {"run": run.id, "rewards": {r["name"]: {k: v for k, v in r.items() if k != "name"}
                                       for r in config["rewards"]},
            "steps": [{"step": row["step"], "minutes": round(row["elapsed_s"] / 60, 2),
                       **{name: (row.get("rewards") or {}).get(name) for name in names},
                       "length": row.get("completion_len"), "clipped": row.get("clipped_ratio")} for row in rows],
            "heldout": heldout, "eval": run.read_eval(), "alerts": first,
            "watch": sorted(kind for kind in first if kind in HACKING)}


def region_shot(page, path: Path, top: str, bottom: str) -> None:
    """The page from the top of one element to the bottom of another, as one picture."""
    page.mouse.move(0, 0)
    page.evaluate("window.scrollTo(0, 0)")  # bounding boxes are then page coordinates
    first, last = page.locator(top).bounding_box(), page.locator(bottom).bounding_box()
    width = page.viewport_size["width"]
    clip = {"x": 0, "y": first["y"] - 12, "width": width, "height": last["y"] + last["height"] - first["y"] + 24}
    page.screenshot(path=str(path), full_page=True, clip=clip, animations="disabled")


def screenshots(runs: list[Path], folder: Path) -> None:
    """The two runs as a workshop sees them: the first one's Train tab with its alerts, both on the Experiments tab."""
    from playwright.sync_api import expect, sync_playwright

    from dragon_ui.studio.backend import Studio
    from dragon_ui.ui import build_app
    from dragon_ui.ui.app import launch

    (runs_dir,) = {Path(run).resolve().parent for run in runs}
    ids = [Path(run).name for run in runs]
    demo = build_app(Studio(runs_dir, policy=LAPTOP))
    launch(demo, prevent_thread_lock=True, quiet=True)
    folder.mkdir(parents=True, exist_ok=True)
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path="/usr/bin/chromium",
                                                 args=["--no-sandbox", "--headless", "--disable-gpu"])
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            expect.set_options(timeout=30_000)
            page.goto(demo.local_url)
            expect(page.locator("#form-area")).to_be_visible()
            page.locator("#recipe input").click()  # the lesson as a workshop opens it: its notes above the tabs
            page.get_by_role("option", name="reward_hacking").click()
            page.locator("#load-recipe").click()
            expect(page.locator("#draft-notes")).to_contain_text("Lesson: reward hacking")
            page.locator("#tabs button[role=tab]", has_text="Train").click()
            page.get_by_text("Past runs").click()
            page.locator("#train-run-choice input").click()
            page.get_by_role("option", name=ids[0]).click()
            page.locator("#train-open").click()
            expect(page.locator("#train-alerts")).to_contain_text("padding")
            page.locator("#train-rollouts button.explain-group").first.click()
            expect(page.locator("#train-explain")).to_contain_text("what did this step do?")
            region_shot(page, folder / "hacking.png", "#train-status", "#train-plot-length")
            page.locator("#tabs button[role=tab]", has_text="Experiments").click()
            for run_id in ids:
                page.locator("#experiments-runs input").click()
                page.get_by_role("option", name=run_id, exact=False).first.click()
            expect(page.locator("#experiments-said")).to_contain_text("differ")
            expect(page.locator("#experiments-chart-0 .legendtext")).to_have_count(len(ids))
            page.keyboard.press("Escape")  # the run picker's list closed
            expect(page.get_by_role("listbox")).to_have_count(0)
            region_shot(page, folder / "experiments.png", "#experiments-leaderboard", "#experiments-chart-3")
            browser.close()
    finally:
        demo.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--keep", type=Path, default=None, help="train into this folder and keep the runs")
    parser.add_argument("--analyse", type=Path, nargs="+", default=None, help="replay these run folders only")
    parser.add_argument("--screenshots", type=Path, default=None, help="save the app's pictures of the runs here")
    args = parser.parse_args()
    if args.analyse:
        runs = args.analyse
    else:
        workdir = args.keep or Path(tempfile.mkdtemp(prefix="dragon-hacking-"))
        workdir.mkdir(parents=True, exist_ok=True)
        runs = [train(lesson_config(fixed, args.steps, workdir / "runs"), workdir) for fixed in (False, True)]
    results = [replay(Path(run)) for run in runs]
    path = write_result("reward-hacking", {"settings": {"steps": args.steps}, "runs": results})
    for result in results:
        steps = result["steps"]
        names = list(result["rewards"])
        print(f"\n{result['run']}: " + ", ".join(f"{n} {result['rewards'][n]}" for n in names))
        print(table([[s["step"], s["minutes"], *(s[n] for n in names), s["length"], s["clipped"]] for s in steps],
                    ["step", "minutes", *names, "length", "at cap"]))
        print("held-out: " + ", ".join(f"step {c['step']}: {c['reward']:.3f}" for c in result["heldout"]))
        for kind, alert in result["alerts"].items():
            print(f"  first {kind} alert at step {alert['step']} ({alert['minutes']} min): {alert['title']}")
    print(f"->  {path}")
    if args.screenshots:
        screenshots(runs, args.screenshots)


if __name__ == "__main__":
    main()
