"""The one-step dry run (engine/dry_run.py): one real step of a run's settings on its longest prompts, in a process
of its own, measured; nothing left behind; the device's own figure for the peak."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
import torch
import yaml

from dragon_ui.config import RunConfig
from dragon_ui.engine import dry_run
from dragon_ui.errors import DragonError
from dragon_ui.public import LAPTOP

GB = 1024**3


def test_dragon_check_dry_run_trains_one_step_of_the_longest_prompts_and_leaves_nothing_behind(
        tiny_config_dict, tmp_path, runs_dir):
    config_path = tmp_path / "tiny.yaml"
    config_path.write_text(yaml.safe_dump(tiny_config_dict), encoding="utf-8")
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    checked = subprocess.run([sys.executable, "-m", "dragon_ui", "check", str(config_path), "--dry-run"],
                             capture_output=True, text=True, cwd=tmp_path, timeout=600,
                             env={**os.environ, "TMPDIR": str(scratch)})
    assert checked.returncode == 0, checked.stderr[-2000:]
    said = checked.stdout.splitlines()[-1]
    longest = max(len(row) for row in _questions(tiny_config_dict))
    measured = re.fullmatch(rf"Dry run: one step of 2 prompts \(the longest, up to {longest} characters; replies of "
                            r"(?P<tokens>\d+) tokens on average\) took (?P<step>.+) on the cpu; peak memory (?P<peak>[\d.]+) GB \(the process's peak resident "
                            r"memory\)\.", said)
    assert measured, said
    assert 0.2 < float(measured["peak"]) < 8 and measured["step"].endswith(" s")
    assert 1 <= int(measured["tokens"]) <= tiny_config_dict["grpo"]["max_new_tokens"]
    assert not runs_dir.exists() and list(scratch.iterdir()) == []  # no run folder, no temporary one left
    assert sorted(path.name for path in tmp_path.iterdir()) == ["arithmetic.csv", "scratch", "tiny.yaml"]


def _questions(config: dict) -> list[str]:
    lines = open(config["data"]["source"], encoding="utf-8").read().splitlines()[1:]
    return [line.split(",")[0] for line in lines]


def test_a_dry_run_that_cannot_train_says_why(tiny_config_dict):
    config = RunConfig.from_dict(tiny_config_dict, policy=LAPTOP)
    config.data.source = config.data.source + ".gone"
    with pytest.raises(DragonError, match=r"^The dry run's step failed: .*arithmetic\.csv\.gone"):
        dry_run.dry_run(config, policy=LAPTOP)


@pytest.mark.parametrize("lengths, wanted, kept", [
    ([5, 50, 20, 40], 2, [50, 40]),  # the longest, in the data's order
    ([5, 50, 20, 40], 9, [5, 50, 20, 40]),  # fewer rows than a step takes: all of them
    ([30, 30, 10], 1, [30]),
    ([7], 0, [7]),  # at least one
])
def test_the_step_takes_the_longest_prompts(lengths, wanted, kept):
    rows = [{"prompt": [{"role": "system", "content": "s"}, {"role": "user", "content": "x" * n}]} for n in lengths]
    assert [len(dry_run._prompt_text(row)) - 1 for row in dry_run._longest(rows, wanted)] == kept


def test_the_peak_on_a_gpu_is_the_allocators_peak_plus_the_context(monkeypatch):
    """The CUDA path, on a CPU machine: torch.cuda answers as a GPU that ran the step would."""
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda: 3 * GB)
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda: 1 * GB)  # after the step freed its cache
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda: (78 * GB, 80 * GB))  # 2 GB in use: 1 GB context
    assert dry_run.peak_memory("cuda") == (4.0, "torch.cuda.max_memory_allocated plus the CUDA context")


def test_the_answer_line_survives_the_libraries_own_output(monkeypatch, tiny_config_dict):
    """The libraries print to standard output too; the answer is the line that says it is one."""
    measured = dry_run.DryRun(step_s=1.5, peak_gb=2.0, device="cpu", peak_is="p", prompts=2, longest_prompt_chars=9,
                              completion_tokens=5.5)
    output = "Loading weights 100%\n" + dry_run.ANSWER + json.dumps(measured.__dict__) + "\n{'loss': 0.1}\n"
    monkeypatch.setattr(subprocess, "run", lambda *args, **kwargs: subprocess.CompletedProcess(args, 0, output, ""))
    config = RunConfig.from_dict(tiny_config_dict, policy=LAPTOP)
    assert dry_run.dry_run(config, policy=LAPTOP) == measured
