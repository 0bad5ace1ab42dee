"""The client's own warnings: a plain module logger, rate-limited per message key.

These records never go through the Loki handler (it ignores loggers under
`telemetry_client`), so a failing Loki push cannot recurse into more pushes.
"""

from __future__ import annotations

import logging
import threading
import time

logger = logging.getLogger("telemetry_client")


class RateLimitedLog:
    """Log each key at most once per `interval` seconds; count what was suppressed."""

    def __init__(self, interval: float = 60.0) -> None:
        self.interval = interval
        self._last: dict[str, float] = {}
        self._suppressed: dict[str, int] = {}
        self._lock = threading.Lock()

    def warning(self, key: str, message: str, *args: object, exc_info: bool = False) -> None:
        """Warn about `key` unless it was warned about within the interval."""
        now = time.monotonic()
        with self._lock:
            last = self._last.get(key)
            if last is not None and now - last < self.interval:
                self._suppressed[key] = self._suppressed.get(key, 0) + 1
                return
            suppressed = self._suppressed.pop(key, 0)
            self._last[key] = now
        if suppressed:
            message += f" ({suppressed} similar messages suppressed)"
        logger.warning(message, *args, exc_info=exc_info)

    def once(self, key: str, message: str, *args: object) -> None:
        """Warn about `key` only the first time it happens in this process."""
        with self._lock:
            if key in self._last:
                return
            self._last[key] = float("inf")
        logger.warning(message, *args)


warn = RateLimitedLog()
