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
from conftest import turn_public_mode_on

from dragon_ui.config import RunConfig
from dragon_ui.engine import dry_run, public_checks
from dragon_ui.errors import BusyError, DragonError
from dragon_ui.public import LAPTOP, Allowance, Limits, Policy, Visitor

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
                            r"(?P<tokens>\d+) tokens on average\) took (?P<step>.+) on the cpu, after a first step "
                            r"to warm up; peak memory (?P<peak>[\d.]+) GB \(the process's peak resident memory\)\.",
                            said)
    assert measured, said
    assert 0.2 < float(measured["peak"]) < 8 and measured["step"].endswith(" s")
    assert 1 <= int(measured["tokens"]) <= tiny_config_dict["grpo"]["max_new_tokens"]
    assert not runs_dir.exists() and list(scratch.iterdir()) == []  # no run folder, no temporary one left
    assert sorted(path.name for path in tmp_path.iterdir()) == ["arithmetic.csv", "scratch", "tiny.yaml"]


def _questions(config: dict) -> list[str]:
    lines = open(config["data"]["source"], encoding="utf-8").read().splitlines()[1:]
    return [line.split(",")[0] for line in lines]


def test_a_dry_run_that_cannot_train_says_why(tiny_config_dict, monkeypatch):
    """Data that cannot be read is said in the run's own sentence, before any process starts; a step that fails in
    its process says so, with that process's sentence."""
    config = RunConfig.from_dict(tiny_config_dict, policy=LAPTOP)
    config.data.source = config.data.source + ".gone"
    with pytest.raises(DragonError, match=r"^data.source: no file at .*arithmetic\.csv\.gone"):
        dry_run.dry_run(config, policy=LAPTOP)
    failed = dry_run.ANSWER + json.dumps({"error": "the step ran out of memory"}) + "\n"
    monkeypatch.setattr(dry_run, "_run_measuring", lambda *args: (failed, "", 0))
    with pytest.raises(DragonError, match=r"^The dry run's step failed: the step ran out of memory$"):
        dry_run.dry_run(RunConfig.from_dict(tiny_config_dict, policy=LAPTOP), policy=LAPTOP)


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
    answer = {"step_s": 1.5, "peak_gb": 2.0, "device": "cpu", "peak_is": "p", "completion_tokens": 5.5}
    output = "Loading weights 100%\n" + dry_run.ANSWER + json.dumps(answer) + "\n{'loss': 0.1}\n"
    monkeypatch.setattr(dry_run, "_run_measuring", lambda *args: (output, "", 0))
    config = RunConfig.from_dict(tiny_config_dict, policy=LAPTOP)
    longest = max(len(row) for row in _questions(tiny_config_dict))
    assert dry_run.dry_run(config, policy=LAPTOP) == dry_run.DryRun(**answer, prompts=2,
                                                                     longest_prompt_chars=longest)


def test_the_model_tab_measures_one_step_and_forgets_it_when_the_settings_change(studio, tiny_config_dict):
    from dragon_ui.ui import model_tab

    said = model_tab.measure_step(studio, tiny_config_dict)
    assert re.fullmatch(r"✅ Dry run: one step of 2 prompts .* took .+ on the cpu, after a first step to warm up; "
                        r"peak memory [\d.]+ GB \(.+\)\.",
                        said), said
    assert model_tab.preview_after_edit(studio, tiny_config_dict)[-1] == model_tab.MEASURE_HELP


def test_no_step_is_measured_beside_a_training_or_with_settings_that_are_not_valid(studio, tiny_config_dict,
                                                                                   monkeypatch):
    from dragon_ui.engine import queue
    from dragon_ui.ui import model_tab

    monkeypatch.setattr(dry_run, "_run_measuring", lambda *args: pytest.fail("a step was measured"))
    tiny_config_dict["grpo"]["group_size"] = 1
    assert model_tab.measure_step(studio, tiny_config_dict).startswith("❌ ")
    tiny_config_dict["grpo"]["group_size"] = 2
    monkeypatch.setattr(queue, "training_run_ids", lambda runs_dir: ["someone-else"])
    assert model_tab.measure_step(studio, tiny_config_dict) == (
        "❌ A training is running on this machine; a step measured beside it would take longer than it will, and "
        "slow the training down. Wait for it to finish or stop it first.")


@pytest.mark.parametrize("per_hour, visitor, allowed", [
    (0, Visitor(key="v", address="a"), [False]),  # the default: a demo measures no steps for its visitors
    (0, Visitor(key="v", address="a", unlocked=True), [True, True]),  # its owner measures as on a laptop
    (2, Visitor(key="v", address="a"), [True, True, False]),  # an owner's allowance per address an hour
    (2, Visitor(key="v"), [False]),  # a visitor it cannot count
])
def test_a_public_demo_measures_steps_only_where_its_owner_allows(monkeypatch, per_hour, visitor, allowed):
    monkeypatch.setattr(public_checks, "_dry_runs", Allowance(window_s=3600))
    policy = Policy(limits=Limits(dry_runs_per_hour=per_hour)).asked_by(visitor)
    for expected in allowed:
        if expected:
            public_checks.take_dry_run(policy=policy)
            continue
        with pytest.raises(DragonError, match="(measures no steps for its visitors|2 dry runs were asked for from "
                                              "your network address in the last hour|measures steps only for "
                                              "visitors it can count)"):
            public_checks.take_dry_run(policy=policy)
    assert policy.measures_steps == (per_hour > 0 or visitor.unlocked)  # what the Model tab offers
    public_checks.take_dry_run(policy=LAPTOP)  # a laptop's are never counted


@pytest.fixture
def public_demo_measuring_steps(monkeypatch, tiny_model_dir, runs_dir):
    """A public demo whose owner allows two dry runs an hour for each network address."""
    turn_public_mode_on(monkeypatch, tiny_model_dir)
    monkeypatch.setenv("DRAGON_UI_MAX_DRY_RUNS_PER_HOUR", "2")
    monkeypatch.setattr(public_checks, "_dry_runs", Allowance(window_s=3600))


def test_a_visitor_measures_a_step_of_their_own_upload_where_the_owner_allows(public_demo_measuring_steps, studio,
                                                                               tiny_config_dict, tmp_path):
    """The step trains on the visitor's own upload, which only they may read: the data is read in the app, as the
    visitor, and the process that trains the step reads nothing of anyone's."""
    from conftest import uploaded_by, write_arithmetic_csv

    from dragon_ui import public

    alice = public.Visitor(key="alice", address="10.0.0.1")
    tiny_config_dict["data"]["source"] = uploaded_by("alice", write_arithmetic_csv(tmp_path / "mine.csv"))
    del tiny_config_dict["runs_dir"]  # a public demo keeps its own
    with public.visiting(alice):
        measured = studio.measure_step(tiny_config_dict)
    assert measured.prompts == 2 and measured.peak_gb > 0.2
    with public.visiting(public.Visitor(key="bob", address="10.0.0.2")), \
            pytest.raises(DragonError, match="must be one of the bundled datasets, a file you upload here"):
        studio.measure_step(tiny_config_dict)  # another visitor's upload stays theirs


@pytest.mark.parametrize("iterations, steps", [(1, 2), (2, 4), (3, 6)])
def test_the_timed_steps_come_after_as_many_that_warm_up_and_include_a_sampling_one(tiny_config_dict, iterations,
                                                                                     steps):
    """With num_iterations μ a batch is sampled once every μ steps: the dry run trains 2μ and times the last μ."""
    tiny_config_dict["grpo"]["num_iterations"] = iterations
    config = RunConfig.from_dict(tiny_config_dict, policy=LAPTOP)
    assert dry_run.one_step_of(config, policy=LAPTOP).training.max_steps == steps


def test_a_dry_run_stops_at_once_when_asked_and_leaves_no_process_or_folder(tiny_config_dict, monkeypatch, tmp_path):
    """The page went away, or a training started: the measuring process and all it started end, and its
    temporary folder goes."""
    import tempfile
    import time

    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    started = []
    real_popen = subprocess.Popen
    monkeypatch.setattr(dry_run.subprocess, "Popen",
                        lambda *args, **kwargs: started.append(real_popen(*args, **kwargs)) or started[-1])
    asked = time.monotonic()
    with pytest.raises(BusyError, match="^The page went away"):
        dry_run.dry_run(RunConfig.from_dict(tiny_config_dict, policy=LAPTOP), policy=LAPTOP,
                        interrupted=lambda: "The page went away." if time.monotonic() > asked + 3 else None)
    (process,) = started
    assert process.poll() is not None
    with pytest.raises(ProcessLookupError):
        os.killpg(process.pid, 0)  # its group is gone: nothing it started goes on
    assert list(scratch.iterdir()) == []


def test_a_public_demo_offers_measure_one_step_only_where_its_owner_allows(monkeypatch, runs_dir, tiny_model_dir):
    from dragon_ui import public
    from dragon_ui.studio.backend import Studio
    from dragon_ui.ui import build_app

    monkeypatch.setenv(public.PUBLIC_ENV, "1")
    for per_hour, offered in ((None, False), ("3", True)):
        if per_hour:
            monkeypatch.setenv("DRAGON_UI_MAX_DRY_RUNS_PER_HOUR", per_hour)
        studio = Studio(runs_dir, policy=public.Policy.from_env(runs_dir))
        try:
            app = build_app(studio)
            (button,) = [block for block in app.blocks.values() if getattr(block, "elem_id", None) == "model-measure"]
            assert button.parent.visible is offered
        finally:
            studio.close()
