"""A local stand-in for Grafana's `POST /api/ds/query`, backed by a real InfluxDB 1.x.

Grafana cannot run here, so the simulator's Grafana path is tested against this
receiver, which follows Grafana's documented request and response format:

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
  whole answer is HTTP 400, as Grafana answers without the multi-status feature.
"""

from __future__ import annotations

import base64
import json
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

from simulator import dashboards as dash

_RELATIVE = re.compile(r"^now(?:-(\d+)([smhdw]))?$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


@dataclass(frozen=True)
class InfluxSource:
    """A provisioned InfluxDB (InfluxQL) data source."""

    url: str
    database: str
    min_interval: timedelta = timedelta(seconds=10)
    type: str = "influxdb"


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
        datasources: dict[str, InfluxSource],
        *,
        token: str | None = None,
        basic_auth: tuple[str, str] | None = None,
    ) -> None:
        if not token and not basic_auth:
            raise ValueError("a Grafana receiver needs credentials (token or basic_auth), as Grafana does")
        self.datasources = datasources
        self.token = token
        self.basic_auth = basic_auth
        self._state = _State()
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None

    def __enter__(self) -> GrafanaReceiver:
        server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        server.daemon_threads = True
        server.receiver = self  # type: ignore[attr-defined]
        self._server = server
        threading.Thread(target=server.serve_forever, name="grafana-receiver", daemon=True).start()
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
    try:
        with urllib.request.urlopen(f"{source.url}/query", data=data, timeout=60) as response:
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
        if self.path == "/api/health":
            self._send(200, {"database": "ok", "version": "13.2.1"})
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
