"""A minimal, hand-written TRL GRPO script: the baseline Dragon's engine is measured against.

Same model, data, rewards and GRPO settings as the arithmetic recipe, with nothing of Dragon in the training path:
no run store, no callbacks beyond one that notes the time of each step's log.

    python bench/plain_trl.py --model-dir DIR --prompts train.jsonl --steps 5 --out times.json [--dtype float32] [--threads 2]

``--prompts`` is a JSONL file of {"prompt": [chat messages], "reference": str}: the overhead benchmark passes the
exact training rows Dragon uses, in the same order, so both sample the same prompts and are timed on equal work.
"""

import argparse
import json
import re
import time

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


def length(prompts, completions, **kwargs):
    sizes = [len(c[0]["content"].strip()) for c in completions]
    return [1.0 if n <= 12 else max(0.0, 1 - (n - 12) / 12) for n in sizes]


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
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    with open(args.prompts, encoding="utf-8") as fh:
        rows = [json.loads(line) for line in fh if line.strip()]
    dataset = Dataset.from_list([{"prompt": r["prompt"], "reference": r["reference"]} for r in rows])
    tokenizer = AutoTokenizer.from_pretrained(args.model_dir)
    model = AutoModelForCausalLM.from_pretrained(args.model_dir, dtype=getattr(torch, args.dtype))
    config = GRPOConfig(
        output_dir="/tmp/plain-trl-bench", per_device_train_batch_size=24, num_generations=6, max_completion_length=16,
        learning_rate=1e-5, beta=0.04, temperature=1.0, max_steps=args.steps, logging_steps=1, save_strategy="no",
        report_to="none", use_cpu=not torch.cuda.is_available(), bf16=args.dtype == "bfloat16",
        gradient_checkpointing=False, reward_weights=[1.0, 0.3], disable_tqdm=True, seed=42,
    )
    lora = LoraConfig(r=16, lora_alpha=32, lora_dropout=0.05, target_modules="all-linear", task_type="CAUSAL_LM")
    times = StepTimes()
    trainer = GRPOTrainer(model=model, reward_funcs=[numeric, length], args=config, train_dataset=dataset,
                          processing_class=tokenizer, peft_config=lora, callbacks=[times])
    start = time.perf_counter()
    trainer.train()
    marks = [start] + times.times
    lengths = [row["completions/mean_length"] for row in trainer.state.log_history if "reward" in row]
    with open(args.out, "w") as fh:
        json.dump({"step_seconds": [b - a for a, b in zip(marks, marks[1:])], "completion_len": lengths}, fh)


if __name__ == "__main__":
    main()
