"""The simulator end to end: a short flood into a real InfluxDB 1.6.7, every dashboard query run.

Logs go to the Loki conformance receiver (no Loki can run here) and the Grafana
path goes through tests/grafana_receiver.py, which executes the queries against
the same InfluxDB. Each run is a few seconds of load on loopback.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from grafana_receiver import SIMULATED_FLEET_ORG_ID, GrafanaReceiver, InfluxSource, LokiSource
from loki_receiver import LokiReceiver, production_loki
from servers import InfluxV1

from simulator import dashboards as dash
from simulator import validate as vd
from simulator.cli import main
from telemetry_client.catalog import NODE_CATALOG

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
ENV_NAMES = (
    "INFLUXDB_URL",
    "INFLUXDB_HOST",
    "INFLUXDB_PORT",
    "INFLUXDB_DATABASE",
    "INFLUXDB_TOKEN",
    "INFLUXDB_READ_TOKEN",
    "INFLUXDB_ORG",
    "INFLUXDB_API_VERSION",
    "INFLUXDB_USERNAME",
    "INFLUXDB_PASSWORD",
    "LOKI_URL",
    "LOKI_USERNAME",
    "LOKI_PASSWORD",
    "LOKI_BEARER_TOKEN",
    "GRAFANA_URL",
    "GRAFANA_TOKEN",
    "GRAFANA_USER",
    "GRAFANA_PASSWORD",
    "METRICS_BACKEND",
    "VICTORIAMETRICS_URL",
    "VICTORIAMETRICS_USERNAME",
    "VICTORIAMETRICS_PASSWORD",
    "VICTORIAMETRICS_BEARER_TOKEN",
)
# A small, fast flood: 1 s buckets so that rate panels (derivatives) get several in a few seconds.
QUICK = ["--duration", "3", "--ramp", "0.5", "--window-seconds", "1", "--min-interval", "1"]
QUICK += ["--self-metrics-interval", "0.5", "--system-interval", "0.5", "--settle", "3", "--quiet"]


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """The stack comes from flags here; a developer's own environment must not leak in."""
    for name in ENV_NAMES:
        monkeypatch.delenv(name, raising=False)


def influx_args(server: InfluxV1, database: str) -> list[str]:
    return ["--influxdb-url", server.url, "--influxdb-api-version", "1", "--influxdb-database", database]


# What the simulator says of a target its panel's twin stands in for (simulator/validate.py).
TWIN = "another target of the panel answers for this range and selection"


def influx_checks(report: Mapping[str, Any]) -> list[dict[str, Any]]:
    return [q for q in report["queries"] if q["datasource"] == "influxdb"]


def stored_points(server: InfluxV1, database: str, run_id: str, measurement: str, field: str) -> int:
    rows = server.rows(f'SELECT count("{field}") FROM "{measurement}" WHERE "runtime_id" =~ /^{run_id}-/', database)
    return int(rows[0]["count"]) if rows else 0


def test_cli_flood_with_worker_processes_every_influxql_query_ok_and_nothing_lost(
    influx_db: tuple[InfluxV1, str], tmp_path: Path
) -> None:
    server, database = influx_db
    report_path = tmp_path / "report.json"
    env = {k: v for k, v in os.environ.items() if k not in ENV_NAMES}
    env["PYTHONPATH"] = str(REPO)
    argv = [sys.executable, "-m", "simulator", *influx_args(server, database), *QUICK]
    argv += ["--processes", "2", "--miners", "8", "--points-per-sec", "3000", "--run-id", "sim-e2e1"]
    # The stack's own backup reports too, for the backup panels (else SKIPPED).
    argv += ["--datasource", "influxdb", "--backup-status", "--report", str(report_path)]
    done = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(report_path.read_text())

    checks = influx_checks(report)
    panels = [q for q in checks if q["kind"] == "panel"]
    assert len(panels) == sum(
        1 for d in dash.load_dashboards() for q in dash.panel_queries(d) if q.datasource_type == "influxdb"
    )
    # A panel pairs targets (raw data / downsampled copy, fleet / chosen nodes): the one
    # that answers for the run's window with every node selected is OK, its twins SKIPPED.
    twin = TWIN
    assert {q["status"] for q in checks if q["message"] != twin} == {"OK"}, [
        q for q in checks if q["status"] != "OK" and q["message"] != twin
    ]
    assert {q["status"] for q in checks if q["message"] == twin} == {"SKIPPED"}
    answered = {(q["dashboard"], q["panel_id"]) for q in panels if q["status"] == "OK"}
    assert answered == {(q["dashboard"], q["panel_id"]) for q in panels}
    assert all(q["status"] == "SKIPPED" for q in report["queries"] if q["datasource"] == "loki")

    fleet = report["fleet"]
    assert fleet["processes"] == 2
    sent_by_key = fleet["metrics"]["sent_by_key"]
    # Every node measurement of the catalog reached InfluxDB (gpu ones simulated, telemetry_client from the client).
    assert set(sent_by_key) == set(NODE_CATALOG)
    assert sum(sent_by_key.values()) == fleet["metrics"]["sent"] == report["summary"]["points_sent"]
    assert report["summary"]["lost"] == 0 and report["summary"]["client_drops"] == {}
    assert {row["key"] for row in report["delivery"]} == set(NODE_CATALOG)
    assert all(row["ok"] and row["sent"] == row["stored"] for row in report["delivery"])
    # Independently of the simulator's own counting: the store holds what the workers reported sent.
    assert stored_points(server, database, "sim-e2e1", "training_step", "loss") == sent_by_key["training_step"]
    assert stored_points(server, database, "sim-e2e1", "system", "cpu_percent") == sent_by_key["system"]
    assert report["run"]["run_id"] == "sim-e2e1" and report["summary"]["exit_code"] == 0


def _break_dashboard(source: Path, target_dir: Path) -> dict[str, str]:
    """A copy of the training dashboard where one panel asks for a field nobody sends and one is not InfluxQL."""
    target_dir.mkdir()
    dashboard = json.loads(source.read_text())
    broken = {}
    for panel in dash.iter_panels(dashboard):
        for target in panel.get("targets", []):
            if panel.get("title") == "Training loss":
                target["query"] = target["query"].replace('("loss"', '("loss_nobody_sends"')
                broken[panel["title"]] = "EMPTY"
            elif panel.get("title") == "Learning rate":
                target["query"] = "SELEC nonsense FROM"
                broken[panel["title"]] = "ERROR"
    (target_dir / "training.json").write_text(json.dumps(dashboard))
    return broken


def test_a_broken_dashboard_is_reported_and_fails_the_exit_code(
    influx_db: tuple[InfluxV1, str], tmp_path: Path
) -> None:
    server, database = influx_db
    broken = _break_dashboard(dash.DASHBOARDS_DIR / "training.json", tmp_path / "dashboards")
    report_path = tmp_path / "report.json"
    argv = [*influx_args(server, database), *QUICK, "--duration", "1.5", "--processes", "0", "--miners", "3"]
    argv += ["--validators", "1", "--points-per-sec", "600", "--dashboards", str(tmp_path / "dashboards")]
    argv += ["--report", str(report_path)]
    code = main(argv)
    report = json.loads(report_path.read_text())
    assert code & 1 and not code & 4, code  # queries failed, nothing was lost
    by_title = {q["title"]: q for q in report["queries"] if q["kind"] == "panel" and q["message"] != TWIN}
    for title, status in broken.items():
        assert by_title[title]["status"] == status
    assert "loss_nobody_sends" in by_title["Training loss"]["query"]
    assert "SELEC" in by_title["Learning rate"]["message"] or "error parsing" in by_title["Learning rate"]["message"]
    others = [
        q
        for q in report["queries"]
        if q["title"] not in broken and q["datasource"] == "influxdb" and q["message"] != TWIN
    ]
    assert others and all(q["status"] == "OK" for q in others)
    assert report["summary"]["exit_code"] == code


@pytest.fixture
def loki() -> Iterator[LokiReceiver]:
    with LokiReceiver() as receiver:
        yield receiver


def run_lines(receiver: LokiReceiver, run_id: str) -> dict[str, int]:
    """Lines the receiver accepted for one run, per level label."""
    counts: dict[str, int] = {}
    for entry in receiver.entries:
        if entry.json().get("run_id") == run_id:
            level = entry.labels["level"]
            counts[level] = counts.get(level, 0) + 1
    return counts


def test_log_lines_sent_equal_lines_received_by_the_loki_receiver(
    influx_db: tuple[InfluxV1, str], loki: LokiReceiver, tmp_path: Path
) -> None:
    server, database = influx_db
    report_path = tmp_path / "report.json"
    argv = [*influx_args(server, database), *QUICK, "--processes", "0", "--miners", "6", "--validators", "2"]
    argv += ["--points-per-sec", "800", "--lines-per-sec", "600", "--loki-url", loki.base_url]
    argv += ["--run-id", "sim-logs1", "--datasource", "influxdb", "--report", str(report_path)]
    code = main(argv, line_counter=lambda window: run_lines(loki, "sim-logs1"))
    report = json.loads(report_path.read_text())
    assert code == 0, report["summary"]
    log_rows = [row for row in report["delivery"] if row["store"] == "loki"]
    assert {row["key"] for row in log_rows} == {
        f"lines level={lv}" for lv in ("debug", "info", "warning", "error", "critical")
    }
    assert all(row["ok"] for row in log_rows)
    received = run_lines(loki, "sim-logs1")
    assert sum(received.values()) == report["summary"]["lines_sent"] == report["fleet"]["lines_logged"]
    assert loki.refused == [] and loki.duplicates == 0

    entries = [e for e in loki.entries if e.json().get("run_id") == "sim-logs1"]
    labels = entries[0].labels
    assert set(labels) == {"service", "environment", "host", "level", "uid", "role", "version"}
    assert labels["environment"] == "simnet"
    errors = [e.json() for e in entries if e.labels["level"] in ("error", "critical")]
    assert errors and all("Traceback (most recent call last)" in body["exception"] for body in errors)
    assert {"window", "step", "peer", "trace_id"} <= set(errors[0])
    # The loki sink's counters reach InfluxDB as self-metrics too (the Telemetry health dashboard).
    sinks = server.rows('SHOW TAG VALUES FROM "telemetry_client" WITH KEY = "sink"', database)
    assert {row["value"] for row in sinks} == {"influxdb", "loki"}


def test_lines_refused_by_loki_are_reported_as_lost(
    influx_db: tuple[InfluxV1, str], loki: LokiReceiver, tmp_path: Path
) -> None:
    server, database = influx_db
    loki.refuse_lines_containing("Heartbeat")
    report_path = tmp_path / "report.json"
    argv = [*influx_args(server, database), *QUICK, "--duration", "2", "--processes", "0", "--miners", "3"]
    argv += ["--validators", "1", "--points-per-sec", "300", "--lines-per-sec", "400", "--loki-url", loki.base_url]
    argv += ["--run-id", "sim-logs2", "--datasource", "influxdb", "--report", str(report_path)]
    code = main(argv, line_counter=lambda window: run_lines(loki, "sim-logs2"))
    report = json.loads(report_path.read_text())
    assert code & 4, report["summary"]
    assert report["summary"]["client_drops"]["loki"]["too_far_behind"] == len(loki.refused) > 0


@pytest.fixture
def grafana(influx_db: tuple[InfluxV1, str], loki: LokiReceiver) -> Iterator[GrafanaReceiver]:
    server, database = influx_db
    sources = {
        "influxdb": InfluxSource(server.url, database, min_interval=timedelta(seconds=1)),
        "loki": LokiSource(loki),
    }
    with GrafanaReceiver(sources, token="glsa_test_token") as receiver:
        yield receiver


def run_window(report: Mapping[str, Any]) -> dash.TimeRange:
    run = report["run"]
    return dash.TimeRange(
        datetime.fromtimestamp(run["started_ns"] / 1e9 - 1, UTC), datetime.fromtimestamp(run["ended_ns"] / 1e9 + 1, UTC)
    )


def test_loki_panels_and_line_counts_through_lokis_query_api(
    influx_db: tuple[InfluxV1, str], loki: LokiReceiver, grafana: GrafanaReceiver, tmp_path: Path
) -> None:
    """The direct Loki path: query_range, query and label values, served over the receiver's entries."""
    server, database = influx_db
    report_path = tmp_path / "report.json"
    argv = [*influx_args(server, database), *QUICK, "--processes", "0", "--miners", "4", "--validators", "1"]
    argv += ["--points-per-sec", "400", "--lines-per-sec", "500", "--loki-url", loki.base_url]
    argv += ["--run-id", "sim-logs3", "--datasource", "influxdb", "--no-validate", "--report", str(report_path)]
    assert main(argv) == 0
    report = json.loads(report_path.read_text())
    window = run_window(report)
    logs_dashboard = [d for d in dash.load_dashboards() if d["uid"] == "telemetry-logs"]
    loki_api = vd.LokiQL(grafana.url)
    checks = vd.check_dashboards(
        logs_dashboard, {"loki": loki_api}, window, "simnet", min_interval=timedelta(seconds=1)
    )
    assert len(checks) == 14  # 6 variables and 8 panel targets
    assert {c.status for c in checks} == {"OK"}, [(c.title, c.status, c.message) for c in checks if c.status != "OK"]
    counted = vd.loki_line_counts(loki_api, "simnet", "sim-logs3", window)
    assert counted == vd.lines_by_level(report["fleet"]["logs"]["sent_by_key"])
    assert vd.loki_line_counts(loki_api, "simnet", "sim-no-such-run", window) == {}


def test_queries_and_counts_through_grafana_ds_query(
    influx_db: tuple[InfluxV1, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Loki as in production (a tenant per node, the edge's audit stream in _edge), read through Grafana."""
    server, database = influx_db
    monkeypatch.setenv("GRAFANA_TOKEN", "glsa_test_token")
    report_path = tmp_path / "report.json"
    argv = [*influx_args(server, database), *QUICK, "--processes", "0", "--miners", "6", "--points-per-sec", "800"]
    with production_loki() as loki:
        sources = {
            "influxdb": InfluxSource(server.url, database, min_interval=timedelta(seconds=1)),
            "loki": LokiSource(loki, org_id=SIMULATED_FLEET_ORG_ID),
        }
        with GrafanaReceiver(sources, token="glsa_test_token") as grafana:
            argv += ["--lines-per-sec", "300", "--loki-url", loki.base_url, "--grafana-url", grafana.url]
            argv += ["--edge-audit", "--backup-status", "--loki-tenant-per-node", "--report", str(report_path)]
            code = main(argv)
    report = json.loads(report_path.read_text())
    assert code == 0, [q for q in report["queries"] if q["status"] not in ("OK", "SKIPPED")]
    statuses = {(q["datasource"], q["kind"], q["status"]) for q in report["queries"]}
    # Every panel, InfluxQL and LogQL (the edge's audit stream too), returned data through Grafana; Loki's label_values
    # variables go through Grafana's resource API, which this path does not use.
    # The twin targets of a panel (the downsampled copy, the per-node lines) are SKIPPED.
    assert statuses == {
        ("influxdb", "panel", "OK"),
        ("influxdb", "panel", "SKIPPED"),
        ("influxdb", "variable", "OK"),
        ("loki", "panel", "OK"),
        ("loki", "variable", "SKIPPED"),
    }
    assert set(grafana.authorizations) == {"Bearer glsa_test_token"}
    seen = [q for q in grafana.queries if q.datasource_uid == "influxdb"]
    # Template variables were filled in by the simulator; Grafana's macros were left to Grafana.
    panel_queries = [q for q in seen if "$timeFilter" in q.raw]
    assert panel_queries and all("$network" not in q.raw and "time >= " in q.executed for q in panel_queries)
    assert any(
        "$__auto" in q.raw and "$__auto" not in q.executed for q in grafana.queries if q.datasource_uid == "loki"
    )
    # The accounting went through Grafana as well, and found everything.
    assert any("count(*)" in q.raw for q in seen)
    stores = {row["store"] for row in report["delivery"]}
    assert stores == {"influxdb", "loki"} and all(row["ok"] for row in report["delivery"])
    assert report["summary"]["lines_sent"] == sum(run_lines(loki, report["run"]["run_id"]).values()) > 0


def test_wrong_grafana_credentials_fail_every_query(
    influx_db: tuple[InfluxV1, str], grafana: GrafanaReceiver, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    server, database = influx_db
    token_file = tmp_path / "token"
    token_file.write_text("not-the-token\n")
    report_path = tmp_path / "report.json"
    argv = [*influx_args(server, database), *QUICK, "--duration", "1", "--processes", "0", "--miners", "2"]
    argv += ["--points-per-sec", "200", "--grafana-url", grafana.url, "--grafana-token-file", str(token_file)]
    # The stack's own backup reports too, for the backup panels (else SKIPPED).
    argv += ["--datasource", "influxdb", "--backup-status", "--report", str(report_path)]
    code = main(argv)
    report = json.loads(report_path.read_text())
    assert code & 1 and not code & 4
    checks = influx_checks(report)
    asked = [q for q in checks if q["message"] != TWIN]
    assert asked and all(q["status"] == "ERROR" and "credentials" in q["message"] for q in asked)
    assert "not-the-token" not in report_path.read_text()


def test_an_unreachable_influxdb_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from servers import free_port

    url = f"http://127.0.0.1:{free_port()}"
    code = main(["--influxdb-url", url, "--influxdb-api-version", "1", "--quiet"])
    assert code == 2
    assert "unreachable" in capsys.readouterr().err


def test_v2_write_path_with_a_token_from_the_environment(
    victoria_server: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The default API v2 (/api/v2/write, token from INFLUXDB_TOKEN) floods a real v2-write server.

    VictoriaMetrics takes InfluxDB's v2 writes but not InfluxQL, so this run floods only.
    """
    monkeypatch.setenv("INFLUXDB_URL", victoria_server.url)
    monkeypatch.setenv("INFLUXDB_TOKEN", "token-for-a-test-server")
    report_path = tmp_path / "report.json"
    argv = [*QUICK, "--duration", "1.5", "--processes", "0", "--miners", "2", "--validators", "1"]
    argv += ["--points-per-sec", "300", "--run-id", "sim-vm1", "--no-validate", "--report", str(report_path)]
    assert main(argv) == 0
    report = json.loads(report_path.read_text())
    assert report["settings"]["influxdb_api_version"] == 2
    assert "token-for-a-test-server" not in report_path.read_text()
    sent = report["fleet"]["metrics"]["sent_by_key"]
    assert sent["training_step"] > 0 and report["summary"]["client_drops"] == {}
    match = '{__name__="training_step_loss", runtime_id=~"sim-vm1-.*"}'
    exported = victoria_server.wait_for_series(match, 2)
    deadline = time.monotonic() + 15  # the last samples take a moment to become searchable
    while sum(len(s["values"]) for s in exported) < sent["training_step"] and time.monotonic() < deadline:
        time.sleep(0.2)
        victoria_server.flush()
        exported = victoria_server.export(match)
    assert {s["metric"]["role"] for s in exported} == {"miner"}
    assert sum(len(s["values"]) for s in exported) == sent["training_step"]


def test_a_client_configuration_error_stops_the_run_before_any_load(
    monkeypatch: pytest.MonkeyPatch, influx_db: tuple[InfluxV1, str], capsys: pytest.CaptureFixture[str]
) -> None:
    server, database = influx_db
    monkeypatch.setenv("INFLUXDB_USERNAME", "only-a-user")
    code = main([*influx_args(server, database), "--quiet"])
    assert code == 2
    assert "INFLUXDB_PASSWORD" in capsys.readouterr().err
