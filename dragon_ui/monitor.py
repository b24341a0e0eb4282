"""Watching a run directory cheaply, and spotting the usual ways a GRPO run goes wrong.

The Train tab polls once a second while a run trains, possibly on the same two CPU cores, so a poll must cost next
to nothing when nothing happened: :func:`read_snapshot` only stats the status and log files (re-reading them when
their modification time or size changed) and reads the progress and rollout files from the byte offset where the
last poll stopped. Its cursor is plain data, kept by the UI between polls. A resume rewrites the progress files
(dropping steps after the checkpoint); the new file has a new inode, which resets the cursor.

:func:`health_alerts` turns the progress rows into warnings with a concrete fix, so a participant learns *why* a
run is not improving instead of watching a flat line.
"""

from __future__ import annotations

import os
import re
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

from .runstore import ACTIVE_STATES, RunDir, read_jsonl

LOG_LINES = 40
LOG_TAIL_CHARS = 16_000
# A run left "running" by a process that died never touches its status again; re-read it now and then anyway so
# RunDir.read_status can notice and report it.
STATUS_RECHECK_S = 10.0


@dataclass
class Snapshot:
    """What a run looks like now, and which parts changed since the previous snapshot."""

    run_dir: str
    status: dict = field(default_factory=dict)
    progress: list[dict] = field(default_factory=list)  # every progress row so far
    rollouts: dict | None = None  # the latest step's sampled groups
    log: str = ""  # the last LOG_LINES lines
    cursor: dict = field(default_factory=dict)
    status_changed: bool = False
    progress_changed: bool = False
    rollouts_changed: bool = False
    log_changed: bool = False

    @property
    def changed(self) -> bool:
        return self.status_changed or self.progress_changed or self.rollouts_changed or self.log_changed

    @property
    def active(self) -> bool:
        return self.status.get("state") in ACTIVE_STATES

    def to_state(self) -> dict:
        """Plain data for a gr.State; pass it back as ``since`` to read only what is new."""
        return {"run_dir": self.run_dir, "status": self.status, "progress": self.progress, "rollouts": self.rollouts,
                "log": self.log, "cursor": self.cursor}


def read_snapshot(run_dir: str | os.PathLike, since: dict | None = None) -> Snapshot:
    """The run's state, reading only what changed after the snapshot ``since`` (a ``Snapshot.to_state()``).

    Everything counts as changed on the first read, or when ``since`` belongs to another run.
    """
    run = RunDir(Path(run_dir))
    previous = since if since and since.get("run_dir") == str(run.path) else None
    old_cursor = previous["cursor"] if previous else {}
    snap = Snapshot(str(run.path), cursor={})

    # The status first: once it says the run ended, every row it wrote before is already in the files below.
    now = time.time()
    status_stamp = _stamp(run.status_path)  # taken before reading: a write in between is seen by the next poll
    previous_status = previous["status"] if previous else None
    recheck = previous_status is not None and previous_status.get("state") in ACTIVE_STATES \
        and now - old_cursor.get("status_read_at", 0.0) >= STATUS_RECHECK_S
    if previous is None or status_stamp != old_cursor.get("status") or recheck:
        snap.status = run.read_status()
        snap.cursor["status"], snap.cursor["status_read_at"] = status_stamp, now
    else:
        snap.status = previous_status
        snap.cursor["status"], snap.cursor["status_read_at"] = old_cursor["status"], old_cursor["status_read_at"]
    snap.status_changed = snap.status != previous_status

    rows, reset, snap.cursor["progress"] = _read_new_rows(run.progress_path, old_cursor.get("progress"))
    snap.progress = rows if reset or previous is None else previous["progress"] + rows
    snap.progress_changed = previous is None or reset or bool(rows)

    rows, reset, snap.cursor["rollouts"] = _read_new_rows(run.rollouts_path, old_cursor.get("rollouts"))
    if rows:
        snap.rollouts = rows[-1]
    elif previous is not None and not reset:
        snap.rollouts = previous["rollouts"]
    snap.rollouts_changed = previous is None or reset or bool(rows)

    log_stamp = _stamp(run.log_path)
    if previous is None or log_stamp != old_cursor.get("log"):
        snap.log = tail_lines(run.log_tail(LOG_TAIL_CHARS), LOG_LINES)
    else:
        snap.log = previous["log"]
    snap.cursor["log"] = log_stamp
    snap.log_changed = previous is None or snap.log != previous["log"]
    return snap


def _stamp(path: Path) -> list[int] | None:
    """(inode, modification time, size) of a file, or None when it does not exist yet; an atomic rewrite (a new
    inode) or an append (a new size) always changes it."""
    try:
        info = path.stat()
    except FileNotFoundError:
        return None
    return [info.st_ino, info.st_mtime_ns, info.st_size]


def _read_new_rows(path: Path, position: list[int] | None) -> tuple[list[dict], bool, list[int] | None]:
    """Rows appended since ``position`` ([inode, offset]); ``reset`` when the file was replaced or shrank, in which
    case the rows are the whole file."""
    try:
        info = path.stat()
    except FileNotFoundError:
        return [], position is not None, None
    reset = position is not None and (position[0] != info.st_ino or info.st_size < position[1])
    start = 0 if reset or position is None else position[1]
    if position is not None and not reset and info.st_size == start:
        return [], False, position  # nothing appended: no need to open the file
    rows, offset = read_jsonl(path, start)
    return rows, reset, [info.st_ino, offset]


def tail_lines(text: str, count: int) -> str:
    return "\n".join(text.splitlines()[-count:])


# ----------------------------------------------------------------------------------------------------------------
# Health alerts.

WINDOW = 3  # "the last few steps"
ZERO_SPREAD_FRAC = 0.9  # frac_reward_zero_std at or above this counts as "every group scores the same"
CLIPPED_FRAC = 0.5
KL_HIGH = 1.0
KL_FLOOR = 0.1
KL_GROWTH = 3.0
# The line training.RunStoreCallback logs the first time a reward fails.
_REWARD_ERROR_LINE = re.compile(r"Reward '(?P<name>[^']+)' failed on some completions \(scored 0\); "
                                r"first error: (?P<error>.*)")


@dataclass(frozen=True)
class Alert:
    level: str  # "warn" | "error"
    title: str
    fix: str


def _values(rows: list[dict], key: str) -> list[float]:
    return [row[key] for row in rows if isinstance(row.get(key), (int, float))]


def health_alerts(progress_rows: list[dict], status: dict, config: dict, log: str = "") -> list[Alert]:
    """Warnings about the run so far, each with a suggested fix. ``config`` is the run's config as a dict
    (config.json); ``log`` is the log tail, where the trainer writes each failing reward's first error.

    - every group scores the same: frac_reward_zero_std >= 0.9 on each of the last 3 steps;
    - most completions hit the length cap: mean clipped_ratio of the last 3 steps > 0.5;
    - KL rising fast: mean KL of the last 3 steps > 1.0, or > 0.1 and more than 3x the 3 steps before;
    - reward errors: errors_<name> > 0 in the latest row (or in status.reward_errors).
    """
    grpo = config.get("grpo") or {}
    training = config.get("training") or {}
    recent = progress_rows[-WINDOW:]
    alerts: list[Alert] = []

    spread = _values(recent, "frac_reward_zero_std")
    if len(recent) == WINDOW and len(spread) == WINDOW and min(spread) >= ZERO_SPREAD_FRAC:
        rewards = _values(recent, "reward")
        knobs = f"group_size (now {grpo.get('group_size', '?')}) or temperature (now {grpo.get('temperature', '?')})"
        if rewards and max(abs(r) for r in rewards) < 1e-9:
            alerts.append(Alert("warn", "Every completion scores 0, so there is nothing to learn from",
                                "The task is too hard for this model or the rewards too strict: give partial credit "
                                f"(a format or length reward), use easier prompts, or raise {knobs}."))
        else:
            alerts.append(Alert("warn", "Every completion in a group gets the same reward",
                                "GRPO learns from differences within a group. Add a reward that tells better answers "
                                f"from worse ones (partial credit), or raise {knobs}. If all already score full marks, "
                                "the task is learned: make it harder."))

    clipped = _values(recent, "clipped_ratio")
    if clipped and statistics.fmean(clipped) > CLIPPED_FRAC:
        alerts.append(Alert("warn", f"Most completions hit the length cap ({statistics.fmean(clipped):.0%} cut off)",
                            f"Answers are cut off before they finish: raise max new tokens (now "
                            f"{grpo.get('max_new_tokens', '?')}), or reward short answers with a length reward."))

    kl = _values(progress_rows, "kl")
    if kl:
        now = statistics.fmean(kl[-WINDOW:])
        before = statistics.fmean(kl[-2 * WINDOW:-WINDOW]) if len(kl) >= 2 * WINDOW else None
        if now > KL_HIGH or (before is not None and now > KL_FLOOR and now > KL_GROWTH * before):
            alerts.append(Alert("warn", f"KL is rising fast (now {now:.2f})",
                                "The model is drifting quickly from where it started, which often ends in repetitive "
                                f"or garbled text: lower the learning rate (now {training.get('learning_rate', '?')}) "
                                f"or raise beta (now {grpo.get('beta', '?')})."))

    latest = progress_rows[-1] if progress_rows else {}
    errors = {key[len("errors_"):]: value for key, value in latest.items() if key.startswith("errors_")}
    for name, count in (status.get("reward_errors") or {}).items():
        errors.setdefault(name, count)
    first_errors = {m["name"]: m["error"].strip() for m in _REWARD_ERROR_LINE.finditer(log)}
    for name, count in errors.items():
        if isinstance(count, (int, float)) and count > 0:
            detail = f"First error: {first_errors[name]}" if name in first_errors else \
                "Its first error is in the run's log (log.txt in the run folder)."
            plural = "s" if count != 1 else ""
            alerts.append(Alert("error", f"The reward '{name}' failed on {int(count)} completion{plural} so far "
                                "(they scored 0)",
                                f"{detail} Fix the reward on the Rewards tab (test it there on a sample reply), then "
                                "start a new run."))
    return alerts
