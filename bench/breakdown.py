"""Where the time of a GRPO step goes, next to the floor the FLOPs and this machine's matmul throughput imply.

Trains the arithmetic recipe through Dragon's engine with timers around TRL's own methods: generation, the
reference log-prob pass, reward scoring, the policy forward, the backward, the optimiser step, and Dragon's
callback (progress/rollout files). The floor for each part is the time its matmuls take on their own: every linear
layer of the model (q, k, v, o, gate, up, down, LM head) and, with LoRA, the adapters' thin matmuls (see
``Floors``) are timed at the exact shapes the part uses (prefill, one decode step, the training forward, the
backward's gradients) in the same dtype and threads, and the floor adds those times up. Each shape is timed with
its weight read from main memory, as in a real pass over the model (whose weights are several times the size of
this machine's caches): a decoding step's matmuls of 24 rows run 1.5 times slower that way than with one weight
reused from the cache, which no pass over a model ever gets. With ``merged_sampling``, generation counts the
merged weights' matmuls and the merge itself (B @ A per adapted layer, in float32) instead of the adapters' matmuls
per token. With ``shared_prompts``, the floor counts each distinct prompt once where the step reads it once: when
sampling, in the reference pass and, without dropout, in the policy pass. The LM head counts only the rows that
need it: the last prompt position and each new token when sampling, the completion tokens when scoring. Attention
scores (about 2 % of the FLOPs at these lengths) and the non-matmul ops count as zero. A second, "peak" floor divides the same FLOPs by the best throughput any shape reached, which is what the machine could do
if every matmul ran as well as its best one. A third, "TRL's floor", counts the passes plain TRL makes for the same
step (every copy of a prompt read, the adapters applied per token), to show what the speed-ups that remove matmul
work gain against the hardware limit of TRL's own way.

    python bench/breakdown.py [--steps 4] [--dtype float32] [--threads 2] [--set lora.dropout=0] [--tag NAME]

DRAGON_UI_SPEEDUPS chooses the speed-ups (dragon_ui/speedups/); bench/speedups.py compares them.
"""

import argparse
import contextlib
import json
import os
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

    from dragon_ui.engine import progress, training

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
        timers.wrap(progress.RunStoreCallback, hook, lambda: "dragon_callback")

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


def linear_shapes(model_dir: str) -> list[tuple[str, int, int, int]]:
    """(name, in_features, out_features, count) of every linear layer; the LM head comes last."""
    config = json.loads((Path(model_dir) / "config.json").read_text())
    hidden, layers, inter = config["hidden_size"], config["num_hidden_layers"], config["intermediate_size"]
    heads = config["num_attention_heads"]
    kv = config.get("num_key_value_heads", heads) * (config.get("head_dim") or hidden // heads)
    per_layer = [("q_proj", hidden, hidden), ("k_proj", hidden, kv), ("v_proj", hidden, kv), ("o_proj", hidden, hidden),
                 ("gate_proj", hidden, inter), ("up_proj", hidden, inter), ("down_proj", inter, hidden)]
    return [(name, k, n, layers) for name, k, n in per_layer] + [("lm_head", hidden, config["vocab_size"], 1)]


def best_gflops(m: int, k: int, n: int, dtype: str, weights_mib: float = 0) -> float:
    """The best of three timings of one shape, since a busy moment on a shared machine only ever makes a matmul
    slower."""
    return max(matmul_gflops(m, k, n, dtype, seconds=0.15, weights_mib=weights_mib) for _ in range(3))


class Floors:
    """Time of a model's matmuls at a given batch of rows, from measured per-shape throughput (cached).

    With LoRA the adapters' own matmuls count too: x·A and (x·A)·B in a forward; in the backward, the gradients
    flowing back through B and A and the gradients of A's and B's weights. They are thin (rank 16), so they run
    far below the machine's best throughput, but a LoRA step cannot do without them. Without LoRA the backward
    counts every weight's gradient instead.
    """

    def __init__(self, shapes, dtype: str, lora_rank: int = 0, adapted: str | list[str] = "all-linear"):
        self.shapes, self.dtype, self.rank, self.measured = shapes, dtype, lora_rank, {}
        self.adapted = {name for name, *_ in shapes[:-1]} if adapted == "all-linear" else set(adapted)
        bytes_per_value = 2 if dtype in ("bfloat16", "float16") else 4
        self.weights_mib = sum(k * n * count for _, k, n, count in shapes) * bytes_per_value / 2**20

    def gflops(self, m: int, k: int, n: int) -> float:
        """Throughput of one shape, its weights cycling through as much memory as the model's own weights fill."""
        if (m, k, n) not in self.measured:
            self.measured[(m, k, n)] = best_gflops(m, k, n, self.dtype, weights_mib=self.weights_mib)
        return self.measured[(m, k, n)]

    def matmuls(self, rows: int, head_rows: int, backward: bool, adapters: bool) -> list[tuple[int, int, int, int]]:
        """(m, k, n, count) of every matmul of one pass over ``rows`` tokens, ``head_rows`` of which reach the LM head."""
        r, found = self.rank, []
        for name, k, n, count in self.shapes:
            m = head_rows if name == "lm_head" else rows
            if not m:
                continue
            found.append(((m, n, k) if backward else (m, k, n)) + (count,))
            if backward and not r:  # full fine-tuning: the weight gradients too
                found.append((n, m, k, count))
            if adapters and r and name in self.adapted:
                found += [(m, n, r, count), (m, r, k, count), (r, m, n, count), (k, m, r, count)] if backward \
                    else [(m, k, r, count), (m, r, n, count)]
        return found

    def seconds(self, rows: int, head_rows: int, backward: bool = False, adapters: bool = True) -> float:
        return sum(count * 2 * m * k * n / (self.gflops(m, k, n) * 1e9)
                   for m, k, n, count in self.matmuls(rows, head_rows, backward, adapters))

    def flops(self, rows: int, head_rows: int, backward: bool = False, adapters: bool = True) -> float:
        return sum(count * 2 * m * k * n for m, k, n, count in self.matmuls(rows, head_rows, backward, adapters))

    def merge_matmuls(self) -> list[tuple[int, int, int, int]]:
        """(m, k, n, count) of ``merged_sampling``'s B @ A per adapted layer, in float32 as the adapters are."""
        return [(n, self.rank, k, count) for name, k, n, count in self.shapes if name in self.adapted]

    def merge_seconds(self) -> float:
        return sum(count * 2 * m * k * n / (best_gflops(m, k, n, "float32") * 1e9) for m, k, n, count in self.merge_matmuls())

    def merge_flops(self) -> float:
        return sum(count * 2 * m * k * n for m, k, n, count in self.merge_matmuls())

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

    from dragon_ui import speedups
    from dragon_ui.config import ModelConfig, RunConfig, apply_overrides
    from dragon_ui.engine import training
    from dragon_ui.engine.models import load_tokenizer, resolve_model
    from dragon_ui.public import LAPTOP

    torch.set_num_threads(args.threads)
    speedups.choose(os.environ.get(speedups.ENV, ""))
    timers = Timers()
    instrument(timers)
    with tempfile.TemporaryDirectory() as tmp:
        data = bench_config_dict(args.steps, Path(tmp), dtype=args.dtype, threads=args.threads)
        config = RunConfig.from_dict(apply_overrides(data, args.set), policy=LAPTOP)
        run = training.train_config(config, policy=LAPTOP)
        status = run.read_status()
        assert status["state"] == "succeeded", status.get("error")
        examples = [json.loads(line) for line in run.train_data_path.read_text().splitlines()]

    source = resolve_model(ModelConfig())
    tokenizer = load_tokenizer(source)
    prompt_tokens = median([len(tokenizer(tokenizer.apply_chat_template(ex["prompt"], add_generation_prompt=True, tokenize=False),
                                          add_special_tokens=False)["input_ids"]) for ex in examples[:50]])
    sequences = config.training.batch_size * config.grpo.group_size
    steps = timers.steps[1:]  # the first step includes warm-up
    completion = median([s["completion_len"] for s in steps])
    lora_rank = config.lora.r if config.lora.enabled else 0
    floors_of = Floors(linear_shapes(source.path), args.dtype, lora_rank, config.lora.target_modules)
    # whole tokens per sequence, as in every real pass: oneDNN is up to 2x slower at some odd row counts (1444)
    prompt_rows, train_rows = sequences * round(prompt_tokens), sequences * round(prompt_tokens + completion)
    scored_rows = sequences * round(completion)
    reference = config.grpo.beta > 0
    # merged_sampling samples through the adapted weights merged into one matrix per layer, made once per step
    merged = bool(lora_rank) and speedups.enabled("merged_sampling")
    # shared_prompts runs each group's prompt once, then the completions on top, in the reference pass and, where
    # nothing drops out, in the policy pass
    shared = speedups.enabled("shared_prompts")
    shared_policy = shared and not (lora_rank and config.lora.dropout)
    distinct_prompt_rows = config.training.batch_size * round(prompt_tokens)

    def passes_for(share: bool, share_policy: bool, merge: bool) -> dict[str, list[tuple]]:
        """Each part's matmul passes: (times, rows, rows reaching the LM head, backward, with the adapters)."""
        def scoring(backward: bool, adapters: bool, shared_rows: bool) -> list[tuple]:
            if shared_rows:
                return [(1, distinct_prompt_rows, 0, backward, adapters),
                        (1, scored_rows, scored_rows, backward, adapters)]
            return [(1, train_rows, scored_rows, backward, adapters)]

        prefill = [(1, prompt_rows, sequences, False, not merge)]
        if share:  # each distinct prompt but its last token once, then that last token for every sequence
            prefill = [(1, distinct_prompt_rows - config.training.batch_size, 0, False, not merge),
                       (1, sequences, sequences, False, not merge)]
        return {
            "generation": prefill + [(completion, sequences, sequences, False, not merge)],
            # with LoRA, TRL's reference pass is the same model with its adapters switched off
            "reference_pass": scoring(False, False, share) if reference else [],
            "policy_forward": scoring(False, True, share_policy),
            "backward": scoring(True, True, share_policy),
        }

    passes = passes_for(shared, shared_policy, merged)

    def floor_of(part: str, measure=floors_of.seconds, adapters: bool = True, of=passes) -> float:
        return sum(times * measure(rows, head, backward=backward, adapters=adapters and with_adapters)
                   for times, rows, head, backward, with_adapters in of.get(part, []))

    # the floor of the passes TRL itself makes (every prompt copy read, the adapters applied per token)
    trl_floor = sum(floor_of(part, of=passes_for(False, False, False)) for part in PARTS)
    floors = {part: floor_of(part) for part in PARTS}
    floors["generation"] += floors_of.merge_seconds() if merged else 0.0
    # the floor without the adapters' matmuls, as this benchmark counted it before they were added
    base_floor = sum(floor_of(part, adapters=False) for part in PARTS)
    peak = floors_of.peak()
    step_flops = sum(floor_of(part, floors_of.flops) for part in PARTS) + (floors_of.merge_flops() if merged else 0)
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
          f"{completion:.1f} new tokens); matmul throughput by shape, weights from {floors_of.weights_mib:.0f} MiB "
          f"of memory: {min(floors_of.measured.values()):.1f} to {peak:.1f} GFLOP/s; peak-throughput floor of a "
          f"step: {peak_floor:.2f} s")
    print(table([[r[0], f"{r[1]:.4f}", f"{r[2]:.3f}", r[3]] for r in rows], ["part", "median s", "floor s", "x floor"]))
    path = write_result(f"breakdown-{args.dtype}{'-' + args.tag if args.tag else ''}", {
        "settings": vars(args), "speedups": active, "sequences": sequences, "prompt_tokens": prompt_tokens,
        "completion_tokens": completion,
        "matmul_weights_mib": floors_of.weights_mib,
        "matmul_gflops_by_shape": {f"{m}x{k}x{n}": g for (m, k, n), g in floors_of.measured.items()},
        "peak_gflops": peak, "peak_floor_step_s": peak_floor, "measured_median_s": measured, "other_s": other,
        "step_median_s": total, "floors_s": floors, "floor_step_s": floor_total, "step_over_floor": total / floor_total,
        "floor_without_adapters_s": base_floor, "trl_floor_step_s": trl_floor, "step_over_trl_floor": total / trl_floor,
        "per_step": steps})
    print(f"step / floor = {total / floor_total:.2f} (without the adapters' matmuls in the floor: "
          f"{base_floor:.2f} s, {total / base_floor:.2f}; against the floor of the passes TRL makes itself: "
          f"{trl_floor:.2f} s, {total / trl_floor:.2f})  ->  {path}")


if __name__ == "__main__":
    main()
