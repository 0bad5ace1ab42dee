"""Telemetry health: the telemetry client's own counters, per sink, and what the production edge refused."""

from __future__ import annotations

from grafana.builder import audit
from grafana.builder.panels import Layout, dashboard
from grafana.builder.queries import DROP_REASONS, counter_rates, fleet_and_nodes, most_dropped_nodes
from grafana.builder.targets import Json, loki_target
from grafana.builder.variables import metric_variable, node_variables


def build() -> Json:
    ly = Layout()
    ly.row("Throughput of the telemetry client")
    ly.timeseries(
        "Records queued per second",
        "Records accepted by log()/emit(), per sink (influxdb, loki).",
        counter_rates({"queued": "queued"}),
        unit="short",
    )
    ly.timeseries(
        "Records sent per second",
        "Points and log lines the servers accepted, per sink.",
        counter_rates({"sent": "sent"}),
        unit="short",
    )
    ly.timeseries(
        "Retries and batches per second",
        "Requests retried and requests accepted, per sink.",
        counter_rates({"retries": "retries"}, legend="retries {sink}"),
        counter_rates({"batches": "batches"}, ref="B", legend="batches {sink}"),
    )
    ly.timeseries(
        "Bytes sent per second",
        "Compressed bytes the servers accepted, per sink.",
        counter_rates({"bytes_sent": "bytes_sent"}),
        unit="Bps",
    )
    ly.row("Drops and backlog")
    ly.timeseries(
        "Dropped per second, by reason",
        "Records the client dropped, by reason and sink. Anything but sampled_out deserves a look.",
        counter_rates({reason: f"dropped_{reason}" for reason in DROP_REASONS}, legend="{stat} {sink}"),
        width=24,
    )
    fleet = (
        "With every node selected: median, p90 and maximum across the processes, per sink; with a few chosen "
        "in UID: one line per node and sink."
    )
    per_sink = {"by": ("sink",), "node_agg": "last", "filters": ("sink",)}
    ly.timeseries(
        "Pending records",
        f"Records buffered and not yet delivered. {fleet}",
        *fleet_and_nodes("pending", "telemetry_client", **per_sink),
    )
    ly.timeseries(
        "Pending bytes",
        f"Encoded bytes buffered and not yet delivered. {fleet}",
        *fleet_and_nodes("pending_bytes", "telemetry_client", **per_sink),
        unit="bytes",
    )
    ly.table(
        "Nodes with the most drops",
        "The ten nodes whose processes dropped the most records (cumulative counters, latest value, "
        "the worst process and sink of each node).",
        *most_dropped_nodes(10),
        width=24,
    )
    ly.row("Refused at the edge")
    refused = ", ".join(str(s) for s in audit.REFUSED_STATUSES)
    ly.timeseries(
        "Refused requests at the edge, by node",
        f"Requests the production edge answered {refused} (no or an unknown credential, forbidden, a body over "
        "the size limit, over a rate limit), per interval, by site, node and address: the node is the one its "
        f"credential names, {audit.NO_NODE} for a request without a known credential (then the address tells "
        f"who). From the edge's audit stream, which only the edge's shipper writes (Loki tenant "
        f"{audit.EDGE_TENANT}); empty on a stack without the edge, such as the local one. The UID and Sink "
        "variables do not apply.",
        loki_target(
            "A",
            audit.refused_count(("site", "user_id", "request_remote_ip", "status"), "$__auto"),
            "{{user_id}} {{status}} at {{site}} from {{request_remote_ip}}",
        ),
        width=24,
    )
    variables = [
        *node_variables("telemetry_client"),
        metric_variable("sink", "Sink", "sink", "telemetry_client", ("network",)),
    ]
    return dashboard(
        "telemetry-health",
        "Telemetry health",
        "The telemetry client's own counters: queued, sent, retried and dropped, per sink; the requests the "
        "production edge refused, per node.",
        ["telemetry-health"],
        variables,
        ly,
    )
