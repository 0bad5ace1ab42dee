"""After a run: evaluate every provisioned alert rule the way Grafana would, and judge it against the faults.

The rules are grafana/alerting/rules.yaml with the settings filled in for the run
(grafana/alerting_src/settings.py: `simulated` values, and windows derived from the
run's length), so what is evaluated is what Grafana loads, windows scaled to seconds.
Each rule's queries run over its relativeTimeRange ending where the load ended, then
its expressions (simulator/expressions.py, Grafana's semantics), then its condition:

- FIRING: at least one instance (node, process, device) is Alerting;
- NORMAL: every instance is Normal;
- NO DATA: a query returned nothing, or the condition is null;
- ERROR: a query failed (the store's message is kept), or two instances of the
  condition have the same labels (Grafana's message, simulator/expressions.py);
- SKIPPED: its data source is not part of the run, or the run was too short to judge.

Whether Grafana would notify is then decided by the rule's own noDataState and
execErrState (a NO DATA rule with noDataState Alerting fires). Evaluation happens
once, as if `for` were 0 (the simulated settings make it 0). A rule fires as it
should when it fires exactly under the faults that are meant to fire it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

import yaml

from grafana.alerting_src import render
from grafana.alerting_src import settings as st
from grafana.alerting_src.rules import RULES
from simulator import dashboards as dash
from simulator import expressions as ex
from simulator.faults import STORE_FAULTS, ActiveFault, down_datasources

REPO = Path(__file__).resolve().parents[1]
ALERTING_DIR = REPO / "grafana" / "alerting"
# The rule set provisioned with each metrics backend (same uids, the metrics queries in its language).
ALERTING_DIRS = {"influxdb": ALERTING_DIR, "victoriametrics": REPO / "grafana" / "alerting-victoriametrics"}


FIRING, NORMAL, NO_DATA, ERROR, SKIPPED = "FIRING", "NORMAL", "NO DATA", "ERROR", "SKIPPED"
MIN_RUN_SECONDS = 8.0  # the simulated windows are a few seconds: a shorter run cannot tell silence from a pause
MAX_INSTANCES = 10


class InfluxSource(Protocol):
    def query(self, text: str) -> list[dict[str, Any]]: ...


class LokiSource(Protocol):
    def instant(self, expr: str, at_ns: int) -> Any: ...


class PrometheusSource(Protocol):
    """VictoriaMetrics' Prometheus query API (simulator/victoria.py), straight or through Grafana."""

    def instant(self, expr: str, at_ms: int) -> Any: ...


@dataclass
class AlertCheck:
    """One rule after the run."""

    uid: str
    title: str
    group: str
    status: str
    fires: bool
    expected: bool
    message: str = ""
    instances: list[dict[str, Any]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.status == SKIPPED or self.fires == self.expected

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "ok": self.ok}


def run_settings(load_seconds: float, window_seconds: float) -> dict[str, str]:
    """The settings the simulator evaluates with: `simulated` values, windows that span the run.

    A run shorter than MIN_RUN_SECONDS is not judged, but its settings still have to be
    valid (a baseline above its window), so the span never goes below it.
    """
    span = str(math.ceil(max(MIN_RUN_SECONDS, load_seconds)))
    derived = {
        "ALERT_NODE_SILENT_LOOKBACK_SECONDS": span,
        "ALERT_LOSS_BASELINE_SECONDS": span,
        "ALERT_LOG_ERRORS_BASELINE_SECONDS": span,
        "ALERT_STORE_WINDOW_SECONDS": span,
        # The backup reports come every second of the load (simulator/backups.py), not every 15 minutes.
        "ALERT_BACKUP_REPORT_WINDOW_SECONDS": span,
        # The clean edge's refusals (the deploy's checks) come once, at the start: the rule judges them too.
        "ALERT_EDGE_REFUSED_WINDOW_SECONDS": span,
        # A validator's window lasts about --window-seconds: give it four of them to move.
        "ALERT_WINDOW_STALL_SECONDS": str(max(4, math.ceil(4 * window_seconds))),
        # A burst must stand out against a node's own share of the lines, not against a tenth of one.
        "ALERT_LOG_ERRORS_MIN": "10",
    }
    values = {s.name: s.simulated for s in st.SETTINGS if s.simulated is not None}
    return st.resolve({**values, **derived})


def fault_needs_seconds(kind: str, window_seconds: float) -> float:
    """How long a fault must last before the load ends for its rule to see it with the run's settings."""
    if kind == "window-stall":
        return max(4, math.ceil(4 * window_seconds)) + 2.0
    return 5.0


def load_rules(values: Mapping[str, str], directory: Path = ALERTING_DIR) -> list[tuple[str, dict[str, Any]]]:
    """(group name, rule) of the generated rules file with `values` filled in."""
    text = render.fill((directory / render.RULES_FILE).read_text(encoding="utf-8"), values)
    return [(group["name"], rule) for group in yaml.safe_load(text)["groups"] for rule in group["rules"]]


def expected_rules(faults: Sequence[ActiveFault]) -> set[str]:
    """Uids of the rules the run's faults are meant to fire."""
    kinds = {f.kind for f in faults}
    return {rule.uid for rule in RULES if kinds & set(rule.fired_by)}


def skip_where(
    rules: Sequence[tuple[str, Mapping[str, Any]]],
    checks: Sequence[AlertCheck],
    reads: Callable[[str], bool],
    reason: str,
) -> None:
    """Rules with a query that `reads` picks (data this run did not write) are SKIPPED, with the reason."""
    for (_, rule), check in zip(rules, checks, strict=True):
        texts = [q["model"].get("query") or q["model"].get("expr") or "" for q in rule["data"]]
        if check.status != SKIPPED and any(reads(text) for text in texts):
            check.status, check.fires, check.instances = SKIPPED, False, []
            check.message = reason


# ---------------------------------------------------------------- queries


def influx_results(payload: list[dict[str, Any]]) -> ex.Results:
    """InfluxQL results as Grafana's InfluxDB data source frames them: one series per tag set and column."""
    out: ex.Results = []
    for result in payload:
        for series in result.get("series") or []:
            labels = {k: str(v) for k, v in (series.get("tags") or {}).items()}
            columns = series.get("columns") or []
            rows = series.get("values") or []
            for index, column in enumerate(columns):
                if column == "time":
                    continue
                points = tuple(
                    (int(row[0]), None if row[index] is None else float(row[index]))
                    for row in rows
                    if isinstance(row[index], int | float | type(None))
                )
                out.append(ex.Series(labels, points))
    return out or [ex.NO_DATA]


def loki_results(data: Any, at_ms: int) -> ex.Results:
    """A Loki instant query's vector (or scalar) as one-point series, labels from the metric."""
    out: ex.Results = []
    if isinstance(data, dict) and data.get("resultType") == "vector":
        for sample in data.get("result") or []:
            value = (sample.get("value") or [0, "NaN"])[1]
            out.append(ex.Series(dict(sample.get("metric") or {}), ((at_ms, float(value)),)))
    elif isinstance(data, dict) and data.get("resultType") == "scalar":
        out.append(ex.Series({}, ((at_ms, float(data["result"][1])),)))
    return out or [ex.NO_DATA]


def prometheus_results(data: Any, at_ms: int) -> ex.Results:
    """An instant query's vector as one-point series, labels from the metric (`__name__` included).

    Grafana's Prometheus data source labels each series' value field with the whole
    metric, and turns NaN into a null with a NaN entity that the expressions read
    back as NaN (grafana/grafana pkg/promlib/converter/testdata/prom-vector-frame.jsonc).
    """
    out: ex.Results = []
    if isinstance(data, dict) and data.get("resultType") == "vector":
        for sample in data.get("result") or []:
            value = (sample.get("value") or [0, "NaN"])[1]
            out.append(ex.Series(dict(sample.get("metric") or {}), ((at_ms, float(value)),)))
    elif isinstance(data, dict) and data.get("resultType") == "scalar":
        out.append(ex.Series({}, ((at_ms, float(data["result"][1])),)))
    return out or [ex.NO_DATA]


def run_query(
    query: Mapping[str, Any],
    influx: InfluxSource | None,
    loki: LokiSource | None,
    at_ms: int,
    prometheus: PrometheusSource | None = None,
) -> ex.Results | None:
    """One data source query over its window ending at `at_ms`; None when its data source is not available."""
    window = query["relativeTimeRange"]
    start, end = at_ms - int(window["from"]) * 1000, at_ms - int(window["to"]) * 1000
    model = query["model"]
    if query["datasourceUid"] == "influxdb":
        if influx is None:
            return None
        # Grafana's InfluxQL macro (pkg/tsdb/influxdb/influxql/query.go): time >= <from>ms and time <= <to>ms.
        text = model["query"].replace("$timeFilter", f"time >= {start}ms and time <= {end}ms")
        return influx_results(influx.query(text))
    if query["datasourceUid"] == "loki":
        if loki is None:
            return None
        # $__range is the query's window (pkg/tsdb/loki interpolation); an instant query runs at its end.
        expr = model["expr"].replace("$__range", f"{max(1, (end - start) // 1000)}s")
        return loki_results(loki.instant(expr, end * 1_000_000), end)
    if query["datasourceUid"] == "victoriametrics":
        if prometheus is None:
            return None
        if not model.get("instant"):
            raise ex.ExpressionError(f"{model.get('refId')}: only instant Prometheus queries are modelled")
        # The macros as Grafana's Prometheus backend fills them in ($__range: the query's window).
        window = dash.TimeRange(datetime.fromtimestamp(start / 1000, UTC), datetime.fromtimestamp(end / 1000, UTC))
        expr = dash.expand_metricsql(model["expr"], window)
        return prometheus_results(prometheus.instant(expr, end), end)
    raise ex.ExpressionError(f"unknown data source {query['datasourceUid']}")


def _expression(model: Mapping[str, Any], variables: Mapping[str, ex.Results]) -> ex.Results:
    kind = model["type"]
    if kind == "reduce":
        settings = model.get("settings") or {}
        source = variables[model["expression"].lstrip("$")]
        return ex.reduce(source, model["reducer"], settings.get("mode", ""), settings.get("replaceWithValue", 0.0))
    if kind == "math":
        return ex.evaluate_math(model["expression"], variables)
    if kind == "threshold":
        evaluator = model["conditions"][0]["evaluator"]
        return ex.threshold(variables[model["expression"].lstrip("$")], evaluator["type"], evaluator["params"])
    raise ex.ExpressionError(f"expression type {kind} is not modelled")


def evaluate_rule(
    group: str, rule: Mapping[str, Any], influx: InfluxSource | None, loki: LokiSource | None, at_ms: int,
    expected: bool, prometheus: PrometheusSource | None = None,
) -> AlertCheck:  # fmt: skip
    check = AlertCheck(rule["uid"], rule["title"], group, NORMAL, False, expected)
    variables: dict[str, ex.Results] = {}
    no_data = False
    try:
        for query in rule["data"]:
            if query["datasourceUid"] == "__expr__":
                variables[query["refId"]] = _expression(query["model"], variables)
                continue
            results = run_query(query, influx, loki, at_ms, prometheus)
            if results is None:
                check.status, check.message = SKIPPED, f"no {query['datasourceUid']} data source in this run"
                return check
            no_data = no_data or isinstance(results[0], ex.NoData)
            variables[query["refId"]] = results
        # eval.go decides NoData before it looks at the condition's labels (duplicates are an Error).
        states = [] if no_data else ex.condition_states(variables[rule["condition"]])
    except (RuntimeError, OSError, ValueError) as exc:
        check.status, check.message = ERROR, str(exc)[:500]
        check.fires = rule["execErrState"] == "Alerting"
        return check
    alerting = [(labels, value) for labels, state, value in states if state == ex.ALERTING]
    if no_data or not states or all(state == ex.NODATA for _, state, _ in states):
        check.status = NO_DATA
        check.fires = rule["noDataState"] == "Alerting"
    elif alerting:
        check.status, check.fires = FIRING, True
    check.instances = [{"labels": labels, "value": value} for labels, value in alerting[:MAX_INSTANCES]]
    if len(alerting) > MAX_INSTANCES:
        check.message = f"{len(alerting)} instances alerting, the first {MAX_INSTANCES} listed"
    return check


def evaluate(
    rules: Sequence[tuple[str, Mapping[str, Any]]],
    influx: InfluxSource | None,
    loki: LokiSource | None,
    at_ms: int,
    faults: Sequence[ActiveFault] = (),
    load_seconds: float = MIN_RUN_SECONDS,
    prometheus: PrometheusSource | None = None,
) -> list[AlertCheck]:
    """Every rule at `at_ms` (where the load ended), judged against the faults."""
    expected = expected_rules(faults)
    if load_seconds < MIN_RUN_SECONDS:
        message = f"the load lasted {load_seconds:.1f} s; judging the rules needs {MIN_RUN_SECONDS:g} s or more"
        return [
            AlertCheck(rule["uid"], rule["title"], group, SKIPPED, False, rule["uid"] in expected, message)
            for group, rule in rules
        ]
    checks = [
        evaluate_rule(group, rule, influx, loki, at_ms, rule["uid"] in expected, prometheus) for group, rule in rules
    ]
    # A fault's rule (a node's, the edge's, the backups') reads a store that a store fault of the
    # same run took down: it can only be an Error, and then its execErrState decides, not the
    # fault (grafana/grafana pkg/services/ngalert/eval/eval.go, as simulator/expressions.py
    # cites), so it is not judged.
    down = down_datasources(faults)
    by_other_faults = expected_rules([f for f in faults if f.kind not in STORE_FAULTS])
    for (_, rule), check in zip(rules, checks, strict=True):
        blind = sorted(down & {q["datasourceUid"] for q in rule["data"]})
        if rule["uid"] in by_other_faults and blind and check.status != SKIPPED:
            check.status, check.fires, check.instances = SKIPPED, False, []
            check.message = f"its fault cannot be seen while {', '.join(blind)} is down (a store fault of this run)"
    return checks
