"""`python -m simulator`: flood the stack with a simulated network, then validate every dashboard.

The target stack comes from flags or the client library's own environment
variables (INFLUXDB_URL or INFLUXDB_HOST/INFLUXDB_PORT, INFLUXDB_DATABASE,
INFLUXDB_ORG, INFLUXDB_API_VERSION, INFLUXDB_TOKEN, INFLUXDB_USERNAME,
INFLUXDB_PASSWORD, LOKI_URL and LOKI_USERNAME/LOKI_PASSWORD/LOKI_BEARER_TOKEN),
so the simulator reaches exactly what a node configured the same way reaches.
Secrets are read from the environment or from files, never from flags.

The metrics store is InfluxDB or VictoriaMetrics (METRICS_BACKEND, as the stack's
own switch). Nodes write InfluxDB line protocol either way; with VictoriaMetrics
the dashboards, the accounting and the alert rules run MetricsQL at its
Prometheus query API (VICTORIAMETRICS_URL).
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import secrets
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from grafana.builder import audit
from simulator import alerting as al
from simulator import backups as bk
from simulator import dashboards as dash
from simulator import edge, load
from simulator import faults as ft
from simulator import fleet as fl
from simulator import report as rp
from simulator import validate as vd
from simulator import victoria as vm
from simulator.grafana_api import GrafanaClient, GrafanaError

DATASOURCE_TYPES = ("influxdb", "prometheus", "loki")
METRICS_BACKENDS = ("influxdb", "victoriametrics")
# The Grafana data source type each backend's dashboards and rules query.
METRICS_DATASOURCE = {"influxdb": "influxdb", "victoriametrics": "prometheus"}
DASHBOARD_DIRS = {"influxdb": dash.DASHBOARDS_DIR, "victoriametrics": dash.VICTORIAMETRICS_DASHBOARDS_DIR}
# Stores make writes visible after a moment; this is how long a missing count is re-checked.
DEFAULT_SETTLE = 5.0


class UsageError(Exception):
    """A flag or environment variable is missing or wrong; the message says which and how to fix it."""


def _env(name: str) -> str | None:
    return os.environ.get(name) or None


def _positive(kind: type) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        value = kind(text)
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
        return value

    return parse


def _non_negative(kind: type) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        value = kind(text)
        if value < 0:
            raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
        return value

    return parse


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m simulator",
        description=(
            "Flood the telemetry stack with a simulated training network (miners, validators, aggregators, "
            "evaluators using telemetry_client as real nodes do), then run every provisioned dashboard query "
            "over the run's time window and account for every point and log line sent."
        ),
        epilog=(
            "Environment: INFLUXDB_URL (or INFLUXDB_HOST, INFLUXDB_PORT), INFLUXDB_DATABASE, INFLUXDB_ORG, "
            "INFLUXDB_API_VERSION, INFLUXDB_TOKEN (writes), INFLUXDB_READ_TOKEN (validation queries; defaults to "
            "INFLUXDB_TOKEN), INFLUXDB_USERNAME/INFLUXDB_PASSWORD (InfluxDB 1.x), LOKI_URL, LOKI_USERNAME/"
            "LOKI_PASSWORD or LOKI_BEARER_TOKEN, GRAFANA_URL, GRAFANA_TOKEN or GRAFANA_USER/GRAFANA_PASSWORD. "
            "Exit code: 0 all OK; bits 1 = a query EMPTY or ERROR, 2 = usage error, 4 = records lost, "
            "8 = the fleet or a store failed, 16 = an alert rule fired without its fault or stayed quiet under it "
            "(they add up)."
        ),
    )
    nodes = parser.add_argument_group("fleet")
    nodes.add_argument("--miners", type=_non_negative(int), default=32, help="simulated miners (default: 32)")
    nodes.add_argument("--validators", type=_non_negative(int), default=4, help="simulated validators (default: 4)")
    nodes.add_argument("--aggregators", type=_non_negative(int), default=1, help="simulated aggregators (default: 1)")
    nodes.add_argument("--evaluators", type=_non_negative(int), default=1, help="simulated evaluators (default: 1)")
    nodes.add_argument(
        "--network",
        default="simnet",
        help="network name: the `network` tag and the Loki `environment` label (default: simnet)",
    )
    nodes.add_argument(
        "--run-id",
        help="id of this run; every node's runtime_id starts with it, which scopes the accounting "
        "(default: sim-<random hex>)",
    )
    nodes.add_argument("--seed", type=int, default=0, help="seed of every signal: same seed, same values (default: 0)")
    nodes.add_argument(
        "--window-seconds",
        type=_positive(float),
        default=2.0,
        help="wall-clock length of a training window at the target rate; small values fill minutes of "
        "dashboards in seconds (default: 2)",
    )
    rate = parser.add_argument_group("load")
    rate.add_argument(
        "--points-per-sec", type=_non_negative(float), default=2000.0, help="target points/s, all nodes (default: 2000)"
    )
    rate.add_argument(
        "--lines-per-sec", type=_non_negative(float), default=200.0, help="target log lines/s, all nodes (default: 200)"
    )
    rate.add_argument("--duration", type=_positive(float), default=30.0, help="seconds of load (default: 30)")
    rate.add_argument(
        "--ramp", type=_non_negative(float), default=5.0, help="seconds to ramp up linearly to the rates (default: 5)"
    )
    rate.add_argument(
        "--processes",
        type=_non_negative(int),
        default=load.default_processes(),
        help="worker processes, each with its own sender thread; 0 runs the fleet in this process "
        f"(default: {load.default_processes()}, one per core up to 4)",
    )
    rate.add_argument(
        "--system-interval",
        type=_positive(float),
        default=1.0,
        help="seconds between a node's `system` samples (client's system_metrics_interval; default: 1)",
    )
    rate.add_argument(
        "--self-metrics-interval",
        type=_positive(float),
        default=1.0,
        help="seconds between a node's `telemetry_client` self-metrics points (default: 1)",
    )
    rate.add_argument(
        "--close-timeout",
        type=_positive(float),
        default=30.0,
        help="seconds the fleet may take to deliver what is buffered at the end (default: 30)",
    )
    target = parser.add_argument_group("stack (flags win over the environment)")
    target.add_argument(
        "--metrics-backend",
        choices=METRICS_BACKENDS,
        help="the stack's metrics store (env METRICS_BACKEND; default: influxdb). Nodes write InfluxDB line "
        "protocol to either; with victoriametrics the dashboards (grafana/dashboards-victoriametrics), the "
        "accounting and the alert rules run MetricsQL at --victoriametrics-url",
    )
    target.add_argument(
        "--victoriametrics-url",
        help="where VictoriaMetrics answers queries (env VICTORIAMETRICS_URL): a single node's URL, e.g. "
        "http://localhost:8428, or a cluster's http://<vmselect>:8481/select/0/prometheus; "
        "a single node takes the writes there too (default of --influxdb-url); read credentials from env "
        "VICTORIAMETRICS_USERNAME/VICTORIAMETRICS_PASSWORD or VICTORIAMETRICS_BEARER_TOKEN, and the key of "
        "-forceFlushAuthKey from VICTORIAMETRICS_FORCE_FLUSH_AUTH_KEY",
    )
    target.add_argument(
        "--influxdb-url",
        help="where the nodes write metrics (env INFLUXDB_URL, or INFLUXDB_HOST/INFLUXDB_PORT): InfluxDB's base "
        "URL; with --metrics-backend victoriametrics the base of its line protocol endpoint, a single node's "
        "URL (default: --victoriametrics-url) or a cluster's http://<vminsert>:8480/insert/0/influx",
    )
    target.add_argument("--influxdb-database", help="database (1.x) or bucket (2.x) (env INFLUXDB_DATABASE; telemetry)")
    target.add_argument("--influxdb-org", help="organisation, InfluxDB 2.x (env INFLUXDB_ORG; default: telemetry)")
    target.add_argument(
        "--influxdb-api-version",
        type=int,
        choices=(1, 2),
        help="1 for InfluxDB 1.x (/write, user/password), 2 for /api/v2/write with a token "
        "(env INFLUXDB_API_VERSION; default: 2)",
    )
    target.add_argument("--influxdb-token-file", help="file holding the write token (else env INFLUXDB_TOKEN)")
    target.add_argument(
        "--influxdb-read-token-file",
        help="file holding a read token for the validation queries (else env INFLUXDB_READ_TOKEN, "
        "else the write token)",
    )
    target.add_argument("--loki-url", help="Loki base URL (env LOKI_URL); without one the fleet writes no logs")
    target.add_argument(
        "--loki-query-url",
        help="where Loki answers queries, when not at --loki-url (a read path behind another address; "
        "env LOKI_QUERY_URL)",
    )
    target.add_argument(
        "--loki-tenant-per-node",
        action="store_true",
        help="each node pushes into its own Loki tenant (X-Scope-OrgID: its uid), as the production edge sets it, "
        "and the run's Loki queries read every node's tenant (their uids joined by '|', as Grafana's data source "
        "does); for a Loki with auth_enabled and multi_tenant_queries_enabled",
    )
    target.add_argument("--grafana-url", help="run the queries through Grafana's /api/ds/query (env GRAFANA_URL)")
    target.add_argument(
        "--grafana-token-file",
        help="file holding a Grafana service account token (else env GRAFANA_TOKEN, or GRAFANA_USER/GRAFANA_PASSWORD)",
    )
    check = parser.add_argument_group("validation and report")
    check.add_argument(
        "--dashboards",
        type=Path,
        help="directory of dashboard JSON files (default: grafana/dashboards, or "
        "grafana/dashboards-victoriametrics with --metrics-backend victoriametrics)",
    )
    check.add_argument(
        "--datasource",
        action="append",
        choices=DATASOURCE_TYPES,
        help="validate only queries of this data source type (repeatable; default: the metrics backend's "
        "(influxdb, or prometheus for VictoriaMetrics) and loki); others are SKIPPED",
    )
    check.add_argument(
        "--min-interval",
        type=_positive(float),
        default=10.0,
        help="lower bound of $__interval in seconds, as the data source's min interval (default: 10, the "
        "provisioned InfluxDB data source's timeInterval); through Grafana, Grafana decides",
    )
    check.add_argument(
        "--settle",
        type=_non_negative(float),
        default=DEFAULT_SETTLE,
        help=f"seconds to keep re-counting stored records that are still missing (default: {DEFAULT_SETTLE:g})",
    )
    check.add_argument(
        "--victoriametrics-latency-offset",
        type=_non_negative(float),
        default=vm.LATENCY_OFFSET_SECONDS,
        metavar="SECONDS",
        help="VictoriaMetrics hides samples younger than this from Grafana's queries (its -search.latencyOffset); "
        "through Grafana the simulator waits that long after the load before it counts and queries "
        f"(default: {vm.LATENCY_OFFSET_SECONDS:g})",
    )
    check.add_argument(
        "--fault",
        action="append",
        default=[],
        metavar="KIND[:uid=N][@SECONDS]",
        help="inject a fault (repeatable): "
        + "; ".join(f"{k}: {v[0]}" for k, v in ft.KINDS.items()).replace("%", "%%")
        + ". Default node: the first that fits; default start: half-way. Every alert rule is then evaluated "
        "and must fire exactly under its fault",
    )
    check.add_argument(
        "--edge-audit",
        action="store_true",
        help="also write the production edge's audit stream: the lines its access log and shipper would put "
        "into Loki's tenant _edge for the run (nodes' pushes, the deploy's checks, the refused-credentials "
        "fault), pushed to --loki-url, which must keep tenants apart (auth_enabled: true) for the audit panel "
        "and rule to read them; without it they are SKIPPED",
    )
    check.add_argument(
        "--backup-status",
        action="store_true",
        help="also write the stack's own backup reports (stack_backup) for a few stateful hosts over the run, as "
        "the backup role's report timer would (every run ok, the last success hours old; the backup-overdue "
        "fault makes one host overdue), for the backup panels and rule; without it they are SKIPPED",
    )
    check.add_argument(
        "--alerting",
        type=Path,
        help="directory of the generated alerting files (default: grafana/alerting, or "
        "grafana/alerting-victoriametrics with --metrics-backend victoriametrics)",
    )
    check.add_argument("--no-validate", action="store_true", help="flood only: no dashboard queries, no accounting")
    check.add_argument("--report", type=Path, help="write the JSON report to this file")
    check.add_argument("--verbose", action="store_true", help="list every query in the table, OK ones included")
    check.add_argument("--quiet", action="store_true", help="no live progress and no tables (the exit code remains)")
    return parser


@dataclass(frozen=True)
class Stack:
    """The resolved target stack (secrets included: never printed, never in the report)."""

    influx_url: str
    database: str
    org: str
    api_version: int
    token: str | None
    read_token: str | None
    username: str | None
    password: str | None
    loki_url: str | None
    grafana: GrafanaClient | None
    loki_query_url: str | None = None
    backend: str = "influxdb"
    victoria_url: str | None = None
    victoria_headers: tuple[tuple[str, str], ...] = ()
    # X-Scope-OrgID of the run's own Loki queries (--loki-tenant-per-node: every node's tenant).
    loki_org_id: str | None = None

    @property
    def loki_read_url(self) -> str | None:
        return self.loki_query_url or self.loki_url

    @property
    def metrics_datasource(self) -> str:
        """The Grafana data source type of the metrics store's dashboards and rules."""
        return METRICS_DATASOURCE[self.backend]


def _read_secret(path: str | None, variable: str) -> str | None:
    if path:
        try:
            value = Path(path).read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise UsageError(f"cannot read {path}: {exc.strerror}") from None
        if not value:
            raise UsageError(f"{path} is empty")
        return value
    return _env(variable)


def resolve_stack(args: argparse.Namespace) -> Stack:
    """Flags first, then the client library's environment variables."""
    backend = args.metrics_backend or _env("METRICS_BACKEND") or "influxdb"
    if backend not in METRICS_BACKENDS:
        raise UsageError(f"METRICS_BACKEND must be one of {', '.join(METRICS_BACKENDS)}, got {backend!r}")
    url = args.influxdb_url or _env("INFLUXDB_URL")
    if not url and _env("INFLUXDB_HOST"):
        host = _env("INFLUXDB_HOST") or ""
        scheme = "http" if host in ("localhost", "127.0.0.1", "::1") else "https"
        url = f"{scheme}://{host}:{_env('INFLUXDB_PORT') or 8086}"
    victoria = (args.victoriametrics_url or _env("VICTORIAMETRICS_URL") or "").rstrip("/") or None
    if backend == "victoriametrics":
        if not url and not victoria:
            raise UsageError(
                "no VictoriaMetrics: pass --victoriametrics-url or set VICTORIAMETRICS_URL (a single node takes the "
                "writes there too; a cluster's vminsert goes in --influxdb-url)"
            )
        url, victoria = url or victoria, victoria or (url or "").rstrip("/")
    if not url:
        raise UsageError("no InfluxDB: pass --influxdb-url or set INFLUXDB_URL (or INFLUXDB_HOST/INFLUXDB_PORT)")
    version_text = args.influxdb_api_version or _env("INFLUXDB_API_VERSION") or 2
    try:
        api_version = int(version_text)
    except ValueError:
        raise UsageError(f"INFLUXDB_API_VERSION must be 1 or 2, got {version_text!r}") from None
    if api_version not in (1, 2):
        raise UsageError(f"InfluxDB API version must be 1 or 2, got {api_version}")
    token = _read_secret(args.influxdb_token_file, "INFLUXDB_TOKEN")
    if api_version == 2 and not token:
        if backend == "victoriametrics":
            raise UsageError(
                "the nodes send a token with /api/v2/write: set INFLUXDB_TOKEN or pass --influxdb-token-file "
                "(the one VictoriaMetrics' auth proxy expects; a VictoriaMetrics without auth accepts any)"
            )
        raise UsageError(
            "InfluxDB API v2 needs a token: set INFLUXDB_TOKEN or pass --influxdb-token-file "
            "(for InfluxDB 1.x pass --influxdb-api-version 1)"
        )
    read_token = _read_secret(args.influxdb_read_token_file, "INFLUXDB_READ_TOKEN") or token
    username, password = _env("INFLUXDB_USERNAME"), _env("INFLUXDB_PASSWORD")
    if bool(username) != bool(password):
        raise UsageError("set both INFLUXDB_USERNAME and INFLUXDB_PASSWORD, or neither")
    grafana = None
    grafana_url = args.grafana_url or _env("GRAFANA_URL")
    if grafana_url:
        try:
            grafana = GrafanaClient.from_env(grafana_url, args.grafana_token_file)
        except (GrafanaError, OSError) as exc:
            raise UsageError(str(exc)) from None
    return Stack(
        influx_url=url.rstrip("/"),
        database=args.influxdb_database or _env("INFLUXDB_DATABASE") or "telemetry",
        org=args.influxdb_org or _env("INFLUXDB_ORG") or "telemetry",
        api_version=api_version,
        token=token,
        read_token=read_token if api_version == 2 else None,
        username=username,
        password=password,
        loki_url=(args.loki_url or _env("LOKI_URL") or "").rstrip("/") or None,
        grafana=grafana,
        loki_query_url=(args.loki_query_url or _env("LOKI_QUERY_URL") or "").rstrip("/") or None,
        backend=backend,
        victoria_url=victoria if backend == "victoriametrics" else None,
        victoria_headers=victoria_headers(backend),
    )


def victoria_headers(backend: str) -> tuple[tuple[str, str], ...]:
    """VictoriaMetrics read credentials from the environment (none for InfluxDB)."""
    if backend != "victoriametrics":
        return ()
    try:
        return vm.headers_from_env(os.environ)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def check_reachable(url: str, what: str) -> None:
    """Fail fast when a store does not answer at all (any HTTP answer counts as reachable)."""
    try:
        with urllib.request.urlopen(url, timeout=5):
            pass
    except urllib.error.HTTPError:
        return
    except (urllib.error.URLError, OSError) as exc:
        raise UsageError(f"{what} at {url} is unreachable: {getattr(exc, 'reason', exc)}") from None


def _influxql_post(stack: Stack, statement: str) -> dict[str, Any]:
    """One InfluxQL statement through InfluxDB 1.x's /query (POST, as statements that write need)."""
    headers = {"Content-Type": "application/x-www-form-urlencoded"}
    if stack.username and stack.password:
        basic = base64.b64encode(f"{stack.username}:{stack.password}".encode()).decode()
        headers["Authorization"] = f"Basic {basic}"
    data = urllib.parse.urlencode({"q": statement}).encode()
    request = urllib.request.Request(f"{stack.influx_url}/query", data=data, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            payload = json.loads(response.read() or b"{}")
    except urllib.error.HTTPError as exc:
        body = exc.read().decode("utf-8", "replace")
        try:
            payload = json.loads(body)
        except ValueError:
            payload = {"error": body.strip() or f"HTTP {exc.code}"}
    except (urllib.error.URLError, OSError, ValueError) as exc:
        return {"error": str(getattr(exc, "reason", exc))}
    results = payload.get("results") or [{}]
    return {"error": payload.get("error") or results[0].get("error"), "series": results[0].get("series") or []}


def ensure_database(stack: Stack) -> None:
    """InfluxDB 1.x: make sure the database exists before the fleet writes to it.

    InfluxDB 1.x refuses every point written to a missing database ("database not
    found"), so the run would only flood it with refusals. The database is
    created when the credentials allow it (an admin, or no auth); otherwise the run
    stops here with one sentence saying what to do.
    """
    if stack.api_version != 1 or stack.backend != "influxdb":
        return
    listed = _influxql_post(stack, "SHOW DATABASES")
    names = {row[0] for series in listed["series"] for row in series.get("values") or [] if row}
    if not listed["error"] and stack.database in names:
        return
    quoted = stack.database.replace("\\", "\\\\").replace('"', '\\"')
    created = _influxql_post(stack, f'CREATE DATABASE "{quoted}"')
    if created["error"]:
        reason = created["error"] or listed["error"]
        raise UsageError(
            f"InfluxDB at {without_userinfo(stack.influx_url)} has no database {stack.database!r} and these "
            f"credentials cannot create it ({reason}): create it as an admin "
            f'(CREATE DATABASE "{stack.database}") or pass --influxdb-database with an existing one.'
        )


def check_client_config(targets: fl.Targets) -> None:
    """Build a client as the nodes will, so a configuration error stops the run here, not in a worker."""
    from telemetry_client import ConfigurationError
    from telemetry_client.loki import push_url
    from telemetry_client.metrics import MetricsLogger

    try:
        MetricsLogger(
            url=targets.influx_url,
            database=targets.database,
            token=targets.token,
            org=targets.org,
            api_version=targets.api_version,
            username=targets.username,
            password=targets.password,
            self_metrics_interval=None,
        ).close(0.1)
        if targets.loki_url:
            push_url(targets.loki_url)
    except ConfigurationError as exc:
        raise UsageError(str(exc)) from None


def without_userinfo(url: str | None) -> str | None:
    """A URL as the report may show it: user and password removed."""
    if not url:
        return url
    parts = urllib.parse.urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    netloc = parts.hostname or ""
    if ":" in netloc:
        netloc = f"[{netloc}]"
    if parts.port is not None:
        netloc += f":{parts.port}"
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def public_settings(args: argparse.Namespace, stack: Stack, run: fl.RunIdentity) -> dict[str, Any]:
    """What the report records about the run's configuration: no secret, ever."""
    return {
        "nodes": {
            "miner": args.miners,
            "validator": args.validators,
            "aggregator": args.aggregators,
            "evaluator": args.evaluators,
        },
        "points_per_sec": args.points_per_sec,
        "lines_per_sec": args.lines_per_sec,
        "duration": args.duration,
        "ramp": args.ramp,
        "processes": args.processes,
        "window_seconds": args.window_seconds,
        "seed": run.seed,
        "metrics_backend": stack.backend,
        "influxdb_url": without_userinfo(stack.influx_url),
        "victoriametrics_url": without_userinfo(stack.victoria_url),
        "influxdb_database": stack.database,
        "influxdb_api_version": stack.api_version,
        "loki_url": without_userinfo(stack.loki_url),
        "edge_audit": args.edge_audit,
        "backup_status": args.backup_status,
        "grafana_url": without_userinfo(stack.grafana.url) if stack.grafana else None,
        "dashboards": str(args.dashboards),
        "datasources": sorted(selected_datasources(args, stack)),
        "min_interval": args.min_interval,
    }


LineCounter = Callable[[dash.TimeRange], Mapping[str, int]]


@dataclass(frozen=True)
class _Unconfigured:
    """Stands in for a data source the run has no address for."""

    message: str

    def run(self, query: dash.Query, text: str, window: dash.TimeRange, interval: timedelta) -> vd.Outcome:
        return vd.Outcome(vd.ERROR, self.message)


def runners_for(stack: Stack, selected: Sequence[str]) -> dict[str, vd.Runner]:
    runners: dict[str, vd.Runner] = {}
    if stack.grafana is not None:
        through = vd.ThroughGrafana(stack.grafana)
        return {kind: through for kind in selected}
    if stack.metrics_datasource in selected:
        runners[stack.metrics_datasource] = promql(stack) if stack.backend == "victoriametrics" else influxql(stack)
    if "loki" in selected:
        runners["loki"] = (
            lokiql(stack.loki_read_url, stack.loki_org_id)
            if stack.loki_read_url
            else _Unconfigured("no Loki URL: set --loki-url or LOKI_URL, or leave Loki out with --datasource influxdb")
        )
    return runners


def lokiql(url: str, org_id: str | None = None) -> vd.LokiQL:
    """Loki's query API with the client's own credentials (LOKI_USERNAME/PASSWORD or BEARER_TOKEN, TENANT_ID).

    `org_id`, when given, is the X-Scope-OrgID instead of LOKI_TENANT_ID: the tenants the queries read.
    """
    headers: list[tuple[str, str]] = []
    user, password, bearer = _env("LOKI_USERNAME"), _env("LOKI_PASSWORD"), _env("LOKI_BEARER_TOKEN")
    if user and password:
        headers.append(("Authorization", "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()))
    elif bearer:
        headers.append(("Authorization", f"Bearer {bearer}"))
    tenants = org_id or _env("LOKI_TENANT_ID")
    if tenants:
        headers.append(("X-Scope-OrgID", tenants))
    return vd.LokiQL(url, tuple(headers))


def promql(stack: Stack) -> vm.PromQL:
    """VictoriaMetrics' Prometheus query API, with the read credentials and force-flush key of the environment."""
    flush_key = _env("VICTORIAMETRICS_FORCE_FLUSH_AUTH_KEY") or ""
    return vm.PromQL(stack.victoria_url or stack.influx_url, stack.victoria_headers, flush_key=flush_key)


def selected_datasources(args: argparse.Namespace, stack: Stack) -> list[str]:
    """The data source types to validate: as chosen, else the metrics backend's and Loki."""
    return list(args.datasource or (stack.metrics_datasource, "loki"))


def influxql(stack: Stack) -> vd.InfluxQL:
    return vd.InfluxQL.for_server(
        stack.influx_url,
        stack.database,
        token=stack.read_token,
        username=stack.username,
        password=stack.password,
    )


def execute(args: argparse.Namespace, line_counter: LineCounter | None = None) -> int:
    """Run the fleet, validate and report; returns the exit code.

    `line_counter` replaces the LogQL count of stored lines (per level) where the
    Loki endpoint cannot answer queries, e.g. a conformance receiver in tests.
    """
    stack = resolve_stack(args)
    if stack.victoria_url:
        check_reachable(f"{stack.victoria_url}/api/v1/labels", "VictoriaMetrics")
    if stack.backend == "influxdb":
        check_reachable(f"{stack.influx_url}/ping", "InfluxDB")
    else:
        # Every VictoriaMetrics server answers /health at its root (VictoriaMetrics v1.136.0
        # lib/httpserver/httpserver.go, builtinRoutesHandler); a cluster's vminsert knows no
        # /insert/<tenant>/influx/ping and logs each such request.
        check_reachable(f"{stack.influx_url.split('/insert/', 1)[0]}/health", "the metrics write URL")
    args.dashboards = args.dashboards or DASHBOARD_DIRS[stack.backend]
    args.alerting = args.alerting or al.ALERTING_DIRS[stack.backend]
    if not args.no_validate and not args.dashboards.is_dir():
        raise UsageError(f"--dashboards {args.dashboards} is not a directory")
    run = fl.RunIdentity(args.run_id or f"sim-{secrets.token_hex(4)}", args.network, args.seed)
    counts = fl.role_counts(args.miners, args.validators, args.aggregators, args.evaluators)
    specs = fl.build_specs(counts, args.seed)
    if not specs:
        raise UsageError("the fleet is empty: give at least one of --miners, --validators, --aggregators, --evaluators")
    if args.edge_audit and not stack.loki_url:
        raise UsageError("--edge-audit needs Loki: give --loki-url")
    if args.loki_tenant_per_node:
        # Every node's tenant, and the edge's when the run writes its audit stream (as Grafana's data source reads).
        tenants = [spec.uid for spec in specs] + ([audit.EDGE_TENANT] if args.edge_audit else [])
        stack = replace(stack, loki_org_id="|".join(tenants))
    faults = resolve_faults(args, specs, stack)
    plan = replace(fl.plan_for(specs, args.points_per_sec, args.window_seconds, args.duration), faults=tuple(faults))
    targets = fl.Targets(
        influx_url=stack.influx_url,
        database=stack.database,
        api_version=stack.api_version,
        token=stack.token,
        org=stack.org,
        username=stack.username,
        password=stack.password,
        loki_url=stack.loki_url,
        loki_tenant_per_node=args.loki_tenant_per_node,
        system_interval=args.system_interval,
        self_metrics_interval=args.self_metrics_interval,
    )
    check_client_config(targets)
    ensure_database(stack)
    lines_per_sec = args.lines_per_sec if stack.loki_url else 0.0  # no Loki, no log lines
    settings = load.LoadSettings(
        args.points_per_sec, lines_per_sec, args.duration, args.ramp, args.processes, args.close_timeout
    )
    with load.ProgressView(settings, enabled=load.progress_enabled(args.quiet)) as progress:
        fleet = load.run_fleet(specs, run, plan, targets, settings, progress)
    if args.edge_audit:
        try:
            edge.push(stack.loki_url or "", edge.requests(specs, faults, fleet.started_ns, fleet.load_seconds))
        except RuntimeError as exc:
            fleet.errors.append(str(exc))

    if args.backup_status:
        try:
            max_age = float(al.run_settings(fleet.load_seconds, args.window_seconds)["ALERT_BACKUP_MAX_AGE_SECONDS"])
            bk.write(
                stack.influx_url,
                stack.database,
                bk.reports(faults, fleet.started_ns, fleet.load_seconds, max_age),
                api_version=stack.api_version,
                token=stack.token,
                org=stack.org,
                username=stack.username,
                password=stack.password,
            )
        except RuntimeError as exc:
            fleet.errors.append(str(exc))

    if not args.no_validate and stack.backend == "victoriametrics" and stack.grafana is not None:
        wait_until_visible(fleet.ended_ns / 1e9 + args.victoriametrics_latency_offset, args.quiet)
    checks: list[vd.QueryCheck] = []
    delivery: list[vd.DeliveryRow] = []
    alerts: list[al.AlertCheck] = []
    if not args.no_validate:
        window = dash.TimeRange(
            datetime.fromtimestamp(fleet.started_ns / 1e9 - 1, UTC),
            datetime.fromtimestamp(fleet.ended_ns / 1e9 + 1, UTC),
        )
        selected = selected_datasources(args, stack)
        dashboards = dash.load_dashboards(args.dashboards)
        uids = vd.datasource_uids(dashboards)
        # Counting first: it waits (up to --settle) until the stores show every record,
        # so the dashboards then query everything the fleet sent.
        delivery = account_delivery(stack, fleet, window, args.settle, line_counter, uids)
        runners = runners_for(stack, selected)
        if not args.edge_audit and "loki" in runners:
            runners["loki"] = vd.SkipWhere(runners["loki"], edge.reads_audit, edge.WITHOUT_AUDIT)
        if not args.backup_status and stack.metrics_datasource in runners:
            runners[stack.metrics_datasource] = vd.SkipWhere(
                runners[stack.metrics_datasource], bk.reads_backups, bk.WITHOUT_BACKUPS
            )
        checks = vd.check_dashboards(
            dashboards,
            runners,
            window,
            run.network,
            min_interval=timedelta(seconds=args.min_interval),
            through_grafana=stack.grafana is not None,
        )
        alerts = evaluate_alerts(args, stack, fleet, faults, selected, uids)

    report = rp.build_report(public_settings(args, stack, run), fleet, checks, delivery, alerts, faults)
    if args.report:
        rp.write_json(report, args.report)
    if not args.quiet:
        rp.print_report(report, verbose=args.verbose)
    return report["summary"]["exit_code"]


def wait_until_visible(at: float, quiet: bool) -> None:
    """Sleep until the epoch time `at`, when the store shows the run's last samples to Grafana."""
    delay = at - time.time()
    if delay > 0:
        if not quiet:
            print(f"waiting {delay:.0f} s until VictoriaMetrics shows the last samples to Grafana", file=sys.stderr)
        time.sleep(delay)


REFUSED_URL = "http://127.0.0.1:1"  # nothing listens on port 1: a store that refuses connections


def resolve_faults(args: argparse.Namespace, specs: Sequence[fl.NodeSpec], stack: Stack) -> list[ft.ActiveFault]:
    """The --fault flags for this fleet, each with enough of the run left to be noticed."""
    try:
        parsed = [ft.Fault.parse(text) for text in args.fault]
        faults = ft.resolve(parsed, {s.uid: s.role for s in specs}, args.duration)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if faults and args.duration < al.MIN_RUN_SECONDS:
        raise UsageError(f"faults need a load of {al.MIN_RUN_SECONDS:g} s or more to be judged (--duration)")
    for fault in faults:
        needed = al.fault_needs_seconds(fault.kind, args.window_seconds)
        if args.duration - fault.at < needed:
            raise UsageError(
                f"fault {fault.kind} starts at {fault.at:g}s: the rules need {needed:g} s of it before the load "
                f"ends at {args.duration:g}s; start it earlier or run longer"
            )
        if fault.kind in ("error-burst", "loki-down") and not stack.loki_url:
            raise UsageError(f"fault {fault.kind} needs Loki: give --loki-url")
        if fault.kind in ft.EDGE_FAULTS and not args.edge_audit:
            raise UsageError(f"fault {fault.kind} needs the edge's audit stream: give --edge-audit")
        if fault.kind in ft.BACKUP_FAULTS and not args.backup_status:
            raise UsageError(f"fault {fault.kind} needs the stack's backup reports: give --backup-status")
    return faults


def evaluate_alerts(
    args: argparse.Namespace,
    stack: Stack,
    fleet: load.FleetResult,
    faults: Sequence[ft.ActiveFault],
    selected: Sequence[str],
    uids: Mapping[str, str],
) -> list[al.AlertCheck]:
    """Every provisioned rule, evaluated where the load ended, with the run's settings."""
    ended_ms = int((fleet.started_ns + fleet.load_seconds * 1e9) / 1e6)
    sources: dict[str, Any] = {}
    if stack.grafana is not None:
        wide = dash.TimeRange(
            datetime.fromtimestamp(fleet.started_ns / 1e9 - 3600, UTC), datetime.fromtimestamp(ended_ms / 1e3 + 60, UTC)
        )
        sources["influxdb"] = vd.GrafanaInfluxQL(stack.grafana, uids.get("influxdb", "influxdb"), wide)
        sources["prometheus"] = vm.GrafanaPromQL(stack.grafana, uids.get("prometheus", "victoriametrics"))
        sources["loki"] = vd.GrafanaLogQL(stack.grafana, uids.get("loki", "loki"))
    else:
        sources["influxdb"] = influxql(stack)
        sources["prometheus"] = promql(stack)
        sources["loki"] = lokiql(stack.loki_read_url, stack.loki_org_id) if stack.loki_read_url else None
    kinds = {f.kind for f in faults}
    if "metrics-down" in kinds:
        sources["influxdb"], sources["prometheus"] = vd.InfluxQL(REFUSED_URL, stack.database), vm.PromQL(REFUSED_URL)
    if "loki-down" in kinds:
        sources["loki"] = vd.LokiQL(REFUSED_URL)
    for kind in ("influxdb", "prometheus"):
        if kind not in selected or kind != stack.metrics_datasource:
            sources[kind] = None
    if "loki" not in selected or not stack.loki_url:
        sources["loki"] = None
    try:
        rules = al.load_rules(al.run_settings(fleet.load_seconds, args.window_seconds), args.alerting)
    except (OSError, ValueError, KeyError) as exc:
        raise UsageError(f"cannot read the alert rules in {args.alerting}: {exc}") from None
    checks = al.evaluate(
        rules, sources["influxdb"], sources["loki"], ended_ms, faults, fleet.load_seconds, sources["prometheus"]
    )
    if not args.edge_audit:
        al.skip_where(rules, checks, edge.reads_audit, edge.WITHOUT_AUDIT)
    if not args.backup_status:
        al.skip_where(rules, checks, bk.reads_backups, bk.WITHOUT_BACKUPS)
    return checks


def metrics_counter(
    stack: Stack, fleet: load.FleetResult, wide: dash.TimeRange, uids: Mapping[str, str]
) -> Callable[[Sequence[str]], Mapping[str, int]]:
    """What counts the metrics store's points for the run: straight at the store, or through Grafana."""
    run_id = fleet.run.run_id
    if stack.backend == "victoriametrics":
        prom: vm.PromQL | vm.GrafanaPromQL = promql(stack)
        if stack.grafana is not None:
            prom = vm.GrafanaPromQL(stack.grafana, uids.get("prometheus", "victoriametrics"))
        return lambda keys: vm.stored_counts(prom, run_id, wide, keys)
    influx: vd.InfluxQL | vd.GrafanaInfluxQL = influxql(stack)
    if stack.grafana is not None:
        influx = vd.GrafanaInfluxQL(stack.grafana, uids.get("influxdb", "influxdb"), wide)
    return lambda keys: vd.influx_counts(influx, run_id, wide, keys)


def account_delivery(
    stack: Stack,
    fleet: load.FleetResult,
    window: dash.TimeRange,
    settle: float,
    line_counter: LineCounter | None = None,
    uids: Mapping[str, str] | None = None,
) -> list[vd.DeliveryRow]:
    """Sent (client counters) against stored, per measurement and per log level.

    Counts go straight to InfluxDB and Loki, or through Grafana when it is given
    (`uids`: the data source uid per type, as the dashboards name them).
    """
    uids = uids or {}
    # Timestamps come from the nodes' clocks; a minute of slack either side costs nothing.
    wide = dash.TimeRange(window.start - timedelta(minutes=1), window.end + timedelta(minutes=1))
    loki: vd.LokiQL | vd.GrafanaLogQL | None = (
        lokiql(stack.loki_read_url, stack.loki_org_id) if stack.loki_read_url else None
    )
    if stack.grafana is not None:  # count through Grafana too: its credentials are all the run needs
        loki = vd.GrafanaLogQL(stack.grafana, uids.get("loki", "loki"))
    rows = vd.account(
        stack.backend, fleet.metrics.get("sent_by_key") or {}, metrics_counter(stack, fleet, wide, uids), settle
    )
    if stack.backend == "victoriametrics":
        for row in rows:
            if row.stored is not None and row.stored > row.sent and not row.message:
                # InfluxDB keeps one point per series and time; VictoriaMetrics keeps every copy.
                row.message = (
                    f"{row.stored - row.sent} more stored than sent: VictoriaMetrics keeps both copies of a batch "
                    "the client sent again after a timeout the server had outlived"
                )
    sent_lines = vd.lines_by_level(fleet.logs.get("sent_by_key") or {})
    if sent_lines:
        if line_counter is not None:
            counter: Callable[[Sequence[str]], Mapping[str, int]] = lambda _keys: line_counter(wide)  # noqa: E731
        elif loki is not None:
            counter = lambda _keys: vd.loki_line_counts(loki, fleet.run.network, fleet.run.run_id, wide)  # noqa: E731
        else:
            counter = lambda _keys: {}  # noqa: E731
        rows += [
            vd.DeliveryRow(row.store, f"lines level={row.key}", row.sent, row.stored, row.message)
            for row in vd.account("loki", sent_lines, counter, settle)
        ]
    return rows


def main(argv: Sequence[str] | None = None, line_counter: LineCounter | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return execute(args, line_counter)
    except UsageError as exc:
        print(f"{parser.prog}: error: {exc}", file=sys.stderr)
        return rp.EXIT_USAGE
    except KeyboardInterrupt:
        print(f"{parser.prog}: interrupted", file=sys.stderr)
        return 130
