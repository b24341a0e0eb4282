"""The machine's memory, as every layer may ask it: the container's where it is held to less (system/cgroups.py)."""

from __future__ import annotations

import os
from pathlib import Path

from . import cgroups

GB = 1024**3
MEMINFO = Path("/proc/meminfo")


def system_memory_gb(free: bool = True) -> float | None:
    """The machine's free (or total) memory, where the platform tells (Linux and macOS do); in a container with a
    memory limit, no more than the limit (less what the container uses, for the free memory).

    Free is Linux's MemAvailable where there is one: unused memory plus the file caches the kernel hands back on
    demand. Unused pages alone (sysconf's count, the fallback) undercount it on any machine that has been reading
    files, such as one that has just loaded a model: 12.6 against 17.3 GB on this project's 24 GB machine.
    """
    machine = _machine_memory_gb(free)
    limit = cgroups.memory_limit_gb()
    if limit is None:
        return machine
    if free:
        used = cgroups.memory_used_gb()
        limit = max(0.0, limit - used) if used is not None else limit
    return limit if machine is None else min(machine, limit)


def _machine_memory_gb(free: bool) -> float | None:
    if free:
        try:
            for line in MEMINFO.read_text().splitlines():
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024 / GB  # in kB
        except (OSError, ValueError, IndexError):
            pass
    try:
        pages = os.sysconf("SC_AVPHYS_PAGES" if free else "SC_PHYS_PAGES")
        return pages * os.sysconf("SC_PAGE_SIZE") / GB
    except (ValueError, OSError, AttributeError):  # not every platform names these
        return None
