"""`make` refuses a Python too old for TRL and transformers with one sentence, before pip would fail obscurely."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")


def python_check(python: str) -> subprocess.CompletedProcess:
    return subprocess.run(["make", "-s", "python-check", f"PYTHON={python}"], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)


def test_a_python_older_than_311_gets_one_sentence_saying_what_to_install(tmp_path):
    old = tmp_path / "python3"
    old.write_text('#!/bin/sh\n[ "$1" = "--version" ] && { echo "Python 3.9.6"; exit 0; }\nexit 1\n')
    old.chmod(0o755)
    checked = python_check(str(old))
    assert checked.returncode != 0
    sentence = checked.stderr.splitlines()[0]
    assert sentence == (f"Dragon GRPO Studio needs Python 3.11 or newer, but {old} is Python 3.9.6: install Python "
                        "3.12 (python.org, brew install python@3.12, or uv python install 3.12) and run make again "
                        "with PYTHON=python3.12.")


def test_a_missing_python_is_named_as_missing():
    checked = python_check("/no/such/python3")
    assert checked.returncode != 0 and "/no/such/python3 is not installed: install Python 3.12" in checked.stderr


def test_this_python_passes():
    assert python_check(sys.executable).returncode == 0
