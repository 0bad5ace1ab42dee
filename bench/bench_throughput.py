"""Points per second delivered from one process to a real InfluxDB 1.6.7, against the server's ceiling.

The ceiling is the same data, pre-encoded into the same batches and gzip bodies,
POSTed back to back over one connection: what the server takes when the client
costs nothing. The client runs in a process of its own, which logs the points as
fast as it can and flushes; it is given room for every point (a drop would make
the rate meaningless, and a fast machine's caller outruns the sender most). Both
run against the same fresh server in one run, alternated, round after round: the
server's speed drifts. Each run starts once the server is quiet (`wait_until_quiet`).
The CPU time of each side is measured too.

Two placements, each with a server of its own, one after the other:

- `separate`: the server on one half of the machine's cores (the larger half of
  an odd number), the client (and the ceiling's sender) on the other, as when
  the server is another machine: what the client's pipeline delivers of what
  the server can take. The halves are of physical cores where the machine says
  which CPUs share one. On 2 cores the client has one: its gzip, which runs
  without the interpreter lock, then shares it with the caller.
- `shared`: every process on every core, as when the server runs beside the
  training: the client's CPU is then taken from the server's, and the sum of
  both sides' CPU over the cores bounds what the client can reach.

Each round's ceiling and client run back to back and are compared with each
other; the best client run against the best ceiling is printed too (a busy
machine only ever slows a run down).

`--baseline REV` also runs the client of git revision REV (its `telemetry_client/`
extracted to a temporary directory) in every round, to compare a change with
what it replaced on the same server and machine.

    python bench/bench_throughput.py
    python bench/bench_throughput.py --baseline HEAD~1 --rounds 5 --placement shared
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import psutil
import urllib3
from _common import ROOT, extract, run_client
from servers import influxdb_v1

POINTS = 300_000
BATCH = 5_000
QUIET_WINDOW = 1.25  # seconds without server work before each run (`wait_until_quiet`)
TS = 1_700_000_000_000_000_000
# The client's process: reads the 1,000 (tags, fields) pairs it cycles through on stdin,
# so that it logs exactly the data the ceiling's bodies hold. The caller's own work
# (building its dicts) is done before the clock starts: this measures what the client
# costs, as the ceiling measures what the server costs.
CHILD = r"""
import json, sys, time
import telemetry_client
from telemetry_client import BufferSettings, MetricsLogger

url, database, points, batch, ts = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
records = [(tags, fields) for tags, fields in json.load(sys.stdin)]
logger = MetricsLogger(
    url=url, database=database, api_version=1, uid=1, role="miner", self_metrics_interval=None,
    buffer=BufferSettings(batch_items=batch, max_items=points, max_bytes=points * 4_096),
)
cpu = time.process_time()
start = time.perf_counter()
for i in range(points):
    tags, fields = records[i % 1_000]
    logger.log("throughput", tags, fields, timestamp=ts + i)
left = logger.flush(120)
elapsed = time.perf_counter() - start
cpu = time.process_time() - cpu
print(json.dumps({"client": telemetry_client.__file__, "left": left, "sent": logger.stats()["sent"],
                  "elapsed": elapsed, "cpu": cpu}))
logger.close(1)
"""


@dataclass
class Round:
    rate: float  # points/s
    server_cpu: float  # seconds
    client_cpu: float  # seconds (0 for the ceiling, whose client is not measured)


def records() -> list[tuple[dict[str, str], dict[str, float]]]:
    """The 1,000 (tags, fields) pairs both sides cycle through: 10 float fields each."""
    return [({"node": str(i % 16)}, {f"field_{k}": (i % 1_000) * 0.25 + k for k in range(10)}) for i in range(1_000)]


def ceiling_bodies(points: int) -> list[bytes]:
    """The ceiling's request bodies: the points' line protocol in batches, gzipped."""
    pairs = records()
    lines = []
    for i in range(points):
        tags, fields = pairs[i % 1_000]
        lines.append(
            f"throughput,node={tags['node']},role=miner,uid=1 "
            + ",".join(f"{k}={v}" for k, v in sorted(fields.items()))
            + f" {TS + i}\n"
        )
    return [gzip.compress("".join(lines[i : i + BATCH]).encode(), 1) for i in range(0, points, BATCH)]


def ceiling_rate(url: str, database: str, bodies: list[bytes], points: int) -> float:
    """Points per second the server takes when the bodies are POSTed back to back over one connection."""
    pool = urllib3.PoolManager(maxsize=1)
    headers = {"Content-Encoding": "gzip", "Content-Type": "text/plain"}
    start = time.perf_counter()
    for body in bodies:
        response = pool.request("POST", f"{url}/write?db={database}&precision=n", body=body, headers=headers)
        assert response.status == 204, response.data
    return points / (time.perf_counter() - start)


def client_run(code: Path, url: str, database: str, points: int) -> tuple[float, float]:
    """The client under `code` logging `points` points in a process of its own: (points/s, its CPU seconds)."""
    result = run_client(code, CHILD, [url, database, str(points), str(BATCH), str(TS)], json.dumps(records()))
    if result["left"] or result["sent"] != points:
        raise RuntimeError(f"the client delivered {result['sent']:,} of {points:,} points ({result['left']} left)")
    return points / result["elapsed"], result["cpu"]


def _cpu_seconds(process: psutil.Process) -> float:
    times = process.cpu_times()
    return times.user + times.system


def wait_until_quiet(process: psutil.Process, timeout: float = 30.0) -> None:
    """Wait until `process` has used at most 2% of a core for `QUIET_WINDOW` seconds (at most `timeout` s).

    InfluxDB keeps working for a while after a run: it writes its cache out once
    about 25 MB of values are in it (0.3-0.5 CPU seconds after 300,000 points here),
    and it looks at the cache once a second (influxdb tsdb/engine/tsm1/engine.go,
    `compactCache`), so the window is longer than that. Without this pause that
    work falls into the next run: into the client's, which starts a fraction of a
    second after the ceiling's, never into the ceiling's, whose bodies take a
    second to prepare. (CPU time comes in clock ticks of 10 ms: 2% of 1.25 s is two.)
    """
    deadline = time.monotonic() + timeout
    before = _cpu_seconds(process)
    while time.monotonic() < deadline:
        time.sleep(QUIET_WINDOW)
        now = _cpu_seconds(process)
        if now - before <= QUIET_WINDOW * 0.02:
            return
        before = now
    print(f"the server was still busy after {timeout:.0f} s: this run starts anyway", flush=True)


@dataclass(frozen=True)
class Placement:
    """Which cores the server runs on, and which the client and the ceiling's sender (None: all of them)."""

    name: str
    server_cores: frozenset[int] | None
    client_cores: frozenset[int] | None

    def describe(self) -> str:
        if self.server_cores is None:
            return "server and client share every core"
        return f"server on core(s) {_cores(self.server_cores)}, client on core(s) {_cores(self.client_cores)}"


def placements(cpus: set[int], wanted: str) -> list[Placement]:
    """The placements `--placement` asks for; `separate` needs two physical cores at least."""
    cores = _physical_cores(cpus)
    half = len(cores) // 2
    chosen = []
    if wanted in ("separate", "both"):
        if half:
            chosen.append(
                Placement(
                    "separate",
                    frozenset(cpu for core in cores[half:] for cpu in core),
                    frozenset(cpu for core in cores[:half] for cpu in core),
                )
            )
        else:
            print("placement separate skipped: one core only", flush=True)
    if wanted in ("shared", "both"):
        chosen.append(Placement("shared", None, None))
    return chosen


def _physical_cores(cpus: set[int]) -> list[list[int]]:
    """`cpus` grouped by the physical core they share (Linux's sysfs topology), one group per CPU without it."""
    groups: dict[tuple[str, str] | int, list[int]] = {}
    for cpu in sorted(cpus):
        topology = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology")
        try:
            key: tuple[str, str] | int = (
                (topology / "physical_package_id").read_text().strip(),
                (topology / "core_id").read_text().strip(),
            )
        except OSError:
            key = cpu
        groups.setdefault(key, []).append(cpu)
    return list(groups.values())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--points", type=int, default=POINTS)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--baseline", help="a git revision whose client runs in every round too")
    parser.add_argument("--placement", choices=("both", "separate", "shared"), default="both")
    args = parser.parse_args()
    cores = os.sched_getaffinity(0)
    with tempfile.TemporaryDirectory(prefix="bench-baseline-") as tmp:
        clients = {"current": ROOT}
        if args.baseline:
            clients[f"baseline {args.baseline}"] = extract(args.baseline, Path(tmp))
        chosen = placements(cores, args.placement)
        if not chosen:
            parser.error(f"--placement {args.placement} needs two cores or more")
        for placement in chosen:
            print(f"placement {placement.name}: {placement.describe()}", flush=True)
            load = os.getloadavg()[0]
            results, stored = run_placement(placement, clients, args, cores)
            report(results, stored, args, placement, len(cores), load)


def run_placement(
    placement: Placement, clients: dict[str, Path], args: argparse.Namespace, cores: set[int]
) -> tuple[dict[str, list[Round]], dict[str, list[int]]]:
    """`args.rounds` rounds of the ceiling and every client, on a fresh server placed as `placement` says."""
    results: dict[str, list[Round]] = {"ceiling": [], **{name: [] for name in clients}}
    stored: dict[str, list[int]] = {name: [] for name in clients}
    try:
        if placement.server_cores is not None:
            os.sched_setaffinity(0, placement.server_cores)  # the server inherits it
        with influxdb_v1() as server:
            if placement.client_cores is not None:
                # This process (it sends the ceiling) and the clients it starts.
                os.sched_setaffinity(0, placement.client_cores)
            (influxd,) = [p for p in psutil.Process().children(recursive=True) if p.name() == "influxd"]
            for round_ in range(args.rounds):
                database = f"ceiling{round_}"
                server.create_database(database)
                bodies = ceiling_bodies(args.points)
                wait_until_quiet(influxd)
                before = _cpu_seconds(influxd)
                rate = ceiling_rate(server.url, database, bodies, args.points)
                results["ceiling"].append(Round(rate, _cpu_seconds(influxd) - before, 0.0))
                for index, (name, code) in enumerate(clients.items()):
                    database = f"client{round_}_{index}"
                    server.create_database(database)
                    wait_until_quiet(influxd)
                    before = _cpu_seconds(influxd)
                    rate, client_cpu = client_run(code, server.url, database, args.points)
                    results[name].append(Round(rate, _cpu_seconds(influxd) - before, client_cpu))
                    rows = server.rows('SELECT count("field_0") FROM "throughput"', database)
                    stored[name].append(rows[0]["count"])
                print(
                    f"round {round_ + 1}: "
                    + ", ".join(f"{name} {runs[-1].rate:,.0f}" for name, runs in results.items())
                    + " points/s",
                    flush=True,
                )
    finally:
        os.sched_setaffinity(0, cores)
    return results, stored


def report(
    results: dict[str, list[Round]],
    stored: dict[str, list[int]],
    args: argparse.Namespace,
    placement: Placement,
    cores: int,
    load: float,
) -> None:
    ceilings = results["ceiling"]
    ceiling = statistics.median(r.rate for r in ceilings)
    print(
        f"{args.points:,} points, 10 fields, batches of {BATCH:,}, InfluxDB 1.6.7 on loopback, {args.rounds} rounds, "
        f"{cores} cores ({placement.describe()}), load average {load:.1f} at the start, "
        f"{os.getloadavg()[0]:.1f} at the end"
    )
    print(f"{'server ceiling (pre-encoded batches)':40} {ceiling:10,.0f} points/s median  ({_rates(ceilings)})")
    best_ceiling = max(r.rate for r in ceilings)
    for name, runs in results.items():
        if name == "ceiling":
            continue
        rate = statistics.median(r.rate for r in runs)
        # Per round, against that round's ceiling: the server's speed drifts between rounds.
        shares = [r.rate / c.rate for r, c in zip(runs, ceilings, strict=True)]
        print(
            f"{'MetricsLogger, one process: ' + name:40} {rate:10,.0f} points/s median  ({_rates(runs)}); "
            f"of the round's ceiling: median {statistics.median(shares):.0%} "
            f"({', '.join(f'{s:.0%}' for s in shares)}); "
            f"best against best {max(r.rate for r in runs) / best_ceiling:.0%}"
        )
        print(
            f"{'':40} stored {', '.join(f'{n:,}' for n in stored[name])}; CPU seconds per round, server + client: "
            + "; ".join(f"{r.server_cpu:.2f} + {r.client_cpu:.2f}" for r in runs)
            + f"; client CPU per point {statistics.median(r.client_cpu for r in runs) / args.points * 1e6:.1f} us"
        )
        if placement.server_cores is None:
            # The server's own work at the ceiling plus the client's, spread over the cores.
            bounds = [
                args.points / max(args.points / c.rate, (c.server_cpu + r.client_cpu) / cores)
                for r, c in zip(runs, ceilings, strict=True)
            ]
            print(
                f"{'':40} bound on {cores} cores (the ceiling's server CPU plus this client's, over the cores): "
                f"median {statistics.median(bounds) / ceiling:.0%} of the ceiling"
            )


def _cores(cores: frozenset[int] | None) -> str:
    return ",".join(map(str, sorted(cores or ())))


def _rates(runs: list[Round]) -> str:
    return ", ".join(f"{r.rate:,.0f}" for r in runs)


if __name__ == "__main__":
    main()
