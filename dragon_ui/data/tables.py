"""Reading a file of examples into rows of text, the way the person who saved it meant them.

Files come from Excel, from other tools and from other people's machines, so this module decodes the common
encodings (saying which it used), reads spreadsheets, and never lets a broken line pass silently: an unterminated
quote is an error naming its line, a line with more fields than the header is skipped and counted, a header that
names a column twice gets the second one renamed, and every such repair is said in the table's ``notes``.
Values stay text ("007" stays "007", an empty cell stays ""), except in Parquet and JSON, which have types.
"""

from __future__ import annotations

import codecs
import csv
import datetime
import io
import json
from dataclasses import dataclass, field
from pathlib import Path

from ..system.processes import run_apart, runs_apart
from ..errors import ConfigError
from ..public import LIFT

SPREADSHEET_EXTENSIONS = (".xlsx", ".xlsm", ".xls", ".ods")
SUPPORTED_EXTENSIONS = (".csv", ".tsv", ".jsonl", ".ndjson", ".json", ".parquet", *SPREADSHEET_EXTENSIONS)
# Keys under which a JSON file may wrap its list of rows, e.g. {"data": [...]}.
JSON_WRAPPER_KEYS = ("data", "rows", "train")
# Single-byte encodings tried, in this order, when a text file is not UTF-8: what Excel and Windows tools save.
SINGLE_BYTE_ENCODINGS = {"cp1252": "Windows-1252", "latin_1": "Latin-1"}
SKIPPED_LINES_SHOWN = 3  # line numbers listed in a note; the count covers the rest
# The csv module refuses cells over 128 KiB; a long prompt is the prompt filter's to judge (engine/prompts.py), with
# a sentence, not the reader's. Process-wide, as the csv module keeps it; 2**31 - 1 fits a C long everywhere.
csv.field_size_limit(2**31 - 1)


@dataclass
class Table:
    """The rows of a file, as dicts of column -> value, and what was done to read them."""

    rows: list[dict]
    notes: list[str] = field(default_factory=list)  # e.g. "Read as Windows-1252." or "Line 7 was skipped: ..."
    sheets: list[str] = field(default_factory=list)  # a spreadsheet's sheet names, the one read among them


def read_file(path: Path, sheet: str | None = None, max_rows: int | None = None,
              max_read_mb: float | None = None, max_columns: int | None = None,
              max_cell_chars: int | None = None) -> Table:
    """The table in a local file, by its extension; ConfigError with the sentence to show when it cannot be read.

    Reading stops after ``max_rows`` rows (the caller's row limit, plus one to tell that there were more), so a
    small file that holds millions of rows is never read whole. ``max_read_mb``: a public demo reads the file in a
    separate process with limits on its memory and time, which hands back at most this many MB of rows (system/processes.py),
    and none at all when a cell has more than ``max_cell_chars`` characters (a small compressed file can hold
    megabytes of one repeated text).
    """
    if max_read_mb is not None:
        answer = run_apart(read_here_as_json, {"path": str(path), "sheet": sheet, "max_rows": max_rows,
                                               "max_columns": max_columns, "max_cell_chars": max_cell_chars},
                           int(max_read_mb * 2**20), path.name)
        return Table(answer["rows"], answer["notes"], answer["sheets"])
    return read_here(path, sheet, max_rows, max_columns)


@runs_apart
def read_here_as_json(path: str, sheet: str | None, max_rows: int | None, max_columns: int | None,
                      max_cell_chars: int | None = None) -> dict:
    """read_here's table as the reading process hands it back (system.processes.run_apart)."""
    table = read_here(Path(path), sheet, max_rows, max_columns)
    check_cells(table.rows, max_cell_chars, Path(path).name)
    return {"rows": table.rows, "notes": table.notes, "sheets": table.sheets}


def check_cells(rows: list[dict], max_chars: int | None, name: str) -> None:
    """Refuse rows with a cell of more than ``max_chars`` characters (public.Limits.text_chars); a list or a
    mapping counts as its JSON text."""
    if max_chars is None:
        return
    for number, row in enumerate(rows, start=1):
        for column, value in row.items():
            size = len(value) if isinstance(value, str) else (
                len(json.dumps(value, default=str)) if isinstance(value, list | dict) else 0)
            if size > max_chars:
                raise ConfigError(f"data.source: row {number} of {name} has {size:,} characters in the column "
                                  f"{str(column)[:60]!r}, more than this public demo's limit of {max_chars:,} "
                                  f"characters in one row's prompt, reference answer or system message; shorten it or "
                                  f"leave that row out ({LIFT} for longer texts).")


def read_here(path: Path, sheet: str | None, max_rows: int | None, max_columns: int | None = None) -> Table:
    """read_file in this process."""
    suffix = path.suffix.lower()
    if suffix in (".csv", ".tsv"):
        text, encoding = decode(path)
        table = _read_delimited(text, "\t" if suffix == ".tsv" else ",", path.name, max_rows, max_columns)
        table.notes.insert(0, f"Read as {encoding}.")
        return table
    if suffix == ".parquet":
        return Table(_read_parquet(path, max_rows, max_columns))
    if suffix in SPREADSHEET_EXTENSIONS:
        return _read_spreadsheet(path, sheet, max_rows, max_columns)
    text, encoding = decode(path)
    rows = _read_json(text, path.name, max_rows) if suffix == ".json" else read_json_lines(text, path.name,
                                                                                           max_rows=max_rows)
    check_columns(rows, max_columns, path.name)  # each row may bring keys of its own
    return Table(rows, [f"Read as {encoding}."])


def check_columns(rows: list[dict], max_columns: int | None, name: str) -> None:
    """Refuse rows whose keys, all rows together, are more than ``max_columns`` (public.Limits.columns)."""
    if max_columns is None:
        return
    keys: set = set()
    for row in rows:
        keys.update(row)
        if len(keys) > max_columns:
            raise ConfigError(f"data.source: {name} has more than {max_columns:,} columns, the most a table may have "
                              "in this public demo; keep the columns your prompts and rewards use.")


def decode(path: Path) -> tuple[str, str]:
    """(the text of a file, the name of its encoding): UTF-8 with or without BOM, UTF-16 with a BOM, else the
    single-byte encoding Windows tools save (Windows-1252, or Latin-1 for the bytes it lacks). A file with NUL bytes
    and no UTF-16 BOM is binary, not text, and is refused with the advice to save it as UTF-8."""
    raw = path.read_bytes()
    if raw.startswith(codecs.BOM_UTF8):
        return raw[len(codecs.BOM_UTF8):].decode("utf-8", errors="strict"), "UTF-8 (with a byte-order mark)"
    if raw.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        try:
            return raw.decode("utf-16"), "UTF-16"
        except UnicodeDecodeError:
            pass
    else:
        try:
            return raw.decode("utf-8"), "UTF-8"
        except UnicodeDecodeError:
            pass
    if b"\x00" not in raw:
        from charset_normalizer import from_bytes

        best = from_bytes(raw, cp_isolation=list(SINGLE_BYTE_ENCODINGS)).best()
        if best is not None:
            return str(best), SINGLE_BYTE_ENCODINGS.get(best.encoding, best.encoding)
    raise ConfigError(f"data.source: {path.name} is not UTF-8 text; save it again with UTF-8 encoding.")


def _read_delimited(text: str, sep: str, name: str, max_rows: int | None = None,
                    max_columns: int | None = None) -> Table:
    """CSV/TSV cells as text. A quote that never closes is an error naming its line; a line with more fields than
    the header is skipped (and counted); a line with fewer gets empty cells; blank lines are ignored. Reading stops
    once the header and ``max_rows`` lines are read."""
    kind = "TSV" if sep == "\t" else "CSV"
    reader = csv.reader(io.StringIO(text, newline=""), delimiter=sep, strict=True)
    records, started = [], 1
    try:
        for record in reader:
            if any(cell.strip() for cell in record):
                records.append((started, record))
                if max_rows is not None and len(records) > max_rows:
                    break
            started = reader.line_num + 1
    except csv.Error as exc:
        if "unexpected end of data" in str(exc) or "EOF" in str(exc):
            raise ConfigError(f"data.source: line {started} of {name} opens a quote (\") that never closes, so "
                              "the rest of the file would become one cell; close the quote or remove it.") from None
        raise ConfigError(f"data.source: line {started} of {name} is not valid {kind} ({exc}); a quote inside a "
                          'cell must be doubled ("") or the whole cell quoted.') from None
    if not records:
        return Table([])
    (_, header), body = records[0], records[1:]
    columns, notes = unique_columns(header, max_columns)
    rows, skipped = [], []
    for line, record in body:
        if len(record) > len(columns):
            skipped.append((line, len(record)))
            continue
        rows.append(dict(zip(columns, record + [""] * (len(columns) - len(record)), strict=True)))
    if skipped:
        shown = ", ".join(str(line) for line, _ in skipped[:SKIPPED_LINES_SHOWN])
        more = f" and {len(skipped) - SKIPPED_LINES_SHOWN} more" if len(skipped) > SKIPPED_LINES_SHOWN else ""
        notes.append(f"{len(skipped)} line{'s' if len(skipped) > 1 else ''} skipped (line {shown}{more}): more "
                     f"fields than the header's {len(columns)}, usually a {'tab' if sep == chr(9) else 'comma'} "
                     "inside a cell that is not quoted.")
        if not rows:
            raise ConfigError(f"data.source: every line of {name} has more fields than its header "
                              f"({len(columns)}); check the separator, or quote the cells that contain it.")
    return Table(rows, notes)


def unique_columns(header: list, max_columns: int | None = None) -> tuple[list[str], list[str]]:
    """Column names from a header row, each once: an empty one becomes "column N", a repeated one gets " (2)"; the
    notes say which were renamed. Linear in the header (a set of the names taken); ``max_columns``: a public demo's
    limit (public.Limits.columns)."""
    if max_columns is not None and len(header) > max_columns:
        raise ConfigError(f"data.source: the header has {len(header):,} columns, more than the {max_columns:,} a "
                          "table may have in this public demo; keep the columns your prompts and rewards use.")
    given = {str(raw) for raw in header}
    columns, taken, notes = [], set(), []
    for number, raw in enumerate(header, start=1):
        name = str(raw).strip() or f"column {number}"
        if name in taken:
            renamed, copy = name, 2
            while renamed in taken or renamed in given:
                renamed, copy = f"{name} ({copy})", copy + 1
            notes.append(f"Two columns are called '{name}': column {number} is read as '{renamed}'.")
            name = renamed
        elif not str(raw).strip():
            notes.append(f"Column {number} has no name in the header: it is read as '{name}'.")
        columns.append(name)
        taken.add(name)
    return columns, notes


def _read_spreadsheet(path: Path, sheet: str | None, max_rows: int | None = None,
                      max_columns: int | None = None) -> Table:
    """The first sheet (or ``sheet``) of an Excel or OpenDocument file through python-calamine, which reads
    .xlsx, .xls and .ods alike with the values Excel last calculated. The first non-empty row is the header; rows
    are read until ``max_rows`` are found."""
    from python_calamine import CalamineError, CalamineWorkbook

    try:
        workbook = CalamineWorkbook.from_path(str(path))
    except (CalamineError, OSError, ValueError) as exc:
        raise ConfigError(f"data.source: {path.name} is not a spreadsheet this app can read ({exc}).") from None
    names = list(workbook.sheet_names)
    if not names:
        raise ConfigError(f"data.source: {path.name} has no sheets.")
    chosen = names[0] if sheet is None else sheet
    if chosen not in names:
        raise ConfigError(f"data.sheet: {path.name} has no sheet called {sheet!r}; its sheets are: "
                          f"{', '.join(names)}.")
    cells = []
    for row in workbook.get_sheet_by_name(chosen).iter_rows():
        texts = [cell_text(value) for value in row]
        if any(value.strip() for value in texts):
            cells.append(texts)
            if max_rows is not None and len(cells) > max_rows:  # the header and max_rows rows
                break
    notes = [f"Read the sheet '{chosen}'" + (f" (of {len(names)}: {', '.join(names)})." if len(names) > 1 else ".")]
    if not cells:
        return Table([], notes, names)
    columns, renamed = unique_columns(cells[0], max_columns)
    width = len(columns)
    rows = [dict(zip(columns, (row + [""] * width)[:width], strict=True)) for row in cells[1:]]
    return Table(rows, notes + renamed, names)


def cell_text(value) -> str:
    """A spreadsheet cell as the text a person sees in it: 90 not 90.0, TRUE/FALSE, dates as 2024-03-01."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() else repr(value)
    if isinstance(value, datetime.datetime):
        return value.isoformat(sep=" ", timespec="seconds").removesuffix(" 00:00:00")
    if isinstance(value, (datetime.date, datetime.time)):
        return value.isoformat()
    return str(value)


def _read_parquet(path: Path, max_rows: int | None = None, max_columns: int | None = None) -> list[dict]:
    """Parquet via pyarrow, which gives plain Python values and None for nulls (no NaN upcasting); batch by batch,
    so only the first ``max_rows`` rows are ever decoded."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        parquet = pq.ParquetFile(path)
        # pandas stores a non-default index as an extra column; it is not data the user meant to use.
        columns = [c for c in parquet.schema_arrow.names if not c.startswith("__index_level_")]
        check_columns([dict.fromkeys(columns)], max_columns, path.name)  # from the schema, before any row
        rows: list[dict] = []
        for batch in parquet.iter_batches(batch_size=1024, columns=columns):
            rows += batch.to_pylist()
            if max_rows is not None and len(rows) >= max_rows:
                return rows[:max_rows]
    except pa.ArrowMemoryError:
        raise  # not a broken file: one too big for the memory it may take
    except pa.ArrowException as exc:
        raise ConfigError(f"data.source: {path.name} is not a valid Parquet file ({exc}).") from None
    return rows


def _read_json(text: str, name: str, max_rows: int | None = None) -> list[dict]:
    """A JSON array of objects, or an object wrapping one under 'data', 'rows' or 'train'; the first ``max_rows``
    of them (a JSON array is parsed whole: its size is the file's)."""
    if not text.strip():
        return []
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        if exc.msg == "Extra data":  # one object per line saved as .json: read it as JSON Lines
            return read_json_lines(text, name, max_rows=max_rows)
        raise ConfigError(f"data.source: {name} is not valid JSON (line {exc.lineno}: {exc.msg}).") from None
    if isinstance(data, dict):
        data = next((data[k] for k in JSON_WRAPPER_KEYS if isinstance(data.get(k), list)), data)
    if not isinstance(data, list):
        raise ConfigError(f"data.source: {name} must hold a list of objects (one per row), or an object with the "
                          f"list under {', '.join(repr(k) for k in JSON_WRAPPER_KEYS)}.")
    data = data[:max_rows] if max_rows is not None else data
    for number, item in enumerate(data, start=1):
        if not isinstance(item, dict):
            raise ConfigError(f"data.source: item {number} of {name} is not an object with named fields.")
    return data


def read_json_lines(text: str, name: str, prefix: str = "data.source: ", max_rows: int | None = None) -> list[dict]:
    """One JSON object per line, the first ``max_rows`` of them; blank lines are ignored and a bad line is reported
    by its number."""
    rows: list[dict] = []
    for number, line in enumerate(io.StringIO(text, newline=None), start=1):
        if max_rows is not None and len(rows) >= max_rows:
            break
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{prefix}line {number} of {name} is not valid JSON ({exc.msg}).") from None
        if not isinstance(row, dict):
            raise ConfigError(f"{prefix}line {number} of {name} is not a JSON object with named fields.")
        rows.append(row)
    return rows
