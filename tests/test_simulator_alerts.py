"""Every provisioned alert rule, evaluated after real floods: quiet on a clean run, firing under its fault.

Each test runs on either metrics store with its own rule set: a real InfluxDB 1.6.7
(grafana/alerting/, InfluxQL) and a real VictoriaMetrics (grafana/alerting-victoriametrics/,
MetricsQL, a fresh server per test as InfluxDB gets a fresh database). Logs go to the
Loki conformance receiver; Loki's query API is served over the receiver's entries by
tests/grafana_receiver.py (its LogQL evaluator), given to the simulator as
--loki-query-url. Each run is ten seconds of load: the simulated rule windows are a
few seconds.
"""

from __future__ import annotations

import json
import math
import re
import shutil
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from grafana_receiver import SIMULATED_FLEET_ORG_ID, GrafanaReceiver, InfluxSource, LokiSource
from loki_receiver import production_loki
from servers import InfluxV1, victoria_metrics
from test_simulator_e2e import clean_env  # noqa: F401  (the developer's environment stays out)

from grafana.alerting_src.rules import RULES
from simulator import alerting as al
from simulator import backups, edge
from simulator import expressions as ex
from simulator import faults as ft
from simulator import validate as vd
from simulator import victoria as vm
from simulator.cli import main

pytestmark = pytest.mark.slow

RUN = ["--duration", "10", "--ramp", "0.5", "--window-seconds", "1", "--min-interval", "1", "--settle", "3"]
RUN += ["--self-metrics-interval", "0.5", "--system-interval", "0.5", "--processes", "0", "--quiet"]
# As in production: each node pushes into its own Loki tenant, and the run writes the edge's
# audit stream (tenant _edge) for the edge rule; every query reads all of them.
RUN += ["--loki-tenant-per-node"]
# The stack's own backup reports (stack_backup) for the backup rule, as the backup role's report timer writes them.
WITHOUT_BACKUPS = [*RUN, "--edge-audit"]
RUN += ["--backup-status"]
WITHOUT_AUDIT = list(RUN)
RUN += ["--edge-audit"]
# uids: validators 0-1, aggregator 2, evaluator 3, miners 4-9.
FLEET = ["--miners", "6", "--validators", "2", "--points-per-sec", "600", "--lines-per-sec", "300"]
ALL_NODE_FAULTS = [
    "silent:uid=3@3s",
    "loss-divergence:uid=5@3",
    "window-stall:uid=0@2",
    "gpu-oom:uid=6@3",
    "memory-full:uid=7@3",
    "disk-full:uid=7@3",
    "drops:uid=8@3",
    "error-burst:uid=9@3",
]
EDGE_FAULTS = ["refused-credentials@3"]
BACKUP_FAULTS = ["backup-overdue@3"]


# The data source type of each store's metrics queries, for --datasource.
METRICS_DATASOURCE = {"influxdb": "influxdb", "victoriametrics": "prometheus"}


@pytest.fixture(params=["influxdb", "victoriametrics"])
def backend(request: pytest.FixtureRequest) -> str:
    return request.param


def _with_loki(metrics: list[str], sources: dict[str, Any]) -> Iterator[list[str]]:
    with production_loki() as loki:
        sources = {
            **sources,
            "loki": LokiSource(loki, org_id=SIMULATED_FLEET_ORG_ID),
        }
        with GrafanaReceiver(sources, token="glsa_test_token") as grafana:
            yield [*metrics, "--loki-url", loki.base_url, "--loki-query-url", grafana.url]


@pytest.fixture
def influx_stack(influx_db: tuple[InfluxV1, str]) -> Iterator[list[str]]:
    server, database = influx_db
    metrics = ["--influxdb-url", server.url, "--influxdb-api-version", "1", "--influxdb-database", database]
    yield from _with_loki(metrics, {"influxdb": InfluxSource(server.url, database, min_interval=timedelta(seconds=1))})


@pytest.fixture
def stack(backend: str, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The simulator's flags for a stack on `backend`."""
    if backend == "influxdb":
        yield request.getfixturevalue("influx_stack")
        return
    monkeypatch.setenv("INFLUXDB_TOKEN", "victoria-takes-any-token")  # no auth on this VictoriaMetrics
    with victoria_metrics() as server:
        yield from _with_loki(["--metrics-backend", "victoriametrics", "--victoriametrics-url", server.url], {})


def simulate(stack: list[str], tmp_path: Path, *extra: str, run: list[str] = RUN) -> tuple[int, dict[str, Any]]:
    report = tmp_path / "report.json"
    code = main([*stack, *run, *FLEET, *extra, "--report", str(report)])
    return code, json.loads(report.read_text())


def by_uid(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {alert["uid"]: alert for alert in report["alerts"]}


def query_labels(stack: list[str], report: dict[str, Any], backend: str) -> dict[str, list[list[dict[str, str]]]]:
    """Per rule, the labels of every frame each of its data queries returns, over the run's stores."""
    flags = dict(zip(stack[::2], stack[1::2], strict=True))
    influx = vd.InfluxQL(flags["--influxdb-url"], flags["--influxdb-database"]) if backend == "influxdb" else None
    prometheus = vm.PromQL(flags["--victoriametrics-url"]) if backend == "victoriametrics" else None
    loki = vd.LokiQL(flags["--loki-query-url"], (("X-Scope-OrgID", SIMULATED_FLEET_ORG_ID),))  # every tenant
    load_seconds = report["fleet"]["load_seconds"]
    ended_ms = int(report["run"]["started_ns"] / 1e6 + load_seconds * 1000)
    out: dict[str, list[list[dict[str, str]]]] = {}
    for _, rule in al.load_rules(al.run_settings(load_seconds, 1), al.ALERTING_DIRS[backend]):
        for query in rule["data"]:
            if query["datasourceUid"] != "__expr__":
                results = al.run_query(query, influx, loki, ended_ms, prometheus) or []
                out.setdefault(rule["uid"], []).append([dict(r.labels) for r in results])
    return out


def test_a_clean_run_leaves_every_rule_normal(stack: list[str], backend: str, tmp_path: Path) -> None:
    code, report = simulate(stack, tmp_path)
    alerts = by_uid(report)
    assert set(alerts) == {rule.uid for rule in RULES}
    assert {uid: a["status"] for uid, a in alerts.items() if a["status"] != al.NORMAL} == {}
    assert code == 0 and report["summary"]["alerts"] == {al.NORMAL: len(RULES)}
    # Grafana makes a rule one Error when two of its results have the same labels: every frame of
    # every query is labelled uniquely, whatever the model downstream makes of it.
    for uid, queries in query_labels(stack, report, backend).items():
        for frames in queries:
            texts = [ex.labels_text(labels) for labels in frames]
            assert len(texts) == len(set(texts)), (uid, sorted(texts))


def test_every_node_fault_at_once_fires_exactly_its_rule_on_its_node(stack: list[str], tmp_path: Path) -> None:
    faults = ALL_NODE_FAULTS + EDGE_FAULTS + BACKUP_FAULTS
    code, report = simulate(stack, tmp_path, *(x for fault in faults for x in ("--fault", fault)))
    alerts = by_uid(report)
    assert report["summary"]["alerts_wrong"] == [] and code == 0, report["summary"]
    firing = {uid for uid, a in alerts.items() if a["status"] == al.FIRING}
    assert firing == {rule.uid for rule in RULES if not rule.uid.endswith("unavailable")}
    node = {uid: {i["labels"].get("uid") for i in a["instances"]} for uid, a in alerts.items()}
    assert node["telemetry-node-silent"] == {"3"}
    assert node["telemetry-loss-diverging"] == {"5"}
    assert node["telemetry-validator-window-stalled"] == {"0"}
    assert node["telemetry-gpu-memory-high"] == {"6"}
    assert node["telemetry-host-memory-high"] == node["telemetry-host-disk-high"] == {"7"}
    assert node["telemetry-client-drops"] == {"8"}
    assert node["telemetry-log-errors"] == {"9"}
    # The notification policy groups by network: every node's alert names its network.
    unsplit = [
        uid
        for uid, a in alerts.items()
        for i in a["instances"]
        if "uid" in i["labels"] and not i["labels"].get("network")
    ]
    assert unsplit == []
    # The drops fault's none_value drops are expected, not lost records.
    assert report["fleet"]["metrics"]["dropped_by_reason"]["none_value"] > 0
    assert report["summary"]["client_drops"] == {} and report["summary"]["lost"] == 0
    # The edge's refusals come from the stranger's address alone: the deploy's two checks stay below the threshold.
    refused = alerts["telemetry-edge-refused-credentials"]["instances"]
    assert [i["labels"]["request_remote_ip"] for i in refused] == [edge.STRANGER_ADDRESS]
    # The overdue host alone, by its host label (the others' backups are hours old).
    overdue = alerts["telemetry-backup-overdue"]["instances"]
    assert [i["labels"] for i in overdue] == [{"host": backups.HOSTS[0]}]
    assert [f["kind"] for f in report["faults"]] == [re.split("[:@]", f)[0] for f in faults]


def test_without_the_edge_audit_its_rule_and_panel_are_skipped(stack: list[str], tmp_path: Path) -> None:
    code, report = simulate(stack, tmp_path, run=WITHOUT_AUDIT)
    alerts = by_uid(report)
    assert alerts["telemetry-edge-refused-credentials"]["status"] == al.SKIPPED
    assert {a["status"] for uid, a in alerts.items() if uid != "telemetry-edge-refused-credentials"} == {al.NORMAL}
    audit_panels = [c for c in report["queries"] if edge.reads_audit(c["query"])]
    assert audit_panels and {c["status"] for c in audit_panels} == {"SKIPPED"}
    assert code == 0 and report["settings"]["edge_audit"] is False


def test_without_the_backup_status_its_rule_and_panels_are_skipped(stack: list[str], tmp_path: Path) -> None:
    code, report = simulate(stack, tmp_path, run=WITHOUT_BACKUPS)
    alerts = by_uid(report)
    assert alerts["telemetry-backup-overdue"]["status"] == al.SKIPPED
    assert {a["status"] for uid, a in alerts.items() if uid != "telemetry-backup-overdue"} == {al.NORMAL}
    backup_panels = [c for c in report["queries"] if backups.reads_backups(c["query"])]
    assert backup_panels and {c["status"] for c in backup_panels} == {"SKIPPED"}
    assert code == 0 and report["settings"]["backup_status"] is False


def test_the_backup_rule_fires_when_no_host_reported_in_its_window(stack: list[str], backend: str) -> None:
    """No report in the window is NoData, which the rule turns into Alerting; a fresh report within it is Normal."""
    flags = dict(zip(stack[::2], stack[1::2], strict=True))
    influx = vd.InfluxQL(flags["--influxdb-url"], flags["--influxdb-database"]) if backend == "influxdb" else None
    prometheus = vm.PromQL(flags["--victoriametrics-url"]) if backend == "victoriametrics" else None
    settings = al.run_settings(10, 1)  # the report window: the run's span, 10 s
    rules = {rule["uid"]: (group, rule) for group, rule in al.load_rules(settings, al.ALERTING_DIRS[backend])}
    group, rule = rules["telemetry-backup-overdue"]
    window_s = int(settings["ALERT_BACKUP_REPORT_WINDOW_SECONDS"])
    now_ns = time.time_ns()
    connection: dict[str, Any] = (
        {"influx_url": flags["--influxdb-url"], "database": flags["--influxdb-database"], "api_version": 1}
        if backend == "influxdb"
        else {"influx_url": flags["--victoriametrics-url"], "database": "telemetry"}
    )

    def evaluate() -> al.AlertCheck:
        if prometheus is not None:
            prometheus.flush()
        return al.evaluate_rule(group, rule, influx, None, now_ns // 1_000_000, True, prometheus)

    assert evaluate().status == al.NO_DATA  # nothing ever reported
    stale = backups.reports((), now_ns - (window_s + 30) * 1_000_000_000, 20, 93600.0, every=10.0)
    backups.write(written=stale, **connection)
    check = evaluate()
    assert check.status == al.NO_DATA and check.fires, check  # reports older than the window only
    fresh = backups.reports((), now_ns - 2_000_000_000, 1, 93600.0)
    backups.write(written=fresh, **connection)
    assert evaluate().status == al.NORMAL


def test_stores_that_refuse_connections_fire_the_store_rules_only(
    stack: list[str], backend: str, tmp_path: Path
) -> None:
    down = {"influxdb": "influxdb-down", "victoriametrics": "metrics-down"}[backend]  # the older name still works
    code, report = simulate(stack, tmp_path, "--fault", down, "--fault", "loki-down@4")
    alerts = by_uid(report)
    assert code == 0, report["summary"]
    fires = {uid for uid, a in alerts.items() if a["fires"]}
    assert fires == {"telemetry-influxdb-unavailable", "telemetry-loki-unavailable"}
    assert {a["status"] for a in alerts.values()} == {al.ERROR}
    assert "Connection refused" in alerts["telemetry-node-silent"]["message"]
    assert [f["kind"] for f in report["faults"]] == ["metrics-down", "loki-down"]


def _broken_rules(tmp_path: Path, backend: str, old: str, new: str) -> Path:
    """A copy of the backend's generated alerting files with one rule changed."""
    copy = tmp_path / "alerting"
    shutil.copytree(al.ALERTING_DIRS[backend], copy)
    rules = copy / "rules.yaml"
    text = rules.read_text()
    assert old in text
    rules.write_text(text.replace(old, new, 1))
    return copy


def test_a_rule_that_stays_normal_under_its_fault_fails_the_run(stack: list[str], backend: str, tmp_path: Path) -> None:
    broken = _broken_rules(tmp_path, backend, "- ${ALERT_GPU_MEMORY_PERCENT}", "- 1000")
    code, report = simulate(stack, tmp_path, "--fault", "gpu-oom@3", "--alerting", str(broken))
    assert code & 16 and report["summary"]["alerts_wrong"] == ["telemetry-gpu-memory-high"]
    assert by_uid(report)["telemetry-gpu-memory-high"]["status"] == al.NORMAL


def test_a_backup_rule_whose_threshold_is_never_reached_fails_the_run_under_its_fault(
    stack: list[str], backend: str, tmp_path: Path
) -> None:
    broken = _broken_rules(tmp_path, backend, "- ${ALERT_BACKUP_MAX_AGE_SECONDS}", "- 1000000")
    code, report = simulate(stack, tmp_path, "--fault", "backup-overdue@3", "--alerting", str(broken))
    assert code & 16 and report["summary"]["alerts_wrong"] == ["telemetry-backup-overdue"]
    assert by_uid(report)["telemetry-backup-overdue"]["status"] == al.NORMAL


def test_a_backup_rule_with_a_threshold_below_a_days_age_fails_a_clean_run(
    stack: list[str], backend: str, tmp_path: Path
) -> None:
    """A threshold of an hour fires on hosts whose last backup is a few hours old: the simulator reports it."""
    broken = _broken_rules(tmp_path, backend, "- ${ALERT_BACKUP_MAX_AGE_SECONDS}", "- 3600")
    code, report = simulate(stack, tmp_path, "--alerting", str(broken), "--datasource", METRICS_DATASOURCE[backend])
    assert code == 16, report["summary"]
    assert report["summary"]["alerts_wrong"] == ["telemetry-backup-overdue"]
    firing = by_uid(report)["telemetry-backup-overdue"]["instances"]
    assert sorted(i["labels"]["host"] for i in firing) == sorted(backups.HOSTS)  # every host's is over an hour


def test_a_rule_that_fires_on_a_clean_run_fails_the_run(stack: list[str], backend: str, tmp_path: Path) -> None:
    broken = _broken_rules(tmp_path, backend, "- ${ALERT_HOST_DISK_PERCENT}", "- 0")
    only_metrics = ["--datasource", METRICS_DATASOURCE[backend]]
    code, report = simulate(stack, tmp_path, "--alerting", str(broken), *only_metrics)
    assert code == 16, report["summary"]
    assert report["summary"]["alerts_wrong"] == ["telemetry-host-disk-high"]
    loki_rules = [a for a in report["alerts"] if a["uid"] in ("telemetry-log-errors", "telemetry-loki-unavailable")]
    assert {a["status"] for a in loki_rules} == {al.SKIPPED}


@pytest.mark.parametrize(
    ("fault", "message"),
    [
        ("meltdown", "bad fault"),
        ("loss-divergence:uid=0", "fits a miner; node 0 is a validator"),
        ("silent:uid=99", "no node with uid 99"),
        ("silent@9.5", "start it earlier or run longer"),
        ("drops@12", "after the load ends"),
    ],
)
def test_a_fault_that_cannot_apply_is_a_usage_error(
    influx_stack: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str], fault: str, message: str
) -> None:
    assert main([*influx_stack, *RUN, *FLEET, "--fault", fault]) == 2
    assert message in capsys.readouterr().err


def test_the_backup_fault_needs_the_backup_status(influx_stack: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*influx_stack, *WITHOUT_BACKUPS, *FLEET, "--fault", "backup-overdue"]) == 2
    assert "fault backup-overdue needs the stack's backup reports: give --backup-status" in capsys.readouterr().err


def test_the_edge_fault_needs_the_edge_audit_stream(
    influx_stack: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*influx_stack, *WITHOUT_AUDIT, *FLEET, "--fault", "refused-credentials"]) == 2
    assert "fault refused-credentials needs the edge's audit stream: give --edge-audit" in capsys.readouterr().err


def test_short_runs_skip_the_rules_and_faults_need_a_long_enough_run() -> None:
    checks = al.evaluate([("g", {"uid": "r", "title": "t"})], None, None, 0, load_seconds=3.0)
    assert checks[0].status == al.SKIPPED and checks[0].ok
    assert ft.resolve([ft.Fault.parse("silent")], {"0": "validator", "1": "miner"}, 10.0)[0].uid == "1"
    assert ft.Fault.parse("loss-divergence:uid=5@15s") == ft.Fault("loss-divergence", "5", 15.0)
    assert ft.Fault.parse("influxdb-down@2") == ft.Fault("metrics-down", None, 2.0)
    assert al.expected_rules(ft.resolve([ft.Fault("drops")], {"0": "miner"}, 10)) == {"telemetry-client-drops"}


def test_faults_given_without_a_node_each_get_a_node_of_their_own() -> None:
    roles = {"0": "miner", "1": "miner", "2": "validator"}
    resolved = ft.resolve([ft.Fault("error-burst"), ft.Fault("silent"), ft.Fault("gpu-oom", "0")], roles, 10.0)
    assert [(f.kind, f.uid) for f in resolved] == [("error-burst", "1"), ("silent", "2"), ("gpu-oom", "0")]
    # Two faults named on one node stay there: the user asked for it.
    assert {f.uid for f in ft.resolve([ft.Fault("silent", "0"), ft.Fault("drops", "0")], roles, 10.0)} == {"0"}
    with pytest.raises(ValueError, match="every miner of the fleet already has a fault"):
        ft.resolve([ft.Fault("loss-divergence"), ft.Fault("loss-divergence"), ft.Fault("loss-divergence")], roles, 10.0)


def test_a_node_fault_whose_store_is_down_is_not_judged_and_the_store_rule_fires(
    stack: list[str], tmp_path: Path
) -> None:
    """With Loki down the log rule can only be an Error (its execErrState decides): it cannot show a burst."""
    code, report = simulate(stack, tmp_path, "--fault", "error-burst", "--fault", "loki-down")
    alerts = by_uid(report)
    assert code == 0, report["summary"]
    assert alerts["telemetry-log-errors"]["status"] == al.SKIPPED
    assert "loki is down" in alerts["telemetry-log-errors"]["message"]
    assert alerts["telemetry-loki-unavailable"]["status"] in (al.ERROR, al.FIRING)
    assert alerts["telemetry-loki-unavailable"]["fires"]


def test_the_edge_fault_whose_store_is_down_is_not_judged_either(stack: list[str], tmp_path: Path) -> None:
    """The refused-credentials rule reads the edge's audit in Loki: with Loki down it cannot show the refusals."""
    code, report = simulate(stack, tmp_path, "--fault", "refused-credentials", "--fault", "loki-down")
    alerts = by_uid(report)
    assert code == 0, report["summary"]
    assert alerts["telemetry-edge-refused-credentials"]["status"] == al.SKIPPED
    assert "loki is down" in alerts["telemetry-edge-refused-credentials"]["message"]


def test_a_prometheus_rule_query_runs_instant_at_its_window_end_with_the_window_as_range() -> None:
    """Grafana's Prometheus backend: $__range is the window in whole seconds; the query runs at the window's end."""
    asked: list[tuple[str, int]] = []

    class Store:
        def instant(self, expr: str, at_ms: int) -> dict[str, Any]:
            asked.append((expr, at_ms))
            return {"resultType": "vector", "result": [{"metric": {"uid": "3"}, "value": [at_ms / 1000, "NaN"]}]}

    query = {
        "refId": "A",
        "datasourceUid": "victoriametrics",
        "relativeTimeRange": {"from": 600, "to": 120},
        "model": {"refId": "A", "expr": "max(max_over_time(x[$__range]))", "instant": True},
    }
    [series] = al.run_query(query, None, None, 1_000_000, Store())
    assert asked == [("max(max_over_time(x[480s]))", 880_000)]
    assert series.labels == {"uid": "3"} and math.isnan(series.points[0][1])
    assert al.run_query(query, None, None, 1_000_000, None) is None  # no VictoriaMetrics in this run
    with pytest.raises(ValueError, match="only instant"):
        al.run_query({**query, "model": {**query["model"], "instant": False}}, None, None, 1_000_000, Store())


def test_with_a_tenant_per_node_every_log_query_and_the_log_rule_read_every_tenant(
    influx_db: tuple[InfluxV1, str], tmp_path: Path
) -> None:
    """Production's Loki: each node pushes into its own tenant; the queries name all of them, joined by '|'."""
    server, database = influx_db
    metrics = ["--influxdb-url", server.url, "--influxdb-api-version", "1", "--influxdb-database", database]
    with production_loki() as loki:
        sources = {
            "influxdb": InfluxSource(server.url, database, min_interval=timedelta(seconds=1)),
            "loki": LokiSource(loki, org_id=SIMULATED_FLEET_ORG_ID),
        }
        with GrafanaReceiver(sources, token="glsa_test_token") as grafana:
            stack = [*metrics, "--loki-url", loki.base_url, "--loki-query-url", grafana.url]
            code, report = simulate(stack, tmp_path, "--fault", "error-burst:uid=9@3")
        entries = loki.entries
    assert code == 0, report["summary"]
    assert {e.tenant for e in entries} == {*(str(uid) for uid in range(10)), "_edge"}
    assert all(e.tenant == e.labels["uid"] for e in entries if e.tenant != "_edge")
    loki_queries = [q for q in report["queries"] if q["datasource"] == "loki"]
    assert loki_queries and {q["status"] for q in loki_queries} <= {"OK", "SKIPPED"}, loki_queries
    lines = [row for row in report["delivery"] if row["store"] == "loki"]
    assert lines and all(row["stored"] == row["sent"] for row in lines), lines
    alerts = by_uid(report)
    assert {uid for uid, a in alerts.items() if a["status"] == al.FIRING} == {"telemetry-log-errors"}
    assert {a["status"] for uid, a in alerts.items() if uid != "telemetry-log-errors"} == {al.NORMAL}
    assert {i["labels"]["uid"] for i in alerts["telemetry-log-errors"]["instances"]} == {"9"}
