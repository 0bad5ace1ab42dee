"""Network and performance: peers, sync, gather success, gradient exchange and throughput."""

from __future__ import annotations

from grafana.builder.panels import Layout, dashboard
from grafana.builder.queries import (
    fleet_tokens_per_sec_target,
    influx_select,
)
from grafana.builder.targets import Json, influx_target
from grafana.builder.variables import node_variables


def build() -> Json:
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
