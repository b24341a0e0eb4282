"""Run a function in a separate process, with limits on its memory, its time and the size of what it hands back: a
public demo reads what a visitor sends (an uploaded file, a Hub dataset) this way.

A few kilobytes can unpack into gigabytes (a Parquet or spreadsheet cell repeated, one row of a Hub dataset), and a
crafted file can keep a parser busy for minutes. Read apart, such a file ends its own process, never the server's,
and the app receives at most the rows its limits allow. One read runs at a time: the cores are the training's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .errors import ConfigError

MEMORY_MB = 2048  # the reading process's address space: Python, the reading library, and the rows
SECONDS = 60  # one read, from the process's start to its answer
PACKAGE_PARENT = str(Path(__file__).resolve().parents[1])  # holds dragon_ui: a child imports this copy of it
WAIT_SECONDS = 120  # how long a read waits for the one before it
SECRETS = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_TOKEN_PATH", "DRAGON_UI_OWNER_KEY")  # never in a child's environment

_turn = threading.Semaphore(1)


def runs_apart(function: Callable[..., Any]) -> Callable[..., Any]:
    """Mark a top-level function of dragon_ui's as one run_apart may run: the process runs no other."""
    function.runs_apart = True
    return function


def run_apart(function: Callable[..., Any], arguments: dict, limit_bytes: int, what: str) -> Any:
    """``function(**arguments)`` (marked @runs_apart, at its module's top level, whose answer is JSON) in a
    separate process; a ConfigError naming ``what`` (the file's or dataset's name) when it fails, runs out of memory
    or time, or hands back more than ``limit_bytes``."""
    if not _turn.acquire(timeout=WAIT_SECONDS):
        raise ConfigError("data.source: the demo is busy reading other visitors' data; try again in a minute.")
    try:
        with tempfile.TemporaryDirectory(prefix="dragon-read-") as empty:
            target = f"{function.__module__}:{function.__qualname__}"
            done = _child(target, arguments, limit_bytes, what, empty)
    finally:
        _turn.release()
    if done is None:
        raise ConfigError(f"data.source: {what} took longer than {SECONDS} s to read; use a smaller file or fewer "
                          "rows.")
    if done.returncode != 0 or not done.stdout:
        raise ConfigError(f"data.source: {what} takes more than this public demo's memory for one dataset once it is "
                          "unpacked (long texts repeated in many cells, or very large rows); use fewer rows or "
                          "shorter cells.")
    answer = json.loads(done.stdout)
    if "error" in answer:
        raise ConfigError(answer["error"])
    return answer["value"]


def child_environment() -> dict[str, str]:
    """The environment of a process that handles what visitors send (a file to read, an answer to check): the app's,
    without the server's Hub tokens or the demo's owner key, and finding this copy of dragon_ui."""
    environment = {key: value for key, value in os.environ.items() if key not in SECRETS}
    environment["PYTHONPATH"] = os.pathsep.join(filter(None, [PACKAGE_PARENT, os.environ.get("PYTHONPATH")]))
    return environment


def _child(target: str, arguments: dict, limit_bytes: int, what: str,
           folder: str) -> subprocess.CompletedProcess | None:
    """The process, started in an empty folder (so nothing relative to the app's own folder is found there) without
    the server's Hub tokens; None when it ran out of time."""
    request = json.dumps({"target": target, "arguments": arguments, "limit_bytes": limit_bytes, "what": what,
                          "memory": MEMORY_MB * 2**20})
    try:
        return subprocess.run([sys.executable, "-c", "from dragon_ui.apart import main; main()"], input=request,
                              capture_output=True, text=True, timeout=SECONDS, env=child_environment(), cwd=folder)
    except subprocess.TimeoutExpired:
        return None


def main() -> None:
    """The process: its request on standard input, its answer (JSON) on standard output."""
    import importlib
    import resource

    request = json.loads(sys.stdin.read())
    resource.setrlimit(resource.RLIMIT_AS, (request["memory"], request["memory"]))
    module, _, name = request["target"].partition(":")
    function = getattr(importlib.import_module(module), name, None) if module.startswith("dragon_ui.") else None
    if not getattr(function, "runs_apart", False):
        raise SystemExit(f"apart runs the functions marked @runs_apart only, not {request['target']!r}")
    try:
        value = function(**request["arguments"])
        answer = json.dumps({"value": value}, ensure_ascii=False, default=str)
        if len(answer) > request["limit_bytes"]:
            raise ConfigError(f"data.source: {request['what']} unpacks to more than this public demo's limit of "
                              f"{request['limit_bytes'] / 2**20:g} MB of data; use fewer rows or columns.")
    except ConfigError as exc:
        answer = json.dumps({"error": str(exc)})
    sys.stdout.write(answer)
