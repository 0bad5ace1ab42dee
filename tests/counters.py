"""The identity a channel's counters keep at every moment, for the fault tests to check in every scenario."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def assert_counters_add_up(stats: Mapping[str, Any]) -> None:
    """queued == sent + pending + unconfirmed + the items dropped whole (see docs/delivery.md, "Counters").

    `dropped_values` are parts of items (field values) left out of points that were
    sent on: `dropped_by_reason` counts them, the identity does not.
    """
    whole_drops = sum(stats["dropped_by_reason"].values()) - stats["dropped_values"]
    accounted = stats["sent"] + stats["pending"] + stats["unconfirmed"] + whole_drops
    assert stats["dropped"] == sum(stats["dropped_by_reason"].values()), stats
    assert stats["queued"] == accounted, f"queued {stats['queued']} != {accounted} accounted: {dict(stats)}"
    assert 0 <= stats["in_flight"] <= stats["pending"], stats
