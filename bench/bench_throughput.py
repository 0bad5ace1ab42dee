"""Points per second delivered from one process to a real InfluxDB 1.6.7, against the server's ceiling.

The ceiling is the same data, pre-encoded into the same batches and gzip bodies,
POSTed back to back over one connection: what the server takes when the client
costs nothing. Both run against the same fresh server in one run. The CPU time
of each side is measured too: where the server and the client share the
machine's cores, their sum over the cores bounds what the client can reach.
"""

from __future__ import annotations

import gzip
import os
import statistics
import time

import psutil
import urllib3
from _common import influx_v1_logger
from servers import influxdb_v1

from telemetry_client import BufferSettings

POINTS = 300_000
ROUNDS = 3
BATCH = 5_000


def fields_for(i: int) -> dict[str, float]:
    return {f"field_{k}": (i % 1_000) * 0.25 + k for k in range(10)}


def client_rate(url: str, database: str) -> float:
    # Room for every point however fast the caller outruns the sender: a drop would
    # make the rate meaningless, and a fast machine's caller outruns it most.
    logger = influx_v1_logger(
        url, database, BufferSettings(batch_items=BATCH, max_items=POINTS, max_bytes=POINTS * 4_096)
    )
    # The caller's own work (building its dicts) is done before the clock starts: this
    # measures what the client costs, as the ceiling measures what the server costs.
    records = [({"node": str(i % 16)}, fields_for(i)) for i in range(1_000)]
    start = time.perf_counter()
    for i in range(POINTS):
        tags, fields = records[i % 1_000]
        logger.log("throughput", tags, fields, timestamp=1_700_000_000_000_000_000 + i)
    left = logger.flush(120)
    elapsed = time.perf_counter() - start
    sent = logger.stats()["sent"]
    logger.close(1)
    assert left == 0 and sent == POINTS, (left, sent)
    return POINTS / elapsed


def ceiling_rate(url: str, database: str) -> float:
    lines = [
        f"ceiling,node={i % 16},role=miner,uid=1 "
        + ",".join(f"{k}={v}" for k, v in sorted(fields_for(i).items()))
        + f" {1_700_000_000_000_000_000 + i}\n"
        for i in range(POINTS)
    ]
    bodies = [gzip.compress("".join(lines[i : i + BATCH]).encode(), 1) for i in range(0, POINTS, BATCH)]
    pool = urllib3.PoolManager(maxsize=1)
    headers = {"Content-Encoding": "gzip", "Content-Type": "text/plain"}
    start = time.perf_counter()
    for body in bodies:
        response = pool.request("POST", f"{url}/write?db={database}&precision=n", body=body, headers=headers)
        assert response.status == 204, response.data
    return POINTS / (time.perf_counter() - start)


def _cpu_seconds(process: psutil.Process) -> float:
    times = process.cpu_times()
    return times.user + times.system


def _measured(run, url: str, database: str, server: psutil.Process) -> tuple[float, float, float]:
    """`run(url, database)`'s rate, and the CPU seconds the server and this process spent meanwhile."""
    me = psutil.Process()
    server_before, client_before = _cpu_seconds(server), _cpu_seconds(me)
    rate = run(url, database)
    return rate, _cpu_seconds(server) - server_before, _cpu_seconds(me) - client_before


def main() -> None:
    ceilings, ours, stored, bounds, cpu = [], [], [], [], []
    cores = len(os.sched_getaffinity(0))
    with influxdb_v1() as server:
        (influxd,) = [p for p in psutil.Process().children(recursive=True) if p.name() == "influxd"]
        for round_ in range(ROUNDS):  # alternate, on fresh databases: the server's speed drifts
            server.create_database(f"ceiling{round_}")
            server.create_database(f"client{round_}")
            rate, ceiling_server_cpu, _ = _measured(ceiling_rate, server.url, f"ceiling{round_}", influxd)
            ceilings.append(rate)
            rate, server_cpu, client_cpu = _measured(client_rate, server.url, f"client{round_}", influxd)
            ours.append(rate)
            # The server's own work at the ceiling plus the client's, spread over the cores.
            bounds.append(POINTS / max(POINTS / ceilings[-1], (ceiling_server_cpu + client_cpu) / cores))
            cpu.append((ceiling_server_cpu, server_cpu, client_cpu))
            stored.append(server.rows('SELECT count("field_0") FROM "throughput"', f"client{round_}")[0]["count"])
    ceiling, client, bound = statistics.median(ceilings), statistics.median(ours), statistics.median(bounds)
    print(f"{POINTS} points, 10 fields, batches of {BATCH}, InfluxDB 1.6.7 on loopback, {ROUNDS} alternating rounds")
    print(f"server ceiling (pre-encoded batches) : {ceiling:10,.0f} points/s median  ({_rates(ceilings)})")
    print(f"MetricsLogger, one process           : {client:10,.0f} points/s median  ({_rates(ours)})")
    print(f"MetricsLogger / ceiling              : {client / ceiling:10.0%}")
    print(f"stored by the server, each round     : {', '.join(f'{n:,}' for n in stored)} points")
    print(
        "CPU seconds per round (server at the ceiling, server and client in the client's run): "
        + "; ".join(f"{a:.2f}, {b:.2f} + {c:.2f}" for a, b, c in cpu)
    )
    print(
        f"bound on {cores} cores (the ceiling's server CPU plus the client's, over the cores): "
        f"{bound:,.0f} points/s median, {bound / ceiling:.0%} of the ceiling"
    )


def _rates(values: list[float]) -> str:
    return ", ".join(f"{v:,.0f}" for v in values)


if __name__ == "__main__":
    main()
