"""The alert rules' metrics queries, written in the language of the metrics store being built for.

Each helper means one thing over the rule's query window, per node (the `network`,
`role` and `uid` tags, plus any given), and the build's dialect writes it
(grafana.builder.dialects: InfluxQL for InfluxDB, MetricsQL for VictoriaMetrics,
and how each reads the window), so that a rule means the same on either store.

Only measurements, fields and tags of telemetry_client/catalog.py are named here.
"""

from __future__ import annotations

from collections.abc import Sequence

from grafana.builder.dialects import NODE, current_dialect


def mean(field: str, measurement: str, by: Sequence[str] = NODE) -> str:
    """The mean of every value of `field` in the window, per group (not a mean of per-series means)."""
    return current_dialect().rule_mean(field, measurement, by)


def maximum(field: str, measurement: str, by: Sequence[str] = NODE) -> str:
    """The largest value of `field` in the window, per group."""
    return current_dialect().rule_maximum(field, measurement, by)


def last(field: str, measurement: str, by: Sequence[str] = NODE) -> str:
    """The newest value of `field` in the window, per group."""
    return current_dialect().rule_last(field, measurement, by)


def spread(field: str, measurement: str, by: Sequence[str] = NODE) -> str:
    """The largest minus the smallest value of `field` in the window, per group."""
    return current_dialect().rule_spread(field, measurement, by)


def missing(field: str, present: str, measurement: str, by: Sequence[str] = NODE) -> str:
    """Points of the window that carry `present` but not `field`, per group.

    InfluxQL gives null for a group without any `field` value; MetricsQL counts it
    as every point missing it.
    """
    return current_dialect().rule_missing(field, present, measurement, by)


def last_percent(part: str, whole: str, measurement: str, by: Sequence[str] = NODE) -> str:
    """The latest `part` as a percentage of the latest `whole`, per group."""
    return current_dialect().rule_last_percent(part, whole, measurement, by)


def increase(counters: Sequence[str], measurement: str, by: Sequence[str]) -> str:
    """How much the cumulative `counters` grew in the window (largest minus smallest), added up per group.

    Either way a group missing one of the counters has no value (InfluxQL's
    `spread(a) + spread(b)` is null; MetricsQL's `+` finds no match).
    """
    return current_dialect().rule_increase(counters, measurement, by)


def points(field: str, measurements: Sequence[str], by: Sequence[str] = ()) -> str:
    """How many points of `measurements` carry `field` in the window, per group (all together without `by`)."""
    return current_dialect().rule_points(field, measurements, by)


def reporting(field: str, measurements: Sequence[str], steps: str, step_seconds: str) -> str:
    """Per node seen in the window: 0 when it sent no point with `field` for the last `steps` x `step_seconds`."""
    return current_dialect().rule_reporting(field, measurements, steps, step_seconds)


def store_name() -> str:
    """The metrics store's name, for the texts of the rule about the store itself."""
    return current_dialect().store_name
