"""A public demo's disk stays in bounds: finished runs and uploads older than the owner's retention
(``DRAGON_UI_KEEP_HOURS``) are removed, and downloads and unclaimed uploads after an hour, by the queue's scheduler
thread.

Nothing a run still needs is removed: a run training or waiting, and a finished run that a waiting one continues
from, stay whatever their age.
"""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Iterable
from pathlib import Path

from ..public import UPLOADS_FOLDER
from ..runstore import ACTIVE_STATES, RunDir, list_runs, read_json

log = logging.getLogger("dragon_ui")

# A download is fetched by its browser at once, and an upload claimed by its page's next event: an hour covers a slow
# connection.
PASSING_HOURS = 1.0


def clean_up(runs_dir: Path, keep_hours: float, passing: Iterable[Path] = ()) -> list[Path]:
    """Remove what is older than ``keep_hours`` (runs by the time they finished, uploads by the time they arrived)
    and the entries of the ``passing`` folders (downloads, uploads on their way) older than PASSING_HOURS; returns
    what was removed."""
    removed = [*_old_runs(runs_dir, keep_hours), *_old_entries(runs_dir / UPLOADS_FOLDER, keep_hours, depth=2)]
    for folder in passing:
        removed += _old_entries(folder, PASSING_HOURS, depth=1)
    for path in removed:
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
        log.info("Removed %s: older than this demo keeps it.", path)
    return removed


def _old_runs(runs_dir: Path, keep_hours: float) -> list[Path]:
    summaries = list_runs(runs_dir)
    active = [summary for summary in summaries if summary["state"] in ACTIVE_STATES]
    needed = {str(Path(summary["model"]).resolve()) for summary in active if summary["model"].startswith("/")}
    cutoff = time.time() - keep_hours * 3600
    old = []
    for summary in summaries:
        if summary["state"] in ACTIVE_STATES or summary["dir"] in needed:
            continue
        run = RunDir(Path(summary["dir"]))
        status = read_json(run.status_path, default={}) or {}
        ended = status.get("finished_at") or status.get("updated_at") or run.config_path.stat().st_mtime
        if ended < cutoff:
            old.append(run.path)
    return old


def _old_entries(folder: Path, hours: float, depth: int) -> list[Path]:
    """Entries ``depth`` levels below ``folder`` last changed more than ``hours`` ago (an upload's own folder is
    two levels down: visitor, then upload)."""
    if not folder.is_dir():
        return []
    cutoff = time.time() - hours * 3600
    entries = [folder]
    for _ in range(depth):
        entries = [child for entry in entries if entry.is_dir() for child in entry.iterdir()]
    return [entry for entry in entries if _last_changed(entry) < cutoff]


def _last_changed(path: Path) -> float:
    """The newest modification time in ``path`` (a file, or a folder and what it holds)."""
    times = [path.stat().st_mtime]
    if path.is_dir():
        times += [child.stat().st_mtime for child in path.rglob("*")]
    return max(times)
