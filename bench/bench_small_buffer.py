"""What a small `max_bytes` loses at a steady rate to a real InfluxDB 1.6.7 that keeps up.

`max_bytes` bounds the raw records waiting to be encoded too (about 1 KB per
10-field point): a few MiB hold fewer records than a batch (5,000). The sender
must be woken before they fill it, or `log()` drops their oldest while it sleeps.
For each `max_bytes`, a process of its own logs 10-field points at `--rate` for
`--seconds`; printed: points logged, stored (read back), dropped. `--baseline REV`
runs the client of git revision REV too, alternated.

    python bench/bench_small_buffer.py
    python bench/bench_small_buffer.py --baseline cc23d50 --sizes 2 4 8
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from _common import ROOT, extract, run_client
from servers import influxdb_v1

CHILD = r"""
import json, sys, time
import telemetry_client
from telemetry_client import BufferSettings, MetricsLogger

url, database = sys.argv[1], sys.argv[2]
max_bytes, rate, seconds = int(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5])
logger = MetricsLogger(url=url, database=database, api_version=1, uid=1, role="miner", self_metrics_interval=None,
                       buffer=BufferSettings(max_bytes=max_bytes))
points = int(rate * seconds)
start = time.perf_counter()
for i in range(points):
    fields = {f"field_{k}": i * 0.5 + k for k in range(10)}
    logger.log("small", {"node": "a"}, fields, timestamp=1_700_000_000_000_000_000 + i)
    if i % 100 == 0:  # paced: `rate` points/s
        ahead = start + i / rate - time.perf_counter()
        if ahead > 0:
            time.sleep(ahead)
left = logger.flush(60)
stats = logger.stats()
logger.close(1)
result = {"client": telemetry_client.__file__, "logged": points, "left": left, "dropped": stats["dropped_by_reason"]}
print(json.dumps(result))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=10_000.0, help="points/s")
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--sizes", type=float, nargs="+", default=[2.0, 4.0, 8.0], help="max_bytes in MiB")
    parser.add_argument("--baseline", help="a git revision whose client runs beside this one")
    args = parser.parse_args()
    print(f"10-field points at {args.rate:,.0f} points/s for {args.seconds:g} s to InfluxDB 1.6.7 on loopback")
    print(f"{'client':20} {'max_bytes':>10} {'logged':>8} {'stored':>8}  dropped")
    with tempfile.TemporaryDirectory(prefix="bench-baseline-") as tmp, influxdb_v1() as server:
        clients = {"current": ROOT}
        if args.baseline:
            clients[f"at {args.baseline}"] = extract(args.baseline, Path(tmp))
        for index, size in enumerate(args.sizes):
            for client_index, (name, code) in enumerate(clients.items()):
                database = f"small{index}_{client_index}"
                server.create_database(database)
                child_args = [server.url, database, str(int(size * 1024 * 1024)), str(args.rate), str(args.seconds)]
                result = run_client(code, CHILD, child_args)
                rows = server.rows('SELECT count("field_0") FROM "small"', database)
                stored = rows[0]["count"] if rows else 0
                print(
                    f"{name:20} {size:>6g} MiB {result['logged']:>8,} {stored:>8,}  {result['dropped'] or 'none'}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
