"""InfluxQL and LogQL query text with the standard filters of every dashboard.

Every InfluxQL query names only measurements, fields and tags of
telemetry_client/catalog.py, and every LogQL selector only the Loki stream labels
the logging handler sets; tests/test_dashboards.py checks both.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from grafana.builder.targets import Json, influx_target
from telemetry_client.catalog import DELTA_SUFFIX
from telemetry_client.catalog import DROP_REASONS as _CATALOG_DROP_REASONS

# Every reason the client drops data for: one series each on Telemetry health.
DROP_REASONS: tuple[str, ...] = tuple(_CATALOG_DROP_REASONS)


# The filter every InfluxQL panel applies: one regex per template variable, so the
# same query works for one value, several values and "All" (allValue ".*").
NODE_FILTER = '"network" =~ /^$network$/ AND "role" =~ /^$role$/ AND "uid" =~ /^$uid$/ AND "version" =~ /^$version$/'


# Fleet or nodes. With the uid variable at "All", Grafana inserts its custom
# allValue ".*" unformatted for ${uid:raw}; with one node or a handful chosen it
# inserts their uids. A panel carries a fleet target (a distribution: a few
# series whatever the fleet's size) and a per-node target, and InfluxQL folds the
# comparison of two literals, so the target not wanted answers at once with nothing.
def fleet_view(variable: str = "uid") -> str:
    """True when `variable` is at "All"."""
    return f"'${{{variable}:raw}}' = '.*'"


def node_view(variable: str = "uid") -> str:
    """True when one value or a handful are chosen in `variable`."""
    return f"'${{{variable}:raw}}' != '.*'"


# Time ranges longer than six hours read the downsampled copy (retention policy
# DOWNSAMPLED_RP, written as grafana/builder/downsampling.py says): the same fields at one
# point per DOWNSAMPLE_EVERY. Every InfluxQL target goes twice into its panel, one
# reading the raw data for ranges up to LONG_RANGE_MS, one the copy beyond; the
# comparison of Grafana's $__from/$__to (epoch ms) is folded by InfluxQL, so the
# target not wanted answers at once with nothing.
# The limit is the dashboard variable $raw_up_to_ms (variables.raw_range_variable),
# six hours by default (a day: 288 points of 5 minutes per line, about a minute
# behind the raw data); "always" keeps every range on the raw data, for a server
# without the copy (InfluxDB 3.x) or to see every point of a long range.
LONG_RANGE_MS = 6 * 3_600_000
ALWAYS_RAW_MS = 2**53 - 1  # larger than any range in epoch milliseconds
DOWNSAMPLED_RP = "downsampled"
DOWNSAMPLE_EVERY = "5m"

# The measurements with the most points per range read the copy from a sixth of
# $raw_up_to_ms on (beyond an hour by default): validator_scores holds one series
# per validator and evaluated miner (4,096 in the reference fleet), telemetry_client
# a point per process and sink every 10 s. On the raw data their fleet panels
# scanned every point of every series and took 6-11 s at six hours for 138 nodes;
# the copy has a point per 5 minutes (a 6-hour panel draws 72 per line).
# "always" (ALWAYS_RAW_MS) still keeps them on the raw data.
EARLY_COPY_DIVISOR = {"validator_scores": 6, "telemetry_client": 6}
_MEASUREMENTS = re.compile(r'FROM "((?:[^"\\]|\\.)*)"')


def raw_range_limit(query: str) -> str:
    """The InfluxQL expression of the longest range `query` reads on the raw data."""
    divisor = max((EARLY_COPY_DIVISOR.get(m, 1) for m in _MEASUREMENTS.findall(query)), default=1)
    return "$raw_up_to_ms" if divisor == 1 else f"$raw_up_to_ms / {divisor}"


def by_time_range(target: Json) -> list[Json]:
    """`target` on the raw data for short ranges, and its twin on the downsampled copy for long ones."""
    query = target["query"]
    limit = raw_range_limit(query)
    raw_range = "${__to} - ${__from} <= " + limit
    long_range = "${__to} - ${__from} > " + limit
    raw = dict(target, query=query.replace("$timeFilter", f"$timeFilter AND {raw_range}"))
    long_query = query.replace("$timeFilter", f"$timeFilter AND {long_range}").replace(
        'FROM "', f'FROM "{DOWNSAMPLED_RP}"."'
    )
    long = dict(target, refId=f"{target['refId']}-long", query=long_query)
    return [raw, long]


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


def _where(*conditions: str) -> str:
    return " AND ".join(c for c in conditions if c)


def fleet_stats(field: str, *, lowest_is_worst: bool = False) -> str:
    """Median, the tenth worst share and the worst value of `field` across the samples of an interval.

    Every node of a role samples at the same rate, so the samples' spread is the
    nodes' spread; and it reads the points once, with no per-node subquery.
    """
    if lowest_is_worst:
        return f'median("{field}") AS "median", percentile("{field}", 10) AS "p10", min("{field}") AS "min"'
    return f'median("{field}") AS "median", percentile("{field}", 90) AS "p90", max("{field}") AS "max"'


def fleet_and_nodes(
    field: str,
    measurement: str,
    *,
    node_agg: str = "mean",
    lowest_is_worst: bool = False,
    by: Sequence[str] = (),
    node_by: Sequence[str] = ("uid",),
    node_alias: str = "$tag_uid",
    extra_where: str = "",
    prefix: str = "",
    variable: str = "uid",
    refs: tuple[str, str] = ("A", "B"),
) -> list[Json]:
    """The fleet as a distribution when every node is selected; one line per node when a few are.

    Two targets: A (median, p90 and max, or p10 and min when low is bad) over all
    the selected nodes' samples, and B (`node_agg` per node) when nodes are chosen
    in `variable` (uid, or eval_uid for the miners validators score).
    """
    tags = "".join(f" $tag_{tag}" for tag in by)
    fleet = influx_select(
        fleet_stats(field, lowest_is_worst=lowest_is_worst),
        measurement,
        by=by,
        extra_where=_where(extra_where, fleet_view(variable)),
    )
    nodes = influx_select(
        f'{node_agg}("{field}")', measurement, by=(*node_by, *by), extra_where=_where(extra_where, node_view(variable))
    )
    return [
        influx_target(refs[0], fleet, f"{prefix}$col{tags}"),
        influx_target(refs[1], nodes, f"{prefix}{node_alias}{tags}"),
    ]


def worst_nodes(
    field: str,
    measurement: str,
    *,
    count: int = 5,
    lowest_is_worst: bool = False,
    agg: str = "mean",
    tag: str = "uid",
    extra_where: str = "",
) -> str:
    """The `count` nodes (by `tag`) with the highest, or lowest, `agg` of `field` over the time range.

    One row per node inside, then TOP/BOTTOM keeps the few, named: a short table
    whatever the fleet's size.
    """
    inner = influx_select(
        f'{agg}("{field}") AS "{field}"', measurement, by=(tag,), extra_where=extra_where, per_interval=False
    )
    selector = "bottom" if lowest_is_worst else "top"
    return f'SELECT {selector}("{field}", "{tag}", {count}) AS "{field}" FROM ({inner})'


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
    """Per-second rates of the client's counters, summed per sink.

    The client writes `<counter>_delta` beside each cumulative counter: what it
    grew by since the process's previous point (restarts included). The rate of an
    interval is then the plain sum of the deltas divided by the interval's length,
    with no derivative per process under a second aggregation.
    """
    rates = ", ".join(
        f'sum("{field}{DELTA_SUFFIX}") * 1000 / $__interval_ms AS "{alias}"' for alias, field in fields.items()
    )
    return influx_select(rates, "telemetry_client", by=("sink",), extra_where='"sink" =~ /^$sink$/')


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
