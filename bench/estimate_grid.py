"""One measured training step over a grid of settings, beside what the estimate says for it: the table that
``dragon_ui/engine/estimate.py``'s memory and CPU time constants were fitted to.

The grid: two preset shapes (SmolLM2-135M and Qwen2.5-0.5B, whose vocabulary is three times larger), gradient
checkpointing off and on, 16, 64 and 256 new tokens, groups of 4 and 8 (2 prompts a step), LoRA, in bf16; six rows
in float32 and two with full fine-tuning. Each row is a dry run (``dragon check --dry-run``: one real step in a
process of its own, whose peak resident memory the kernel reports) of the arithmetic recipe with those settings.
The CPU probe the app measures when it starts (``estimate.cpu_flops_per_thread``) is measured in the same sitting
and kept with the table, so the estimate of each row can be worked out again later without the machine.

The models carry random weights in the presets' shapes (this machine cannot download them; memory and time depend
on the shape alone), and random weights almost never say the end-of-sequence token, so every reply uses all its new
tokens: the case an estimate describes.

    python bench/estimate_grid.py                 # measure the grid (~40 min on 2 vCPU), then report
    python bench/estimate_grid.py --report        # the estimate against the stored measurements; nothing measured
    python bench/estimate_grid.py --report --fit  # and the least-squares fit of the estimate's constants

It reports; it does not assert. tests/test_estimate.py checks the estimate against the stored table.
"""

from __future__ import annotations

import argparse
import itertools
import json
import tempfile
from dataclasses import replace
from pathlib import Path

from common import RECIPE, RESULTS, off_by, write_result

from dragon_ui.config import RunConfig
from dragon_ui.engine import estimate
from dragon_ui.engine.hardware import detect_hardware, resolve_hardware
from dragon_ui.engine.presets import find_preset
from dragon_ui.public import LAPTOP

SHAPES = {  # preset -> the transformers configuration of its family
    "HuggingFaceTB/SmolLM2-135M-Instruct": "LlamaConfig",
    "Qwen/Qwen2.5-0.5B-Instruct": "Qwen2Config",
}
BATCH_SIZE = 2
RESULT = "estimate_grid"


def grid() -> list[dict]:
    rows = [dict(model=model, dtype="bfloat16", gradient_checkpointing=checkpointing, max_new_tokens=tokens,
                 group_size=group, lora=True)
            for model, checkpointing, tokens, group in itertools.product(SHAPES, (False, True), (16, 64, 256), (4, 8))]
    small = next(iter(SHAPES))
    rows += [dict(model=small, dtype="float32", gradient_checkpointing=checkpointing, max_new_tokens=tokens,
                  group_size=8, lora=True) for checkpointing, tokens in itertools.product((False, True), (16, 64, 256))]
    rows += [dict(model=small, dtype="bfloat16", gradient_checkpointing=False, max_new_tokens=64, group_size=group,
                  lora=False) for group in (4, 8)]
    return rows


def random_model(preset_id: str, folder: Path) -> Path:
    """A model folder with the preset's shape, random weights, and the offline SmolLM2's tokenizer."""
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from dragon_ui.engine.models import offline_default_dir

    target = folder / preset_id.replace("/", "--")
    if target.is_dir():
        return target
    dims = find_preset(preset_id).dims
    config = getattr(transformers, SHAPES[preset_id])(
        hidden_size=dims.hidden_size, num_hidden_layers=dims.num_layers, intermediate_size=dims.intermediate_size,
        vocab_size=dims.vocab_size, num_attention_heads=dims.num_heads, num_key_value_heads=dims.num_kv_heads,
        tie_word_embeddings=dims.tied_embeddings, max_position_embeddings=8192)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).save_pretrained(target)
    AutoTokenizer.from_pretrained(offline_default_dir()).save_pretrained(target)
    return target


def config_of(row: dict, model_id: str) -> RunConfig:
    data = RunConfig.from_file(RECIPE, policy=LAPTOP).to_dict()
    data["model"]["id"] = model_id
    data["grpo"].update(group_size=row["group_size"], max_new_tokens=row["max_new_tokens"])
    data["training"].update(batch_size=BATCH_SIZE, grad_accum=1, gradient_checkpointing=row["gradient_checkpointing"])
    data["lora"]["enabled"] = row["lora"]
    data["hardware"].update(device="cpu", dtype=row["dtype"])
    return RunConfig.from_dict(data, base_dir=str(RECIPE.parent), policy=LAPTOP)


def measure(rows: list[dict], folder: Path) -> list[dict]:
    from dragon_ui.engine import training
    from dragon_ui.engine.dry_run import dry_run

    measured = []
    for row in rows:
        config = config_of(row, str(random_model(row["model"], folder)))
        found = training.inspect(config, policy=LAPTOP)
        dry = dry_run(config, policy=LAPTOP)
        measured.append({**row, "prompt_tokens": found.prompts.longest, "completion_tokens": dry.completion_tokens,
                         "peak_gb": dry.peak_gb, "step_s": dry.step_s})
        print(f"{row} -> {dry.peak_gb:.2f} GB, {dry.step_s:.1f} s", flush=True)
    return measured


def probe() -> dict:
    """The app's start-up measure of this CPU, with the threads a run uses here."""
    return {"threads": resolve_hardware(RunConfig().hardware, detect_hardware()).cpu_threads,
            "flops_per_thread": {dtype: estimate.cpu_flops_per_thread(dtype) for dtype in ("float32", "bfloat16")}}


def estimated(row: dict, machine: dict) -> estimate.Estimate:
    """The estimate of ``row``'s settings on the CPU the stored probe describes (the preset's shape: the model is
    not needed)."""
    config = config_of(row, row["model"])
    hardware = replace(resolve_hardware(config.hardware, detect_hardware()), cpu_threads=machine["threads"])
    return estimate.estimate_run(config, hardware, detect_hardware(), probe=machine["flops_per_thread"].__getitem__,
                                 prompt_tokens=row["prompt_tokens"])


def report(measured: list[dict], machine: dict) -> None:
    """The table docs/performance.md shows (Markdown): each row's measured step and peak beside the estimate's."""
    print("| model | precision | checkpointing | training | new tokens | group | step: measured, estimate | "
          "peak: measured, estimate |\n|---|---|---|---|---|---|---|---|")
    for row in measured:
        guess = estimated(row, machine)
        step, peak = guess.step.total_s, guess.memory.total_gb
        print(f"| {row['model'].split('/')[-1].removesuffix('-Instruct')} | {row['dtype']} | "
              f"{'on' if row['gradient_checkpointing'] else 'off'} | {'LoRA' if row['lora'] else 'full'} | "
              f"{row['max_new_tokens']} | {row['group_size']} | {row['step_s']:.1f} s, {step:.1f} s "
              f"({off_by(step, row['step_s'])}) | {row['peak_gb']:.2f} GB, {peak:.2f} GB ({off_by(peak, row['peak_gb'])}) |")


def fit(measured: list[dict], machine: dict) -> None:
    """Least squares, relative to each measurement, of the estimate's fitted constants. Memory: the runtime (a
    constant), the weights' factor and each training term's (estimate.training_terms), the attention matrices
    counted as held. Time on the CPU: a decoding layer's fixed cost (in FLOPs at one thread's fp32 probe speed), and
    the share of the probe's speed that generation and training reach (estimate.step_work; reading the weights is
    left out: the CPU's compute is the larger)."""
    import numpy as np

    fitted = [name for name in estimate.ACTIVATION_FACTORS if name != "attention"]
    memory_columns, memory_targets, time_columns, time_targets = [], [], [], []
    for row in measured:
        config = config_of(row, row["model"])
        dims, dtype, prompt_tokens = find_preset(row["model"]).dims, row["dtype"], row["prompt_tokens"]
        counted = estimate.estimate_memory(config, dims, dtype, False, "cpu", prompt_tokens)
        terms = {name: held / estimate.GB
                 for name, held in estimate.training_terms(config, dims, dtype, False, "cpu", prompt_tokens).items()}
        peak = row["peak_gb"]
        memory_columns.append([1 / peak, counted.weights_gb / peak, *(terms[name] / peak for name in fitted)])
        memory_targets.append((peak - counted.trainable_gb - terms["attention"]) / peak)
        work, flops = estimate.step_work(config, dims, dtype, False, prompt_tokens), machine["flops_per_thread"]
        threads, step = machine["threads"], row["step_s"]
        time_columns.append([work.decode_layers / flops["float32"] / step,
                             work.generation_flop / (flops[dtype] * threads) / step,
                             (work.training_flop + work.reference_flop) / (flops[dtype] * threads) / step])
        time_targets.append(1.0)
    memory, *_ = np.linalg.lstsq(np.array(memory_columns), np.array(memory_targets), rcond=None)
    time, *_ = np.linalg.lstsq(np.array(time_columns), np.array(time_targets), rcond=None)
    print("RUNTIME_GB['cpu'] =", f"{memory[0]:.2f}", " WEIGHTS_FACTOR['cpu'] =", f"{memory[1]:.2f}",
          " ACTIVATION_FACTORS:", {name: round(float(value), 2) for name, value in zip(fitted, memory[2:])})
    print(f"CPU_LAYER_LATENCY_FLOP = {time[0]:.3g}  CPU_GENERATION_EFFICIENCY = {1 / time[1]:.2f}  "
          f"CPU_TRAIN_EFFICIENCY = {1 / time[2]:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--report", action="store_true", help="report on the stored measurements; measure nothing")
    parser.add_argument("--fit", action="store_true", help="also print the least-squares fit of the model's terms")
    args = parser.parse_args()
    if args.report:
        stored = json.loads((RESULTS / f"{RESULT}.json").read_text())
        measured, machine = stored["results"], stored["probe"]
    else:
        machine = probe()
        with tempfile.TemporaryDirectory(prefix="dragon-bench-grid-") as folder:
            measured = measure(grid(), Path(folder))
        print(f"wrote {write_result(RESULT, {'probe': machine, 'batch_size': BATCH_SIZE, 'results': measured})}")
    report(measured, machine)
    if args.fit:
        fit(measured, machine)


if __name__ == "__main__":
    main()
