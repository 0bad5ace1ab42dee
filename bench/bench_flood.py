"""How hard can the simulated fleet flood the stack with nothing lost?

Starts a real InfluxDB 1.6.7 (tests/servers.py) and the Loki conformance receiver
(tests/loki_receiver.py) on loopback, then climbs a ladder of target rates, about
ten seconds each, with the default fleet (32 miners, 4 validators, an aggregator and
an evaluator) in worker processes. A step passes when the fleet sustained at least
95% of the target rate, delivery kept pace (no more than about a second of records
buffered when the load stops), the clients dropped nothing, and InfluxDB and the
receiver hold exactly what the clients counted as delivered. The ladder stops at the first
step that fails; the last passing step is the highest sustained zero-loss rate.

CPU is the fleet's own (user + system time of the worker processes, with their
sender threads, "us/rec" per point or line), then the InfluxDB server's and this
process's ("bench": the Loki receiver runs here). The machine is shared with
whatever else runs on it; figures drop when it is busy (see `uptime`).

    python bench/bench_flood.py                # the ladder: 5k, 10k, 15k, 20k, 30k, 40k points/s
    python bench/bench_flood.py --steps 2000 8000 --seconds 5

Plain script, no pytest: prints the figures. Runs in well under 3 minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass

from _fleet import FLEET, child_process, flood

from simulator import fleet as fl
from simulator import validate as vd


@dataclass
class Step:
    target_points: float
    target_lines: float
    points_per_sec: float = 0.0
    lines_per_sec: float = 0.0
    points_sent: int = 0
    points_stored: int = 0
    lines_sent: int = 0
    lines_received: int = 0
    client_drops: int = 0
    fleet_cpu: float = 0.0
    influxd_cpu: float = 0.0
    bench_cpu: float = 0.0
    load_seconds: float = 0.0
    close_seconds: float = 0.0
    pending_at_end: int = 0
    verdict: str = ""

    @property
    def passed(self) -> bool:
        return self.verdict == "ok"


def run_step(
    step: Step,
    seconds: float,
    processes: int,
    influx: vd.InfluxQL,
    influx_url: str,
    receiver: object,
    database: str,
    index: int,
) -> Step:
    run = fl.RunIdentity(f"bench-{os.getpid()}-{index}", "benchnet", seed=index)
    targets = fl.Targets(
        influx_url=influx_url,
        database=database,
        api_version=1,
        loki_url=receiver.base_url,  # type: ignore[attr-defined]
        system_interval=1.0,
        self_metrics_interval=1.0,
    )
    result = flood(run, targets, step.target_points, step.target_lines, seconds, processes, child_process("influxd"))
    fleet = result.fleet
    step.close_seconds = result.close_seconds
    step.influxd_cpu = result.server_cpu
    step.bench_cpu = result.own_cpu
    step.fleet_cpu = fleet.cpu_seconds
    step.load_seconds = fleet.load_seconds
    step.pending_at_end = fleet.pending_at_end
    step.points_per_sec = result.points_per_sec
    step.lines_per_sec = result.lines_per_sec

    sent = fleet.metrics["sent_by_key"]
    rows = vd.account(
        "influxdb", sent, lambda keys: vd.influx_counts(influx, run.run_id, result.window, keys), settle=5
    )
    step.points_sent = sum(sent.values())
    step.points_stored = sum(row.stored or 0 for row in rows)
    step.lines_sent = int(fleet.logs.get("sent", 0))
    step.lines_received = sum(
        1
        for entry in receiver.entries  # type: ignore[attr-defined]
        if entry.json().get("run_id") == run.run_id
    )
    step.client_drops = result.client_drops
    problems = result.problems()
    if step.points_stored != step.points_sent or any(row.stored is None for row in rows):
        problems.append(f"points stored {step.points_stored} != sent {step.points_sent}")
    if step.lines_received != step.lines_sent:
        problems.append(f"lines received {step.lines_received} != sent {step.lines_sent}")
    # A partial batch waits up to flush_interval (1 s); more than that buffered when the load
    # stops means delivery was falling behind and a longer run would fill the buffer.
    allowed = 1.5 * (step.target_points + step.target_lines)
    if step.pending_at_end > allowed:
        problems.append(f"delivery falling behind: {step.pending_at_end:,} records buffered at the end")
    step.verdict = "; ".join(problems) or "ok"
    return step


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ladder = [5000, 10000, 15000, 20000, 30000, 40000]
    parser.add_argument("--steps", type=float, nargs="+", default=ladder, help="target points/s, in order")
    parser.add_argument("--lines-ratio", type=float, default=0.1, help="log lines per point (default: %(default)s)")
    parser.add_argument("--seconds", type=float, default=10.0, help="seconds of load per step (default: %(default)s)")
    parser.add_argument("--processes", type=int, default=2, help="fleet worker processes (default: %(default)s)")
    args = parser.parse_args()

    try:
        from loki_receiver import LokiReceiver
        from servers import influxdb_v1
    except ImportError as exc:
        print(f"cannot import the test servers: {exc}", file=sys.stderr)
        return 2
    began = time.monotonic()
    print(f"machine: {os.cpu_count()} cores; fleet: {sum(FLEET.values())} nodes in {args.processes} worker processes")
    try:
        server_cm = influxdb_v1()
        server = server_cm.__enter__()
    except BaseException as exc:  # pytest.skip() when influxd is missing
        print(f"InfluxDB 1.x is not available: {exc}", file=sys.stderr)
        return 2
    results: list[Step] = []
    try:
        database = "bench"
        server.create_database(database)
        influx = vd.InfluxQL(server.url, database)
        with LokiReceiver() as receiver:
            print(
                f"{'target pts/s':>12} {'pts/s':>7} {'lines/s':>7} {'points sent/stored':>19} "
                f"{'lines sent/recv':>15} {'fleet CPU':>9} {'us/rec':>6} {'influxd':>7} {'bench':>6} "
                f"{'backlog':>8} {'close':>6}  verdict"
            )
            for index, rate in enumerate(args.steps):
                step = run_step(
                    Step(rate, rate * args.lines_ratio),
                    args.seconds,
                    args.processes,
                    influx,
                    server.url,
                    receiver,
                    database,
                    index,
                )
                results.append(step)
                records = step.points_sent + step.lines_sent
                per_record = 1e6 * step.fleet_cpu / records if records else 0.0
                columns = [
                    f"{step.target_points:>12,.0f} {step.points_per_sec:>7,.0f} {step.lines_per_sec:>7,.0f}",
                    f"{step.points_sent:>9,}/{step.points_stored:<9,} {step.lines_sent:>7,}/{step.lines_received:<7,}",
                    f"{step.fleet_cpu:>8.1f}s {per_record:>6.1f} {step.influxd_cpu:>6.1f}s {step.bench_cpu:>5.1f}s",
                    f"{step.pending_at_end:>8,} {step.close_seconds:>5.1f}s  {step.verdict}",
                ]
                print(" ".join(columns), flush=True)
                if not step.passed:
                    break
    finally:
        server_cm.__exit__(None, None, None)
    passed = [s for s in results if s.passed]
    if passed:
        best = passed[-1]
        cores = best.fleet_cpu / best.load_seconds if best.load_seconds else 0.0
        print(
            f"highest sustained zero-loss flood: {best.points_per_sec:,.0f} points/s and "
            f"{best.lines_per_sec:,.0f} log lines/s for {best.load_seconds:.0f}s; the fleet used "
            f"{best.fleet_cpu:.1f}s CPU ({cores:.2f} cores), InfluxDB {best.influxd_cpu:.1f}s"
        )
    else:
        print("no step passed")
    print(f"total {time.monotonic() - began:.0f}s")
    return 0 if passed else 1


if __name__ == "__main__":
    raise SystemExit(main())
