"""InfluxQL text of the dashboards' panels: the standard filters, fleet and per-node views, rates.

Every InfluxQL query names only measurements, fields and tags of
telemetry_client/catalog.py; tests/test_dashboards.py checks it. The dashboards
call the backend-neutral helpers of grafana.builder.queries, which come here when
building for InfluxDB.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from telemetry_client.catalog import DELTA_SUFFIX, SPREAD_OF

Json = dict[str, Any]


def tag_matches(tag: str) -> str:
    """`"tag" =~ /^${tag:regex}$/`: the tag is one of the values of the template variable of the same name.

    Grafana's regex format escapes every value. A bare `$tag` is left to the InfluxDB
    data source, which does not escape a single value that parseFloat reads as a
    number: a version 1.4.2+cu121 would match no tag (simulator/dashboards.py,
    _influx_interpolate, cites where).
    """
    return f'"{tag}" =~ /^${{{tag}:regex}}$/'


# The filter every InfluxQL panel applies: one regex per template variable, so the
# same query works for one value, several values and "All" (allValue ".*").
NODE_FILTER = " AND ".join(tag_matches(tag) for tag in ("network", "role", "uid", "version"))


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

# The measurements with the most points per range read the copy from a fraction
# of $raw_up_to_ms on: a sixth (beyond an hour by default) for telemetry_client, a
# point per process and sink every 10 s, and gpu and gpu_memory, one series per
# device (1,096 in the reference fleet) every 30 s; a twelfth (beyond 30 minutes)
# for validator_scores, one series per validator and evaluated miner (4,096).
# Over a day of the reference fleet their fleet panels on the raw data took
# 6.7-10.7 s at six hours (GPU) and about 3 s at one hour (scores), against
# 0.3-1.1 s from the copy, which has a point per 5 minutes (a 6-hour panel draws
# 72 per line, a 1-hour score panel 12). "always" (ALWAYS_RAW_MS) still keeps
# them on the raw data. From the same point on, the fleet views of the score and
# GPU panels read their Spread (a series per node) rather than the copy; see
# fleet_from_spread.
EARLY_COPY_DIVISOR = {"validator_scores": 12, "telemetry_client": 6, "gpu": 6, "gpu_memory": 6}
_MEASUREMENTS = re.compile(r'FROM "((?:[^"\\]|\\.)*)"')


def raw_range_limit(query: str) -> str:
    """The InfluxQL expression of the longest range `query` reads on the raw data."""
    divisor = max((EARLY_COPY_DIVISOR.get(m, 1) for m in _MEASUREMENTS.findall(query)), default=1)
    return "$raw_up_to_ms" if divisor == 1 else f"$raw_up_to_ms / {divisor}"


# A target whose long-range twin reads other data than its own query on the copy
# (a Spread, see fleet_from_spread) carries that query under this key until
# by_time_range takes it out; Grafana never sees it.
LONG_QUERY = "_long_range_query"


def by_time_range(target: Json) -> list[Json]:
    """`target` on the raw data for short ranges, and its twin on the downsampled copy for long ones."""
    target = dict(target)
    query = target["query"]
    long_source = target.pop(LONG_QUERY, query)
    limit = raw_range_limit(query)
    raw_range = "${__to} - ${__from} <= " + limit
    long_range = "${__to} - ${__from} > " + limit
    raw = dict(target, query=query.replace("$timeFilter", f"$timeFilter AND {raw_range}"))
    long_query = long_source.replace("$timeFilter", f"$timeFilter AND {long_range}").replace(
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
    The largest value is percentile 100: InfluxDB 1.x's percentile is the nearest
    rank, floor(n * p / 100 + 0.5) - 1, so p = 100 is the last of the sorted values
    (influxdata/influxdb 1.6, query/call_iterator.go,
    NewFloatPercentileReduceSliceFunc). It reads the points as median and
    percentile do, where max() over thousands of series took twice as long on
    InfluxDB 1.6.7 (2.9 s against 1.3 s for 4,096 score series over a day).
    The smallest stays min(): no rank gives the first value for every n.
    """
    if lowest_is_worst:
        return f'median("{field}") AS "median", percentile("{field}", 10) AS "p10", min("{field}") AS "min"'
    return f'median("{field}") AS "median", percentile("{field}", 90) AS "p90", percentile("{field}", 100) AS "max"'


def variable_filters(tags: Sequence[str]) -> str:
    """`tag_matches` for each tag, filtered by the template variable of the same name."""
    return " AND ".join(tag_matches(tag) for tag in tags)


def fleet(
    field: str, measurement: str, *, lowest_is_worst: bool, by: Sequence[str], extra_where: str, variable: str
) -> str:
    """The fleet as a distribution, answering only when `variable` is at "All"."""
    return influx_select(
        fleet_stats(field, lowest_is_worst=lowest_is_worst),
        measurement,
        by=by,
        extra_where=_where(extra_where, fleet_view(variable)),
    )


def fleet_from_spread(
    field: str, measurement: str, *, lowest_is_worst: bool, by: Sequence[str], filters: Sequence[str], variable: str
) -> str | None:
    """`fleet` over the catalog's Spread of `measurement`, for the copy; None when there is none for it.

    The Spread holds, per node and period, the median, p90 and max across the
    tags folded away (a validator's scores of all its evaluated miners, a node's
    GPUs). The fleet's median and p90 are then the median of the nodes' medians
    and p90s (the typical node's), and its max the largest max: exact. Reading a
    series per validator, not one per validator and evaluated miner, took the
    score panels over a day of the reference fleet from 7-8 s to under a second.
    """
    spread = SPREAD_OF.get(measurement)
    if spread is None or field not in spread.fields or lowest_is_worst or set(spread.across) & set(by):
        return None
    where = variable_filters([tag for tag in filters if tag not in spread.across])
    stats = f'median("{field}_median") AS "median", median("{field}_p90") AS "p90", max("{field}_max") AS "max"'
    return influx_select(stats, spread.name, by=by, extra_where=_where(where, fleet_view(variable)))


def nodes(field: str, measurement: str, *, agg: str, by: Sequence[str], extra_where: str, variable: str) -> str:
    """`agg` of `field` per node, answering only when a few values are chosen in `variable`."""
    return influx_select(f'{agg}("{field}")', measurement, by=by, extra_where=_where(extra_where, node_view(variable)))


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


def tokens_per_sec_sum() -> str:
    """The selected miners' throughput added up (one mean per miner first, then the sum)."""
    return influx_sum_over_nodes(
        'mean("tokens_per_sec") AS "tokens_per_sec"',
        'sum("tokens_per_sec") AS "tokens_per_sec"',
        "training_step",
        inner_by=("uid",),
    )


def counter_rates(fields: Mapping[str, str]) -> str:
    """Per-second rates of the client's counters, summed per sink.

    The client writes `<counter>_delta` beside each cumulative counter: what it
    grew by since the process's previous point (restarts included). The rate of an
    interval is then the plain sum of the deltas divided by the interval's length,
    with no derivative per process under a second aggregation.
    """
    rates = ", ".join(
        f'sum("{field}{DELTA_SUFFIX}") * 1000 / $__interval_ms AS "{alias}"' for alias, field in fields.items()
    )
    return influx_select(rates, "telemetry_client", by=("sink",), extra_where=tag_matches("sink"))


def most_dropped(count: int = 10) -> str:
    """The nodes whose processes dropped the most (latest cumulative counters), with their other counters."""
    latest = influx_select(
        'last("dropped") AS "dropped", last("queued") AS "queued", last("sent") AS "sent", '
        'last("retries") AS "retries", last("pending") AS "pending"',
        "telemetry_client",
        by=("uid", "runtime_id", "sink"),
        extra_where=tag_matches("sink"),
        per_interval=False,
    )
    return f'SELECT top("dropped", "uid", {count}) AS "dropped", "queued", "sent", "retries", "pending" FROM ({latest})'


def show_tag_values(key: str, source: str | None, depends_on: Sequence[str]) -> str:
    """SHOW TAG VALUES of `key`, narrowed by the variables chosen before it."""
    from_clause = f' FROM "{source}"' if source else ""
    where = " AND ".join(tag_matches(dep) for dep in depends_on)
    query = f'SHOW TAG VALUES{from_clause} WITH KEY = "{key}"'
    if where:
        query += f" WHERE {where}"
    return query


def stack_series(field: str, measurement: str, *, agg: str, by: Sequence[str]) -> str:
    """`agg` of `field` per interval and `by` group, of a measurement the stack writes: no node filter applies."""
    group = ", ".join(["time($__interval)", *(f'"{tag}"' for tag in by)])
    return f'SELECT {agg}("{field}") FROM "{measurement}" WHERE $timeFilter GROUP BY {group} fill(none)'
