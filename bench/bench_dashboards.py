"""How long every dashboard takes to load over a fleet's history, on a real InfluxDB 1.6.7 or VictoriaMetrics.

Backfills a fleet (simulator/backfill.py) into a fresh influxd (tests/servers.py),
or into a running one (--url --backfill), then runs every InfluxQL panel and
variable query of grafana/dashboards/ as Grafana would; with --backend
victoriametrics, into a fresh victoria-metrics (API v2, as nodes write) and every
MetricsQL panel and variable query of grafana/dashboards-victoriametrics/ (no
downsampled copy there). Every variable at "All",
the auto interval of a ~1,000 px wide panel, at 1 h, 6 h, 24 h and 7 d ending at
the end of the backfill. Per dashboard and range it prints the slowest query,
the p95 and median of the queries, the whole load (all queries, six in flight as
in a browser), the largest response and the most series one query returned.

    python bench/bench_dashboards.py                       # a small fleet, minutes on 2 cores
    python bench/bench_dashboards.py --miners 256 --validators 16 --hours 24 --repeat 3   # the reference fleet
    python bench/bench_dashboards.py --url URL --end END --miners 256 --validators 16 --hours 24  # time again
    python bench/bench_dashboards.py --backend victoriametrics   # the MetricsQL twins on VictoriaMetrics

How the history is written: every line is the one the node's own MetricsLogger
would write (its standard tags, the client's encoder metrics.encode_lines, the write URL
and headers its configuration resolves to, gzip), but posted in batches of
about 4 MB by --workers processes, one connection each. A live logger sends
from one thread per process, a few thousand lines per request as the buffer
settings say: through loggers the backfill ran at about 3,800 points/s here,
an hour and a half for a day of the reference fleet (about 20 million points).
The batching changes how fast the lines arrive, not what is stored
(tests/test_backfill.py compares both ways on a real server, point for point).

The downsampled copy: continuous queries compute only periods relative to
now(), so they never see history written with past timestamps; InfluxDB 1.6's
documentation says to fill such history with a plain INTO query over an explicit
time range (influxdata/docs-v2, content/influxdb/v1.6/query_language/
continuous_queries.md, "Common issues with basic syntax", issue 3: "Backfilling
results for older data"). The bench runs the continuous queries' own SELECT ...
INTO (grafana.builder.downsampling.influxql_backfill) an hour at a time over the
backfilled hours: with the same GROUP BY time(5m) the periods, and so the points
written, are those the continuous queries write as the data arrives; the same
goes for the spreads beside the copy (validator_scores_spread, gpu_spread...). The series
count the catalog implies (telemetry_client.cardinality) is printed beside the
one the database holds.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from _common import percentile

from grafana.builder import downsampling
from simulator import dashboards as dash
from simulator.backfill import FleetShape, backfill
from telemetry_client import cardinality as card

VICTORIAMETRICS = "(victoriametrics)"  # the `database` of a VictoriaMetrics run: it has none
RANGES = {"1h": timedelta(hours=1), "6h": timedelta(hours=6), "24h": timedelta(hours=24), "7d": timedelta(days=7)}
IN_FLIGHT = 6  # queries a browser runs at once against one Grafana


@dataclass
class Timing:
    query: dash.Query
    seconds: float
    size: int
    series: int
    error: str = ""


TIMEOUT_S = 60.0  # a query still running after this counts as this long, flagged "timeout"


def run_query(url: str, database: str, text: str, timeout: float | None = None) -> tuple[float, int, int, str]:
    """Seconds, response bytes, series (one per field column, as Grafana draws them), error."""
    data = urllib.parse.urlencode({"q": text, "db": database, "epoch": "ms"}).encode()
    start = time.perf_counter()
    try:
        with urllib.request.urlopen(f"{url}/query", data=data, timeout=timeout or TIMEOUT_S) as response:
            body = response.read()
    except TimeoutError:
        return TIMEOUT_S, 0, 0, f"timeout after {TIMEOUT_S:g} s"
    except OSError as exc:
        return time.perf_counter() - start, 0, 0, str(exc)
    seconds = time.perf_counter() - start
    result = json.loads(body)["results"][0]
    series = sum(max(1, len(s["columns"]) - 1) for s in result.get("series", []))
    return seconds, len(body), series, result.get("error", "")


def run_prometheus(url: str, query: dash.Query, text: str, time_range: dash.TimeRange) -> tuple[float, int, int, str]:
    """The same for a MetricsQL query, sent as Grafana's Prometheus data source sends it."""
    interval = dash.auto_interval(time_range, max_data_points=1000, min_interval=dash.PROMETHEUS_SCRAPE_INTERVAL)
    if query.source == "variable":
        label, selector = dash.prometheus_label_values(text)
        path = f"/api/v1/label/{label}/values"
        params = {"start": dash.prometheus_time(time_range.start_ms), "end": dash.prometheus_time(time_range.end_ms)}
        if selector:
            params["match[]"] = selector
    elif query.instant:
        path, params = "/api/v1/query", {"query": text, "time": dash.prometheus_time(time_range.end_ms)}
    else:
        path, params = "/api/v1/query_range", {"query": text, **dash.prometheus_range(time_range, interval)}
    start = time.perf_counter()
    try:
        with urllib.request.urlopen(
            f"{url}{path}", data=urllib.parse.urlencode(params).encode(), timeout=TIMEOUT_S
        ) as response:
            body = response.read()
    except TimeoutError:
        return TIMEOUT_S, 0, 0, f"timeout after {TIMEOUT_S:g} s"
    except OSError as exc:
        return time.perf_counter() - start, 0, 0, str(exc)
    seconds = time.perf_counter() - start
    answer = json.loads(body)
    data = answer.get("data")
    series = len(data) if query.source == "variable" else len((data or {}).get("result", []))
    return seconds, len(body), series, answer.get("error", "")


def expanded_queries(dashboard: dict, time_range: dash.TimeRange, kind: str) -> list[tuple[dash.Query, str]]:
    datasources = dash.load_datasources()
    floor = dash.PROMETHEUS_SCRAPE_INTERVAL if kind == "prometheus" else timedelta(seconds=10)
    interval = dash.auto_interval(time_range, max_data_points=1000, min_interval=floor)
    values = dash.all_selected(dashboard)
    out = []
    for query in dash.iter_queries([dashboard], datasources):
        if query.datasource_type != kind:
            continue
        out.append((query, dash.expand(query, time_range, values, dashboard=dashboard, interval=interval)))
    return out


def time_dashboard(url: str, database: str, dashboard: dict, time_range: dash.TimeRange, repeat: int) -> dict:
    kind = "prometheus" if database == VICTORIAMETRICS else "influxdb"

    def run(query: dash.Query, text: str) -> tuple[float, int, int, str]:
        if kind == "prometheus":
            return run_prometheus(url, query, text, time_range)
        return run_query(url, database, text)

    queries = expanded_queries(dashboard, time_range, kind)
    timings = []
    for query, text in queries:
        runs = [run(query, text) for _ in range(repeat)]
        seconds = statistics.median(r[0] for r in runs)
        _, size, series, error = runs[-1]
        timings.append(Timing(query, seconds, size, series, error))
    start = time.perf_counter()
    with ThreadPoolExecutor(IN_FLIGHT) as pool:
        list(pool.map(lambda qt: run(*qt), queries))
    load = time.perf_counter() - start
    ordered = sorted(t.seconds for t in timings)
    slowest = max(timings, key=lambda t: t.seconds)
    widest = max((t for t in timings if t.query.source == "panel"), key=lambda t: t.series)
    return {
        "queries": len(timings),
        "slowest": slowest,
        "p50": statistics.median(ordered),
        "p95": percentile(ordered, 0.95),
        "load": load,
        "largest": max(t.size for t in timings),
        "series": widest,
        "errors": [t for t in timings if t.error],
        "timings": timings,
    }


def main(argv: list[str] | None = None) -> int:
    global TIMEOUT_S
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--miners", type=int, default=32)
    parser.add_argument("--validators", type=int, default=4)
    parser.add_argument("--gpus", type=int, default=4, help="GPUs per node")
    parser.add_argument("--hours", type=float, default=6.0, help="hours of history to backfill")
    parser.add_argument("--ranges", default="1h,6h,24h,7d", help="dashboard time ranges to time")
    parser.add_argument("--repeat", type=int, default=1, help="runs per query; the median is reported")
    parser.add_argument("--url", help="an InfluxDB 1.x already holding the backfill (skips starting one)")
    parser.add_argument("--backfill", action="store_true", help="with --url: backfill into that server first")
    parser.add_argument("--workers", type=int, default=3, help="processes writing the backfill at once")
    parser.add_argument("--database", default="telemetry")
    parser.add_argument("--end", help="end of the backfill with --url, ISO 8601")
    parser.add_argument("--json", help="also write every timing to this file")
    parser.add_argument("--timeout", type=float, default=TIMEOUT_S, help="seconds before a query counts as timed out")
    parser.add_argument(
        "--backend", choices=("influxdb", "victoriametrics"), default="influxdb", help="the metrics store to time"
    )
    args = parser.parse_args(argv)
    TIMEOUT_S = args.timeout
    shape = FleetShape(miners=args.miners, validators=args.validators, gpus_per_node=args.gpus, hours=args.hours)
    ranges = {name: RANGES[name] for name in args.ranges.split(",") if name}
    if args.backend == "victoriametrics":
        return bench_victoriametrics(shape, ranges, args)
    if args.url and not args.backfill:
        end = datetime.fromisoformat(args.end) if args.end else datetime.now(UTC)
        return report(args.url, args.database, shape, end, ranges, args)
    if args.url:
        end = fill(args.url, args.database, shape, args.workers)
        return report(args.url, args.database, shape, end, ranges, args)
    from servers import influxdb_v1

    with influxdb_v1() as server:
        end = fill(server.url, args.database, shape, args.workers)
        return report(server.url, args.database, shape, end, ranges, args)


def fill(url: str, database: str, shape: FleetShape, workers: int) -> datetime:
    """Create the database and its copy's continuous queries, backfill the fleet, fill the copy; return the end."""
    for statement in [f'CREATE DATABASE "{database}"', *downsampling.influxql_setup(database)]:
        _, _, _, error = run_query(url, database, statement)
        if error:
            raise RuntimeError(f"{error}: {statement}")
    end = datetime.now(UTC).replace(microsecond=0)
    print(f"fleet: {len(shape.nodes())} nodes ({shape.miners} miners, {shape.validators} validators, ", end="")
    print(f"{shape.aggregators} aggregator, {shape.evaluators} evaluator), {shape.gpus_per_node} GPUs each, ", end="")
    print(f"{shape.hours:g} h of history ending {end.isoformat()}")
    fleet = card.Fleet(shape.miners, shape.validators, shape.aggregators, shape.evaluators, shape.gpus_per_node)
    print(card.report(fleet))
    start = time.perf_counter()
    sent = backfill(url, database, shape, end, workers=workers)
    seconds = time.perf_counter() - start
    print(f"backfill: {sent:,} points in {seconds:.0f} s ({sent / seconds:,.0f} points/s, {workers} processes)")
    start = time.perf_counter()
    end_ms = int(end.timestamp() * 1000) + 1
    hour_ms = 3_600_000
    chunk_start = int((end - timedelta(hours=shape.hours)).timestamp() * 1000) - 300_000
    while chunk_start < end_ms:  # an hour at a time: each statement stays short
        chunk_end = min(end_ms, chunk_start + hour_ms)
        for statement in downsampling.influxql_backfill(database, chunk_start, chunk_end):
            _, _, _, error = run_query(url, database, statement, timeout=600)
            if error:
                raise RuntimeError(f"{error}: {statement}")
        chunk_start = chunk_end
    seconds = time.perf_counter() - start
    print(f"downsampled copy and spreads (what the continuous queries write) filled in {seconds:.0f} s")
    rows = json.loads(_get(url, database, "SHOW SERIES EXACT CARDINALITY"))["results"][0].get("series", [])
    print(f"series in the database: {sum(s['values'][0][0] for s in rows):,}")
    return end


def _get(url: str, database: str, text: str) -> bytes:
    data = urllib.parse.urlencode({"q": text, "db": database}).encode()
    with urllib.request.urlopen(f"{url}/query", data=data, timeout=600) as response:
        return response.read()


def bench_victoriametrics(shape: FleetShape, ranges: dict, args) -> int:
    """The fleet into a victoria-metrics (a fresh one, or --url [--backfill]), then the MetricsQL set."""
    if args.url and not args.backfill:
        end = datetime.fromisoformat(args.end) if args.end else datetime.now(UTC)
        return report(args.url, VICTORIAMETRICS, shape, end, ranges, args)
    if args.url:
        return report(
            args.url, VICTORIAMETRICS, shape, fill_victoriametrics(args.url, shape, args.workers), ranges, args
        )
    from servers import victoria_metrics

    with victoria_metrics() as server:
        end = fill_victoriametrics(server.url, shape, args.workers)
        return report(server.url, VICTORIAMETRICS, shape, end, ranges, args)


def fill_victoriametrics(url: str, shape: FleetShape, workers: int) -> datetime:
    """Backfill the fleet through /api/v2/write (VictoriaMetrics ignores the token and org); return the end."""
    end = datetime.now(UTC).replace(microsecond=0)
    print(f"fleet: {len(shape.nodes())} nodes, {shape.hours:g} h of history ending {end.isoformat()}")
    start = time.perf_counter()
    sent = backfill(
        url, "telemetry", shape, end, api_version=2, token="bench-not-a-secret", org="bench", workers=workers
    )
    seconds = time.perf_counter() - start
    print(f"backfill: {sent:,} points in {seconds:.0f} s ({sent / seconds:,.0f} points/s, {workers} processes)")
    with urllib.request.urlopen(f"{url}/internal/force_flush", timeout=600):
        pass  # searchable now, not in a second
    with urllib.request.urlopen(f"{url}/api/v1/series/count", timeout=600) as response:
        print(f"series in the database (one per field): {json.loads(response.read())['data'][0]:,}")
    return end


def report(url: str, database: str, shape: FleetShape, end: datetime, ranges: dict, args) -> int:
    kind = "prometheus" if database == VICTORIAMETRICS else "influxdb"
    directory = dash.VICTORIAMETRICS_DASHBOARDS_DIR if kind == "prometheus" else dash.DASHBOARDS_DIR
    dashboards = [
        d
        for d in dash.load_dashboards(directory)
        if any(q.datasource_type == kind for q in dash.iter_queries([d], dash.load_datasources()))
    ]
    rows = []
    dump = []
    header = (
        f"{'dashboard':<26} {'range':>5} {'queries':>7} {'p50 s':>7} {'p95 s':>7} {'slowest s':>9} "
        f"{'load s':>7} {'largest':>9} {'series':>6}  slowest query / most series"
    )
    print(header)
    print("-" * len(header))
    for name, duration in ranges.items():
        time_range = dash.TimeRange(end - duration, end)
        for dashboard in dashboards:
            r = time_dashboard(url, database, dashboard, time_range, args.repeat)
            rows.append((dashboard["title"], name, r))
            print(
                f"{dashboard['title']:<26} {name:>5} {r['queries']:>7} {r['p50']:>7.2f} {r['p95']:>7.2f} "
                f"{r['slowest'].seconds:>9.2f} {r['load']:>7.2f} {r['largest'] / 1e6:>8.2f}M {r['series'].series:>6}  "
                f"{r['slowest'].query.name!r} / {r['series'].query.name!r}",
                flush=True,
            )
            for t in r["errors"]:
                print(f"    error in {t.query.where}: {t.error}")
            dump.extend(
                {
                    "dashboard": dashboard["title"],
                    "range": name,
                    "query": t.query.where,
                    "seconds": round(t.seconds, 4),
                    "bytes": t.size,
                    "series": t.series,
                    "error": t.error,
                }
                for t in r["timings"]
            )
    for name in ranges:
        every = sorted(t.seconds for _, n, r in rows if n == name for t in r["timings"])
        if every:
            over = sum(1 for s in every if s > 1)
            print(
                f"all dashboards, {name}: {len(every)} queries, p50 {statistics.median(every):.2f} s, "
                f"p95 {percentile(every, 0.95):.2f} s, max {every[-1]:.2f} s, {over} over 1 s"
            )
    if args.json:
        with open(args.json, "w", encoding="utf-8") as out:
            json.dump({"shape": shape.__dict__, "timings": dump}, out, indent=1)
    return 1 if any(r["errors"] for _, _, r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
