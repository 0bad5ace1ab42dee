"""The alert rules' metrics queries, written in the language of the metrics store being built for.

Each helper means one thing over the rule's query window, per node (the `network`,
`role` and `uid` tags, plus any given), and writes it as InfluxQL for InfluxDB or as
MetricsQL for VictoriaMetrics (grafana.builder.backend decides which), so that a rule
means the same on either store:

- InfluxQL selects over `$timeFilter` (the window, filled in by Grafana's InfluxDB
  data source) and groups by the tags;
- MetricsQL is an instant query at the end of the window whose rollups cover
  `[$__range]`, the window's length (Grafana's Prometheus data source fills it in:
  grafana/grafana pkg/promlib/models/query.go, interpolateVariables), aggregated
  `by` the same labels. VictoriaMetrics stores the field `f` of a measurement `m`
  as the metric `m_f`, with the tags as labels.

Only measurements, fields and tags of telemetry_client/catalog.py are named here.
"""

from __future__ import annotations

from collections.abc import Sequence

from grafana.builder import metricsql
from grafana.builder.backend import current_backend

NODE: tuple[str, ...] = ("network", "role", "uid")


def _victoria() -> bool:
    return current_backend() == "victoriametrics"


def select(fields: str, measurements: Sequence[str], by: Sequence[str] = NODE, extra: str = "") -> str:
    """InfluxQL over the rule's own window ($timeFilter), one series per `by` group."""
    sources = ", ".join(f'"{m}"' for m in measurements)
    group = ", ".join(f'"{tag}"' for tag in by)
    query = f"SELECT {fields} FROM {sources} WHERE $timeFilter"
    return query + (f" GROUP BY {group}" if group else "") + extra


def _selector(field: str, measurements: Sequence[str]) -> str:
    """The series of `field` in `measurement`, over the window."""
    (measurement,) = measurements
    return f"{measurement}_{field}[$__range]"


def _rollups(function: str, field: str, measurements: Sequence[str]) -> str:
    """`function` over the window of `field` in each of `measurements`, their series side by side.

    One rollup per measurement joined with `or` (the rules file keeps the lines as
    written) rather than one long `__name__` regex. `or` keeps a right-hand series
    only when no left-hand one has the same labels, the metric name left out
    (Prometheus' set operators, as VictoriaMetrics applies them), so each piece is
    labelled with its measurement first.
    """
    if len(measurements) == 1:
        return f"{function}({measurements[0]}_{field}[$__range])"
    pieces = [f'label_set({function}({m}_{field}[$__range]),\n    "measurement", "{m}")' for m in measurements]
    return "\n  " + "\n  or ".join(pieces) + "\n"


def _by(labels: Sequence[str]) -> str:
    return f" by ({', '.join(labels)})" if labels else ""


def mean(field: str, measurement: str, by: Sequence[str] = NODE) -> str:
    """The mean of every value of `field` in the window, per group (not a mean of per-series means)."""
    if _victoria():
        return metricsql.mean_of_samples(_selector(field, [measurement]), by)
    return select(f'mean("{field}")', [measurement], by)


def maximum(field: str, measurement: str, by: Sequence[str] = NODE) -> str:
    """The largest value of `field` in the window, per group."""
    if _victoria():
        return f"max{_by(by)} (max_over_time({_selector(field, [measurement])}))"
    return select(f'max("{field}")', [measurement], by)


def spread(field: str, measurement: str, by: Sequence[str] = NODE) -> str:
    """The largest minus the smallest value of `field` in the window, per group."""
    if _victoria():
        series = _selector(field, [measurement])
        return f"max{_by(by)} (max_over_time({series})) - min{_by(by)} (min_over_time({series}))"
    return select(f'spread("{field}")', [measurement], by)


def missing(field: str, present: str, measurement: str, by: Sequence[str] = NODE) -> str:
    """Points of the window that carry `present` but not `field`, per group.

    InfluxQL gives null for a group without any `field` value; MetricsQL counts it
    as every point missing it (`or ... * 0` stands in for the absent series).
    """
    if _victoria():
        having = f"sum{_by(by)} (count_over_time({_selector(present, [measurement])}))"
        counted = f"sum{_by(by)} (count_over_time({_selector(field, [measurement])}))"
        return f"{having} - ({counted} or {having} * 0)"
    return select(f'count("{present}") - count("{field}")', [measurement], by)


def last_percent(part: str, whole: str, measurement: str, by: Sequence[str] = NODE) -> str:
    """The latest `part` as a percentage of the latest `whole`, per group.

    Where a group holds several series (processes of one node reporting the same
    device), MetricsQL takes the largest of their latest values.
    """
    if _victoria():
        numerator = f"max{_by(by)} (last_over_time({_selector(part, [measurement])}))"
        denominator = f"max{_by(by)} (last_over_time({_selector(whole, [measurement])}))"
        return f"{numerator} / {denominator} * 100"
    return select(f'last("{part}") / last("{whole}") * 100', [measurement], by)


def increase(counters: Sequence[str], measurement: str, by: Sequence[str]) -> str:
    """How much the cumulative `counters` grew in the window (largest minus smallest), added up per group.

    Either way a group missing one of the counters has no value (InfluxQL's
    `spread(a) + spread(b)` is null; MetricsQL's `+` finds no match).
    """
    if _victoria():
        # One-to-one on every label: a process without one of the counters drops out, as InfluxQL's null does.
        rollups = [f"range_over_time({measurement}_{counter}[$__range])" for counter in counters]
        return f"sum{_by(by)} (\n  " + "\n  + ".join(rollups) + "\n)"
    return select(" + ".join(f'spread("{counter}")' for counter in counters), [measurement], by)


def points(field: str, measurements: Sequence[str], by: Sequence[str] = ()) -> str:
    """How many points of `measurements` carry `field` in the window, per group (all together without `by`)."""
    if _victoria():
        return f"sum{_by(by)} ({_rollups('count_over_time', field, measurements)})"
    return select(f'count("{field}")', measurements, by)


def reporting(field: str, measurements: Sequence[str], steps: str, step_seconds: str) -> str:
    """Per node seen in the window: 0 when it sent no point with `field` for the last `steps` x `step_seconds`.

    InfluxQL: points per step, fill(0) for the steps without any, then the moving
    average over the last `steps` steps. InfluxDB 1.x pushes an outer query's time
    range into its subquery, so "was reporting" (the window) and "went quiet" (the
    last steps) come from one query's buckets. MetricsQL: 1 while the node's last
    point is younger than `steps` x `step_seconds`, else 0 (`< bool`).
    """
    if _victoria():
        last_seen = f"max{_by(NODE)} ({_rollups('tlast_over_time', field, measurements)})"
        return f"(time() - {last_seen}) < bool ({steps} * {step_seconds})"
    group = ", ".join(f'"{tag}"' for tag in NODE)
    return (
        f'SELECT moving_average(count("{field}"), {steps}) FROM '
        + ", ".join(f'"{m}"' for m in measurements)
        + f" WHERE $timeFilter GROUP BY time({step_seconds}s), {group} fill(0)"
    )


def store_name() -> str:
    """The metrics store's name, for the texts of the rule about the store itself."""
    return "VictoriaMetrics" if _victoria() else "InfluxDB"
