"""The downsampled copy that dashboards read for time ranges longer than six hours.

Every catalog measurement is copied at one point per DOWNSAMPLE_EVERY per series
(all tags kept, the same field names), each field reduced the way its catalog
`rollup` says: mean for levels, max or min for extremes, sum for the per-interval
growth of counters (so a rate over the copy is the same plain sum), last for
cumulative counters. Dashboards then run the same query text on either copy.

- InfluxDB 1.x: a retention policy DOWNSAMPLED_RP beside the raw one, filled by
  one continuous query per measurement (`influxql_setup`).
- InfluxDB 2.x: a second bucket with a DBRP mapping (database = the raw
  bucket's name, retention policy DOWNSAMPLED_RP), filled by one task per
  measurement (`flux_task`); compose/influxdb/init and the Ansible influxdb role
  create both. Task scripts hold the bucket names as @RAW_BUCKET@ and
  @DOWNSAMPLED_BUCKET@, filled in when the task is created.
- InfluxDB 3.x has neither continuous queries nor tasks; docs/dashboards.md says
  what to do there.

Beside the copy, the same runs write each catalog Spread (telemetry_client/
catalog.py): per node and period, the median, p90 and max of a measurement's
fields across some tags (the scores a validator gave all the miners it
evaluated, a node's GPUs), read by the fleet view of a long range in place of
thousands of series.

Each run (every RUN_EVERY) recomputes the periods of the last RECOMPUTE, the
current partial one included: the copy lags the raw data by about a minute, and
points that arrive a little late (a node's buffer draining after a short outage)
still reach it. The oldest period is whole: InfluxDB 1.x truncates the start of a
continuous query's range to its GROUP BY interval (services/continuous_querier/
service.go, ExecuteContinuousQuery), and the tasks truncate theirs the same way.
"""

from __future__ import annotations

from grafana.builder.influxql import DOWNSAMPLE_EVERY, DOWNSAMPLED_RP
from telemetry_client.catalog import MEASUREMENTS, SPREADS, Measurement, Spread

RECOMPUTE = "15m"  # how far back every run recomputes (whole periods)
RUN_EVERY = "1m"  # how often the copy is brought up to date
RAW_RP = "autogen"  # the default retention policy InfluxDB 1.x creates with a database
ROLLUPS = ("mean", "max", "min", "sum", "last")


def rollup_select(measurement: Measurement) -> str:
    """The SELECT list that reduces one period of `measurement`, keeping every field's name."""
    parts = []
    for field in measurement.fields:
        if field.kind == "string":
            continue
        if field.rollup not in ROLLUPS:
            raise ValueError(f"{measurement.name}.{field.name}: unknown rollup {field.rollup!r}")
        parts.append(f'{field.rollup}("{field.name}") AS "{field.name}"')
    return ", ".join(parts)


def _into_select(database: str, raw_rp: str, measurement: Measurement, where: str = "") -> str:
    return (
        f'SELECT {rollup_select(measurement)} INTO "{database}"."{DOWNSAMPLED_RP}"."{measurement.name}" '
        f'FROM "{database}"."{raw_rp}"."{measurement.name}"{where} GROUP BY time({DOWNSAMPLE_EVERY}), *'
    )


# A Spread's statistics in InfluxQL: median() is the mean of the two middle values
# for an even count, percentile() the nearest rank (influxdata/influxdb 1.6,
# query/call_iterator.go), max() the largest.
_INFLUXQL_STAT = {"median": 'median("{f}")', "p90": 'percentile("{f}", 90)', "max": 'max("{f}")'}


def spread_select(spread: Spread) -> str:
    """The SELECT list that reduces one period of `spread.source` to its spread across `spread.across`."""
    return ", ".join(
        f'{_INFLUXQL_STAT[stat].format(f=field)} AS "{field}_{stat}"'
        for field in spread.fields
        for stat in spread.STATS
    )


def _spread_into_select(database: str, raw_rp: str, spread: Spread, where: str = "") -> str:
    group = ", ".join(f'"{tag}"' for tag in spread.group_tags)
    return (
        f'SELECT {spread_select(spread)} INTO "{database}"."{DOWNSAMPLED_RP}"."{spread.name}" '
        f'FROM "{database}"."{raw_rp}"."{spread.source}"{where} GROUP BY time({DOWNSAMPLE_EVERY}), {group}'
    )


def _continuous_query(database: str, name: str, select: str) -> str:
    return (
        f'CREATE CONTINUOUS QUERY "downsample_{name}" ON "{database}" '
        f"RESAMPLE EVERY {RUN_EVERY} FOR {RECOMPUTE} BEGIN {select} END"
    )


def continuous_query(database: str, measurement: Measurement, raw_rp: str = RAW_RP) -> str:
    """The InfluxDB 1.x continuous query that keeps `measurement`'s copy up to date."""
    return _continuous_query(database, measurement.name, _into_select(database, raw_rp, measurement))


def spread_continuous_query(database: str, spread: Spread, raw_rp: str = RAW_RP) -> str:
    """The InfluxDB 1.x continuous query that keeps `spread` up to date (from the raw data)."""
    return _continuous_query(database, spread.name, _spread_into_select(database, raw_rp, spread))


def influxql_setup(
    database: str, *, raw_rp: str = RAW_RP, raw_retention: str = "30d", downsampled_retention: str = "400d"
) -> list[str]:
    """InfluxQL for InfluxDB 1.x: both retentions, then one continuous query per measurement.

    Run once per database (CREATE ... is idempotent when nothing changed; a
    changed continuous query must be dropped first).
    """
    statements = [
        f'ALTER RETENTION POLICY "{raw_rp}" ON "{database}" DURATION {raw_retention} DEFAULT',
        f'CREATE RETENTION POLICY "{DOWNSAMPLED_RP}" ON "{database}" DURATION {downsampled_retention} REPLICATION 1',
    ]
    statements += [continuous_query(database, m, raw_rp) for m in MEASUREMENTS]
    statements += [spread_continuous_query(database, s, raw_rp) for s in SPREADS]
    return statements


def influxql_backfill(database: str, start_ms: int, end_ms: int, *, raw_rp: str = RAW_RP) -> list[str]:
    """SELECT ... INTO statements that fill the copy for data written before the continuous queries."""
    where = f" WHERE time >= {start_ms}ms AND time < {end_ms}ms"
    return [_into_select(database, raw_rp, m, where) for m in MEASUREMENTS] + [
        _spread_into_select(database, raw_rp, s, where) for s in SPREADS
    ]


def flux_task(measurement: Measurement) -> str:
    """The InfluxDB 2.x task that keeps `measurement`'s copy up to date (one pipeline per rollup)."""
    by_rollup: dict[str, list[str]] = {}
    for field in measurement.fields:
        if field.kind != "string":
            by_rollup.setdefault(field.rollup, []).append(field.name)
    lines = [
        f"// Downsamples {measurement.name} into one point per {DOWNSAMPLE_EVERY} per series"
        " (generated by grafana/build_dashboards.py).",
        'import "date"',
        "",
        f'option task = {{name: "downsample_{measurement.name}", every: {RUN_EVERY}, offset: 10s}}',
        "",
        "data =",
        '    from(bucket: "@RAW_BUCKET@")',
        f"        |> range(start: date.truncate(t: -{RECOMPUTE}, unit: {DOWNSAMPLE_EVERY}))",
        f'        |> filter(fn: (r) => r._measurement == "{measurement.name}")',
    ]
    for rollup in ROLLUPS:
        fields = by_rollup.get(rollup)
        if not fields:
            continue
        names = ", ".join(f'"{name}"' for name in fields)
        lines += [
            "",
            "data",
            f"    |> filter(fn: (r) => contains(value: r._field, set: [{names}]))",
            f'    |> aggregateWindow(every: {DOWNSAMPLE_EVERY}, fn: {rollup}, createEmpty: false, timeSrc: "_start")',
            '    |> to(bucket: "@DOWNSAMPLED_BUCKET@")',
        ]
    return "\n".join(lines) + "\n"


# A Spread's statistics in Flux, chosen to match InfluxQL's: exact_mean averages
# the two middle values, exact_selector returns a stored value (the nearest rank);
# the default, estimate_tdigest, would be an estimate (docs.influxdata.com/flux/v0/
# stdlib/universe/quantile/).
_FLUX_STAT = {
    "median": '(column, tables=<-) => tables |> quantile(q: 0.5, method: "exact_mean", column: column)',
    "p90": '(column, tables=<-) => tables |> quantile(q: 0.9, method: "exact_selector", column: column)',
    "max": "max",
}


def spread_flux_task(spread: Spread) -> str:
    """The InfluxDB 2.x task that keeps `spread` up to date (one pipeline per statistic).

    Renaming _measurement and _field in map() moves each row to the table of its
    new group key (docs.influxdata.com/flux/v0/stdlib/universe/map/), so to()
    writes the Spread's series.
    """
    group = ", ".join(f'"{tag}"' for tag in ("_measurement", "_field", *spread.group_tags))
    names = ", ".join(f'"{name}"' for name in spread.fields)
    lines = [
        f"// {spread.name}: median, p90 and max of {spread.source} across {', '.join(spread.across)}, per node"
        f" and {DOWNSAMPLE_EVERY} (generated by grafana/build_dashboards.py).",
        'import "date"',
        "",
        f'option task = {{name: "downsample_{spread.name}", every: {RUN_EVERY}, offset: 10s}}',
        "",
        "data =",
        '    from(bucket: "@RAW_BUCKET@")',
        f"        |> range(start: date.truncate(t: -{RECOMPUTE}, unit: {DOWNSAMPLE_EVERY}))",
        f'        |> filter(fn: (r) => r._measurement == "{spread.source}")',
        f"        |> filter(fn: (r) => contains(value: r._field, set: [{names}]))",
        f"        |> group(columns: [{group}])",
    ]
    for stat in spread.STATS:
        lines += [
            "",
            "data",
            f"    |> aggregateWindow(every: {DOWNSAMPLE_EVERY}, fn: {_FLUX_STAT[stat]},"
            ' createEmpty: false, timeSrc: "_start")',
            f'    |> map(fn: (r) => ({{r with _measurement: "{spread.name}", _field: r._field + "_{stat}"}}))',
            '    |> to(bucket: "@DOWNSAMPLED_BUCKET@")',
        ]
    return "\n".join(lines) + "\n"


def render() -> dict[str, str]:
    """Generated files below grafana/downsampling/: 1.x InfluxQL and the 2.x task scripts."""
    files = {
        "influxdb1.influxql": '-- InfluxDB 1.x, database "telemetry": retentions and continuous queries\n'
        "-- (generated by grafana/build_dashboards.py; grafana.builder.downsampling.influxql_setup for another name).\n"
        + "".join(f"{statement};\n" for statement in influxql_setup("telemetry")),
    }
    files.update({f"tasks/{m.name}.flux": flux_task(m) for m in MEASUREMENTS})
    files.update({f"tasks/{s.name}.flux": spread_flux_task(s) for s in SPREADS})
    return files
