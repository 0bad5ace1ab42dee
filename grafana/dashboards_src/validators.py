"""Validators: evaluation losses and improvement, scores and weights, evaluator benchmarks."""

from __future__ import annotations

from grafana.builder.panels import Layout, dashboard
from grafana.builder.queries import fleet_and_nodes, node_series, spread_note, worst_nodes
from grafana.builder.targets import Json
from grafana.builder.variables import metric_variable, node_variables


def build() -> Json:
    ly = Layout()
    ly.row("Evaluation")
    ly.timeseries(
        "Evaluation loss before and after the gradients",
        "Mean loss on the evaluation data before and after applying the miners' gradients.",
        node_series("A", "mean", "loss_before", "validator_window", legend="before {uid}"),
        node_series("B", "mean", "loss_after", "validator_window", legend="after {uid}"),
    )
    ly.timeseries(
        "Improvement",
        "Relative loss improvement, (before - after) / before, per validator.",
        node_series("A", "mean", "improvement", "validator_window"),
        unit="percentunit",
    )
    ly.timeseries(
        "Miners evaluated per window",
        "How many miners each validator evaluated.",
        node_series("A", "last", "evaluated_uids", "validator_window"),
    )
    ly.timeseries(
        "Validator window",
        "Window each validator evaluated last.",
        node_series("A", "max", "window", "validator_window"),
    )
    ly.row("Scores and weights per evaluated miner")
    per_miner = {
        "filters": ("eval_uid",),
        "node_by": ("eval_uid",),
        "node_legend": "{eval_uid}",
        "variable": "eval_uid",
    }
    long_range = spread_note("half an hour", "each validator's")
    fleet = (
        "With every evaluated miner selected: median, p90 and maximum across the scores the selected "
        f"validators gave{long_range}; with a few chosen in Evaluated UID: one line per evaluated miner."
    )
    ly.timeseries(
        "Score per evaluated miner",
        f"Score the selected validators gave the evaluated miners. {fleet}",
        *fleet_and_nodes("score", "validator_scores", **per_miner),
    )
    ly.timeseries(
        "Moving average score",
        f"Exponential moving average of the evaluated miners' scores. {fleet}",
        *fleet_and_nodes("moving_avg_score", "validator_scores", **per_miner),
    )
    ly.timeseries(
        "Weight per evaluated miner",
        f"Weight set on chain for the evaluated miners. {fleet}",
        *fleet_and_nodes("weight", "validator_scores", node_agg="last", **per_miner),
    )
    ly.table(
        "Highest weights",
        "The ten evaluated miners with the highest mean weight over the time range (selected validators).",
        worst_nodes("weight", "validator_scores", count=10, tag="eval_uid", filters=("eval_uid",)),
    )
    ly.table(
        "Lowest scores",
        "The ten evaluated miners with the lowest mean score over the time range (selected validators).",
        worst_nodes("score", "validator_scores", count=10, tag="eval_uid", lowest_is_worst=True, filters=("eval_uid",)),
    )
    ly.row("Evaluator benchmarks")
    ly.timeseries(
        "Benchmark score per task",
        "Checkpoint benchmark scores reported by the evaluator.",
        node_series("A", "last", "score", "evaluator_benchmark", by=("task",), legend="{task}"),
    )
    ly.timeseries(
        "Benchmark duration",
        "Time each benchmark took.",
        node_series("A", "mean", "duration_s", "evaluator_benchmark", by=("task",), legend="{task}"),
        unit="s",
    )
    variables = [
        *node_variables(None),
        metric_variable("eval_uid", "Evaluated UID", "eval_uid", "validator_scores", ("network", "uid")),
    ]
    return dashboard(
        "telemetry-validators",
        "Validators",
        "Evaluation losses and improvement, scores and weights per evaluated miner.",
        ["validators"],
        variables,
        ly,
    )
