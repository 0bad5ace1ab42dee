"""Host metrics for the `system` measurement: psutil, with memory from the cgroup inside a container."""

from __future__ import annotations

import os
import time
from pathlib import Path

import psutil

CGROUP_ROOT = Path("/sys/fs/cgroup")


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def _inactive_file(stat_path: Path, key: str) -> int:
    try:
        for line in stat_path.read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == key and value.strip().isdigit():
                return int(value)
    except OSError:
        pass
    return 0


def cgroup_memory(root: Path = CGROUP_ROOT) -> tuple[int, int] | None:
    """(used, limit) bytes of this process's cgroup when it has a memory limit, else None.

    Used memory excludes the reclaimable page cache (inactive files), as `docker stats` does.
    """
    v2_limit = root / "memory.max"
    if v2_limit.exists():
        limit = _read_int(v2_limit)  # "max" (no limit) reads as None
        used = _read_int(root / "memory.current")
        if limit is None or used is None:
            return None
        return max(0, used - _inactive_file(root / "memory.stat", "inactive_file")), limit
    v1 = root / "memory"
    limit = _read_int(v1 / "memory.limit_in_bytes")
    used = _read_int(v1 / "memory.usage_in_bytes")
    if limit is None or used is None or limit >= 1 << 60:  # v1 writes a huge number for "no limit"
        return None
    return max(0, used - _inactive_file(v1 / "memory.stat", "total_inactive_file")), limit


def _disk_percent(path: str = ".") -> float:
    """Disk in use on the working directory's filesystem (where checkpoints usually go); 0 if unreadable."""
    try:
        return float(psutil.disk_usage(path).percent)
    except OSError:
        return 0.0


class SystemSampler:
    """Samples the host at most once per `interval` seconds."""

    def __init__(self, interval: float = 10.0, cgroup_root: Path = CGROUP_ROOT) -> None:
        self.interval = interval
        self.cgroup_root = cgroup_root
        self._last = -float("inf")
        self._process = psutil.Process(os.getpid())
        psutil.cpu_percent(interval=None)  # the first reading is meaningless: prime it now

    def due(self, now: float | None = None) -> bool:
        return (time.monotonic() if now is None else now) - self._last >= self.interval

    def sample(self) -> dict[str, float]:
        """One sample of the `system` measurement's fields."""
        self._last = time.monotonic()
        memory = psutil.virtual_memory()
        used, total = float(memory.total - memory.available), float(memory.total)
        limited = cgroup_memory(self.cgroup_root)
        if limited is not None and limited[1] < memory.total:
            used, total = float(limited[0]), float(limited[1])
        return {
            "cpu_percent": float(psutil.cpu_percent(interval=None)),
            "memory_used_bytes": used,
            "memory_total_bytes": total,
            "memory_percent": 100.0 * used / total if total else 0.0,
            "process_rss_bytes": float(self._process.memory_info().rss),
            "disk_percent": _disk_percent(),
        }
