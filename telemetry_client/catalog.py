"""The one catalog of measurements the stack knows.

The simulator emits from it, the dashboards query it, and a test proves that every
dashboard query names only what is defined here. Tags are a small fixed set (low
cardinality); per-step values such as window, step or pid are fields, never tags.

Most measurements come from the nodes, through their MetricsLogger (with the
STANDARD_TAGS). A few the stack writes about itself, from its own hosts
(`Measurement.stack`): no node writes them, no role or standard tag applies, and
the node model of the simulator (simulator/values.py) has no value for them.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "ALL_ROLES",
    "CATALOG",
    "DELTA_SUFFIX",
    "DROP_REASONS",
    "LOKI_ONLY_COUNTERS",
    "MEASUREMENTS",
    "NODE_CATALOG",
    "QUERYABLE",
    "ROLES",
    "SELF_COUNTERS",
    "SPARSE_DELTAS",
    "SPREADS",
    "SPREAD_OF",
    "STACK_CATALOG",
    "STANDARD_TAGS",
    "Field",
    "Measurement",
    "Spread",
    "measurement",
    "measurements_for_role",
]

# Tags every MetricsLogger adds to every point it writes (when the value is set).
STANDARD_TAGS: tuple[str, ...] = (
    "uid",
    "role",
    "version",
    "network",
    "runtime_id",
    "group",
    "job_type",
)

ROLES: tuple[str, ...] = ("miner", "validator", "aggregator", "evaluator")
ALL_ROLES = ROLES


@dataclass(frozen=True)
class Field:
    """One field of a measurement; a node's numeric fields are stored as floats (its client writes them so)."""

    name: str
    unit: str
    description: str
    kind: str = "float"  # "float", "integer" (the stack's own line protocol `<n>i`) or "string"
    # How the downsampled copy keeps the field per period (grafana/builder/downsampling.py):
    # mean, max, min, sum (per-interval growth) or last (cumulative counters).
    rollup: str = "mean"


@dataclass(frozen=True)
class Measurement:
    """A measurement: its name, who emits it, its own tags (beyond STANDARD_TAGS), its fields."""

    name: str
    description: str
    roles: tuple[str, ...]
    fields: tuple[Field, ...]
    tags: tuple[str, ...] = ()
    automatic: bool = False  # written by the client itself, not by the caller
    stack: bool = False  # written by the stack's own hosts, never by a node: no role, no standard tag

    @property
    def field_names(self) -> tuple[str, ...]:
        return tuple(f.name for f in self.fields)

    @property
    def tag_names(self) -> tuple[str, ...]:
        return self.tags if self.stack else STANDARD_TAGS + self.tags


def _stats(name: str, unit: str, what: str) -> tuple[Field, ...]:
    """Fields produced when a list of numbers is logged under `name`."""
    return tuple(
        Field(
            f"{name}_{stat}", unit, f"{stat} of {what} over the step", rollup=stat if stat in ("min", "max") else "mean"
        )
        for stat in ("mean", "min", "max", "median")
    )


# Reasons the client drops data; each becomes a `dropped_<reason>` field of the
# self-metrics measurement. The shipping engine and the encoders use only these.
DROP_REASONS: tuple[str, ...] = (
    "buffer_full",  # the bounded buffer was full: the oldest data made room
    "expired",  # older than the configured maximum age while the server was down
    "rejected",  # the server answered 4xx (not 429): not retryable
    "invalid",  # a name, tag or point the server could not store exactly
    "non_finite",  # a NaN or infinite field value
    "no_fields",  # a point left with no field after cleaning
    "none_value",  # a field value of None (never turned into 0.0)
    "unsupported_type",  # a field value of a type that has no documented treatment
    "too_large",  # a value or line over the configured size limit
    "sampled_out",  # not kept by log(sample_rate=...)
    "shutdown",  # still buffered when close() reached its deadline
    "encode_error",  # the encoder raised: a bug, logged with its traceback
    "disabled",  # given to a logger that is off (nothing configured, or enabled=False)
)

# The client's cumulative counters (per process and sink, from process start).
# Beside each one the client writes `<counter>_delta`, what it grew by since the
# previous self-metrics point of the process: a dashboard's rate is then a plain
# sum of deltas per time bucket, instead of a derivative per process under a
# second aggregation (which InfluxQL builds once per outer aggregate: slow).
SELF_COUNTERS: tuple[str, ...] = (
    "queued",
    "sent",
    "batches",
    "retries",
    "bytes_sent",
    "dropped",
    "truncated",
    "metadata_removed",
    *(f"dropped_{reason}" for reason in DROP_REASONS),
)
DELTA_SUFFIX = "_delta"
# Counters only a Loki handler's stats() have.
LOKI_ONLY_COUNTERS: tuple[str, ...] = ("truncated", "metadata_removed")
# Counters whose delta is written only when it is not zero: each drop reason and
# truncated lines or lines resent without their metadata. Most intervals drop nothing; an absent field costs a query
# nothing, where a dozen zero fields per point made the by-reason panel slow, and
# the panel then draws the reasons that happened.
SPARSE_DELTAS: frozenset[str] = frozenset({*LOKI_ONLY_COUNTERS, *(f"dropped_{reason}" for reason in DROP_REASONS)})


def _deltas(counters: tuple[str, ...]) -> tuple[Field, ...]:
    return tuple(
        Field(
            f"{name}{DELTA_SUFFIX}", "count", f"growth of {name} since the previous point of the process", rollup="sum"
        )
        for name in counters
    )


MEASUREMENTS: tuple[Measurement, ...] = (
    Measurement(
        name="training_step",
        description="One optimiser step of a miner",
        roles=("miner",),
        fields=(
            Field("loss", "", "training loss"),
            Field("learning_rate", "", "current learning rate"),
            *_stats("grad_norm", "", "per-parameter-group gradient norms"),
            Field("tokens_per_sec", "tokens/s", "training throughput"),
            Field("batch_tokens", "tokens", "tokens in the step's batch"),
            Field("window", "", "training window the step belongs to", rollup="max"),
            Field("global_step", "", "optimiser step counter", rollup="max"),
        ),
    ),
    Measurement(
        name="validator_window",
        description="A validator's evaluation summary for one window",
        roles=("validator",),
        fields=(
            Field("loss_before", "", "mean loss on evaluation data before applying gradients"),
            Field("loss_after", "", "mean loss after applying the evaluated gradients"),
            Field("improvement", "", "relative loss improvement, (before - after) / before"),
            Field("evaluated_uids", "count", "miners evaluated in the window"),
            Field("window", "", "window evaluated", rollup="max"),
            Field("global_step", "", "validator step counter", rollup="max"),
        ),
    ),
    Measurement(
        name="validator_scores",
        description="A validator's score and weight for one evaluated miner",
        roles=("validator",),
        tags=("eval_uid",),
        fields=(
            Field("score", "", "score of the evaluated miner in the window"),
            Field("moving_avg_score", "", "exponential moving average of the score"),
            Field("weight", "", "weight set on chain for the evaluated miner"),
            Field("window", "", "window evaluated", rollup="max"),
        ),
    ),
    Measurement(
        name="aggregator_step",
        description="One aggregation round of the aggregator",
        roles=("aggregator",),
        fields=(
            Field("gradients_gathered", "count", "gradients merged in the round"),
            Field("gather_success_rate", "ratio", "share of expected peers whose gradient arrived"),
            Field("aggregation_time_s", "s", "time spent merging"),
            Field("window", "", "window aggregated", rollup="max"),
        ),
    ),
    Measurement(
        name="evaluator_benchmark",
        description="A benchmark score of a checkpoint, from the evaluator",
        roles=("evaluator",),
        tags=("task",),
        fields=(
            Field("score", "", "benchmark score (accuracy or normalised metric)"),
            Field("duration_s", "s", "time the benchmark took"),
            Field("global_step", "", "checkpoint's global step", rollup="max"),
            Field("window", "", "checkpoint's window", rollup="max"),
        ),
    ),
    Measurement(
        name="network_status",
        description="A node's view of the peer-to-peer network",
        roles=ALL_ROLES,
        fields=(
            Field("active_peers", "count", "peers seen active in the window"),
            Field("sync_lag_windows", "windows", "how many windows the node is behind", rollup="max"),
            Field("is_synced", "bool", "1 when the node is in sync, else 0", rollup="min"),
            Field("gather_success_rate", "ratio", "share of peers whose gradient was gathered"),
            Field("window", "", "current window", rollup="max"),
        ),
    ),
    Measurement(
        name="performance",
        description="Gradient exchange and step timings of a node",
        roles=ALL_ROLES,
        fields=(
            Field("compression_ratio", "ratio", "raw gradient bytes / compressed gradient bytes"),
            Field("gather_time_s", "s", "time to gather peers' gradients"),
            Field("put_time_s", "s", "time to upload the node's gradient"),
            Field("step_time_s", "s", "wall time of the whole step"),
            Field("window", "", "current window", rollup="max"),
        ),
    ),
    Measurement(
        name="system",
        description="Host metrics, sampled by the client at most once per interval",
        roles=ALL_ROLES,
        automatic=True,
        fields=(
            Field("cpu_percent", "percent", "CPU use of the host since the previous sample"),
            Field("memory_used_bytes", "bytes", "memory in use (the cgroup's inside a container)"),
            Field("memory_total_bytes", "bytes", "memory available (the cgroup limit if lower)"),
            Field("memory_percent", "percent", "memory_used_bytes / memory_total_bytes"),
            Field("process_rss_bytes", "bytes", "resident memory of the logging process"),
            Field("disk_percent", "percent", "disk in use on the filesystem of the working directory", rollup="max"),
        ),
    ),
    Measurement(
        name="gpu",
        description="Per-device GPU metrics from NVML, sampled at most once per interval",
        roles=ALL_ROLES,
        automatic=True,
        tags=("gpu_uuid", "gpu_index", "gpu_name"),
        fields=(
            Field("memory_used_bytes", "bytes", "device memory in use (all processes)"),
            Field("memory_total_bytes", "bytes", "device memory"),
            Field("utilization_percent", "percent", "GPU utilisation"),
            Field("temperature_c", "°C", "GPU temperature", rollup="max"),
            Field("power_w", "W", "power draw"),
        ),
    ),
    Measurement(
        name="gpu_memory",
        description="torch.cuda allocator statistics of the logging process, per device",
        roles=ALL_ROLES,
        automatic=True,
        tags=("gpu_uuid", "gpu_index"),
        fields=(
            Field("allocated_bytes", "bytes", "memory held by tensors"),
            Field("reserved_bytes", "bytes", "memory cached by the allocator (allocated + free)"),
            Field("max_allocated_bytes", "bytes", "peak of allocated_bytes", rollup="max"),
            Field("segments", "count", "allocator segments currently held"),
        ),
    ),
    Measurement(
        name="telemetry_client",
        description="The client's own counters, per sink (influxdb or loki)",
        roles=ALL_ROLES,
        automatic=True,
        tags=("sink",),
        fields=(
            Field("queued", "count", "records given to log()/emit(), and system and GPU points", rollup="last"),
            Field("sent", "count", "points or log lines the server accepted", rollup="last"),
            Field("batches", "count", "requests the server stored all or part of", rollup="last"),
            Field("retries", "count", "requests retried", rollup="last"),
            Field("pending", "count", "records buffered, not yet delivered", rollup="max"),
            Field("pending_bytes", "bytes", "encoded bytes buffered, not yet delivered", rollup="max"),
            Field("bytes_sent", "bytes", "compressed bytes the server accepted", rollup="last"),
            Field("dropped", "count", "records dropped, all reasons", rollup="last"),
            Field("truncated", "count", "log lines shortened to Loki's line limit (delivered, marked)", rollup="last"),
            Field(
                "metadata_removed",
                "count",
                "log lines sent again without the structured metadata Loki refused (delivered)",
                rollup="last",
            ),
            *(
                Field(f"dropped_{reason}", "count", f"records dropped: {reason}", rollup="last")
                for reason in DROP_REASONS
            ),
            *_deltas(SELF_COUNTERS),
        ),
    ),
    Measurement(
        name="stack_backup",
        description="The stack's backups, one point per stateful host and report: written by the backup role's "
        "report timer after each backup run and every 15 minutes, never by a node",
        roles=(),
        stack=True,
        tags=("host",),  # the inventory hostname
        fields=(
            Field("last_success", "s", "Unix time the last successful backup ended, 0 if none ever did", rollup="max"),
            Field(
                "age_seconds",
                "s",
                "seconds from the last successful backup's end to the report (none yet: since the backup was "
                "installed on the host)",
                rollup="max",
            ),
            Field(
                "last_run_ok", "bool", "1 when the latest backup run succeeded, else 0", kind="integer", rollup="min"
            ),
            Field("last_duration_seconds", "s", "how long the latest backup run took", rollup="max"),
            Field(
                "added_bytes",
                "bytes",
                "bytes the latest backup run added to the repository",
                kind="integer",
                rollup="max",
            ),
        ),
    ),
)

CATALOG: dict[str, Measurement] = {m.name: m for m in MEASUREMENTS}
# The nodes' measurements (what a MetricsLogger writes), and the stack's own.
NODE_CATALOG: dict[str, Measurement] = {m.name: m for m in MEASUREMENTS if not m.stack}
STACK_CATALOG: dict[str, Measurement] = {m.name: m for m in MEASUREMENTS if m.stack}


@dataclass(frozen=True)
class Spread:
    """A measurement the metrics store derives, never a node: how `source`'s fields spread across some tags.

    Per node and period it holds each field's median, p90 and max across the
    values of the tags `across` (the evaluated miners a validator scores, a
    node's GPUs): a fleet panel over a long range reads a series per node in
    place of one per node and evaluated miner or device.
    grafana/builder/downsampling.py writes it beside the downsampled copy.
    """

    name: str
    source: str
    across: tuple[str, ...]
    fields: tuple[str, ...]

    STATS = ("median", "p90", "max")

    @property
    def measurement(self) -> Measurement:
        """The derived measurement: the source's tags but `across`, a field per source field and statistic."""
        source = CATALOG[self.source]
        folded = " and ".join(self.across)
        return Measurement(
            name=self.name,
            description=f"spread of {source.name} across {folded}, per node and period",
            roles=source.roles,
            tags=tuple(tag for tag in source.tags if tag not in self.across),
            fields=tuple(
                Field(f"{field}_{stat}", "", f"{stat} of {field} across {folded}")
                for field in self.fields
                for stat in self.STATS
            ),
            automatic=True,
        )

    @property
    def group_tags(self) -> tuple[str, ...]:
        """The tags a period is grouped by: every tag of the source but `across`."""
        return self.measurement.tag_names


SPREADS: tuple[Spread, ...] = (
    Spread("validator_scores_spread", "validator_scores", ("eval_uid",), ("score", "moving_avg_score", "weight")),
    Spread(
        "gpu_spread",
        "gpu",
        ("gpu_uuid", "gpu_index", "gpu_name"),
        ("memory_used_bytes", "utilization_percent", "temperature_c", "power_w"),
    ),
    Spread("gpu_memory_spread", "gpu_memory", ("gpu_uuid", "gpu_index"), ("allocated_bytes", "reserved_bytes")),
)
SPREAD_OF: dict[str, Spread] = {s.source: s for s in SPREADS}
# Every measurement a query may name: the catalog's and the ones the store derives.
QUERYABLE: dict[str, Measurement] = {**CATALOG, **{s.name: s.measurement for s in SPREADS}}


def measurement(name: str) -> Measurement:
    """Look a measurement up by name, with a clear error for an unknown one."""
    try:
        return CATALOG[name]
    except KeyError:
        raise KeyError(f"unknown measurement {name!r}; the catalog defines: {', '.join(sorted(CATALOG))}") from None


def measurements_for_role(role: str) -> tuple[Measurement, ...]:
    """Measurements a node of `role` emits itself (automatic ones excluded)."""
    return tuple(m for m in MEASUREMENTS if role in m.roles and not m.automatic)
