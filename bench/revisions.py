"""Before and after a change to the training path: the same short run trained by the code of two git revisions.

Each revision is checked out into a temporary worktree and trains the arithmetic recipe *as that revision ships it*
(through its own command line, so a config setting one revision does not know cannot get in the way), on the CPU
with the same precision and threads. Runs alternate between the revisions in fresh processes, in a rotating order,
so drift on a shared machine hits both equally; the first step of every run is dropped (warm-up) and the medians
of the rest are compared, with each repeat's own ratio beside them.

    python bench/revisions.py BEFORE [AFTER] [--steps 5] [--repeats 3] [--dtype float32] [--threads 2]
                              [--label torch2.13]

AFTER defaults to the working tree as it is (uncommitted changes included). ``--label`` names the results file
(revisions-<dtype>-<label>.json), to keep a run on another stack beside this one.
"""

import argparse
import subprocess
import tempfile
from pathlib import Path

from common import REPO, median, table, write_result
from overhead import run_steps


def worktree(revision: str, parent: Path) -> Path:
    """A checkout of ``revision`` under ``parent`` (removed with it)."""
    target = parent / revision.replace("/", "_")
    subprocess.run(["git", "worktree", "add", "--detach", str(target), revision], cwd=REPO, check=True,
                   capture_output=True, text=True)
    return target


def train(tree: Path, workdir: Path, steps: int, dtype: str, threads: int) -> tuple[list[float], list[float]]:
    """Step times and completion lengths of one run of the revision in ``tree``."""
    overrides = [f"training.max_steps={steps}", "training.save_steps=10000", "training.eval_every=0",
                 "hardware.device=cpu", f"hardware.dtype={dtype}", f"hardware.cpu_threads={threads}",
                 f"runs_dir={workdir / 'runs'}", "n_samples=0"]
    command = ["train", str(tree / "dragon_ui" / "assets" / "recipes" / "arithmetic.yaml")]
    for override in overrides:
        command += ["--set", override]
    return run_steps(command, tree, workdir / "runs")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("before")
    parser.add_argument("after", nargs="?", default=None, help="a revision; default: the working tree")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--label", default="", help="added to the results file's name")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as parent:
        parent = Path(parent)
        trees = {"before": worktree(args.before, parent),
                 "after": worktree(args.after, parent) if args.after else REPO}
        try:
            measured = {side: [] for side in trees}
            lengths = {side: [] for side in trees}
            paired = []
            for repeat in range(args.repeats):
                order = list(trees) if repeat % 2 == 0 else list(trees)[::-1]
                this_repeat = {}
                for side in order:
                    with tempfile.TemporaryDirectory() as workdir:
                        steps, length = train(trees[side], Path(workdir), args.steps, args.dtype, args.threads)
                    measured[side] += steps[1:]
                    lengths[side] += length[1:]
                    this_repeat[side] = median(steps[1:])
                    print(f"repeat {repeat + 1} {side:6s}: " + " ".join(f"{s:.2f}" for s in steps), flush=True)
                paired.append(this_repeat["after"] / this_repeat["before"])
        finally:
            for side, tree in trees.items():
                if tree != REPO:
                    subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=REPO,
                                   capture_output=True)
    medians = {side: median(values) for side, values in measured.items()}
    path = write_result(f"revisions-{args.dtype}" + (f"-{args.label}" if args.label else ""), {
        "settings": vars(args), "step_seconds": measured, "completion_len": lengths, "median_s": medians,
        "after_over_before": medians["after"] / medians["before"], "paired_ratios": paired})
    label = {"before": args.before, "after": args.after or "working tree"}
    print(table([[label[side], medians[side], median(lengths[side]), len(measured[side])] for side in trees],
                ["revision", "median s/step", "median completion tokens", "steps"]))
    print(f"after / before: {medians['after'] / medians['before']:.3f} over all steps; per repeat "
          + ", ".join(f"{ratio:.3f}" for ratio in paired))
    print(f"->  {path}")


if __name__ == "__main__":
    main()
