"""Telemetry health: the telemetry client's own counters, per sink."""

from __future__ import annotations

from grafana.builder.panels import Layout, dashboard
from grafana.builder.queries import (
    DROP_REASONS,
    counter_rates,
    influx_select,
)
from grafana.builder.targets import Json, influx_target
from grafana.builder.variables import influx_variable, node_variables


def build() -> Json:
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
