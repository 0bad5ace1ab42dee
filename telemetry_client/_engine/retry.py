"""Retry timing: capped exponential backoff with full jitter, and `Retry-After` parsing."""

from __future__ import annotations

import email.utils
import random
import time


def backoff_delay(attempt: int, base: float, cap: float, rng: random.Random | None = None) -> float:
    """Full-jitter delay before retry number `attempt` (1-based): uniform in [0, min(cap, base*2^(attempt-1))].

    Full jitter spreads a fleet's retries so that a recovering server is not hit
    by every node at the same instant.
    """
    ceiling = min(cap, base * (2 ** min(attempt - 1, 30)))
    return (rng or random).uniform(0.0, ceiling)


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """Seconds to wait from a `Retry-After` header (delta-seconds or HTTP date); None if absent or invalid."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when is None:
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))
