"""One backup run at a time on a host: an exclusive, non-blocking flock.

The kernel drops the lock when the process ends, however it ends, so a killed
run never leaves a stale lock behind.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


class Busy(Exception):
    """Another run holds the lock."""


@contextmanager
def exclusive(path: Path) -> Iterator[None]:
    """Hold the lock file for the duration of the block, or raise Busy at once."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            raise Busy(f"another backup run holds {path} (pid {holder}); not starting a second one") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)
