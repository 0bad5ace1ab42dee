"""MetricsQL text of the dashboards' panels, for VictoriaMetrics: the same views as the InfluxQL ones.

VictoriaMetrics stores a MetricsLogger point's field as the metric
`<measurement>_<field>` (e.g. `training_step_loss`) and its tags as labels, so
every selector here names a catalog measurement and field and filters on catalog
tags, like the InfluxQL twin (grafana/builder/influxql.py).

How an InfluxQL construct maps (docs/dashboards.md has the table):

- `GROUP BY time($__interval)` is a rollup over `[$__interval]` evaluated at each
  step of the range query (Grafana sends the interval as the step). A point of
  VictoriaMetrics covers (t - interval, t] where InfluxDB's bucket covers
  [t, t + interval): the same samples, labelled one interval later.
- A node's mean is the sum of its samples over their count, across all its
  series (several devices, processes, or a restarted run's new `runtime_id`), as
  InfluxQL's `mean()` over the node's group: not a mean of per-series means. Its
  last value is the newest sample among its series; max, min, count and sum are
  per-series rollups combined by `max`, `min` and `sum`.
- A fleet statistic across the samples of an interval (median, p90, max) is a
  per-series rollup first (the series' mean over the interval, or its max or min
  for the extremes), then `quantile`/`max` across the series. With one sample per
  series per interval (a node samples every 10-30 s; the interval at six hours is
  30 s) it is the same number; over longer intervals the median and p90 are those
  of the nodes' means, the max and min still those of every sample.
- Fleet or nodes: MetricsQL has no comparison of strings, so the condition is a
  series that exists or not: `label_set(vector(1), "sel", "${uid:raw}")` holds
  ".*" exactly when the uid variable is at "All" (its allValue, inserted
  unformatted), and `label_match`/`label_mismatch` keep or drop it; `and on()`
  then keeps the panel's series only when that condition series exists.
- TOP/BOTTOM over the time range: an instant `topk`/`bottomk` over `[$__range]`.
- Counter rates: the client's `<counter>_delta` samples summed per interval
  (`sum_over_time(...[$__interval])`), summed per sink, divided by the interval.

VictoriaMetrics (open source) has no downsampled copy: every range reads the raw
samples, so there is no raw/long pair of targets and no `$raw_up_to_ms`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from telemetry_client.catalog import DELTA_SUFFIX

# The labels every panel filters on, each by the template variable of the same name.
NODE_LABELS: tuple[str, ...] = ("network", "role", "uid", "version")

# A node's `agg` over a window that is one rollup per series then one aggregation
# across the node's series (several devices, processes or runs); "mean" and "last"
# need more than that (mean_of_samples, newest_sample).
ROLLUPS: dict[str, tuple[str, str]] = {
    "max": ("max_over_time", "max"),
    "min": ("min_over_time", "min"),
    "count": ("count_over_time", "sum"),
    "sum": ("sum_over_time", "sum"),
}
AGGREGATES: tuple[str, ...] = ("mean", "last", *ROLLUPS)


def metric(measurement: str, field: str) -> str:
    """The metric name VictoriaMetrics gives a MetricsLogger field."""
    return f"{measurement}_{field}"


def selector(measurement: str, field: str, filters: Sequence[str] = ()) -> str:
    """`<measurement>_<field>{network=~"$network", ...}`: the standard filters and `filters`."""
    matchers = ", ".join(f'{label}=~"${label}"' for label in (*NODE_LABELS, *filters))
    return f"{metric(measurement, field)}{{{matchers}}}"


def _by(labels: Sequence[str]) -> str:
    return f" by ({', '.join(labels)}) " if labels else ""


def mean_of_samples(series: str, by: Sequence[str]) -> str:
    """The mean of every sample of `series` (a range selector, `m{...}[window]`) per `by` group.

    The sum of the samples over their count: a group's series (devices, processes,
    runs) may hold different numbers of samples, and a mean of per-series means
    would weigh a short-lived series like a long one, where InfluxQL's `mean()`
    weighs every sample alike.
    """
    return f"sum{_by(by)}(sum_over_time({series})) / sum{_by(by)}(count_over_time({series}))"


def newest_sample(series: str, by: Sequence[str]) -> str:
    """The value of the newest sample of `series` (a range selector) per `by` group, whichever series holds it.

    Each series' last value is kept only where its time is the group's latest, so a
    process that stopped within the window (a restart's old `runtime_id`) does not
    count; series whose newest samples share that instant (one point per device)
    are averaged, where InfluxQL's `last()` returns one of them.
    """
    newest = f"tlast_over_time({series})"
    latest = f"max{_by(by)}({newest})"
    return f"avg{_by(by)}(last_over_time({series}) and ({newest} == on({', '.join(by)}) group_left {latest}))"


def fleet_view(variable: str = "uid") -> str:
    """A series exactly when `variable` is at "All"."""
    return f'label_match(label_set(vector(1), "sel", "${{{variable}:raw}}"), "sel", "\\\\.\\\\*")'


def node_view(variable: str = "uid") -> str:
    """A series exactly when one value or a handful are chosen in `variable`."""
    return f'label_mismatch(label_set(vector(1), "sel", "${{{variable}:raw}}"), "sel", "\\\\.\\\\*")'


def per_node(
    field: str,
    measurement: str,
    *,
    agg: str,
    by: Sequence[str],
    filters: Sequence[str] = (),
    window: str = "$__interval",
) -> str:
    """`agg` of `field` per `by` (a node, a device...) over each `window`, over all the group's series."""
    series = f"{selector(measurement, field, filters)}[{window}]"
    if agg == "mean":
        return mean_of_samples(series, by)
    if agg == "last":
        return newest_sample(series, by)
    if agg not in ROLLUPS:
        raise ValueError(f"no MetricsQL rollup for {agg!r}: expected one of {', '.join(AGGREGATES)}")
    rollup, combine = ROLLUPS[agg]
    return f"{combine}{_by(by)}({rollup}({series}))"


def fleet_stats(
    field: str, measurement: str, *, lowest_is_worst: bool, by: Sequence[str], filters: Sequence[str]
) -> str:
    """Median, p90 (or p10) and the worst value across the series, per interval, each labelled `stat`."""
    sel = selector(measurement, field, filters)
    mean = f"avg_over_time({sel}[$__interval])"
    if lowest_is_worst:
        parts = [
            ("median", f"quantile{_by(by)}(0.5, {mean})"),
            ("p10", f"quantile{_by(by)}(0.1, {mean})"),
            ("min", f"min{_by(by)}(min_over_time({sel}[$__interval]))"),
        ]
    else:
        parts = [
            ("median", f"quantile{_by(by)}(0.5, {mean})"),
            ("p90", f"quantile{_by(by)}(0.9, {mean})"),
            ("max", f"max{_by(by)}(max_over_time({sel}[$__interval]))"),
        ]
    return " or ".join(f'label_set({expr}, "stat", "{name}")' for name, expr in parts)


def fleet(
    field: str, measurement: str, *, lowest_is_worst: bool, by: Sequence[str], filters: Sequence[str], variable: str
) -> str:
    """The fleet as a distribution, answering only when `variable` is at "All"."""
    stats = fleet_stats(field, measurement, lowest_is_worst=lowest_is_worst, by=by, filters=filters)
    return f"({stats}) and on() {fleet_view(variable)}"


def nodes(field: str, measurement: str, *, agg: str, by: Sequence[str], filters: Sequence[str], variable: str) -> str:
    """`agg` of `field` per node, answering only when a few values are chosen in `variable`."""
    return f"{per_node(field, measurement, agg=agg, by=by, filters=filters)} and on() {node_view(variable)}"


def worst_nodes(
    field: str,
    measurement: str,
    *,
    count: int = 5,
    lowest_is_worst: bool = False,
    agg: str = "mean",
    tag: str = "uid",
    filters: Sequence[str] = (),
) -> str:
    """The `count` values of `tag` with the highest, or lowest, `agg` of `field` over the time range (instant)."""
    selector_fn = "bottomk" if lowest_is_worst else "topk"
    inner = per_node(field, measurement, agg=agg, by=(tag,), filters=filters, window="$__range")
    return f"{selector_fn}({count}, {inner})"


def tokens_per_sec_sum() -> str:
    """The selected miners' throughput added up (one mean per miner first, then the sum)."""
    return f"sum({per_node('tokens_per_sec', 'training_step', agg='mean', by=('uid',))})"


def counter_rates(fields: Mapping[str, str]) -> str:
    """Per-second rates of the client's counters, summed per sink, each series labelled `stat` with its alias.

    The sum of the `<counter>_delta` samples of an interval divided by the
    interval's length, as on InfluxDB.
    """
    parts = []
    for alias, field in fields.items():
        sel = selector("telemetry_client", f"{field}{DELTA_SUFFIX}", ("sink",))
        rate = f"sum by (sink) (sum_over_time({sel}[$__interval])) * 1000 / $__interval_ms"
        parts.append(f'label_set({rate}, "stat", "{alias}")' if len(fields) > 1 else rate)
    return " or ".join(parts)


MOST_DROPPED_COLUMNS = ("queued", "sent", "retries", "pending")


def most_dropped(count: int = 10) -> tuple[str, list[str]]:
    """The nodes whose processes dropped the most (latest cumulative value, worst process and sink of each),
    and the same nodes' other counters (the largest of their processes), one instant query each."""

    def latest(field: str) -> str:
        return f"max by (uid) (last_over_time({selector('telemetry_client', field, ('sink',))}[$__range]))"

    top = f"topk({count}, {latest('dropped')})"
    return top, [f"{latest(column)} and on(uid) {top}" for column in MOST_DROPPED_COLUMNS]


def label_values(key: str, source: str | None, depends_on: Sequence[str]) -> str:
    """Grafana's `label_values(selector, label)` variable query, narrowed by the variables chosen before it.

    A selector needs one matcher that does not match the empty string: the metric
    names of the measurement `source`, or any metric name.
    """
    matchers = [f'__name__=~"{source}_.+"' if source else '__name__=~".+"']
    matchers += [f'{dep}=~"${dep}"' for dep in depends_on]
    if not source and not depends_on:
        return f"label_values({key})"
    return f"label_values({{{', '.join(matchers)}}}, {key})"


def stack_series(field: str, measurement: str, *, agg: str, by: Sequence[str]) -> str:
    """`agg` of `field` per interval and `by` group, of a measurement the stack writes: no node filter applies."""
    if agg not in ROLLUPS:
        raise ValueError(f"no MetricsQL rollup for {agg!r}: expected one of {', '.join(ROLLUPS)}")
    rollup, combine = ROLLUPS[agg]
    return f"{combine}{_by(by)}({rollup}({metric(measurement, field)}[$__interval]))"
