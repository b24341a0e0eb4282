"""The command line: train, runs, eval, score, stop; bad input exits 2 with one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from dragon_ui.cli import main
from dragon_ui.runstore import RunDir

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def config_file(tiny_config_dict, tmp_path) -> Path:
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(tiny_config_dict), encoding="utf-8")
    return path


def test_train_runs_eval_in_process(config_file, runs_dir, capsys):
    assert main(["train", str(config_file), "--set", "training.max_steps=1", "--set", "name=cli-run"]) == 0
    out = capsys.readouterr().out
    assert "Run succeeded" in out and "Held-out reward" in out
    (run_dir,) = list(runs_dir.iterdir())
    assert run_dir.name.endswith("cli-run")
    assert json.loads((run_dir / "status.json").read_text())["total_steps"] == 1

    assert main(["runs"]) == 0
    table = capsys.readouterr().out
    assert run_dir.name in table and "succeeded" in table and "1/1" in table

    assert main(["eval", str(run_dir)]) == 0
    stored = capsys.readouterr().out
    assert "numeric" in stored and "length" in stored and "before" in stored
    assert "Held-out reward during training" in stored and "step 0: " in stored and "step 1: " in stored

    before = json.loads((run_dir / "eval.json").read_text())
    tampered = json.loads(json.dumps(before))
    tampered["before"]["reward_mean"] = tampered["after"]["reward_mean"] = -1.0
    (run_dir / "eval.json").write_text(json.dumps(tampered))
    assert main(["eval", str(run_dir), "--recompute"]) == 0
    assert "Done: the trained model" in capsys.readouterr().out  # the Compare tab's evaluation, with its progress
    # Greedy decoding in the same batches: recomputing both sides from the saved adapter gives training's numbers.
    after = json.loads((run_dir / "eval.json").read_text())
    assert after["after"]["reward_mean"] == pytest.approx(before["after"]["reward_mean"])
    assert after["before"]["reward_mean"] == pytest.approx(before["before"]["reward_mean"])

    assert main(["stop", str(run_dir)]) == 0
    assert "not running" in capsys.readouterr().out

    RunDir(run_dir).update_status(state="cancelled")  # as a stop leaves it: shown as it reads, stored as it was
    for argv in (["runs"], ["stop", str(run_dir)]):
        assert main(argv) == 0
        out = capsys.readouterr().out
        assert "stopped — can resume" in out and "cancelled" not in out


@pytest.mark.parametrize("text", [
    "- kind: numeric\n- kind: length\n  max_chars: 12\n  weight: 0.3\n",  # a list of rewards
    '{"rewards": [{"kind": "numeric"}, {"kind": "length", "max_chars": 12, "weight": 0.3}]}',  # the same, under rewards:
    "data: {source: arithmetic, prompt: question, reference: answer}\nrewards:\n- kind: numeric\n- kind: length\n  max_chars: 12\n  weight: 0.3\n",  # a run
])
def test_score_prints_per_reward_json(tmp_path, capsys, text):
    rewards = tmp_path / "rewards.yaml"
    rewards.write_text(text, encoding="utf-8")
    assert main(["score", "--rewards", str(rewards), "--completion", "The answer is 1,234.", "--reference", "1234"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["scores"]["numeric"] == 1.0
    assert result["scores"]["length"] == pytest.approx(1 - (20 - 12) / 12)
    assert result["total"] == pytest.approx(1.0 + 0.3 * result["scores"]["length"])


@pytest.mark.parametrize("argv, message", [
    (["train", "missing.yaml"], "No configuration file at missing.yaml; give a YAML/JSON file or a bundled recipe: arithmetic"),
    (["train"], "Give a configuration file"),
    (["score", "--rewards", "missing.yaml", "--completion", "x"], "No --rewards file at missing.yaml"),
    (["eval", "/nonexistent/run"], "not a run folder"),
])
def test_bad_input_exits_2_with_one_line(argv, message, capsys, runs_dir):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and message in err and "\n" not in err


def test_bad_setting_is_refused_before_training(config_file, capsys, runs_dir):
    assert main(["train", str(config_file), "--set", "grpo.group_size=1"]) == 2
    assert "grpo.group_size" in capsys.readouterr().err
    assert main(["train", str(config_file), "--set", "grpo.nonsense=1"]) == 2
    assert "nonsense" in capsys.readouterr().err


def test_module_entry_point_trains_and_lists(config_file, runs_dir):
    env = {**os.environ, "DRAGON_UI_RUNS_DIR": str(runs_dir), "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-m", "dragon_ui", "train", str(config_file), "--set", "training.max_steps=1"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "Run folder:" in done.stdout and "step 1/1" in done.stderr
    for noise in ("Warning", "deprecated", "bitsandbytes", "gemm_4bit"):  # the terminal shows Dragon's own lines
        assert noise not in done.stderr, done.stderr[-2000:]
    listing = subprocess.run([sys.executable, "-m", "dragon_ui", "runs"], cwd=REPO, env=env, capture_output=True,
                             text=True, timeout=120)
    assert "succeeded" in listing.stdout


def test_speedups_lists_each_with_why_and_verify_runs_the_self_checks(tmp_path):
    from dragon_ui import speedups

    env = {**os.environ, "DRAGON_UI_CACHE": str(tmp_path / "cache"), "PYTHONPATH": str(REPO)}
    env.pop(speedups.ENV, None)

    def dragon(*args):
        done = subprocess.run([sys.executable, "-m", "dragon_ui", "speedups", *args], cwd=REPO, env=env,
                              capture_output=True, text=True, timeout=240)
        assert done.returncode == 0, done.stderr[-2000:]
        return done

    before = dragon("--json")
    table = json.loads(before.stdout)
    assert [row["name"] for row in table["speedups"]] == list(speedups.ALL)
    assert table["versions"]["torch"] and all(row["on"] for row in table["speedups"])
    assert all("self-check has not run here yet" in row["why"] for row in table["speedups"])
    verified = dragon("--verify")
    lines = verified.stdout.splitlines()
    assert lines[0].startswith("Speed-ups with torch ") and lines[-1] == "11 of 11 on."
    for name in speedups.ALL:
        row = next(line for line in lines if line.strip().startswith(name + " "))
        assert " on   " in row and "its self-check passed on this machine" in row, row
    assert "Warning" not in verified.stderr, verified.stderr[-2000:]


def test_settings_lists_each_setting_with_its_default_and_help(capsys):
    assert main(["settings", "grpo.ep"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("grpo.epsilon (default 0.2)\n    PPO's clip: how far one update may move")
    assert "grpo.epsilon_high (empty)\n    DAPO's clip-higher" in out  # the link's text, not its address
    assert "grpo.beta" not in out and "https://" not in out


def test_settings_names_the_sections_when_nothing_matches(capsys):
    assert main(["settings", "gpro"]) == 2
    assert "No setting starts with 'gpro'; the configuration's settings and sections are: model, data, rewards, tools, grpo" \
        in capsys.readouterr().err
