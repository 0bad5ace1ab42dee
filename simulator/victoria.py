"""VictoriaMetrics as the metrics store: its Prometheus query API, and what it holds of a run.

VictoriaMetrics takes MetricsLogger's InfluxDB line protocol (`/api/v2/write`) and
stores each numeric field as the metric `<measurement>_<field>`, tags as labels
(docs/VictoriaMetrics/Single-server-VictoriaMetrics.md, "How to send data from
InfluxDB-compatible agents"). The dashboards and alert rules for it are MetricsQL,
run through the Prometheus query API that a single node serves at its root and a
cluster's vmselect at `/select/<tenant>/prometheus`:

- `/api/v1/query_range` for range panels, `/api/v1/query` for instant ones, as
  Grafana's Prometheus data source sends them (grafana/grafana
  pkg/promlib/models/query.go: a target is instant when `instant` is set, a range
  query otherwise; the range's start and end are aligned down to the step);
- `/api/v1/label/<name>/values` (with `match[]`) and `/api/v1/labels` for the
  template variables' `label_values(...)` and `label_names()`, and an instant query
  for `query_result(...)` (public/app/plugins/datasource/prometheus/metric_find_query.ts).

VictoriaMetrics hides the newest samples from queries that end near "now" unless
asked not to (app/vmselect/prometheus/prometheus.go: an instant query's time is
moved back by `-search.latencyOffset`, 30 s by default, unless `nocache=1`; a range
query's points within that offset are replaced by the one before, unless
`latency_offset` says otherwise, which releases after 1.79 honour). The simulator
validates right after its load, so it sends `nocache=1` and the smallest
`latency_offset` there is (FRESH): what it checks is the data, not the store's
display delay.
"""

from __future__ import annotations

import json
import math
import re
import urllib.error
import urllib.parse
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Protocol

from simulator import dashboards as dash
from simulator.grafana_api import GrafanaClient
from simulator.validate import EMPTY, ERROR, MAX_DATA_POINTS, OK, Outcome, _grafana_result, _http, _message

# The query arguments that make just-written samples visible (see the module docstring).
# latency_offset must be 1 ms or more: v1.136.0 answers 0 with 422 "latency_offset=0ms is
# out of allowed range [1ms ... 3153600000000ms]" (VictoriaMetrics lib/httputil/duration.go,
# GetDuration, tag v1.136.0; its own vmalert-tool sends "1ms" with nocache=1 for the same
# purpose: app/vmalert-tool/unittest/recording.go). 1.79.5 ignores the argument.
FRESH = {"nocache": "1", "latency_offset": "1ms"}
# -search.latencyOffset's default: how long the newest samples stay hidden from queries without FRESH.
LATENCY_OFFSET_SECONDS = 30.0
# Grafana's Prometheus variable query forms (metric_find_query.ts).
_LABEL_NAMES = re.compile(r"^\s*label_names\(\s*(.*?)\s*\)\s*$", re.DOTALL)
_METRICS = re.compile(r"^\s*metrics\(\s*(.*?)\s*\)\s*$", re.DOTALL)
_QUERY_RESULT = re.compile(r"^\s*query_result\(\s*(.+)\s*\)\s*$", re.DOTALL)
# RE2 metacharacters, for a literal inside a regex matcher.
_REGEX_SPECIAL = re.compile(r"([\\^$*+?.()|\[\]{}])")


def string_literal(value: str) -> str:
    """A MetricsQL double-quoted string holding `value` (Go string escapes, as PromQL's lexer reads them)."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def regex_escape(value: str) -> str:
    """`value` as a literal inside a label regex matcher."""
    return _REGEX_SPECIAL.sub(r"\\\1", value)


def variable_call(text: str) -> tuple[str, str] | None:
    """(kind, argument) of a Grafana Prometheus variable query, or None for an ordinary expression."""
    for kind, pattern in (
        ("label_names", _LABEL_NAMES),
        ("metrics", _METRICS),
        ("query_result", _QUERY_RESULT),
    ):
        match = pattern.match(text)
        if match:
            return kind, match.group(1)
    try:
        label, match = dash.prometheus_label_values(text)
    except ValueError:
        return None
    return "label_values", json.dumps([(match or "").strip(), label])


def _is_number(text: Any) -> bool:
    try:
        return not math.isnan(float(text))
    except (TypeError, ValueError):
        return False


def result_counts(data: Any) -> tuple[int, int]:
    """(series, non-NaN values) of a Prometheus query result (matrix, vector, scalar or string)."""
    if not isinstance(data, dict):
        return 0, 0
    kind, result = data.get("resultType"), data.get("result")
    if kind == "matrix":
        series = result or []
        return len(series), sum(sum(1 for _, v in s.get("values") or [] if _is_number(v)) for s in series)
    if kind == "vector":
        samples = result or []
        return len(samples), sum(1 for s in samples if _is_number((s.get("value") or [0, "NaN"])[1]))
    if kind == "scalar":
        return 1, int(_is_number((result or [0, "NaN"])[1]))
    if kind == "string":
        return 1, 1
    return 0, 0


@dataclass(frozen=True)
class PromQL:
    """A Prometheus-compatible query API: VictoriaMetrics' single node, or a vmselect's prometheus path."""

    url: str
    headers: tuple[tuple[str, str], ...] = ()
    timeout: float = 60.0
    # The server's -forceFlushAuthKey, if it has one (env VICTORIAMETRICS_FORCE_FLUSH_AUTH_KEY).
    flush_key: str = ""

    def _call(self, path: str, params: dict[str, str]) -> Any:
        """POST form arguments (long expressions fit) and return `data`; RuntimeError with the server's words."""
        try:
            status, raw = _http(f"{self.url}{path}", params, dict(self.headers), self.timeout)
        except (urllib.error.URLError, OSError) as exc:
            raise RuntimeError(f"VictoriaMetrics at {self.url} is unreachable: {getattr(exc, 'reason', exc)}") from exc
        if status != 200:
            raise RuntimeError(f"HTTP {status}: {_message(raw)}")
        try:
            payload = json.loads(raw)
        except ValueError as exc:
            raise RuntimeError(f"not a Prometheus API answer: {raw[:200]!r}") from exc
        if payload.get("status") != "success":
            raise RuntimeError(str(payload.get("error") or payload))
        return payload.get("data")

    def instant(self, expr: str, at_ms: int) -> Any:
        """/api/v1/query at `at_ms`: {"resultType", "result"}."""
        return self._call("/api/v1/query", {"query": expr, "time": f"{at_ms / 1000:.3f}", **FRESH})

    def range(self, expr: str, window: dash.TimeRange, step: timedelta) -> Any:
        """/api/v1/query_range with start and end aligned down to the step, as Grafana sends it."""
        return self._call("/api/v1/query_range", {"query": expr, **dash.prometheus_range(window, step), **FRESH})

    def flush(self) -> bool:
        """Make just-written samples searchable now, where the server offers it (a single node does).

        A cluster's vmselect has no such handler (v1.136.0-cluster refuses the path
        and logs a warning each time), so a cluster is not asked: its vmstorage nodes make samples searchable within
        about a second by themselves.
        """
        if "/select/" in self.url:
            return False
        base = self.url
        # The key goes in the form body (VictoriaMetrics reads authKey there too), not the URL.
        form = {"authKey": self.flush_key} if self.flush_key else None
        try:
            status, _ = _http(f"{base}/internal/force_flush", form, dict(self.headers), self.timeout)
        except (urllib.error.URLError, OSError):
            return False
        return status == 200

    def variable(self, kind: str, argument: str, window: dash.TimeRange) -> list[str]:
        """The values a template variable query offers over `window`."""
        span = {"start": f"{window.start_ms / 1000:.3f}", "end": f"{window.end_ms / 1000:.3f}"}
        if kind == "label_values":
            match, label = json.loads(argument)
            params = {**span, **({"match[]": match} if match else {})}
            return list(self._call(f"/api/v1/label/{urllib.parse.quote(label)}/values", params) or [])
        if kind == "label_names":
            return list(self._call("/api/v1/labels", {**span, **({"match[]": argument} if argument else {})}) or [])
        if kind == "metrics":
            names = self._call("/api/v1/label/__name__/values", span) or []
            return [name for name in names if re.search(argument or "", name)]
        data = self.instant(argument, window.end_ms)  # query_result(...)
        return [json.dumps(sample) for sample in (data or {}).get("result") or []]

    def run(self, query: dash.Query, text: str, window: dash.TimeRange, interval: timedelta) -> Outcome:
        try:
            call = variable_call(text) if query.source == "variable" else None
            if call is not None:
                found = self.variable(*call, window)
                return Outcome(OK if found else EMPTY, "" if found else "no values offered", 1, len(found))
            data = self.instant(text, window.end_ms) if query.instant else self.range(text, window, interval)
        except (RuntimeError, ValueError) as exc:
            return Outcome(ERROR, str(exc))
        series, values = result_counts(data)
        return Outcome(OK if values else EMPTY, "" if values else "no values in the run's window", series, values)


class InstantSource(Protocol):
    """What counts run on: an instant query at a time (PromQL, or a Grafana data source answering like it)."""

    def instant(self, expr: str, at_ms: int) -> Any: ...


def stored_counts(
    source: PromQL | InstantSource, run_id: str, window: dash.TimeRange, measurements: Iterable[str]
) -> dict[str, int]:
    """Points stored per measurement for the run (its runtime_id prefix) within `window`.

    A point becomes one sample in each of its numeric fields' series
    (`<measurement>_<field>`); the simulator writes the same fields into every point
    of a measurement, so the field series holding the most samples counts the points.
    `count_over_time` drops the metric name unless told `keep_metric_names`.
    """
    from telemetry_client import catalog

    if isinstance(source, PromQL):
        source.flush()
    seconds = max(1, math.ceil((window.end_ms - window.start_ms) / 1000))
    run_matcher = f"runtime_id=~{string_literal(regex_escape(run_id) + '-.*')}"
    counts: dict[str, int] = {}
    for name in sorted(set(measurements)):
        measurement = catalog.CATALOG.get(name)
        fields = [f.name for f in measurement.fields if f.kind != "string"] if measurement else []
        names = "|".join(regex_escape(f"{name}_{field}") for field in fields) or regex_escape(name) + "_.+"
        expr = (
            f"max(sum by (__name__) (count_over_time({{__name__=~{string_literal(names)}, {run_matcher}}}"
            f"[{seconds}s]) keep_metric_names))"
        )
        data = source.instant(expr, window.end_ms) or {}
        samples = data.get("result") or []
        counts[name] = int(float(samples[0]["value"][1])) if samples else 0
    return counts


def series_by_label(source: PromQL, label: str, run_id: str, window: dash.TimeRange) -> dict[str, int]:
    """How many series the run created, per value of `label` (the store's cardinality)."""
    run_matcher = f"runtime_id=~{string_literal(regex_escape(run_id) + '-.*')}"
    seconds = max(1, math.ceil((window.end_ms - window.start_ms) / 1000))
    expr = f"count by ({label}) (last_over_time({{{run_matcher}}}[{seconds}s]))"
    data = source.instant(expr, window.end_ms) or {}
    return {
        (sample.get("metric") or {}).get(label, "?"): int(float(sample["value"][1]))
        for sample in data.get("result") or []
    }


def headers_from_env(env: Mapping[str, str | None]) -> tuple[tuple[str, str], ...]:
    """Read credentials: VICTORIAMETRICS_USERNAME/VICTORIAMETRICS_PASSWORD (basic) or VICTORIAMETRICS_BEARER_TOKEN."""
    import base64

    user, password = env.get("VICTORIAMETRICS_USERNAME"), env.get("VICTORIAMETRICS_PASSWORD")
    if bool(user) != bool(password):
        raise ValueError("set both VICTORIAMETRICS_USERNAME and VICTORIAMETRICS_PASSWORD, or neither")
    if user and password:
        return (("Authorization", "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()),)
    token = env.get("VICTORIAMETRICS_BEARER_TOKEN")
    return (("Authorization", f"Bearer {token}"),) if token else ()


@dataclass(frozen=True)
class GrafanaPromQL:
    """Instant MetricsQL through Grafana's /api/ds/query, answering like /api/v1/query (for the counts).

    Grafana's Prometheus data source turns each series into a data frame whose
    number field carries the series' labels (grafana/grafana pkg/promlib/converter).
    """

    client: GrafanaClient
    uid: str

    def instant(self, expr: str, at_ms: int) -> dict[str, Any]:
        target = {
            "refId": "A",
            "datasource": {"type": "prometheus", "uid": self.uid},
            "expr": expr,
            "instant": True,
            "range": False,
            "intervalMs": 1000,
            "maxDataPoints": MAX_DATA_POINTS,
        }
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
