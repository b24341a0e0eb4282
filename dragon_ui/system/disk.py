"""Files that a reader never sees half-written (the UI, the CLI and downloads read run files while they are written),
and the folders: where runs live, and where what is worked out once per machine is kept."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def replaced_atomically(path: Path) -> Iterator[Path]:
    """A temporary file beside ``path`` to write; it replaces ``path`` in one rename when the block ends, and is
    removed if the block raises (the old file stays as it was)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    os.close(fd)
    try:
        yield Path(tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def cache_dir() -> Path:
    """Where converted models and machine measurements are kept (DRAGON_UI_CACHE, else ~/.cache/dragon_ui)."""
    root = os.environ.get("DRAGON_UI_CACHE") or os.path.join(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache",
                                                             "dragon_ui")
    return Path(root)


RUNS_DIR_ENV = "DRAGON_UI_RUNS_DIR"
SPACE_STORAGE = Path("/data")  # a Hugging Face Space's persistent storage, where it has some


def resolve_runs_dir(chosen: str | os.PathLike[str] | None = None) -> Path:
    """Where runs live: the folder chosen (a config's runs_dir, --runs-dir), else $DRAGON_UI_RUNS_DIR, else
    ``runs`` in a Space's persistent storage (which outlives a restart of the Space), else ./runs."""
    default = "runs"
    if os.environ.get("SPACE_ID") and SPACE_STORAGE.is_dir() and os.access(SPACE_STORAGE, os.W_OK):
        default = str(SPACE_STORAGE / "runs")
    return Path(chosen or os.environ.get(RUNS_DIR_ENV) or default).expanduser().resolve()
