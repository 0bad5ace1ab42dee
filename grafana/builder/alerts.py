"""Grafana-managed alert rules as data: queries, expressions and the rule envelope.

The shapes follow Grafana's alerting file provisioning, apiVersion 1 (grafana/grafana
docs/sources/alerting/set-up/provision-alerting-resources/file-provisioning/index.md
and pkg/services/provisioning/alerting/rules_types.go, AlertRuleV1 / QueryV1):

- a rule's `data` is a list of queries, each with a `refId`, a `relativeTimeRange`
  (seconds before now: `from`, `to`), a `datasourceUid` and a `model`; server-side
  expressions use the datasource uid `__expr__` and a model `type` of reduce, math,
  threshold or classic_conditions (pkg/expr/commands.go);
- `condition` names the refId whose value decides: 0 is Normal, anything else
  (NaN included) Alerting, a null value or no value at all NoData
  (pkg/services/ngalert/eval/eval.go, evaluateExecutionResult).

Settings (thresholds, durations) appear as `${ALERT_...}` placeholders. Grafana
interpolates environment variables in some fields only (pkg/services/provisioning/
values/values.go, `$$` for a literal `$`): the query `model` is passed on raw
(rules_types.go, QueryV1.mapToModel uses Model.Raw) and `relativeTimeRange` is a
plain integer. So the placeholders are filled in before Grafana reads the files
(grafana/alerting_render.py, compose/grafana/entrypoint.sh, the Ansible grafana
role), never left to Grafana.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from grafana.alerting_src import settings as st
from grafana.builder.dialects import current_dialect
from grafana.builder.targets import LOKI, Json

EXPR_UID = "__expr__"
EXPRESSION_DATASOURCE: dict[str, str] = {"type": "__expr__", "uid": EXPR_UID}
# Grafana's own defaults for alert queries (what the rule editor writes).
INTERVAL_MS = 1000
MAX_DATA_POINTS = 43200

# noDataState / execErrState values Grafana accepts (pkg/services/ngalert/models/alert_rule.go:
# NoDataStateFromString, ErrStateFromString). A noDataState may also be the placeholder of
# a choice setting whose every choice is one of these (filled in before Grafana reads it).
NO_DATA_STATES = ("NoData", "Alerting", "OK", "KeepLast")
EXEC_ERR_STATES = ("Error", "Alerting", "OK", "KeepLast")
REDUCERS = ("last", "mean", "min", "max", "sum", "count")
REDUCE_MODES = ("", "dropNN", "replaceNN")
THRESHOLDS = ("gt", "lt", "within_range", "outside_range")


def placeholder(name: str) -> str:
    """The text a setting stands as in the generated files, filled in before Grafana reads them."""
    return "${" + name + "}"


@dataclass(frozen=True)
class TimeRange:
    """A query's window, in seconds before the evaluation: from `start` ago to `end` ago.

    Each bound is a number of seconds or the name of a setting holding one.
    """

    start: int | str
    end: int | str = 0

    def to_json(self) -> Json:
        def bound(value: int | str) -> int | str:
            return placeholder(value) if isinstance(value, str) else value

        return {"from": bound(self.start), "to": bound(self.end)}


def metrics_query(ref: str, query: str, window: TimeRange) -> Json:
    """A query of the metrics store being built for over `window`: InfluxQL for InfluxDB, MetricsQL (an instant
    query at the end of the window) for VictoriaMetrics; the build's dialect writes the model's own fields."""
    dialect = current_dialect()
    return {
        "refId": ref,
        "relativeTimeRange": window.to_json(),
        "datasourceUid": dialect.datasource["uid"],
        "model": {
            "refId": ref,
            "datasource": dialect.datasource,
            **dialect.alert_model(query),
            "intervalMs": INTERVAL_MS,
            "maxDataPoints": MAX_DATA_POINTS,
        },
    }


def loki_query(ref: str, expr: str, window: TimeRange) -> Json:
    """A LogQL metric query, run as an instant query at the end of `window`."""
    return {
        "refId": ref,
        "relativeTimeRange": window.to_json(),
        "datasourceUid": LOKI["uid"],
        "model": {
            "refId": ref,
            "datasource": LOKI,
            "expr": expr,
            "queryType": "instant",
            "editorMode": "code",
            "intervalMs": INTERVAL_MS,
            "maxDataPoints": MAX_DATA_POINTS,
        },
    }


def _expression(ref: str, model: Json) -> Json:
    return {
        "refId": ref,
        "relativeTimeRange": {"from": 0, "to": 0},
        "datasourceUid": EXPR_UID,
        "model": {
            "refId": ref,
            "datasource": EXPRESSION_DATASOURCE,
            "intervalMs": INTERVAL_MS,
            "maxDataPoints": MAX_DATA_POINTS,
            **model,
        },
    }


def reduce(ref: str, source: str, reducer: str, mode: str = "dropNN", replace_with: float | None = None) -> Json:
    """Reduce each series of `source` to one number (pkg/expr/mathexp/reduce.go).

    mode "" is strict (a NaN or null makes the result NaN), "dropNN" drops NaN, Inf
    and null first, "replaceNN" replaces them with `replace_with`.
    """
    if reducer not in REDUCERS or mode not in REDUCE_MODES:
        raise ValueError(f"unknown reducer {reducer!r} or mode {mode!r}")
    settings: Json = {"mode": mode}
    if mode == "replaceNN":
        if replace_with is None:
            raise ValueError("replaceNN needs replace_with")
        settings["replaceWithValue"] = replace_with
    return _expression(ref, {"type": "reduce", "expression": source, "reducer": reducer, "settings": settings})


def math(ref: str, expression: str) -> Json:
    """A math expression over other refIds ($A, ${A}), e.g. `$B > 5` (pkg/expr/mathexp)."""
    return _expression(ref, {"type": "math", "expression": expression})


def threshold(ref: str, source: str, kind: str, *params: float | str) -> Json:
    """1 where `source` passes the test, else 0 (pkg/expr/threshold.go).

    Each param is a number or the name of a setting holding one.
    """
    if kind not in THRESHOLDS:
        raise ValueError(f"unknown threshold {kind!r}")
    values = [placeholder(p) if isinstance(p, str) else p for p in params]
    return _expression(
        ref,
        {"type": "threshold", "expression": source, "conditions": [{"evaluator": {"type": kind, "params": values}}]},
    )


def _states(value: str) -> tuple[str, ...]:
    """The states `value` can be: itself, or every choice of the setting it is the placeholder of."""
    match = st.PLACEHOLDER.match(value)
    if not match:
        return (value,)
    setting = st.BY_NAME.get(match.group(1))
    return (setting.choices or (value,)) if setting is not None and setting.kind == "choice" else (value,)


@dataclass(frozen=True)
class PanelLink:
    """The dashboard panel that shows what a rule watches (title looked up to an id)."""

    dashboard_uid: str
    panel_title: str


@dataclass(frozen=True)
class Rule:
    """One alert rule: what it watches, when it fires and why each state was chosen."""

    uid: str
    title: str
    summary: str
    description: str
    severity: str
    data: Sequence[Json]
    condition: str
    no_data_state: str
    no_data_reason: str
    exec_err_state: str
    exec_err_reason: str
    panel: PanelLink
    pending: str  # the `for` duration, e.g. "${ALERT_PENDING_SECONDS}s" or "0s"
    # What the simulator's faults should make of it: fault kinds that must fire it.
    fired_by: tuple[str, ...] = ()
    runbook: str = ""
    labels: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not set(_states(self.no_data_state)) <= set(NO_DATA_STATES) or self.exec_err_state not in EXEC_ERR_STATES:
            raise ValueError(f"{self.uid}: bad noDataState or execErrState")
        refs = [q["refId"] for q in self.data]
        if len(set(refs)) != len(refs) or self.condition not in refs:
            raise ValueError(f"{self.uid}: refIds must be unique and the condition one of them")
        for text in (self.summary, self.description, *self.labels.values()):
            if "$" in text:  # Grafana would expand it as an environment variable (values.go)
                raise ValueError(f"{self.uid}: use {{{{ .Labels.x }}}}, never $, in annotations and labels")

    def to_json(self, panel_id: int) -> Json:
        annotations = {
            "summary": self.summary,
            "description": self.description,
            "__dashboardUid__": self.panel.dashboard_uid,
            "__panelId__": str(panel_id),
        }
        if self.runbook:
            annotations["runbook_url"] = self.runbook
        return {
            "uid": self.uid,
            "title": self.title,
            "condition": self.condition,
            "data": list(self.data),
            "dashboardUid": self.panel.dashboard_uid,
            "panelId": panel_id,
            "noDataState": self.no_data_state,
            "execErrState": self.exec_err_state,
            "for": self.pending,
            "annotations": annotations,
            "labels": {"severity": self.severity, **self.labels},
            "isPaused": False,
        }


def rule_group(name: str, folder: str, interval: str, rules: Sequence[Json]) -> Json:
    """One rule group: its rules are evaluated together every `interval`."""
    return {"orgId": 1, "name": name, "folder": folder, "interval": interval, "rules": list(rules)}
