"""Files that a reader never sees half-written: the UI, the CLI and downloads read run files while they are written."""

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
