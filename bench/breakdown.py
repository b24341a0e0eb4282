"""Where the time of a GRPO step goes, next to the floor the FLOPs and this machine's matmul throughput imply.

Trains the arithmetic recipe through Dragon's engine with timers around TRL's own methods: generation, the
reference log-prob pass, reward scoring, the policy forward, the backward, the optimiser step, and Dragon's
callback (progress/rollout files). The floor for each part is the time its matmuls take on their own: every linear
layer of the model (q, k, v, o, gate, up, down, LM head) is timed at the exact shape the part uses (prefill, one
decode step, the training forward, the input-gradient of the backward) in the same dtype and threads, and the
floor adds those times up. The LM head counts only the rows that need it: the last prompt position and each new
token when sampling, the completion tokens when scoring. Attention scores and the non-matmul ops count as zero. A
second, "peak" floor divides the same FLOPs by the best throughput any shape reached, which is what the machine
could do if every matmul ran as well as its best one.

    python bench/breakdown.py [--steps 4] [--dtype float32] [--threads 2] [--set lora.dropout=0] [--tag NAME]

DRAGON_UI_SPEEDUPS chooses the speed-ups (dragon_ui/speedups.py); bench/speedups.py compares them.
"""

import argparse
import contextlib
import json
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path

from common import bench_config_dict, matmul_gflops, median, table, write_result

PARTS = ["generation", "reference_pass", "rewards", "policy_forward", "backward", "optimizer", "dragon_callback"]


class Timers:
    """Seconds per part for the step in progress; a thread-local flag tells the two log-prob passes apart."""

    def __init__(self):
        self.current = defaultdict(float)
        self.steps: list[dict] = []
        self.local = threading.local()
        self.step_started = None

    @contextlib.contextmanager
    def part(self, name):
        start = time.perf_counter()
        try:
            yield
        finally:
            self.current[name] += time.perf_counter() - start

    def wrap(self, owner, method, name_for_call):
        original = getattr(owner, method)
        timers = self

        def timed(*args, **kwargs):
            name = name_for_call()
            if name is None:
                return original(*args, **kwargs)
            with timers.part(name):
                return original(*args, **kwargs)

        setattr(owner, method, timed)


def instrument(timers: Timers) -> None:
    from transformers import TrainerCallback
    from trl import GRPOTrainer

    from dragon_ui import training

    scoring = lambda: getattr(timers.local, "scoring", False)  # noqa: E731

    original_score = GRPOTrainer._generate_and_score_completions

    def generate_and_score(self, *args, **kwargs):
        timers.local.scoring = True
        try:
            return original_score(self, *args, **kwargs)
        finally:
            timers.local.scoring = False

    GRPOTrainer._generate_and_score_completions = generate_and_score
    timers.wrap(GRPOTrainer, "_generate", lambda: "generation")
    timers.wrap(GRPOTrainer, "_calculate_rewards", lambda: "rewards")
    timers.wrap(GRPOTrainer, "_get_per_token_logps_and_entropies",
                lambda: "reference_pass" if scoring() else "policy_forward")
    for hook in ("on_log", "on_step_end", "on_save"):
        timers.wrap(training.RunStoreCallback, hook, lambda: "dragon_callback")

    class StepClock(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            timers.current = defaultdict(float)
            timers.step_started = time.perf_counter()

        def on_pre_optimizer_step(self, args, state, control, **kwargs):
            timers.optimizer_started = time.perf_counter()

        def on_optimizer_step(self, args, state, control, **kwargs):
            timers.current["optimizer"] += time.perf_counter() - timers.optimizer_started

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "reward" in logs and timers.step_started is not None:
                row = dict(timers.current)
                row["total"] = time.perf_counter() - timers.step_started
                row["completion_len"] = logs.get("completions/mean_length")
                row["reward"] = logs.get("reward")
                timers.steps.append(row)

    original_build = training.build_trainer

    def build_trainer(*args, **kwargs):
        trainer = original_build(*args, **kwargs)
        timers.wrap(trainer.accelerator, "backward", lambda: "backward")
        trainer.add_callback(StepClock())
        return trainer

    training.build_trainer = build_trainer


def linear_shapes(model_dir: str) -> list[tuple[int, int, int]]:
    """(in_features, out_features, count) of every linear layer; the LM head comes last."""
    config = json.loads((Path(model_dir) / "config.json").read_text())
    hidden, layers, inter = config["hidden_size"], config["num_hidden_layers"], config["intermediate_size"]
    heads = config["num_attention_heads"]
    kv = config.get("num_key_value_heads", heads) * (config.get("head_dim") or hidden // heads)
    per_layer = [(hidden, hidden), (hidden, kv), (hidden, kv), (hidden, hidden), (hidden, inter), (hidden, inter),
                 (inter, hidden)]
    shapes: dict[tuple[int, int], int] = {}
    for shape in per_layer:
        shapes[shape] = shapes.get(shape, 0) + layers
    shapes[(hidden, config["vocab_size"])] = 1
    return [(k, n, count) for (k, n), count in shapes.items()]


class Floors:
    """Time of a model's matmuls at a given batch of rows, from measured per-shape throughput (cached)."""

    def __init__(self, shapes, dtype: str):
        self.shapes, self.dtype, self.measured = shapes, dtype, {}

    def gflops(self, m: int, k: int, n: int) -> float:
        if (m, k, n) not in self.measured:
            self.measured[(m, k, n)] = matmul_gflops(m, k, n, self.dtype, seconds=0.3)
        return self.measured[(m, k, n)]

    def seconds(self, rows: int, head_rows: int, backward: bool = False) -> float:
        """One pass over ``rows`` tokens of which ``head_rows`` reach the LM head; ``backward``: the input gradients
        (out -> in) the frozen weights need."""
        total = 0.0
        for index, (k, n, count) in enumerate(self.shapes):
            m = head_rows if index == len(self.shapes) - 1 else rows
            shape = (m, n, k) if backward else (m, k, n)
            total += count * 2 * m * k * n / (self.gflops(*shape) * 1e9)
        return total

    def flops(self, rows: int, head_rows: int) -> float:
        *layers, (k, n, _) = self.shapes
        return sum(count * 2 * rows * k * n for k, n, count in layers) + 2 * head_rows * k * n

    def peak(self) -> float:
        return max(self.measured.values())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--tag", default="")
    args = parser.parse_args()

    import torch

    from dragon_ui import speedups, training
    from dragon_ui.config import ModelConfig, RunConfig, apply_overrides
    from dragon_ui.models import load_tokenizer, resolve_model

    torch.set_num_threads(args.threads)
    timers = Timers()
    instrument(timers)
    with tempfile.TemporaryDirectory() as tmp:
        data = bench_config_dict(args.steps, Path(tmp), dtype=args.dtype, threads=args.threads)
        config = RunConfig.from_dict(apply_overrides(data, args.set))
        handle = training.start(config)
        handle.wait()
        status = handle.run.read_status()
        assert status["state"] == "succeeded", status.get("error")
        examples = [json.loads(line) for line in (handle.run.data_dir / "train.jsonl").read_text().splitlines()]

    source = resolve_model(ModelConfig())
    tokenizer = load_tokenizer(source)
    prompt_tokens = median([len(tokenizer(tokenizer.apply_chat_template(ex["prompt"], add_generation_prompt=True, tokenize=False),
                                          add_special_tokens=False)["input_ids"]) for ex in examples[:50]])
    sequences = config.training.batch_size * config.grpo.group_size
    steps = timers.steps[1:]  # the first step includes warm-up
    completion = median([s["completion_len"] for s in steps])
    floors_of = Floors(linear_shapes(source.path), args.dtype)
    prompt_rows, train_rows = int(sequences * prompt_tokens), int(sequences * (prompt_tokens + completion))
    scored_rows = int(sequences * completion)
    reference = config.grpo.beta > 0
    floors = {
        "generation": floors_of.seconds(prompt_rows, sequences) + completion * floors_of.seconds(sequences, sequences),
        "reference_pass": floors_of.seconds(train_rows, scored_rows) if reference else 0.0,
        "rewards": 0.0,
        "policy_forward": floors_of.seconds(train_rows, scored_rows),
        # LoRA: the input gradients of the frozen weights
        "backward": floors_of.seconds(train_rows, scored_rows, backward=True),
        "optimizer": 0.0,
        "dragon_callback": 0.0,
    }
    peak = floors_of.peak()
    step_flops = (floors_of.flops(prompt_rows, sequences) + completion * floors_of.flops(sequences, sequences)
                  + (2 + reference) * floors_of.flops(train_rows, scored_rows))  # policy forward, backward, reference
    peak_floor = step_flops / (peak * 1e9)
    measured = {part: median([s.get(part, 0.0) for s in steps]) for part in PARTS}
    total = median([s["total"] for s in steps])
    other = max(0.0, total - sum(measured.values()))
    floor_total = sum(floors.values())
    rows = [[part, measured[part], floors[part], measured[part] / floors[part] if floors[part] else "-"] for part in PARTS]
    rows += [["other (TRL/transformers bookkeeping)", other, 0.0, "-"], ["step", total, floor_total, total / floor_total]]
    active = [name for name in speedups.ALL if speedups.enabled(name)]
    print(f"speed-ups: {', '.join(active) or 'none'}")
    print(f"dtype {args.dtype}, {args.threads} thread(s), {sequences} sequences x ({prompt_tokens:.0f} prompt + "
          f"{completion:.1f} new tokens); matmul throughput by shape: {min(floors_of.measured.values()):.1f} to "
          f"{peak:.1f} GFLOP/s; peak-throughput floor of a step: {peak_floor:.2f} s")
    print(table([[r[0], f"{r[1]:.4f}", f"{r[2]:.3f}", r[3]] for r in rows], ["part", "median s", "floor s", "x floor"]))
    path = write_result(f"breakdown-{args.dtype}{'-' + args.tag if args.tag else ''}", {
        "settings": vars(args), "speedups": active, "sequences": sequences, "prompt_tokens": prompt_tokens,
        "completion_tokens": completion,
        "matmul_gflops_by_shape": {f"{m}x{k}x{n}": g for (m, k, n), g in floors_of.measured.items()},
        "peak_gflops": peak, "peak_floor_step_s": peak_floor, "measured_median_s": measured, "other_s": other,
        "step_median_s": total, "floors_s": floors, "floor_step_s": floor_total, "step_over_floor": total / floor_total,
        "per_step": steps})
    print(f"step / floor = {total / floor_total:.2f}  ->  {path}")


if __name__ == "__main__":
    main()
