"""What a logger that is off reports: every record it was given, counted under `disabled`.

A node with no telemetry configured still starts; its loggers take every call,
do nothing with it, and count it, so that `stats()` shows how much was not sent.
"""

from __future__ import annotations

from typing import Any

from telemetry_client._engine.shipping import Counter

DISABLED = "disabled"  # the drop reason (see catalog.DROP_REASONS)

__all__ = ["DISABLED", "Counter", "disabled_stats"]


def disabled_stats(sink: str, count: int, reason: str | None) -> dict[str, Any]:
    """The counters of a destination that is off, shaped like `Channel.stats()`."""
    return {
        "sink": sink,
        "queued": count,
        "sent": 0,
        "batches": 0,
        "retries": 0,
        "bytes_sent": 0,
        "pending": 0,
        "pending_bytes": 0,
        "in_flight": 0,
        "unconfirmed": 0,
        "dropped": count,
        "dropped_by_reason": {DISABLED: count} if count else {},
        "dropped_values": 0,
        "sent_by_key": {},
        "last_error": None,
        "last_error_time": None,
        "disabled_reason": reason,
    }
