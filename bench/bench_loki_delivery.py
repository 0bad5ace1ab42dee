"""Loki delivery against Loki's default limits: pushes of several streams vs one stream per push.

Loki answers a push with the result of its last stream only, so a push that
mixes streams can be answered 204 while an earlier stream was rate-limited: those
lines are lost and counted sent. The client now sends one stream per push; this
script measures what that costs in requests and what it saves in lines, side by
side in one run, against the local receiver (tests/loki_receiver.py) set to Loki
3.x's default limits (4 MiB/s per tenant, burst 6 MiB; 3 MiB/s per stream, burst
15 MiB; shard_streams on, so a stream over its limit is refused whole).

Two workloads, one handler each, levels mixed as a busy node logs them (90% info,
7% warning, 3% error):

* steady: 2,000 lines/s for 6 s (a node in normal operation): requests/s it costs;
* flood: 60,000 lines of 1 KB as fast as one process logs them, beyond Loki's rate limits:
  lines/s delivered, requests/s, and whether every line arrived exactly once.

"Before" is the previous push design (several streams per push), selected by
switching the sink's `batch_per_key` off (`telemetry_client._loki.sink`: the one use of the
client's internals in the benchmarks, pinned in tests/test_public_api.py); everything
else is the current code.

Run: python bench/bench_loki_delivery.py
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from dataclasses import dataclass

from _common import dedicated_logger
from loki_receiver import MB, Limits, LokiReceiver

from telemetry_client._loki.sink import LokiSink
from telemetry_client.loki import LokiHandler

STEADY_RATE = 2_000
STEADY_SECONDS = 6.0
FLOOD_LINES = 60_000
STEADY_PAD = "x" * 120  # lines of about 250 bytes once the JSON body is written
FLOOD_PAD = "y" * 900  # about 1 KB (a short traceback): beyond Loki's 4 MiB/s once above ~4,000 lines/s
LEVELS = [logging.INFO] * 90 + [logging.WARNING] * 7 + [logging.ERROR] * 3


@dataclass
class Result:
    lines: int
    seconds: float
    requests: int
    throttled: int
    stored: int
    distinct: int
    sent: int
    dropped: int

    @property
    def exact(self) -> bool:
        return self.stored == self.distinct == self.sent == self.lines and self.dropped == 0


# The per-stream limit binds before the tenant's once an operator raises the tenant's (as
# compose/loki/loki.yml does): one stream of a mixed push is refused while the others pass.
TENANT_RAISED = Limits.loki_defaults(
    ingestion_rate_bytes=16.0 * MB,
    ingestion_burst_bytes=24 * MB,
    per_stream_rate_bytes=1.0 * MB,
    per_stream_burst_bytes=2 * MB,
)
STREAM_LIMITED_LINES = 20_000


def _run(one_stream_per_push: bool, steady: bool, limits: Limits, flood_lines: int = FLOOD_LINES) -> Result:
    previous = LokiSink.batch_per_key
    LokiSink.batch_per_key = one_stream_per_push
    try:
        with LokiReceiver(limits=limits) as receiver:
            handler = LokiHandler(receiver.base_url, {"service": "bench"})
            logger = dedicated_logger(handler, "bench.delivery")
            total = int(STEADY_RATE * STEADY_SECONDS) if steady else flood_lines
            pad = STEADY_PAD if steady else FLOOD_PAD
            start = time.perf_counter()
            for i in range(total):
                if steady and i % 100 == 0:  # pace in steps of 100 lines
                    delay = start + i / STEADY_RATE - time.perf_counter()
                    if delay > 0:
                        time.sleep(delay)
                logger.log(LEVELS[i % len(LEVELS)], "line %d %s", i, pad, extra={"id": i})
            handler.flush(300)
            seconds = time.perf_counter() - start
            stats = handler.stats()
            handler.close(5)
            ids = Counter(entry.json()["id"] for entry in receiver.entries)
            requests = receiver.requests
            return Result(
                lines=total,
                seconds=seconds,
                requests=len(requests),
                throttled=sum(r.status == 429 for r in requests),
                stored=sum(ids.values()),
                distinct=len(ids),
                sent=stats["sent"],
                dropped=stats["dropped"],
            )
    finally:
        LokiSink.batch_per_key = previous


def main() -> None:
    defaults = Limits.loki_defaults()
    workloads = (
        ("steady", True, defaults, FLOOD_LINES),
        ("flood", False, defaults, FLOOD_LINES),
        ("flood*", False, TENANT_RAISED, STREAM_LIMITED_LINES),
    )
    rows = []
    for name, steady, limits, lines in workloads:
        for one_stream in (False, True):
            rows.append((name, one_stream, _run(one_stream, steady, limits, lines)))
    print("Loki delivery against Loki 3.x default limits (receiver on 127.0.0.1, same process)")
    print("flood*: tenant limit raised to 16 MiB/s, per-stream limit 1 MiB/s, burst 2 MiB")
    header = (
        f"{'workload':8} {'push design':24} {'lines':>7} {'lines/s':>9} {'requests/s':>10} "
        f"{'429s':>5} {'stored':>7} {'counted sent':>12} {'exact':>6}"
    )
    print(header)
    for name, one_stream, r in rows:
        design = "one stream per push" if one_stream else "several streams per push"
        print(
            f"{name:8} {design:24} {r.lines:7d} {r.lines / r.seconds:9,.0f} "
            f"{r.requests / r.seconds:10.1f} {r.throttled:5d} {r.distinct:7d} {r.sent:12d} "
            f"{'yes' if r.exact else 'NO':>6}"
        )
    print("stored: distinct lines the receiver holds; exact: every line stored once and counted sent, none lost")


if __name__ == "__main__":
    main()
