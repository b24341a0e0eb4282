"""The calculator lesson, measured: SmolLM2-135M learning to call a calculator for three-digit products, on the CPU.

Two runs through Dragon's engine on the same data and held-out prompts: the recipe without its tool (one step, for
its held-out scores: the model alone), then the recipe as shipped (the calculator, two worked examples in every
prompt). For the tools run it reports, over the first and last steps, the training reward and the tool calls per
completion, and the held-out reward before and after training with the share of held-out replies that called the
calculator. Writes bench/results/calculator.json.

    python bench/calculator.py [--steps 40]
"""

from __future__ import annotations

import argparse
import statistics

from common import REPO, lesson_draft, table, write_result

from dragon_ui.config import RunConfig
from dragon_ui.public import LAPTOP

LESSON = REPO / "dragon_ui" / "assets" / "recipes" / "calculator.yaml"
WINDOW = 4  # steps at each end of a run whose mean says where it started and where it ended


def trained(config: RunConfig) -> dict:
    from dragon_ui.public import LAPTOP
    from dragon_ui.engine import training

    run = training.train_config(config, policy=LAPTOP)
    state = run.read_status()["state"]
    rows = run.read_progress()
    evaluation = run.read_eval()
    answer = [(row.get("rewards") or {}).get("answer") for row in rows]
    calls = [row.get("tool_calls") for row in rows]
    return {"run": run.id, "state": state, "error": run.read_status().get("error"),
            "steps": [{"step": row["step"], "answer": value, "tool_calls": called,
                       "tool_failures": row.get("tool_failures"), "no_spread": row.get("no_spread_share"),
                       "minutes": round(row["elapsed_s"] / 60, 2)} for row, value, called in zip(rows, answer, calls)],
            "answer_first": statistics.fmean(answer[:WINDOW]), "answer_last": statistics.fmean(answer[-WINDOW:]),
            "calls_first": _mean(calls[:WINDOW]), "calls_last": _mean(calls[-WINDOW:]),
            "heldout_before": (evaluation.get("before") or {}).get("reward_mean"),
            "heldout_after": (evaluation.get("after") or {}).get("reward_mean"),
            "n_heldout": (evaluation.get("after") or {}).get("n_prompts"),
            "seconds_per_step": statistics.fmean(row["step_time_s"] for row in rows if row.get("step_time_s")),
            "minutes": round(rows[-1]["elapsed_s"] / 60, 1) if rows else None}


def _mean(values: list) -> float | None:
    known = [value for value in values if value is not None]
    return statistics.fmean(known) if known else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int)
    args = parser.parse_args()

    draft = lesson_draft(LESSON, "bench-calculator-", args.steps)
    alone = {key: value for key, value in draft.items() if key != "tools"}
    alone.update(name="calculator-alone", training={**draft["training"], "max_steps": 1, "eval_every": 0})

    without = trained(RunConfig.from_dict(alone, policy=LAPTOP))
    with_tool = trained(RunConfig.from_dict(draft, policy=LAPTOP))
    print(table([["the model alone (no tool)", f"{without['heldout_before']:.3f}", "–", "–"],
                 ["with the calculator", f"{with_tool['heldout_before']:.3f} → {with_tool['heldout_after']:.3f}",
                  f"{with_tool['answer_first']:.3f} → {with_tool['answer_last']:.3f}",
                  f"{with_tool['calls_first']:.2f} → {with_tool['calls_last']:.2f}"]],
                ["run", f"held-out answer ({with_tool['n_heldout']} prompts)", f"training answer, first → last "
                 f"{WINDOW} steps", "tool calls per completion"]))
    write_result("calculator", {"steps": draft["training"]["max_steps"], "alone": without, "with_tool": with_tool})


if __name__ == "__main__":
    main()
