"""Learning per minute: held-out reward of the arithmetic recipe after fixed wall-clock training budgets.

Trains the recipe on the offline SmolLM2 copy through Dragon's engine. At each budget the run is stopped (it saves
a checkpoint), that checkpoint is scored on held-out prompts with greedy decoding, and training resumes; scoring
time is not counted as training time. Held-out prompts: the recipe's own 20, plus 100 fresh additions that are not
in the dataset at all, for a less noisy figure. Rewards are reported per reward and as the total normalised to
0..1 (divided by the sum of the weights).

    python bench/learning.py [--minutes 5 10 15] [--dtype auto] [--set training.learning_rate=5e-5] [--tag NAME]
"""

import argparse
import json
import random
import tempfile
import threading
import time
from pathlib import Path

from common import RESULTS, bench_config_dict, table, write_result


def fresh_problems(dataset_questions: set[str], n: int = 100, seed: int = 7) -> list[dict]:
    rng = random.Random(seed)
    problems = []
    while len(problems) < n:
        a, b = rng.randint(10, 99), rng.randint(10, 99)
        question = f"What is {a} + {b}? Reply with just the number."
        if question not in dataset_questions and question not in {p["question"] for p in problems}:
            problems.append({"question": question, "answer": str(a + b)})
    return problems


def score(model, tokenizer, examples, rewards, max_new_tokens) -> dict:
    from dragon_ui.engine.evaluation import evaluate_model

    result = evaluate_model(model, tokenizer, examples, rewards, max_new_tokens)
    total_weight = sum(r.weight for r in rewards)
    return {"normalised": result.reward_mean / total_weight, **result.breakdown,
            "examples": [{"reply": r, "total": t} for r, t in zip(result.replies[:5], result.totals[:5])]}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--minutes", type=float, nargs="+", default=[5, 10, 15])
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--tag", default="")
    args = parser.parse_args()

    from peft import PeftModel

    from dragon_ui.config import RunConfig, apply_overrides
    from dragon_ui.data import load_and_map
    from dragon_ui.public import LAPTOP
    from dragon_ui.engine import training
    from dragon_ui.engine.hardware import resolve_hardware
    from dragon_ui.engine.models import load_model, load_tokenizer, resolve_model
    from dragon_ui.rewards import build_rewards

    workdir = Path(tempfile.mkdtemp(prefix="dragon-learning-"))
    data = bench_config_dict(100_000, workdir / "runs", dtype=args.dtype, threads=args.threads)
    apply_overrides(data, args.set)
    data["training"]["save_steps"] = 100_000
    config = RunConfig.from_dict(data, policy=LAPTOP)
    hardware = resolve_hardware(config.hardware)
    source = resolve_model(config.model)
    tokenizer = load_tokenizer(source)
    rewards = build_rewards(config.rewards, tokenizer=tokenizer, max_new_tokens=config.grpo.max_new_tokens, policy=LAPTOP)

    base_model = load_model(source, hardware)
    split = load_and_map(config.data, base_dir=config.base_dir, policy=LAPTOP)
    questions = {json.loads(example["row"])["question"] for example in split.train + split.eval}
    fresh = [{"prompt": [{"role": "user", "content": p["question"]}], "reference": p["answer"],
              "row": json.dumps(p)} for p in fresh_problems(questions)]
    eval_sets = {"recipe_heldout": split.eval, "fresh_100": fresh}

    def measure(model, trained_s: float, step: int) -> None:
        point = {"minutes_trained": trained_s / 60, "step": step}
        for name, examples in eval_sets.items():
            point[name] = score(model, tokenizer, examples, rewards, config.grpo.max_new_tokens)
        points.append(point)
        print(f"{trained_s / 60:5.1f} min, step {step:3d}: recipe held-out {point['recipe_heldout']['normalised']:.3f}, "
              f"fresh {point['fresh_100']['normalised']:.3f}", flush=True)

    points: list[dict] = []
    measure(base_model, 0.0, 0)
    run = None
    for budget in args.minutes:
        # Trains here (as `dragon train` does) until ``budget`` minutes of training, then stops with a checkpoint.
        def stop_at_budget(job, budget=budget) -> None:
            def watch() -> None:
                while not job.should_stop():
                    rows = job.run.read_progress()
                    if rows and rows[-1]["elapsed_s"] >= budget * 60:
                        job.stop()
                    time.sleep(2)
            threading.Thread(target=watch, daemon=True).start()

        if run is None:
            run = training.train_config(config, policy=LAPTOP, on_start=stop_at_budget)
        else:
            training.resume_here(run.path, policy=LAPTOP, on_start=stop_at_budget)
        status = run.read_status()
        if status["state"] != "cancelled":
            raise SystemExit(f"training ended unexpectedly: {status.get('state')} {status.get('error')}")
        rows = run.read_progress()
        model = PeftModel.from_pretrained(base_model, str(run.latest_checkpoint()))
        measure(model, rows[-1]["elapsed_s"], rows[-1]["step"])
        base_model = model.unload()  # the same base weights, without this checkpoint's adapter
    progress = run.read_progress()
    result = {"settings": {**vars(args), "config": config.to_dict()}, "points": points, "progress": progress,
              "run_dir": str(run.path)}
    name = f"learning{'-' + args.tag if args.tag else ''}"
    path = write_result(name, result)
    plot(points, progress, RESULTS / f"{name}.png", config)
    base = points[0]
    print(table([[f"{p['minutes_trained']:.1f}", p["step"], p["recipe_heldout"]["normalised"], p["fresh_100"]["normalised"],
                  p["fresh_100"]["normalised"] - base["fresh_100"]["normalised"]] for p in points],
                ["minutes", "step", "held-out (20)", "fresh (100)", "gain (fresh)"]))
    print(f"-> {path}")


def plot(points: list[dict], progress: list[dict], path: Path, config) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    minutes = [p["minutes_trained"] for p in points]
    for key, label in [("fresh_100", "100 fresh prompts"), ("recipe_heldout", "recipe's 20 held-out")]:
        left.plot(minutes, [p[key]["normalised"] for p in points], marker="o", label=f"total (normalised), {label}")
    for reward in config.rewards:
        left.plot(minutes, [p["fresh_100"][reward.name] for p in points], linestyle="--", marker=".",
                  label=f"{reward.name}, fresh")
    left.set(xlabel="minutes of training", ylabel="held-out reward (greedy)", ylim=(0, 1.05), title="Held-out reward")
    left.legend(fontsize=8)
    right.plot([r["elapsed_s"] / 60 for r in progress], [r["reward"] / sum(x.weight for x in config.rewards) for r in progress],
               alpha=0.6, label="sampled reward (normalised)")
    right.set(xlabel="minutes of training", ylabel="reward", ylim=(0, 1.05), title="Training reward per step")
    right.legend(fontsize=8)
    fig.suptitle("Arithmetic recipe, SmolLM2-135M (offline copy) on this machine's CPU")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
