"""The run directory: the contract between the trainer (writer) and the UI and CLI (readers).

Layout of ``runs/<id>/``::

    config.json      the validated RunConfig, verbatim
    status.json      state, step/total, timings (started_at: the first start; resumed_at: the latest resume),
                     ETA, hardware, error (rewritten atomically)
    log.txt          human-readable log of the run
    progress.jsonl   one row per optimiser step (reward, rewards: {<name>: mean}, kl, lengths, ...: ProgressRow)
    rollouts.jsonl   per step, the sampled groups with per-reward scores and advantages; prompts and references
                     as excerpts (``excerpt``: data/ has them whole), so a step's line stays small whatever the data
    sampling.json    the completions just sampled for the step being trained, before it is scored (rewritten each
                     time a batch is sampled), so the first step shows the model at work before it ends
    heldout.jsonl    the held-out reward during training: a row per check (step, reward, rewards, seconds) on a
                     fixed few held-out prompts; step 0 is the starting model on the same prompts
    data/            the exact train/eval split used, so resume and evaluation never re-split; dropped.json
                     lists the training rows the difficulty filter left out ({"row", "why"}), when it left out any
    checkpoints/     checkpoint-<step>/ with adapter, optimiser, scheduler and RNG state
    adapter/         the final LoRA adapter plus tokenizer (model/ instead for full fine-tuning)
    merged/          after a merge: the starting model with the adapter folded in
    gguf/            after a GGUF export: <id>-<precision>.gguf, and the Ollama Modelfile of the latest one
    eval.json        held-out reward before and after training, per reward
    samples.json     n_samples held-out prompts answered by both models
    stop.request     present while a stop has been asked for (seen by every training process)

JSON files are replaced atomically (temp file + rename) so a reader never sees half a file; JSONL files are only
appended to, one whole line per write, and readers ignore a trailing partial line.
"""

from __future__ import annotations

import json
import os
import re
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypedDict, Unpack, cast

from .system.disk import replaced_atomically

if TYPE_CHECKING:
    from .config import RunConfig

Row = dict[str, Any]  # a JSON object as a run's files hold it

ACTIVE_STATES = ("queued", "running")
RECORDED_TEXT_CHARS = 2_000  # of a prompt or a reference in rollouts.jsonl and sampling.json: more than a view shows


def excerpt(text: str | None, chars: int = RECORDED_TEXT_CHARS) -> str | None:
    """``text`` as a run's records keep it: whole up to ``chars`` characters, else its start and how much is left
    out. Every step writes its prompts and references again, and every view of the run reads them."""
    if text is None or len(text) <= chars:
        return text
    return f"{text[:chars]}… ({len(text) - chars:,} more characters)"


class Turn(TypedDict, total=False):
    """One message of a completion that called tools, as rollouts.jsonl and sampling.json keep it."""

    role: str  # "assistant": the model's text and calls (trained on); "tool": a tool's answer (not trained on)
    text: str | None
    calls: list[Row]  # assistant: each call's {"name", "arguments"}
    name: str  # tool: which tool answered


def recorded_turns(completion: object) -> list[Turn] | None:
    """A completion's turns when it called a tool (each text an excerpt), None for a one-message reply: the final
    answer is the last assistant turn, which the record's text already holds."""
    if not isinstance(completion, list) or not any(m.get("tool_calls") or m.get("role") == "tool"
                                                   for m in completion if isinstance(m, dict)):
        return None
    turns: list[Turn] = []
    for message in completion:
        content = message.get("content")
        text = excerpt(content if isinstance(content, str) else str(content or ""))
        if message.get("role") == "tool":
            turns.append({"role": "tool", "name": str(message.get("name", "")), "text": text})
        else:
            calls = [{"name": (call.get("function") or {}).get("name"),
                      "arguments": (call.get("function") or {}).get("arguments")}
                     for call in message.get("tool_calls") or []]
            turns.append({"role": "assistant", "text": text, "calls": calls})
    return turns
# How a person reads a state, where that differs from the stored value (which stays: status.json is a contract).
# "cancelled" sounded final, but a stopped run keeps its checkpoints and resumes from the latest.
STATE_LABELS = {"cancelled": "stopped — can resume"}


def state_label(state: str | None) -> str:
    """A run state as the UI and the CLI show it."""
    return STATE_LABELS.get(state or "", state or "unknown")


def format_seconds(seconds: float) -> str:
    """A run's time (elapsed, left, estimated) as the UI, the CLI and the model card show it."""
    if seconds < 0.1:
        return "under 0.1 s"
    if seconds < 10:
        return f"{seconds:.1f} s"
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def write_json_atomic(path: Path, data: Any) -> None:
    with replaced_atomically(path) as tmp, open(tmp, "w", encoding="utf-8") as fh:
        json.dump(data, fh, ensure_ascii=False, indent=1, allow_nan=False, default=str)


def read_json(path: Path, default: Any = None) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (FileNotFoundError, json.JSONDecodeError):
        return default


def append_jsonl(path: Path, row: Mapping[str, Any]) -> None:
    line = json.dumps(row, ensure_ascii=False, allow_nan=False, default=str) + "\n"
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(line)


def read_appended_rows(path: Path, start: int = 0) -> tuple[list[Row], int]:
    """Rows appended after byte offset ``start``, and the offset to pass next time (cheap polling for the UI).

    For the append-only logs a training writes while others read them (progress, rollouts): a line still being
    written is left for the next read. data.read_jsonl is the strict reader of whole files.
    """
    try:
        with open(path, "rb") as fh:
            fh.seek(start)
            data = fh.read()
    except FileNotFoundError:
        return [], start
    end = data.rfind(b"\n") + 1  # a line still being written is left for the next read
    rows = []
    for line in data[:end].splitlines():
        try:
            rows.append(json.loads(line))
        except ValueError:  # a damaged line (not JSON, or a number too long to read) is left out, not the file
            continue
    return rows, start + end


TAIL_CHUNK = 64 * 2**10


def read_last_appended_row(path: Path, start: int = 0) -> tuple[list[Row], int]:
    """The newest whole row appended after byte offset ``start`` (a list of none or one), and the offset to pass
    next time: read_appended_rows for a view that shows only the newest row. The file is read back from its end,
    TAIL_CHUNK at a time, so a long run's history costs nothing."""
    end = None  # where the newest whole line ends
    try:
        with open(path, "rb") as fh:
            position, tail = fh.seek(0, os.SEEK_END), b""
            while position > start:
                chunk_start = max(start, position - TAIL_CHUNK)
                fh.seek(chunk_start)
                tail = fh.read(position - chunk_start) + tail
                position = chunk_start
                whole = tail[:tail.rfind(b"\n") + 1]  # a line still being written is left for the next read
                if end is None and whole:
                    end = position + len(whole)
                lines = whole.splitlines()
                for line in reversed(lines[1:] if position > start else lines):  # the first may be cut
                    try:
                        return [json.loads(line)], start if end is None else end
                    except ValueError:  # a damaged or blank line: the one before it
                        continue
    except FileNotFoundError:
        pass
    return [], start if end is None else end


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def slug(text: str, empty: str = "run") -> str:
    """A name safe in a folder or file name (a run's folder, a downloaded config): other characters become "-"."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-.")[:48] or empty


class RunStatus(TypedDict, total=False):
    """status.json: what a run is doing and what it found; rewritten whole (update_status) and read by every tab and
    command. Each key is written by the training, the queue or the public demo's policy, as said."""

    state: str  # queued, running, succeeded, failed, cancelled (state_label says how a person reads it)
    phase: str  # what the state is doing now, in words ("loading the model", "step 3 of 10", ...)
    step: int
    total_steps: int | None  # None until the data is loaded
    eta_s: float
    elapsed_s: float
    created_at: float
    started_at: float  # the first start
    resumed_at: float  # the latest resume
    finished_at: float | None
    updated_at: float
    waiting: str | None  # "start" or "resume" while in the queue
    queued_at: float | None
    stop_reason: str | None  # why a run stopped by itself (the public time limit) or left the queue
    error: str | None  # on failure, the reason in plain words (None again on a resume)
    traceback: str | None  # and the traceback's tail
    pid: int | None  # the process that trains it, and its host: a run left running by a dead process reads as failed
    host: str
    owner: str | None  # a public demo's visitor who started it (a hash of their browser's token)
    owner_address: str | None  # a hash of the network address it came from
    seat: str | None  # in a class (studio.classroom), the name of the seat that started it
    device: str
    dtype: str
    cpu_threads: int
    gpu_name: str | None
    world_size: int
    hardware_reasons: list[str]
    model_label: str
    versions: dict[str, str | None]  # torch, TRL, transformers, PEFT, accelerate, gradio
    speedups: dict[str, Any]  # {"active": [...], "disabled": {name: why}}
    data_summary: str
    n_train: int
    n_eval: int
    n_skipped: int
    longest_prompt_tokens: int  # the longest prompt kept: a public demo's memory check of a resume reads it
    reward_names: list[str]
    reward: float | None  # the latest step's mean total
    reward_errors: dict[str, int]
    heldout_before: float | None
    heldout_after: float | None
    heldout_before_scores: dict[str, float]  # each reward's and metric's held-out mean, before and after training
    heldout_after_scores: dict[str, float]
    heldout_before_right: float | None  # the share of held-out replies that pass every goal reward
    heldout_after_right: float | None
    goal: list[str]  # the rewards that say the answer is right (rewards.goal_names)
    latest_checkpoint: str


# --- the rows of progress.jsonl and heldout.jsonl ---------------------------------------------------------------------
# Version 2 nests each reward's value under "rewards" (and its failures under "errors"), by the reward's name: version
# 1 stored them as reward_<name> beside TRL's reward_std, so a reward named "std" overwrote the spread. Version 1 runs
# still open everywhere: their rows are read into this shape (current_row).
RECORD_VERSION = 2
NESTED = ("rewards", "errors")  # a chart's key "rewards/<name>" is row["rewards"][name] (value_at)
_RENAMED = {"frac_reward_zero_std": "no_spread_share"}  # version 1 stored Dragon's share under TRL's metric's name


class ProgressRow(TypedDict, total=False):
    """One optimiser step, as RunStoreCallback writes it to progress.jsonl."""

    version: int
    step: int
    epoch: float
    elapsed_s: float
    eta_s: float
    loss: float | None
    lr: float | None
    kl: float | None
    reward: float | None  # the weighted total's mean, as TRL logs it
    reward_std: float | None  # TRL's spread of the totals over the whole step
    rewards: dict[str, float | None]  # each reward's mean, by name
    errors: dict[str, int]  # each reward's failed completions so far, by name
    completion_len: float | None
    clipped_ratio: float | None
    no_spread_share: float | None  # grpo_math.no_spread_share: groups whose totals do not differ
    step_time_s: float | None
    peak_gpu_mem_gb: float | None
    world_size: int
    completions_per_step: int
    reused_batch: bool  # num_iterations > 1: this step trained again on the last sampled batch
    tool_calls: float | None  # with tools: calls per completion (TRL's tools/call_frequency)
    tool_failures: float | None  # the share of those calls that failed (TRL's tools/failure_frequency)


class HeldOutRow(TypedDict, total=False):
    """One check of the held-out prompts during training, as HeldOutChecks writes it to heldout.jsonl."""

    version: int
    step: int
    reward: float | None
    rewards: dict[str, float | None]
    right: float | None  # the share of replies that pass every goal reward (rewards.goal_names)
    n_prompts: int
    of_prompts: int  # the held-out set's size: a check answers its first n_prompts
    seconds: float


def reward_key(name: str) -> str:
    """The key of a reward's value in a progress or held-out row, for value_at and the charts."""
    return f"rewards/{name}"


def errors_key(name: str) -> str:
    return f"errors/{name}"


def value_at(row: Mapping[str, Any], key: str) -> Any:
    """The row's value at ``key``: a top-level name, or "rewards/<name>" and "errors/<name>" inside their section."""
    section, _, name = key.partition("/")
    if name and section in NESTED:
        nested = row.get(section)
        return nested.get(name) if isinstance(nested, dict) else None
    return row.get(key)


def current_row(row: object) -> Row:
    """A progress or held-out row in this version's shape. A version 1 row's reward_<name> and errors_<name> move
    under "rewards" and "errors" (its reward_std stays TRL's: that version could not tell a reward named "std" from
    it), and its frac_reward_zero_std becomes no_spread_share."""
    if not isinstance(row, dict):
        return {}
    version = row.get("version", 1)
    if isinstance(version, int) and version >= RECORD_VERSION:
        return row
    upgraded: dict[str, Any] = {}
    nested: dict[str, Row] = {"rewards": {}, "errors": {}}
    for key, value in row.items():
        if key.startswith("reward_") and key != "reward_std":
            nested["rewards"][key.removeprefix("reward_")] = value
        elif key.startswith("errors_"):
            nested["errors"][key.removeprefix("errors_")] = value
        elif key not in nested:
            upgraded[_RENAMED.get(str(key), str(key))] = value
    return {**upgraded, **nested, "version": RECORD_VERSION}


def read_record_rows(path: Path, start: int = 0) -> tuple[list[Row], int]:
    """read_appended_rows for progress.jsonl and heldout.jsonl, each row in this version's shape; a row without a
    whole-number step (a damaged file) is left out: every chart and alert is drawn against the step."""
    rows, offset = read_appended_rows(path, start)
    rows = [current_row(row) for row in rows]
    return [row for row in rows if isinstance(row.get("step"), int) and not isinstance(row["step"], bool)], offset


class _InRun:
    """A path inside the run folder, as an attribute of RunDir: ``_InRun("data", "train.jsonl")``."""

    def __init__(self, *parts: str) -> None:
        self.parts = parts

    def __get__(self, run: RunDir, owner: type | None = None) -> Path:
        return run.path.joinpath(*self.parts)


@dataclass
class RunDir:
    """Paths and safe reads/writes for one run directory. Cheap to create; holds no open files.

    ``read_only`` is set on the non-main processes of a multi-process run: they read the shared directory but every
    write is skipped, so exactly one process writes it.
    """

    path: Path
    read_only: bool = False

    def __post_init__(self) -> None:
        self.path = Path(self.path).resolve()
        self._status_lock = threading.Lock()

    @classmethod
    def create(cls, runs_dir: Path, name: str) -> RunDir:
        runs_dir.mkdir(parents=True, exist_ok=True)
        base = f"{time.strftime('%Y%m%d-%H%M%S')}-{slug(name)}"
        for attempt in range(1, 1000):
            candidate = runs_dir / (base if attempt == 1 else f"{base}-{attempt}")
            try:
                candidate.mkdir()
            except FileExistsError:
                continue
            return cls(candidate)
        raise RuntimeError(f"could not create a run directory under {runs_dir}")

    # --- paths -------------------------------------------------------------------------------------------------
    @property
    def id(self) -> str:
        return self.path.name

    config_path = _InRun("config.json")
    status_path = _InRun("status.json")
    log_path = _InRun("log.txt")
    progress_path = _InRun("progress.jsonl")
    rollouts_path = _InRun("rollouts.jsonl")
    heldout_path = _InRun("heldout.jsonl")
    sampling_path = _InRun("sampling.json")
    data_dir = _InRun("data")
    train_data_path = _InRun("data", "train.jsonl")  # the mapped training examples
    eval_data_path = _InRun("data", "eval.jsonl")  # the held-out ones (empty when none)
    dropped_rows_path = _InRun("data", "dropped.json")  # rows the difficulty filter left out
    checkpoints_dir = _InRun("checkpoints")
    adapter_dir = _InRun("adapter")
    full_model_dir = _InRun("model")
    merged_dir = _InRun("merged")  # the adapter folded into its model (merge)
    gguf_dir = _InRun("gguf")  # the merged model as GGUF files, with the Ollama Modelfile of the latest (export-gguf)
    tensorboard_dir = _InRun("tensorboard")  # logging.report_to: [tensorboard]
    eval_path = _InRun("eval.json")
    samples_path = _InRun("samples.json")
    stop_request_path = _InRun("stop.request")

    # --- config ------------------------------------------------------------------------------------------------
    def write_config(self, config: RunConfig) -> None:
        if self.read_only:
            return
        write_json_atomic(self.config_path, config.to_dict())

    def read_config(self) -> RunConfig:
        """The run's settings, as they were checked when the run was prepared: nothing is refused here and no
        custom reward's code runs (whoever builds its rewards applies the policy then)."""
        from .config import RunConfig
        from .public import LAPTOP

        data = read_json(self.config_path)
        if data is None:
            from .errors import ConfigError

            raise ConfigError(f"{self.path} is not a run folder (it has no readable config.json).")
        return RunConfig.from_dict(data, policy=LAPTOP, load_code=False)

    # --- status ------------------------------------------------------------------------------------------------
    def read_status(self) -> RunStatus:
        """The status, with a run left "running" by a process that no longer exists reported (and saved) as failed.
        A run waiting in the queue belongs to no process until its turn comes."""
        status = self._saved_status()
        pid = status.get("pid")
        if (status.get("state") in ACTIVE_STATES and not status.get("waiting")
                and status.get("host") == socket.gethostname() and isinstance(pid, int) and not _pid_alive(pid)):
            status = self.update_status(state="failed", finished_at=time.time(),
                                        error="Interrupted: the process running this training stopped unexpectedly "
                                              "(closed, killed or out of memory). Resume continues from the latest checkpoint.")
        return status

    def update_status(self, **fields: Unpack[RunStatus]) -> RunStatus:
        """Set ``fields`` (keys of RunStatus only: status.json is a contract every reader relies on) and
        updated_at; the status as saved."""
        unknown = fields.keys() - RunStatus.__annotations__.keys()
        if unknown:
            raise TypeError(f"status.json has no {', '.join(sorted(unknown))}: add it to RunStatus first")
        if self.read_only:
            return self._saved_status()
        with self._status_lock:
            status = self._saved_status()
            status.update(fields)
            status["updated_at"] = time.time()
            write_json_atomic(self.status_path, status)
            return status

    def _saved_status(self) -> RunStatus:
        return cast(RunStatus, read_json(self.status_path, default={}) or {})

    def mark_owner(self, pid: int | None = None) -> None:
        """Record which process owns the run (this one, or ``pid``: the training process it was handed to), so
        readers can tell a live run from an abandoned one."""
        self.update_status(pid=pid or os.getpid(), host=socket.gethostname())

    # --- progress and rollouts ---------------------------------------------------------------------------------
    def append_progress(self, row: ProgressRow) -> None:
        if not self.read_only:
            append_jsonl(self.progress_path, {"version": RECORD_VERSION, **row})

    def append_rollouts(self, row: Row) -> None:
        if not self.read_only:
            append_jsonl(self.rollouts_path, row)

    def append_heldout(self, row: HeldOutRow) -> None:
        if not self.read_only:
            append_jsonl(self.heldout_path, {"version": RECORD_VERSION, **row})

    def write_sampling(self, batch: Row) -> None:
        if not self.read_only:
            write_json_atomic(self.sampling_path, batch)

    def read_sampling(self) -> Row | None:
        batch: Row | None = read_json(self.sampling_path, default=None)
        return batch

    def read_progress(self) -> list[ProgressRow]:
        return cast(list[ProgressRow], read_record_rows(self.progress_path)[0])

    def read_heldout(self) -> list[HeldOutRow]:
        return cast(list[HeldOutRow], read_record_rows(self.heldout_path)[0])

    def read_rollouts(self) -> list[Row]:
        return read_appended_rows(self.rollouts_path)[0]

    def truncate_after_step(self, step: int) -> None:
        """Drop rows newer than ``step`` (the checkpoint a resume starts from), so the history has no duplicate steps."""
        if self.read_only:
            return
        for path in (self.progress_path, self.rollouts_path, self.heldout_path):
            rows, _ = read_appended_rows(path)  # none where the file is missing: nothing to rewrite
            kept = [row for row in rows if row.get("step", 0) <= step]
            if len(kept) != len(rows):
                with replaced_atomically(path) as tmp, open(tmp, "w", encoding="utf-8") as fh:
                    fh.writelines(json.dumps(row, ensure_ascii=False) + "\n" for row in kept)

    # --- checkpoints, weights, stop ----------------------------------------------------------------------------
    def checkpoints(self) -> list[Path]:
        found = [p for p in self.checkpoints_dir.glob("checkpoint-*") if p.name.split("-")[-1].isdigit()
                 and (p / "trainer_state.json").is_file()]  # written last by transformers: a complete checkpoint
        return sorted(found, key=lambda p: int(p.name.split("-")[-1]))

    def latest_checkpoint(self) -> Path | None:
        found = self.checkpoints()
        return found[-1] if found else None

    def has_final_weights(self) -> bool:
        return (self.adapter_dir / "adapter_config.json").is_file() or (self.full_model_dir / "config.json").is_file()

    def request_stop(self) -> None:
        self.stop_request_path.write_text(time.strftime("%Y-%m-%d %H:%M:%S"), encoding="utf-8")

    def stop_requested(self) -> bool:
        return self.stop_request_path.exists()

    def clear_stop_request(self) -> None:
        if self.read_only:
            return
        self.stop_request_path.unlink(missing_ok=True)

    # --- evaluation and log ------------------------------------------------------------------------------------
    def read_eval(self) -> Row:
        found: Row = read_json(self.eval_path, default={}) or {}
        return found

    def read_samples(self) -> list[Row]:
        found: list[Row] = read_json(self.samples_path, default=[]) or []
        return found

    def log_tail(self, max_chars: int = 20_000) -> str:
        try:
            with open(self.log_path, "rb") as fh:
                fh.seek(max(0, fh.seek(0, os.SEEK_END) - max_chars))
                return fh.read().decode("utf-8", errors="replace")
        except FileNotFoundError:
            return ""


def _completions_per_step(config: Row) -> int | None:
    """RunConfig.completions_per_step, read from a config.json as written (None where it cannot be)."""
    training, grpo = config.get("training") or {}, config.get("grpo") or {}
    try:
        return int(training["batch_size"]) * int(grpo["group_size"]) * int(training.get("grad_accum", 1))
    except (KeyError, TypeError, ValueError):
        return None


def list_runs(runs_dir: Path) -> list[Row]:
    """One summary per run folder, newest first: what ``python -m dragon_ui runs`` and the UI's run list show."""
    if not runs_dir.is_dir():
        return []
    summaries = []
    for path in sorted((p for p in runs_dir.iterdir() if (p / "config.json").is_file()), reverse=True):
        run = RunDir(path)
        status = run.read_status()
        config = read_json(run.config_path, default={}) or {}
        summaries.append({
            "id": run.id, "dir": str(run.path), "state": status.get("state", "unknown"),
            "step": status.get("step", 0), "total_steps": status.get("total_steps"),
            "reward": status.get("reward"), "heldout_before": status.get("heldout_before"),
            "heldout_after": status.get("heldout_after"),
            "heldout_before_scores": status.get("heldout_before_scores"),
            "heldout_after_scores": status.get("heldout_after_scores"),
            "heldout_before_right": status.get("heldout_before_right"),
            "heldout_after_right": status.get("heldout_after_right"), "goal": status.get("goal") or [],
            "model": (config.get("model") or {}).get("id", ""), "started_at": status.get("started_at"),
            "completions_per_step": _completions_per_step(config),
            "name": config.get("name") or "", "data": (config.get("data") or {}).get("source") or "",
            "elapsed_s": status.get("elapsed_s"),
            "error": status.get("error"), "owner": status.get("owner"), "address": status.get("owner_address"),
            "seat": status.get("seat"),
            "waiting": status.get("waiting"),
            "queued_at": status.get("queued_at"),
        })
    return summaries
