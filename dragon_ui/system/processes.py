"""Run a function in a separate process, with limits on its memory, its time and the size of what it hands back: a
public demo reads what a visitor sends (an uploaded file, a Hub dataset) this way.

A few kilobytes can unpack into gigabytes (a Parquet or spreadsheet cell repeated, one row of a Hub dataset), and a
crafted file can keep a parser busy for minutes. Read apart, such a file ends its own process, never the server's,
and the app receives at most the rows its limits allow. One read runs at a time, at a low priority: the cores are
the training's and the pages'. Waiting reads take turns by network address (``FairTurns``), and an address has only
a few waiting, so one visitor's files cannot fill the line ahead of another's.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..public import visitor, without_secrets

MEMORY_MB = 2048  # the reading process's address space: Python, the reading library, and the rows
SECONDS = 60  # one read, from the process's start to its answer
PACKAGE_PARENT = str(Path(__file__).resolve().parents[2])  # holds dragon_ui: a child imports this copy of it
WAIT_SECONDS = 120  # how long a read waits for the one before it

READER_NICENESS = 10  # the Linux nice of a process that serves visitors: the server's handlers and the training first
WAITING_PER_ASKER = 2  # turns one network address may have waiting behind the running one


class TurnRefused(Exception):
    """No turn: ``crowded`` when the asker has WAITING_PER_ASKER turns waiting already, else its wait timed out."""

    def __init__(self, crowded: bool) -> None:
        super().__init__("crowded" if crowded else "timed out")
        self.crowded = crowded


class FairTurns:
    """One turn at a time on a shared worker (the file reader, math-verify's), handed to the waiting asker (a
    network address) served longest ago, first come first served among equals; TurnRefused for an asker with
    WAITING_PER_ASKER turns waiting already (never the unnamed asker "": a laptop, the operator, a training), or
    one that waited ``timeout`` seconds."""

    def __init__(self) -> None:
        self._condition = threading.Condition()
        self._busy = False
        self._waiting: list[tuple[str, int]] = []  # (asker, ticket), in arrival order
        self._served: dict[str, int] = {}  # asker -> the ticket of its last turn
        self._tickets = 0

    @contextlib.contextmanager
    def turn(self, asker: str, timeout: float) -> Iterator[None]:
        with self._condition:
            if asker and sum(waiting == asker for waiting, _ in self._waiting) >= WAITING_PER_ASKER:
                raise TurnRefused(crowded=True)
            self._tickets += 1
            ticket = (asker, self._tickets)
            self._waiting.append(ticket)
            try:
                if not self._condition.wait_for(lambda: not self._busy and self._next() == ticket, timeout):
                    self._condition.notify_all()  # the next in line may be another now
                    raise TurnRefused(crowded=False)
            finally:
                self._waiting.remove(ticket)
            self._busy = True
            self._served = {**{k: v for k, v in self._served.items() if any(k == w for w, _ in self._waiting)},
                            asker: ticket[1]}  # forget the askers that wait no more: the dict stays small
        try:
            yield
        finally:
            with self._condition:
                self._busy = False
                self._condition.notify_all()

    def _next(self) -> tuple[str, int]:
        return min(self._waiting, key=lambda waiting: (self._served.get(waiting[0], 0), waiting[1]))


_turns = FairTurns()


def runs_apart(function: Callable[..., Any]) -> Callable[..., Any]:
    """Mark a top-level function of dragon_ui's as one run_apart may run: the process runs no other."""
    setattr(function, "runs_apart", True)  # main runs only what carries this mark
    return function


def run_apart(function: Callable[..., Any], arguments: dict[str, Any], limit_bytes: int, what: str) -> Any:
    """``function(**arguments)`` (marked @runs_apart, at its module's top level, whose answer is JSON) in a
    separate process; a ConfigError naming ``what`` (the file's or dataset's name) when it fails, runs out of memory
    or time, or hands back more than ``limit_bytes``, or waits too long for its turn (FairTurns)."""
    try:
        with _turns.turn(asker(), WAIT_SECONDS), tempfile.TemporaryDirectory(prefix="dragon-read-") as empty:
            done = _child(f"{function.__module__}:{function.__qualname__}", arguments, limit_bytes, what, empty)
    except TurnRefused as refused:
        if refused.crowded:
            raise ConfigError(f"data.source: {WAITING_PER_ASKER} files or datasets from your network address are "
                              "waiting to be read already; wait for them, then try again.") from None
        raise ConfigError("data.source: the demo is busy reading other visitors' data; try again in a "
                          "minute.") from None
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


def asker() -> str:
    """Whose turn a request of the visitor being served takes (public.Visitor.turn)."""
    return visitor().turn


def lower_priority() -> None:
    """In a process that serves visitors (a reading process, math-verify's worker): READER_NICENESS, or lower."""
    with contextlib.suppress(AttributeError, OSError):  # not on Windows
        os.setpriority(os.PRIO_PROCESS, 0, max(READER_NICENESS, os.getpriority(os.PRIO_PROCESS, 0)))


def child_environment() -> dict[str, str]:
    """The environment of a process that handles what visitors send (a file to read, an answer to check): the app's,
    without the server's Hub tokens or the demo's owner key, and finding this copy of dragon_ui."""
    environment = without_secrets(dict(os.environ))
    environment["PYTHONPATH"] = os.pathsep.join(filter(None, [PACKAGE_PARENT, os.environ.get("PYTHONPATH")]))
    return environment


def _child(target: str, arguments: dict[str, Any], limit_bytes: int, what: str,
           folder: str) -> subprocess.CompletedProcess[str] | None:
    """The process, started in an empty folder (so nothing relative to the app's own folder is found there) without
    the server's Hub tokens; None when it ran out of time."""
    request = json.dumps({"target": target, "arguments": arguments, "limit_bytes": limit_bytes, "what": what,
                          "memory": MEMORY_MB * 2**20})
    try:
        return subprocess.run([sys.executable, "-c", "from dragon_ui.system.processes import main; main()"],
                              input=request, capture_output=True, text=True, timeout=SECONDS, env=child_environment(), cwd=folder)
    except subprocess.TimeoutExpired:
        return None


def main() -> None:
    """The process: its request on standard input, its answer (JSON) on standard output."""
    import importlib
    import resource

    request = json.loads(sys.stdin.read())
    resource.setrlimit(resource.RLIMIT_AS, (request["memory"], request["memory"]))
    lower_priority()
    module, _, name = request["target"].partition(":")
    function = getattr(importlib.import_module(module), name, None) if module.startswith("dragon_ui.") else None
    if function is None or not getattr(function, "runs_apart", False):
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


def end_group(process: subprocess.Popen[Any], hard: bool) -> None:
    """End a child started in a session of its own, and everything it started: SIGTERM, or with ``hard`` SIGKILL, to
    its process group. The child is not reaped yet, so its group id cannot have been reused. Where there are no
    process groups (Windows), the child alone."""
    if hasattr(os, "killpg"):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL if hard else signal.SIGTERM)
    elif hard:
        process.kill()
    else:
        process.terminate()
