"""Load a table of examples (local file or Hub dataset) and turn it into chat prompts for GRPO.

The user points ``data.source`` at a file or a Hub dataset and says how to build the prompt (a column
name or a template such as ``"Q: {question}"``), optionally a reference answer and a system message.
Every column of a row also travels to the reward functions as text, in the ``row`` JSON field, so rewards
can check any column, mapped or not.

Errors are :class:`ConfigError` with one sentence naming the setting and the fix, because the people who
read them are workshop participants, not Python programmers.  This module must stay free of gradio and
torch; ``datasets`` is imported only when a Hub dataset is actually requested.
"""

import contextlib
import json
import math
import os
import random
import re
import string
import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import TypeGuard

import pandas as pd

from .. import ASSETS_DIR
from ..chat import last_user_text
from ..errors import ConfigError, check_length, check_seed, first_line
from ..public import LIFT, Policy
from ..settings import setting
from ..system.disk import replaced_atomically
from ..system.processes import run_apart, runs_apart
from .tables import (SPREADSHEET_EXTENSIONS, SUPPORTED_EXTENSIONS, Table, check_columns, read_file,
                              read_json_lines)

BUNDLED_DATASETS_DIR = ASSETS_DIR / "datasets"

# Fewer usable rows than this and nothing is held out: every example is needed for training.
MIN_ROWS_FOR_EVAL = 20
# However small eval_frac is, this many prompts are held out (fewer would make the before/after comparison noise),
# but never more than a fifth of the rows, so small data still trains on the other four fifths.
MIN_HELD_OUT = 10
TEMPLATE_CHARS = 10_000  # a prompt, reference or system template (with its fixed text) may be this long
MOST_PASS_RATES = 100_000  # rows of data.pass_rates: far more than a pre-flight measures (at most 256 a time)
SETTING_CHARS = 1000  # the source, and the Hub config, split and sheet names
# A public demo hands the app at most this many times its upload limit of rows, from a file or a Hub dataset.
UNPACKED_TIMES_UPLOAD = 10


_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*$")
_FILE_EXTENSION = re.compile(r"\.[A-Za-z]+$")


@dataclass
class DataConfig:
    """Where the examples come from and how a row becomes a prompt; part of the saved run config."""

    source: str = setting("", label="Data source", help=(
        "A CSV, TSV, JSONL, JSON, Parquet or spreadsheet (`.xlsx`, `.xlsm`, `.xls`, `.ods`) file, or a Hugging "
        "Face dataset id like `openai/gsm8k`."), see="[Reading files](#reading-files)")
    prompt: str = setting("", label="Prompt", help=(
        "A column, or a template with columns in braces such as `Q: {question}`."))
    reference: str | None = setting(None, label="Reference answer", help=(
        "A column or template the rewards compare replies with (e.g. the correct answer); may stay empty."))
    system: str | None = setting(None, label="System message", help=(
        "Fixed text, a column or a template; may stay empty."))
    hub_config: str | None = setting(None, label="Hub config", help="Which configuration of a Hub dataset to read.")
    hub_split: str = setting("train", label="Hub split", help="Which split of a Hub dataset to read.")
    eval_frac: float = setting(0.05, label="Held-out fraction", help=(
        "The share of rows kept aside to compare the model before and after training: at least 10 rows (a fifth of "
        "the rows when 10 would be more); none under 20 rows or at 0."))
    seed: int = setting(42, label="Split seed", help="The seed of the held-out split.")
    max_rows: int | None = setting(None, label="Max rows", help="Train on the first rows only; empty: all of them.")
    sheet: str | None = setting(None, label="Sheet", help="Which sheet of a spreadsheet to read; empty: the first.")
    max_prompt_tokens: int | None = setting(None, label="Longest prompt (tokens)", help=(
        "Prompts longer than this many tokens (chat template included) are dropped and counted; empty: 512 on the "
        "CPU, the model's context elsewhere. A prompt that with max new tokens overflows the model's context is "
        "dropped too."))
    pass_rates: dict[str, float] | None = setting(None, label="Pre-flight pass rates", help=(
        "Row number (in the file) → the share of its sampled replies that passed in a pre-flight; the difficulty "
        "filter keeps a training row whose rate lies from `data.min_pass_rate` to `data.max_pass_rate`. The "
        "pre-flight's fix *Drop the prompts that all fail or all pass* writes it; rows not measured are kept."),
        see="[Will it learn? The pre-flight](#will-it-learn-the-pre-flight)")
    environment_column: str | None = setting(None, label="Environment column", help=(
        "With two or more environments among the tools: the column whose value, in each row, is the name of the "
        "environment that row plays."), see="[Environments](#environments)")
    min_pass_rate: float = setting(0.0, label="Lowest pass rate kept", help=(
        "Training rows whose pre-flight pass rate is below this are dropped (0.01: those where every reply "
        "failed, too hard to learn from)."))
    max_pass_rate: float = setting(1.0, label="Highest pass rate kept", help=(
        "Training rows whose pre-flight pass rate is above this are dropped (0.99: those where every reply passed, "
        "nothing left to learn)."))

    def validate(self, where: str = "data") -> None:
        """Check the settings that make sense without reading the data; raises ConfigError."""
        for name in ("source", "hub_config", "hub_split", "sheet"):
            check_length(f"{where}.{name}", getattr(self, name), SETTING_CHARS)
        if not isinstance(self.source, str) or not self.source.strip():
            raise ConfigError(
                f"{where}.source is empty; choose a bundled dataset, a CSV/JSONL/Parquet file, "
                "or a Hub dataset id like 'openai/gsm8k'."
            )
        if not isinstance(self.hub_split, str) or not self.hub_split.strip():
            raise ConfigError(f"{where}.hub_split is empty; most Hub datasets have a split called 'train'.")
        if self.hub_config is not None and not isinstance(self.hub_config, str):
            raise ConfigError(f"{where}.hub_config must be text such as 'main', or empty.")
        if self.sheet is not None and (not isinstance(self.sheet, str) or not self.sheet.strip()):
            raise ConfigError(f"{where}.sheet must be the name of a sheet of the spreadsheet, or empty for the "
                              "first one.")
        self._check_mapping_settings(where)

    def _check_mapping_settings(self, where: str, columns: list[str] | None = None) -> None:
        """The subset of validate() that map_rows needs; it does not care where the rows came from. With the
        data's ``columns`` known, a missing prompt suggests them."""
        if not isinstance(self.prompt, str) or not self.prompt.strip():
            if columns:
                raise ConfigError(f"{where}.prompt is empty; choose the column that holds the prompts (one of: "
                                  f"{', '.join(columns)}) or a template such as 'Q: {{{columns[0]}}}'.")
            raise ConfigError(f"{where}.prompt is empty; give the name of the column that holds the prompts, or a "
                              "template with column names in braces such as 'Q: {question}'.")
        for name in ("reference", "system"):
            if getattr(self, name) is not None and not isinstance(getattr(self, name), str):
                raise ConfigError(f"{where}.{name} must be text (a column name or a template), or empty.")
        for name in ("prompt", "reference", "system"):
            check_length(f"{where}.{name}", getattr(self, name), TEMPLATE_CHARS)
        column = self.environment_column
        if column == "":  # an empty box: no column
            self.environment_column = column = None
        if column is not None and (not isinstance(column, str) or not column.strip()):
            raise ConfigError(f"{where}.environment_column must be the name of a column, or empty.")
        check_length(f"{where}.environment_column", column, SETTING_CHARS)
        frac = self.eval_frac
        if isinstance(frac, bool) or not isinstance(frac, int | float) or not 0 <= frac <= 0.5:
            raise ConfigError(
                f"{where}.eval_frac must be a number from 0 to 0.5 (the share of rows held out), got {frac!r}."
            )
        check_seed(f"{where}.seed", self.seed)
        tokens = self.max_prompt_tokens
        if tokens is not None and (isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 1):
            raise ConfigError(f"{where}.max_prompt_tokens must be a whole number of at least 1, or empty for the "
                              f"default (512 on the CPU, the model's context elsewhere), got {tokens!r}.")
        rows = self.max_rows
        if rows is not None and (isinstance(rows, bool) or not isinstance(rows, int) or rows < 1):
            raise ConfigError(
                f"{where}.max_rows must be a whole number of at least 1, or empty to use all rows, got {rows!r}."
            )
        self._check_difficulty(where)

    def _check_difficulty(self, where: str) -> None:
        for name in ("min_pass_rate", "max_pass_rate"):
            if not _is_share(rate := getattr(self, name)):
                raise ConfigError(f"{where}.{name} must be a share from 0 to 1, got {rate!r}.")
        if self.min_pass_rate > self.max_pass_rate:
            raise ConfigError(f"{where}.min_pass_rate ({self.min_pass_rate:g}) is above {where}.max_pass_rate "
                              f"({self.max_pass_rate:g}), so every measured row would be dropped.")
        rates = self.pass_rates
        if rates is None:
            return
        if not isinstance(rates, dict) or len(rates) > MOST_PASS_RATES:
            raise ConfigError(f"{where}.pass_rates must map at most {MOST_PASS_RATES:,} row numbers to pass rates, "
                              "as the pre-flight writes them.")
        for row, rate in rates.items():
            if not isinstance(row, str) or not row.isascii() or not row.isdigit() or int(row) < 1 or len(row) > 9:
                raise ConfigError(f"{where}.pass_rates: {_shown(row)} is not a row number (1, 2, 3, …).")
            if not _is_share(rate):
                raise ConfigError(f"{where}.pass_rates[{row}] must be a share from 0 to 1, got {_shown(rate)}.")

    def keeps_rate(self, rate: float) -> bool:
        """Whether the difficulty filter keeps a row whose pre-flight pass rate is ``rate``: the one rule that
        training, the pre-flight's drop fix and the Data tab's sentence all apply."""
        return self.min_pass_rate <= rate <= self.max_pass_rate

    def dropped_because(self, row_number: int) -> str | None:
        """Why the difficulty filter drops the training row ``row_number`` (its pre-flight pass rate is outside the
        range kept), or None when it keeps it (a row the pre-flight did not measure is kept)."""
        rate = (self.pass_rates or {}).get(str(row_number))
        if rate is None or self.keeps_rate(rate):
            return None
        side = "below" if rate < self.min_pass_rate else "above"
        bound = self.min_pass_rate if side == "below" else self.max_pass_rate
        what = " (every reply failed)" if rate == 0 else " (every reply passed)" if rate == 1 else ""
        return f"its pre-flight pass rate {rate:.0%}{what} is {side} {bound:g}"


@dataclass
class MappedData:
    """Training and held-out examples, ready for TRL, plus the counts shown to the user."""

    train: list[dict]
    eval: list[dict]
    n_rows: int
    n_skipped: int
    columns: list[str]
    eval_frac: float = 0.0
    notes: list[str] = dataclasses.field(default_factory=list)  # how the file was read (tables.Table.notes)
    held_out_limit: int | None = None  # a public demo's limit of held-out prompts; None: no limit
    dropped: list[dict] = dataclasses.field(default_factory=list)  # {"row", "why"}: training rows the filter dropped

    def summary(self) -> str:
        """One line for the UI and the run log, e.g. '400 rows: 380 for training, 20 held out, 0 skipped. Read
        as Windows-1252.'."""
        rows = f"{self.n_rows} row" + ("" if self.n_rows == 1 else "s")
        counts = f"{rows}: {len(self.train)} for training, {len(self.eval)} held out, {self.n_skipped} skipped."
        filtered = (f"{len(self.dropped)} training row{'s were' if len(self.dropped) > 1 else ' was'} dropped by "
                    "the difficulty filter (the pre-flight's pass rates).") if self.dropped else ""
        return " ".join(filter(None, [counts, filtered, self.held_out_reason(), *self.notes]))

    def held_out_reason(self) -> str:
        """Why more rows are held out than eval_frac asks for, or '' when they are not."""
        usable = len(self.train) + len(self.eval)
        asked = round(usable * self.eval_frac)
        if len(self.eval) < asked and len(self.eval) == self.held_out_limit:
            return (f"Only {len(self.eval)} rows are held out, this public demo's limit of held-out prompts scored "
                    f"before and after ({asked} asked for).")
        if len(self.eval) <= asked:
            return ""
        share = f"{self.eval_frac * 100:g}%"
        return (f"{len(self.eval)} rows are held out for the before/after comparison ({share} would be "
                + ("none)." if asked == 0 else f"only {asked}, too few to compare)."))


# --------------------------------------------------------------------------------------------- loading


def is_hub_dataset_id(source: str, look_on_disk: bool = True) -> bool:
    """True for 'owner/name' strings that do not end like a file name (and, looking on disk, are no local path).

    Any letters-only extension (.csv, but also .xlsx or .txt) means a file, so a mistyped file name gets
    "no file at ..." instead of a puzzling Hub download attempt; Hub names like 'org/data-v1.2' still pass.
    """
    source = source.strip()
    shaped = bool(_HUB_ID.match(source)) and not _FILE_EXTENSION.search(source)
    return shaped and not (look_on_disk and Path(source).exists())


def bundled_datasets() -> list[Path]:
    """The example datasets shipped in dragon_ui/assets/datasets."""
    return [path for path in sorted(BUNDLED_DATASETS_DIR.iterdir()) if path.suffix.lower() in SUPPORTED_EXTENSIONS]


@dataclass(frozen=True)
class HubDataset:
    """A data source that names a dataset on the Hugging Face Hub (``owner/name``)."""

    id: str


def locate(source: str, base_dir: str | None = None, *, policy: Policy) -> Path | HubDataset:
    """Where ``source`` is read from: a local file (looked up in the current folder, then ``base_dir``, the folder
    of the config file, so a config and its data can be moved together), or a Hub dataset.

    In a public demo the text alone decides, and nothing on the disk is looked at first: an ``owner/name`` text is
    a Hub dataset, anything else must be a bundled dataset or one of this visitor's uploads (``base_dir`` plays no
    part, since a visitor could send any); every other source is refused with a ConfigError.
    """
    source = source.strip()
    if policy.public:
        if is_hub_dataset_id(source, look_on_disk=False):
            return HubDataset(source)
        path = _as_absolute(source)
        if is_bundled(source) or policy.is_own_upload(path):
            return path
        raise ConfigError("data.source must be one of the bundled datasets, a file you upload here, or a Hub dataset "
                          f"id like openai/gsm8k: this public demo reads no other files on the server ({LIFT} to use "
                          "any file).")
    candidates = _candidate_paths(source, base_dir)
    found = next((path for path in candidates if path.exists()), None)
    if found is None and is_hub_dataset_id(source, look_on_disk=False):
        return HubDataset(source)
    return (found or candidates[0]).resolve()


def _as_absolute(source: str) -> Path:
    """A path text made absolute by its text alone: no symlink or other file on the disk is looked at."""
    return Path(os.path.normpath(os.path.abspath(source.strip())))


def is_bundled(source: str) -> bool:
    """Whether ``source`` names one of the bundled datasets (by its text alone)."""
    return _as_absolute(source) in {_as_absolute(str(path)) for path in bundled_datasets()}


def _candidate_paths(source: str, base_dir: str | None) -> list[Path]:
    candidates = [Path(source.strip()).expanduser()]
    if base_dir is not None and not candidates[0].is_absolute():
        candidates.append(Path(base_dir) / candidates[0])
    return candidates


def rows_to_read(max_rows: int | None, *, policy: Policy) -> int | None:
    """How many rows to read at most: the rows asked for (``data.max_rows``); in a public demo one more than its
    limit whatever is asked (enough to tell that a file has too many, and the same read for every Max rows, so a
    visitor cannot make the app read a file again and again)."""
    return policy.limits.dataset_rows + 1 if policy.limits else max_rows


def read_table(source: str, hub_config=None, hub_split="train", base_dir: str | None = None,
               sheet: str | None = None, max_rows: int | None = None, *, policy: Policy) -> Table:
    """Read the rows of a local file (``sheet`` of a spreadsheet) or a Hub dataset, and what reading them took: the
    first ``max_rows`` (and, in a public demo, never more than one past its row limit).

    A public demo reads only what :func:`locate` allows, and a Hub id from the Hub alone.
    """
    place = locate(source, base_dir, policy=policy)
    limit = rows_to_read(max_rows, policy=policy)
    if isinstance(place, HubDataset):
        return Table(_load_hub(place.id, hub_config, hub_split, limit, policy=policy))
    if not place.exists():
        tried = " or ".join(str(p.absolute()) for p in _candidate_paths(source, base_dir))
        raise ConfigError(f"data.source: no file at {tried}.")
    if place.is_dir():
        raise ConfigError(f"data.source: {place} is a folder; point it at a single data file inside it.")
    suffix = place.suffix.lower()
    if suffix not in SUPPORTED_EXTENSIONS:
        raise ConfigError(
            f"data.source: {place.name} has the unsupported file type '{suffix or '(none)'}'; "
            f"use one of {', '.join(SUPPORTED_EXTENSIONS)}."
        )
    if sheet is not None and suffix not in SPREADSHEET_EXTENSIONS:
        raise ConfigError(f"data.sheet is only for spreadsheets ({', '.join(SPREADSHEET_EXTENSIONS)}); "
                          f"{place.name} has no sheets, so leave it empty.")
    # None on a laptop, which reads any file whole, in its own process; and for the bundled datasets, the app's own
    # small files, which every first page shows and which never wait for a visitor's read (system/processes.py).
    limits = None if is_bundled(str(place)) else policy.limits
    try:
        table = (read_file(place, sheet, limit) if limits is None else
                 read_file(place, sheet, limit, limits.upload_mb * UNPACKED_TIMES_UPLOAD, limits.columns,
                           limits.text_chars))
    except OSError as exc:
        raise ConfigError(f"data.source: {place} could not be read ({exc.strerror or exc}).") from None
    if not table.rows:
        raise ConfigError(f"data.source: {place.name} has no rows.")
    return table


def _load_hub(source: str, hub_config: str | None, hub_split: str, max_rows: int | None,
              *, policy: Policy) -> list[dict]:
    """The rows of a Hub dataset split (the first ``max_rows``). A public demo streams them in a separate process
    with limits on its memory and time (stream_hub_rows, system/processes.py)."""
    limits = policy.limits
    if limits is not None:
        arguments = {"source": source, "hub_config": hub_config, "hub_split": hub_split, "max_rows": max_rows,
                     "limit_bytes": int(limits.upload_mb * 2**20), "max_columns": limits.columns}
        rows = run_apart(stream_hub_rows, arguments, int(limits.upload_mb * UNPACKED_TIMES_UPLOAD * 2**20),
                         f"the Hub dataset '{source}'")
    else:
        import datasets  # heavy, and only needed for Hub sources

        with _hub_errors(source, hub_config, hub_split):
            dataset = datasets.load_dataset(source, name=hub_config, split=hub_split)
            if max_rows is not None and max_rows < len(dataset):
                dataset = dataset.select(range(max_rows))
            rows = dataset.to_list()
    if not rows:
        raise ConfigError(f"data.source: the split '{hub_split}' of the Hub dataset '{source}' has no rows.")
    return rows


@runs_apart
def stream_hub_rows(source: str, hub_config: str | None, hub_split: str, max_rows: int | None,
                    limit_bytes: int, max_columns: int | None = None) -> list[dict]:
    """A public demo's Hub rows, read in its reading process: streamed, so nothing past the row and size limits is
    downloaded; through an ``hf://datasets/`` path, which ``datasets`` never looks up on the disk (a bare
    ``owner/name`` that is also a folder, such as ``runs/<id>``, would be loaded from that folder); and with
    ``token=False``, so the server's own token never reaches a private or gated dataset for a visitor."""
    import datasets

    rows: list[dict] = []
    size = 0
    with _hub_errors(source, hub_config, hub_split):
        stream = datasets.load_dataset(f"hf://datasets/{source}", name=hub_config, split=hub_split, streaming=True,
                                       token=False)
        for row in stream:
            size += len(json.dumps(row, ensure_ascii=False, default=str))
            if size > limit_bytes:
                raise ConfigError(f"data.source: the first {len(rows):,} rows of the Hub dataset '{source}' already "
                                  f"hold more than this public demo's limit of {limit_bytes / 2**20:g} MB of data; set "
                                  f"data.max_rows lower, or {LIFT}.")
            rows.append(row)
            if max_rows is not None and len(rows) >= max_rows:
                break
    check_columns(rows, max_columns, f"the Hub dataset '{source}'")
    return rows


@contextlib.contextmanager
def _hub_errors(source: str, hub_config: str | None, hub_split: str):
    """Any failure of a Hub load as one sentence; offline is the common workshop case, so it gets its own advice."""
    try:
        yield
    except (ConfigError, MemoryError):  # too big is the reading process's to report (system/processes.py)
        raise
    except Exception as exc:
        if _is_network_error(exc):
            raise ConfigError(
                f"data.source: the Hugging Face Hub could not be reached to load '{source}'; "
                "download the data as a CSV, JSONL or Parquet file and set data.source to that file."
            ) from None
        detail = f"config {hub_config!r}, " if hub_config else ""
        raise ConfigError(
            f"data.source: could not load the Hub dataset '{source}' ({detail}split '{hub_split}'): {first_line(exc)}"
        ) from None


def _is_network_error(exc: BaseException | None) -> bool:
    """datasets/huggingface_hub signal 'offline' or 'unreachable' as (a cause chain ending in) a ConnectionError."""
    while exc is not None:
        if isinstance(exc, ConnectionError | TimeoutError):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def columns_of(rows: list[dict]) -> list[str]:
    """All column names in first-seen order; JSON rows need not all have the same keys."""
    return list(dict.fromkeys(key for row in rows for key in row))


# --------------------------------------------------------------------------------------------- mapping


def _is_missing(value) -> bool:
    """Nulls from any source (JSON null, pandas NA/NaN/NaT) mean 'no value', not the text 'nan'."""
    return value is None or value is pd.NA or value is pd.NaT or (isinstance(value, float) and math.isnan(value))


def _to_text(value) -> str:
    """Scalars as the text a person would write: 85 and 85.0 -> '85', True -> 'true' (as in JSON)."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _format_columns(columns: list[str], limit: int = 20) -> str:
    """Column list for error messages, cut short so wide Hub datasets still give a readable sentence."""
    shown = ", ".join(columns[:limit])
    return shown + (f" and {len(columns) - limit} more" if len(columns) > limit else "")


class _Mapping:
    """How one setting (prompt, reference or system) turns a row's text fields into a string."""

    def __init__(self, label: str, text: str, columns: list[str], constant_allowed: bool):
        self.label = label
        self.column: str | None = None
        self.pieces: list[tuple[str, str | None]] = []  # (literal text, column or None)
        # A stray space pasted around a column name is invisible in the UI, so it still counts as that column.
        name = text if text in columns else text.strip()
        if name in columns:
            self.column = name
            return
        try:
            parsed = list(string.Formatter().parse(text))
        except ValueError:
            raise ConfigError(
                f"{label} has an unmatched '{{' or '}}'; write '{{{{' or '}}}}' for a literal brace."
            ) from None
        for literal, field, spec, conversion in parsed:
            if field is None:
                self.pieces.append((literal, None))
                continue
            # The whole text between the braces is the column name, so '{a.b}' or '{x:y}' name columns literally.
            name = field + (f"!{conversion}" if conversion else "") + (f":{spec}" if spec else "")
            if name not in columns:
                # Braces around something that is no plausible column name are most likely meant literally (JSON).
                brace_hint = "" if re.fullmatch(r"[\w .-]+", name) else "; write '{{' or '}}' for a literal brace"
                raise ConfigError(
                    f"{label} uses the column '{name}' in its template, but the file has no such column; "
                    f"its columns are: {_format_columns(columns)}{brace_hint}."
                )
            self.pieces.append((literal, name))
        if not constant_allowed and not self.used_columns:
            raise ConfigError(
                f"{label} '{text}' is neither a column of the file nor a template with {{column}} placeholders; "
                f"columns are: {_format_columns(columns)}."
            )

    @property
    def used_columns(self) -> list[str]:
        if self.column is not None:
            return [self.column]
        return [name for _, name in self.pieces if name is not None]

    def render(self, fields: dict[str, str]) -> str:
        if self.column is not None:
            return fields.get(self.column, "")
        return "".join(literal + (fields.get(name, "") if name is not None else "") for literal, name in self.pieces)


def _row_fields(row: dict, number: int, mapped: dict[str, str]) -> dict[str, str]:
    """Every non-missing value as text; lists/dicts become JSON text unless a mapping needs real text."""
    fields = {}
    for key, value in row.items():
        if _is_missing(value):
            continue
        if isinstance(value, list | tuple | dict):
            if key in mapped:
                kind = "dict" if isinstance(value, dict) else "list"
                raise ConfigError(
                    f"{mapped[key]} uses the column '{key}', but row {number} holds a {kind} there "
                    "instead of text or a number."
                )
            fields[str(key)] = json.dumps(value, ensure_ascii=False, default=str)
        else:
            fields[str(key)] = _to_text(value)
    return fields


def map_rows(rows: list[dict], config: DataConfig, *, policy: Policy, first_row: int = 1) -> MappedData:
    """Turn raw rows into chat-format examples and split off a seeded, reproducible held-out set (within
    ``policy``'s limits of rows and held-out prompts). ``first_row``: the row of the file ``rows`` start at, which
    numbers the examples and the messages."""
    config._check_mapping_settings("data", columns_of(rows))
    rows = rows[: config.max_rows] if config.max_rows is not None else rows
    if not rows:
        raise ConfigError("data.source: the dataset has no rows.")
    limit = policy.limits.dataset_rows if policy.limits else None
    if limit is not None and len(rows) > limit:  # read_table stops one row past the limit
        raise ConfigError(f"data.max_rows must be at most {limit:,} here: the data has more than {limit:,} rows, this "
                          f"public demo's limit of rows of data; set it to {limit:,} or fewer ({LIFT} to train on "
                          "all of it).")
    columns = columns_of(rows)
    prompt = _Mapping("data.prompt", config.prompt, columns, constant_allowed=False)
    reference = _Mapping("data.reference", config.reference, columns, False) if _given(config.reference) else None
    system = _Mapping("data.system", config.system, columns, True) if _given(config.system) else None
    mapped: dict[str, str] = {}
    for mapping in (prompt, reference, system):
        if mapping is not None:
            for column in mapping.used_columns:
                mapped.setdefault(column, mapping.label)

    examples = []
    most_chars = policy.limits.text_chars if policy.limits else None
    for number, row in enumerate(rows, start=first_row):
        fields = _row_fields(row, number, mapped)
        user_text = prompt.render(fields)
        if not user_text.strip():
            continue
        system_text = system.render(fields) if system else ""
        reference_text = reference.render(fields) if reference else ""
        for mapping, text in ((prompt, user_text), (system, system_text), (reference, reference_text)):
            if mapping is not None and most_chars is not None and len(text) > most_chars:
                raise ConfigError(f"{mapping.label} gives row {number} {len(text):,} characters, more than this "
                                  f"public demo's limit of {most_chars:,} characters in one row's prompt, reference "
                                  f"answer or system message; shorten it or leave that row out ({LIFT} for longer "
                                  "texts).")
        messages = [{"role": "system", "content": system_text}] if system_text.strip() else []
        messages.append({"role": "user", "content": user_text})
        examples.append({
            "prompt": messages,
            "reference": reference_text,
            "row": json.dumps(fields, ensure_ascii=False),
            "number": number,  # its row in the file: what a pre-flight's pass rates are keyed by
        })
    if not examples:
        used = prompt.used_columns
        what = f"the column '{used[0]}' is" if len(used) == 1 else f"the columns {', '.join(map(repr, used))} are"
        raise ConfigError(
            f"data.prompt gave empty text for all {len(rows)} rows, so there is nothing to train on; "
            f"check that {what} filled in."
        )
    held_out_limit = policy.limits.held_out_prompts if policy.limits else None
    train, held_out = _split(examples, config.eval_frac, config.seed, held_out_limit)
    kept, dropped = [], []
    for example in train:  # after the split: filtering first would move rows between training and held out
        why = config.dropped_because(example["number"])
        if why is None:
            kept.append(example)
        else:
            dropped.append({"row": example["number"], "why": why})
    if not kept:
        raise ConfigError(f"data.pass_rates: the difficulty filter drops all {len(train)} training rows (their "
                          f"pre-flight pass rates are outside {config.min_pass_rate:g} to {config.max_pass_rate:g}); "
                          "widen the range or clear the filter.")
    return MappedData(kept, held_out, len(rows), len(rows) - len(examples), columns, config.eval_frac,
                      held_out_limit=held_out_limit, dropped=dropped)


def _is_share(value) -> bool:
    """A number from 0 to 1 (a bool is not one)."""
    return isinstance(value, int | float) and not isinstance(value, bool) and 0 <= value <= 1


def _shown(value) -> str:
    """A value a message quotes, cut short: a config may hold anything."""
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _given(text: str | None) -> TypeGuard[str]:
    """An empty reference or system box in the UI means 'not used'."""
    return text is not None and bool(text.strip())


def held_out_count(n: int, eval_frac: float, limit: int | None = None) -> int:
    """How many of ``n`` usable examples to hold out: round(n * eval_frac), raised to MIN_HELD_OUT (or a fifth of
    the rows, if that is fewer); none when eval_frac is 0 or there are fewer than MIN_ROWS_FOR_EVAL; at most
    ``limit`` (a public demo's limit of held-out prompts, which bounds the scoring before and after a run)."""
    if n < MIN_ROWS_FOR_EVAL or eval_frac <= 0:
        return 0
    count = max(round(n * eval_frac), min(MIN_HELD_OUT, n // 5))
    return count if limit is None else min(count, limit)


def _split(examples: list[dict], eval_frac: float, seed: int, limit: int | None) -> tuple[list[dict], list[dict]]:
    """Hold out held_out_count() examples, chosen by a seeded shuffle.

    Both parts keep the file order, so previews show the first rows of the file.
    """
    n = len(examples)
    n_eval = held_out_count(n, eval_frac, limit)
    if not n_eval:
        return examples, []
    order = list(range(n))
    random.Random(seed).shuffle(order)
    held_out = set(order[:n_eval])
    return (
        [ex for i, ex in enumerate(examples) if i not in held_out],
        [ex for i, ex in enumerate(examples) if i in held_out],
    )


def load_and_map(config: DataConfig, base_dir: str | None = None, *, policy: Policy) -> MappedData:
    """Validate, load and map in one go: what training and the data preview both need."""
    config.validate()
    table = read_table(config.source, config.hub_config, config.hub_split, base_dir=base_dir, sheet=config.sheet,
                       max_rows=config.max_rows, policy=policy)
    mapped = map_rows(table.rows, config, policy=policy)
    mapped.notes = table.notes
    return mapped


def prompt_text(example: dict) -> str:
    """The text of the last user message (or the prompt itself if it is plain text), for display and rewards."""
    return last_user_text(example.get("prompt", ""))


# --------------------------------------------------------------------------------------------- JSONL files


def write_jsonl(path, examples) -> None:
    """Write one JSON object per line via a temp file and os.replace, so readers never see half a file."""
    with replaced_atomically(Path(path)) as tmp, open(tmp, "w", encoding="utf-8", newline="\n") as handle:
        for example in examples:
            handle.write(json.dumps(example, ensure_ascii=False) + "\n")


def read_jsonl(path) -> list[dict]:
    """Read a file written by write_jsonl (or any JSON Lines file); a bad line is a ConfigError with its number."""
    path = Path(path)
    return read_json_lines(path.read_text(encoding="utf-8"), path.name, prefix="")
