"""A local stand-in for Grafana's `POST /api/ds/query`, backed by a real InfluxDB 1.x and the Loki receiver.

Grafana cannot run here, so the simulator's Grafana path is tested against this
receiver, which follows Grafana's documented request and response format. The
grafana/grafana paths cited below are of release 13.2.1 (versions.env,
GRAFANA_IMAGE); the grafana/loki ones were read at tag v3.7.6, of the 3.7 line
whose 3.7.8 versions.env pins (LOKI_IMAGE):

* authentication: `Authorization: Bearer <service account token>` or basic auth;
  anything else is answered 401 `{"message": "Unauthorized"}`;
* request: `{"queries": [{"refId", "datasource": {"uid", "type"}, "query",
  "rawQuery", "resultFormat", "intervalMs", "maxDataPoints"}], "from", "to"}`
  with from/to as epoch milliseconds (strings or numbers) or `now`, `now-5m`...;
  a datasource uid that is not provisioned is answered 404;
* Grafana's InfluxQL backend fills in the macros `$timeFilter` (`time >= <from>ms
  and time <= <to>ms`), `$__interval`, `$interval`, `$__interval_ms`, with the
  interval never below the data source's min interval (`timeInterval`), and runs
  the query through InfluxDB's `/query` (POST, as `httpMode: POST` provisions it);
* response: `{"results": {refId: {"status": 200, "frames": [...]}}}`, one data
  frame per series for `time_series` (a Time field and a Value field carrying the
  series' tags as labels), one frame with every column for `table`; a failing
  query gets `{"error": ..., "errorSource": "downstream", "status": 400}` and the
  whole answer is HTTP 400, as Grafana answers without the multi-status feature;
* Loki data sources are answered from the entries a tests/loki_receiver.py
  receiver accepted, by the small LogQL evaluator at the end of this module
  (Grafana's Loki backend fills in `$__auto`, `$__interval` and `$__range`); the
  same evaluator serves Loki's own query API (`/loki/api/v1/query_range`,
  `/loki/api/v1/query`, `/loki/api/v1/label/<name>/values`), so the simulator's
  direct Loki path is tested too. Tenants are resolved as Loki's querier does
  (grafana/loki v3.7 pkg/querier/multi_tenant_querier.go): with the receiver's
  `auth_enabled`, the query's `X-Scope-OrgID` (the data source's provisioned
  header, or the request's on the direct path) names the tenants, `|`-separated;
  none is "no org id"; several need `multi_tenant_queries_enabled` (else dskit's
  "multiple org IDs present"). One tenant reads that tenant alone, labels as
  stored. Several: matchers on `__tenant_id__` choose the tenants and are removed
  from the selector (filterValuesByMatchers; one on `original___tenant_id__`
  matches the stream's own label), each tenant's result gets `__tenant_id__` after
  its pipeline (an existing one becomes `original___tenant_id__`: relabel), and the
  label values of `__tenant_id__` are the header's tenants (Label);
* what `make doctor` reads, each behind the same authentication:
  `GET /api/datasources/uid/<uid>/health` (grafana/grafana `pkg/api/api.go` routes it to
  `CheckDatasourceHealthWithUID`, `pkg/api/datasources.go`: 200 `{"status": "OK",
  "message"}` when the plugin's CheckHealth passes, 400 `{"status": "ERROR", "message"}`
  when it fails, 500 `{"message": "Unable to load datasource metadata"}` for an unknown
  uid); the InfluxDB source's check runs `SHOW MEASUREMENTS` on its database, the Loki
  source's check reaches the receiver (the messages are this receiver's own), the
  Prometheus source's check (a VictoriaMetrics) runs the instant query `1+1` at t=4 s and
  answers "Successfully queried the Prometheus API." or "<error> - There was an error
  returned querying the Prometheus API." (grafana/grafana `pkg/promlib/healthcheck.go`);
  `GET /api/search` (the provisioned dashboards: `uid`, `title`, `type: "dash-db"`,
  `folderUid`; `type=`/`query=` filter them) and `GET /api/v1/provisioning/alert-rules`
  (the provisioned rules as given, a JSON array), as Grafana's HTTP API reference
  (docs/sources/developers/http_api/) describes them.
"""

from __future__ import annotations

import base64
import json
import math
import re
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from loki_receiver import SINGLE_TENANT, tenant_ids

from simulator import dashboards as dash

_RELATIVE = re.compile(r"^now(?:-(\d+)([smhdw]))?$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
# Lines a Loki query returns when it names no limit (grafana/loki v3.7.6 pkg/loghttp/params.go, defaultQueryLimit).
LOKI_DEFAULT_QUERY_LIMIT = 100


@dataclass(frozen=True)
class InfluxSource:
    """A provisioned InfluxDB (InfluxQL) data source."""

    url: str
    database: str
    min_interval: timedelta = timedelta(seconds=10)
    type: str = "influxdb"
    # Sent with every query, as the provisioned httpHeaderName1/httpHeaderValue1 (the read token) are.
    headers: tuple[tuple[str, str], ...] = ()


# The X-Scope-OrgID Grafana's Loki data source sends in production (the grafana role's
# LOKI_TENANTS) for a simulated fleet: every uid the simulator gives (0 up), and the edge's
# tenant. Tenants nothing was pushed into answer nothing, as in Loki.
SIMULATED_FLEET_ORG_ID = "|".join([*(str(uid) for uid in range(512)), "_edge"])


@dataclass(frozen=True)
class LokiSource:
    """A provisioned Loki data source, answered from what a LokiReceiver accepted."""

    receiver: Any  # tests/loki_receiver.LokiReceiver
    type: str = "loki"
    # The provisioned X-Scope-OrgID (httpHeaderName1/httpHeaderValue1): tenants joined by "|".
    org_id: str | None = None


@dataclass(frozen=True)
class PrometheusSource:
    """A provisioned Prometheus-type data source (a VictoriaMetrics): its health check and its queries.

    `min_interval` is the data source's `timeInterval` (scrape interval), the floor of
    the step Grafana computes.
    """

    url: str
    type: str = "prometheus"
    min_interval: timedelta = timedelta(seconds=10)


@dataclass
class SeenQuery:
    """One query as the receiver got it, and what it ran."""

    ref_id: str
    datasource_uid: str
    raw: str
    executed: str
    status: int


@dataclass
class _State:
    queries: list[SeenQuery] = field(default_factory=list)
    authorizations: list[str] = field(default_factory=list)


class GrafanaReceiver:
    """A threaded HTTP server on 127.0.0.1 implementing /api/ds/query and /api/health."""

    def __init__(
        self,
        datasources: dict[str, InfluxSource | LokiSource | PrometheusSource],
        *,
        token: str | None = None,
        basic_auth: tuple[str, str] | None = None,
        dashboards: list[dict[str, Any]] | None = None,
        alert_rules: list[dict[str, Any]] | None = None,
    ) -> None:
        if not token and not basic_auth:
            raise ValueError("a Grafana receiver needs credentials (token or basic_auth), as Grafana does")
        self.datasources = datasources
        self.token = token
        self.basic_auth = basic_auth
        self.dashboards = list(dashboards or [])
        self.alert_rules = list(alert_rules or [])
        self._state = _State()
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None

    def __enter__(self) -> GrafanaReceiver:
        server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        server.daemon_threads = True
        server.receiver = self  # type: ignore[attr-defined]
        self._server = server
        # shutdown() waits for the poll interval: the default 0.5 s would end every test late.
        threading.Thread(target=server.serve_forever, args=(0.02,), name="grafana-receiver", daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    @property
    def queries(self) -> list[SeenQuery]:
        with self._lock:
            return list(self._state.queries)

    @property
    def authorizations(self) -> list[str]:
        with self._lock:
            return list(self._state.authorizations)

    # ---- request handling ------------------------------------------------------

    def authorized(self, header: str) -> bool:
        with self._lock:
            self._state.authorizations.append(header)
        if self.token and header == f"Bearer {self.token}":
            return True
        if self.basic_auth:
            expected = "Basic " + base64.b64encode(":".join(self.basic_auth).encode()).decode()
            return header == expected
        return False

    def ds_query(self, body: Any) -> tuple[int, dict[str, Any]]:
        if not isinstance(body, dict) or not isinstance(body.get("queries"), list) or not body["queries"]:
            return 400, {"message": "bad request data: queries must be a non-empty list"}
        try:
            start, end = parse_time(body.get("from", "now-6h")), parse_time(body.get("to", "now"))
        except ValueError as exc:
            return 400, {"message": f"bad request data: {exc}"}
        window = dash.TimeRange(start, end)
        results: dict[str, Any] = {}
        failed = False
        for query in body["queries"]:
            ref_id = str(query.get("refId") or "A")
            uid = str((query.get("datasource") or {}).get("uid") or "")
            source = self.datasources.get(uid)
            if source is None:
                return 404, {"message": "Data source not found"}
            if isinstance(source, LokiSource):
                result = self._logql(ref_id, uid, source, query, window)
            elif isinstance(source, PrometheusSource):
                result = self._promql(ref_id, uid, source, query, window)
            else:
                result = self._influxql(ref_id, uid, source, query, window)
            failed = failed or "error" in result
            results[ref_id] = result
        return (400 if failed else 200), {"results": results}

    def _influxql(
        self, ref_id: str, uid: str, source: InfluxSource, query: dict[str, Any], window: dash.TimeRange
    ) -> dict[str, Any]:
        raw = str(query.get("query") or "")
        if not query.get("rawQuery") or not raw:
            return self._error(ref_id, uid, raw, raw, "this receiver runs raw InfluxQL queries only")
        max_points = int(query.get("maxDataPoints") or 1000)
        floor = max(source.min_interval, timedelta(milliseconds=int(query.get("intervalMs") or 0)))
        interval = dash.auto_interval(window, max_points, floor)
        try:
            executed = dash.expand_influxql(raw, window, {}, interval=interval)
        except KeyError as exc:  # a template variable the client did not fill in
            executed = raw
            return self._error(ref_id, uid, raw, executed, f"error parsing query: found {exc.args[0]}")
        try:
            payload = influx_query(source, executed)
        except RuntimeError as exc:
            return self._error(ref_id, uid, raw, executed, str(exc))
        table = query.get("resultFormat") == "table"
        frames = table_frames(ref_id, executed, payload) if table else series_frames(ref_id, executed, payload)
        with self._lock:
            self._state.queries.append(SeenQuery(ref_id, uid, raw, executed, 200))
        return {"status": 200, "frames": frames}

    def _logql(
        self, ref_id: str, uid: str, source: LokiSource, query: dict[str, Any], window: dash.TimeRange
    ) -> dict[str, Any]:
        raw = str(query.get("expr") or "")
        # Grafana's Loki backend takes the interval the request names (intervalMs, 1 s when
        # absent: grafana/grafana pkg/services/query/query.go parseMetricRequest) as it is,
        # with no minimum; the step is that interval, at least range / 11,000, rounded up
        # to the millisecond (pkg/tsdb/loki/step.go calculateStep).
        interval = timedelta(milliseconds=int(query.get("intervalMs") or 1000))
        try:
            executed = dash.expand_logql(raw, window, {}, interval=interval)
            instant = query.get("queryType") == "instant"
            step_ms = math.ceil(max(interval, window.duration / 11000) / timedelta(milliseconds=1))
            step = None if instant else step_ms / 1000
            start_ns, end_ns = window.start_ms * 1_000_000, window.end_ms * 1_000_000
            view = tenant_view(source.receiver, source.org_id)
            # Grafana's backend sends maxLines as `limit`, and no limit when the query has
            # none (grafana/grafana pkg/tsdb/loki/api.go makeDataRequest); Loki then
            # returns 100 lines (LOKI_DEFAULT_QUERY_LIMIT).
            limit = int(query.get("maxLines") or LOKI_DEFAULT_QUERY_LIMIT)
            data = logql_query(executed, source.receiver.entries, start_ns, end_ns, step, limit, view)
        except TenantError as exc:
            return self._error(ref_id, uid, raw, raw, str(exc))
        except (KeyError, LogQLError, re.error) as exc:
            return self._error(ref_id, uid, raw, raw, f"parse error: {exc}")
        with self._lock:
            self._state.queries.append(SeenQuery(ref_id, uid, raw, executed, 200))
        return {"status": 200, "frames": loki_frames(ref_id, data)}

    def _promql(
        self, ref_id: str, uid: str, source: PrometheusSource, query: dict[str, Any], window: dash.TimeRange
    ) -> dict[str, Any]:
        """Grafana's Prometheus backend (pkg/promlib): the macros filled in, then query or query_range.

        models/query.go: a query is instant when `instant` is set and a range query
        otherwise; the step is the interval (never below the data source's
        timeInterval), the range's start and end aligned down to it; $__interval,
        $__range, $__rate_interval... interpolated. The answer is converted as
        converter/prom.go does (testdata/prom-vector-frame.jsonc): one frame per
        series, a Time field and a Value field labelled with the whole metric,
        NaN written as null.
        """
        raw = str(query.get("expr") or "")
        max_points = int(query.get("maxDataPoints") or 1000)
        interval = dash.auto_interval(window, max_points, source.min_interval)
        try:
            executed = dash.expand_metricsql(raw, window, {}, interval=interval)
        except KeyError as exc:  # a template variable the client did not fill in
            return self._error(ref_id, uid, raw, raw, f"bad_data: unknown variable {exc.args[0]}")
        if query.get("instant"):
            path, params = "/api/v1/query", {"query": executed, "time": dash.prometheus_time(window.end_ms)}
        else:
            path, params = "/api/v1/query_range", {"query": executed, **dash.prometheus_range(window, interval)}
        data = urllib.parse.urlencode(params).encode()
        try:
            with urllib.request.urlopen(source.url.rstrip("/") + path, data=data, timeout=60) as response:
                body = json.loads(response.read())
        except urllib.error.HTTPError as exc:
            text = exc.read().decode(errors="replace")
            try:
                message = json.loads(text).get("error") or text
            except ValueError:
                message = text
            return self._error(ref_id, uid, raw, executed, str(message))
        except (urllib.error.URLError, OSError) as exc:
            return self._error(ref_id, uid, raw, executed, str(exc))
        with self._lock:
            self._state.queries.append(SeenQuery(ref_id, uid, raw, executed, 200))
        return {"status": 200, "frames": prometheus_frames(ref_id, executed, body.get("data") or {})}

    def loki_api(self, path: str, params: dict[str, str], org_id: str | None = None) -> tuple[int, Any]:
        """Loki's own query API (query_range, query, label values) over the first Loki source."""
        source = next((s for s in self.datasources.values() if isinstance(s, LokiSource)), None)
        if source is None:
            return 404, "404 page not found\n"
        entries = source.receiver.entries
        now_ns = time.time_ns()
        try:
            view = tenant_view(source.receiver, org_id)
        except TenantError as exc:
            return exc.status, f"{exc}\n"
        try:
            end = int(params.get("end") or params.get("time") or now_ns)
            start = int(params.get("start") or end - 3600 * 10**9)
            limit = int(params.get("limit") or 100)
            if path == "/loki/api/v1/query_range":
                step = parse_duration(params["step"]) if "step" in params else max(1.0, (end - start) / 1e9 / 250)
                data = logql_query(params["query"], entries, start, end, step, limit, view)
            elif path == "/loki/api/v1/query":
                data = logql_query(params["query"], entries, end, end, None, limit, view)
            elif path.startswith("/loki/api/v1/label/") and path.endswith("/values"):
                label = path[len("/loki/api/v1/label/") : -len("/values")]
                return 200, {
                    "status": "success",
                    "data": label_values(label, params.get("query", ""), entries, start, end, view),
                }
            else:
                return 404, "404 page not found\n"
        except KeyError as exc:
            return 400, f"missing parameter {exc}\n"
        except (LogQLError, ValueError, re.error) as exc:
            return 400, f"{exc}\n"
        with self._lock:
            self._state.queries.append(SeenQuery("", "loki-api", params.get("query", ""), params.get("query", ""), 200))
        return 200, {"status": "success", "data": data}

    def datasource_health(self, uid: str) -> tuple[int, dict[str, Any]]:
        """`GET /api/datasources/uid/<uid>/health`: run the source's own check, as Grafana's plugins do."""
        source = self.datasources.get(uid)
        if source is None:
            return 500, {"message": "Unable to load datasource metadata"}
        if isinstance(source, LokiSource):
            try:
                urllib.request.urlopen(source.receiver.base_url + "/loki/api/v1/push", timeout=10).close()
            except urllib.error.HTTPError:
                pass  # it answered: the push endpoint refuses a GET
            except (urllib.error.URLError, OSError) as exc:
                return 400, {"status": "ERROR", "message": f"Unable to connect with Loki: {exc}"}
            return 200, {"status": "OK", "message": "Data source successfully connected."}
        if isinstance(source, PrometheusSource):
            return _prometheus_health(source)
        try:
            results = influx_query(source, "SHOW MEASUREMENTS")
        except RuntimeError as exc:
            return 400, {"status": "ERROR", "message": f"error performing influxQL query: {exc}"}
        count = sum(len(s.get("values", [])) for r in results for s in r.get("series", []))
        return 200, {"status": "OK", "message": f"datasource is working. {count} measurements found"}

    def search(self, params: dict[str, str]) -> list[dict[str, Any]]:
        """`GET /api/search`: the provisioned dashboards (`type=dash-db` and `query=` narrow it)."""
        if params.get("type", "dash-db") != "dash-db":
            return []
        wanted = params.get("query", "").lower()
        return [
            {"uid": d.get("uid"), "title": d.get("title"), "type": "dash-db", "folderUid": d.get("folderUid", "")}
            for d in self.dashboards
            if wanted in str(d.get("title", "")).lower()
        ]

    def _error(self, ref_id: str, uid: str, raw: str, executed: str, message: str) -> dict[str, Any]:
        with self._lock:
            self._state.queries.append(SeenQuery(ref_id, uid, raw, executed, 400))
        return {"error": message, "errorSource": "downstream", "status": 400}


def parse_time(value: Any) -> datetime:
    """Epoch milliseconds (number or digits) or Grafana's relative `now`, `now-15m`."""
    text = str(value).strip()
    if text.isdigit():
        return datetime.fromtimestamp(int(text) / 1000, UTC)
    match = _RELATIVE.match(text)
    if match:
        back = int(match.group(1) or 0) * _UNITS.get(match.group(2) or "s", 1)
        return datetime.now(UTC) - timedelta(seconds=back)
    raise ValueError(f"cannot read time {text!r}")


def influx_query(source: InfluxSource, text: str) -> list[dict[str, Any]]:
    data = urllib.parse.urlencode({"db": source.database, "q": text, "epoch": "ms"}).encode()
    request = urllib.request.Request(f"{source.url}/query", data=data, headers=dict(source.headers))
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            payload = json.loads(response.read())
    except urllib.error.HTTPError as exc:
        raise RuntimeError(exc.read().decode("utf-8", "replace").strip()) from None
    except (urllib.error.URLError, OSError) as exc:
        raise RuntimeError(f"InfluxDB unreachable: {exc}") from None
    results = payload.get("results") or []
    for result in results:
        if result.get("error"):
            raise RuntimeError(str(result["error"]))
    return results


def _frame(ref_id: str, name: str, executed: str, fields: list[dict[str, Any]], values: list[list[Any]]) -> dict:
    return {
        "schema": {"name": name, "refId": ref_id, "meta": {"executedQueryString": executed}, "fields": fields},
        "data": {"values": values},
    }


_TIME_FIELD = {"name": "Time", "type": "time", "typeInfo": {"frame": "time.Time"}}


def series_frames(ref_id: str, executed: str, results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """time_series: one frame per series and value column, as Grafana's InfluxQL backend builds them."""
    frames = []
    for result in results:
        for series in result.get("series") or []:
            columns = series.get("columns") or []
            rows = series.get("values") or []
            tags = series.get("tags") or {}
            times = [row[0] for row in rows]
            for index, column in enumerate(columns[1:], start=1):
                tag_text = ", ".join(f"{k}: {v}" for k, v in sorted(tags.items()))
                name = f"{series.get('name', '')}.{column}" + (f" {{{tag_text}}}" if tag_text else "")
                value_field = {
                    "name": "Value",
                    "type": "number",
                    "typeInfo": {"frame": "float64", "nullable": True},
                    "labels": tags,
                    "config": {"displayNameFromDS": name},
                }
                values = [row[index] for row in rows]
                frames.append(_frame(ref_id, name, executed, [_TIME_FIELD, value_field], [times, values]))
    return frames


def table_frames(ref_id: str, executed: str, results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """table: one frame, tags as string columns, then the series' columns."""
    tag_names: list[str] = []
    columns: list[str] = []
    for result in results:
        for series in result.get("series") or []:
            for key in series.get("tags") or {}:
                if key not in tag_names:
                    tag_names.append(key)
            for column in series.get("columns") or []:
                if column not in columns:
                    columns.append(column)
    names = ["Time" if c == "time" else c for c in columns[:1]] + tag_names + columns[1:]
    values: list[list[Any]] = [[] for _ in names]
    for result in results:
        for series in result.get("series") or []:
            tags = series.get("tags") or {}
            own = series.get("columns") or []
            for row in series.get("values") or []:
                record = dict(zip(own, row, strict=False))
                cells = [record.get(columns[0]) if columns else None]
                cells += [tags.get(t) for t in tag_names] + [record.get(c) for c in columns[1:]]
                for column_values, cell in zip(values, cells, strict=True):
                    column_values.append(cell)
    fields = []
    for position, name in enumerate(names):
        if position == 0 and name == "Time":
            fields.append(_TIME_FIELD)
        elif name in tag_names:
            fields.append({"name": name, "type": "string", "typeInfo": {"frame": "string", "nullable": True}})
        else:
            fields.append({"name": name, "type": "number", "typeInfo": {"frame": "float64", "nullable": True}})
    return [_frame(ref_id, "", executed, fields, values)] if any(values) else []


def _number(value: Any) -> float | None:
    number = float(value)
    return None if math.isnan(number) else number


def prometheus_frames(ref_id: str, executed: str, data: dict[str, Any]) -> list[dict[str, Any]]:
    """A Prometheus answer as Grafana's frames: per series a Time field and a labelled Value field."""
    kind, result = data.get("resultType"), data.get("result") or []
    if kind == "scalar":
        result = [{"metric": {}, "value": result}]
    frames = []
    for series in result if kind in ("matrix", "vector", "scalar") else []:
        points = series.get("values") or ([series["value"]] if "value" in series else [])
        value_field = {
            "name": "Value",
            "type": "number",
            "typeInfo": {"frame": "float64", "nullable": True},
            "labels": dict(series.get("metric") or {}),
        }
        times = [int(float(t) * 1000) for t, _ in points]
        values = [_number(v) for _, v in points]
        frames.append(_frame(ref_id, "", executed, [_TIME_FIELD, value_field], [times, values]))
    return frames


def _prometheus_health(source: PrometheusSource) -> tuple[int, dict[str, Any]]:
    """Grafana's Prometheus CheckHealth: `1+1` as an instant query (POST, as `httpMethod: POST` provisions it)."""
    failed = "There was an error returned querying the Prometheus API."
    data = urllib.parse.urlencode({"query": "1+1", "time": "4"}).encode()
    try:
        with urllib.request.urlopen(source.url.rstrip("/") + "/api/v1/query", data=data, timeout=30) as response:
            body = json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return 400, {"status": "ERROR", "message": f"{exc.code} {exc.read().decode(errors='replace')} - {failed}"}
    except (urllib.error.URLError, OSError, ValueError) as exc:
        return 400, {"status": "ERROR", "message": f"{exc} - {failed}"}
    if body.get("status") != "success":
        return 400, {"status": "ERROR", "message": f"{body.get('error')} - {failed}"}
    return 200, {"status": "OK", "message": "Successfully queried the Prometheus API."}


class _Handler(BaseHTTPRequestHandler):
    server_version = "Grafana"

    def log_message(self, format: str, *args: Any) -> None:  # keep test output quiet
        pass

    def _send(self, status: int, payload: Any) -> None:
        body = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        receiver: GrafanaReceiver = self.server.receiver  # type: ignore[attr-defined]
        parsed = urllib.parse.urlsplit(self.path)
        if parsed.path == "/api/health":
            self._send(200, {"database": "ok", "version": "13.2.1"})
        elif parsed.path.startswith(("/api/datasources/", "/api/search", "/api/v1/provisioning/")):
            if not receiver.authorized(self.headers.get("Authorization", "")):
                self._send(401, {"message": "Unauthorized"})
                return
            health = re.fullmatch(r"/api/datasources/uid/([^/]+)/health", parsed.path)
            if health:
                self._send(*receiver.datasource_health(urllib.parse.unquote(health.group(1))))
            elif parsed.path == "/api/search":
                self._send(200, receiver.search(dict(urllib.parse.parse_qsl(parsed.query))))
            elif parsed.path == "/api/v1/provisioning/alert-rules":
                self._send(200, receiver.alert_rules)
            else:
                self._send(404, {"message": "Not found"})
        elif parsed.path.startswith("/loki/api/v1/"):
            params = dict(urllib.parse.parse_qsl(parsed.query))
            status, payload = receiver.loki_api(parsed.path, params, self.headers.get("X-Scope-OrgID"))
            if isinstance(payload, str):
                body = payload.encode()
                self.send_response(status)
                self.send_header("Content-Type", "text/plain; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
            else:
                self._send(status, payload)
        else:
            self._send(404, {"message": "Not found"})

    def do_POST(self) -> None:
        receiver: GrafanaReceiver = self.server.receiver  # type: ignore[attr-defined]
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length)
        if self.path.split("?")[0] != "/api/ds/query":
            self._send(404, {"message": "Not found"})
            return
        if not receiver.authorized(self.headers.get("Authorization", "")):
            self._send(401, {"message": "Unauthorized"})
            return
        if self.headers.get("Content-Type", "").split(";")[0].strip() != "application/json":
            self._send(400, {"message": "bad request data: Content-Type must be application/json"})
            return
        try:
            body = json.loads(raw)
        except ValueError:
            self._send(400, {"message": "bad request data"})
            return
        started = time.monotonic()
        status, payload = receiver.ds_query(body)
        self.log_message("ds/query %s in %.3fs", status, time.monotonic() - started)
        self._send(status, payload)


# ---------------------------------------------------------------- LogQL over the Loki receiver
#
# A small LogQL evaluator, enough for the dashboards' queries and the simulator's
# count: stream selectors (=, !=, =~, !~; regexes fully anchored; `__tenant_id__`
# as Loki's querier takes it, TenantView above), line filters
# (|=, !=, |~, !~), `| json` (optionally with name="field" parameters), label
# filters (name op "value", __error__ included), count_over_time and rate over
# [range], sum/count/max/min/avg with `by (...)`, topk(k, ...) and `/` between two
# vectors. Anything else is a parse error, reported as Loki would report one.

_TOKEN = re.compile(
    r'\s*(?:(?P<string>"(?:\\.|[^"\\])*"|`[^`]*`)|(?P<range>\[[^\]]+\])|(?P<number>\d+(?:\.\d+)?)'
    r"|(?P<ident>[A-Za-z_][A-Za-z0-9_]*)|(?P<op>\|=|\|~|!=|!~|=~|[{}(),|=/]))"
)
_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w)")
_DURATION_S = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_VECTOR_OPS = {"sum", "count", "max", "min", "avg"}


class LogQLError(ValueError):
    """A query this evaluator (or Loki) cannot parse."""


class TenantError(Exception):
    """A query Loki refuses for its tenants, with the status it answers."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


TENANT_LABEL = "__tenant_id__"  # multi_tenant_querier.go defaultTenantLabel
_RETAINED_TENANT_LABEL = "original_" + TENANT_LABEL  # retainExistingPrefix


@dataclass(frozen=True)
class TenantView:
    """The tenants one query reads. `tenants` None: a Loki without auth_enabled (the one tenant, all entries)."""

    tenants: tuple[str, ...] | None = None
    multi_tenant: bool = False  # multi_tenant_queries_enabled: the MultiTenantQuerier answers

    def scope(self, matchers: list[tuple[str, str, str]]) -> tuple[set[str] | None, list[tuple[str, str, str]], bool]:
        """(tenants read or None for all, the matchers left for the streams, whether results get the tenant label)."""
        if self.tenants is None:
            return None, matchers, False
        if len(self.tenants) == 1:
            return set(self.tenants), matchers, False
        chosen, rest = set(self.tenants), []
        for name, op, value in matchers:  # filterValuesByMatchers
            if name == TENANT_LABEL:
                chosen = {t for t in chosen if _match(op, t, value)}
            elif name == _RETAINED_TENANT_LABEL:
                rest.append((TENANT_LABEL, op, value))
            else:
                rest.append((name, op, value))
        return chosen, rest, True

    def label_values(self) -> list[str] | None:
        """What the label values of `__tenant_id__` are, when the MultiTenantQuerier answers them (Label)."""
        if not self.multi_tenant:
            return None
        return list(self.tenants) if self.tenants is not None else [SINGLE_TENANT]


ALL_TENANTS = TenantView()


def tenant_view(receiver: Any, org_id: str | None) -> TenantView:
    """The tenants a query with this X-Scope-OrgID reads on `receiver`, or the error Loki answers."""
    multi = bool(getattr(receiver, "multi_tenant_queries_enabled", False))
    if not getattr(receiver, "auth_enabled", False):
        return TenantView(None, multi)
    if not org_id:
        raise TenantError(401, "no org id")  # dskit middleware/http_auth.go, user/id.go ErrNoOrgID
    try:
        ids = tenant_ids(org_id)
    except ValueError as exc:
        raise TenantError(400, str(exc)) from None
    if len(ids) > 1 and not multi:
        raise TenantError(400, "multiple org IDs present")  # dskit user/id.go ErrTooManyOrgIDs
    return TenantView(tuple(ids), multi)


def parse_duration(text: str) -> float:
    parts = _DURATION.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise LogQLError(f"parse error: invalid duration {text!r}")
    return sum(float(n) * _DURATION_S[u] for n, u in parts)


def _tokens(text: str) -> list[tuple[str, str]]:
    out, position = [], 0
    while position < len(text):
        if text[position:].strip() == "":
            break
        match = _TOKEN.match(text, position)
        if not match or match.end() == position:
            raise LogQLError(f"parse error at position {position}: unexpected {text[position : position + 10]!r}")
        kind = match.lastgroup or ""
        value = match.group(kind)
        if kind == "string":
            value = json.loads(value) if value.startswith('"') else value[1:-1]
        elif kind == "range":
            value = value[1:-1].strip()
        out.append((kind, value))
        position = match.end()
    return out


@dataclass
class _Log:
    matchers: list[tuple[str, str, str]]
    stages: list[tuple[str, Any]]


@dataclass
class _Node:
    kind: str  # "log", "range", "agg", "topk", "div", "number", "label_replace"
    args: dict[str, Any]


class _Parser:
    def __init__(self, text: str) -> None:
        self.items = _tokens(text)
        self.i = 0

    def peek(self, offset: int = 0) -> tuple[str, str]:
        j = self.i + offset
        return self.items[j] if j < len(self.items) else ("end", "")

    def take(self, kind: str | None = None, value: str | None = None) -> str:
        got_kind, got = self.peek()
        if (kind and got_kind != kind) or (value is not None and got != value):
            raise LogQLError(f"parse error: expected {value or kind}, found {got or got_kind!r}")
        self.i += 1
        return got

    def parse(self) -> _Node:
        node = self.expr()
        if self.peek()[0] != "end":
            raise LogQLError(f"parse error: unexpected {self.peek()[1]!r}")
        return node

    def expr(self) -> _Node:
        node = self.term()
        while self.peek() == ("op", "/"):
            self.take()
            node = _Node("div", {"left": node, "right": self.term()})
        return node

    def _by(self) -> list[str] | None:
        if self.peek() != ("ident", "by"):
            return None
        self.take()
        self.take("op", "(")
        labels = []
        while self.peek() != ("op", ")"):
            labels.append(self.take("ident"))
            if self.peek() == ("op", ","):
                self.take()
        self.take("op", ")")
        return labels

    def term(self) -> _Node:
        kind, value = self.peek()
        if kind == "number":
            self.take()
            return _Node("number", {"value": float(value)})
        if kind == "op" and value == "{":
            return _Node("log", {"log": self.log_expr()})
        if kind == "ident" and value in ("count_over_time", "rate"):
            self.take()
            self.take("op", "(")
            log = self.log_expr()
            duration = parse_duration(self.take("range"))
            self.take("op", ")")
            return _Node("range", {"fn": value, "log": log, "range": duration})
        if kind == "ident" and value in _VECTOR_OPS:
            self.take()
            by = self._by()
            self.take("op", "(")
            inner = self.expr()
            self.take("op", ")")
            by = by if by is not None else self._by()
            return _Node("agg", {"fn": value, "by": by, "inner": inner})
        if kind == "ident" and value == "label_replace":
            self.take()
            self.take("op", "(")
            inner = self.expr()
            args = []
            for _ in range(4):
                self.take("op", ",")
                args.append(self.take("string"))
            self.take("op", ")")
            dst, replacement, src, regex = args
            return _Node("label_replace", {"inner": inner, "dst": dst, "replacement": replacement,
                                           "src": src, "regex": regex})  # fmt: skip
        if kind == "ident" and value == "topk":
            self.take()
            self.take("op", "(")
            k = int(float(self.take("number")))
            self.take("op", ",")
            inner = self.expr()
            self.take("op", ")")
            return _Node("topk", {"k": k, "inner": inner})
        if kind == "op" and value == "(":
            self.take()
            node = self.expr()
            self.take("op", ")")
            return node
        raise LogQLError(f"parse error: unexpected {value or kind!r}")

    def log_expr(self) -> _Log:
        self.take("op", "{")
        matchers = []
        while self.peek() != ("op", "}"):
            name = self.take("ident")
            op = self.take("op")
            if op not in ("=", "!=", "=~", "!~"):
                raise LogQLError(f"parse error: bad matcher operator {op!r}")
            matchers.append((name, op, self.take("string")))
            if self.peek() == ("op", ","):
                self.take()
        self.take("op", "}")
        if not matchers:
            raise LogQLError("parse error: queries require at least one regexp or equality matcher")
        stages: list[tuple[str, Any]] = []
        while True:
            kind, value = self.peek()
            if kind == "op" and value in ("|=", "!=", "|~", "!~"):
                self.take()
                stages.append(("line", (value, self.take("string"))))
            elif (kind, value) == ("op", "|") and self.peek(1) == ("ident", "json"):
                self.take()
                self.take()
                params = {}
                while self.peek()[0] == "ident" and self.peek(1) == ("op", "="):
                    name = self.take()
                    self.take()
                    params[name] = self.take("string")
                    if self.peek() == ("op", ","):
                        self.take()
                stages.append(("json", params))
            elif (kind, value) == ("op", "|") and self.peek(1)[0] == "ident":
                self.take()
                name = self.take("ident")
                op = self.take("op")
                if op not in ("=", "!=", "=~", "!~"):
                    raise LogQLError(f"parse error: bad label filter operator {op!r}")
                stages.append(("label", (name, op, self.take("string"))))
            else:
                return _Log(matchers, stages)


def _match(op: str, actual: str, expected: str) -> bool:
    if op == "=":
        return actual == expected
    if op == "!=":
        return actual != expected
    found = re.fullmatch(expected, actual, re.DOTALL) is not None
    return found if op in ("=~", "|~") else not found


def _flatten(prefix: str, value: Any, out: dict[str, str]) -> None:
    if isinstance(value, dict):
        for key, inner in value.items():
            _flatten(f"{prefix}_{key}" if prefix else str(key), inner, out)
    elif isinstance(value, list):
        out[prefix] = json.dumps(value)
    elif value is not None:
        out[prefix] = value if isinstance(value, str) else json.dumps(value)


def _run_log(
    log: _Log, entries: list[Any], lo_ns: int, hi_ns: int, view: TenantView = ALL_TENANTS
) -> list[tuple[dict[str, str], int, str]]:
    """Entries in (lo, hi] of the view's tenants through the selector and the pipeline: (labels, ts, line)."""
    out = []
    tenants, matchers, relabel = view.scope(log.matchers)
    for entry in entries:
        if not lo_ns < entry.ts <= hi_ns:
            continue
        if tenants is not None and entry.tenant not in tenants:
            continue
        labels = dict(entry.labels)
        if not all(_match(op, labels.get(name, ""), value) for name, op, value in matchers):
            continue
        keep = True
        for stage, spec in log.stages:
            if stage == "line":
                op, text = spec
                if op == "|=":
                    keep = text in entry.line
                elif op == "!=":
                    keep = text not in entry.line
                else:
                    keep = (re.search(text, entry.line) is not None) == (op == "|~")
            elif stage == "json":
                try:
                    body = json.loads(entry.line)
                    extracted: dict[str, str] = {}
                    if spec:
                        for name, path in spec.items():
                            if isinstance(body, dict) and path in body:
                                _flatten(name, body[path], extracted)
                    elif isinstance(body, dict):
                        _flatten("", body, extracted)
                    for name, value in extracted.items():
                        # grafana/loki pkg/logql/log/parser.go (2.x-3.x): a parsed key that is already a
                        # stream label gets duplicateSuffix "_extracted" (the JSON `level` is `level_extracted`).
                        labels[f"{name}_extracted" if name in entry.labels else name] = value
                except ValueError:
                    labels["__error__"] = "JSONParserErr"
            else:
                name, op, value = spec
                keep = _match(op, labels.get(name, ""), value)
            if not keep:
                break
        if keep:
            if relabel:  # after the tenant's own query, pipeline included (TenantEntryIterator)
                if TENANT_LABEL in labels:
                    labels[_RETAINED_TENANT_LABEL] = labels.pop(TENANT_LABEL)
                labels[TENANT_LABEL] = entry.tenant
            out.append((labels, entry.ts, entry.line))
    return out


Vector = dict[tuple[tuple[str, str], ...], float]


def _key(labels: dict[str, str]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((k, v) for k, v in labels.items() if k != "__error__" or v))


def _instant(node: _Node, entries: list[Any], at_ns: int, view: TenantView = ALL_TENANTS) -> Vector | float:
    if node.kind == "number":
        return node.args["value"]
    if node.kind == "range":
        span = node.args["range"]
        found: Vector = {}
        for labels, _, _ in _run_log(node.args["log"], entries, at_ns - int(span * 1e9), at_ns, view):
            key = _key(labels)
            found[key] = found.get(key, 0.0) + 1.0
        if node.args["fn"] == "rate":
            found = {k: v / span for k, v in found.items()}
        return found
    if node.kind == "agg":
        inner = _instant(node.args["inner"], entries, at_ns, view)
        if not isinstance(inner, dict):
            raise LogQLError("parse error: aggregation of a scalar")
        groups: dict[tuple[tuple[str, str], ...], list[float]] = {}
        by = node.args["by"]
        for key, value in inner.items():
            group = tuple((k, v) for k, v in key if by is not None and k in by)
            groups.setdefault(group, []).append(value)
        fn = node.args["fn"]
        reduce = {"sum": sum, "count": len, "max": max, "min": min, "avg": lambda v: sum(v) / len(v)}[fn]
        return {group: float(reduce(values)) for group, values in groups.items()}
    if node.kind == "topk":
        inner = _instant(node.args["inner"], entries, at_ns, view)
        if not isinstance(inner, dict):
            raise LogQLError("parse error: topk of a scalar")
        ranked = sorted(inner.items(), key=lambda item: -item[1])[: node.args["k"]]
        return dict(ranked)
    if node.kind == "div":
        left = _instant(node.args["left"], entries, at_ns, view)
        right = _instant(node.args["right"], entries, at_ns, view)
        if isinstance(left, dict) and isinstance(right, dict):
            return {k: v / right[k] for k, v in left.items() if right.get(k)}
        if isinstance(left, dict):
            return {k: v / right for k, v in left.items()} if right else {}
        if isinstance(right, dict):
            return {k: left / v for k, v in right.items() if v}
        return left / right if right else math.nan
    if node.kind == "label_replace":
        inner = _instant(node.args["inner"], entries, at_ns, view)
        if not isinstance(inner, dict):
            raise LogQLError("parse error: label_replace of a scalar")
        return _label_replace(inner, **{k: v for k, v in node.args.items() if k != "inner"})
    raise LogQLError("parse error: a log query is not a metric query")


def _label_replace(vector: Vector, dst: str, replacement: str, src: str, regex: str) -> Vector:
    """Prometheus' label_replace, which LogQL has (grafana/loki pkg/logql/syntax LabelReplaceExpr).

    The regex must match the whole source value (an absent label is ""); the
    replacement's $1 / ${1} name its groups; an empty result removes `dst`; no
    match leaves the series as it is.
    """
    pattern = re.compile(regex)
    template = re.sub(r"\$\{?(\w+)\}?", lambda m: "\\g<" + m.group(1) + ">", replacement)
    out: Vector = {}
    for key, value in vector.items():
        labels = dict(key)
        found = pattern.fullmatch(labels.get(src, ""))
        if found is not None:
            new = found.expand(template)
            if new:
                labels[dst] = new
            else:
                labels.pop(dst, None)
        out[_key(labels)] = value
    return out


def logql_query(text: str, entries: list[Any], start_ns: int, end_ns: int, step_s: float | None,
                limit: int = 1000, view: TenantView = ALL_TENANTS) -> dict[str, Any]:  # fmt: skip
    """Loki's `data` for a query over the view's tenants: streams for a log query; a matrix (step) or a vector."""
    node = _Parser(text).parse()
    if node.kind == "log":
        lines = _run_log(node.args["log"], entries, start_ns - 1, end_ns, view)
        lines.sort(key=lambda item: -item[1])
        streams: dict[tuple[tuple[str, str], ...], list[list[str]]] = {}
        for labels, ts, line in lines[:limit]:
            streams.setdefault(_key(labels), []).append([str(ts), line])
        result = [{"stream": dict(key), "values": values} for key, values in streams.items()]
        return {"resultType": "streams", "result": result}
    if step_s is None:
        value = _instant(node, entries, end_ns, view)
        if not isinstance(value, dict):
            return {"resultType": "scalar", "result": [end_ns / 1e9, str(value)]}
        return {
            "resultType": "vector",
            "result": [{"metric": dict(k), "value": [end_ns / 1e9, str(v)]} for k, v in value.items()],
        }
    series: dict[tuple[tuple[str, str], ...], list[list[Any]]] = {}
    step_ns = max(1, int(step_s * 1e9))
    at = start_ns
    while at <= end_ns:
        value = _instant(node, entries, at, view)
        for key, number in value.items() if isinstance(value, dict) else [((), value)]:
            series.setdefault(key, []).append([at / 1e9, str(number)])
        at += step_ns
    return {"resultType": "matrix", "result": [{"metric": dict(k), "values": v} for k, v in series.items()]}


def label_values(
    label: str, stream: str, entries: list[Any], start_ns: int, end_ns: int, view: TenantView = ALL_TENANTS
) -> list[str]:
    """/loki/api/v1/label/<label>/values over the view's tenants, optionally narrowed by a stream selector."""
    if label == TENANT_LABEL and (tenants := view.label_values()) is not None:
        return tenants  # MultiTenantQuerier.Label answers these before looking at any stream
    matchers = _Parser(stream).log_expr().matchers if stream else []
    chosen, matchers, _ = view.scope(matchers)
    selected = [
        e
        for e in entries
        if (chosen is None or e.tenant in chosen) and all(_match(op, e.labels.get(n, ""), v) for n, op, v in matchers)
    ]
    return sorted({e.labels[label] for e in selected if label in e.labels and start_ns <= e.ts <= end_ns})


def loki_frames(ref_id: str, data: dict[str, Any]) -> list[dict[str, Any]]:
    """Grafana's data frames for a Loki answer: one per series, or one log frame with Time and Line."""
    frames = []
    if data["resultType"] == "streams":
        times, lines, labels = [], [], []
        for stream in data["result"]:
            for ts, line in stream["values"]:
                times.append(int(ts) // 1_000_000)
                lines.append(line)
                labels.append(stream["stream"])
        if times:
            fields = [
                {"name": "labels", "type": "other", "typeInfo": {"frame": "json.RawMessage"}},
                _TIME_FIELD,
                {"name": "Line", "type": "string", "typeInfo": {"frame": "string"}},
            ]
            frames.append(_frame(ref_id, "", "", fields, [labels, times, lines]))
        return frames
    rows = data["result"]
    if data["resultType"] == "vector":
        rows = [{"metric": r["metric"], "values": [r["value"]]} for r in rows]
    elif data["resultType"] == "scalar":
        rows = [{"metric": {}, "values": [data["result"]]}]
    for row in rows:
        value_field = {"name": "Value", "type": "number", "typeInfo": {"frame": "float64"}, "labels": row["metric"]}
        times = [int(float(t) * 1000) for t, _ in row["values"]]
        values = [float(v) for _, v in row["values"]]
        frames.append(_frame(ref_id, "", "", [_TIME_FIELD, value_field], [times, values]))
    return frames
