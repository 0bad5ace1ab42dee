"""Backend-neutral panel queries: the helpers every dashboard source calls, and the LogQL text.

A dashboard source (grafana/dashboards_src/) asks for a view, such as "the fleet
as a distribution of this field, or one line per chosen node", and gets targets
in the language of the backend being built for: each helper asks the build's
dialect (grafana.builder.dialects.current_dialect), InfluxQL for InfluxDB (text
from grafana.builder.influxql), MetricsQL for VictoriaMetrics (from
grafana.builder.metricsql). Neither language's text lives in the dashboard sources.

Every metrics query names only measurements, fields and tags of
telemetry_client/catalog.py, and every LogQL selector only the Loki stream labels
the logging handler sets; tests/test_dashboards.py checks both.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from grafana.builder.dialects import current_dialect
from grafana.builder.targets import Json
from telemetry_client.catalog import DROP_REASONS as _CATALOG_DROP_REASONS

# Every reason the client drops data for: one series each on Telemetry health.
DROP_REASONS: tuple[str, ...] = tuple(_CATALOG_DROP_REASONS)


def metrics_target(ref: str, query: str, legend: str = "", table: bool = False) -> Json:
    """A target of the metrics backend being built for; `legend` is neutral ({uid}, {stat})."""
    return current_dialect().target(ref, query, legend, table)


def fleet_and_nodes(
    field: str,
    measurement: str,
    *,
    node_agg: str = "mean",
    lowest_is_worst: bool = False,
    by: Sequence[str] = (),
    node_by: Sequence[str] = ("uid",),
    node_legend: str = "{uid}",
    filters: Sequence[str] = (),
    prefix: str = "",
    variable: str = "uid",
    refs: tuple[str, str] = ("A", "B"),
) -> list[Json]:
    """The fleet as a distribution when every node is selected; one line per node when a few are.

    Two targets: A (median, p90 and max, or p10 and min when low is bad) over all
    the selected nodes' samples, and B (`node_agg` per node) when nodes are chosen
    in `variable` (uid, or eval_uid for the miners validators score). `filters`
    are further tags, each filtered by the template variable of the same name;
    `node_legend` names a node's line ({tag} for a tag's value).
    """
    dialect = current_dialect()
    tags = "".join(f" {{{tag}}}" for tag in by)
    node_by = (*node_by, *by)
    fleet = dialect.fleet_target(
        refs[0],
        f"{prefix}{{stat}}{tags}",
        field,
        measurement,
        lowest_is_worst=lowest_is_worst,
        by=by,
        filters=filters,
        variable=variable,
    )
    nodes = dialect.nodes(field, measurement, agg=node_agg, by=node_by, filters=filters, variable=variable)
    return [fleet, dialect.target(refs[1], nodes, f"{prefix}{node_legend}{tags}")]


def stack_series(ref: str, agg: str, field: str, measurement: str, *, by: Sequence[str], legend: str) -> Json:
    """`agg` of `field` per interval, one line per `by` group, of a measurement the stack writes about itself."""
    dialect = current_dialect()
    return dialect.target(ref, dialect.stack_series(field, measurement, agg=agg, by=by), legend)


def spread_note(beyond: str, whose: str, across: str = "") -> str:
    """For a fleet panel's description: how its long ranges read a Spread (InfluxDB; VictoriaMetrics has no copy)."""
    return current_dialect().long_range_note(beyond, whose, across)


def node_series(
    ref: str,
    agg: str,
    field: str,
    measurement: str,
    *,
    by: Sequence[str] = ("uid",),
    legend: str = "{uid}",
    filters: Sequence[str] = (),
) -> Json:
    """`agg` (mean, max, min, last...) of `field` per interval, one line per `by` (a node, a task...)."""
    query = current_dialect().node_series(field, measurement, agg=agg, by=by, filters=filters)
    return metrics_target(ref, query, legend)


def worst_nodes(
    field: str,
    measurement: str,
    *,
    ref: str = "A",
    count: int = 5,
    lowest_is_worst: bool = False,
    agg: str = "mean",
    tag: str = "uid",
    filters: Sequence[str] = (),
) -> Json:
    """A table of the `count` nodes (by `tag`) with the highest, or lowest, `agg` of `field` over the time range.

    One value per node, then TOP/BOTTOM keeps the few, named: a short table
    whatever the fleet's size.
    """
    query = current_dialect().worst_nodes(
        field, measurement, count=count, lowest_is_worst=lowest_is_worst, agg=agg, tag=tag, filters=filters
    )
    return metrics_target(ref, query, table=True)


def fleet_tokens_per_sec_target() -> Json:
    """The selected miners' throughput added up (one mean per miner first, then the sum)."""
    return metrics_target("A", current_dialect().tokens_per_sec_sum(), "tokens/s")


def counter_rates(fields: Mapping[str, str], *, ref: str = "A", legend: str = "{sink}") -> Json:
    """Per-second rates of the client's counters (alias to catalog field), summed per sink.

    The client writes `<counter>_delta` beside each cumulative counter: what it
    grew by since the process's previous point (restarts included). The rate of an
    interval is then the plain sum of the deltas divided by the interval's length,
    with no derivative per process under a second aggregation. With several
    counters, {stat} in `legend` names each one's alias.
    """
    return metrics_target(ref, current_dialect().counter_rates(fields), legend)


def most_dropped_nodes(count: int = 10) -> list[Json]:
    """A table of the nodes whose processes dropped the most records, with their other counters."""
    queries = current_dialect().most_dropped(count)
    refs = "ABCDEFGH"
    if len(queries) > len(refs):
        raise ValueError(f"{len(queries)} queries for one table: at most {len(refs)}")
    return [metrics_target(ref, query, table=True) for ref, query in zip(refs, queries, strict=False)]


# The label Loki gives each series and stream of a query that reads several tenants
# (grafana/loki pkg/querier/multi_tenant_querier.go, defaultTenantLabel). In production
# every node pushes into its own tenant, named by the edge after the node's uid from its
# credential; the local stack has one tenant and no such label.
TENANT_LABEL = "__tenant_id__"


def uid_from_tenant(expr: str) -> str:
    """A LogQL metric `expr` whose `uid` is the tenant's where Loki names one, the stream's own otherwise.

    label_replace runs after Loki added the tenant label, which a pipeline stage never
    sees ("Tenant ID filtering in stages is not supported", Loki's multi-tenancy docs):
    so in production a node's lines count under the uid of the credential that pushed
    them whatever `uid` label it wrote; on a single-tenant Loki (no tenant label, the
    regex does not match "") the series keep their `uid` label.
    """
    return f'label_replace({expr}, "uid", "$1", "{TENANT_LABEL}", "(.+)")'


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
