"""The query language of each metrics store: every text and shape a panel or an alert rule takes from it.

A build writes for one metrics store (grafana.builder.backend); `current_dialect()`
is that store's `Dialect`, chosen once from the build's backend. The backend-neutral
helpers (grafana.builder.queries for the dashboards, grafana.alerting_src.queries
for the rules, the targets, variables and alert queries they make) ask it for
their text instead of knowing every language: InfluxQL for InfluxDB, MetricsQL
for VictoriaMetrics. A third store is one more `Dialect` subclass, listed in
DIALECTS under its backend name.

The dashboards' text of each language lives in grafana.builder.influxql and
grafana.builder.metricsql; the alert rules' text is written here.

The rules' queries each mean one thing over the rule's query window, per node (the
`network`, `role` and `uid` tags, plus any given), so that a rule means the same
on either store:

- InfluxQL selects over `$timeFilter` (the window, filled in by Grafana's InfluxDB
  data source) and groups by the tags;
- MetricsQL is an instant query at the end of the window whose rollups cover
  `[$__range]`, the window's length (Grafana's Prometheus data source fills it in:
  grafana/grafana pkg/promlib/models/query.go, interpolateVariables), aggregated
  `by` the same labels. VictoriaMetrics stores the field `f` of a measurement `m`
  as the metric `m_f`, with the tags as labels.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import ClassVar

from grafana.builder import influxql, metricsql
from grafana.builder.backend import Backend, current_backend
from grafana.builder.targets import (
    INFLUX,
    VICTORIAMETRICS,
    Json,
    influx_alias,
    influx_target,
    prometheus_legend,
    prometheus_target,
)

# The tags a rule's query keeps apart by default: one series per node.
NODE: tuple[str, ...] = ("network", "role", "uid")


class Dialect(ABC):
    """What the builder needs from one metrics store's query language.

    Dashboard views return query text unless they say otherwise; `legend`s are
    neutral ({uid} for a tag's value, {stat} for the value's name), `filters` are
    further tags, each filtered by the template variable of the same name. The
    `rule_*` queries are the alert rules' (over the rule's window, grouped `by`).
    """

    backend: ClassVar[Backend]
    store_name: ClassVar[str]  # as the rules' texts name the store
    datasource: ClassVar[dict[str, str]]  # the provisioned data source its panels and rules query

    # ------------------------------------------------------------ targets and variables

    @abstractmethod
    def target(self, ref: str, query: str, legend: str = "", table: bool = False) -> Json:
        """A panel target running `query`; a table's query gives one value per row."""

    @abstractmethod
    def panel_targets(self, target: Json) -> list[Json]:
        """The targets a panel carries for one of this dialect's targets (a store may split it by time range)."""

    @abstractmethod
    def tag_values(self, key: str, source: str | None, depends_on: Sequence[str]) -> str:
        """A template variable's query: the values of tag `key` (of measurement `source`, or of any),
        narrowed by the variables `depends_on` chosen before it."""

    @abstractmethod
    def alert_model(self, query: str) -> Json:
        """The data-source-specific fields of an alert query's model, between its datasource and intervalMs."""

    # ------------------------------------------------------------ dashboard views

    @abstractmethod
    def fleet_target(
        self,
        ref: str,
        legend: str,
        field: str,
        measurement: str,
        *,
        lowest_is_worst: bool,
        by: Sequence[str],
        filters: Sequence[str],
        variable: str,
    ) -> Json:
        """The fleet as a distribution (median, p90 and max, or p10 and min), answering only when
        `variable` is at "All"."""

    @abstractmethod
    def nodes(
        self, field: str, measurement: str, *, agg: str, by: Sequence[str], filters: Sequence[str], variable: str
    ) -> str:
        """`agg` of `field` per node, answering only when a few values are chosen in `variable`."""

    @abstractmethod
    def long_range_note(self, beyond: str, whose: str, across: str) -> str:
        """For a fleet panel's description: how its long ranges read other data, or "" when they do not."""

    @abstractmethod
    def node_series(self, field: str, measurement: str, *, agg: str, by: Sequence[str], filters: Sequence[str]) -> str:
        """`agg` of `field` per interval, one line per `by` group."""

    @abstractmethod
    def worst_nodes(
        self,
        field: str,
        measurement: str,
        *,
        count: int,
        lowest_is_worst: bool,
        agg: str,
        tag: str,
        filters: Sequence[str],
    ) -> str:
        """The `count` values of `tag` with the highest, or lowest, `agg` of `field` over the time range."""

    @abstractmethod
    def tokens_per_sec_sum(self) -> str:
        """The selected miners' throughput added up (one mean per miner first, then the sum)."""

    @abstractmethod
    def counter_rates(self, fields: Mapping[str, str]) -> str:
        """Per-second rates of the client's counters (alias to catalog field), summed per sink."""

    @abstractmethod
    def most_dropped(self, count: int) -> list[str]:
        """Table queries: the nodes whose processes dropped the most, then (where the language needs
        one query per column) the same nodes' other counters."""

    @abstractmethod
    def stack_series(self, field: str, measurement: str, *, agg: str, by: Sequence[str]) -> str:
        """`agg` of `field` per interval, one line per `by` group, of a measurement the stack writes about
        itself (no node filter: it has no node tag)."""

    # ------------------------------------------------------------ alert rules

    @abstractmethod
    def rule_mean(self, field: str, measurement: str, by: Sequence[str]) -> str:
        """The mean of every value of `field` in the window, per group (not a mean of per-series means)."""

    @abstractmethod
    def rule_maximum(self, field: str, measurement: str, by: Sequence[str]) -> str:
        """The largest value of `field` in the window, per group."""

    @abstractmethod
    def rule_last(self, field: str, measurement: str, by: Sequence[str]) -> str:
        """The newest value of `field` in the window, per group."""

    @abstractmethod
    def rule_spread(self, field: str, measurement: str, by: Sequence[str]) -> str:
        """The largest minus the smallest value of `field` in the window, per group."""

    @abstractmethod
    def rule_missing(self, field: str, present: str, measurement: str, by: Sequence[str]) -> str:
        """Points of the window that carry `present` but not `field`, per group."""

    @abstractmethod
    def rule_last_percent(self, part: str, whole: str, measurement: str, by: Sequence[str]) -> str:
        """The latest `part` as a percentage of the latest `whole`, per group."""

    @abstractmethod
    def rule_increase(self, counters: Sequence[str], measurement: str, by: Sequence[str]) -> str:
        """How much the cumulative `counters` grew in the window, added up per group; none where one is missing."""

    @abstractmethod
    def rule_points(self, field: str, measurements: Sequence[str], by: Sequence[str]) -> str:
        """How many points of `measurements` carry `field` in the window, per group (all together without `by`)."""

    @abstractmethod
    def rule_reporting(self, field: str, measurements: Sequence[str], steps: str, step_seconds: str) -> str:
        """Per node seen in the window: 0 when it sent no point with `field` for the last `steps` x `step_seconds`."""


class InfluxQL(Dialect):
    """InfluxDB 1.x's InfluxQL, through Grafana's InfluxDB data source (raw queries)."""

    backend = "influxdb"
    store_name = "InfluxDB"
    datasource = INFLUX

    def target(self, ref: str, query: str, legend: str = "", table: bool = False) -> Json:
        return influx_target(ref, query, influx_alias(legend), table)

    def panel_targets(self, target: Json) -> list[Json]:
        """The raw data for short ranges, the downsampled copy for long ones (influxql.by_time_range)."""
        return influxql.by_time_range(target)

    def tag_values(self, key: str, source: str | None, depends_on: Sequence[str]) -> str:
        return influxql.show_tag_values(key, source, depends_on)

    def alert_model(self, query: str) -> Json:
        """A raw InfluxQL query, as the dashboards write them."""
        return {"rawQuery": True, "query": query, "resultFormat": "time_series"}

    def fleet_target(
        self,
        ref: str,
        legend: str,
        field: str,
        measurement: str,
        *,
        lowest_is_worst: bool,
        by: Sequence[str],
        filters: Sequence[str],
        variable: str,
    ) -> Json:
        """Its long-range twin reads the catalog's Spread of `measurement` where there is one for it."""
        where = influxql.variable_filters(filters)
        query = influxql.fleet(
            field, measurement, lowest_is_worst=lowest_is_worst, by=by, extra_where=where, variable=variable
        )
        target = self.target(ref, query, legend)
        spread = influxql.fleet_from_spread(
            field, measurement, lowest_is_worst=lowest_is_worst, by=by, filters=filters, variable=variable
        )
        if spread:
            target[influxql.LONG_QUERY] = spread
        return target

    def nodes(
        self, field: str, measurement: str, *, agg: str, by: Sequence[str], filters: Sequence[str], variable: str
    ) -> str:
        where = influxql.variable_filters(filters)
        return influxql.nodes(field, measurement, agg=agg, by=by, extra_where=where, variable=variable)

    def long_range_note(self, beyond: str, whose: str, across: str) -> str:
        return (
            f" (beyond {beyond}: {whose} median and p90{across} per 5 minutes, then their median;"
            " the maximum stays exact)"
        )

    def node_series(self, field: str, measurement: str, *, agg: str, by: Sequence[str], filters: Sequence[str]) -> str:
        return influxql.influx_select(
            f'{agg}("{field}")', measurement, by=by, extra_where=influxql.variable_filters(filters)
        )

    def worst_nodes(
        self,
        field: str,
        measurement: str,
        *,
        count: int,
        lowest_is_worst: bool,
        agg: str,
        tag: str,
        filters: Sequence[str],
    ) -> str:
        return influxql.worst_nodes(
            field,
            measurement,
            count=count,
            lowest_is_worst=lowest_is_worst,
            agg=agg,
            tag=tag,
            extra_where=influxql.variable_filters(filters),
        )

    def tokens_per_sec_sum(self) -> str:
        return influxql.tokens_per_sec_sum()

    def counter_rates(self, fields: Mapping[str, str]) -> str:
        return influxql.counter_rates(fields)

    def most_dropped(self, count: int) -> list[str]:
        """One query: a subquery keeps the other counters beside `dropped`."""
        return [influxql.most_dropped(count)]

    def stack_series(self, field: str, measurement: str, *, agg: str, by: Sequence[str]) -> str:
        return influxql.stack_series(field, measurement, agg=agg, by=by)

    @staticmethod
    def _select(fields: str, measurements: Sequence[str], by: Sequence[str]) -> str:
        """InfluxQL over the rule's own window ($timeFilter), one series per `by` group."""
        sources = ", ".join(f'"{m}"' for m in measurements)
        group = ", ".join(f'"{tag}"' for tag in by)
        query = f"SELECT {fields} FROM {sources} WHERE $timeFilter"
        return query + (f" GROUP BY {group}" if group else "")

    def rule_mean(self, field: str, measurement: str, by: Sequence[str]) -> str:
        return self._select(f'mean("{field}")', [measurement], by)

    def rule_maximum(self, field: str, measurement: str, by: Sequence[str]) -> str:
        return self._select(f'max("{field}")', [measurement], by)

    def rule_last(self, field: str, measurement: str, by: Sequence[str]) -> str:
        return self._select(f'last("{field}")', [measurement], by)

    def rule_spread(self, field: str, measurement: str, by: Sequence[str]) -> str:
        return self._select(f'spread("{field}")', [measurement], by)

    def rule_missing(self, field: str, present: str, measurement: str, by: Sequence[str]) -> str:
        """Null for a group without any `field` value."""
        return self._select(f'count("{present}") - count("{field}")', [measurement], by)

    def rule_last_percent(self, part: str, whole: str, measurement: str, by: Sequence[str]) -> str:
        return self._select(f'last("{part}") / last("{whole}") * 100', [measurement], by)

    def rule_increase(self, counters: Sequence[str], measurement: str, by: Sequence[str]) -> str:
        """`spread(a) + spread(b)`: null where one of them is."""
        return self._select(" + ".join(f'spread("{counter}")' for counter in counters), [measurement], by)

    def rule_points(self, field: str, measurements: Sequence[str], by: Sequence[str]) -> str:
        return self._select(f'count("{field}")', measurements, by)

    def rule_reporting(self, field: str, measurements: Sequence[str], steps: str, step_seconds: str) -> str:
        """Points per step, fill(0) for the steps without any, then the moving average over the last `steps`.

        InfluxDB 1.x pushes an outer query's time range into its subquery, so "was
        reporting" (the window) and "went quiet" (the last steps) come from one
        query's buckets.
        """
        group = ", ".join(f'"{tag}"' for tag in NODE)
        return (
            f'SELECT moving_average(count("{field}"), {steps}) FROM '
            + ", ".join(f'"{m}"' for m in measurements)
            + f" WHERE $timeFilter GROUP BY time({step_seconds}s), {group} fill(0)"
        )


def _by(labels: Sequence[str]) -> str:
    return f" by ({', '.join(labels)})" if labels else ""


class MetricsQL(Dialect):
    """VictoriaMetrics' MetricsQL, through Grafana's Prometheus data source."""

    backend = "victoriametrics"
    store_name = "VictoriaMetrics"
    datasource = VICTORIAMETRICS

    def target(self, ref: str, query: str, legend: str = "", table: bool = False) -> Json:
        return prometheus_target(ref, query, prometheus_legend(legend), table)

    def panel_targets(self, target: Json) -> list[Json]:
        """As it is: VictoriaMetrics (open source) has no downsampled copy, every range reads the raw samples."""
        return [target]

    def tag_values(self, key: str, source: str | None, depends_on: Sequence[str]) -> str:
        return metricsql.label_values(key, source, depends_on)

    def alert_model(self, query: str) -> Json:
        """Grafana's Prometheus query, run as an instant query at the end of the window.

        The model's fields are grafana/grafana pkg/promlib/models/query.go's: `expr`,
        `instant`/`range`, `editorMode`, beside the common refId, datasource,
        intervalMs and maxDataPoints; `$__range` in `expr` is the window's length in
        seconds, as Grafana's Prometheus backend interpolates it.
        """
        return {"expr": query, "instant": True, "range": False, "editorMode": "code"}

    def fleet_target(
        self,
        ref: str,
        legend: str,
        field: str,
        measurement: str,
        *,
        lowest_is_worst: bool,
        by: Sequence[str],
        filters: Sequence[str],
        variable: str,
    ) -> Json:
        query = metricsql.fleet(
            field, measurement, lowest_is_worst=lowest_is_worst, by=by, filters=filters, variable=variable
        )
        return self.target(ref, query, legend)

    def nodes(
        self, field: str, measurement: str, *, agg: str, by: Sequence[str], filters: Sequence[str], variable: str
    ) -> str:
        return metricsql.nodes(field, measurement, agg=agg, by=by, filters=filters, variable=variable)

    def long_range_note(self, beyond: str, whose: str, across: str) -> str:
        """Nothing: every range reads the raw samples."""
        return ""

    def node_series(self, field: str, measurement: str, *, agg: str, by: Sequence[str], filters: Sequence[str]) -> str:
        return metricsql.per_node(field, measurement, agg=agg, by=by, filters=filters)

    def worst_nodes(
        self,
        field: str,
        measurement: str,
        *,
        count: int,
        lowest_is_worst: bool,
        agg: str,
        tag: str,
        filters: Sequence[str],
    ) -> str:
        return metricsql.worst_nodes(
            field, measurement, count=count, lowest_is_worst=lowest_is_worst, agg=agg, tag=tag, filters=filters
        )

    def tokens_per_sec_sum(self) -> str:
        return metricsql.tokens_per_sec_sum()

    def counter_rates(self, fields: Mapping[str, str]) -> str:
        return metricsql.counter_rates(fields)

    def most_dropped(self, count: int) -> list[str]:
        """The top nodes by `dropped`, then one instant query per other counter, joined on uid in the table."""
        top, columns = metricsql.most_dropped(count)
        return [top, *columns]

    def stack_series(self, field: str, measurement: str, *, agg: str, by: Sequence[str]) -> str:
        return metricsql.stack_series(field, measurement, agg=agg, by=by)

    @staticmethod
    def _window(field: str, measurement: str) -> str:
        """The series of `field` in `measurement`, over the window."""
        return f"{measurement}_{field}[$__range]"

    @staticmethod
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

    def rule_mean(self, field: str, measurement: str, by: Sequence[str]) -> str:
        return metricsql.mean_of_samples(self._window(field, measurement), by)

    def rule_maximum(self, field: str, measurement: str, by: Sequence[str]) -> str:
        return f"max{_by(by)} (max_over_time({self._window(field, measurement)}))"

    def rule_last(self, field: str, measurement: str, by: Sequence[str]) -> str:
        """Where a group holds several series (the same host written twice), the largest of their latest values."""
        return f"max{_by(by)} (last_over_time({self._window(field, measurement)}))"

    def rule_spread(self, field: str, measurement: str, by: Sequence[str]) -> str:
        series = self._window(field, measurement)
        return f"max{_by(by)} (max_over_time({series})) - min{_by(by)} (min_over_time({series}))"

    def rule_missing(self, field: str, present: str, measurement: str, by: Sequence[str]) -> str:
        """A group without any `field` value has every point missing it (`or ... * 0` stands in for the series)."""
        having = f"sum{_by(by)} (count_over_time({self._window(present, measurement)}))"
        counted = f"sum{_by(by)} (count_over_time({self._window(field, measurement)}))"
        return f"{having} - ({counted} or {having} * 0)"

    def rule_last_percent(self, part: str, whole: str, measurement: str, by: Sequence[str]) -> str:
        """Where a group holds several series (processes of one node reporting the same device), the largest
        of their latest values."""
        numerator = f"max{_by(by)} (last_over_time({self._window(part, measurement)}))"
        denominator = f"max{_by(by)} (last_over_time({self._window(whole, measurement)}))"
        return f"{numerator} / {denominator} * 100"

    def rule_increase(self, counters: Sequence[str], measurement: str, by: Sequence[str]) -> str:
        """One-to-one on every label: a process without one of the counters drops out, as InfluxQL's null does."""
        rollups = [f"range_over_time({measurement}_{counter}[$__range])" for counter in counters]
        return f"sum{_by(by)} (\n  " + "\n  + ".join(rollups) + "\n)"

    def rule_points(self, field: str, measurements: Sequence[str], by: Sequence[str]) -> str:
        return f"sum{_by(by)} ({self._rollups('count_over_time', field, measurements)})"

    def rule_reporting(self, field: str, measurements: Sequence[str], steps: str, step_seconds: str) -> str:
        """1 while the node's last point is younger than `steps` x `step_seconds`, else 0 (`< bool`)."""
        last_seen = f"max{_by(NODE)} ({self._rollups('tlast_over_time', field, measurements)})"
        return f"(time() - {last_seen}) < bool ({steps} * {step_seconds})"


# One dialect per backend name (grafana.builder.backend.BACKENDS).
DIALECTS: dict[Backend, Dialect] = {dialect.backend: dialect for dialect in (InfluxQL(), MetricsQL())}


def current_dialect() -> Dialect:
    """The dialect of the backend being built for (`building_for`; InfluxDB outside it)."""
    return DIALECTS[current_backend()]
