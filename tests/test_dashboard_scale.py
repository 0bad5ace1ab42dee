"""The dashboards at fleet scale: series budget per view, and the cardinality the catalog implies.

The fleet is the benchmark's reference shape (bench/bench_dashboards.py): 256
miners, 16 validators, an aggregator and an evaluator with 4 GPUs each, written
through MetricsLogger into a real InfluxDB 1.6.7 (a few minutes of history: the
series count does not depend on the length, only the points do), with the
downsampled copy filled in as the continuous queries would; and into a real
VictoriaMetrics (API v2), for the MetricsQL set of the dashboards.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from servers import InfluxV1, VictoriaMetrics, victoria_metrics

from grafana.builder import downsampling
from grafana.builder.influxql import DOWNSAMPLED_RP
from simulator import dashboards as dash
from simulator.backfill import FleetShape, backfill
from simulator.victoria import PromQL, result_counts
from telemetry_client import cardinality as card
from telemetry_client.catalog import QUERYABLE, STACK_CATALOG

pytestmark = pytest.mark.slow

SERIES_BUDGET = 50  # what one panel query may return with every variable at its default
SHAPE = FleetShape(miners=256, validators=16, aggregators=1, evaluators=1, gpus_per_node=4, hours=0.05)
FLEET = card.Fleet(miners=256, validators=16, gpus_per_node=4, tasks=4, sinks=2)
RANGES = {"1h": timedelta(hours=1), "6h": timedelta(hours=6), "24h": timedelta(days=1), "7d": timedelta(days=7)}


def test_series_per_node_follow_the_catalog() -> None:
    fleet = card.Fleet(miners=10, validators=2, gpus_per_node=8, tasks=3, sinks=2)
    miner = card.series_per_node("miner", fleet)
    assert miner["training_step"] == 1 and miner["gpu"] == 8 and miner["gpu_memory"] == 8
    assert miner["telemetry_client"] == 2 and "validator_scores" not in miner
    validator = card.series_per_node("validator", fleet)
    assert validator["validator_scores"] == 10  # one per evaluated miner
    assert card.series_per_node("evaluator", fleet)["evaluator_benchmark"] == 3
    total = card.fleet_series(fleet)
    assert total["validator_scores"] == 2 * 10 and total["gpu"] == 14 * 8
    restarts = card.fleet_series(card.Fleet(miners=10, validators=2, gpus_per_node=8, tasks=3, runs_per_node=3))
    assert restarts["system"] == 3 * total["system"]
    with pytest.raises(ValueError, match="unknown role"):
        card.series_per_node("observer", fleet)


def test_the_report_prints_per_role_and_fleet_totals(capsys: pytest.CaptureFixture[str]) -> None:
    assert card.main(["--miners", "256", "--validators", "16", "--gpus", "4"]) == 0
    out = capsys.readouterr().out
    assert "validator_scores" in out and "series per node" in out
    assert f"{sum(card.fleet_series(FLEET).values()):,}" in out


@pytest.fixture(scope="module")
def fleet_db(influx_server: InfluxV1) -> Iterator[tuple[InfluxV1, str, datetime]]:
    database = "telemetry_scale"
    influx_server.create_database(database)
    for statement in downsampling.influxql_setup(database):
        assert "error" not in influx_server.query(statement)["results"][0], statement
    end = datetime.now(UTC).replace(microsecond=0)
    assert backfill(influx_server.url, database, SHAPE, end) > 0
    start_ms = int((end - timedelta(hours=1)).timestamp() * 1000)
    for statement in downsampling.influxql_backfill(database, start_ms, int(end.timestamp() * 1000) + 1):
        result = influx_server.query(statement, database)["results"][0]
        assert "error" not in result, f"{result['error']}\n{statement}"
    yield influx_server, database, end
    influx_server.query(f'DROP DATABASE "{database}"')


def test_the_database_holds_the_series_the_catalog_implies(fleet_db: tuple[InfluxV1, str, datetime]) -> None:
    server, database, _ = fleet_db
    spreads = card.spread_series(FLEET)
    stored = {}
    for name in (name for name in QUERYABLE if name not in STACK_CATALOG):  # the stack's own: not the fleet's
        # A spread is only in the downsampled copy's retention policy; FROM without one reads the default.
        where = f'"{DOWNSAMPLED_RP}"."{name}"' if name in spreads else f'"{name}"'
        rows = server.rows(f"SHOW SERIES EXACT CARDINALITY FROM {where}", database)
        stored[name] = sum(row["count"] for row in rows)
    assert stored == card.fleet_series(FLEET) | spreads


@pytest.mark.parametrize("span", list(RANGES))
def test_no_default_view_exceeds_the_series_budget(fleet_db: tuple[InfluxV1, str, datetime], span: str) -> None:
    server, database, end = fleet_db
    time_range = dash.TimeRange(end - RANGES[span], end)
    interval = dash.auto_interval(time_range, max_data_points=1000, min_interval=dash.INFLUXDB_TIME_INTERVAL)
    datasources = dash.load_datasources()
    over, answered = [], 0
    for dashboard in dash.load_dashboards():
        values = dash.all_selected(dashboard)
        for query in dash.panel_queries(dashboard, datasources):
            if query.datasource_type != "influxdb":
                continue
            text = dash.expand(query, time_range, values, dashboard=dashboard, interval=interval)
            result = server.query(text, database, epoch="ms")["results"][0]
            assert "error" not in result, f"{query.where}: {result['error']}"
            series = sum(max(1, len(s["columns"]) - 1) for s in result.get("series", []))
            answered += bool(series)
            if series > SERIES_BUDGET:
                over.append(f"{query.where}: {series} series")
    assert answered > 40, "the default views answered too little to prove anything"
    assert over == []


@pytest.fixture(scope="module")
def fleet_vm() -> Iterator[tuple[VictoriaMetrics, datetime]]:
    """The same fleet in a VictoriaMetrics of this module's own, written as nodes write (API v2)."""
    with victoria_metrics() as server:
        end = datetime.now(UTC).replace(microsecond=0)
        assert backfill(server.url, "telemetry", SHAPE, end, api_version=2, token="test-token-not-secret", org="o") > 0
        server.wait_for_series('{__name__="system_cpu_percent"}', SHAPE.miners, timeout=120)
        yield server, end


@pytest.mark.parametrize("span", list(RANGES))
def test_no_default_view_exceeds_the_series_budget_on_victoriametrics(
    fleet_vm: tuple[VictoriaMetrics, datetime], span: str
) -> None:
    """The MetricsQL twins (grafana/dashboards-victoriametrics/) under the same budget."""
    server, end = fleet_vm
    interval = dash.auto_interval(
        dash.TimeRange(end - RANGES[span], end), max_data_points=1000, min_interval=dash.PROMETHEUS_SCRAPE_INTERVAL
    )
    # Grafana rounds a range query's end down to a multiple of the step: open the
    # dashboard one step after the data so that the last step still covers it.
    time_range = dash.TimeRange(end + interval - RANGES[span], end + interval)
    api = PromQL(server.url, timeout=300)
    over, answered = [], 0
    for dashboard in dash.load_dashboards(dash.VICTORIAMETRICS_DASHBOARDS_DIR):
        values = dash.all_selected(dashboard)
        for query in dash.panel_queries(dashboard):
            if query.datasource_type != "prometheus":
                continue
            text = dash.expand(query, time_range, values, dashboard=dashboard, interval=interval)
            data = api.instant(text, time_range.end_ms) if query.instant else api.range(text, time_range, interval)
            series, _ = result_counts(data)
            answered += bool(series)
            if series > SERIES_BUDGET:
                over.append(f"{query.where}: {series} series")
    assert answered > 40, "the default views answered too little to prove anything"
    assert over == []
