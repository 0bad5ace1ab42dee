"""Memory and caller latency through an outage, at the highest rate one process reaches.

The server is down (nothing listens on the port) for the whole run. One process
calls log() with 10 fields as fast as it can for `--seconds` (or at `--rate`
points/s, a pace the sender keeps up with, so that what the buffer holds is
encoded batches rather than records waiting to be encoded), with the default
buffer settings (max_bytes 64 MiB), and prints the peak RSS growth against that
bound, the rate reached, and log()'s p99.9 and maximum. influxdb_client's batching
WriteApi.write(Point) runs the same loop in its own process. Each runs in a fresh
interpreter so that one's memory cannot hide in the other's figures.
"""

from __future__ import annotations

import argparse
import array
import gc
import json
import os
import subprocess
import sys
import time

from _common import ROOT, percentile

FIELDS = {f"field_{k}": k * 0.5 for k in range(10)}
MAX_CALLS_PER_SECOND = 400_000  # room for the latency samples, allocated before the baseline
RSS_CEILING = 2 * 1024**3  # a run stops early rather than exhaust a shared machine


def make_metrics_logger(url: str):
    from telemetry_client.metrics import MetricsLogger

    logger = MetricsLogger(url=url, api_version=1, uid=1, role="miner", self_metrics_interval=None)
    return logger.log, lambda: logger.close(0.5), logger.channel.settings.max_bytes, logger.stats


def make_influxdb_client(url: str):
    from influxdb_client import InfluxDBClient, Point
    from influxdb_client.client.write_api import WriteOptions

    client = InfluxDBClient(url=url, token="bench-token", org="o")
    write_api = client.write_api(write_options=WriteOptions(batch_size=5_000, flush_interval=1_000))

    def log(measurement: str, fields: dict) -> None:
        point = Point(measurement).tag("uid", "1").tag("role", "miner")
        for key, value in fields.items():
            point.field(key, value)
        write_api.write(bucket="b", record=point)

    return log, None, None, None


def run_one(which: str, seconds: float, url: str, rate: float = 0.0) -> dict:
    import psutil

    log, close, bound, stats = (make_metrics_logger if which == "MetricsLogger" else make_influxdb_client)(url)
    timings = array.array("I", bytes(4 * int(MAX_CALLS_PER_SECOND * seconds)))  # 100 ns units
    log("warmup", fields=FIELDS)
    gc.collect()
    process = psutil.Process()
    baseline = peak = process.memory_info().rss
    clock = time.perf_counter_ns
    calls = 0
    start = time.monotonic()
    stopped = ""
    while calls < len(timings):
        for _ in range(1000):
            t0 = clock()
            log("outage", fields=FIELDS)
            timings[calls] = min(0xFFFFFFFF, (clock() - t0) // 100)
            calls += 1
        if rate:  # wait until this chunk's share of the run is due
            time.sleep(max(0.0, start + calls / rate - time.monotonic()))
        if calls % 20_000 == 0:
            peak = max(peak, process.memory_info().rss)
            if peak - baseline > RSS_CEILING:
                stopped = f"stopped early: RSS grew past {RSS_CEILING / 2**30:.0f} GiB"
                break
            if time.monotonic() - start >= seconds:
                break
    elapsed = time.monotonic() - start
    peak = max(peak, process.memory_info().rss)
    sample = sorted(timings[:calls])
    result = {
        "which": which,
        "calls": calls,
        "rate": calls / elapsed,
        "rss_growth": peak - baseline,
        "bound": bound,
        "p50_us": percentile(sample, 0.50) / 10,
        "p999_us": percentile(sample, 0.999) / 10,
        "max_us": sample[-1] / 10,
        "stopped": stopped,
    }
    if stats is not None:
        s = stats()
        result["pending"] = s["pending"]
        result["pending_bytes"] = s["pending_bytes"]
        result["dropped"] = s["dropped_by_reason"]
    if close is not None:
        close()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--rate", type=float, default=0.0, help="points/s to log (default: as fast as possible)")
    parser.add_argument("--only", help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.only:
        print(json.dumps(run_one(args.only, args.seconds, args.url, args.rate)), flush=True)
        os._exit(0)  # influxdb_client's writer would retry into the dead server before letting the process end

    from servers import free_port

    url = f"http://127.0.0.1:{free_port()}"  # nothing listens: the server is down
    pace = f"at {args.rate:,.0f} points/s" if args.rate else "as fast as one process can"
    print(f"server down; each client logs 10-field points {pace} for {args.seconds:.0f} s")
    results = []
    for which in ("MetricsLogger", "influxdb_client"):
        out = subprocess.run(
            [
                sys.executable,
                __file__,
                "--only",
                which,
                "--seconds",
                str(args.seconds),
                "--rate",
                str(args.rate),
                "--url",
                url,
            ],
            capture_output=True,
            text=True,
            cwd=ROOT,
            check=True,
        ).stdout
        results.append(json.loads(out.strip().splitlines()[-1]))
    print(f"{'':18} {'points/s':>10} {'RSS growth':>11} {'bound':>8} {'p50 µs':>8} {'p99.9 µs':>9} {'max ms':>8}")
    for r in results:
        bound = f"{r['bound'] / 2**20:.0f} MiB" if r["bound"] else "none"
        print(
            f"{r['which']:18} {r['rate']:10,.0f} {r['rss_growth'] / 2**20:7.1f} MiB {bound:>8} "
            f"{r['p50_us']:8.2f} {r['p999_us']:9.1f} {r['max_us'] / 1000:8.1f}  {r['stopped']}"
        )
    ours = results[0]
    print(
        f"MetricsLogger: {ours['calls']:,} points logged; buffered {ours['pending']:,} "
        f"({ours['pending_bytes'] / 2**20:.1f} MiB accounted); dropped {ours['dropped']}"
    )
    verdict = "within" if ours["rss_growth"] <= ours["bound"] else "OVER"
    print(f"peak RSS growth {ours['rss_growth'] / 2**20:.1f} MiB: {verdict} the {ours['bound'] / 2**20:.0f} MiB bound")


if __name__ == "__main__":
    main()
