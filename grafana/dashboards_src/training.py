"""Training (miners): loss, learning rate, gradient norms, throughput and progress."""

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
