"""What one host of each metrics store takes: InfluxDB 1.6.7 and VictoriaMetrics side by side.

Starts Debian's real `influxd` (1.6.7, `/write`) and `victoria-metrics` (InfluxDB
`/api/v2/write`) on loopback, plus the Loki conformance receiver for the log
lines, and floods each with the simulator's default fleet (32 miners, 4
validators, an aggregator and an evaluator, in worker processes) at a ladder of
target rates. A step passes when the fleet sustained 95% of the target, the
clients dropped nothing, and the store holds exactly what the clients counted as
delivered (InfluxDB: InfluxQL count per measurement; VictoriaMetrics: samples of
the measurement's fields, `measurement_field` series, per measurement).

Per store it prints the store's own CPU per 10,000 points/s and its memory, the
series the fleet created (InfluxDB series keys; VictoriaMetrics series, one per
numeric field), and the per-node figures of the capacity model in
docs/scaling.md: points/s, series and log bytes/s per node of each role.

The fleet shares the machine's cores with the store: on a 2-core machine the
fleet's own CPU, not the store, sets the highest rate (bench_flood.py).

    python bench/bench_stores.py                      # 5k, 10k, 20k points/s, 8 s each, both stores
    python bench/bench_stores.py --steps 2000 --seconds 5 --store victoria
"""

from __future__ import annotations

import argparse
import os
import time
from collections import Counter
from dataclasses import dataclass

from _fleet import FLEET, child_process, flood

from simulator import dashboards as dash
from simulator import fleet as fl
from simulator import validate as vd
from simulator import victoria as vm


@dataclass
class Step:
    store: str
    target_points: float
    points_per_sec: float = 0.0
    lines_per_sec: float = 0.0
    points_sent: int = 0
    points_stored: int = 0
    client_drops: int = 0
    store_cpu: float = 0.0
    store_rss_mib: float = 0.0
    load_seconds: float = 0.0
    series: int = 0
    series_by_role: dict | None = None
    points_by_role: dict | None = None
    log_bytes: int = 0
    lines_sent: int = 0
    verdict: str = ""


def _influx_series(influx: vd.InfluxQL, run_id: str) -> Counter:
    results = influx.query(f'SHOW SERIES WHERE "runtime_id" =~ /^{dash.influx_regex_escape(run_id)}-/')
    roles: Counter = Counter()
    for result in results:
        for series in result.get("series") or []:
            for (key,) in series.get("values") or []:
                role = next((part.split("=", 1)[1] for part in key.split(",") if part.startswith("role=")), "?")
                roles[role] += 1
    return roles


def run_step(step: Step, seconds: float, processes: int, server, receiver, index: int) -> Step:
    run = fl.RunIdentity(f"cap-{step.store}-{os.getpid()}-{index}", "capnet", seed=index)
    if step.store == "influxdb":
        targets = fl.Targets(influx_url=server.url, database="bench", api_version=1, loki_url=receiver.base_url)
        process = child_process("influxd")
    else:
        targets = fl.Targets(
            influx_url=server.url,
            database="bench",
            api_version=2,
            token="not-checked",
            org="o",
            loki_url=receiver.base_url,
        )
        process = child_process("victoria-metrics")
    result = flood(run, targets, step.target_points, step.target_points / 10, seconds, processes, process)
    fleet = result.fleet
    window = result.window
    step.store_cpu = result.server_cpu
    step.store_rss_mib = process.memory_info().rss / 2**20 if process else 0.0
    step.load_seconds = fleet.load_seconds
    step.points_per_sec = result.points_per_sec
    step.lines_per_sec = result.lines_per_sec
    sent = fleet.metrics["sent_by_key"]
    if step.store == "influxdb":
        influx = vd.InfluxQL(server.url, "bench")
        rows = vd.account("influxdb", sent, lambda keys: vd.influx_counts(influx, run.run_id, window, keys), settle=5)
        by_role = _influx_series(influx, run.run_id)
    else:
        prom = vm.PromQL(server.url)
        rows = vd.account("victoria", sent, lambda keys: vm.stored_counts(prom, run.run_id, window, keys), settle=5)
        by_role = Counter(vm.series_by_label(prom, "role", run.run_id, window))
    step.points_sent = sum(sent.values())
    step.points_stored = sum(row.stored or 0 for row in rows)
    step.series_by_role = dict(by_role)
    step.series = sum(by_role.values())
    mine = [e for e in receiver.entries if e.json().get("run_id") == run.run_id]
    step.lines_sent = int(fleet.logs.get("sent", 0))
    step.log_bytes = sum(len(e.line.encode()) for e in mine)
    step.client_drops = result.client_drops
    problems = result.problems()
    if step.points_stored != step.points_sent:
        lost = {row.key: (row.sent, row.stored) for row in rows if row.sent != row.stored}
        problems.append(f"stored {step.points_stored} != sent {step.points_sent}: {lost}")
    step.verdict = "; ".join(problems) or "ok"
    return step


def _per_node(step: Step) -> str:
    seconds = max(0.001, step.load_seconds)
    parts = []
    for role, count in FLEET.items():
        series = (step.series_by_role or {}).get(role, 0) / count
        parts.append(f"{role} {series:.0f}")
    nodes = sum(FLEET.values())
    return (
        f"per node: {step.points_per_sec / nodes:.1f} points/s, {step.log_bytes / seconds / nodes:,.0f} log B/s "
        f"({step.log_bytes / max(1, step.lines_sent):.0f} B/line); series per node: " + ", ".join(parts)
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=float, nargs="+", default=[5000, 10000, 20000], help="target points/s")
    parser.add_argument("--seconds", type=float, default=8.0, help="seconds of load per step (default: %(default)s)")
    parser.add_argument("--processes", type=int, default=2, help="fleet worker processes (default: %(default)s)")
    parser.add_argument("--store", choices=["influxdb", "victoria"], action="append", help="default: both")
    args = parser.parse_args()
    from loki_receiver import LokiReceiver
    from servers import influxdb_v1, victoria_metrics

    print(f"machine: {os.cpu_count()} cores; fleet: {sum(FLEET.values())} nodes in {args.processes} processes")
    header = (
        f"{'store':>9} {'target':>7} {'pts/s':>7} {'sent/stored':>21} {'store CPU':>9} "
        f"{'cores/10k':>9} {'RSS MiB':>7} {'series':>6}  verdict"
    )
    for store in args.store or ["influxdb", "victoria"]:
        context = influxdb_v1() if store == "influxdb" else victoria_metrics()
        with context as server, LokiReceiver() as receiver:
            if store == "influxdb":
                server.create_database("bench")
            print(header)
            best = None
            for index, rate in enumerate(args.steps):
                step = run_step(Step(store, rate), args.seconds, args.processes, server, receiver, index)
                cores = step.store_cpu / max(0.001, step.load_seconds)
                per_10k = cores / (step.points_per_sec / 10000) if step.points_per_sec else 0.0
                print(
                    f"{store:>9} {rate:>7,.0f} {step.points_per_sec:>7,.0f} "
                    f"{step.points_sent:>10,}/{step.points_stored:<10,} {step.store_cpu:>8.1f}s "
                    f"{per_10k:>9.3f} {step.store_rss_mib:>7.0f} {step.series:>6}  {step.verdict}",
                    flush=True,
                )
                if step.verdict != "ok":
                    break
                best = step
            if best:
                print(f"  {store}: highest zero-loss step {best.points_per_sec:,.0f} points/s; {_per_node(best)}")
        time.sleep(1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
