"""The benchmarks are not run by the test suite (they report, on an idle machine), but they must start, and the
floor they compare every step against must count the right matmuls."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"
SCRIPTS = sorted(path.name for path in BENCH.glob("*.py") if path.name != "common.py")


@pytest.mark.parametrize("script", SCRIPTS)
def test_every_benchmark_script_starts_and_explains_its_options(script):
    result = subprocess.run([sys.executable, script, "--help"], cwd=BENCH, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage:")


@pytest.fixture
def breakdown(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    import breakdown

    return breakdown


SHAPES = [("q_proj", 8, 8, 2), ("down_proj", 16, 8, 2), ("lm_head", 8, 100, 1)]


@pytest.mark.parametrize("rank, adapted, backward, adapters, expected", [
    # frozen base, forward: every linear once; the LM head only for its own rows (3)
    (4, "all-linear", False, False, [(10, 8, 8, 2), (10, 16, 8, 2), (3, 8, 100, 1)]),
    # LoRA forward: x·A then (x·A)·B for each adapted layer, never for the LM head
    (4, "all-linear", False, True, [(10, 8, 8, 2), (10, 8, 4, 2), (10, 4, 8, 2), (10, 16, 8, 2), (10, 16, 4, 2),
                                    (10, 4, 8, 2), (3, 8, 100, 1)]),
    (4, ["down_proj"], False, True, [(10, 8, 8, 2), (10, 16, 8, 2), (10, 16, 4, 2), (10, 4, 8, 2),
                                     (3, 8, 100, 1)]),
    # LoRA backward: the input gradient of each frozen weight, then through B and A and both adapter weights
    (4, ["q_proj"], True, True, [(10, 8, 8, 2), (10, 8, 4, 2), (10, 4, 8, 2), (4, 10, 8, 2), (8, 10, 4, 2),
                                 (10, 8, 16, 2), (3, 100, 8, 1)]),
    # full fine-tuning backward: input gradients and every weight's gradient
    (0, "all-linear", True, True, [(10, 8, 8, 2), (8, 10, 8, 2), (10, 8, 16, 2), (8, 10, 16, 2), (3, 100, 8, 1),
                                   (100, 3, 8, 1)]),
])
def test_the_floor_counts_each_matmul_a_pass_needs(breakdown, rank, adapted, backward, adapters, expected):
    floors = breakdown.Floors(SHAPES, "float32", lora_rank=rank, adapted=adapted)
    assert floors.matmuls(10, 3, backward=backward, adapters=adapters) == expected
    assert floors.flops(10, 3, backward=backward, adapters=adapters) == sum(2 * m * k * n * c for m, k, n, c in expected)


def test_a_pass_that_scores_no_token_has_no_lm_head_matmul(breakdown):
    """shared_prompts' prompt pass: every layer over the prompt rows, the LM head over none."""
    floors = breakdown.Floors(SHAPES, "float32")
    assert floors.matmuls(10, 0, backward=False, adapters=False) == [(10, 8, 8, 2), (10, 16, 8, 2)]


def test_linear_shapes_read_the_model_config(breakdown, tiny_model_dir):
    shapes = breakdown.linear_shapes(str(tiny_model_dir))
    assert [name for name, *_ in shapes] == ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                            "down_proj", "lm_head"]
    assert shapes[1][1:] == (16, 8, 2)  # 1 of 2 heads for keys and values: 16 -> 8, in each of the 2 layers


def test_the_floor_times_each_matmul_with_weights_from_a_model_sized_pool(breakdown, monkeypatch):
    import common

    floors = breakdown.Floors(SHAPES, "bfloat16", lora_rank=4)
    assert floors.weights_mib == (8 * 8 * 2 + 16 * 8 * 2 + 8 * 100) * 2 / 2**20  # the model's weights in bf16
    seen = []
    monkeypatch.setattr(breakdown, "matmul_gflops", lambda *args, **kwargs: seen.append(kwargs["weights_mib"]) or 1.0)
    floors.seconds(10, 3)
    assert seen and set(seen) == {floors.weights_mib}

    import torch

    used, original = [], torch.nn.functional.linear
    monkeypatch.setattr("torch.nn.functional.linear", lambda x, w: used.append(w.data_ptr()) or original(x, w))
    assert common.matmul_gflops(2, 8, 16, weights_mib=64 * 8 * 16 * 4 / 2**20, seconds=0.02) > 0
    assert len(set(used)) == 64  # one different weight per call until the pool's memory is used up
