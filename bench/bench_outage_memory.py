"""Memory through an outage: RSS growth while the server is down for 60 s at 10,000 points/s.

The logger's buffer is bounded (here 100,000 items / 16 MiB); once full it drops
the oldest points and counts them. This prints the RSS growth every 10 s and at
the end, against the configured byte bound. `--seconds` shortens the run.
"""

from __future__ import annotations

import argparse
import gc
import time

import psutil
from _common import ROOT  # noqa: F401  (puts tests/ on sys.path)
from servers import free_port

from telemetry_client.metrics import MetricsLogger
from telemetry_client.shipping import BufferSettings

RATE = 10_000
BUFFER = BufferSettings(max_items=100_000, max_bytes=16 * 1024 * 1024, retry_cap=5.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=int, default=60)
    args = parser.parse_args()
    process = psutil.Process()
    logger = MetricsLogger(
        url=f"http://127.0.0.1:{free_port()}",
        api_version=1,
        uid=1,
        role="miner",
        buffer=BUFFER,
        self_metrics_interval=None,
    )
    fields = {f"field_{k}": k * 0.5 for k in range(10)}
    logger.log("warmup", fields=fields)
    gc.collect()
    baseline = process.memory_info().rss
    peak = baseline
    start = time.monotonic()
    sent = 0
    print(
        f"server down; logging {RATE} points/s for {args.seconds} s; buffer {BUFFER.max_items} items, "
        f"{BUFFER.max_bytes / 2**20:.0f} MiB"
    )
    next_report = 10
    while (elapsed := time.monotonic() - start) < args.seconds:
        due = int(elapsed * RATE)
        while sent < due:
            logger.log("outage", fields=fields)
            sent += 1
        peak = max(peak, process.memory_info().rss)
        if elapsed >= next_report:
            stats = logger.stats()
            print(
                f"  t={elapsed:4.0f}s  rss +{(peak - baseline) / 2**20:6.1f} MiB  pending {stats['pending']:7d} "
                f"({stats['pending_bytes'] / 2**20:5.1f} MiB)  dropped {stats['dropped']:7d}"
            )
            next_report += 10
        time.sleep(0.01)
    stats = logger.stats()
    print(
        f"logged {sent} points; buffered {stats['pending']} ({stats['pending_bytes'] / 2**20:.1f} MiB compressed); "
        f"dropped {stats['dropped_by_reason']}"
    )
    growth = peak - baseline
    verdict = "within" if growth <= BUFFER.max_bytes else "OVER"
    print(f"peak RSS growth: {growth / 2**20:.1f} MiB, {verdict} the {BUFFER.max_bytes / 2**20:.0f} MiB buffer bound")
    logger.close(0.5)


if __name__ == "__main__":
    main()
