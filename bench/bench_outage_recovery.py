"""What an outage of the store costs one process logging at a steady rate, and how soon delivery resumes.

A child process logs 10-field points at `--rate` (default 10,000/s) with the default
buffer settings into a real InfluxDB 1.6.7 of this run's own, while the server:

- **kill**: is SIGKILLed for `--outage` seconds (default 15; the port refuses
  connections), then restarted on the same data;
- **pause**: is SIGSTOPped for `--pause` seconds (default 20; connections are
  accepted and never answered, each request waits for its read timeout), then
  SIGCONTed.

It prints what was logged and stored, what the client counted dropped (by reason),
how many runs of consecutive points were lost (1: the oldest went, as one run), the
most points the client held at once ("peak"), and for "kill" how long the server was
down (from the kill to the restarted server answering `/ping`) and the time from
then to the client's first delivery ("resume"; the child samples its counters every
50 ms). Every point carries its index
as a field and timestamp, so the stored set is read back exactly.

`--baseline REV` runs the same scenarios, alternated, with the client of git revision
REV (its `telemetry_client/` extracted to a temporary directory), to compare a
change with what it replaced.

    python bench/bench_outage_recovery.py
    python bench/bench_outage_recovery.py --baseline HEAD~3 --rounds 3 --scenario kill
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from _common import ROOT, extract
from servers import influxdb_v1_for_outages

TS = 1_700_000_000_000_000_000
CHILD = r"""
import json, sys, threading, time
import telemetry_client
from telemetry_client import MetricsLogger

url, rate, seconds, ts = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
logger = MetricsLogger(url=url, database="bench", api_version=1, self_metrics_interval=None)
fields = {f"field_{k}": k * 0.5 for k in range(9)}
done = threading.Event()
out = threading.Lock()


def say(**what):
    with out:
        sys.stdout.write(json.dumps(what) + "\n")
        sys.stdout.flush()


def sample():
    while not done.is_set():
        stats = logger.stats()
        say(t=time.monotonic(), sent=stats["sent"], pending=stats["pending"])
        time.sleep(0.05)


threading.Thread(target=sample, daemon=True).start()
say(started=time.monotonic(), client=telemetry_client.__file__)
began = time.monotonic()
total = int(rate * seconds)
for i in range(total):
    logger.log("outage", fields={**fields, "i": i}, timestamp=ts + i)
    if i % 100 == 99:
        time.sleep(max(0.0, began + (i + 1) / rate - time.monotonic()))
left = logger.flush(120)
done.set()
time.sleep(0.1)
say(final=logger.stats(), left=left, logged=total, began=began)
"""


@dataclass
class Run:
    scenario: str
    client: str
    logged: int = 0
    stored: int = 0
    dropped: dict[str, int] = field(default_factory=dict)
    lost_runs: int = 0
    resume: float | None = None
    down: float | None = None  # kill: from the kill to the restarted server answering /ping
    peak_pending: int = 0
    note: str = ""


def runs_of(ids: list[int]) -> int:
    """How many runs of consecutive integers a sorted list holds."""
    return sum(1 for index, value in enumerate(ids) if index == 0 or ids[index - 1] != value - 1)


def one_run(scenario: str, client: str, code: Path, args: argparse.Namespace) -> Run:
    run = Run(scenario, client)
    outage = args.outage if scenario == "kill" else args.pause
    seconds = args.before + outage + args.after
    with influxdb_v1_for_outages() as server:
        server.create_database("bench")
        env = {**os.environ, "PYTHONPATH": str(code)}
        child = subprocess.Popen(
            [sys.executable, "-c", CHILD, server.url, str(args.rate), str(seconds), str(TS)],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=env,
            cwd=code,  # `python -c` imports from the working directory first
        )
        lines: list[dict] = []
        reader = threading.Thread(target=lambda: lines.extend(json.loads(line) for line in child.stdout), daemon=True)
        reader.start()
        while not any("started" in line for line in lines):
            if child.poll() is not None:
                raise RuntimeError(f"the child ended with {child.returncode} before logging")
            time.sleep(0.01)
        first = next(line for line in lines if "started" in line)
        if not Path(first["client"]).is_relative_to(code):
            raise RuntimeError(f"the child imported {first['client']}, not the client under {code}")
        started = first["started"]
        time.sleep(max(0.0, started + args.before - time.monotonic()))
        up = None
        if scenario == "kill":
            killed = time.monotonic()
            server.kill()
            time.sleep(outage)
            server.start()  # returns once /ping answers
            up = time.monotonic()
            run.down = up - killed
        else:
            server.pause()
            time.sleep(outage)
            server.resume()
        child.wait(timeout=seconds + 300)
        reader.join(timeout=10)
        final = next(line for line in lines if "final" in line)
        rows = server.rows('SELECT "field_0", "i" FROM "outage"', "bench")
    stored = sorted({int(row["i"]) for row in rows})
    stats = final["final"]
    run.logged, run.stored, run.dropped = final["logged"], len(stored), stats["dropped_by_reason"]
    lost = sorted(set(range(run.logged)) - set(stored))
    run.lost_runs = runs_of(lost)
    samples = [line for line in lines if "t" in line]
    run.peak_pending = max(sample["pending"] for sample in samples)
    if up is not None:
        before = max((s["sent"] for s in samples if s["t"] <= up), default=0)
        resumed = next((s["t"] for s in samples if s["t"] > up and s["sent"] > before), None)
        run.resume = None if resumed is None else resumed - up
    if lost:
        rate = args.rate
        run.note = f"lost logged {lost[0] / rate:.1f}-{(lost[-1] + 1) / rate:.1f} s into the run"
    if stats["sent"] != run.stored:
        run.note += f"; counted sent {stats['sent']:,} but stored {run.stored:,}"
    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scenario", choices=("kill", "pause", "both"), default="both")
    parser.add_argument("--rate", type=float, default=10_000.0, help="points/s the child logs")
    parser.add_argument("--outage", type=float, default=15.0, help="seconds the server is killed")
    parser.add_argument("--pause", type=float, default=20.0, help="seconds the server is paused")
    parser.add_argument("--before", type=float, default=5.0, help="seconds of logging before the outage")
    parser.add_argument("--after", type=float, default=15.0, help="seconds of logging after it")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--baseline", help="a git revision whose client runs the same scenarios, alternated")
    args = parser.parse_args()
    scenarios = ("kill", "pause") if args.scenario == "both" else (args.scenario,)
    with tempfile.TemporaryDirectory(prefix="bench-baseline-") as tmp:
        clients = {"current": ROOT}
        if args.baseline:
            clients[f"baseline {args.baseline}"] = extract(args.baseline, Path(tmp))
        print(
            f"{args.rate:,.0f} points/s, default settings; kill {args.outage:g} s, pause {args.pause:g} s; "
            f"load average {os.getloadavg()[0]:.1f}"
        )
        header = (
            f"{'scenario':8} {'client':22} {'logged':>8} {'stored':>8} {'runs':>4} {'down s':>6} {'resume s':>8} "
            f"{'peak':>8}"
        )
        print(header, " dropped")
        results: list[Run] = []
        for _ in range(args.rounds):
            for scenario in scenarios:
                for client, code in clients.items():
                    run = one_run(scenario, client, code, args)
                    results.append(run)
                    resume = "" if run.resume is None else f"{run.resume:.2f}"
                    down = "" if run.down is None else f"{run.down:.1f}"
                    print(
                        f"{run.scenario:8} {run.client:22} {run.logged:8,} {run.stored:8,} {run.lost_runs:4} "
                        f"{down:>6} {resume:>8} {run.peak_pending:8,}  {run.dropped or '{}'} {run.note}",
                        flush=True,
                    )
        for client in clients:
            delays = [r.resume for r in results if r.client == client and r.resume is not None]
            if delays:
                print(
                    f"{client}: resume after the restart, median {statistics.median(delays):.2f} s, "
                    f"max {max(delays):.2f} s over {len(delays)} runs"
                )
        print("load average at the end", f"{os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
