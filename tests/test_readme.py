"""The README is the newcomer's manual: every setting, command and reward kind it must explain is in it."""

import dataclasses
from pathlib import Path

import pytest

from dragon_ui.config import RunConfig
from dragon_ui.rewards import EXTRACT_MODES, REWARD_KINDS

README = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")


def setting_names() -> list[str]:
    names = []
    for section in dataclasses.fields(RunConfig):
        if section.name in ("rewards", "base_dir"):
            continue
        default = getattr(RunConfig(), section.name)
        if dataclasses.is_dataclass(default):
            names += [f"{section.name}.{f.name}" for f in dataclasses.fields(default)]
        else:
            names.append(section.name)
    return names


@pytest.mark.parametrize("name", setting_names())
def test_every_setting_is_documented(name):
    assert f"`{name}`" in README, name


@pytest.mark.parametrize("kind", REWARD_KINDS + EXTRACT_MODES)
def test_every_reward_kind_and_extraction_is_documented(kind):
    assert f"`{kind}`" in README


@pytest.mark.parametrize("command", ["make run", "make test", "train", "runs", "eval", "score", "stop", "merge", "export"])
def test_commands_are_documented(command):
    assert command in README


def test_the_two_commands_come_first():
    first_block = README.split("```")[1]
    assert "make run" in first_block and "make test" in first_block
