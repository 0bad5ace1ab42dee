"""Where log()'s slow calls come from when one process floods a server that is down.

Each run logs 10-field points as fast as one process can (as bench_outage_memory.py)
and times every call. For every call slower than 2 ms it also reads the calling
thread's CPU time and the process's, which tells the three causes apart:

- `caller`: the calling thread itself computed (a garbage-collection pass it
  triggered, for one);
- `sender`: the sender thread ran while the caller waited (it held the GIL);
- `OS`: neither ran: the machine gave the process no core.

It also records every full (generation 2) collection's CPU time with
`gc.callbacks`. Runs alternate between the default `max_bytes` (64 MiB) and 16 MiB,
which bounds how many raw records wait to be encoded. The load average is printed
with each run: on a shared machine the `OS` share and the maxima follow it.

    python bench/bench_log_stalls.py --seconds 15 --rounds 3
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import threading
import time

from _common import ROOT, percentile

from telemetry_client import BufferSettings

FIELDS = {f"field_{k}": k * 0.5 for k in range(10)}
SLOW_NS = 2_000_000
DEFAULT_MAX_BYTES = BufferSettings().max_bytes
SETTINGS = {f"{DEFAULT_MAX_BYTES / 2**20:g} MiB": DEFAULT_MAX_BYTES, "16 MiB": 16 * 2**20}


def run_one(max_bytes: int, seconds: float, url: str) -> dict:
    from telemetry_client import BufferSettings
    from telemetry_client.metrics import MetricsLogger

    full_passes: list[float] = []
    started: dict[str, int] = {}

    def on_gc(phase: str, info: dict) -> None:
        if info["generation"] != 2:
            return
        if phase == "start":
            started[threading.current_thread().name] = time.thread_time_ns()
        else:
            full_passes.append((time.thread_time_ns() - started.pop(threading.current_thread().name, 0)) / 1e6)

    logger = MetricsLogger(
        url=url,
        api_version=1,
        uid=1,
        role="miner",
        self_metrics_interval=None,
        buffer=BufferSettings(max_bytes=max_bytes),
    )
    log = logger.log
    log("warmup", fields=FIELDS)
    gc.collect()
    gc.callbacks.append(on_gc)
    wall, own_cpu, all_cpu = time.perf_counter_ns, time.thread_time_ns, time.process_time_ns
    timings: list[int] = []
    causes = {"caller": 0, "sender": 0, "OS": 0}
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for _ in range(1000):
            p0, c0, t0 = all_cpu(), own_cpu(), wall()
            log("outage", fields=FIELDS)
            t1, c1, p1 = wall(), own_cpu(), all_cpu()
            elapsed = t1 - t0
            timings.append(elapsed)
            if elapsed > SLOW_NS:
                own, others = c1 - c0, (p1 - p0) - (c1 - c0)
                cause = "caller" if own > elapsed / 2 else "sender" if others > elapsed / 2 else "OS"
                causes[cause] += 1
    gc.callbacks.remove(on_gc)
    waiting = len(logger.channel._intake)  # raw records not yet encoded at the end
    timings.sort()
    return {
        "rate": len(timings) / seconds,
        "p50_us": percentile(timings, 0.50) / 1e3,
        "p999_us": percentile(timings, 0.999) / 1e3,
        "max_ms": timings[-1] / 1e6,
        "slow": causes,
        "full_gc_ms": sorted(full_passes),
        "waiting": waiting,
        "load": os.getloadavg()[0],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--only", help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.only:
        print(json.dumps(run_one(SETTINGS[args.only], args.seconds, args.url)), flush=True)
        os._exit(0)  # the sender would retry into the dead server until the exit deadline

    from servers import free_port

    url = f"http://127.0.0.1:{free_port()}"  # nothing listens: the server is down
    print(f"server down; 10-field points as fast as one process can, {args.seconds:.0f} s per run")
    print(
        f"{'max_bytes':9} {'load':>5} {'points/s':>9} {'p50 µs':>7} {'p99.9 µs':>9} {'max ms':>7} "
        f"{'raw waiting':>11} {'full GC passes, CPU ms':>24}  calls > 2 ms by cause"
    )
    results: dict[str, list[dict]] = {name: [] for name in SETTINGS}
    for _ in range(args.rounds):
        for name in SETTINGS:
            out = subprocess.run(
                [sys.executable, __file__, "--only", name, "--seconds", str(args.seconds), "--url", url],
                capture_output=True,
                text=True,
                cwd=ROOT,
                check=True,
            ).stdout
            r = json.loads(out.strip().splitlines()[-1])
            results[name].append(r)
            passes = ", ".join(f"{ms:.0f}" for ms in r["full_gc_ms"]) or "-"
            slow = ", ".join(f"{cause} {count}" for cause, count in r["slow"].items())
            print(
                f"{name:9} {r['load']:5.1f} {r['rate']:9,.0f} {r['p50_us']:7.2f} {r['p999_us']:9.1f} "
                f"{r['max_ms']:7.1f} {r['waiting']:11,} {passes:>24}  {slow}",
                flush=True,
            )
    for name, runs in results.items():
        passes = [ms for r in runs for ms in r["full_gc_ms"]]
        print(
            f"{name} medians over {len(runs)} runs: p99.9 {statistics.median(r['p999_us'] for r in runs):.0f} µs, "
            f"max {statistics.median(r['max_ms'] for r in runs):.0f} ms; full GC passes "
            f"{min(passes, default=0):.0f}-{max(passes, default=0):.0f} ms CPU"
        )


if __name__ == "__main__":
    main()
