"""The VictoriaMetrics dashboard set: MetricsQL twins of the InfluxQL panels, built by the same builder.

Generated into grafana/dashboards-victoriametrics/ by python -m grafana.build_dashboards
from the same sources as grafana/dashboards/; every panel exists in both sets
(same dashboard uids, titles and panel ids), the Loki panels are the same LogQL.
"""

from __future__ import annotations

import ast
import math
import re
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import yaml
from servers import InfluxV1, VictoriaMetrics, victoria_metrics
from test_dashboard_queries import (
    MINERS,
    NODES,
    VALIDATORS,
    CatalogPoint,
    catalog_points,
    write_backup_reports,
    write_with_metrics_logger,
)

from grafana import build_dashboards
from grafana.builder.backend import BACKENDS, building_for, current_backend
from grafana.builder.dialects import DIALECTS, Dialect, current_dialect
from simulator import backups
from simulator import dashboards as dash
from simulator.victoria import PromQL, variable_call
from telemetry_client.catalog import CATALOG, STANDARD_TAGS

ROOT = Path(__file__).resolve().parents[1]
GRAFANA = ROOT / "grafana"
VM_DIR = GRAFANA / "dashboards-victoriametrics"
INFLUX_SET = dash.load_dashboards()
VM_SET = dash.load_dashboards(VM_DIR)
DATASOURCES = dash.load_datasources()


# ---------------------------------------------------------------- the backend switch


def test_building_for_switches_the_backend_and_restores_it() -> None:
    assert BACKENDS == ("influxdb", "victoriametrics")
    assert current_backend() == "influxdb"
    with building_for("victoriametrics"):
        assert current_backend() == "victoriametrics"
        with building_for("influxdb"):
            assert current_backend() == "influxdb"
        assert current_backend() == "victoriametrics"
    assert current_backend() == "influxdb"
    with pytest.raises(ValueError, match="unknown metrics backend 'prometheus'"), building_for("prometheus"):  # type: ignore[arg-type]
        pass


def test_a_build_in_another_thread_keeps_its_own_backend() -> None:
    seen: list[str] = []
    with building_for("victoriametrics"):
        thread = threading.Thread(target=lambda: seen.append(current_backend()))
        thread.start()
        thread.join()
    assert seen == ["influxdb"]


def test_every_backend_has_a_dialect_with_the_whole_interface() -> None:
    abstract = {name for name, member in vars(Dialect).items() if getattr(member, "__isabstractmethod__", False)}
    assert {"target", "fleet_target", "rule_mean", "rule_reporting"} <= abstract
    assert set(DIALECTS) == set(BACKENDS)
    for backend, dialect in DIALECTS.items():
        assert dialect.backend == backend
        assert not type(dialect).__abstractmethods__, backend
        assert abstract <= set(vars(type(dialect))), backend
        assert dialect.store_name and dialect.datasource["uid"], backend
    with building_for("victoriametrics"):
        assert current_dialect() is DIALECTS["victoriametrics"]
    assert current_dialect() is DIALECTS["influxdb"]


# The modules whose helpers build panels and rules: only the dialects may know a backend by name.
_NEUTRAL_SOURCES = sorted(
    path
    for folder in ("builder", "alerting_src", "dashboards_src")
    for path in (GRAFANA / folder).glob("*.py")
    if path.name not in {"backend.py", "dialects.py"}
)


def _backend_branches(source: str) -> list[str]:
    """Where `source` asks for the backend or compares, matches or keys on a backend's name."""

    def names_backend(node: ast.AST | None) -> bool:
        return isinstance(node, ast.Constant) and node.value in BACKENDS

    found = []
    for node in ast.walk(ast.parse(source)):
        line = getattr(node, "lineno", 0)
        if isinstance(node, ast.Name | ast.Attribute) and "current_backend" in (
            getattr(node, "id", None),
            getattr(node, "attr", None),
        ):
            found.append(f"line {line}: current_backend")
        elif isinstance(node, ast.ImportFrom) and any(alias.name == "current_backend" for alias in node.names):
            found.append(f"line {line}: imports current_backend")
        elif isinstance(node, ast.Compare) and any(names_backend(n) for n in (node.left, *node.comparators)):
            found.append(f"line {line}: compares with a backend name")
        elif isinstance(node, ast.MatchValue) and names_backend(node.value):
            found.append(f"line {line}: matches a backend name")
        elif isinstance(node, ast.Dict) and any(names_backend(key) for key in node.keys):
            found.append(f"line {line}: keyed by backend name")
    return found


def test_the_branch_check_finds_a_branch_on_the_backend() -> None:
    assert _backend_branches('def f():\n    return current_backend() == "victoriametrics"\n')
    assert _backend_branches('x = {"influxdb": 1}[b]\n')
    assert _backend_branches('if b != "influxdb":\n    pass\n')
    assert not _backend_branches('with building_for("victoriametrics"):\n    pass\n')


@pytest.mark.parametrize("path", _NEUTRAL_SOURCES, ids=lambda path: f"{path.parent.name}/{path.name}")
def test_no_helper_branches_on_the_backend_outside_the_dialects(path: Path) -> None:
    """A helper asks current_dialect() for its text: a new store is a new Dialect, not a branch in every helper."""
    assert _backend_branches(path.read_text(encoding="utf-8")) == []


# ---------------------------------------------------------------- the generated set


def test_committed_victoriametrics_json_is_what_the_builder_generates() -> None:
    rendered = build_dashboards.render("victoriametrics")
    on_disk = {p.name: p.read_text(encoding="utf-8") for p in VM_DIR.glob("*.json")}
    assert set(on_disk) == set(rendered), "run python -m grafana.build_dashboards"
    for name, text in rendered.items():
        assert on_disk[name] == text, f"{name} is stale: run python -m grafana.build_dashboards"


def _panels(dashboard: dict) -> dict[int, tuple[str, str]]:
    return {p["id"]: (p["title"], p["type"]) for p in dash.iter_panels(dashboard)}


def test_every_panel_has_its_twin_in_the_other_set() -> None:
    """Same files, dashboard uids and titles; the same panels (id, title, type), both ways."""
    influx = {d["_file"]: d for d in INFLUX_SET}
    victoria = {d["_file"]: d for d in VM_SET}
    assert set(influx) == set(victoria)
    for name, dashboard in influx.items():
        twin = victoria[name]
        assert (twin["uid"], twin["title"]) == (dashboard["uid"], dashboard["title"]), name
        assert _panels(twin) == _panels(dashboard), name


def test_metrics_panels_query_victoriametrics_and_loki_panels_are_unchanged() -> None:
    influx = {d["uid"]: d for d in INFLUX_SET}
    for dashboard in VM_SET:
        twin_panels = {p["id"]: p for p in dash.iter_panels(influx[dashboard["uid"]])}
        for panel in dash.iter_panels(dashboard):
            if panel["type"] == "row":
                continue
            twin = twin_panels[panel["id"]]
            sources = {t["datasource"]["uid"] for t in panel["targets"]}
            if twin["datasource"]["uid"] == "loki":
                assert panel["targets"] == twin["targets"], panel["title"]
            else:
                assert twin["datasource"]["uid"] == "influxdb"
                assert sources == {"victoriametrics"}, panel["title"]
                assert panel["datasource"] == {"type": "prometheus", "uid": "victoriametrics"}


def test_victoriametrics_set_has_no_downsampled_copy_switch() -> None:
    """VictoriaMetrics (open source) keeps no downsampled copy: no raw/long twins, no $raw_up_to_ms."""
    for dashboard in VM_SET:
        names = {v["name"] for v in dashboard["templating"]["list"]}
        assert "raw_up_to_ms" not in names, dashboard["uid"]
        for query in dash.panel_queries(dashboard):
            assert not query.ref_id.endswith("-long"), query.where
            assert "raw_up_to_ms" not in query.text and "downsampled" not in query.text, query.where


def test_variables_are_label_values_chained_like_the_influxdb_ones() -> None:
    influx = {d["uid"]: d for d in INFLUX_SET}
    for dashboard in VM_SET:
        twin = {v["name"]: v for v in influx[dashboard["uid"]]["templating"]["list"]}
        for variable in dashboard["templating"]["list"]:
            if variable["name"] == "raw_up_to_ms":
                continue
            other = twin[variable["name"]]
            assert variable["type"] == other["type"], variable["name"]
            if other.get("datasource", {}).get("uid") != "influxdb":
                assert variable == other, variable["name"]
                continue
            assert variable["datasource"] == {"type": "prometheus", "uid": "victoriametrics"}
            assert variable["query"].startswith("label_values(") and variable["allValue"] == ".*"
            assert (variable["multi"], variable["includeAll"]) == (other["multi"], other["includeAll"])
            # Chained the same way: the InfluxQL WHERE names the same variables as the selector.
            for name in twin:
                chained = f"${{{name}:regex}}" in other["query"]
                assert (f"${name}" in variable["query"]) == chained, (variable["name"], name)


# ---------------------------------------------------------------- on the real servers

# The data: every catalog measurement of a small fleet (tests/test_dashboard_queries.py),
# written through MetricsLogger into a real VictoriaMetrics (API v2, as nodes write) and
# into InfluxDB 1.6.7 (API v1) alike. Samples sit 5 s off the 10 s grid so that no sample
# lies on an interval's edge: InfluxDB's bucket [t, t + i) and VictoriaMetrics' window
# (t' - i, t'] then hold the same samples, the latter labelled one interval later.
NOW = datetime(2026, 11, 30, 12, 0, 0, tzinfo=UTC)
RANGE = dash.TimeRange(NOW - timedelta(minutes=30), NOW)
INTERVAL = timedelta(seconds=30)
OFFSET = timedelta(seconds=5)
SERIES_BUDGET = 50  # what one panel query may return with every variable at its default (as for InfluxDB)
VM_BY_UID = {d["uid"]: d for d in VM_SET}
INFLUX_BY_UID = {d["uid"]: d for d in INFLUX_SET}
VM_QUERIES = [q for q in dash.iter_queries(VM_SET) if q.datasource_type == "prometheus"]
CHOSEN = {"uid": [node[0] for node in NODES], "eval_uid": list(MINERS)}
VIEW = re.compile(r'label_(match|mismatch)\(label_set\(vector\(1\), "sel", "\$\{(\w+):raw\}"\)')


def v2_connection(server: VictoriaMetrics) -> dict[str, object]:
    return {"url": server.url, "token": "test-token-not-secret", "org": "telemetry", "database": "telemetry"}


@pytest.fixture(scope="module")
def victoria() -> Iterator[VictoriaMetrics]:
    """A VictoriaMetrics of this module's own, holding the small fleet."""
    with victoria_metrics() as server:
        points = list(catalog_points(NOW - OFFSET, timedelta(minutes=30)))
        assert write_with_metrics_logger(points, **v2_connection(server)) == len(points)
        connection = v2_connection(server)
        write_backup_reports(
            NOW - OFFSET,
            timedelta(minutes=30),
            influx_url=server.url,
            database="telemetry",
            token=connection["token"],
            org="telemetry",
        )
        server.wait_for_series('{__name__="system_cpu_percent"}', len(NODES), timeout=60)
        server.wait_for_series('{__name__="stack_backup_age_seconds"}', len(backups.HOSTS), timeout=60)
        yield server


@pytest.fixture(scope="module")
def influx_twin(influx_server: InfluxV1) -> Iterator[tuple[InfluxV1, str]]:
    """The same points in InfluxDB 1.6.7, for the panels whose numbers are compared."""
    database = "telemetry_twins"
    influx_server.create_database(database)
    points = list(catalog_points(NOW - OFFSET, timedelta(minutes=30)))
    connection = {"url": influx_server.url, "database": database, "api_version": 1}
    assert write_with_metrics_logger(points, **connection) == len(points)
    write_backup_reports(
        NOW - OFFSET, timedelta(minutes=30), influx_url=influx_server.url, database=database, api_version=1
    )
    yield influx_server, database
    influx_server.query(f'DROP DATABASE "{database}"')


def run_vm(
    server: VictoriaMetrics,
    query: dash.Query,
    time_range: dash.TimeRange,
    values: dict,
    interval: timedelta = INTERVAL,
) -> list[dict]:
    """The series `query` returns, interpolated and sent as Grafana sends it (range or instant)."""
    dashboard = VM_BY_UID[query.dashboard_uid]
    text = dash.expand(query, time_range, values, dashboard=dashboard, interval=interval)
    api = PromQL(server.url, timeout=120)
    data = api.instant(text, time_range.end_ms) if query.instant else api.range(text, time_range, interval)
    return data["result"]


def vm_values(series: list[dict]) -> list[float]:
    """Every number of a range (values) or instant (value) answer, NaN left out."""
    numbers = [float(v) for one in series for _, v in one.get("values", [one["value"]] if "value" in one else [])]
    return [n for n in numbers if not math.isnan(n)]


def live_values(query: dash.Query) -> dict:
    """Variables under which `query` is its panel's live target: All, or every node by name for a per-node one."""
    values = dash.all_selected(VM_BY_UID[query.dashboard_uid])
    for kind, variable in VIEW.findall(query.text):
        if kind == "mismatch":
            values[variable] = CHOSEN[variable]
    return values


def variable_values(server: VictoriaMetrics, query: dash.Query, values: dict) -> list[str]:
    """What a label_values() variable lists: /api/v1/label/<label>/values, with match[] when it has a selector."""
    text = dash.expand(query, RANGE, values, dashboard=VM_BY_UID[query.dashboard_uid], interval=INTERVAL)
    call = variable_call(text)
    assert call is not None and call[0] == "label_values", text
    return PromQL(server.url, timeout=120).variable(*call, RANGE)


@pytest.mark.slow
@pytest.mark.parametrize("query", [q for q in VM_QUERIES if q.source == "panel"], ids=lambda q: q.where)
def test_every_metricsql_panel_query_returns_data_within_budget(victoria: VictoriaMetrics, query: dash.Query) -> None:
    values = live_values(query)
    dashboard = VM_BY_UID[query.dashboard_uid]
    assert dash.answers(query, RANGE, values, dashboard=dashboard), query.where
    series = run_vm(victoria, query, RANGE, values)
    assert vm_values(series), f"no data for {query.where}"
    assert len(series) <= SERIES_BUDGET, f"{query.where}: {len(series)} series"


@pytest.mark.slow
@pytest.mark.parametrize("query", [q for q in VM_QUERIES if VIEW.search(q.text)], ids=lambda q: q.where)
def test_a_view_target_is_silent_when_its_twin_answers(victoria: VictoriaMetrics, query: dash.Query) -> None:
    """The fleet target is empty with nodes chosen, the per-node one with "All"; answers() agrees."""
    values = live_values(query)
    flipped = dict(values)
    for _, variable in VIEW.findall(query.text):
        flipped[variable] = None if isinstance(values[variable], list) else CHOSEN[variable]
    dashboard = VM_BY_UID[query.dashboard_uid]
    assert not dash.answers(query, RANGE, flipped, dashboard=dashboard), query.where
    assert run_vm(victoria, query, RANGE, flipped) == [], query.where


@pytest.mark.slow
@pytest.mark.parametrize("query", [q for q in VM_QUERIES if "$network" in q.text], ids=lambda q: q.where)
def test_metricsql_query_follows_the_network_variable(victoria: VictoriaMetrics, query: dash.Query) -> None:
    values = live_values(query)
    if query.source == "variable":
        assert set(variable_values(victoria, query, values | {"network": ["nowhere"]})) == set()
        assert variable_values(victoria, query, values | {"network": ["finney"]})
        return
    assert vm_values(run_vm(victoria, query, RANGE, values | {"network": ["finney"]})), query.where
    assert run_vm(victoria, query, RANGE, values | {"network": ["nowhere"]}) == [], query.where


@pytest.mark.slow
@pytest.mark.parametrize("query", [q for q in VM_QUERIES if q.source == "variable"], ids=lambda q: q.where)
def test_every_variable_lists_values(victoria: VictoriaMetrics, query: dash.Query) -> None:
    assert variable_values(victoria, query, dash.all_selected(VM_BY_UID[query.dashboard_uid])), query.where


def _variable(dashboard_uid: str, name: str) -> dash.Query:
    return next(q for q in dash.variable_queries(VM_BY_UID[dashboard_uid]) if q.name == name)


@pytest.mark.slow
def test_variables_chain_network_role_uid(victoria: VictoriaMetrics) -> None:
    everything = dash.all_selected(VM_BY_UID["telemetry-network"])
    assert set(variable_values(victoria, _variable("telemetry-network", "network"), everything)) == {
        "finney",
        "testnet",
    }
    testnet = everything | {"network": "testnet"}
    assert set(variable_values(victoria, _variable("telemetry-network", "role"), testnet)) == {"miner"}
    validators = everything | {"network": "finney", "role": "validator"}
    assert set(variable_values(victoria, _variable("telemetry-network", "uid"), validators)) == set(VALIDATORS)
    training = dash.all_selected(VM_BY_UID["telemetry-training"])
    assert set(variable_values(victoria, _variable("telemetry-training", "uid"), training)) == set(MINERS)


# ---------------------------------------------------------------- the same numbers as the InfluxQL twin


def _twins(dashboard_uid: str, title: str) -> tuple[dict[str, dash.Query], dict[str, dash.Query]]:
    vm = {q.ref_id: q for q in dash.panel_queries(VM_BY_UID[dashboard_uid]) if q.name == title}
    influx = {q.ref_id: q for q in dash.panel_queries(INFLUX_BY_UID[dashboard_uid], DATASOURCES) if q.name == title}
    return vm, influx


def _influx_series(server: InfluxV1, database: str, query: dash.Query, values: dict, interval: timedelta) -> dict:
    """{(tags..., column): {time_ms: value}} of an InfluxQL panel query."""
    text = dash.expand(query, RANGE, values, dashboard=INFLUX_BY_UID[query.dashboard_uid], interval=interval)
    result = server.query(text, database, epoch="ms")["results"][0]
    assert "error" not in result, f"{result['error']}\n{text}"
    found: dict = {}
    for one in result.get("series", []):
        tags = tuple(sorted((one.get("tags") or {}).values()))
        for row in one["values"]:
            for column, value in zip(one["columns"][1:], row[1:], strict=True):
                if value is not None:
                    found.setdefault((*tags, column), {})[row[0]] = value
    return found


def _vm_series(series: list[dict], interval: timedelta, label: str) -> dict:
    """{(labels..., stat): {start of the InfluxDB bucket, ms: value}}: a point at t covers (t - interval, t]."""
    found: dict = {}
    shift = int(interval.total_seconds() * 1000)
    for one in series:
        metric = dict(one["metric"])
        stat = metric.pop(label, None)
        key = (*sorted(metric.values()), *([stat] if stat else []))
        found[key] = {int(float(t) * 1000) - shift: float(v) for t, v in one["values"]}
    return found


@pytest.mark.slow
@pytest.mark.parametrize("interval_s", [10, 30])
def test_fleet_cpu_is_the_same_distribution_on_both_servers(
    victoria: VictoriaMetrics, influx_twin: tuple[InfluxV1, str], interval_s: int
) -> None:
    """CPU with every node: the max of every interval matches; so does the median when
    each node has one sample per interval (10 s), as at ranges up to about three hours."""
    server, database = influx_twin
    interval = timedelta(seconds=interval_s)
    vm_q, influx_q = _twins("telemetry-system", "CPU")
    values = dash.all_selected(VM_BY_UID["telemetry-system"])
    influx_values = dash.all_selected(INFLUX_BY_UID["telemetry-system"])
    ours = _vm_series(run_vm(victoria, vm_q["A"], RANGE, values, interval), interval, "stat")
    theirs = _influx_series(server, database, influx_q["A"], influx_values, interval)
    compared = ["max", "median"] if interval_s == 10 else ["max"]
    for stat in compared:
        common = set(ours[(stat,)]) & set(theirs[(stat,)])
        assert len(common) >= len(theirs[(stat,)]) - 2 >= 20, (stat, sorted(ours[(stat,)]), sorted(theirs[(stat,)]))
        for t in common:
            assert ours[(stat,)][t] == pytest.approx(theirs[(stat,)][t]), (stat, t)


@pytest.mark.slow
def test_counter_rate_is_the_same_on_both_servers(victoria: VictoriaMetrics, influx_twin: tuple[InfluxV1, str]) -> None:
    """Records sent per second, per sink: 49 per 10 s per process, summed, on either server."""
    server, database = influx_twin
    interval = timedelta(minutes=1)
    vm_q, influx_q = _twins("telemetry-health", "Records sent per second")
    values = dash.all_selected(VM_BY_UID["telemetry-health"])
    influx_values = dash.all_selected(INFLUX_BY_UID["telemetry-health"])
    ours = _vm_series(run_vm(victoria, vm_q["A"], RANGE, values, interval), interval, "stat")
    theirs = _influx_series(server, database, influx_q["A"], influx_values, interval)
    assert set(ours) == {(sink,) for sink in ("influxdb", "loki")}
    assert {key[:1] for key in theirs} == set(ours)
    for key, points in theirs.items():
        mine = ours[key[:1]]
        inner = sorted(set(points) & set(mine))[1:-1]  # the edges of the range hold part of an interval
        assert len(inner) >= 25, key
        for t in inner:
            assert mine[t] == pytest.approx(points[t]) == pytest.approx(4.9 * len(NODES), rel=0.05)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("dashboard_uid", "title"),
    [
        ("telemetry-system", "Hottest GPUs"),
        ("telemetry-system", "Least utilised GPUs"),
        ("telemetry-system", "Highest memory use"),
        ("telemetry-training", "Slowest miners"),
    ],
)
def test_worst_nodes_tables_name_the_same_nodes(
    victoria: VictoriaMetrics, influx_twin: tuple[InfluxV1, str], dashboard_uid: str, title: str
) -> None:
    server, database = influx_twin
    vm_q, influx_q = _twins(dashboard_uid, title)
    values = dash.all_selected(VM_BY_UID[dashboard_uid])
    influx_values = dash.all_selected(INFLUX_BY_UID[dashboard_uid])
    rows = run_vm(victoria, vm_q["A"], RANGE, values)
    text = dash.expand(influx_q["A"], RANGE, influx_values, dashboard=INFLUX_BY_UID[dashboard_uid], interval=INTERVAL)
    theirs = server.rows(text, database)
    assert 0 < len(rows) == len(theirs) <= 5
    field = next(k for k in theirs[0] if k not in ("time", "uid"))
    assert {r["metric"]["uid"]: float(r["value"][1]) for r in rows} == pytest.approx(
        {r["uid"]: r[field] for r in theirs}
    )


# A miner restarted ten minutes into the range: its old run (runtime_id) wrote 63
# steps, its new one 116 after a 20 s gap, so the node has two series with different
# sample counts, and the one-minute interval of the restart holds 3 old samples and
# 2 new ones. A steady miner beside it has one series.
RESTARTED = ("restarted", "miner", "finney", "1.4.0")
STEADY = ("steady", "miner", "finney", "1.4.0")
RESTART_S = int(RANGE.start.timestamp()) + 640


def _restart_points() -> list[CatalogPoint]:
    start = int(RANGE.start.timestamp())
    old = [start + 5 + 10 * k for k in range(63)]  # up to start + 625
    new = [start + 645 + 10 * k for k in range(116)]  # up to start + 1795, 5 s before the end
    points = [
        (RESTARTED, "training_step", {}, {"tokens_per_sec": 1000.0 + 10 * k, "learning_rate": 1e-3 + k * 1e-6}, t)
        for k, t in enumerate(old)
    ]
    points += [
        (RESTARTED, "training_step", {}, {"tokens_per_sec": 400.0 + k, "learning_rate": 5e-4 - k * 1e-6}, t)
        for k, t in enumerate(new)
    ]
    points += [(STEADY, "training_step", {}, {"tokens_per_sec": 800.0, "learning_rate": 2e-4}, t) for t in old + new]
    return points


def _run_of(point: CatalogPoint) -> str:
    node, seconds = point[0], point[4]
    return f"run-{node[0]}-{'old' if node == RESTARTED and seconds < RESTART_S else 'new'}"


@pytest.fixture(scope="module")
def restarted(influx_server: InfluxV1) -> Iterator[tuple[VictoriaMetrics, InfluxV1, str]]:
    """The restarted and the steady miner, in a VictoriaMetrics of their own and an InfluxDB database."""
    points = _restart_points()
    database = "telemetry_restarts"
    influx_server.create_database(database)
    connection = {"url": influx_server.url, "database": database, "api_version": 1}
    assert write_with_metrics_logger(points, _run_of, **connection) == len(points)
    with victoria_metrics() as server:
        assert write_with_metrics_logger(points, _run_of, **v2_connection(server)) == len(points)
        server.wait_for_series('{__name__="training_step_tokens_per_sec"}', 3, timeout=60)
        yield server, influx_server, database
    influx_server.query(f'DROP DATABASE "{database}"')


def _samples(field: str, start_s: float = 0, end_s: float = math.inf) -> list[tuple[int, float]]:
    """(time, value) of the restarted miner's `field`, both runs, within [start_s, end_s)."""
    return [(p[4], p[3][field]) for p in _restart_points() if p[0] == RESTARTED and start_s <= p[4] < end_s]


@pytest.mark.slow
def test_slowest_miners_mean_weighs_every_sample_of_a_restarted_miner(
    restarted: tuple[VictoriaMetrics, InfluxV1, str],
) -> None:
    """The mean over the range is that of all the node's samples, as InfluxQL's mean(),
    not the mean of its two runs' means."""
    server, influx, database = restarted
    values = [v for _, v in _samples("tokens_per_sec")]
    expected = sum(values) / len(values)
    per_run = [[v for t, v in _samples("tokens_per_sec") if (t < RESTART_S) == old] for old in (True, False)]
    assert abs(expected - sum(sum(r) / len(r) for r in per_run) / 2) > 100  # the two readings differ
    vm_q, influx_q = _twins("telemetry-training", "Slowest miners")
    rows = run_vm(server, vm_q["A"], RANGE, dash.all_selected(VM_BY_UID["telemetry-training"]))
    ours = {r["metric"]["uid"]: float(r["value"][1]) for r in rows}
    dashboard = INFLUX_BY_UID["telemetry-training"]
    text = dash.expand(influx_q["A"], RANGE, dash.all_selected(dashboard), dashboard=dashboard, interval=INTERVAL)
    rows = influx.rows(text, database)
    column = next(k for k in rows[0] if k not in ("time", "uid"))
    theirs = {r["uid"]: r[column] for r in rows}
    assert ours == pytest.approx({"restarted": expected, "steady": 800.0})
    assert theirs == pytest.approx(ours)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("title", "field"), [("Tokens per second", "tokens_per_sec"), ("Learning rate", "learning_rate")]
)
def test_a_restarted_miners_line_is_its_mean_and_newest_sample_per_interval(
    restarted: tuple[VictoriaMetrics, InfluxV1, str], title: str, field: str
) -> None:
    """Per one-minute interval, the node's line is the mean of all its samples (tokens per
    second) or its newest sample (learning rate, `last`), on either server, including the
    interval of the restart, where the old run's last sample is not the node's latest."""
    server, influx, database = restarted
    interval = timedelta(minutes=1)
    vm_q, influx_q = _twins("telemetry-training", title)
    chosen = {"uid": [RESTARTED[0], STEADY[0]]}
    vm_values_ = dash.all_selected(VM_BY_UID["telemetry-training"]) | chosen
    influx_values = dash.all_selected(INFLUX_BY_UID["telemetry-training"]) | chosen
    ours = _vm_series(run_vm(server, vm_q["B"], RANGE, vm_values_, interval), interval, "stat")[(RESTARTED[0],)]
    theirs = _influx_series(influx, database, influx_q["B"], influx_values, interval)
    (column,) = [key for key in theirs if key[0] == RESTARTED[0]]
    step = int(interval.total_seconds())
    expected = {}
    for bucket in range(int(RANGE.start.timestamp()), int(RANGE.end.timestamp()), step):
        samples = _samples(field, bucket, bucket + step)
        mean = sum(v for _, v in samples) / len(samples)
        expected[bucket * 1000] = mean if title == "Tokens per second" else max(samples)[1]
    restart_bucket = RESTART_S // step * step * 1000
    assert restart_bucket in expected and restart_bucket in ours
    assert ours == pytest.approx(expected)
    assert theirs[column] == pytest.approx(expected)


# ---------------------------------------------------------------- Grafana's Prometheus interpolation


def test_prometheus_macros_are_what_grafanas_backend_writes() -> None:
    """pkg/promlib/models/query.go: $__interval by gtime.FormatInterval, $__range in rounded
    seconds, $__rate_interval = max(interval + scrape, 4 x scrape) as a Go duration."""
    text = "[$__interval] $__interval_ms [$__range] $__range_s $__range_ms [$__rate_interval] ${__interval}"
    q = dash.expand_metricsql(text, RANGE, interval=timedelta(minutes=2))
    assert q == "[2m] 120000 [1800s] 1800 1800000 [2m10s] 2m"
    assert dash.expand_metricsql("[$__rate_interval]", RANGE, interval=timedelta(seconds=10)) == "[40s]"
    assert dash.expand_metricsql("[$__rate_interval]", RANGE, interval=timedelta(seconds=50)) == "[1m0s]"
    assert dash.grafana_format_interval(timedelta(seconds=90)) == "1m"  # the largest whole unit, truncated
    assert dash.expand_metricsql("[$__range]", dash.TimeRange(NOW - timedelta(milliseconds=1_500), NOW)) == "[2s]"


def test_prometheus_variables_are_escaped_like_grafanas_data_source() -> None:
    """packages/grafana-prometheus/src/escaping.ts (classic behaviour): each value of a multi-value
    variable regex-escaped (a backslash becomes four, a metacharacter gets two in front) and
    several joined as (a|b); "All" is the allValue; ${var:raw} is left alone; a single-value
    variable has its backslashes doubled and each single quote behind two backslashes."""
    system = VM_BY_UID["telemetry-system"]
    template = 'm{uid=~"$uid", version=~"$version"} "${uid:raw}"'
    many = dash.expand_metricsql(template, RANGE, {"uid": ["1", "2"], "version": ["1.4.0", "a|b"]}, dashboard=system)
    assert many == r'm{uid=~"(1|2)", version=~"(1\\.4\\.0|a\\|b)"} "1,2"'
    one = dash.expand_metricsql(template, RANGE, {"uid": "7", "version": r"c:\x"}, dashboard=system)
    assert one == r'm{uid=~"7", version=~"c:\\\\x"} "7"'
    every = dash.expand_metricsql(template, RANGE, dash.all_selected(system), dashboard=system)
    assert every == 'm{uid=~".*", version=~".*"} ".*"'
    textbox = {"templating": {"list": [{"name": "box", "type": "textbox"}]}}
    plain = dash.expand_metricsql("<$box>", RANGE, {"box": "it's a\\b"}, dashboard=textbox)
    assert plain == "<it" + "\\\\" + "'s a" + "\\\\" + "b>"


def test_range_request_is_aligned_to_the_step() -> None:
    """Grafana rounds start and end down to a multiple of the step (AlignTimeRange, UTC)."""
    time_range = dash.TimeRange(NOW - timedelta(minutes=30, seconds=7), NOW + timedelta(seconds=25))
    start = NOW - timedelta(minutes=30, seconds=30)
    assert dash.prometheus_range(time_range, timedelta(seconds=30)) == {
        "start": str(int(start.timestamp())),
        "end": str(int(NOW.timestamp())),
        "step": "30",
    }
    assert dash.prometheus_time(1_500) == "1.5"
    assert dash.prometheus_label_values('label_values({a=~"$b"}, uid)') == ("uid", '{a=~"$b"}')
    assert dash.prometheus_label_values("label_values(network)") == ("network", None)
    with pytest.raises(ValueError, match="not a label_values"):
        dash.prometheus_label_values("up")


# ---------------------------------------------------------------- true to the catalog

CATALOG_METRICS = {f"{m.name}_{f}": m for m in CATALOG.values() for f in m.field_names}


@pytest.mark.parametrize("query", VM_QUERIES, ids=lambda q: q.where)
def test_metricsql_names_only_catalog_metrics_and_tags(query: dash.Query) -> None:
    """Every metric is <measurement>_<field> of the catalog, every label one of its tags."""
    refs = dash.metricsql_references(query.text)
    unknown = refs.metrics - set(CATALOG_METRICS)
    assert not unknown, f"{query.where}: metrics outside the catalog: {sorted(unknown)}"
    assert refs.name_prefixes <= set(CATALOG), query.where
    measurements = [CATALOG_METRICS[m] for m in refs.metrics] + [CATALOG[m] for m in refs.name_prefixes]
    allowed = set(STANDARD_TAGS).union(*(m.tag_names for m in measurements))
    assert refs.labels <= allowed, f"{query.where}: labels outside the catalog: {sorted(refs.labels - allowed)}"
    assert refs.own_labels <= {"stat", "sel"}, query.where
    assert refs.metrics or refs.name_prefixes or query.source == "variable", query.where


@pytest.mark.parametrize(
    ("text", "wrong"),
    [
        ('avg by (uid) (avg_over_time(system_cpu{uid=~"$uid"}[1m]))', "system_cpu"),
        ('max(system_cpu_percent{gpu_index=~"$x"})', "gpu_index"),
        ('sum by (host) (system_cpu_percent{uid=~"$uid"})', "host"),
        ('label_values({__name__=~"systems_.+"}, uid)', "systems"),
    ],
)
def test_the_catalog_check_catches_mistakes(text: str, wrong: str) -> None:
    refs = dash.metricsql_references(text)
    metrics_ok = refs.metrics <= set(CATALOG_METRICS) and refs.name_prefixes <= set(CATALOG)
    measurements = [CATALOG_METRICS[m] for m in refs.metrics if m in CATALOG_METRICS]
    tags = set(STANDARD_TAGS).union(*(m.tag_names for m in measurements))
    assert not (metrics_ok and refs.labels <= tags), text
    assert wrong in {*refs.metrics, *refs.name_prefixes, *refs.labels}


def test_victoriametrics_panels_resolve_to_the_provisioned_data_sources() -> None:
    """The VictoriaMetrics set names the uids its provisioning defines, with the right types, and the
    simulator's Prometheus interval floor is that data source's timeInterval."""
    sources = dash.load_datasources(dash.VICTORIAMETRICS_DATASOURCES_DIR)
    assert sources == {"victoriametrics": "prometheus", "loki": "loki"}
    for query in dash.iter_queries(VM_SET, sources):
        assert (query.datasource_uid, query.datasource_type) in sources.items(), query.where
    document = yaml.safe_load((dash.VICTORIAMETRICS_DATASOURCES_DIR / "datasources.yml").read_text())
    victoria = next(s for s in document["datasources"] if s["uid"] == "victoriametrics")
    assert victoria["jsonData"]["timeInterval"] == dash.format_duration(dash.PROMETHEUS_SCRAPE_INTERVAL)
