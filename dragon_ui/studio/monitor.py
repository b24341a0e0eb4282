"""Watching a run directory cheaply, and spotting the usual ways a GRPO run goes wrong.

The Train tab polls once a second while a run trains, possibly on the same two CPU cores, so a poll must cost next
to nothing when nothing happened: :func:`read_snapshot` only stats the status and log files (re-reading them when
their modification time or size changed) and reads the progress and rollout files from the byte offset where the
last poll stopped. Its cursor is plain data, kept by the UI between polls. A resume rewrites the progress files
(dropping steps after the checkpoint); the new file has a new inode, which resets the cursor.

:func:`health_alerts` turns the progress rows into warnings with a concrete fix, so a participant learns *why* a
run is not improving instead of watching a flat line. It reads the rows through :func:`series`, as the charts do
(dragon_ui.ui.plots), so an alert that quotes a number quotes what the chart shows at that step.
"""

from __future__ import annotations

import collections
import os
import re
import statistics
import time
from collections.abc import Mapping, Sequence, Set
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from ..config import usual_learning_rates
from ..grpo_math import finite_number
from ..rewards import PENALTY_KINDS, goal_names, stored_metrics, training_weight
from ..runstore import (ACTIVE_STATES, HeldOutRow, ProgressRow, RunDir, RunStatus, errors_key, read_appended_rows,
                        read_last_appended_row, read_record_rows, reward_key, value_at)

LOG_LINES = 40
LOG_TAIL_CHARS = 16_000
# A run left "running" by a process that died never touches its status again; re-read it now and then anyway so
# RunDir.read_status can notice and report it.
STATUS_RECHECK_S = 10.0


@dataclass
class Snapshot:
    """What a run looks like now, and which parts changed since the previous snapshot."""

    run_dir: str
    status: RunStatus = field(default_factory=lambda: RunStatus())
    progress: list[ProgressRow] = field(default_factory=list)  # every progress row so far
    heldout: list[HeldOutRow] = field(default_factory=list)  # every held-out check so far (heldout.jsonl)
    rollouts: dict | None = None  # the latest step's sampled groups
    sampling: dict | None = None  # before the first step ends: the batch it is scoring and training on
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
        return {"run_dir": self.run_dir, "status": self.status, "progress": self.progress, "heldout": self.heldout,
                "rollouts": self.rollouts, "sampling": self.sampling, "log": self.log, "cursor": self.cursor}


def read_snapshot(run_dir: str | os.PathLike, since: dict | None = None) -> Snapshot:
    """The run's state, reading only what changed after the snapshot ``since`` (a ``Snapshot.to_state()``).

    Everything counts as changed on the first read, or when ``since`` belongs to another run.
    """
    run = RunDir(Path(run_dir))
    previous = _same_run(since, run)
    old_cursor = previous["cursor"] if previous else {}
    snap = Snapshot(str(run.path), cursor={})

    # The status first: once it says the run ended, every row it wrote before is already in the files below.
    now = time.time()
    status_stamp = _stamp(run.status_path)  # taken before reading: a write in between is seen by the next poll
    previous_status = previous["status"] if previous else None
    if previous is None or status_stamp != old_cursor.get("status") or _status_recheck_due(previous, now):
        snap.status = run.read_status()
        snap.cursor["status"], snap.cursor["status_read_at"] = status_stamp, now
    else:
        snap.status = previous["status"]
        snap.cursor["status"], snap.cursor["status_read_at"] = old_cursor["status"], old_cursor["status_read_at"]
    snap.status_changed = snap.status != previous_status

    rows, reset, snap.cursor["progress"] = _read_new_rows(run.progress_path, old_cursor.get("progress"),
                                                          read_record_rows)
    snap.progress = cast(list[ProgressRow], rows if reset or previous is None else previous["progress"] + rows)
    snap.progress_changed = previous is None or reset or bool(rows)

    rows, reset, snap.cursor["heldout"] = _read_new_rows(run.heldout_path, old_cursor.get("heldout"),
                                                         read_record_rows)
    snap.heldout = cast(list[HeldOutRow], rows if reset or previous is None else (previous.get("heldout") or []) + rows)
    snap.progress_changed = snap.progress_changed or reset or bool(rows)  # the reward chart draws both

    rows, reset, snap.cursor["rollouts"] = _read_new_rows(run.rollouts_path, old_cursor.get("rollouts"),
                                                          read_last_appended_row)  # only the newest is shown
    if rows:
        snap.rollouts = rows[-1]
    elif previous is not None and not reset:
        snap.rollouts = previous["rollouts"]
    snap.rollouts_changed = previous is None or reset or bool(rows)
    if snap.rollouts is None:  # until the first step ends, the completions it sampled (sampling.json)
        stamp = _stamp(run.sampling_path)
        if previous is None or stamp != old_cursor.get("sampling"):
            snap.sampling = run.read_sampling() if stamp else None
            snap.rollouts_changed = snap.rollouts_changed or snap.sampling != (previous or {}).get("sampling")
        else:
            snap.sampling = previous.get("sampling")
        snap.cursor["sampling"] = stamp

    log_stamp = _stamp(run.log_path)
    if previous is None or log_stamp != old_cursor.get("log"):
        snap.log = tail_lines(run.log_tail(LOG_TAIL_CHARS), LOG_LINES)
    else:
        snap.log = previous["log"]
    snap.cursor["log"] = log_stamp
    snap.log_changed = previous is None or snap.log != previous["log"]
    return snap


def fingerprint(run_dir: str | os.PathLike, since: dict | None = None) -> list:
    """What a poll compares to know whether ``read_snapshot(run_dir, since)`` would find anything new, without
    opening a file: the stamp of every file it reads and, when it would re-read an active run's status anyway
    (STATUS_RECHECK_S), the time."""
    run = RunDir(Path(run_dir))
    paths = (run.status_path, run.progress_path, run.heldout_path, run.rollouts_path, run.sampling_path, run.log_path)
    now = time.time()
    return [*(_stamp(path) for path in paths), now if _status_recheck_due(_same_run(since, run), now) else None]


def _same_run(since: dict | None, run: RunDir) -> dict | None:
    """``since`` when it is a snapshot of ``run``."""
    return since if since and since.get("run_dir") == str(run.path) else None


def _status_recheck_due(previous: dict | None, now: float) -> bool:
    """Whether an active run's status is due to be read again although its file did not change."""
    if previous is None:
        return False
    status = previous["status"]
    return status is not None and status.get("state") in ACTIVE_STATES \
        and now - previous["cursor"].get("status_read_at", 0.0) >= STATUS_RECHECK_S


def _stamp(path: Path) -> list[int] | None:
    """(inode, modification time, size) of a file, or None when it does not exist yet; an atomic rewrite (a new
    inode) or an append (a new size) always changes it."""
    try:
        info = path.stat()
    except FileNotFoundError:
        return None
    return [info.st_ino, info.st_mtime_ns, info.st_size]


def _read_new_rows(path: Path, position: list[int] | None,
                   read=read_appended_rows) -> tuple[list[dict], bool, list[int] | None]:
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
    rows, offset = read(path, start)
    return rows, reset, [info.st_ino, offset]


def tail_lines(text: str, count: int) -> str:
    return "\n".join(text.splitlines()[-count:])


# ----------------------------------------------------------------------------------------------------------------
# Progress series: what the Train tab's charts draw, and what the health alerts read.


def series(rows: Sequence[Mapping[str, Any]], key: str) -> tuple[list, list[float | None]]:
    """(steps, values) of one progress key, one point per row; None where a row has no finite number (a gap in the
    chart). The charts draw exactly this and the alerts read exactly this, so they cannot disagree."""
    return [row.get("step") for row in rows], [finite_number(value_at(row, key)) for row in rows]


def _known(values: Sequence[float | None]) -> list[float] | None:
    """``values`` where every one is a number; None where any is missing (a gap in its chart)."""
    known = [value for value in values if value is not None]
    return known if len(known) == len(values) else None


def points(rows: Sequence[Mapping[str, Any]], key: str) -> list[tuple[int, float]]:
    """The (step, value) points a chart of ``key`` shows, oldest first."""
    return [(step, value) for step, value in zip(*series(rows, key)) if value is not None]


def reward_names_of(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """The rewards the rows hold a value of, in first-seen order."""
    names: dict[str, None] = {}
    for row in rows:
        rewards = row.get("rewards")
        for name in rewards if isinstance(rewards, dict) else ():
            names.setdefault(str(name), None)
    return list(names)


# ----------------------------------------------------------------------------------------------------------------
# Health alerts.

WINDOW = 3  # "the last few steps"
FLAT_STEPS = 5  # a reward whose mean is 0 this many steps in a row never gives credit
MOST_GROUPS_SAME = 0.9  # no_spread_share at or above this, WINDOW steps running: little left to learn from
CLIPPED_FRAC = 0.5
KL_HIGH = 1.0
KL_NOTABLE = 0.1  # below this, KL growth is harmless however fast
KL_GROWTH = 3.0  # rising: the last WINDOW steps all above the WINDOW before, the latest 3x their mean
KL_SPIKE = 2.0  # a spike: one step above twice the highest of the WINDOW steps before it...
KL_SPIKE_MIN = 0.3  # ...and high enough to matter
SAME = 1e-9  # float noise: values closer than this count as equal
# The line progress.RunStoreCallback logs the first time a reward fails.
_REWARD_ERROR_LINE = re.compile(r"Reward '(?P<name>[^']+)' failed on some completions \(scored 0\); "
                                r"first error: (?P<error>.*)")


@dataclass(frozen=True)
class Alert:
    """A warning with its fix. ``kind`` names the check that fired; ``value`` is the number the title quotes, the
    value the chart of progress key ``key`` shows at ``step`` (None where the alert quotes no progress value)."""

    level: str  # "warn" | "error"
    title: str
    fix: str
    kind: str = ""
    key: str | None = None
    step: int | None = None
    value: float | None = None


def health_alerts(progress_rows: list[ProgressRow], status: RunStatus, config: dict, log: str = "",
                  rollout: dict | None = None, heldout: list[HeldOutRow] | None = None) -> list[Alert]:
    """Warnings about the run so far, each with a suggested fix, computed from the values the charts draw (see
    :func:`series`). ``config`` is the run's config as a dict (config.json); ``log`` is the log tail, where the
    trainer writes each failing reward's first error; ``rollout`` the latest step's sampled groups (rollouts.jsonl),
    which the completions viewer shows; ``heldout`` the held-out checks during training (heldout.jsonl).

    - a reward failing: errors_<name> > 0 in the latest row (or in status.reward_errors);
    - a reward that teaches nothing (a penalty, which is 0 until it is due, excepted): a mean of 0 on each of
      the last FLAT_STEPS steps, or one mean on every step;
    - every group scoring the same: no_spread_share == 1 in the latest row (or >= 0.9 for WINDOW steps running);
    - most completions cut off: clipped_ratio > 0.5 in the latest row;
    - KL: a spike among the last WINDOW steps, the latest above 1.0, or rising for WINDOW steps to 3x the level before;
    - reward hacking (:func:`hacking_alerts`): the training reward rising while the held-out one does not, one
      reward rising while another falls, padding to earn a length reward, one reply to different questions,
      repetitive or empty replies;
    - with tools (:func:`_tool_alerts`): no tool called for WINDOW steps, every call failing for WINDOW steps, most
      of the latest step's replies ending in a call instead of an answer.
    """
    grpo = config.get("grpo") or {}
    training = config.get("training") or {}
    alerts = _reward_error_alerts(progress_rows, status, log)
    failing = {alert.key.removeprefix(errors_key("")) for alert in alerts if alert.key is not None}  # their zeros are explained already
    penalties = {str(spec.get("name") or spec.get("kind")) for spec in config.get("rewards") or []
                 if isinstance(spec, dict) and spec.get("kind") in PENALTY_KINDS}  # at 0 when no penalty is due
    alerts += _flat_reward_alerts(progress_rows, skip=failing | penalties)
    alerts += _spread_alerts(progress_rows, grpo)
    hacking = hacking_alerts(progress_rows, rollout, config, heldout, skip=failing)
    if not any(alert.kind == "padding" for alert in hacking):  # else the cap is reached on purpose: raising it feeds it
        alerts += _length_alerts(progress_rows, grpo)
    alerts += _kl_alerts(progress_rows, grpo, training, usual_learning_rates(
        (config.get("lora") or {}).get("enabled", True), _parameters((config.get("model") or {}).get("id", ""))))
    if config.get("tools"):
        alerts += _tool_alerts(progress_rows, rollout, grpo)
    return alerts + hacking


def _parameters(model_id: str) -> float | None:
    """The model's number of parameters, where it is known here (a preset, a local or cached config)."""
    from ..engine.estimate import model_dims

    try:
        return model_dims(model_id)[0].params
    except Exception:  # noqa: BLE001 - an unknown size only makes the advice more general
        return None


def _reward_error_alerts(rows: list[ProgressRow], status: RunStatus, log: str) -> list[Alert]:
    """The counts are cumulative (progress.RunStoreCallback), so the latest row has them all; the row before tells
    whether the reward is still failing."""
    latest = rows[-1] if rows else {}
    before = rows[-2] if len(rows) > 1 else {}
    errors = latest.get("errors")
    counts = {str(name): finite_number(value) for name, value in (errors if isinstance(errors, dict) else {}).items()}
    kept = status.get("reward_errors")
    for name, kept_count in (kept if isinstance(kept, dict) else {}).items():
        counts.setdefault(name, finite_number(kept_count))
    first_errors = {m["name"]: m["error"].strip() for m in _REWARD_ERROR_LINE.finditer(log)}
    per_step = finite_number(latest.get("completions_per_step"))
    alerts = []
    for name, count in counts.items():
        if count is None or count <= 0:
            continue
        title = f"The reward '{name}' failed on {int(count)} completion{'s' if count != 1 else ''} so far"
        if latest:
            earlier = finite_number(value_at(before, errors_key(name))) or 0
            new = count - earlier if count >= earlier else count  # a resume starts the counts again
            of = f" of {int(per_step)}" if per_step else ""
            title += f", {int(new)}{of} in step {latest.get('step')}" if new else f", none in step {latest.get('step')}"
        detail = f"First error: {first_errors[name]}" if name in first_errors else \
            "Its first error is in the run's log (log.txt in the run folder)."
        alerts.append(Alert("error", title + " (they scored 0)",
                            f"{detail} Fix the reward on the Rewards tab (test it there on a sample reply), then "
                            "start a new run.", "reward_errors", errors_key(name), latest.get("step"), count))
    return alerts


def _flat_reward_alerts(rows: list[ProgressRow], skip: Set[str]) -> list[Alert]:
    """A reward that teaches nothing: a mean of 0 on each of the last FLAT_STEPS steps (it never gives credit), or
    one mean on every step of the run (it gives everything the same score). A mean between 0 and 1 can repeat over a
    few steps by chance, hence the whole run for that one."""
    alerts = []
    for name in reward_names_of(rows):
        if name in skip:
            continue
        key = reward_key(name)
        steps, values = series(rows, key)
        recent = _known(values[-FLAT_STEPS:])
        if recent is None or len(recent) < FLAT_STEPS:
            continue
        step, value = steps[-1], recent[-1]
        if all(abs(v) <= SAME for v in recent):
            alerts.append(Alert("warn", f"The reward '{name}' scored 0 on each of the last {FLAT_STEPS} steps",
                                "It never gives credit, so it teaches nothing. Test it on the Rewards tab with a reply "
                                "that should score (a wrong answer format or reference column is the usual cause), or "
                                "give partial credit.", "reward_flat", key, step, value))
        elif (whole := _known(values)) is not None and max(whole) - min(whole) <= SAME:
            alerts.append(Alert("warn", f"The reward '{name}' gave {value:.3f} on every step so far ({len(values)} "
                                "steps)", "It gives every completion the same score, so it teaches nothing. If that is "
                                "full marks, it is too easy: make it stricter or remove it; otherwise test it on the "
                                "Rewards tab with replies that should score differently.", "reward_flat", key, step,
                                value))
    return alerts


def _spread_alerts(rows: list[ProgressRow], grpo: dict) -> list[Alert]:
    """no_spread_share is the share of groups whose completions all scored the same (the spread chart's "groups
    with no spread"); GRPO learns only from the others. The chart's other line, reward_std, is TRL's spread over the
    whole batch: above 0 whenever groups differ from each other, even if each group agrees within itself."""
    steps, recent = series(rows[-WINDOW:], "no_spread_share")
    frac = recent[-1] if recent else None
    if frac is None:
        return []
    step = steps[-1]
    knobs = f"group_size (now {grpo.get('group_size', '?')}) or temperature (now {grpo.get('temperature', '?')})"
    if frac >= 1 - SAME:
        reward = finite_number(rows[-1].get("reward"))
        if reward is not None and abs(reward) <= SAME:
            return [Alert("warn", f"Every completion scored 0 at step {step}, so there is nothing to learn from",
                          "The task is too hard for this model or the rewards too strict: give partial credit (a "
                          f"format or length reward), use easier prompts, or raise {knobs}.",
                          "all_zero", "reward", step, reward)]
        return [Alert("warn", f"Every group scored the same at step {step}: no completion did better than the others "
                      "of its group", "GRPO learns from differences within a group. Add a reward that tells better "
                      f"answers from worse ones (partial credit), or raise {knobs}. If all already score full marks, "
                      "the task is learned: make it harder.", "no_spread", "no_spread_share", step, frac)]
    if len(recent) == WINDOW and (known := _known(recent)) is not None and min(known) >= MOST_GROUPS_SAME:
        return [Alert("warn", f"Almost every group scores the same ({frac:.0%} of them at step {step}, "
                      f"{WINDOW} steps running)", "Only the few groups with different scores teach anything. Add a "
                      f"reward that gives partial credit, or raise {knobs}.",
                      "little_spread", "no_spread_share", step, frac)]
    return []


def _length_alerts(rows: list[ProgressRow], grpo: dict) -> list[Alert]:
    """Completions cut off at max_new_tokens: the length chart's mean length sits at its dashed cap."""
    if not rows or (clipped := finite_number(rows[-1].get("clipped_ratio"))) is None or clipped <= CLIPPED_FRAC:
        return []
    step, length, cap = rows[-1].get("step"), finite_number(rows[-1].get("completion_len")), grpo.get("max_new_tokens", "?")
    mean = f", mean length {length:.1f} of {cap} tokens" if length is not None else ""
    return [Alert("warn", f"Most completions hit the length cap at step {step} ({clipped:.0%} cut off{mean})",
                  "Answers are cut off before they finish, so they rarely reach the part that earns the reward: raise "
                  f"max new tokens (now {cap}), or add a length reward that pays for shorter answers.",
                  "clipped", "clipped_ratio", step, clipped)]


def _kl_alerts(rows: list[ProgressRow], grpo: dict, training: dict, learning_rates: str) -> list[Alert]:
    """At most one KL alert: a spike first (the most specific), then a high KL, then a steady rise; none while the
    training reward is not falling. KL only says how far the model moved from where it started, and a run that
    learns its task must move: a high KL is a warning when the reward has stopped paying for the distance."""
    kl = points(rows, "kl")
    if not kl or not _reward_falling(rows):
        return []
    knobs = (f"lower the learning rate (now {training.get('learning_rate', '?')}; {learning_rates}) or raise beta "
             f"(now {grpo.get('beta', '?')})")
    now_step, now = kl[-1]
    spike = _recent_spike(kl)
    if spike is not None:
        step, value, level = spike
        later = f", now {now:.3f} at step {now_step}" if step != now_step else ""
        return [Alert("warn", f"KL jumped to {value:.3f} at step {step} (the {WINDOW} steps before stayed at or below "
                      f"{level:.3f}{later}) while the reward fell", "One update moved the model much further from where "
                      "it started than the steps before. If the replies below turn repetitive or garbled, stop and "
                      f"start again and {knobs}.", "kl_spike", "kl", step, value)]
    drift = ("The model is drifting far from where it started while its reward falls, which often ends in "
             "repetitive or garbled text: ")
    if now > KL_HIGH:
        return [Alert("warn", f"KL is high (now {now:.3f} at step {now_step}) and the reward is falling",
                      drift + knobs + ".", "kl_high", "kl", now_step, now)]
    if len(kl) >= 2 * WINDOW:
        earlier, recent = [v for _, v in kl[-2 * WINDOW:-WINDOW]], [v for _, v in kl[-WINDOW:]]
        if now > KL_NOTABLE and min(recent) > max(earlier) and now > KL_GROWTH * statistics.fmean(earlier):
            first_step, first = kl[-2 * WINDOW]
            return [Alert("warn", f"KL is rising steadily (now {now:.3f} at step {now_step}, up from {first:.3f} at "
                          f"step {first_step}) and the reward is falling", drift + knobs + ".", "kl_rising", "kl",
                          now_step, now)]
    return []


def _reward_falling(rows: list[ProgressRow]) -> bool:
    """Whether the training reward of the last WINDOW steps is below that of the WINDOW before, by more than noise
    (a twentieth of its level, at least 0.02). Too few steps to tell counts as falling: nothing vouches for it yet."""
    rewards = [value for _, value in points(rows, "reward")]
    if len(rewards) < 2 * WINDOW:
        return True
    earlier, recent = statistics.fmean(rewards[-2 * WINDOW:-WINDOW]), statistics.fmean(rewards[-WINDOW:])
    return recent < earlier - max(0.02, 0.05 * abs(earlier))


def _recent_spike(kl: list[tuple[int, float]]) -> tuple[int, float, float] | None:
    """(step, value, level before) of the latest of the last WINDOW points that jumped above KL_SPIKE times the
    highest of the WINDOW points before it: kept for WINDOW steps, so a one-step jump does not flash by unseen."""
    for i in range(len(kl) - 1, max(WINDOW, len(kl) - WINDOW) - 1, -1):
        step, value = kl[i]
        level = max(v for _, v in kl[i - WINDOW:i])
        if value >= KL_SPIKE_MIN and value > KL_SPIKE * level:
            return step, value, level
    return None


# ----------------------------------------------------------------------------------------------------------------
# Reward hacking: the reward climbs because the model found a loophole, not the task.

TRADE_OFF = 0.15  # a reward's mean over the last WINDOW steps this much above (or below) its mean over the WINDOW before
MOST_REPLIES = 0.5  # a share of the latest step's completions
REPEATED_MIN_WORDS = 8  # shorter replies are too short to call repetitive
REPEATED_DISTINCT = 0.5  # a reply whose distinct word 3-grams are at most this share of its 3-grams repeats itself


def hacking_alerts(rows: list[ProgressRow], rollout: dict | None, config: dict, heldout: list[HeldOutRow] | None = None,
                   skip: Set[str] = frozenset()) -> list[Alert]:
    """The usual signs that a model games its rewards, each with the numbers and a fix:

    - the training reward rising over the last three held-out checks while the held-out reward stays flat or falls;
    - a metric (a reward not trained on) falling while the training reward rises, over the last WINDOW steps
      against the WINDOW before or over the last three held-out checks;
    - one reward rising while another falls (the last WINDOW steps against the WINDOW before), a failing reward
      (in ``skip``: its fall is explained already) and metrics aside;
    - replies grown to the length cap since the first steps while a reward that pays for length rose: padding;
    - one reply to most of the latest step's prompts, among prompts whose references differ;
    - most replies repeating themselves (few distinct word 3-grams), or empty;
    - the training reward rising since the first steps while the goal (the rewards that say the answer is right)
      did not: the other rewards are what it learns.
    """
    metrics = stored_metrics(config)
    return [*_heldout_alerts(rows, heldout or []), *_goal_alerts(rows, config),
            *_metric_alerts(rows, heldout or [], metrics - skip),
            *_trade_off_alerts(rows, config, skip | metrics),
            *_padding_alerts(rows, config), *_reply_alerts(rollout)]


HELDOUT_FLAT = 0.02  # a held-out reward that gained less than this (on its own scale, at least 1) did not improve


def _heldout_alerts(rows: list[ProgressRow], heldout: list[HeldOutRow]) -> list[Alert]:
    checks = points(heldout, "reward")[-3:]
    if len(checks) < 3:
        return []
    (first, held_first), (last, held_last) = checks[0], checks[-1]
    trained_first, trained_last = _training_reward_at(rows, first), _training_reward_at(rows, last)
    if trained_first is None or trained_last is None or trained_last - trained_first < TRADE_OFF:
        return []
    if held_last - held_first >= HELDOUT_FLAT * max(1.0, abs(held_first)):
        return []
    went = "fell" if held_last < held_first - HELDOUT_FLAT * max(1.0, abs(held_first)) else "stayed"
    return [Alert("warn", f"The training reward rose from {trained_first:.2f} to {trained_last:.2f} between steps "
                  f"{first} and {last} while the held-out reward {went} at {held_last:.3f} (from {held_first:.3f})"
                  if went == "stayed" else
                  f"The training reward rose from {trained_first:.2f} to {trained_last:.2f} between steps {first} and "
                  f"{last} while the held-out reward fell from {held_first:.3f} to {held_last:.3f}",
                  "What the model learns pays on its training prompts but not on new ones: a loophole in a reward, or "
                  f"prompts it has learned by heart. Read the completions below (step {rows[-1].get('step')}); make "
                  "the reward check the answer itself, or train on more, and more varied, prompts.",
                  "heldout_gap", None, last, held_last)]


def _goal_alerts(rows: list[ProgressRow], config: dict) -> list[Alert]:
    """The training reward risen since the first WINDOW steps while the goal stayed where it was: what training
    learns is paid by the other rewards (a goal that fell is the trade-off and metric alerts'). A goal that never
    pays is said here too, beside the failing-reward alert: that one says the goal teaches nothing, this one what
    is learnt instead."""
    stored: list[Mapping[str, Any]] = [reward for reward in config.get("rewards") or [] if isinstance(reward, dict)]
    goal = goal_names(stored)
    trained = _first_and_last_means(rows, "reward")
    if len(goal) != 1 or trained is None or trained[1] - trained[0] < TRADE_OFF:
        return []
    (name,) = goal
    moved = _first_and_last_means(rows, reward_key(name))
    if moved is None or moved[1] - moved[0] >= HELDOUT_FLAT or moved[0] - moved[1] >= TRADE_OFF:
        return []
    others = [str(reward.get("name") or reward.get("kind")) for reward in stored if training_weight(reward) > 0]
    others = [other for other in others if other != name]
    step = rows[-1].get("step")
    return [Alert("warn", f"The training reward rose from {trained[0]:.2f} to {trained[1]:.2f} since the first "
                  f"{WINDOW} steps while your goal, '{name}', stayed at {moved[1]:.2f} (from {moved[0]:.2f})",
                  f"What training learns is paid by {', '.join(repr(other) for other in others) or 'other rewards'}, "
                  f"not by '{name}'. Read the completions below (step {step}): pay the other rewards only when "
                  f"'{name}' passes (Pays only when: {name}), or choose a goal this model can reach; Will it learn? "
                  "measures both before a run.", "goal_flat", reward_key(name), step, moved[1])]


def _metric_alerts(rows: list[ProgressRow], heldout: list[HeldOutRow], metrics: set[str]) -> list[Alert]:
    """A metric that falls while the training reward rises: what training optimises is not what the metric
    measures, the very gap a metric is there to show. Held-out checks are the stronger sign, so they come first."""
    alerts = []
    for name in sorted(metrics):
        fall = _metric_fall_heldout(rows, heldout, name) or _metric_fall_training(rows, name)
        if fall is None:
            continue
        where, (trained_before, trained_after), (before, after), step = fall
        alerts.append(Alert(
            "warn", f"The metric '{name}' fell from {before:.3f} to {after:.3f} {where} while the training reward rose "
            f"from {trained_before:.2f} to {trained_after:.2f}",
            f"Training is paid by rewards that no longer go with '{name}', which it never sees: a reward pays for "
            f"something other than what '{name}' measures (reward hacking). Read the completions below (step "
            f"{rows[-1].get('step')}); make the trained rewards check what '{name}' checks, or train on '{name}' "
            "itself.", "metric_falling", reward_key(name), step, after))
    return alerts


def _metric_fall_heldout(rows: list[ProgressRow], heldout: list[HeldOutRow], name: str):
    checks = points(heldout, reward_key(name))[-3:]
    if len(checks) < 3:
        return None
    (first, before), (last, after) = checks[0], checks[-1]
    start, end = _training_reward_at(rows, first), _training_reward_at(rows, last)
    if start is None or end is None or end - start < TRADE_OFF or before - after < TRADE_OFF:
        return None
    return f"in the held-out checks of steps {first} to {last}", (start, end), (before, after), last


def _metric_fall_training(rows: list[ProgressRow], name: str):
    metric, trained = _window_means(rows, reward_key(name)), _window_means(rows, "reward")
    if metric is None or trained is None or trained[1] - trained[0] < TRADE_OFF or metric[0] - metric[1] < TRADE_OFF:
        return None
    return (f"on the training prompts (the last {WINDOW} steps against the {WINDOW} before)", trained, metric,
            rows[-1].get("step"))


def _training_reward_at(rows: list[ProgressRow], step: int) -> float | None:
    """The training reward around ``step``: the mean of the WINDOW steps up to it (the first WINDOW for step 0, the
    starting model's check)."""
    near = [value for at, value in points(rows, "reward") if at <= step][-WINDOW:] if step else \
        [value for _, value in points(rows, "reward")[:WINDOW]]
    return statistics.fmean(near) if near else None


def _window_means(rows: list[ProgressRow], key: str) -> tuple[float, float] | None:
    """(mean of the WINDOW steps before the last WINDOW, mean of the last WINDOW) of a progress key."""
    _, values = series(rows[-2 * WINDOW:], key)
    known = _known(values)
    if known is None or len(known) < 2 * WINDOW:
        return None
    return statistics.fmean(known[:WINDOW]), statistics.fmean(known[WINDOW:])


def _trade_off_alerts(rows: list[ProgressRow], config: dict, skip: Set[str]) -> list[Alert]:
    moves = {name: means for name in reward_names_of(rows)
             if name not in skip and (means := _window_means(rows, reward_key(name)))}
    rising = sorted((after - before, name) for name, (before, after) in moves.items() if after - before >= TRADE_OFF)
    falling = sorted((after - before, name) for name, (before, after) in moves.items() if before - after >= TRADE_OFF)
    if not rising or not falling:
        return []
    (_, up), (_, down) = rising[-1], falling[0]
    step, now_up, now_down = rows[-1].get("step"), value_at(rows[-1], reward_key(up)), value_at(rows[-1], reward_key(down))
    weights = {r.get("name") or r.get("kind"): r.get("weight", 1.0) for r in config.get("rewards") or []
               if isinstance(r, dict)}
    weight = f" (now {weights[up]})" if up in weights else ""
    return [Alert("warn", f"'{up}' rose to {now_up:.3f} at step {step} while '{down}' fell to {now_down:.3f} (the last "
                  f"{WINDOW} steps against the {WINDOW} before: {up} {moves[up][0]:.2f} → {moves[up][1]:.2f}, {down} "
                  f"{moves[down][0]:.2f} → {moves[down][1]:.2f})",
                  f"The model may be earning '{up}' at the expense of '{down}': a loophole in '{up}' pays more than "
                  f"the task. Read the completions below (step {step}); if they game '{up}', lower its weight{weight} "
                  "or make it stricter, so that it pays only for what you want.",
                  "reward_trade_off", reward_key(up), step, now_up)]


def _padding_alerts(rows: list[ProgressRow], config: dict) -> list[Alert]:
    """Most replies now stop at the cap, unlike in the first WINDOW steps, while a length reward that pays for long
    replies (min_chars) rose: the model writes more to be paid for writing more."""
    paying = [str(r.get("name") or r.get("kind")) for r in config.get("rewards") or []
              if isinstance(r, dict) and r.get("kind") == "length" and r.get("min_chars")]
    clipped = _first_and_last_means(rows, "clipped_ratio")
    if not paying or clipped is None:
        return []
    early, late = clipped
    moved = {name: _first_and_last_means(rows, reward_key(name)) for name in paying}
    rose = [(name, *means) for name, means in moved.items() if means and means[1] - means[0] >= TRADE_OFF]
    if early >= CLIPPED_FRAC or late < CLIPPED_FRAC or not rose:
        return []
    name, before, after = rose[0]
    step, cap = rows[-1].get("step"), (config.get("grpo") or {}).get("max_new_tokens", "?")
    lengths = _first_and_last_means(rows, "completion_len")
    grew = f" from {lengths[0]:.0f} to {lengths[1]:.0f} tokens" if lengths else ""
    return [Alert("warn", f"Replies grew{grew} and {late:.0%} of them now stop at the cap of {cap} tokens (the last "
                  f"{WINDOW} steps; {early:.0%} in the first {WINDOW}), while '{name}', which pays for length, rose "
                  f"from {before:.2f} to {after:.2f}",
                  f"The model is padding its replies to earn '{name}' (reward hacking): read the completions below "
                  f"(step {step}). Pay for what you want rather than its length: give '{name}' a maximum instead "
                  "of a minimum, lower its weight, or check the working's shape with a format reward. A higher "
                  "max new tokens would only make room for more padding.",
                  "padding", "completion_len", step, late)]


def _first_and_last_means(rows: list[ProgressRow], key: str) -> tuple[float, float] | None:
    """(mean of the first WINDOW steps, mean of the last WINDOW) of a progress key: how far it moved in the run."""
    _, values = series(rows, key)
    first, last = _known(values[:WINDOW]), _known(values[-WINDOW:])
    if len(values) < 2 * WINDOW or first is None or last is None:
        return None
    return statistics.fmean(first), statistics.fmean(last)


def _tool_alerts(rows: list[ProgressRow], rollout: dict | None, grpo: dict) -> list[Alert]:
    """A tools run whose model does not use them, uses them wrongly, or never gets past them to an answer."""
    alerts = []
    steps, every_calls = series(rows[-WINDOW:], "tool_calls")
    calls = _known(every_calls) if len(every_calls) == WINDOW else None
    if calls is not None and max(calls) <= SAME:
        alerts.append(Alert("warn", f"No completion called a tool in the last {WINDOW} steps (to step {steps[-1]})",
                            "GRPO can only reinforce a call the model makes sometimes. Give each tool worked examples "
                            "(Tools: examples) so every prompt shows a call, raise the temperature, or pick a model "
                            "that was trained to call tools.", "tools_unused", "tool_calls", steps[-1], 0.0))
    _, every_failure = series(rows[-WINDOW:], "tool_failures")
    failures = _known(every_failure) if len(every_failure) == WINDOW else None
    if failures is not None and calls is not None and min(failures) >= 1 - SAME and min(calls) > SAME:
        alerts.append(Alert("warn", f"Every tool call failed in the last {WINDOW} steps (to step {steps[-1]})",
                            "Read a call and the tool's answer in the sampled groups below: the error says what was "
                            "wrong (an unknown tool name, missing arguments, arguments the tool cannot read). Show "
                            "the right call in a worked example, or try the tool with such arguments on the Rewards "
                            "tab.", "tool_failures", "tool_failures", steps[-1], 1.0))
    sampled = rollout or {}
    completions = [c for g in sampled.get("groups") or [] if isinstance(g, dict)
                   for c in g.get("completions") or [] if isinstance(c, dict)]
    stuck = sum(ends_calling(c) for c in completions)
    if completions and stuck / len(completions) >= MOST_REPLIES:
        rounds, tokens = grpo.get("max_tool_calling_iterations", "?"), grpo.get("max_new_tokens", "?")
        alerts.append(Alert("warn", f"{stuck} of {len(completions)} completions at step {sampled.get('step')} end in a "
                            "tool call, not an answer", "They run out of rounds or tokens before they answer, and the "
                            "rewards see no answer. Raise tool rounds per completion (now "
                            f"{rounds}) or max new tokens (now {tokens}; the tools' answers use them too), or show in "
                            "a worked example that the answer follows the call.", "no_final_answer", None,
                            sampled.get("step"), stuck / len(completions)))
    return alerts


def ends_calling(completion: dict) -> bool:
    """A completion whose turns end in a call or a tool's answer, so it gave no final answer."""
    turns = completion.get("turns")
    if not isinstance(turns, list) or not turns or not isinstance(turns[-1], dict):
        return False
    return turns[-1].get("role") == "tool" or bool(turns[-1].get("calls"))


def _reply_alerts(rollout: dict | None) -> list[Alert]:
    sampled = rollout or {}
    groups = [g for g in sampled.get("groups") or [] if isinstance(g, dict)]
    completions = [(g, c) for g in groups for c in g.get("completions") or [] if isinstance(c, dict)]
    replies = [(str(g.get("reference", "")), str(c.get("text", ""))) for g, c in completions]
    if not replies:
        return []
    step, total, alerts = sampled.get("step"), len(replies), []
    said = collections.Counter(" ".join(text.split()).lower() for _, text in replies)
    text, count = said.most_common(1)[0]
    references = {reference for reference, reply in replies if " ".join(reply.split()).lower() == text}
    if text and count / total >= MOST_REPLIES and len(references) > 1:
        shown = text if len(text) <= 60 else text[:57] + "…"
        alerts.append(Alert("warn", f"{count} of {total} completions at step {step} are the same reply, “{shown}”, to "
                            f"questions with {len(references)} different answers", "The model found one reply that "
                            "scores whatever the question (reward hacking). Read the completions below; make the reward "
                            "that pays for it check the answer against the reference (numeric, exact, math) instead of "
                            "a shape or a word that any reply can have.", "same_reply", None, step, count / total))
    repetitive = sum(_repeats_itself(reply) for _, reply in replies)
    if repetitive / total >= MOST_REPLIES:
        alerts.append(Alert("warn", f"{repetitive} of {total} completions at step {step} repeat themselves",
                            "Repeated phrases often earn a reward that counts words, numbers or length. Read the "
                            "completions below; pay for the answer rather than its length, lower the temperature or the "
                            "learning rate, or raise beta to keep the model nearer where it started.",
                            "repetition", None, step, repetitive / total))
    empty = sum(not reply.strip() and not ends_calling(c)  # those are _tool_alerts' no_final_answer
                for (_, reply), (_, c) in zip(replies, completions, strict=True))
    if empty / total >= MOST_REPLIES:
        alerts.append(Alert("warn", f"{empty} of {total} completions at step {step} are empty", "An empty reply costs "
                            "nothing and a length or format reward may pay for it. Read the completions below; give "
                            "empty replies no reward (a "
                            "reward that checks the answer does), or lower the weight of the length reward.",
                            "empty_replies", None, step, empty / total))
    return alerts


def _repeats_itself(text: str) -> bool:
    """Whether a reply is mostly the same few words again (its distinct word 3-grams at most REPEATED_DISTINCT of
    them): "85 85 85 85 85 85 85 85", or a sentence said three times."""
    words = text.lower().split()
    if len(words) < REPEATED_MIN_WORDS:
        return False
    trigrams = list(zip(words, words[1:], words[2:]))
    return len(set(trigrams)) <= REPEATED_DISTINCT * len(trigrams)
