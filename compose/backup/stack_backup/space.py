"""Sizes and free space: a staging copy that would fill the disk is refused before it starts."""

from __future__ import annotations

import os
import shutil
from pathlib import Path


class NoSpace(Exception):
    """Not enough free space to stage a store; the message has the figures."""


def tree_size(path: Path) -> int:
    """Bytes of the regular files under path (or of path itself); hard links counted once."""
    if not path.exists():
        return 0
    if path.is_file():
        return path.stat().st_size
    seen: set[tuple[int, int]] = set()
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                info = os.lstat(os.path.join(root, name))
            except FileNotFoundError:
                continue
            key = (info.st_dev, info.st_ino)
            if key not in seen:
                seen.add(key)
                total += info.st_size
    return total


def human(size: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(size) < 1024 or unit == "TiB":
            return f"{size:.1f} {unit}" if unit != "B" else f"{int(size)} B"
        size /= 1024
    raise AssertionError("unreachable")


def require_free(where: Path, store: str, expected: int, margin: float, reserve: int) -> None:
    """Raise NoSpace unless `where` has room for expected * margin + reserve bytes."""
    needed = int(expected * margin) + reserve
    free = shutil.disk_usage(where).free
    if free < needed:
        raise NoSpace(
            f"not staging {store}: it needs about {human(needed)} ({human(expected)} of data, x{margin:g}, "
            f"+{human(reserve)} kept free) but {where} has {human(free)} free"
        )
