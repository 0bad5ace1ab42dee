"""Every InfluxQL query of the dashboards runs on a real InfluxDB and returns data.

The queries are the dashboards' own, with Grafana's macros and template variables
filled in by simulator.dashboards exactly as the simulator will do it, against
InfluxDB 1.6.7 (the `influx_server` fixture of conftest.py) holding points for
every catalog measurement. The interpolation rules themselves are tested first.
"""

from __future__ import annotations

import re
import urllib.request
from collections.abc import Callable, Iterable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from servers import InfluxV1

from grafana.builder import downsampling, influxql
from simulator import backups, values
from simulator import dashboards as dash
from telemetry_client.catalog import CATALOG, DROP_REASONS, QUERYABLE
from telemetry_client.metrics import MetricsLogger

pytestmark = pytest.mark.slow

NOW = datetime(2026, 11, 30, 12, 0, 0, tzinfo=UTC)
RANGE = dash.TimeRange(NOW - timedelta(minutes=30), NOW)
INTERVAL = timedelta(seconds=30)

# ---------------------------------------------------------------- interpolation


def test_time_filter_is_grafanas_millisecond_range() -> None:
    q = dash.expand_influxql('SELECT 1 FROM "m" WHERE $timeFilter', RANGE)
    start = int(RANGE.start.timestamp() * 1000)
    end = int(RANGE.end.timestamp() * 1000)
    assert q == f'SELECT 1 FROM "m" WHERE time >= {start}ms and time <= {end}ms'
    assert dash.expand_influxql("$__timeFilter", RANGE) == q.split("WHERE ")[1]


def test_interval_and_range_macros() -> None:
    q = dash.expand_influxql(
        "time($__interval) $__interval_ms $__range $__range_s $interval",
        RANGE,
        interval=timedelta(minutes=2),
    )
    assert q == "time(2m) 120000 30m 1800 2m"
    assert (
        dash.expand_logql("[$__auto] [$__interval] [$__range]", RANGE, interval=timedelta(seconds=15))
        == "[15s] [15s] [30m]"
    )


@pytest.mark.parametrize(
    ("span", "expected"),
    [
        # range / 1,000 points to the NEAREST of Grafana's steps (rangeutil.ts roundInterval)
        (timedelta(hours=6), timedelta(seconds=20)),  # 21.6 s
        (timedelta(hours=24), timedelta(minutes=1)),  # 86.4 s
        (timedelta(days=7), timedelta(minutes=10)),  # 604.8 s
        (timedelta(hours=1), timedelta(seconds=5)),  # 3.6 s, no floor (the Loki data source has none)
        (timedelta(minutes=5), timedelta(milliseconds=200)),  # 300 ms
        (timedelta(days=365), timedelta(hours=6)),  # 8.76 h
    ],
)
def test_auto_interval_rounds_to_the_nearest_step_as_grafana_does(span: timedelta, expected: timedelta) -> None:
    assert dash.auto_interval(dash.TimeRange.last(span, NOW), 1000) == expected


def test_the_minimum_interval_applies_after_rounding_and_only_to_the_metrics_stores() -> None:
    five_minutes = dash.TimeRange.last(timedelta(minutes=5), NOW)
    assert dash.auto_interval(five_minutes, 1000, dash.INFLUXDB_TIME_INTERVAL) == timedelta(seconds=10)
    # a minimum that is no step of Grafana's stays as it is (calculateInterval does not round it)
    assert dash.auto_interval(five_minutes, 1000, timedelta(seconds=45)) == timedelta(seconds=45)
    # above the minimum, the rounded interval wins
    assert dash.auto_interval(dash.TimeRange.last(timedelta(hours=6), NOW), 1000, timedelta(seconds=10)) == timedelta(
        seconds=20
    )
    query = 'sum(count_over_time({app="x"}[$__interval]))'
    assert dash.expand_logql(query, five_minutes) == 'sum(count_over_time({app="x"}[200ms]))'
    assert dash.expand_influxql("GROUP BY time($__interval)", five_minutes) == "GROUP BY time(10s)"
    assert dash.expand_metricsql("rate(x[$__interval])", five_minutes) == "rate(x[10s])"


def test_format_duration() -> None:
    assert dash.format_duration(timedelta(hours=6)) == "6h"
    assert dash.format_duration(timedelta(seconds=90)) == "90s"
    assert dash.format_duration(timedelta(milliseconds=1500)) == "1500ms"


def test_influxql_regex_forms_of_a_variable() -> None:
    template = '"uid" =~ /^$uid$/ AND "uid" =~ /^${uid}$/ AND "uid" =~ /^[[uid]]$/'
    one = dash.expand_influxql(template, RANGE, {"uid": "12"})
    assert one == '"uid" =~ /^12$/ AND "uid" =~ /^12$/ AND "uid" =~ /^12$/'
    many = dash.expand_influxql('"version" =~ /^$version$/', RANGE, {"version": ["1.4.0", "2.0/rc"]})
    assert many == r'"version" =~ /^(1\.4\.0|2\.0\/rc)$/'
    everything = dash.expand_influxql('"uid" =~ /^$uid$/', RANGE, {"uid": None})
    assert everything == '"uid" =~ /^.*$/'
    assert dash.expand_influxql('"uid" =~ /^$uid$/', RANGE, {"uid": "$__all"}) == everything


def test_influxql_a_single_value_that_reads_as_a_number_is_not_escaped_by_the_data_source() -> None:
    """grafana/grafana-influxdb-datasource src/datasource.ts interpolateQueryExpr: parseFloat first."""
    query = '"version" =~ /^$version$/'
    assert dash.parses_as_number("1.4.2+cu121") and dash.parses_as_number("12") and not dash.parses_as_number("v1")
    assert dash.expand_influxql(query, RANGE, {"version": "1.4.2+cu121"}) == '"version" =~ /^1.4.2+cu121$/'
    assert dash.expand_influxql(query, RANGE, {"version": "v1.4+cu"}) == r'"version" =~ /^v1\.4\+cu$/'
    # a list (several values picked, or one) is escaped and parenthesised; ${var:regex} always escapes
    assert dash.expand_influxql(query, RANGE, {"version": ["1.4.2+cu121"]}) == r'"version" =~ /^(1\.4\.2\+cu121)$/'
    explicit = dash.expand_influxql('"version" =~ /^${version:regex}$/', RANGE, {"version": "1.4.2+cu121"})
    assert explicit == r'"version" =~ /^1\.4\.2\+cu121$/'


def test_influxql_dashboards_escape_every_variable_in_a_regex_whatever_its_value() -> None:
    """A value such as 1.4.2+cu121 (a URL's var-version=..., one picked value) must still match itself."""
    tricky = "1.4.2+cu121"
    datasources = dash.load_datasources()
    checked = 0
    for dashboard in dash.load_dashboards():
        values = {name: tricky for name in dash.variables_of(dashboard)}
        for query in dash.iter_queries([dashboard], datasources):
            if query.datasource_type != "influxdb":
                continue
            text = dash.expand(query, RANGE, values, dashboard=dashboard)
            for literal in re.findall(r"=~\s*/((?:\\.|[^/\\])*)/", text):
                checked += 1
                assert tricky not in literal, f"{query.where}: {literal}"
    assert checked > 100


def test_influxql_variable_outside_a_regex_is_inserted_as_is() -> None:
    q = dash.expand_influxql('SHOW TAG VALUES WITH KEY = "$key"', RANGE, {"key": "role"})
    assert q == 'SHOW TAG VALUES WITH KEY = "role"'
    with pytest.raises(ValueError, match="several values"):
        dash.expand_influxql('WITH KEY = "$key"', RANGE, {"key": ["a", "b"]})


def test_unknown_variable_is_an_error_not_left_in_the_query() -> None:
    with pytest.raises(KeyError, match="nope"):
        dash.expand_influxql('"uid" =~ /^$nope$/', RANGE, {})


def test_all_uses_the_dashboards_allvalue() -> None:
    logs = next(d for d in dash.load_dashboards() if d["uid"] == "telemetry-logs")
    q = dash.expand_logql('{environment=~"$network", role=~"$role"}', RANGE, dash.all_selected(logs), dashboard=logs)
    # Loki refuses a selector whose every matcher matches the empty string.
    assert q == '{environment=~".+", role=~".*"}'


def test_logql_multi_value_is_escaped_for_a_string_literal() -> None:
    """Grafana's Loki data source joins the escaped values with | and no parentheses
    (public/app/plugins/datasource/loki/datasource.ts, interpolateQueryExpr)."""
    q = dash.expand_logql(
        '{service=~"$service", version=~"$version"}', RANGE, {"service": ["miner", "validator"], "version": "1.4.0"}
    )
    assert q == '{service=~"miner|validator", version=~"1\\\\.4\\\\.0"}'


def test_logql_textbox_is_inserted_as_is_like_grafana_does() -> None:
    """A text box is neither multi-value nor "All": Grafana's Loki data source inserts it
    unescaped, so a quote in it ends the LogQL string early (the Logs dashboard's Search
    box uses ${search:regex} in a raw string for that reason)."""
    logs = next(d for d in dash.load_dashboards() if d["uid"] == "telemetry-logs")
    q = dash.expand_logql('{service="x"} |~ "(?i)$search"', RANGE, {"search": 'say "hi" \\d'}, dashboard=logs)
    assert q == '{service="x"} |~ "(?i)say "hi" \\d"'
    raw = dash.expand_logql('{service="x"} |~ `$search`', RANGE, {"search": "it's"}, dashboard=logs)
    assert raw == '{service="x"} |~ `it\'s`'


# ---------------------------------------------------------------- data

MINERS = ("1", "2", "3")
VALIDATORS = ("10", "11")
NODES: tuple[tuple[str, str, str, str], ...] = (
    # uid, role, network, version
    ("1", "miner", "finney", "1.5.0"),
    ("2", "miner", "finney", "1.4.0"),
    ("3", "miner", "testnet", "1.5.0"),
    ("10", "validator", "finney", "1.5.0"),
    ("11", "validator", "finney", "1.5.0"),
    ("20", "aggregator", "finney", "1.5.0"),
    ("30", "evaluator", "finney", "1.5.0"),
)
STEP_S = 10


# Every field on every point, every 10 s; the client's counters grow steadily (the rate
# panels' figures below: 49 records sent per 10 s per process and sink).
GROWTH = {
    "queued": 50.0,
    "sent": 49.0,
    "batches": 1.0,
    "bytes_sent": 4096.0,
    "retries": 0.2,
    "truncated": 0.2,
    "metadata_removed": 0.1,
}
PACE = values.Pace(
    batch=None,
    host_every=1,
    counters=values.ClientCounters(
        growth=GROWTH | {f"dropped_{reason}": 0.03 for reason in DROP_REASONS}, jitter=0.0, sparse=False
    ),
    overflow_rate=0.0,
)
GPUS = 2

CatalogPoint = tuple[tuple[str, str, str, str], str, dict[str, str], dict[str, Any], int]


def catalog_points(now: datetime, duration: timedelta, seed: int = 7) -> Iterator[CatalogPoint]:
    """(node, measurement, own tags, fields, unix seconds) for every catalog measurement and role.

    The fleet's own model of values (simulator/values.py) at a pace that writes every
    field of every measurement of the node's role, one sample every 10 s, a window a sample.
    """
    end = int(now.timestamp())
    steps = int(duration.total_seconds()) // STEP_S
    models = {
        node: values.NodeModel(
            node[1], node[0], seed, miner_uids=MINERS, fleet_size=len(NODES), gpus=GPUS, total_steps=steps, pace=PACE
        )
        for node in NODES
    }
    for step in range(steps + 1):
        for node, model in models.items():
            for point in model.points(step, 1000 + step):
                yield node, point.measurement, point.tags, point.fields, end - (steps - step) * STEP_S


def write_with_metrics_logger(
    points: Iterable[CatalogPoint],
    runtime_id: Callable[[CatalogPoint], str] = lambda point: f"run-{point[0][0]}",
    **connection: Any,
) -> int:
    """Write through MetricsLogger, one logger per node and run as real nodes do; return points sent.

    `connection` is MetricsLogger's (url, database, api_version, token...);
    `runtime_id` names the run (process) that writes a point: one per node unless told.
    """
    loggers: dict[tuple[tuple[str, str, str, str], str], MetricsLogger] = {}
    for point in points:
        node, measurement, tags, fields, seconds = point
        run = runtime_id(point)
        logger = loggers.get((node, run))
        if logger is None:
            uid, role, network, version = node
            logger = loggers[node, run] = MetricsLogger(
                uid=uid,
                role=role,
                network=network,
                version=version,
                runtime_id=run,
                group=network,
                job_type="training",
                self_metrics_interval=None,
                **connection,
            )
        logger.log(measurement, tags, fields, timestamp=seconds * 1_000_000_000)
    sent = 0
    for logger in loggers.values():
        assert logger.close(60) == 0, logger.stats()
        stats = logger.stats()
        assert stats["dropped"] == 0, stats
        sent += stats["sent"]
    return sent


def write_backup_reports(now: datetime, duration: timedelta, **connection: Any) -> int:
    """The stack's own measurements: every stateful host's backup report, one a minute, as its report timer writes.

    `connection` is simulator.backups.write's (influx_url, database, api_version, token...).
    """
    start_ns = int((now - duration).timestamp()) * 1_000_000_000
    max_age = float(BACKUP_MAX_AGE)
    reports = backups.reports((), start_ns, duration.total_seconds(), max_age, every=60.0)
    return backups.write(written=reports, **connection)


BACKUP_MAX_AGE = "93600"


@pytest.fixture(scope="module")
def telemetry_db(influx_server: InfluxV1) -> Iterator[tuple[InfluxV1, str]]:
    """A database named like the stack's bucket, holding every catalog measurement."""
    database = "telemetry_dash"
    influx_server.create_database(database)
    for statement in downsampling.influxql_setup(database):
        result = influx_server.query(statement)["results"][0]
        assert "error" not in result, f"{result['error']}\n{statement}"
    points = catalog_points(NOW, timedelta(minutes=30))
    sent = write_with_metrics_logger(points, url=influx_server.url, database=database, api_version=1)
    assert sent == sum(1 for _ in catalog_points(NOW, timedelta(minutes=30)))
    write_backup_reports(NOW, timedelta(minutes=30), influx_url=influx_server.url, database=database, api_version=1)
    # What the continuous queries would have written by now, for the long-range targets.
    start_ms = int((NOW - timedelta(hours=1)).timestamp() * 1000)
    for statement in downsampling.influxql_backfill(database, start_ms, RANGE.end_ms + 1):
        result = influx_server.query(statement, database)["results"][0]
        assert "error" not in result, f"{result['error']}\n{statement}"
    yield influx_server, database
    influx_server.query(f'DROP DATABASE "{database}"')


def run(server: InfluxV1, database: str, query: str) -> list[dict]:
    """The series of the first statement; an InfluxQL error fails the test."""
    result = server.query(query, database, epoch="ms")["results"][0]
    assert "error" not in result, f"{result['error']}\n{query}"
    return result.get("series", [])


def has_values(series: list[dict]) -> bool:
    """At least one non-null value outside the time column."""
    for one in series:
        columns = one["columns"]
        for row in one["values"]:
            if any(v is not None for c, v in zip(columns, row, strict=True) if c != "time"):
                return True
    return False


DASHBOARDS = dash.load_dashboards()
DATASOURCES = dash.load_datasources()
BY_UID = {d["uid"]: d for d in DASHBOARDS}
INFLUX_QUERIES = [q for q in dash.iter_queries(DASHBOARDS, DATASOURCES) if q.datasource_type == "influxdb"]


def test_every_catalog_measurement_is_written(telemetry_db: tuple[InfluxV1, str]) -> None:
    server, database = telemetry_db
    names = {row["name"] for row in server.rows("SHOW MEASUREMENTS", database)}
    assert names == set(QUERYABLE)  # the catalog's, and the spreads filled in beside the copy


# Two days: a range that reads the downsampled copy; its interval is Grafana's auto one.
LONG_RANGE = dash.TimeRange(NOW - timedelta(days=2), NOW)
NODE_VIEW = re.compile(r"'\$\{(\w+):raw\}' != '\.\*'")
CHOSEN = {"uid": [node[0] for node in NODES], "eval_uid": list(MINERS)}


def when_it_answers(query: dash.Query, dashboard: dict) -> tuple[dash.TimeRange, dict, timedelta | None]:
    """The time range and variables under which `query` is the panel's live target.

    A "-long" target reads the downsampled copy for ranges over a day; a per-node
    target answers when nodes are chosen (here: every node, by name) rather than "All".
    """
    values = dash.all_selected(dashboard)
    for variable in NODE_VIEW.findall(query.text):
        values[variable] = CHOSEN[variable]
    if query.ref_id.endswith("-long"):
        return LONG_RANGE, values, None
    return RANGE, values, INTERVAL


@pytest.mark.parametrize("query", INFLUX_QUERIES, ids=lambda q: q.where)
def test_query_returns_data_when_it_is_the_live_target(telemetry_db: tuple[InfluxV1, str], query: dash.Query) -> None:
    server, database = telemetry_db
    dashboard = BY_UID[query.dashboard_uid]
    time_range, values, interval = when_it_answers(query, dashboard)
    text = dash.expand(query, time_range, values, dashboard=dashboard, interval=interval)
    series = run(server, database, text)
    assert has_values(series), f"no data for {query.where}:\n{text}"


@pytest.mark.parametrize("query", [q for q in INFLUX_QUERIES if q.source == "panel"], ids=lambda q: q.where)
def test_query_is_silent_when_its_twin_answers(telemetry_db: tuple[InfluxV1, str], query: dash.Query) -> None:
    """A raw target is empty over a long range (and its long twin over a short one); a fleet
    target is empty with nodes chosen, a per-node one with "All"."""
    server, database = telemetry_db
    dashboard = BY_UID[query.dashboard_uid]
    time_range, values, interval = when_it_answers(query, dashboard)
    other_range = RANGE if time_range is LONG_RANGE else LONG_RANGE
    text = dash.expand(query, other_range, values, dashboard=dashboard, interval=interval)
    assert not has_values(run(server, database, text)), f"{query.where} answers outside its range:\n{text}"
    views = re.findall(r"'\$\{(\w+):raw\}' (?:!=|=) '\.\*'", query.text)
    if views:
        flipped = dict(values)
        for variable in views:
            flipped[variable] = None if isinstance(values[variable], list) else CHOSEN[variable]
        text = dash.expand(query, time_range, flipped, dashboard=dashboard, interval=interval)
        assert not has_values(run(server, database, text)), f"{query.where} answers in the other view:\n{text}"


@pytest.mark.parametrize("query", [q for q in INFLUX_QUERIES if "$network" in q.text], ids=lambda q: q.where)
def test_query_follows_the_network_variable(telemetry_db: tuple[InfluxV1, str], query: dash.Query) -> None:
    """Choosing a network narrows the data; a network without nodes empties it."""
    server, database = telemetry_db
    dashboard = BY_UID[query.dashboard_uid]
    time_range, values, interval = when_it_answers(query, dashboard)
    chosen = values | {"network": ["finney"]}
    series = run(server, database, dash.expand(query, time_range, chosen, dashboard=dashboard, interval=interval))
    assert has_values(series), f"no data for network finney: {query.where}"
    nobody = values | {"network": ["nowhere"]}
    empty = run(server, database, dash.expand(query, time_range, nobody, dashboard=dashboard, interval=interval))
    assert not has_values(empty), f"{query.where} ignores $network"


def _variable_values(server: InfluxV1, database: str, dashboard: dict, name: str, chosen: dict) -> set[str]:
    query = next(q for q in dash.variable_queries(dashboard, DATASOURCES) if q.name == name)
    series = run(server, database, dash.expand(query, RANGE, chosen, dashboard=dashboard, interval=INTERVAL))
    return {row[1] for one in series for row in one["values"]}


def test_variables_chain_network_role_uid(telemetry_db: tuple[InfluxV1, str]) -> None:
    server, database = telemetry_db
    dashboard = BY_UID["telemetry-network"]
    everything = dash.all_selected(dashboard)
    assert _variable_values(server, database, dashboard, "network", everything) == {"finney", "testnet"}
    testnet = everything | {"network": "testnet"}
    assert _variable_values(server, database, dashboard, "role", testnet) == {"miner"}
    validators = everything | {"network": "finney", "role": "validator"}
    assert _variable_values(server, database, dashboard, "uid", validators) == set(VALIDATORS)


def test_training_uid_variable_lists_only_miners(telemetry_db: tuple[InfluxV1, str]) -> None:
    server, database = telemetry_db
    dashboard = BY_UID["telemetry-training"]
    uids = _variable_values(server, database, dashboard, "uid", dash.all_selected(dashboard))
    assert uids == set(MINERS)


def test_counter_rates_are_per_second_and_survive_the_sum(telemetry_db: tuple[InfluxV1, str]) -> None:
    """The sent-rate panel adds up per-process rates: 49 per 10 s per process."""
    server, database = telemetry_db
    dashboard = BY_UID["telemetry-health"]
    query = next(q for q in dash.panel_queries(dashboard, DATASOURCES) if q.name == "Records sent per second")
    chosen = dash.all_selected(dashboard) | {"sink": "influxdb"}
    series = run(
        server, database, dash.expand(query, RANGE, chosen, dashboard=dashboard, interval=timedelta(minutes=1))
    )
    values = [row[1] for one in series for row in one["values"][1:-1] if row[1] is not None]
    assert values, series
    processes = len(NODES)
    for value in values:
        assert value == pytest.approx(4.9 * processes, rel=0.05)


def test_counter_rates_read_the_same_from_the_downsampled_copy(telemetry_db: tuple[InfluxV1, str]) -> None:
    """Over a long range the panel sums the copy's 5-minute sums of deltas: the same rate."""
    server, database = telemetry_db
    dashboard = BY_UID["telemetry-health"]
    query = next(
        q
        for q in dash.panel_queries(dashboard, DATASOURCES)
        if q.name == "Records sent per second" and q.ref_id.endswith("-long")
    )
    chosen = dash.all_selected(dashboard) | {"sink": "influxdb"}
    text = dash.expand(query, LONG_RANGE, chosen, dashboard=dashboard, interval=timedelta(minutes=5))
    values = [row[1] for one in run(server, database, text) for row in one["values"][1:-1] if row[1] is not None]
    assert len(values) >= 4, text
    for value in values:
        assert value == pytest.approx(4.9 * len(NODES), rel=0.05)


def test_fleet_panels_are_a_few_series_and_chosen_nodes_one_line_each(telemetry_db: tuple[InfluxV1, str]) -> None:
    server, database = telemetry_db
    dashboard = BY_UID["telemetry-system"]
    targets = {q.ref_id: q for q in dash.panel_queries(dashboard, DATASOURCES) if q.name == "CPU"}
    everything = dash.all_selected(dashboard)
    fleet = run(server, database, dash.expand(targets["A"], RANGE, everything, dashboard=dashboard, interval=INTERVAL))
    assert [s["columns"] for s in fleet] == [["time", "median", "p90", "max"]]
    two = everything | {"uid": ["1", "10"]}
    nodes = run(server, database, dash.expand(targets["B"], RANGE, two, dashboard=dashboard, interval=INTERVAL))
    assert sorted(s["tags"]["uid"] for s in nodes) == ["1", "10"]


def test_worst_nodes_tables_name_the_worst_few(telemetry_db: tuple[InfluxV1, str]) -> None:
    server, database = telemetry_db
    dashboard = BY_UID["telemetry-training"]
    query = next(
        q for q in dash.panel_queries(dashboard, DATASOURCES) if q.name == "Slowest miners" and q.ref_id == "A"
    )
    text = dash.expand(query, RANGE, dash.all_selected(dashboard), dashboard=dashboard, interval=INTERVAL)
    rows = server.rows(text, database)
    every = server.rows(
        f'SELECT mean("tokens_per_sec") AS "tps" FROM "training_step" '
        f'WHERE time >= {RANGE.start_ms}ms AND time <= {RANGE.end_ms}ms GROUP BY "uid"',
        database,
    )
    assert len(rows) == min(5, len(MINERS))
    assert {r["uid"] for r in rows} == {r["uid"] for r in sorted(every, key=lambda r: r["tps"])[:5]}


def test_the_database_holds_every_field_of_the_catalog(telemetry_db: tuple[InfluxV1, str]) -> None:
    """Every field of every catalog measurement is stored, as the client wrote the model's points."""
    server, database = telemetry_db
    for name, measurement in CATALOG.items():
        stored = {row["fieldKey"] for row in server.rows(f'SHOW FIELD KEYS FROM "{name}"', database)}
        missing = set(measurement.field_names) - stored
        assert not missing, (
            f"no value for field(s) {sorted(missing)} of measurement {name}: add one to simulator/values.py"
        )
        tags = {row["tagKey"] for row in server.rows(f'SHOW TAG KEYS FROM "{name}"', database)}
        assert tags == set(measurement.tag_names), name


def test_answers_names_the_live_target_of_a_panel() -> None:
    """The simulator skips the twin that is silent by design; this is how it tells them apart."""
    system = BY_UID["telemetry-system"]
    cpu = {q.ref_id: q for q in dash.panel_queries(system, DATASOURCES) if q.name == "CPU"}
    assert set(cpu) == {"A", "A-long", "B", "B-long"}

    def live(time_range: dash.TimeRange, values: dict) -> list[str]:
        return sorted(ref for ref, q in cpu.items() if dash.answers(q, time_range, values, dashboard=system))

    everything = dash.all_selected(system)
    assert live(RANGE, everything) == ["A"]
    assert live(LONG_RANGE, everything) == ["A-long"]
    assert live(RANGE, everything | {"uid": ["1", "2"]}) == ["B"]
    assert live(LONG_RANGE, everything | {"uid": "1"}) == ["B-long"]
    assert live(LONG_RANGE, everything | {"raw_up_to_ms": str(2**53 - 1)}) == ["A"]


def test_busiest_measurements_read_the_copy_from_a_sixth_of_the_raw_limit(telemetry_db: tuple[InfluxV1, str]) -> None:
    """Over two hours (raw limit six hours), "Pending bytes" reads the copy and "CPU" the raw data, on the server."""
    server, database = telemetry_db
    two_hours = dash.TimeRange(NOW - timedelta(hours=2), NOW)
    for uid, title, live_ref, silent_ref in (
        ("telemetry-health", "Pending bytes", "A-long", "A"),
        ("telemetry-system", "CPU", "A", "A-long"),
    ):
        dashboard = BY_UID[uid]
        targets = {q.ref_id: q for q in dash.panel_queries(dashboard, DATASOURCES) if q.name == title}
        everything = dash.all_selected(dashboard)

        def answer(ref: str, values: dict, dashboard: dict = dashboard, targets: dict = targets) -> list[dict]:
            text = dash.expand(targets[ref], two_hours, values, dashboard=dashboard, interval=timedelta(minutes=5))
            return run(server, database, text)

        assert has_values(answer(live_ref, everything)), title
        assert not has_values(answer(silent_ref, everything)), title
        assert dash.answers(targets[live_ref], two_hours, everything, dashboard=dashboard)
        assert not dash.answers(targets[silent_ref], two_hours, everything, dashboard=dashboard)
        # "always" keeps every range on the raw data, the busiest measurements too.
        always = everything | {"raw_up_to_ms": str(2**53 - 1)}
        assert has_values(answer("A", always)), title
        assert not has_values(answer("A-long", always)), title


def _fleet_rows(server: InfluxV1, database: str, panel: tuple[str, str], ref_id: str, chosen: dict) -> dict:
    """A panel's fleet target `ref_id` at a 5-minute interval: {bucket start ms: [median, p90, max]}."""
    dashboard = BY_UID[panel[0]]
    query = next(q for q in dash.panel_queries(dashboard, DATASOURCES) if q.name == panel[1] and q.ref_id == ref_id)
    if ref_id.endswith("-long"):
        assert '_spread"' in query.text, query.text
    time_range = LONG_RANGE if ref_id.endswith("-long") else RANGE
    values = dash.all_selected(dashboard) | chosen
    text = dash.expand(query, time_range, values, dashboard=dashboard, interval=timedelta(minutes=5))
    series = run(server, database, text)
    assert [s["columns"] for s in series] == [["time", "median", "p90", "max"]], text
    return {row[0]: row[1:] for row in series[0]["values"]}


# A fleet panel that reads a Spread over long ranges, what it shows, and variables that leave one node.
SPREAD_PANELS = [
    (("telemetry-validators", "Score per evaluated miner"), "score", "validator_scores", {"uid": ["11"]}),
    (("telemetry-validators", "Weight per evaluated miner"), "weight", "validator_scores", {"uid": ["10"]}),
    (("telemetry-system", "GPU utilisation"), "utilization_percent", "gpu", {"network": ["testnet"]}),
    (("telemetry-system", "GPU memory allocated"), "allocated_bytes", "gpu_memory", {"network": ["testnet"]}),
]


@pytest.mark.parametrize(
    ("panel", "field", "measurement", "one_node"), SPREAD_PANELS, ids=[p[0][1] for p in SPREAD_PANELS]
)
def test_fleet_view_reads_the_same_from_a_spread_as_from_the_raw_data(
    telemetry_db: tuple[InfluxV1, str], panel: tuple[str, str], field: str, measurement: str, one_node: dict
) -> None:
    """Over a long range the panel reads its Spread (a series per node), not the copy's series per
    node and evaluated miner or device. For one node its median, p90 and max per 5 minutes are the
    raw data's; over every node the max still is, and the median and p90 are the median of the
    nodes' own (each lies between the smallest and largest node's)."""
    server, database = telemetry_db
    whole = [t for t in range(RANGE.start_ms, RANGE.end_ms - 300_000 + 1) if t % 300_000 == 0]
    assert len(whole) >= 4
    raw = _fleet_rows(server, database, panel, "A", one_node)
    spread = _fleet_rows(server, database, panel, "A-long", one_node)
    for start in whole:
        assert spread[start] == pytest.approx(raw[start]), start
    per_node = server.query(
        f'SELECT median("{field}"), percentile("{field}", 90), max("{field}") FROM "{measurement}" '
        f'WHERE time >= {RANGE.start_ms}ms AND time <= {RANGE.end_ms}ms GROUP BY time(5m), "uid"',
        database,
        epoch="ms",
    )["results"][0]["series"]
    assert len(per_node) > 1
    own: dict[int, list] = {}  # bucket start ms: [median, p90, max] of each node
    for node in per_node:
        for row in node["values"]:
            own.setdefault(row[0], []).append(row[1:])
    raw_all = _fleet_rows(server, database, panel, "A", {})
    spread_all = _fleet_rows(server, database, panel, "A-long", {})
    for start in whole:
        median, p90, highest = spread_all[start]
        assert highest == pytest.approx(raw_all[start][2])
        assert highest == pytest.approx(max(node[2] for node in own[start]))
        for position, value in ((0, median), (1, p90)):
            values = [node[position] for node in own[start]]
            assert min(values) <= value <= max(values)


@pytest.mark.slow
def test_a_version_that_reads_as_a_number_matches_only_through_the_regex_format(
    influx_db: tuple[InfluxV1, str],
) -> None:
    """On a real InfluxDB: the data source's bare $version leaves 1.4.2+cu121 unescaped, `+` a quantifier."""
    server, database = influx_db
    data = b"training_step,version=1.4.2+cu121,uid=1 loss=0.5 1700000000000000000"
    with urllib.request.urlopen(f"{server.url}/write?db={database}", data=data, timeout=10) as answer:
        assert answer.status == 204
    value = {"version": "1.4.2+cu121"}
    bare = dash.expand_influxql(
        'SELECT count("loss") FROM "training_step" WHERE "version" =~ /^$version$/', RANGE, value
    )
    dashboards = dash.expand_influxql(
        'SELECT count("loss") FROM "training_step" WHERE ' + influxql.tag_matches("version"), RANGE, value
    )
    assert run(server, database, bare) == []
    assert run(server, database, dashboards)[0]["values"][0][1] == 1
