"""Validation: run every dashboard query over the run's time window, and account for every record.

Panels: each target of each provisioned dashboard (and each template variable's
query) is filled in with the run's values (network = the run's network, every
other variable "All") and Grafana's macros over the run's window, then run the
way Grafana would run it: through Grafana's `/api/ds/query`, or straight at
InfluxDB (`/query`, InfluxQL) and Loki (`/loki/api/v1/query_range`). A query is
OK when it returned at least one value, EMPTY when it returned none, ERROR with
the server's message otherwise, SKIPPED when its data source was not selected or
when another target of its panel is the one that answers (a panel pairs targets
for raw and downsampled data, and for the fleet and chosen nodes).

Delivery: what the fleet's clients counted as delivered (`sent_by_key`) against
what the stores hold for the run (scoped by the run's `runtime_id` prefix for
InfluxDB, by the run id in each line's body for Loki). Any difference is loss.
"""

from __future__ import annotations

import json
import math
import re
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import timedelta
from typing import Any, Protocol

from simulator import dashboards as dash
from simulator.grafana_api import GrafanaClient, GrafanaError, frame_values

OK, EMPTY, ERROR, SKIPPED = "OK", "EMPTY", "ERROR", "SKIPPED"
MAX_DATA_POINTS = 1000
# The Loki data source's lines per query where neither the target nor the data
# source sets maxLines (grafana/grafana public/app/plugins/datasource/loki/datasource.ts).
LOKI_DEFAULT_MAX_LINES = 1000
# Grafana's own macros: left in place when Grafana runs the query (its backend fills them in).
GRAFANA_MACROS = re.compile(
    r"\$(?:\{)?(timeFilter|__timeFilter|__interval_ms|__interval|interval|__range_ms|__range_s|__range"
    r"|__from|__to|__auto|__rate_interval)\b(?:\})?"
)


@dataclass
class Outcome:
    status: str
    message: str = ""
    series: int = 0
    values: int = 0


@dataclass
class QueryCheck:
    """The result of one dashboard query."""

    dashboard: str
    dashboard_title: str
    kind: str  # "panel" or "variable"
    title: str
    panel_id: int | None
    ref_id: str
    datasource: str
    status: str
    message: str
    series: int
    values: int
    query: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class Runner(Protocol):
    """Runs one interpolated query and says what came back."""

    def run(self, query: dash.Query, text: str, window: dash.TimeRange, interval: timedelta) -> Outcome: ...


# ---------------------------------------------------------------- HTTP


def _http(url: str, data: dict[str, str] | None, headers: Mapping[str, str], timeout: float) -> tuple[int, bytes]:
    body = urllib.parse.urlencode(data).encode() if data is not None else None
    request = urllib.request.Request(url, data=body, method="POST" if body is not None else "GET")
    for key, value in headers.items():
        request.add_header(key, value)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def _message(raw: bytes) -> str:
    text = raw.decode("utf-8", "replace").strip()
    try:
        payload = json.loads(text)
    except ValueError:
        return text[:500]
    if isinstance(payload, dict):
        return str(payload.get("error") or payload.get("message") or payload)[:500]
    return text[:500]


@dataclass(frozen=True)
class InfluxQL:
    """InfluxDB's /query endpoint (1.x, or 2.x/3.x through the v1-compatible API and a DBRP mapping)."""

    url: str
    database: str
    headers: tuple[tuple[str, str], ...] = ()
    timeout: float = 60.0

    @classmethod
    def for_server(
        cls,
        url: str,
        database: str,
        *,
        token: str | None = None,
        username: str | None = None,
        password: str | None = None,
    ) -> InfluxQL:
        """Auth as the client writes: a token (2.x/3.x: `Authorization: Token`) or 1.x basic auth."""
        headers: list[tuple[str, str]] = []
        if token:
            headers.append(("Authorization", f"Token {token}"))
        elif username and password:
            import base64

            basic = base64.b64encode(f"{username}:{password}".encode()).decode()
            headers.append(("Authorization", f"Basic {basic}"))
        return cls(url.rstrip("/"), database, tuple(headers))

    def query(self, text: str) -> list[dict[str, Any]]:
        """The statements' results; raises RuntimeError with InfluxDB's message on failure."""
        params = {"db": self.database, "q": text, "epoch": "ms"}
        try:
            status, raw = _http(f"{self.url}/query", params, dict(self.headers), self.timeout)
        except (urllib.error.URLError, OSError) as exc:
            raise RuntimeError(f"InfluxDB at {self.url} is unreachable: {exc}") from exc
        if status != 200:
            raise RuntimeError(f"HTTP {status}: {_message(raw)}")
        payload = json.loads(raw)
        if payload.get("error"):
            raise RuntimeError(str(payload["error"]))
        results = payload.get("results") or []
        for result in results:
            if result.get("error"):
                raise RuntimeError(str(result["error"]))
        return results

    def run(self, query: dash.Query, text: str, window: dash.TimeRange, interval: timedelta) -> Outcome:
        try:
            results = self.query(text)
        except (RuntimeError, ValueError) as exc:
            return Outcome(ERROR, str(exc))
        series = values = 0
        for result in results:
            for item in result.get("series") or []:
                series += 1
                columns = item.get("columns") or []
                for row in item.get("values") or []:
                    values += sum(1 for col, v in zip(columns, row, strict=False) if col != "time" and v is not None)
        return Outcome(OK if values else EMPTY, "" if values else "no values in the run's window", series, values)


@dataclass(frozen=True)
class LokiQL:
    """Loki's query API: query_range for range panels, query for instant ones, label values for variables."""

    url: str
    headers: tuple[tuple[str, str], ...] = ()
    timeout: float = 60.0
    # Lines per query where the target sets no maxLines: the Loki data source's
    # default (grafana/grafana public/app/plugins/datasource/loki/datasource.ts,
    # DEFAULT_MAX_LINES); a target's own maxLines wins (dash.Query.max_lines).
    max_lines: int = LOKI_DEFAULT_MAX_LINES

    def _get(self, path: str, params: dict[str, str]) -> Any:
        url = f"{self.url}{path}?{urllib.parse.urlencode(params)}"
        try:
            status, raw = _http(url, None, dict(self.headers), self.timeout)
        except (urllib.error.URLError, OSError) as exc:
            raise RuntimeError(f"Loki at {self.url} is unreachable: {exc}") from exc
        if status != 200:
            raise RuntimeError(f"HTTP {status}: {_message(raw)}")
        payload = json.loads(raw)
        if payload.get("status") not in (None, "success"):
            raise RuntimeError(str(payload.get("error") or payload))
        return payload.get("data")

    def instant(self, expr: str, at_ns: int, max_lines: int | None = None) -> Any:
        limit = str(max_lines or self.max_lines)
        return self._get("/loki/api/v1/query", {"query": expr, "time": str(at_ns), "limit": limit})

    def run(self, query: dash.Query, text: str, window: dash.TimeRange, interval: timedelta) -> Outcome:
        start_ns, end_ns = window.start_ms * 1_000_000, window.end_ms * 1_000_000
        try:
            label_values = _label_values_call(text)
            if label_values is not None:
                label, stream = label_values
                params = {"start": str(start_ns), "end": str(end_ns)}
                if stream:
                    params["query"] = stream
                data = self._get(f"/loki/api/v1/label/{label}/values", params) or []
                return Outcome(OK if data else EMPTY, "" if data else "no label values", 1, len(data))
            if query.instant:
                data = self.instant(text, end_ns, query.max_lines)
            else:
                params = {
                    "query": text,
                    "start": str(start_ns),
                    "end": str(end_ns),
                    "step": f"{max(interval.total_seconds(), 0.001):g}s",
                    "limit": str(query.max_lines or self.max_lines),
                    "direction": "backward",
                }
                data = self._get("/loki/api/v1/query_range", params)
        except (RuntimeError, ValueError) as exc:
            return Outcome(ERROR, str(exc))
        series, values = _loki_counts(data)
        return Outcome(OK if values else EMPTY, "" if values else "no values in the run's window", series, values)


@dataclass(frozen=True)
class SkipWhere:
    """A runner for a run that did not write some data: the queries `reads` picks are SKIPPED, the others run."""

    runner: Runner
    reads: Callable[[str], bool]
    reason: str

    def run(self, query: dash.Query, text: str, window: dash.TimeRange, interval: timedelta) -> Outcome:
        if self.reads(text):
            return Outcome(SKIPPED, self.reason)
        return self.runner.run(query, text, window, interval)


_LABEL_VALUES = re.compile(r"^\s*label_values\(\s*(?:(\{.*\})\s*,\s*)?([A-Za-z_]\w*)\s*\)\s*$")


def _label_values_call(text: str) -> tuple[str, str] | None:
    match = _LABEL_VALUES.match(text)
    return (match.group(2), match.group(1) or "") if match else None


def _loki_counts(data: Any) -> tuple[int, int]:
    """(series or streams, values or lines) of a Loki query result."""
    if not isinstance(data, dict):
        return 0, 0
    result = data.get("result") or []
    kind = data.get("resultType")
    if kind == "streams":
        return len(result), sum(len(s.get("values") or []) for s in result)
    if kind == "matrix":
        return len(result), sum(len(s.get("values") or []) for s in result)
    if kind == "vector":
        return len(result), len(result)
    if kind == "scalar":
        return 1, 1
    return 0, 0


@dataclass(frozen=True)
class ThroughGrafana:
    """Runs queries through Grafana's /api/ds/query, with Grafana's own macros left for its backend."""

    client: GrafanaClient

    def run(self, query: dash.Query, text: str, window: dash.TimeRange, interval: timedelta) -> Outcome:
        target: dict[str, Any] = {
            "refId": query.ref_id or "A",
            "datasource": {"type": query.datasource_type, "uid": query.datasource_uid},
            "intervalMs": int(interval.total_seconds() * 1000),
            "maxDataPoints": MAX_DATA_POINTS,
        }
        if query.datasource_type == "influxdb":
            target.update({"query": text, "rawQuery": True, "resultFormat": "table" if query.table else "time_series"})
        elif query.datasource_type == "loki":
            if _label_values_call(text) is not None:
                return Outcome(SKIPPED, "Loki variables are resolved by Grafana's resource API, not /api/ds/query")
            target.update({"expr": text, "queryType": "instant" if query.instant else "range"})
            # Grafana's front end fills in the data source's default where a target has none.
            target["maxLines"] = query.max_lines or LOKI_DEFAULT_MAX_LINES
        elif query.datasource_type == "prometheus":
            if query.source == "variable":
                return Outcome(SKIPPED, "Prometheus variables are resolved by Grafana's resource API, not ds/query")
            # pkg/promlib/models/query.go: `instant` or `range` (neither means range), `format`.
            target.update({"expr": text, "instant": query.instant, "range": not query.instant})
            target["format"] = "table" if query.table else "time_series"
        else:
            target["query"] = text
        try:
            results = self.client.query([target], window.start_ms, window.end_ms)
        except GrafanaError as exc:
            return Outcome(ERROR, str(exc))
        result = results.get(target["refId"]) or {}
        if result.get("error"):
            return Outcome(ERROR, str(result["error"]))
        status = result.get("status", 200)
        if isinstance(status, int) and status >= 400:
            return Outcome(ERROR, f"HTTP {status}")
        frames, values = frame_values(result)
        return Outcome(OK if values else EMPTY, "" if values else "no values in the run's window", frames, values)


# ---------------------------------------------------------------- panels


def protect_macros(text: str) -> tuple[str, list[str]]:
    """Hide Grafana's macros from variable interpolation (Grafana's backend fills them in)."""
    found: list[str] = []

    def hide(match: re.Match[str]) -> str:
        found.append(match.group(0))
        return f"\x00{len(found) - 1}\x00"

    return GRAFANA_MACROS.sub(hide, text), found


def restore_macros(text: str, found: Sequence[str]) -> str:
    return re.sub("\x00(\\d+)\x00", lambda m: found[int(m.group(1))], text)


def run_values(dashboard: dash.Dashboard, network: str) -> dict[str, dash.VariableValue]:
    """Variables as an operator opens the dashboard for this run: its network, everything else All."""
    values = dash.all_selected(dashboard)
    if "network" in values:
        values["network"] = network
    return values


def interpolate(
    query: dash.Query,
    dashboard: dash.Dashboard,
    values: Mapping[str, dash.VariableValue],
    window: dash.TimeRange,
    interval: timedelta,
    keep_macros: bool,
) -> str:
    """The query text as it is sent: variables always filled in, macros too unless Grafana does it."""
    if not keep_macros:
        return dash.expand(query, window, values, dashboard=dashboard, interval=interval)
    hidden, found = protect_macros(query.text)
    hidden_query = dash.Query(**{**asdict(query), "text": hidden})
    return restore_macros(dash.expand(hidden_query, window, values, dashboard=dashboard, interval=interval), found)


def check_dashboards(
    dashboards: Iterable[dash.Dashboard],
    runners: Mapping[str, Runner],
    window: dash.TimeRange,
    network: str,
    *,
    min_interval: timedelta = timedelta(seconds=10),
    through_grafana: bool = False,
    include_variables: bool = True,
    datasources: Mapping[str, str] | None = None,
) -> list[QueryCheck]:
    """Run every panel target (and variable query) of every dashboard; one check per query.

    `runners` maps a data source type (influxdb, loki) to what runs its queries; a
    type without a runner is reported SKIPPED.
    """
    interval = dash.auto_interval(window, MAX_DATA_POINTS, min_interval)
    checks: list[QueryCheck] = []
    for dashboard in dashboards:
        values = run_values(dashboard, network)
        queries = list(dash.panel_queries(dashboard, datasources))
        if include_variables:
            queries = list(dash.variable_queries(dashboard, datasources)) + queries
        for query in queries:
            text = query.text
            runner = runners.get(query.datasource_type)
            try:
                text = interpolate(query, dashboard, values, window, interval, through_grafana)
            except (KeyError, ValueError) as exc:
                outcome = Outcome(ERROR, f"cannot fill in the query: {exc}")
            else:
                if runner is None:
                    outcome = Outcome(SKIPPED, f"no {query.datasource_type or 'unknown'} data source selected")
                elif not dash.answers(query, window, values, dashboard=dashboard):
                    outcome = Outcome(SKIPPED, "another target of the panel answers for this range and selection")
                else:
                    outcome = runner.run(query, text, window, interval)
            checks.append(
                QueryCheck(
                    dashboard=query.dashboard_uid,
                    dashboard_title=query.dashboard_title,
                    kind=query.source,
                    title=query.name,
                    panel_id=query.panel_id,
                    ref_id=query.ref_id,
                    datasource=query.datasource_type,
                    status=outcome.status,
                    message=outcome.message,
                    series=outcome.series,
                    values=outcome.values,
                    query=text,
                )
            )
    return checks


# ---------------------------------------------------------------- delivery


@dataclass
class DeliveryRow:
    """One store and key (a measurement, or all log lines): sent by the clients against stored."""

    store: str
    key: str
    sent: int
    stored: int | None
    message: str = ""

    @property
    def lost(self) -> int | None:
        return None if self.stored is None else self.sent - self.stored

    @property
    def ok(self) -> bool:
        return self.stored is not None and self.stored == self.sent

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "lost": self.lost, "ok": self.ok}


def influx_counts(
    influx: InfluxQL | GrafanaInfluxQL, run_id: str, window: dash.TimeRange, measurements: Iterable[str]
) -> dict[str, int]:
    """Points stored per measurement for the run (its runtime_id prefix) within `window`.

    count(*) counts each field's non-null values; every point has at least one field,
    and the simulator always writes the same fields per measurement, so the largest
    column is the number of points.
    """
    run_filter = f'"runtime_id" =~ /^{dash.influx_regex_escape(run_id)}-/'
    time_filter = f"time >= {window.start_ms}ms AND time <= {window.end_ms}ms"
    counts: dict[str, int] = {}
    for name in sorted(set(measurements)):
        quoted = name.replace("\\", "\\\\").replace('"', '\\"')
        results = influx.query(f'SELECT count(*) FROM "{quoted}" WHERE {run_filter} AND {time_filter}')
        best = 0
        for result in results:
            for series in result.get("series") or []:
                for row in series.get("values") or []:
                    best = max([best, *(int(v) for v in row[1:] if isinstance(v, int | float))])
        counts[name] = best
    return counts


def loki_line_counts(loki: LokiQL | GrafanaLogQL, network: str, run_id: str, window: dash.TimeRange) -> dict[str, int]:
    """Log lines Loki holds for the run, per level: its network's streams, lines whose body names the run."""
    seconds = max(1, math.ceil((window.end_ms - window.start_ms) / 1000))
    expr = (
        f'sum by (level) (count_over_time({{environment="{_logql_string(network)}"}} '
        f'| json run_id="run_id" | run_id="{_logql_string(run_id)}" [{seconds}s]))'
    )
    data = loki.instant(expr, window.end_ms * 1_000_000)
    counts: dict[str, int] = {}
    for sample in (data or {}).get("result") or []:
        level = (sample.get("metric") or {}).get("level", "")
        value = sample.get("value") or [0, "0"]
        counts[level] = counts.get(level, 0) + int(float(value[1]))
    return counts


_LEVEL_IN_KEY = re.compile(r'(?:^|[{,]\s*)level="([^"]*)"')


def lines_by_level(sent_by_key: Mapping[str, int]) -> dict[str, int]:
    """The Loki channel counts delivered lines per stream (its selector text); sum them per level."""
    out: dict[str, int] = {}
    for key, count in sent_by_key.items():
        match = _LEVEL_IN_KEY.search(key)
        level = match.group(1) if match else ""
        out[level] = out.get(level, 0) + int(count)
    return out


@dataclass(frozen=True)
class GrafanaInfluxQL:
    """InfluxQL through Grafana's /api/ds/query, answering like InfluxDB's /query (for the counts).

    With only Grafana's credentials (a read-only setup) the accounting needs no
    InfluxDB token of its own.
    """

    client: GrafanaClient
    uid: str
    window: dash.TimeRange

    def query(self, text: str) -> list[dict[str, Any]]:
        target = {
            "refId": "A",
            "datasource": {"type": "influxdb", "uid": self.uid},
            "query": text,
            "rawQuery": True,
            "resultFormat": "table",
            "intervalMs": 1000,
            "maxDataPoints": MAX_DATA_POINTS,
        }
        result = _grafana_result(self.client, target, self.window.start_ms, self.window.end_ms)
        series = []
        for frame in result.get("frames") or []:
            names = [f.get("name", "") for f in (frame.get("schema") or {}).get("fields") or []]
            columns = (frame.get("data") or {}).get("values") or []
            series.append({"columns": names, "values": [list(row) for row in zip(*columns, strict=False)]})
        return [{"series": series}]


@dataclass(frozen=True)
class GrafanaLogQL:
    """LogQL instant queries through Grafana's /api/ds/query, answering like Loki's /query."""

    client: GrafanaClient
    uid: str

    def instant(self, expr: str, at_ns: int) -> dict[str, Any]:
        target = {
            "refId": "A",
            "datasource": {"type": "loki", "uid": self.uid},
            "expr": expr,
            "queryType": "instant",
            "intervalMs": 1000,
            "maxDataPoints": MAX_DATA_POINTS,
        }
        at_ms = at_ns // 1_000_000
        result = _grafana_result(self.client, target, at_ms - 1000, at_ms)
        vector = []
        for frame in result.get("frames") or []:
            fields = (frame.get("schema") or {}).get("fields") or []
            columns = (frame.get("data") or {}).get("values") or []
            for spec, column in zip(fields, columns, strict=False):
                values = [v for v in column if v is not None]
                if spec.get("type") == "number" and values:
                    vector.append({"metric": spec.get("labels") or {}, "value": [at_ms / 1000, str(values[-1])]})
        return {"resultType": "vector", "result": vector}


def _grafana_result(client: GrafanaClient, target: dict[str, Any], start_ms: int, end_ms: int) -> dict[str, Any]:
    try:
        results = client.query([target], start_ms, end_ms)
    except GrafanaError as exc:
        raise RuntimeError(str(exc)) from exc
    result = results.get("A") or {}
    if result.get("error"):
        raise RuntimeError(str(result["error"]))
    return result


def datasource_uids(dashboards: Iterable[dash.Dashboard]) -> dict[str, str]:
    """The data source uid the dashboards use for each type (the first one found)."""
    uids: dict[str, str] = {}
    for dashboard in dashboards:
        for query in dash.panel_queries(dashboard):
            if query.datasource_type and query.datasource_uid:
                uids.setdefault(query.datasource_type, query.datasource_uid)
    return uids


def _logql_string(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"')


def account(
    store: str,
    sent_by_key: Mapping[str, int],
    count_stored: Callable[[Sequence[str]], Mapping[str, int]],
    settle: float = 5.0,
) -> list[DeliveryRow]:
    """Compare sent with stored per key; re-count for up to `settle` seconds while anything is missing.

    Stores make acknowledged writes visible to queries after a short delay (Loki's
    ingesters, InfluxDB 3's query buffer); a difference that outlasts `settle` is loss.
    """
    keys = sorted(sent_by_key)
    deadline = time.monotonic() + settle
    while True:
        try:
            stored = dict(count_stored(keys))
            error = ""
        except (RuntimeError, ValueError, OSError) as exc:
            stored, error = {}, str(exc)
        complete = not error and all(stored.get(k, 0) >= sent_by_key[k] for k in keys)
        if complete or time.monotonic() >= deadline:
            break
        time.sleep(0.5)
    rows = []
    for key in keys:
        value = None if error else stored.get(key, 0)
        rows.append(DeliveryRow(store, key, int(sent_by_key[key]), value, error))
    return rows
