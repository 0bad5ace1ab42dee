"""Telemetry health: the telemetry client's own counters, per sink, what the production edge refused, and
how old the stack's own backups are."""

from __future__ import annotations

from grafana.alerting_src.settings import BY_NAME
from grafana.builder import audit
from grafana.builder.panels import Layout, dashboard
from grafana.builder.queries import DROP_REASONS, counter_rates, fleet_and_nodes, most_dropped_nodes, stack_series
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
    ly.row("Backups of the stack")
    max_age = BY_NAME["ALERT_BACKUP_MAX_AGE_SECONDS"]
    reports = (
        "Reported by the backup role's report timer on each stateful host (measurement stack_backup), after "
        "every backup run and every 15 minutes; empty on a stack whose backups are not scheduled, such as the "
        "local one. The UID and Sink variables do not apply."
    )
    ly.timeseries(
        "Time since the last successful backup, by host",
        "Seconds from the end of each host's last successful backup to its report (a host where none ever "
        "succeeded: since its backup was installed). The alert rule telemetry-backup-overdue fires above "
        f"{max_age.name} ({int(max_age.default) // 3600} h by default), and when no host reported for "
        f"ALERT_BACKUP_REPORT_WINDOW_SECONDS. {reports}",
        stack_series("A", "max", "age_seconds", "stack_backup", by=("host",), legend="{host}"),
        unit="s",
    )
    ly.timeseries(
        "Last backup run succeeded, by host",
        "1 when the host's latest backup run succeeded, 0 when it failed (the lowest in each interval: a failed "
        f"run shows). {reports}",
        stack_series("A", "min", "last_run_ok", "stack_backup", by=("host",), legend="{host}"),
    )
    variables = [
        *node_variables("telemetry_client"),
        metric_variable("sink", "Sink", "sink", "telemetry_client", ("network",)),
    ]
    return dashboard(
        "telemetry-health",
        "Telemetry health",
        "The telemetry client's own counters: queued, sent, retried and dropped, per sink; the requests the "
        "production edge refused, per node; the age of the stack's own backups, per host.",
        ["telemetry-health"],
        variables,
        ly,
    )
