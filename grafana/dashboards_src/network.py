"""Network and performance: peers, sync, gather success, gradient exchange and throughput."""

from __future__ import annotations

from grafana.builder.panels import Layout, dashboard
from grafana.builder.queries import fleet_and_nodes, fleet_tokens_per_sec_target, node_series, worst_nodes
from grafana.builder.targets import Json
from grafana.builder.variables import node_variables

FLEET = "With every node selected: median, p90 and maximum across the nodes; a few chosen in UID: one line each."
FLEET_LOW = "With every node selected: median, p10 and minimum across the nodes; a few chosen in UID: one line each."


def build() -> Json:
    ly = Layout()
    ly.row("Peers and sync")
    ly.timeseries(
        "Active peers",
        f"Peers the nodes saw active in the window. {FLEET_LOW}",
        *fleet_and_nodes("active_peers", "network_status", lowest_is_worst=True),
    )
    ly.timeseries(
        "In sync",
        f"1 when a node is in sync, 0 when it is not: a minimum of 0 means some node is out of sync. {FLEET_LOW}",
        *fleet_and_nodes("is_synced", "network_status", node_agg="min", lowest_is_worst=True),
        unit="bool_yes_no",
    )
    ly.timeseries(
        "Sync lag",
        f"How many windows the nodes are behind. {FLEET}",
        *fleet_and_nodes("sync_lag_windows", "network_status", node_agg="max"),
    )
    ly.timeseries(
        "Gather success rate",
        f"Share of peers whose gradient arrived, for the nodes and the aggregator. {FLEET_LOW}",
        *fleet_and_nodes("gather_success_rate", "network_status", lowest_is_worst=True),
        node_series("C", "mean", "gather_success_rate", "aggregator_step", legend="aggregator {uid}"),
        unit="percentunit",
    )
    ly.table(
        "Furthest behind",
        "The five nodes with the largest sync lag (windows) in the time range.",
        worst_nodes("sync_lag_windows", "network_status", agg="max"),
    )
    ly.table(
        "Lowest gather success",
        "The five nodes whose peers' gradients arrived least often over the time range.",
        worst_nodes("gather_success_rate", "network_status", lowest_is_worst=True),
    )
    ly.row("Gradient exchange")
    ly.timeseries(
        "Gradient compression ratio",
        f"Raw gradient bytes divided by compressed bytes. {FLEET_LOW}",
        *fleet_and_nodes("compression_ratio", "performance", lowest_is_worst=True),
    )
    ly.timeseries(
        "Step timings",
        f"Time to gather peers' gradients, to upload the node's own, and the whole step. {FLEET}",
        *fleet_and_nodes("gather_time_s", "performance", prefix="gather ", refs=("A", "B")),
        *fleet_and_nodes("put_time_s", "performance", prefix="put ", refs=("C", "D")),
        *fleet_and_nodes("step_time_s", "performance", prefix="step ", refs=("E", "F")),
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
        node_series("A", "last", "gradients_gathered", "aggregator_step", legend="gathered {uid}"),
        node_series("B", "mean", "aggregation_time_s", "aggregator_step", legend="seconds {uid}"),
    )
    return dashboard(
        "telemetry-network",
        "Network and performance",
        "Peers, sync status, gather success, gradient compression and throughput.",
        ["network"],
        node_variables(None),
        ly,
    )
