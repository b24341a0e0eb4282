"""Runs side by side: a leaderboard of every run, the settings that differ between the runs chosen, and their
progress rows for curves drawn over each other.

Everything comes from the run folders (runstore), so finished, stopped and running runs show alike, and a restarted
app shows the same. What a run's folder names on the server (an upload's path, a model folder) is shown by its file
name alone: the leaderboard is for everyone in a public demo, and a path says nothing a person compares runs by.
"""

from __future__ import annotations

import csv
import hashlib
import math
import time
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .data import is_hub_dataset_id
from .runstore import HeldOutRow, ProgressRow, RunDir, read_json, state_label

MAX_OVERLAID = 8  # more lines than a legend can tell apart
LEADERBOARD_COLUMNS = ["Run", "Name", "Data", "Held-out before", "Held-out after", "Change", "Steps", "Minutes",
                       "State", "Started"]
HELDOUT_TOTAL = "held-out total"  # what the leaderboard ranks by unless a reward or metric is chosen
RIGHT_ANSWERS = "right answers (each run's goal)"  # the share of held-out replies that pass the run's goal
MOST_RANK_CHARS = 100  # a reward's name to rank by, as any client may send one
LEADERBOARD_TYPES = ["str", "str", "str", "number", "number", "number", "number", "number", "str", "str"]
# Config keys that are where a run was made, not how: they differ between any two runs and say nothing.
NOT_SETTINGS = {"name", "notes", "runs_dir", "base_dir"}
# A spreadsheet runs a cell that starts with one of these as a formula (CSV injection): such text gets a quote.
FORMULA_SIGNS = ("=", "+", "-", "@")


def shown_name(text: Any) -> str:
    """A data source or model as the leaderboard shows it: a Hub id as it is, a file or folder by its name."""
    text = str(text or "").strip()
    if not text or is_hub_dataset_id(text, look_on_disk=False):
        return text
    path = Path(text)
    if path.name in ("adapter", "model", "merged"):  # a run's own weights: the run's folder says which
        return f"{path.parent.name}/{path.name}"
    return path.name


@dataclass(frozen=True)
class Entry:
    """One run on the leaderboard."""

    run_id: str
    name: str
    data: str
    heldout_before: float | None
    heldout_after: float | None
    steps: int
    minutes: float | None
    state: str
    started: str
    whose: str = ""

    @property
    def change(self) -> float | None:
        if self.heldout_before is None or self.heldout_after is None:
            return None
        return self.heldout_after - self.heldout_before

    def row(self, public: bool) -> list[Any]:
        rounded = [_rounded(v) for v in (self.heldout_before, self.heldout_after, self.change)]
        return [self.run_id, self.name, self.data, *rounded, self.steps, _rounded(self.minutes, 1), self.state,
                self.started, *([self.whose] if public else [])]

    def matches(self, words: str) -> bool:
        """Whether every word of a filter is in the run's id, name, data or state (any case)."""
        text = " ".join((self.run_id, self.name, self.data, self.state, self.whose)).lower()
        return all(word in text for word in words.lower().split())


def _rounded(value: float | None, digits: int = 3) -> float | None:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
        return None
    return round(value, digits) + 0.0  # + 0.0: no "-0.0"


def rank_choices(summaries: list[dict]) -> list[str]:
    """What the leaderboard can rank by: the held-out total, the right answers by each run's goal (where a run was
    scored on one), then every reward and metric some run was scored on (totals of runs whose rewards differ do not
    compare; one reward, a metric no run trained on, or the share of right answers does)."""
    sides = ("before", "after")
    names = {str(name) for summary in summaries for side in sides for name in _scores(summary, side)}
    goals = any(summary.get(f"heldout_{side}_right") is not None for summary in summaries for side in sides)
    return [HELDOUT_TOTAL, *([RIGHT_ANSWERS] if goals else []), *sorted(names)]


def _scores(summary: dict, side: str) -> dict:
    scores = summary.get(f"heldout_{side}_scores")
    return scores if isinstance(scores, dict) else {}


def _held_out(summary: dict, side: str, by: str) -> float | None:
    value = summary.get(f"heldout_{side}") if by == HELDOUT_TOTAL else summary.get(f"heldout_{side}_right") \
        if by == RIGHT_ANSWERS else _scores(summary, side).get(by)
    return _rounded(value, 6)


def leaderboard(summaries: list[dict], whose: Callable[[dict], str] | None = None,
                by: str = HELDOUT_TOTAL) -> list[Entry]:
    """One entry per run (``summaries`` as from runstore.list_runs), best held-out score after training first, by
    the total or by one reward or metric (``by``, one of rank_choices); runs with none yet follow, newest first.
    ``whose`` says whose each run is, in a public demo."""
    entries = []
    for summary in summaries:
        started = summary.get("started_at")
        elapsed = summary.get("elapsed_s")
        entries.append(Entry(
            run_id=summary["id"], name=summary.get("name") or "", data=shown_name(summary.get("data")),
            heldout_before=_held_out(summary, "before", by),
            heldout_after=_held_out(summary, "after", by), steps=int(summary.get("step") or 0),
            minutes=elapsed / 60 if isinstance(elapsed, (int, float)) else None,
            state=state_label(summary.get("state")),
            started=time.strftime("%Y-%m-%d %H:%M", time.localtime(started)) if started else "",
            whose=whose(summary) if whose else ""))
    scored = sorted((e for e in entries if e.heldout_after is not None), key=lambda e: e.heldout_after or 0.0,
                    reverse=True)
    return scored + [e for e in entries if e.heldout_after is None]


def leaderboard_columns(public: bool, by: str = HELDOUT_TOTAL) -> list[str]:
    """The leaderboard's columns, the held-out ones named after what it ranks by; a public demo's says whose each
    run is."""
    columns = list(LEADERBOARD_COLUMNS)
    if by != HELDOUT_TOTAL:
        columns[3:5] = [f"{by} before", f"{by} after"]
    return [*columns, "Whose"] if public else columns


def leaderboard_types(public: bool) -> list[str]:
    """What each column holds, so that a click on a number column sorts by number."""
    return [*LEADERBOARD_TYPES, "str"] if public else LEADERBOARD_TYPES


def write_csv(path: Path, columns: list[str], rows: list[list[Any]]) -> Path:
    """The leaderboard as a CSV file a spreadsheet opens safely: a text that would run as a formula is quoted."""
    def cell(value: Any) -> Any:
        if value is None:
            return ""
        if isinstance(value, str) and _may_run_as_formula(value):
            return "'" + value
        return value

    with open(path, "w", encoding="utf-8", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(columns)
        writer.writerows([cell(value) for value in row] for row in rows)
    return path


def _may_run_as_formula(text: str) -> bool:
    """Whether a spreadsheet might run ``text`` as a formula: it starts with a formula sign or a look-alike of one
    (full-width ＝ reads as = once NFKC-normalized, as some spreadsheets read it), or with whitespace, a control
    character (tab, line feed) or an invisible one (U+200B, category Cf), which a spreadsheet may strip first."""
    first = text[:1]
    return bool(first) and (first.isspace() or unicodedata.category(first).startswith("C")
                            or unicodedata.normalize("NFKC", first).startswith(FORMULA_SIGNS))


def flat_settings(config: dict) -> dict[str, str]:
    """A run's config.json as one text per setting ("grpo.beta" → "0.04"); each reward is one setting, named by the
    reward's name, whose text gives its kind, weight and options."""
    flat: dict[str, str] = {}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, dict):
            for key, inner in value.items():
                walk(f"{prefix}.{key}" if prefix else key, inner)
        else:
            flat[prefix] = _setting_text(prefix, value)

    for key, value in config.items():
        if key in NOT_SETTINGS:
            continue
        if key == "rewards" and isinstance(value, list):
            for reward in value:
                if isinstance(reward, dict):
                    flat[f"reward · {reward.get('name') or reward.get('kind')}"] = _reward_text(reward)
            continue
        walk(key, value)
    return flat


def _setting_text(path: str, value: Any) -> str:
    if path in ("data.source", "model.id"):
        return shown_name(value)
    if value is None:
        return "–"
    if isinstance(value, list):
        return ", ".join(map(str, value)) or "–"
    return str(value)


def _reward_text(reward: dict) -> str:
    options = ", ".join(f"{key} {_setting_text(key, value)}" for key, value in reward.items()
                        if key not in ("name", "kind", "weight") and key != "code")
    text = f"{reward.get('kind')} × {reward.get('weight', 1.0)}"
    if reward.get("code"):  # a fingerprint: two codes differ in the table when they differ at all
        text += f", its own code #{hashlib.sha256(str(reward['code']).encode()).hexdigest()[:8]}"
    return f"{text} ({options})" if options else text


def differing_settings(configs: list[dict]) -> list[list[str]]:
    """[setting, value in each run...] for the settings that differ between the runs' configs (in the order given),
    a reward that only some runs have among them ("–" where a run has none)."""
    flats = [flat_settings(config) for config in configs]
    keys = list(dict.fromkeys(key for flat in flats for key in flat))
    rows = []
    for key in keys:
        values = [flat.get(key, "–") for flat in flats]
        if len(set(values)) > 1:
            rows.append([key, *values])
    return rows


@dataclass
class RunCurves:
    """One run as the side-by-side view shows it: its progress rows and held-out checks, its settings, what to call it
    in a legend."""

    run_id: str
    label: str
    rows: list[ProgressRow]
    reward_names: list[str]
    config: dict
    heldout: list[HeldOutRow]


def run_curves(run: RunDir) -> RunCurves:
    config = read_json(run.config_path, default={}) or {}
    status = run.read_status()
    names = status.get("reward_names") or [str(r["name"]) for r in config.get("rewards") or []
                                           if isinstance(r, dict) and r.get("name")]
    return RunCurves(run.id, config.get("name") or run.id, run.read_progress(), names, config, run.read_heldout())


def legend_labels(curves: list[RunCurves]) -> list[str]:
    """A label per run for the legends and the settings table: its name, or its id where two runs share a name."""
    names = [c.label for c in curves]
    return [c.label if names.count(c.label) == 1 else c.run_id for c in curves]
