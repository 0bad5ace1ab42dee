"""The simulator on VictoriaMetrics: the fleet writes line protocol to a real victoria-metrics, and every
dashboard query, count and alert rule runs as MetricsQL against it.

Debian's victoria-metrics (tests/servers.py) takes MetricsLogger's `/api/v2/write`
and answers the Prometheus query API; logs go to the Loki conformance receiver,
whose query API tests/grafana_receiver.py serves (--loki-query-url).
"""

from __future__ import annotations

import json
import re
import time
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from grafana_receiver import GrafanaReceiver, LokiSource, PrometheusSource
from loki_receiver import LokiReceiver, production_loki
from servers import VictoriaMetrics, victoria_metrics
from test_simulator import BurstClock
from test_simulator_e2e import clean_env  # noqa: F401  (the developer's environment stays out)

from simulator import cli
from simulator import dashboards as dash
from simulator import fleet as fl
from simulator import validate as vd
from simulator import victoria as vm
from simulator.cli import main
from telemetry_client import BufferSettings
from telemetry_client.catalog import NODE_CATALOG
from telemetry_client.metrics import MetricsLogger

pytestmark = pytest.mark.slow

QUICK = ["--duration", "3", "--ramp", "0.5", "--window-seconds", "1", "--min-interval", "1"]
QUICK += ["--self-metrics-interval", "0.5", "--system-interval", "0.5", "--settle", "10", "--quiet"]
FLEET = ["--processes", "0", "--miners", "4", "--validators", "2", "--points-per-sec", "600"]


def victoria_args(server: VictoriaMetrics) -> list[str]:
    return ["--metrics-backend", "victoriametrics", "--victoriametrics-url", server.url]


@pytest.fixture(scope="module")
def store() -> Iterator[VictoriaMetrics]:
    """This module's own VictoriaMetrics: the session's shared one is for tests that expect it empty."""
    with victoria_metrics() as server:
        yield server


@pytest.fixture
def token(monkeypatch: pytest.MonkeyPatch) -> None:
    """The nodes' write token: this VictoriaMetrics has no auth and takes any."""
    monkeypatch.setenv("INFLUXDB_TOKEN", "victoria-takes-any-token")


@pytest.fixture
def stack(store: VictoriaMetrics, token: None) -> Iterator[list[str]]:
    # Loki as in production: a tenant per node (and the edge's, for --edge-audit), read across tenants.
    with production_loki() as loki, GrafanaReceiver({"loki": LokiSource(loki)}, token="glsa_test") as grafana:
        yield [*victoria_args(store), "--loki-url", loki.base_url, "--loki-query-url", grafana.url,
               "--loki-tenant-per-node"]  # fmt: skip


def simulate(stack: list[str], tmp_path: Path, *extra: str) -> tuple[int, dict[str, Any]]:
    report = tmp_path / "report.json"
    code = main([*stack, *QUICK, *FLEET, *extra, "--report", str(report)])
    return code, json.loads(report.read_text())


def samples(server: VictoriaMetrics, metric: str, run_id: str, at_least: int = 0, timeout: float = 30.0) -> int:
    """Samples of one metric for the run, read back through /api/v1/export (not the simulator's counting).

    The export shows the last samples a moment after queries do: it is read again, flushed,
    until it holds `at_least` or the (generous) deadline passes.
    """
    deadline = time.monotonic() + timeout
    while True:
        server.flush()
        series = server.export(f'{{__name__="{metric}", runtime_id=~"{run_id}-.*"}}')
        found = sum(len(s["values"]) for s in series)
        if found >= at_least or time.monotonic() > deadline:
            return found
        time.sleep(0.5)


def assert_holds(exported: int, sent: int, report: dict[str, Any]) -> None:
    """The store holds what was sent; a batch the client sent again (after a timeout the server outlived) twice."""
    if report["fleet"]["metrics"].get("retries"):
        assert exported >= sent
    else:
        assert exported == sent


# ---------------------------------------------------------------- the query runner


def _query(text: str, source: str = "panel", instant: bool = False) -> dash.Query:
    return dash.Query("d", "D", source, "t", 1 if source == "panel" else None, "A", "prometheus", "vm", text, instant)


@pytest.fixture
def written(store: VictoriaMetrics) -> tuple[str, dash.TimeRange]:
    """Forty points of a measurement with two numeric fields and a string one, from one MetricsLogger."""
    measurement = f"vmcheck{datetime.now(UTC).strftime('%H%M%S%f')}"
    logger = MetricsLogger(
        url=store.url, token="any", org="o", database="b", uid=7, role="miner", runtime_id="vmrun.1-0",
        buffer=BufferSettings(flush_interval=0.05), self_metrics_interval=None,
    )  # fmt: skip
    now = datetime.now(UTC)
    for index in range(40):
        at = now - timedelta(seconds=40 - index)
        logger.log(measurement, fields={"loss": index / 10, "window": index, "note": "text"}, timestamp=at)
    assert logger.flush(10) == 0 and logger.stats()["sent"] == 40
    logger.close(1)
    store.wait_for_series(f'{{__name__=~"{measurement}_.*"}}', 3)
    return measurement, dash.TimeRange(now - timedelta(seconds=60), now + timedelta(seconds=1))


def test_range_instant_and_variable_queries_report_what_came_back(
    store: VictoriaMetrics, written: tuple[str, dash.TimeRange]
) -> None:
    measurement, window = written
    runner = vm.PromQL(store.url)
    step = timedelta(seconds=5)
    ranged = runner.run(_query(""), f"avg_over_time({measurement}_loss[5s])", window, step)
    assert ranged.status == vd.OK and ranged.series == 1 and 8 <= ranged.values <= 13, ranged
    counted = f"sum by (uid) (count_over_time({measurement}_loss[1m]))"
    instant = runner.run(_query("", instant=True), counted, window, step)
    assert (instant.status, instant.series, instant.values) == (vd.OK, 1, 1)
    offered = runner.run(_query("", "variable"), f"label_values({measurement}_loss, uid)", window, step)
    assert (offered.status, offered.values) == (vd.OK, 1)
    assert runner.variable(*vm.variable_call(f"label_values({measurement}_window, role)"), window) == ["miner"]
    names = runner.variable(*vm.variable_call(f"metrics({measurement}_)"), window)
    assert sorted(names) == [f"{measurement}_{f}" for f in ("loss", "note", "window")]  # a string field is 0
    empty = runner.run(_query(""), f'{measurement}_loss{{uid="nobody"}}', window, step)
    assert empty.status == vd.EMPTY and empty.values == 0
    broken = runner.run(_query(""), f"sum({measurement}_loss", window, step)
    assert broken.status == vd.ERROR and "HTTP 422" in broken.message and "unparsed data" in broken.message
    unreachable = vm.PromQL("http://127.0.0.1:1").run(_query(""), "up", window, step)
    assert unreachable.status == vd.ERROR and "unreachable" in unreachable.message


def test_counts_are_the_points_one_logger_wrote(store: VictoriaMetrics, written: tuple[str, dash.TimeRange]) -> None:
    measurement, window = written
    runner = vm.PromQL(store.url)
    # Not in the catalog: every `<measurement>_*` series counts, the fullest one is the point count.
    assert vm.stored_counts(runner, "vmrun.1", window, [measurement]) == {measurement: 40}
    # The run id is a literal prefix of runtime_id: "." matches only itself.
    assert vm.stored_counts(runner, "vmrunx1", window, [measurement, "training_step"]) == {
        measurement: 0,
        "training_step": 0,
    }


# MetricsQL's duration units (github.com/VictoriaMetrics/metricsql, lexer.go: DurationValue), in milliseconds.
_DURATION_UNITS_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000, "w": 604_800_000}
_DURATION_UNITS_MS["y"] = 365 * _DURATION_UNITS_MS["d"]


def _latency_offset_ms(value: str) -> int:
    """`value` in ms as VictoriaMetrics v1.136.0 reads it: seconds as a number, else a MetricsQL duration
    (lib/httputil/duration.go, GetDuration)."""
    try:
        return int(float(value) * 1e3)
    except ValueError:
        assert re.fullmatch(r"(\d+(\.\d+)?(ms|[smhdwy]))+", value), f"not a duration VictoriaMetrics parses: {value!r}"
        pairs = re.findall(r"(\d+(?:\.\d+)?)(ms|[smhdwy])", value)
        return int(sum(float(number) * _DURATION_UNITS_MS[unit] for number, unit in pairs))


def test_every_query_asks_for_a_latency_offset_the_pinned_release_accepts(monkeypatch: pytest.MonkeyPatch) -> None:
    """v1.136.0 answers latency_offset outside [1ms, 100 years] with 422 (lib/httputil/duration.go); 1.79.5
    ignores the argument, so a test against it alone could not tell."""
    sent: list[dict[str, str]] = []

    def answer(url: str, params: dict[str, str], headers: dict, timeout: float) -> tuple[int, bytes]:
        sent.append(params)
        return 200, b'{"status": "success", "data": {"resultType": "vector", "result": []}}'

    monkeypatch.setattr(vm, "_http", answer)
    source = vm.PromQL("http://127.0.0.1:1")
    now = datetime.now(UTC)
    window = dash.TimeRange(now - timedelta(minutes=5), now)
    source.run(_query("up"), "up", window, timedelta(seconds=15))
    source.run(_query("up", instant=True), "up", window, timedelta(seconds=15))
    assert len(sent) == 2
    for params in sent:
        assert params["nocache"] == "1"
        assert 1 <= _latency_offset_ms(params["latency_offset"]) <= 100 * 365 * 24 * 3600 * 1000, params


def test_regex_and_string_escapes_keep_a_run_id_literal() -> None:
    assert vm.regex_escape("sim-a.b(c)") == r"sim-a\.b\(c\)"
    assert vm.string_literal('a"b\\c') == '"a\\"b\\\\c"'
    assert vm.variable_call('label_values(training_step_loss{network=~"$network"}, uid)') == (
        "label_values",
        json.dumps(['training_step_loss{network=~"$network"}', "uid"]),
    )
    assert vm.variable_call("label_values(uid)") == ("label_values", json.dumps(["", "uid"]))
    assert vm.variable_call("query_result(max(x))") == ("query_result", "max(x)")
    assert vm.variable_call("sum(x)") is None


# ---------------------------------------------------------------- a replicated cluster's deduplication

ROLE_DEFAULTS = Path(__file__).resolve().parents[1] / "ansible/roles/victoriametrics/defaults/main.yml"


@pytest.fixture(scope="module")
def deduplicating() -> Iterator[VictoriaMetrics]:
    """A VictoriaMetrics that deduplicates as the victoriametrics role's cluster does (vmstorage and vmselect).

    -dedup.minScrapeInterval is a flag of the single node too: it keeps, per series,
    one sample of each interval, here each millisecond, as a replicated cluster does.
    """
    interval = yaml.safe_load(ROLE_DEFAULTS.read_text())["victoriametrics_dedup_min_scrape_interval"]
    assert interval == "1ms"
    with victoria_metrics(f"-dedup.minScrapeInterval={interval}") as server:
        yield server


def _stored_samples(server: VictoriaMetrics, metric: str, offsets_ns: list[int]) -> int:
    """Samples stored of one series that one MetricsLogger wrote at each offset from the start of a millisecond."""
    logger = MetricsLogger(
        url=server.url, token="any", org="o", database="b", uid=3, role="miner",
        buffer=BufferSettings(flush_interval=0.05), self_metrics_interval=None,
    )  # fmt: skip
    start = time.time_ns() // 1_000_000 * 1_000_000
    for index, offset in enumerate(offsets_ns):
        logger.log(metric, fields={"loss": float(index)}, timestamp=start + offset)
    assert logger.flush(10) == 0 and logger.stats()["sent"] == len(offsets_ns)
    logger.close(1)
    [series] = server.wait_for_series(f"{metric}_loss", 1)
    source = vm.PromQL(server.url)
    data = source.instant(f"count_over_time({metric}_loss[1m])", start // 1_000_000 + 1000)
    [sample] = data["result"]
    assert int(sample["value"][1]) == len(series["values"])  # the queries count what the export shows
    return len(series["values"])


def test_two_points_of_one_series_within_a_millisecond_are_one_under_the_clusters_deduplication(
    store: VictoriaMetrics, deduplicating: VictoriaMetrics
) -> None:
    """What docs/scaling.md tells users: VictoriaMetrics stores milliseconds; deduplication keeps one per series."""
    offsets = [0, 1, 10_000_000, 10_500_000, 20_000_000, 21_000_000]  # t, t+1 ns, t+10 ms, t+10.5 ms, ...
    metric = f"vmdedup{datetime.now(UTC).strftime('%H%M%S%f')}"
    assert _stored_samples(store, metric, offsets) == 6
    assert _stored_samples(deduplicating, metric, offsets) == 4


def test_a_burst_of_the_simulators_points_loses_nothing_to_deduplication(
    deduplicating: VictoriaMetrics, token: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nodes ticking 10 us apart (the load catching up after a stall) into a deduplicating store: all stored.

    What the clients sent counts, per measurement, as in the simulator's own check,
    the one `system` sample each client adds with a point's timestamp included.
    """
    monkeypatch.setattr(fl, "time", BurstClock(step_ns=10_000))
    run = fl.RunIdentity(f"sim-dedup{datetime.now(UTC).strftime('%H%M%S%f')}", "testnet", 5)
    specs = fl.build_specs({"miner": 2, "validator": 1}, run.seed)
    plan = fl.plan_for(specs, points_per_sec=500, window_seconds=2, duration=10)
    buffer = BufferSettings(flush_interval=0.05)
    targets = fl.Targets(deduplicating.url, "b", buffer=buffer, system_interval=3600, self_metrics_interval=None)
    sent: Counter[str] = Counter()
    started = datetime.now(UTC)
    for spec in specs:
        node = fl.make_node(spec, run, plan, targets)
        for _ in range(150):
            node.tick()
        node.finish()
        node.close(30)
        metrics, _ = node.stats()
        assert metrics["pending"] == 0, metrics
        sent.update(metrics["sent_by_key"])
    assert sent["training_step"] == 300 and sent["system"] == len(specs), sent
    latest = max(fl.time.now_ns, time.time_ns()) / 1e9 + 5  # a timestamp may run ahead of the burst's clock
    window = dash.TimeRange(started - timedelta(seconds=5), datetime.fromtimestamp(latest, UTC))
    deduplicating.flush()
    assert vm.stored_counts(vm.PromQL(deduplicating.url), run.run_id, window, sent) == dict(sent)


# ---------------------------------------------------------------- the simulator end to end


def test_a_run_on_victoriametrics_runs_every_metricsql_query_and_accounts_for_every_point_and_line(
    stack: list[str], store: VictoriaMetrics, tmp_path: Path
) -> None:
    # Enough miner steps for the rare non-finite gradient norm that the drops panel shows; the edge's
    # audit stream for the audit panel, the stack's backup reports for the backup panels.
    argv = ["--run-id", "sim-vmrun1", "--miners", "8", "--points-per-sec", "2000", "--edge-audit", "--backup-status"]
    code, report = simulate(stack, tmp_path, *argv)
    assert code == 0, report["summary"]
    # Every query of grafana/dashboards-victoriametrics/ ran on the store and answered.
    queries = [q for q in report["queries"] if q["datasource"] == "prometheus"]
    expected = [q for d in dash.load_dashboards(cli.DASHBOARD_DIRS["victoriametrics"]) for q in dash.iter_queries([d])]
    assert len(queries) == len([q for q in expected if q.datasource_type == "prometheus"]) > 50
    # A panel pairs a fleet target with a per-node one: the one that answers with every node selected is OK.
    twin = "another target of the panel answers for this range and selection"
    assert {q["status"] for q in queries if q["message"] != twin} == {vd.OK}, [
        q for q in queries if q["status"] != vd.OK and q["message"] != twin
    ][:3]
    assert {q["status"] for q in queries if q["message"] == twin} == {vd.SKIPPED}
    panels = {(q["dashboard"], q["panel_id"]) for q in queries if q["kind"] == "panel"}
    assert {(q["dashboard"], q["panel_id"]) for q in queries if q["status"] == vd.OK and q["kind"] == "panel"} == panels
    assert {q["status"] for q in report["queries"] if q["datasource"] == "loki"} == {vd.OK}
    assert not any(q["datasource"] == "influxdb" for q in report["queries"])
    assert report["settings"]["metrics_backend"] == "victoriametrics"
    assert report["settings"]["victoriametrics_url"] == store.url
    sent = report["fleet"]["metrics"]["sent_by_key"]
    assert set(sent) == set(NODE_CATALOG) and report["summary"]["lost"] == 0
    rows = {row["key"]: row for row in report["delivery"] if row["store"] == "victoriametrics"}
    assert set(rows) == set(NODE_CATALOG)
    assert all(row["ok"] and row["stored"] == sent[key] for key, row in rows.items())
    assert [row for row in report["delivery"] if row["store"] == "loki"] and all(r["ok"] for r in report["delivery"])
    # Read back independently of the simulator's counting: the store holds what the clients sent.
    for metric, key in (("training_step_loss", "training_step"), ("system_cpu_percent", "system")):
        assert_holds(samples(store, metric, "sim-vmrun1", at_least=sent[key]), sent[key], report)


def test_points_the_store_does_not_hold_are_reported_lost(
    stack: list[str], store: VictoriaMetrics, tmp_path: Path
) -> None:
    """Writes to a VictoriaMetrics other than the one queried: every point is missing, exit bit 4."""
    (tmp_path / "none").mkdir()
    with victoria_metrics() as elsewhere:
        argv = [*stack, "--influxdb-url", elsewhere.url, "--run-id", "sim-vmrun2"]
        argv += ["--dashboards", str(tmp_path / "none")]
        code, report = simulate(argv, tmp_path, "--settle", "2", "--duration", "1.5")
    assert code & 4 and not code & 8, report["summary"]
    rows = [row for row in report["delivery"] if row["store"] == "victoriametrics"]
    assert rows and all(row["stored"] == 0 and row["sent"] > 0 for row in rows)
    assert report["summary"]["lost"] == sum(row["sent"] for row in rows)


def test_a_drops_fault_is_expected_and_nothing_is_lost(stack: list[str], tmp_path: Path) -> None:
    (tmp_path / "none").mkdir()
    code, report = simulate(
        stack, tmp_path, "--dashboards", str(tmp_path / "none"), "--duration", "10", "--fault", "drops@3"
    )
    assert code == 0, report["summary"]
    assert report["fleet"]["metrics"]["dropped_by_reason"]["none_value"] > 0
    assert report["summary"]["client_drops"] == {} and report["summary"]["lost"] == 0


@pytest.mark.parametrize(
    ("argv", "env", "message"),
    [
        (["--metrics-backend", "victoriametrics"], {}, "no VictoriaMetrics: pass --victoriametrics-url"),
        ([], {"METRICS_BACKEND": "prometheus"}, "METRICS_BACKEND must be one of influxdb, victoriametrics"),
        (["--metrics-backend", "victoriametrics", "--victoriametrics-url", "http://127.0.0.1:1"],
         {"VICTORIAMETRICS_PASSWORD": "pw"}, "set both VICTORIAMETRICS_USERNAME and VICTORIAMETRICS_PASSWORD"),
        (["--metrics-backend", "victoriametrics", "--victoriametrics-url", "http://127.0.0.1:1"], {},
         "VictoriaMetrics at http://127.0.0.1:1/api/v1/labels is unreachable"),
    ],
)  # fmt: skip
def test_a_wrong_backend_setting_is_a_usage_error(
    argv: list[str],
    env: dict[str, str],
    message: str,
    token: None,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert main([*argv, *QUICK]) == 2
    assert message in capsys.readouterr().err


def test_the_backend_comes_from_the_environment_as_the_stack_sets_it(
    store: VictoriaMetrics, token: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("METRICS_BACKEND", "victoriametrics")
    monkeypatch.setenv("VICTORIAMETRICS_URL", store.url)
    (tmp_path / "none").mkdir()
    report = tmp_path / "report.json"
    argv = [*QUICK, *FLEET, "--duration", "1.5", "--dashboards", str(tmp_path / "none"), "--report", str(report)]
    assert main(argv) == 0
    settings = json.loads(report.read_text())["settings"]
    assert settings["metrics_backend"] == "victoriametrics" and settings["influxdb_url"] == store.url


def test_through_grafana_every_metricsql_panel_the_counts_and_the_rules(
    store: VictoriaMetrics, token: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The local stack's path (make simulate): the store is not reachable for reads, Grafana is."""
    monkeypatch.setenv("GRAFANA_TOKEN", "glsa_vm_test")
    with LokiReceiver() as loki:
        sources = {
            "victoriametrics": PrometheusSource(store.url, min_interval=timedelta(seconds=1)),
            "loki": LokiSource(loki),
        }
        with GrafanaReceiver(sources, token="glsa_vm_test") as grafana:
            # Writes only at this address; everything read goes through Grafana.
            stack = ["--metrics-backend", "victoriametrics", "--influxdb-url", store.url]
            stack += ["--loki-url", loki.base_url, "--grafana-url", grafana.url]
            # This server shows samples at once (-search.latencyOffset=0s): nothing to wait for.
            code, report = simulate(
                stack, tmp_path, "--victoriametrics-latency-offset", "0", "--duration", "10", "--fault", "drops@3"
            )
            seen = grafana.queries
    assert code == 0, report["summary"]
    queries = [q for q in report["queries"] if q["datasource"] == "prometheus"]
    variables = [q for q in queries if q["kind"] == "variable"]
    assert variables and {q["status"] for q in variables} == {vd.SKIPPED}  # Grafana's resource API answers those
    assert {q["status"] for q in queries if q["kind"] == "panel" and q["status"] != vd.SKIPPED} == {vd.OK}
    assert "$__interval" in "".join(q["query"] for q in queries)  # Grafana fills its macros in itself
    rows = [row for row in report["delivery"] if row["store"] == "victoriametrics"]
    assert rows and all(row["ok"] for row in rows)
    alerts = {a["uid"]: a for a in report["alerts"]}
    assert alerts["telemetry-client-drops"]["status"] == "FIRING" and report["summary"]["alerts_wrong"] == []
    # The counts and the rules went through Grafana's VictoriaMetrics data source too.
    executed = [q.executed for q in seen if q.datasource_uid == "victoriametrics"]
    assert any("keep_metric_names" in text for text in executed)
    assert any("range_over_time(telemetry_client_dropped_none_value" in text for text in executed)


def test_more_points_stored_than_sent_are_reported_as_such(
    stack: list[str], store: VictoriaMetrics, tmp_path: Path
) -> None:
    """Points the run's clients did not count as sent (as a batch kept twice would be) are named, not hidden."""
    extra = MetricsLogger(
        url=store.url, token="any", org="o", database="b", uid=99, role="miner", runtime_id="sim-vmrun3-99",
        buffer=BufferSettings(flush_interval=0.05), self_metrics_interval=None,
    )  # fmt: skip
    soon = datetime.now(UTC) + timedelta(seconds=2)  # inside the run's window
    for index in range(3):
        extra.log("training_step", fields={"loss": 1.0, "window": 0}, timestamp=soon + timedelta(milliseconds=index))
    assert extra.flush(10) == 0
    extra.close(1)
    (tmp_path / "none").mkdir()
    code, report = simulate(
        stack, tmp_path, "--run-id", "sim-vmrun3", "--dashboards", str(tmp_path / "none"), "--duration", "4"
    )
    assert code & 4, report["summary"]
    [row] = [row for row in report["delivery"] if not row["ok"]]
    assert (row["key"], row["stored"] - row["sent"]) == ("training_step", 3)
    assert row["message"].startswith("3 more stored than sent")


def test_read_credentials_come_from_the_environment() -> None:
    basic = vm.headers_from_env({"VICTORIAMETRICS_USERNAME": "reader", "VICTORIAMETRICS_PASSWORD": "pw"})
    assert basic == (("Authorization", "Basic cmVhZGVyOnB3"),)
    assert vm.headers_from_env({"VICTORIAMETRICS_BEARER_TOKEN": "t0k"}) == (("Authorization", "Bearer t0k"),)
    with pytest.raises(ValueError, match="both VICTORIAMETRICS_USERNAME and VICTORIAMETRICS_PASSWORD"):
        vm.headers_from_env({"VICTORIAMETRICS_USERNAME": "reader"})
