"""Scaling out: config validation, machine checks, the exported launch folder, and real 2-process CPU runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from dragon_ui.config import RunConfig
from dragon_ui.errors import ConfigError
from dragon_ui.scaleout import distributed
from dragon_ui.scaleout.launch_folder import export_launch_folder
from dragon_ui.public import LAPTOP

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("section, values, field", [
    ("distributed", {"strategy": "horovod"}, "distributed.strategy"),
    ("generation", {"backend": "sglang"}, "generation.backend"),
    ("generation", {"backend": "vllm-server"}, "generation.vllm_server_url"),
    ("generation", {"backend": "vllm-server", "vllm_server_url": "localhost:8000"}, "generation.vllm_server_url"),
    ("generation", {"backend": "transformers", "vllm_server_url": "http://x:8000"}, "generation.vllm_server_url"),
    ("generation", {"backend": "vllm-colocate", "vllm_gpu_memory_utilization": 0.99}, "generation.vllm_gpu_memory_utilization"),
])
def test_scaleout_settings_are_validated(tiny_config_dict, section, values, field):
    tiny_config_dict[section] = values
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        RunConfig.from_dict(tiny_config_dict, policy=LAPTOP)


def test_valid_scaleout_settings_load(tiny_config_dict):
    tiny_config_dict["distributed"] = {"strategy": "zero3"}
    tiny_config_dict["generation"] = {"backend": "vllm-server", "vllm_server_url": "http://10.0.0.5:8000"}
    config = RunConfig.from_dict(tiny_config_dict, policy=LAPTOP)
    assert config.distributed.strategy == "zero3" and config.generation.backend == "vllm-server"


@pytest.mark.parametrize("backend", ["vllm-colocate", "vllm-server"])
def test_vllm_needs_cuda(tiny_config_dict, backend):
    tiny_config_dict["generation"] = {"backend": backend, "vllm_server_url": "http://h:8000" if backend == "vllm-server" else None}
    with pytest.raises(ConfigError, match="needs a CUDA GPU"):
        distributed.check_runnable_here(RunConfig.from_dict(tiny_config_dict, policy=LAPTOP), "cpu")


def test_vllm_needs_the_package(tiny_config_dict, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real(name, *a))
    tiny_config_dict["generation"] = {"backend": "vllm-colocate"}
    with pytest.raises(ConfigError, match="needs the vllm package"):
        distributed.check_runnable_here(RunConfig.from_dict(tiny_config_dict, policy=LAPTOP), "cuda")


@pytest.mark.parametrize("strategy, device, env, message", [
    ("zero3", "cpu", {}, "needs CUDA GPUs"),
    ("fsdp", "cpu", {}, "needs CUDA GPUs"),
    ("fsdp", "cuda", {}, "not launched with FSDP"),
])
def test_sharded_strategies_need_their_launch(tiny_config_dict, monkeypatch, strategy, device, env, message):
    monkeypatch.setenv("WORLD_SIZE", "2")
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    tiny_config_dict["distributed"] = {"strategy": strategy}
    with pytest.raises(ConfigError, match=message):
        distributed.check_runnable_here(RunConfig.from_dict(tiny_config_dict, policy=LAPTOP), device)


def test_a_single_process_ignores_the_strategy(tiny_config_dict):
    tiny_config_dict["distributed"] = {"strategy": "zero3"}
    distributed.check_runnable_here(RunConfig.from_dict(tiny_config_dict, policy=LAPTOP), "cpu")  # no error: nothing to shard


def test_export_writes_a_self_contained_folder(tiny_config_dict, tmp_path):
    reward_file = tmp_path / "my_reward.py"
    reward_file.write_text("def reward(prompt, completion, reference, row):\n    return 1.0\n")
    tiny_config_dict["rewards"].append({"kind": "custom", "name": "mine", "file": str(reward_file)})
    tool_file = tmp_path / "my_tool.py"
    tool_file.write_text('def tool(city: str) -> str:\n    """Say the weather.\n\n    Args:\n        city: Where.\n    """\n'
                         '    return "sunny"\n')
    game_file = tmp_path / "my_game.py"
    game_file.write_text('class Game:\n    def reset(self, **row):\n        pass\n\n    def play(self, move: str) -> str:\n'
                         '        """Play.\n\n        Args:\n            move: A move.\n        """\n        return move\n')
    tiny_config_dict["tools"] = [{"kind": "custom", "name": "weather", "file": str(tool_file)},
                                 {"kind": "environment", "name": "game", "class_name": "Game", "file": str(game_file)}]
    tiny_config_dict["distributed"] = {"strategy": "zero2"}
    tiny_config_dict["generation"] = {"backend": "vllm-server", "vllm_server_url": "http://placeholder:8000"}
    folder = export_launch_folder(RunConfig.from_dict(tiny_config_dict, policy=LAPTOP), tmp_path / "export", gpus=4, nodes=2, policy=LAPTOP)

    config = yaml.safe_load((folder / "config.yaml").read_text())
    assert config["data"]["source"] == "data/arithmetic.csv" and (folder / "data" / "arithmetic.csv").is_file()
    assert config["rewards"][-1]["file"] == "rewards/my_reward.py" and (folder / "rewards" / "my_reward.py").is_file()
    assert config["tools"][0]["file"] == "tools/my_tool.py" and (folder / "tools" / "my_tool.py").is_file()
    assert config["tools"][1]["file"] == "tools/my_game.py" and (folder / "tools" / "my_game.py").is_file()
    assert config["runs_dir"] == "runs" and config["hardware"]["device"] == "auto"
    accelerate = yaml.safe_load((folder / "accelerate.yaml").read_text())
    assert accelerate["distributed_type"] == "DEEPSPEED" and accelerate["deepspeed_config"]["zero_stage"] == 2
    assert accelerate["num_processes"] == 8 and accelerate["num_machines"] == 2
    slurm = (folder / "slurm.sbatch").read_text()
    assert "#SBATCH --nodes=3" in slurm and "vllm-serve" in slurm and "--gres=gpu:4" in slurm
    assert os.access(folder / "launch.sh", os.X_OK)
    assert (folder / "dragon_ui" / "engine" / "training.py").is_file() and not (folder / "dragon_ui" / "ui").exists()
    assert not (folder / "dragon_ui" / "studio").exists()  # the engine and the CLI only
    assert "zero2" in (folder / "README.md").read_text()
    # The exported config is valid where it lands (paths relative to its folder).
    RunConfig.from_file(folder / "config.yaml", policy=LAPTOP)


def test_export_refuses_to_overwrite(tiny_config_dict, tmp_path):
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "keep.txt").write_text("mine")
    with pytest.raises(ConfigError, match="not empty"):
        export_launch_folder(RunConfig.from_dict(tiny_config_dict, policy=LAPTOP), tmp_path / "busy", gpus=2, policy=LAPTOP)
    assert (tmp_path / "busy" / "keep.txt").read_text() == "mine"


def _env(runs_dir: Path) -> dict:
    return {**os.environ, "PYTHONPATH": str(REPO), "DRAGON_UI_RUNS_DIR": str(runs_dir), "HF_HUB_OFFLINE": "1",
            "PYTHON": sys.executable}


def _two_processes(args: list[str], runs_dir: Path) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
               "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", "0",
               "-m", "dragon_ui", "train", *args]
    return subprocess.run(command, cwd=REPO, env=_env(runs_dir), capture_output=True, text=True, timeout=400)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_two_processes_share_one_run_and_stop_and_resume(tiny_config_dict, runs_dir, tmp_path):
    marker = tmp_path / "stopped-once"
    stopper = (
        "import pathlib, glob\n"
        "calls = [0]\n"
        "def reward(prompt, completion, reference, row):\n"
        "    calls[0] += 1\n"
        f"    if calls[0] == 8 and not pathlib.Path({str(marker)!r}).exists():\n"
        f"        pathlib.Path({str(marker)!r}).write_text('x')\n"
        f"        for run in glob.glob({str(runs_dir)!r} + '/*/'):\n"
        "            pathlib.Path(run, 'stop.request').write_text('test')\n"
        "    return 1.0\n"
    )
    tiny_config_dict["rewards"].append({"kind": "custom", "name": "stopper", "code": stopper})
    tiny_config_dict["training"].update(max_steps=4, save_steps=10)
    config_file = tmp_path / "run.yaml"
    config_file.write_text(yaml.safe_dump(tiny_config_dict))

    first = _two_processes([str(config_file)], runs_dir)
    assert first.returncode == 0, first.stderr[-3000:]
    (run_dir,) = list(runs_dir.iterdir())  # exactly one run folder for both processes
    status = json.loads((run_dir / "status.json").read_text())
    assert status["state"] == "cancelled", status.get("error")
    assert status["world_size"] == 2
    stopped_at = status["step"]
    assert 1 <= stopped_at < 4
    assert (run_dir / "checkpoints" / f"checkpoint-{stopped_at}").is_dir()

    second = _two_processes(["--resume", str(run_dir)], runs_dir)
    assert second.returncode == 0, second.stderr[-3000:]
    assert list(runs_dir.iterdir()) == [run_dir]
    status = json.loads((run_dir / "status.json").read_text())
    assert status["state"] == "succeeded", status.get("error")
    rows = [json.loads(line) for line in (run_dir / "progress.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows] == [1, 2, 3, 4]
    # Global batch: 2 processes x 2 prompts x 2 completions; TRL's rewards are gathered over both processes.
    assert {row["world_size"] for row in rows} == {2} and {row["completions_per_step"] for row in rows} == {8}
    rollouts = [json.loads(line) for line in (run_dir / "rollouts.jsonl").read_text().splitlines()]
    assert all(len(r["groups"]) == 4 for r in rollouts)
    log = (run_dir / "log.txt").read_text()
    assert log.count("Run ") == log.count("Run " + run_dir.name)  # only the main process writes the log
    assert log.count("step 4/4") == 1


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_exported_launch_script_runs_two_cpu_processes(tiny_config_dict, tmp_path):
    folder = export_launch_folder(RunConfig.from_dict(tiny_config_dict, policy=LAPTOP), tmp_path / "export", gpus=2, policy=LAPTOP)
    done = subprocess.run([str(folder / "launch.sh"), "--cpu", "--set", "training.max_steps=2"], cwd=tmp_path,
                          env={**_env(tmp_path / "unused"), "GPUS": "2"}, capture_output=True, text=True, timeout=500)
    assert done.returncode == 0, done.stderr[-3000:]
    (run_dir,) = list((folder / "runs").iterdir())
    status = json.loads((run_dir / "status.json").read_text())
    assert status["state"] == "succeeded" and status["world_size"] == 2
    assert (run_dir / "adapter" / "adapter_config.json").is_file()
