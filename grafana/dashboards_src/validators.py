"""Validators: evaluation losses and improvement, scores and weights, evaluator benchmarks."""

from __future__ import annotations

from grafana.builder.panels import Layout, dashboard
from grafana.builder.queries import (
    influx_select,
)
from grafana.builder.targets import Json, influx_target
from grafana.builder.variables import influx_variable, node_variables


def build() -> Json:
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
