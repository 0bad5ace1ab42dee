"""Training (miners): loss, learning rate, gradient norms, throughput and progress."""

from __future__ import annotations

from grafana.builder.panels import Layout, dashboard
from grafana.builder.queries import fleet_and_nodes, fleet_tokens_per_sec_target, worst_nodes
from grafana.builder.targets import Json
from grafana.builder.variables import node_variables

FLEET = "With every miner selected: median, p90 and maximum across the miners; a few chosen in UID: one line each."
FLEET_LOW = "With every miner selected: median, p10 and minimum across the miners; a few chosen in UID: one line each."


def build() -> Json:
    ly = Layout()
    ly.row("Optimisation")
    ly.timeseries("Training loss", f"Loss over each interval. {FLEET}", *fleet_and_nodes("loss", "training_step"))
    ly.timeseries(
        "Learning rate",
        f"Learning rate used in the interval. {FLEET}",
        *fleet_and_nodes("learning_rate", "training_step", node_agg="last"),
        unit="sci",
    )
    ly.timeseries(
        "Gradient norm (mean of parameter groups)",
        f"Mean over parameter groups of the gradient norm. {FLEET}",
        *fleet_and_nodes("grad_norm_mean", "training_step"),
    )
    ly.timeseries(
        "Gradient norm (largest parameter group)",
        f"Largest per-group gradient norm: spikes here precede divergence. {FLEET}",
        *fleet_and_nodes("grad_norm_max", "training_step", node_agg="max"),
    )
    ly.row("Throughput and progress")
    ly.timeseries(
        "Tokens per second",
        f"Training throughput. {FLEET_LOW}",
        *fleet_and_nodes("tokens_per_sec", "training_step", lowest_is_worst=True),
    )
    ly.timeseries(
        "Tokens per second, all selected miners",
        "Sum of the miners' throughput.",
        fleet_tokens_per_sec_target(),
    )
    ly.table(
        "Slowest miners",
        "The five miners with the lowest mean throughput over the time range.",
        worst_nodes("tokens_per_sec", "training_step", lowest_is_worst=True),
    )
    ly.table(
        "Fewest steps",
        "The five miners that logged the fewest training steps in the time range: stalled or silent for part of it.",
        worst_nodes("global_step", "training_step", agg="count", lowest_is_worst=True),
    )
    ly.timeseries(
        "Global step",
        f"Optimiser step counter. {FLEET_LOW}",
        *fleet_and_nodes("global_step", "training_step", node_agg="max", lowest_is_worst=True),
    )
    ly.timeseries(
        "Window",
        f"Training window: a miner lagging behind shows up in the minimum. {FLEET_LOW}",
        *fleet_and_nodes("window", "training_step", node_agg="max", lowest_is_worst=True),
    )
    return dashboard(
        "telemetry-training",
        "Training (miners)",
        "Loss, learning rate, gradient norms and throughput of the miners.",
        ["training"],
        node_variables("training_step"),
        ly,
    )
