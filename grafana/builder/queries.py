"""InfluxQL and LogQL query text with the standard filters of every dashboard.

Every InfluxQL query names only measurements, fields and tags of
telemetry_client/catalog.py, and every LogQL selector only the Loki stream labels
the logging handler sets; tests/test_dashboards.py checks both.
"""

from __future__ import annotations

from collections.abc import Sequence

from grafana.builder.targets import Json, influx_target
from telemetry_client.catalog import DROP_REASONS as _CATALOG_DROP_REASONS

# Every reason the client drops data for: one series each on Telemetry health.
DROP_REASONS: tuple[str, ...] = tuple(_CATALOG_DROP_REASONS)


# The filter every InfluxQL panel applies: one regex per template variable, so the
# same query works for one value, several values and "All" (allValue ".*").
NODE_FILTER = '"network" =~ /^$network$/ AND "role" =~ /^$role$/ AND "uid" =~ /^$uid$/ AND "version" =~ /^$version$/'


def influx_select(
    fields: str, measurement: str, *, by: Sequence[str] = ("uid",), extra_where: str = "", per_interval: bool = True
) -> str:
    """One InfluxQL SELECT over a catalog measurement with the standard filters."""
    where = f"$timeFilter AND {NODE_FILTER}"
    if extra_where:
        where += f" AND {extra_where}"
    group = ["time($__interval)"] if per_interval else []
    group += [f'"{tag}"' for tag in by]
    query = f'SELECT {fields} FROM "{measurement}" WHERE {where}'
    if group:
        query += " GROUP BY " + ", ".join(group)
    if per_interval:
        query += " fill(none)"
    return query


def influx_sum_over_nodes(
    inner_fields: str,
    outer_fields: str,
    measurement: str,
    *,
    inner_by: Sequence[str],
    outer_by: Sequence[str] = (),
    extra_where: str = "",
) -> str:
    """Aggregate per node (or per process) first, then add the nodes up."""
    inner = influx_select(inner_fields, measurement, by=inner_by, extra_where=extra_where)
    group = ", ".join(["time($__interval)", *(f'"{tag}"' for tag in outer_by)])
    return f"SELECT {outer_fields} FROM ({inner}) WHERE $timeFilter GROUP BY {group} fill(none)"


def fleet_tokens_per_sec_target() -> Json:
    """The selected miners' throughput added up (one mean per miner first, then the sum)."""
    return influx_target(
        "A",
        influx_sum_over_nodes(
            'mean("tokens_per_sec") AS "tokens_per_sec"',
            'sum("tokens_per_sec") AS "tokens_per_sec"',
            "training_step",
            inner_by=("uid",),
        ),
        "tokens/s",
    )


def counter_rates(fields: dict[str, str]) -> str:
    """Per-second rates of the client's cumulative counters, summed per sink.

    The counters count up from process start, so the rate is taken per process
    (uid, runtime_id, sink) with non_negative_derivative, which also ignores the
    reset to zero when a node restarts, and only then added up per sink.
    """
    inner = ", ".join(f'non_negative_derivative(last("{field}"), 1s) AS "{alias}"' for alias, field in fields.items())
    outer = ", ".join(f'sum("{alias}") AS "{alias}"' for alias in fields)
    return influx_sum_over_nodes(
        inner,
        outer,
        "telemetry_client",
        inner_by=("uid", "runtime_id", "sink"),
        outer_by=("sink",),
        extra_where='"sink" =~ /^$sink$/',
    )


def loki_selector(*extra: str, level: bool = True) -> str:
    """The stream selector of the Logs dashboard, from its variables."""
    matchers = [
        'environment=~"$network"',
        'service=~"$service"',
        'role=~"$role"',
        'uid=~"$uid"',
        'version=~"$version"',
    ]
    if level:
        matchers.append('level=~"$level"')
    matchers.extend(extra)
    return "{" + ", ".join(matchers) + "}"


ERRORS = 'level=~"error|critical"'
