"""What a container allows this process: its CPU quota and its memory limit (Linux control groups, v2 or v1).

A container (a Hugging Face Space, a Docker machine of a workshop) is often given 2 CPUs and 16 GB of a host with
dozens of cores and hundreds of GB, and the CPU affinity and /proc/meminfo report the host's. What trains beside
what, and how many threads a run takes, must count the container's.
"""

from __future__ import annotations

import math
from pathlib import Path

CGROUP = Path("/sys/fs/cgroup")
UNLIMITED_BYTES = 2**60  # v1 says "no limit" with a number near 2**63


def cpu_quota(root: Path = CGROUP) -> int | None:
    """The CPUs the container may use, rounded up (a quota of 1.5 CPUs is 2); None where none is set."""
    v2 = _read(root / "cpu.max")
    if v2 is not None:
        quota, _, period = v2.partition(" ")
        return _cpus(quota, period)
    return _cpus(_read(root / "cpu" / "cpu.cfs_quota_us"), _read(root / "cpu" / "cpu.cfs_period_us"))


def memory_limit_gb(root: Path = CGROUP) -> float | None:
    """The memory the container may use, in GB; None where none is set."""
    limit = _read(root / "memory.max") or _read(root / "memory" / "memory.limit_in_bytes")
    if limit is None or not limit.isdigit() or int(limit) >= UNLIMITED_BYTES:
        return None  # "max", or no file: no limit
    return int(limit) / 1024**3


def memory_used_gb(root: Path = CGROUP) -> float | None:
    """The memory the container uses now, in GB; None where it is not told."""
    used = _read(root / "memory.current") or _read(root / "memory" / "memory.usage_in_bytes")
    return int(used) / 1024**3 if used is not None and used.isdigit() else None


def _cpus(quota: str | None, period: str | None) -> int | None:
    try:
        quota_us, period_us = int(quota or ""), int(period or "")
    except ValueError:  # "max", or no file
        return None
    return max(1, math.ceil(quota_us / period_us)) if quota_us > 0 and period_us > 0 else None


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None
