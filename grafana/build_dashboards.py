"""Build the Grafana dashboards in grafana/dashboards/ from this one Python module.

Why generated rather than hand-written JSON: six dashboards share the same
template variables, filters and panel conventions; one function per convention
keeps them identical, a review reads a few hundred lines of Python instead of
thousands of lines of JSON, and tests/test_dashboards.py fails when the committed
JSON differs from what this module produces (run it after every change).

    python grafana/build_dashboards.py          # rewrite grafana/dashboards/*.json
    python grafana/build_dashboards.py --check  # exit 1 when they are out of date

Every InfluxQL query names only measurements, fields and tags of
telemetry_client/catalog.py, and every LogQL selector only the Loki stream labels
the logging handler sets; tests/test_dashboards.py checks both.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

OUT_DIR = Path(__file__).resolve().parent / "dashboards"

# Fixed uids of grafana/provisioning/datasources/datasources.yml.
INFLUX: dict[str, str] = {"type": "influxdb", "uid": "influxdb"}
LOKI: dict[str, str] = {"type": "loki", "uid": "loki"}

SCHEMA_VERSION = 41


def _catalog() -> ModuleType:
    """telemetry_client.catalog, also when this file runs as a script from grafana/."""
    root = str(Path(__file__).resolve().parents[1])
    if root not in sys.path:
        sys.path.insert(0, root)
    return importlib.import_module("telemetry_client.catalog")


# Every reason the client drops data for: one series each on Telemetry health.
DROP_REASONS: tuple[str, ...] = tuple(_catalog().DROP_REASONS)

# The filter every InfluxQL panel applies: one regex per template variable, so the
# same query works for one value, several values and "All" (allValue ".*").
NODE_FILTER = '"network" =~ /^$network$/ AND "role" =~ /^$role$/ AND "uid" =~ /^$uid$/ AND "version" =~ /^$version$/'

Json = dict[str, Any]


# ---------------------------------------------------------------- variables


def _query_variable(
    name: str, label: str, datasource: dict[str, str], query: Any, definition: str, all_value: str
) -> Json:
    return {
        "name": name,
        "label": label,
        "type": "query",
        "datasource": datasource,
        "query": query,
        "definition": definition,
        "refresh": 2,
        "includeAll": True,
        "allValue": all_value,
        "multi": True,
        "sort": 1,
        "regex": "",
        "hide": 0,
        "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
        "options": [],
    }


def influx_variable(name: str, label: str, key: str, source: str | None, depends_on: Sequence[str] = ()) -> Json:
    """A SHOW TAG VALUES variable, narrowed by the variables chosen before it."""
    from_clause = f' FROM "{source}"' if source else ""
    where = " AND ".join(f'"{dep}" =~ /^${dep}$/' for dep in depends_on)
    query = f'SHOW TAG VALUES{from_clause} WITH KEY = "{key}"'
    if where:
        query += f" WHERE {where}"
    return _query_variable(name, label, INFLUX, query, query, ".*")


def node_variables(source: str | None) -> list[Json]:
    """network, role, uid and version, each chained to the ones before it."""
    return [
        influx_variable("network", "Network", "network", source),
        influx_variable("role", "Role", "role", source, ("network",)),
        influx_variable("uid", "UID", "uid", source, ("network", "role")),
        influx_variable("version", "Version", "version", source, ("network",)),
    ]


def loki_variable(name: str, label: str, stream_label: str, stream: str, all_value: str = ".*") -> Json:
    """A label_values() variable of the Loki data source."""
    query = {
        "qryType": 1,
        "label": stream_label,
        "stream": stream,
        "refId": "LokiVariableQueryEditor-VariableQuery",
    }
    definition = f"label_values({stream}, {stream_label})" if stream else f"label_values({stream_label})"
    return _query_variable(name, label, LOKI, query, definition, all_value)


def textbox_variable(name: str, label: str) -> Json:
    return {
        "name": name,
        "label": label,
        "type": "textbox",
        "query": "",
        "hide": 0,
        "current": {"selected": False, "text": "", "value": ""},
        "options": [],
    }


# ---------------------------------------------------------------- queries


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


# ---------------------------------------------------------------- panels


def influx_target(ref: str, query: str, alias: str = "", table: bool = False) -> Json:
    target: Json = {
        "refId": ref,
        "datasource": INFLUX,
        "rawQuery": True,
        "query": query,
        "resultFormat": "table" if table else "time_series",
    }
    if alias:
        target["alias"] = alias
    return target


def loki_target(ref: str, expr: str, legend: str = "", instant: bool = False) -> Json:
    target: Json = {
        "refId": ref,
        "datasource": LOKI,
        "expr": expr,
        "queryType": "instant" if instant else "range",
        "editorMode": "code",
    }
    if legend:
        target["legendFormat"] = legend
    return target


class Layout:
    """Places panels left to right, two per row, and numbers them."""

    def __init__(self) -> None:
        self.next_id = 1
        self.y = 0
        self.x = 0
        self.panels: list[Json] = []

    def _place(self, panel: Json, width: int, height: int) -> None:
        if self.x + width > 24:
            self.x = 0
            self.y += height
        panel["id"] = self.next_id
        panel["gridPos"] = {"h": height, "w": width, "x": self.x, "y": self.y}
        self.next_id += 1
        self.x += width
        if self.x >= 24:
            self.x = 0
            self.y += height
        self.panels.append(panel)

    def row(self, title: str) -> None:
        if self.x:
            self.x = 0
            self.y += 8
        self._place({"type": "row", "title": title, "collapsed": False, "panels": []}, 24, 1)

    def add(
        self,
        kind: str,
        title: str,
        description: str,
        datasource: dict[str, str],
        targets: Iterable[Json],
        *,
        unit: str = "short",
        width: int = 12,
        height: int = 8,
        options: Json | None = None,
        decimals: int | None = None,
    ) -> None:
        defaults: Json = {"unit": unit}
        if decimals is not None:
            defaults["decimals"] = decimals
        panel: Json = {
            "type": kind,
            "title": title,
            "description": description,
            "datasource": datasource,
            "targets": list(targets),
            "fieldConfig": {"defaults": defaults, "overrides": []},
            "options": options or {},
        }
        if kind == "timeseries":
            panel["fieldConfig"]["defaults"]["custom"] = {"spanNulls": True, "lineWidth": 1}
            panel["options"] = options or {
                "legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
                "tooltip": {"mode": "multi", "sort": "desc"},
            }
        self._place(panel, width, height)

    def timeseries(self, title: str, description: str, *targets: Json, unit: str = "short", width: int = 12) -> None:
        datasource = targets[0]["datasource"]
        self.add("timeseries", title, description, datasource, targets, unit=unit, width=width)

    def table(self, title: str, description: str, *targets: Json, width: int = 12) -> None:
        self.add("table", title, description, targets[0]["datasource"], targets, width=width)

    def logs(self, title: str, description: str, target: Json, height: int = 14) -> None:
        options = {
            "showTime": True,
            "wrapLogMessage": True,
            "sortOrder": "Descending",
            "enableLogDetails": True,
            "prettifyLogMessage": False,
            "dedupStrategy": "none",
        }
        self.add("logs", title, description, LOKI, [target], width=24, height=height, options=options)


def dashboard(
    uid: str, title: str, description: str, tags: Sequence[str], variables: list[Json], layout: Layout
) -> Json:
    return {
        "uid": uid,
        "title": title,
        "description": description,
        "tags": ["telemetry", *tags],
        "editable": False,
        "graphTooltip": 1,
        "timezone": "browser",
        "time": {"from": "now-6h", "to": "now"},
        "refresh": "30s",
        "schemaVersion": SCHEMA_VERSION,
        "version": 1,
        "annotations": {"list": []},
        "links": [
            {
                "type": "dashboards",
                "tags": ["telemetry"],
                "asDropdown": True,
                "title": "Dashboards",
                "includeVars": True,
                "keepTime": True,
            }
        ],
        "templating": {"list": variables},
        "panels": layout.panels,
    }


# ---------------------------------------------------------------- dashboards


def training() -> Json:
    ly = Layout()
    ly.row("Optimisation")
    ly.timeseries(
        "Training loss",
        "Mean loss per miner over each interval (training_step.loss).",
        influx_target("A", influx_select('mean("loss")', "training_step"), "$tag_uid"),
    )
    ly.timeseries(
        "Learning rate",
        "Learning rate each miner used last in the interval.",
        influx_target("A", influx_select('last("learning_rate")', "training_step"), "$tag_uid"),
        unit="sci",
    )
    ly.timeseries(
        "Gradient norm (mean of parameter groups)",
        "Mean over parameter groups of the gradient norm, per miner.",
        influx_target("A", influx_select('mean("grad_norm_mean")', "training_step"), "$tag_uid"),
    )
    ly.timeseries(
        "Gradient norm (largest parameter group)",
        "Largest per-group gradient norm: spikes here precede divergence.",
        influx_target("A", influx_select('max("grad_norm_max")', "training_step"), "$tag_uid"),
    )
    ly.row("Throughput and progress")
    ly.timeseries(
        "Tokens per second, per miner",
        "Training throughput of each miner.",
        influx_target("A", influx_select('mean("tokens_per_sec")', "training_step"), "$tag_uid"),
        unit="short",
    )
    ly.timeseries(
        "Tokens per second, all selected miners",
        "Sum of the miners' throughput.",
        fleet_tokens_per_sec_target(),
    )
    ly.timeseries(
        "Global step",
        "Optimiser step counter of each miner.",
        influx_target("A", influx_select('max("global_step")', "training_step"), "$tag_uid"),
    )
    ly.timeseries(
        "Window",
        "Training window each miner is in: a miner lagging behind shows up here.",
        influx_target("A", influx_select('max("window")', "training_step"), "$tag_uid"),
    )
    return dashboard(
        "telemetry-training",
        "Training (miners)",
        "Loss, learning rate, gradient norms and throughput of the miners.",
        ["training"],
        node_variables("training_step"),
        ly,
    )


def validators() -> Json:
    ly = Layout()
    ly.row("Evaluation")
    ly.timeseries(
        "Evaluation loss before and after the gradients",
        "Mean loss on the evaluation data before and after applying the miners' gradients.",
        influx_target("A", influx_select('mean("loss_before")', "validator_window"), "before $tag_uid"),
        influx_target("B", influx_select('mean("loss_after")', "validator_window"), "after $tag_uid"),
    )
    ly.timeseries(
        "Improvement",
        "Relative loss improvement, (before - after) / before, per validator.",
        influx_target("A", influx_select('mean("improvement")', "validator_window"), "$tag_uid"),
        unit="percentunit",
    )
    ly.timeseries(
        "Miners evaluated per window",
        "How many miners each validator evaluated.",
        influx_target("A", influx_select('last("evaluated_uids")', "validator_window"), "$tag_uid"),
    )
    ly.timeseries(
        "Validator window",
        "Window each validator evaluated last.",
        influx_target("A", influx_select('max("window")', "validator_window"), "$tag_uid"),
    )
    ly.row("Scores and weights per evaluated miner")
    eval_filter = '"eval_uid" =~ /^$eval_uid$/'
    ly.timeseries(
        "Score per evaluated miner",
        "Score the selected validators gave each evaluated miner.",
        influx_target(
            "A",
            influx_select('mean("score")', "validator_scores", by=("eval_uid",), extra_where=eval_filter),
            "$tag_eval_uid",
        ),
    )
    ly.timeseries(
        "Moving average score",
        "Exponential moving average of each evaluated miner's score.",
        influx_target(
            "A",
            influx_select('mean("moving_avg_score")', "validator_scores", by=("eval_uid",), extra_where=eval_filter),
            "$tag_eval_uid",
        ),
    )
    ly.timeseries(
        "Weight per evaluated miner",
        "Weight set on chain for each evaluated miner.",
        influx_target(
            "A",
            influx_select('last("weight")', "validator_scores", by=("eval_uid",), extra_where=eval_filter),
            "$tag_eval_uid",
        ),
    )
    ly.table(
        "Latest score and weight",
        "Last score, moving average and weight per validator and evaluated miner.",
        influx_target(
            "A",
            influx_select(
                'last("score") AS "score", last("moving_avg_score") AS "moving_avg_score", last("weight") AS "weight"',
                "validator_scores",
                by=("uid", "eval_uid"),
                extra_where=eval_filter,
                per_interval=False,
            ),
            table=True,
        ),
    )
    ly.row("Evaluator benchmarks")
    ly.timeseries(
        "Benchmark score per task",
        "Checkpoint benchmark scores reported by the evaluator.",
        influx_target("A", influx_select('last("score")', "evaluator_benchmark", by=("task",)), "$tag_task"),
    )
    ly.timeseries(
        "Benchmark duration",
        "Time each benchmark took.",
        influx_target("A", influx_select('mean("duration_s")', "evaluator_benchmark", by=("task",)), "$tag_task"),
        unit="s",
    )
    variables = [
        *node_variables(None),
        influx_variable("eval_uid", "Evaluated UID", "eval_uid", "validator_scores", ("network", "uid")),
    ]
    return dashboard(
        "telemetry-validators",
        "Validators",
        "Evaluation losses and improvement, scores and weights per evaluated miner.",
        ["validators"],
        variables,
        ly,
    )


def network() -> Json:
    ly = Layout()
    ly.row("Peers and sync")
    ly.timeseries(
        "Active peers",
        "Peers each node saw active in the window.",
        influx_target("A", influx_select('mean("active_peers")', "network_status"), "$tag_uid"),
    )
    ly.timeseries(
        "In sync",
        "1 when the node is in sync, 0 when it is not (lowest value of the interval).",
        influx_target("A", influx_select('min("is_synced")', "network_status"), "$tag_uid"),
        unit="bool_yes_no",
    )
    ly.timeseries(
        "Sync lag",
        "How many windows each node is behind.",
        influx_target("A", influx_select('max("sync_lag_windows")', "network_status"), "$tag_uid"),
    )
    ly.timeseries(
        "Gather success rate",
        "Share of peers whose gradient arrived, per node and for the aggregator.",
        influx_target("A", influx_select('mean("gather_success_rate")', "network_status"), "$tag_uid"),
        influx_target("B", influx_select('mean("gather_success_rate")', "aggregator_step"), "aggregator $tag_uid"),
        unit="percentunit",
    )
    ly.row("Gradient exchange")
    ly.timeseries(
        "Gradient compression ratio",
        "Raw gradient bytes divided by compressed bytes.",
        influx_target("A", influx_select('mean("compression_ratio")', "performance"), "$tag_uid"),
    )
    ly.timeseries(
        "Step timings",
        "Time to gather peers' gradients, to upload the node's own, and the whole step.",
        influx_target("A", influx_select('mean("gather_time_s")', "performance"), "gather $tag_uid"),
        influx_target("B", influx_select('mean("put_time_s")', "performance"), "put $tag_uid"),
        influx_target("C", influx_select('mean("step_time_s")', "performance"), "step $tag_uid"),
        unit="s",
    )
    ly.timeseries(
        "Training throughput (all selected miners)",
        "Sum of the miners' tokens per second.",
        fleet_tokens_per_sec_target(),
    )
    ly.timeseries(
        "Aggregation",
        "Gradients the aggregator merged per round, and the time merging took.",
        influx_target("A", influx_select('last("gradients_gathered")', "aggregator_step"), "gathered $tag_uid"),
        influx_target("B", influx_select('mean("aggregation_time_s")', "aggregator_step"), "seconds $tag_uid"),
    )
    return dashboard(
        "telemetry-network",
        "Network and performance",
        "Peers, sync status, gather success, gradient compression and throughput.",
        ["network"],
        node_variables(None),
        ly,
    )


def system() -> Json:
    ly = Layout()
    ly.row("Host")
    ly.timeseries(
        "CPU",
        "CPU use of each node's host.",
        influx_target("A", influx_select('mean("cpu_percent")', "system"), "$tag_uid"),
        unit="percent",
    )
    ly.timeseries(
        "Memory",
        "Memory in use as a share of the memory available (the cgroup limit if lower).",
        influx_target("A", influx_select('mean("memory_percent")', "system"), "$tag_uid"),
        unit="percent",
    )
    ly.timeseries(
        "Process resident memory",
        "Resident memory of the process that logs.",
        influx_target("A", influx_select('mean("process_rss_bytes")', "system"), "$tag_uid"),
        unit="bytes",
    )
    ly.timeseries(
        "Host memory used",
        "Bytes in use and available on each host.",
        influx_target("A", influx_select('mean("memory_used_bytes")', "system"), "used $tag_uid"),
        influx_target("B", influx_select('mean("memory_total_bytes")', "system"), "total $tag_uid"),
        unit="bytes",
    )
    ly.row("GPU")
    by_gpu = ("uid", "gpu_index")
    ly.timeseries(
        "GPU memory allocated",
        "torch.cuda memory held by tensors, per device.",
        influx_target(
            "A", influx_select('mean("allocated_bytes")', "gpu_memory", by=by_gpu), "$tag_uid gpu$tag_gpu_index"
        ),
        unit="bytes",
    )
    ly.timeseries(
        "GPU memory cached (reserved)",
        "torch.cuda memory reserved by the caching allocator, per device.",
        influx_target(
            "A", influx_select('mean("reserved_bytes")', "gpu_memory", by=by_gpu), "$tag_uid gpu$tag_gpu_index"
        ),
        unit="bytes",
    )
    ly.timeseries(
        "GPU utilisation",
        "NVML utilisation per device.",
        influx_target(
            "A", influx_select('mean("utilization_percent")', "gpu", by=by_gpu), "$tag_uid gpu$tag_gpu_index"
        ),
        unit="percent",
    )
    ly.timeseries(
        "GPU memory used (all processes)",
        "Device memory in use as a share of the device's memory.",
        influx_target(
            "A",
            influx_select(
                'mean("memory_used_bytes") / mean("memory_total_bytes") * 100',
                "gpu",
                by=by_gpu,
            ),
            "$tag_uid gpu$tag_gpu_index",
        ),
        unit="percent",
    )
    ly.timeseries(
        "GPU temperature",
        "Device temperature.",
        influx_target("A", influx_select('max("temperature_c")', "gpu", by=by_gpu), "$tag_uid gpu$tag_gpu_index"),
        unit="celsius",
    )
    ly.timeseries(
        "GPU power",
        "Power draw per device.",
        influx_target("A", influx_select('mean("power_w")', "gpu", by=by_gpu), "$tag_uid gpu$tag_gpu_index"),
        unit="watt",
    )
    return dashboard(
        "telemetry-system",
        "System and GPU",
        "CPU, memory, GPU memory allocated and cached, and GPU utilisation per node.",
        ["system"],
        node_variables(None),
        ly,
    )


def logs() -> Json:
    ly = Layout()
    everything = loki_selector()
    any_level = loki_selector(level=False)
    errors = loki_selector(ERRORS, level=False)
    ly.row("Volume and errors")
    ly.timeseries(
        "Log lines by level",
        "Lines per interval, by level.",
        loki_target("A", f"sum by (level) (count_over_time({everything}[$__auto]))", "{{level}}"),
    )
    ly.timeseries(
        "Log lines by service",
        "Lines per interval, by service.",
        loki_target("A", f"sum by (service) (count_over_time({everything}[$__auto]))", "{{service}}"),
    )
    ly.timeseries(
        "Errors per second by service",
        "Rate of error and critical lines.",
        loki_target("A", f"sum by (service) (rate({errors}[$__auto]))", "{{service}}"),
    )
    ly.timeseries(
        "Error ratio",
        "Error and critical lines as a share of all lines.",
        loki_target("A", f"sum(rate({errors}[$__auto])) / sum(rate({any_level}[$__auto]))", "errors"),
        unit="percentunit",
    )
    ly.table(
        "Most frequent error sources",
        "Loggers with the most error and critical lines in the time range.",
        loki_target(
            "A",
            f'topk(10, sum by (service, logger) (count_over_time({errors} | json | __error__="" [$__range])))',
            instant=True,
        ),
    )
    ly.table(
        "Errors per node",
        "Error and critical lines per node in the time range.",
        loki_target(
            "A",
            f"sum by (uid, role, host) (count_over_time({errors} [$__range]))",
            instant=True,
        ),
    )
    ly.row("Lines")
    ly.logs(
        "Logs",
        "Lines of the selected streams; the Search box filters them (case-insensitive). "
        "| json turns the body's fields (message, logger, window, step, peer, trace_id...) "
        "into fields of each line.",
        loki_target("A", f'{everything} |~ "(?i)$search" | json'),
    )
    ly.logs(
        "Errors and exceptions",
        "Error and critical lines only, with their exception and traceback in the body.",
        loki_target("A", f'{errors} |~ "(?i)$search" | json'),
        height=10,
    )
    variables = [
        loki_variable("network", "Network", "environment", "", all_value=".+"),
        loki_variable("service", "Service", "service", '{environment=~"$network"}'),
        loki_variable("role", "Role", "role", '{environment=~"$network"}'),
        loki_variable("uid", "UID", "uid", '{environment=~"$network", role=~"$role"}'),
        loki_variable("version", "Version", "version", '{environment=~"$network"}'),
        loki_variable("level", "Level", "level", '{environment=~"$network"}'),
        textbox_variable("search", "Search"),
    ]
    return dashboard(
        "telemetry-logs",
        "Logs",
        "Log volume by level and service, error rate, and a searchable log panel.",
        ["logs"],
        variables,
        ly,
    )


def telemetry_health() -> Json:
    ly = Layout()
    ly.row("Throughput of the telemetry client")
    ly.timeseries(
        "Records queued per second",
        "Records accepted by log()/emit(), per sink (influxdb, loki).",
        influx_target("A", counter_rates({"queued": "queued"}), "$tag_sink"),
        unit="short",
    )
    ly.timeseries(
        "Records sent per second",
        "Points and log lines the servers accepted, per sink.",
        influx_target("A", counter_rates({"sent": "sent"}), "$tag_sink"),
        unit="short",
    )
    ly.timeseries(
        "Retries and batches per second",
        "Requests retried and requests accepted, per sink.",
        influx_target("A", counter_rates({"retries": "retries"}), "retries $tag_sink"),
        influx_target("B", counter_rates({"batches": "batches"}), "batches $tag_sink"),
    )
    ly.timeseries(
        "Bytes sent per second",
        "Compressed bytes the servers accepted, per sink.",
        influx_target("A", counter_rates({"bytes_sent": "bytes_sent"}), "$tag_sink"),
        unit="Bps",
    )
    ly.row("Drops and backlog")
    ly.timeseries(
        "Dropped per second, by reason",
        "Records the client dropped, by reason and sink. Anything but sampled_out deserves a look.",
        influx_target(
            "A",
            counter_rates({reason: f"dropped_{reason}" for reason in DROP_REASONS}),
            "$col $tag_sink",
        ),
        width=24,
    )
    ly.timeseries(
        "Pending records",
        "Records buffered and not yet delivered, per node and sink.",
        influx_target(
            "A",
            influx_select('last("pending")', "telemetry_client", by=("uid", "sink"), extra_where='"sink" =~ /^$sink$/'),
            "$tag_uid $tag_sink",
        ),
    )
    ly.timeseries(
        "Pending bytes",
        "Encoded bytes buffered and not yet delivered, per node and sink.",
        influx_target(
            "A",
            influx_select(
                'last("pending_bytes")', "telemetry_client", by=("uid", "sink"), extra_where='"sink" =~ /^$sink$/'
            ),
            "$tag_uid $tag_sink",
        ),
        unit="bytes",
    )
    ly.table(
        "Counters per process (latest)",
        "Cumulative counters of each process (uid, runtime_id) and sink.",
        influx_target(
            "A",
            influx_select(
                'last("queued") AS "queued", last("sent") AS "sent", '
                'last("retries") AS "retries", last("dropped") AS "dropped", '
                'last("pending") AS "pending"',
                "telemetry_client",
                by=("uid", "runtime_id", "sink"),
                extra_where='"sink" =~ /^$sink$/',
                per_interval=False,
            ),
            table=True,
        ),
        width=24,
    )
    variables = [
        *node_variables("telemetry_client"),
        influx_variable("sink", "Sink", "sink", "telemetry_client", ("network",)),
    ]
    return dashboard(
        "telemetry-health",
        "Telemetry health",
        "The telemetry client's own counters: queued, sent, retried and dropped, per sink.",
        ["telemetry-health"],
        variables,
        ly,
    )


BUILDERS = {
    "training.json": training,
    "validators.json": validators,
    "network.json": network,
    "system.json": system,
    "logs.json": logs,
    "telemetry-health.json": telemetry_health,
}


def render() -> dict[str, str]:
    """File name to the exact text the committed file must have."""
    return {
        name: json.dumps(build(), indent=2, sort_keys=True, ensure_ascii=False) + "\n"
        for name, build in BUILDERS.items()
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--check", action="store_true", help="exit 1 when grafana/dashboards/ differs from the generated JSON"
    )
    parser.add_argument("--out", type=Path, default=OUT_DIR)
    args = parser.parse_args(argv)
    stale = []
    for name, text in render().items():
        path = args.out / name
        current = path.read_text(encoding="utf-8") if path.exists() else None
        if current == text:
            continue
        stale.append(name)
        if not args.check:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
    if args.check and stale:
        print(f"out of date: {', '.join(stale)}; run python grafana/build_dashboards.py", file=sys.stderr)
        return 1
    for name in stale:
        print(f"wrote {args.out / name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
