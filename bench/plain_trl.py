"""A minimal, hand-written TRL GRPO script: the baseline Dragon's engine is measured against.

Same model, data, rewards and GRPO settings as the arithmetic recipe, with nothing of Dragon in the training path:
no run store, no callbacks beyond one that notes the time of each step's log.

    python bench/plain_trl.py --model-dir DIR --prompts train.jsonl --config run.json --steps 5 --out times.json \
        [--dtype float32] [--threads 2]

``--prompts`` is a JSONL file of {"prompt": [chat messages], "reference": str} and ``--config`` the run config as
JSON (its ``grpo``, ``training``, ``lora`` and ``rewards`` sections are read as plain values): the overhead
benchmark passes the exact training rows and settings Dragon uses, so both sample the same prompts at the same
temperature and are timed on equal work.

``--speedups`` applies Dragon's CPU speed-ups (``dragon_ui/speedups/``, as ``DRAGON_UI_SPEEDUPS`` chooses them)
to this same script: the work of Dragon as shipped without Dragon's engine (run store, callbacks, worker thread),
so the engine's own cost can be measured at the speed users actually train at.
"""

import argparse
import json
import os
import re
import sys
import time
from pathlib import Path

import torch
from datasets import Dataset
from peft import LoraConfig
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
from trl import GRPOConfig, GRPOTrainer


def last_number(text):
    found = re.findall(r"-?\d[\d,]*\.?\d*", text)
    return float(found[-1].replace(",", "").rstrip(".")) if found else None


def numeric(prompts, completions, reference, **kwargs):
    scores = []
    for completion, ref in zip(completions, reference):
        got, want = last_number(completion[0]["content"]), last_number(ref)
        scores.append(float(got is not None and abs(got - want) <= max(1e-6, 1e-6 * abs(want))))
    return scores


def length_reward(max_chars):
    def length(prompts, completions, **kwargs):
        sizes = [len(c[0]["content"].strip()) for c in completions]
        return [1.0 if n <= max_chars else max(0.0, 1 - (n - max_chars) / max_chars) for n in sizes]

    return length


class StepTimes(TrainerCallback):
    def __init__(self):
        self.times = []

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "reward" in logs:
            self.times.append(time.perf_counter())


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model-dir", required=True)
    parser.add_argument("--prompts", required=True)
    parser.add_argument("--config", required=True)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", required=True)
    parser.add_argument("--speedups", action="store_true", help="apply Dragon's speed-ups to this plain script")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    with open(args.prompts, encoding="utf-8") as fh:
        rows = [json.loads(line) for line in fh if line.strip()]
    with open(args.config, encoding="utf-8") as fh:
        run = json.load(fh)
    grpo, training, lora_settings = run["grpo"], run["training"], run["lora"]
    numeric_reward, length_settings = run["rewards"]
    assert (numeric_reward["kind"], length_settings["kind"]) == ("numeric", "length"), "the arithmetic recipe's rewards"
    dataset = Dataset.from_list([{"prompt": r["prompt"], "reference": r["reference"]} for r in rows])
    tokenizer = AutoTokenizer.from_pretrained(args.model_dir)
    model = AutoModelForCausalLM.from_pretrained(args.model_dir, dtype=getattr(torch, args.dtype))
    trainer_class = GRPOTrainer
    if args.speedups:
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
        from dragon_ui import speedups

        speedups.choose(os.environ.get(speedups.ENV, ""))
        speedups.apply_to_loaded_model(model)
        trainer_class = speedups.grpo_trainer_class()  # GRPOTrainer sampling and scoring with the speed-ups
    config = GRPOConfig(
        output_dir="/tmp/plain-trl-bench", per_device_train_batch_size=training["batch_size"] * grpo["group_size"],
        num_generations=grpo["group_size"], max_completion_length=grpo["max_new_tokens"],
        learning_rate=training["learning_rate"], beta=grpo["beta"], temperature=grpo["temperature"],
        loss_type=grpo["loss_type"], scale_rewards=grpo["scale_rewards"], warmup_steps=training["warmup_ratio"],
        weight_decay=training["weight_decay"], max_steps=args.steps, logging_steps=1, save_strategy="no",
        report_to="none", use_cpu=not torch.cuda.is_available(), bf16=args.dtype == "bfloat16",
        activation_checkpointing=False, reward_weights=[numeric_reward["weight"], length_settings["weight"]],
        disable_tqdm=True, seed=training["seed"],
    )
    lora = LoraConfig(r=lora_settings["r"], lora_alpha=lora_settings["alpha"], lora_dropout=lora_settings["dropout"],
                      target_modules=lora_settings["target_modules"], task_type="CAUSAL_LM")
    times = StepTimes()
    reward_funcs = [numeric, length_reward(length_settings["max_chars"])]
    trainer = trainer_class(model=model, reward_funcs=reward_funcs, args=config, train_dataset=dataset,
                            processing_class=tokenizer, peft_config=lora, callbacks=[times])
    if args.speedups:
        speedups.apply_to_trainer_model(trainer.model)
    start = time.perf_counter()
    trainer.train()
    marks = [start] + times.times
    lengths = [row["completions/mean_length"] for row in trainer.state.log_history if "reward" in row]
    with open(args.out, "w") as fh:
        json.dump({"step_seconds": [b - a for a, b in zip(marks, marks[1:])], "completion_len": lengths}, fh)


if __name__ == "__main__":
    main()
