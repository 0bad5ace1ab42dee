"""The simulator's parts without servers: signals, nodes, pacing, counters, report and exit codes."""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import time
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from simulator import backups, cli, load, values, victoria
from simulator import dashboards as dash
from simulator import faults as ft
from simulator import fleet as fl
from simulator import report as rp
from simulator import signals as sg
from simulator import validate as vd
from simulator.backfill import FleetShape
from simulator.cli import UsageError, build_parser, resolve_stack
from telemetry_client import MetricsLogger, setup_loki_logger
from telemetry_client._influx.fields import normalize_fields
from telemetry_client.catalog import (
    CATALOG,
    DELTA_SUFFIX,
    LOKI_ONLY_COUNTERS,
    ROLES,
    SELF_COUNTERS,
    STACK_CATALOG,
    measurements_for_role,
)
from telemetry_client.testing import InMemoryDestination

_OPEN: list[Any] = []  # the loggers the recorders built, closed after each test


@pytest.fixture(autouse=True)
def _close_recorders() -> Iterator[None]:
    yield
    while _OPEN:
        _OPEN.pop().close(0)


class Recorder:
    """A node's MetricsLogger sending to memory: what it would have written, through the client's own encoder.

    `calls` is what the node handed `log()` (measurement, whether it asked for
    system metrics); `points` what the logger sent, after its tag and typing rules;
    `drops` what the client dropped, by reason.
    """

    def __init__(self) -> None:
        self.sent = InMemoryDestination()
        self.logger = MetricsLogger(destination=self.sent, self_metrics_interval=None)
        _OPEN.append(self.logger)
        self.calls: list[tuple[str, bool]] = []

    def log(
        self,
        measurement: str,
        tags: Mapping[str, Any] | None = None,
        fields: Mapping[str, Any] | None = None,
        timestamp: int | None = None,
        with_system_metrics: bool = False,
        with_gpu_metrics: bool = False,
    ) -> None:
        self.calls.append((measurement, with_system_metrics))
        # The host's own samples are left out: they are not the node's, and differ from run to run.
        self.logger.log(measurement, tags, fields, timestamp)

    @property
    def points(self) -> list[tuple[str, dict[str, str], dict[str, Any], int]]:
        assert self.sent.flush() == 0
        return [(p.measurement, p.tags, p.fields, p.timestamp) for p in self.sent.points]

    @property
    def drops(self) -> dict[str, int]:
        assert self.sent.flush() == 0
        return self.logger.stats()["dropped_by_reason"]


class LogRecorder:
    """A node's Loki logger sending to memory: (level, message, context, with a traceback) of each line sent."""

    def __init__(self) -> None:
        self.sent = InMemoryDestination()
        self.logger = setup_loki_logger(
            "sim-test", destination=self.sent, console=False, level="DEBUG", logger_name=f"sim-test.{id(self)}"
        )
        _OPEN.append(self.logger)
        self.log_with_context = self.logger.log_with_context
        self.log = self.logger.log

    @property
    def lines(self) -> list[tuple[str, str, dict[str, Any], bool]]:
        assert self.sent.flush() == 0
        lines = []
        for entry in self.sent.entries:
            record = entry.record
            context = {k: v for k, v in record.items() if k not in ("message", "level", "logger", "pid", "thread")}
            with_exception = context.pop("exception", None) is not None
            lines.append((record["level"], record["message"], context, with_exception))
        return lines


COUNTS = {"miner": 6, "validator": 2, "aggregator": 1, "evaluator": 1}
RUN = fl.RunIdentity("sim-test", "testnet", 7)


def _simulate(seed: int, ticks: int = 400, with_logs: bool = False) -> dict[str, tuple[Recorder, LogRecorder]]:
    specs = fl.build_specs(COUNTS, seed)
    plan = fl.plan_for(specs, points_per_sec=500, window_seconds=2, duration=10)
    run = fl.RunIdentity("sim-test", "testnet", seed)
    out = {}
    nodes = []
    for spec in specs:
        recorder, logs = Recorder(), LogRecorder()
        node = fl.SimNode(spec, run, plan, recorder, logs if with_logs else None)
        nodes.append(node)
        out[spec.uid] = (recorder, logs)
    for _ in range(ticks):
        for node in nodes:
            node.tick()
            if with_logs:
                node.log_line()
    for node in nodes:
        node.finish()
    return out


# ---------------------------------------------------------------- signals


def test_learning_rate_warms_up_then_decays_to_the_floor() -> None:
    lrs = [sg.cosine_lr(step, 1000, 100, 3e-4, 3e-5) for step in range(1100)]
    assert lrs[0] < lrs[50] < lrs[99] == pytest.approx(3e-4)
    assert all(a >= b for a, b in itertools.pairwise(lrs[100:1000]))
    assert lrs[1000] == pytest.approx(3e-5) and lrs[1099] == pytest.approx(3e-5)


def test_miner_loss_falls_and_gradient_norms_settle() -> None:
    miner = sg.MinerSignals(sg.node_rng(1, "miner", "9"), sg.Progress.for_steps(2000))
    early = [miner.loss(step) for step in range(0, 50)]
    late = [miner.loss(step) for step in range(1950, 2000)]
    assert sum(late) / len(late) < 0.5 * sum(early) / len(early)
    norms_early = [n for s in range(50) for n in miner.grad_norms(s) if math.isfinite(n)]
    norms_late = [n for s in range(1950, 2000) for n in miner.grad_norms(s) if math.isfinite(n)]
    assert sum(norms_late) / len(norms_late) < sum(norms_early) / len(norms_early)


def test_validator_weights_are_a_distribution_favouring_better_miners() -> None:
    uids = [str(u) for u in range(10, 20)]
    validator = sg.ValidatorSignals(sg.node_rng(3, "validator", "0"), 3, uids, sg.Progress.for_steps(100))
    for _ in range(30):
        for uid in uids:
            validator.score(uid)
    weights = {uid: validator.weight(uid) for uid in uids}
    assert sum(weights.values()) == pytest.approx(1.0)
    best = max(uids, key=validator.quality.__getitem__)
    worst = min(uids, key=validator.quality.__getitem__)
    assert weights[best] > weights[worst]


def test_benchmark_scores_stay_within_chance_and_ceiling() -> None:
    evaluator = sg.EvaluatorSignals(sg.node_rng(0, "evaluator", "1"), sg.Progress.for_steps(100))
    for task in sg.BENCHMARK_TASKS:
        chance, ceiling = sg.TASK_RANGE[task]
        start, end = evaluator.benchmark(task, 0)["score"], evaluator.benchmark(task, 100)["score"]
        assert chance - 0.05 < start < end < ceiling + 0.05


# ---------------------------------------------------------------- the model of values

# The model writing everything itself: every miner and task a step, the host, the client's counters.
EVERY_FIELD = values.Pace(
    batch=None, host_every=1, counters=values.ClientCounters(jitter=0.0, sparse=False), overflow_rate=0.0
)


def _model_points(role: str, pace: values.Pace, steps: int, steps_per_window: int = 1) -> list[values.Point]:
    miners = ["m1", "m2", "m3"]
    model = values.NodeModel(role, "n", 3, miner_uids=miners, fleet_size=6, gpus=2, total_steps=steps, pace=pace)
    return [p for step in range(steps) for p in model.points(step, step // steps_per_window)]


@pytest.mark.parametrize("role", ROLES)
def test_every_field_of_every_measurement_a_role_emits_has_a_value(role: str) -> None:
    """A measurement or field added to the catalog needs a value in the model before anything can draw it."""
    seen: dict[str, set[str]] = {}
    for point in _model_points(role, EVERY_FIELD, steps=4):
        drops: dict[str, int] = {}
        fields = normalize_fields(point.fields, lambda reason, n, drops=drops: drops.update({reason: n}))
        assert not drops, (point.measurement, drops)
        assert point.measurement in CATALOG, f"the model writes {point.measurement}, which the catalog lacks"
        assert set(point.tags) == set(CATALOG[point.measurement].tags), point
        seen.setdefault(point.measurement, set()).update(fields)
    for measurement in (m for m in CATALOG.values() if role in m.roles):
        assert measurement.name in seen, f"no value for measurement {measurement.name}: add one to simulator/values.py"
        for name in measurement.field_names:
            assert name in seen[measurement.name], (
                f"no value for field {name} of measurement {measurement.name}: add one to simulator/values.py"
            )
        assert seen[measurement.name] <= set(measurement.field_names), measurement.name


def test_no_role_emits_what_the_stack_writes_about_itself() -> None:
    """The stack's own measurements have no role and no standard tag: the node model has no value for them."""
    assert STACK_CATALOG and all(not m.roles and "uid" not in m.tag_names for m in STACK_CATALOG.values())
    for role in ROLES:
        assert not {m.name for m in measurements_for_role(role)} & set(STACK_CATALOG)


def _line_fields(line: str) -> tuple[str, dict[str, str], dict[str, str]]:
    """Measurement, tags and raw field texts of a line without escapes or spaces in values."""
    key, fields, _ = line.split(" ")
    measurement, *tags = key.split(",")
    return (
        measurement,
        dict(tag.split("=", 1) for tag in tags),
        dict(field.split("=", 1) for field in fields.split(",")),
    )


def test_backup_reports_carry_every_field_of_the_catalog_with_its_type() -> None:
    """What the simulator writes for the backup role's report timer is the catalog's stack_backup, field for field."""
    catalog = STACK_CATALOG[backups.MEASUREMENT]
    written = backups.reports((), 1_700_000_000 * 10**9, 3, 93600.0)
    assert {r.host for r in written} == set(backups.HOSTS) and len(written) == 4 * len(backups.HOSTS)
    for report in written:
        measurement, tags, fields = _line_fields(report.line())
        assert measurement == catalog.name and set(tags) == set(catalog.tag_names)
        assert set(fields) == set(catalog.field_names)
        for field in catalog.fields:
            assert fields[field.name].endswith("i") == (field.kind == "integer"), field.name


def test_backup_ages_stay_under_the_threshold_on_a_clean_run_and_cross_it_under_the_fault() -> None:
    start_ns, threshold = 1_700_000_000 * 10**9, 93600.0
    clean = backups.reports((), start_ns, 10, threshold)
    assert all(r.age_seconds < threshold and r.last_run_ok == 1 for r in clean)
    assert all(math.isclose(r.age_seconds, (r.ts_ns / 1e9) - r.last_success, abs_tol=0.01) for r in clean)
    fault = ft.resolve([ft.Fault.parse("backup-overdue@4")], {"0": "miner"}, 10.0)
    assert fault == [ft.ActiveFault("backup-overdue", None, 4.0)]
    overdue = backups.reports(fault, start_ns, 10, threshold)
    failing = [r for r in overdue if r.host == backups.HOSTS[0]]
    assert [r.age_seconds > threshold for r in failing] == [False] * 5 + [True] * 6  # reports at 0..10 s
    assert [r.last_run_ok for r in failing] == [1] * 4 + [0] * 7  # the run at the fault's start failed
    assert [r for r in overdue if r.host != backups.HOSTS[0]] == [r for r in clean if r.host != backups.HOSTS[0]]


def test_reads_backups_finds_the_backup_panels_and_nothing_else() -> None:
    for directory in (dash.DASHBOARDS_DIR, dash.VICTORIAMETRICS_DASHBOARDS_DIR):
        readers = {q.name for q in dash.iter_queries(dash.load_dashboards(directory)) if backups.reads_backups(q.text)}
        assert readers == {"Time since the last successful backup, by host", "Last backup run succeeded, by host"}


@pytest.mark.parametrize("pace", [EVERY_FIELD, FleetShape().pace()], ids=["every-field", "backfill"])
def test_counters_only_grow_and_deltas_are_the_growth_since_the_previous_point(pace: values.Pace) -> None:
    previous: dict[str, dict[str, float]] = {}
    grew = set()
    for point in _model_points("miner", pace, steps=3000, steps_per_window=6):
        if point.measurement != "telemetry_client":
            continue
        sink = point.tags["sink"]
        before = previous.get(sink)
        for counter in SELF_COUNTERS:
            if counter not in point.fields:
                assert pace.counters is not None and pace.counters.sparse and counter in LOKI_ONLY_COUNTERS, counter
                continue
            value = point.fields[counter]
            growth = value - (before[counter] if before else 0.0)
            assert growth >= 0, (counter, value)
            # The client leaves a zero delta of the rare counters out; any other is the growth.
            assert point.fields.get(counter + DELTA_SUFFIX, 0.0) == growth, (counter, point.fields)
            grew |= {counter} if growth else set()
        previous[sink] = point.fields
    assert {"queued", "sent", "batches", "bytes_sent", "retries", "dropped"} <= grew


# ---------------------------------------------------------------- nodes


def test_every_node_emits_every_catalog_measurement_of_its_role_with_every_field() -> None:
    by_uid = _simulate(seed=1)
    specs = {spec.uid: spec for spec in fl.build_specs(COUNTS, 1)}
    for uid, (recorder, _) in by_uid.items():
        role = specs[uid].role
        seen: dict[str, set[str]] = {}
        for measurement, tags, fields, _ in recorder.points:
            seen.setdefault(measurement, set()).update(fields)
            for tag in tags:
                assert tag in CATALOG[measurement].tags, (measurement, tag)
        expected = {m.name for m in measurements_for_role(role)} | {"gpu", "gpu_memory"}
        assert set(seen) == expected, role
        for name, fields in seen.items():
            assert fields == set(CATALOG[name].field_names), (role, name)


def test_role_specific_tags_and_system_metrics() -> None:
    by_uid = _simulate(seed=2)
    points = [p for recorder, _ in by_uid.values() for p in recorder.points]
    eval_uids = {p[1]["eval_uid"] for p in points if p[0] == "validator_scores"}
    miners = {s.uid for s in fl.build_specs(COUNTS, 2) if s.role == "miner"}
    assert eval_uids == miners
    assert {p[1]["task"] for p in points if p[0] == "evaluator_benchmark"} == set(sg.BENCHMARK_TASKS)
    # The per-step point of every role asks the client for `system` metrics, as a node does.
    calls = [call for recorder, _ in by_uid.values() for call in recorder.calls]
    assert {measurement for measurement, system in calls if system} == {
        "training_step",
        "validator_scores",
        "aggregator_step",
        "evaluator_benchmark",
    }


def test_timestamps_strictly_increase_per_node() -> None:
    for recorder, _ in _simulate(seed=3, ticks=200).values():
        stamps = [p[3] for p in recorder.points]
        assert all(b > a for a, b in itertools.pairwise(stamps))


class BurstClock:
    """`time` for simulator.fleet: wall time that advances `step_ns` per reading, as in a catch-up burst."""

    def __init__(self, step_ns: int) -> None:
        self.now_ns = time.time_ns()
        self.step_ns = step_ns

    def time_ns(self) -> int:
        self.now_ns += self.step_ns
        return self.now_ns

    @staticmethod
    def monotonic() -> float:
        return time.monotonic()


class StampRecorder:
    """A node's metrics sink keeping what it was asked: series, timestamp, and whether `system` goes with it."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, str], int, bool]] = []

    def log(
        self,
        measurement: str,
        tags: Mapping[str, Any] | None = None,
        fields: Mapping[str, Any] | None = None,
        timestamp: int | None = None,
        with_system_metrics: bool = False,
        with_gpu_metrics: bool = False,
    ) -> None:
        assert timestamp is not None
        self.calls.append((measurement, dict(tags or {}), timestamp, with_system_metrics))


def test_points_of_one_series_never_share_a_millisecond(monkeypatch: pytest.MonkeyPatch) -> None:
    """A replicated VictoriaMetrics cluster keeps one sample per series and millisecond (docs/scaling.md).

    Ticks 10 us apart (the load catching up after a stall) still give each point of
    a series a millisecond of its own, the `system` sample the client adds with a
    point's timestamp included.
    """
    monkeypatch.setattr(fl, "time", BurstClock(step_ns=10_000))
    specs = fl.build_specs(COUNTS, 4)
    plan = fl.plan_for(specs, points_per_sec=500, window_seconds=2, duration=10)
    for spec in specs:
        sink = StampRecorder()
        node = fl.SimNode(spec, RUN, plan, sink)
        for _ in range(300):
            node.tick()
        node.finish()
        milliseconds: dict[tuple[str, tuple[tuple[str, str], ...]], list[int]] = {}
        for measurement, tags, timestamp, system in sink.calls:
            for series in [(measurement, tuple(sorted(tags.items())))] + ([fl.SYSTEM_SERIES] if system else []):
                milliseconds.setdefault(series, []).append(timestamp // 1_000_000)
        assert len(milliseconds) > 1 and max(len(ms) for ms in milliseconds.values()) > 100, spec
        for series, ms in milliseconds.items():
            assert len(set(ms)) == len(ms), (spec.uid, series)
        stamps = [call[2] for call in sink.calls]
        assert all(b > a for a, b in itertools.pairwise(stamps))


def test_same_seed_same_values_and_another_seed_other_values() -> None:
    def values(seed: int) -> list[Any]:
        return [(p[0], p[1], p[2]) for r, _ in _simulate(seed, ticks=150).values() for p in r.points]

    first, again, other = values(11), values(11), values(12)
    assert first == again
    assert first != other


def test_windows_advance_every_ticks_per_window_and_validators_summarise_each() -> None:
    specs = fl.build_specs(COUNTS, 5)
    plan = fl.plan_for(specs, points_per_sec=500, window_seconds=2, duration=10)
    recorder = Recorder()
    validator = next(s for s in specs if s.role == "validator")
    node = fl.SimNode(validator, RUN, plan, recorder)
    for _ in range(plan.ticks_per_window * 3):
        node.tick()
    node.finish()
    windows = [p[2]["window"] for p in recorder.points if p[0] == "validator_window"]
    assert windows == [0.0, 1.0, 2.0]


def test_gradient_overflow_is_dropped_by_the_client_as_non_finite() -> None:
    by_uid = _simulate(seed=4, ticks=600)
    drops = sum(recorder.drops.get("non_finite", 0) for recorder, _ in by_uid.values())
    assert drops > 0
    for recorder, _ in by_uid.values():
        for name, _, fields, _ in recorder.points:
            if name == "training_step":
                assert all(math.isfinite(v) for v in fields.values() if isinstance(v, float))


def test_log_lines_mix_levels_with_context_and_real_tracebacks() -> None:
    lines = [line for _, logs in _simulate(seed=6, ticks=300, with_logs=True).values() for line in logs.lines]
    levels = {level for level, _, _, _ in lines}
    assert levels == {"debug", "info", "warning", "error", "critical"}
    share_info = sum(1 for level, *_ in lines if level == "info") / len(lines)
    assert 0.6 < share_info < 0.8
    for level, _, context, with_exception in lines:
        assert {"window", "step", "peer", "trace_id", "run_id"} <= set(context)
        assert with_exception == (level in ("error", "critical"))


# ---------------------------------------------------------------- pacing and counters


def test_target_count_ramps_linearly_then_holds_the_rate() -> None:
    assert load.target_count(1000, 0, 2.0) == 2000
    assert load.target_count(1000, 4, 2.0) == pytest.approx(500)  # half way up the ramp: area of a triangle
    assert load.target_count(1000, 4, 4.0) == pytest.approx(2000)
    assert load.target_count(1000, 4, 10.0) == pytest.approx(8000)
    assert load.target_count(0, 4, 10.0) == 0


def _miners_log_two_points_per_tick(monkeypatch: pytest.MonkeyPatch) -> None:
    """A miner whose tick logs its training step twice, as a model with a second per-step point would."""
    one_point = values.NodeModel._role_points

    def two_points(model: values.NodeModel, step: int) -> list[values.Point]:
        points = one_point(model, step)
        return points * 2 if model.role == "miner" else points

    monkeypatch.setattr(values.NodeModel, "_role_points", two_points)


FLEETS = {
    "default": (COUNTS, None),
    "eight-gpu-miners": (COUNTS, 8),  # 18 window points per miner: GPUs read at every window start
    "two-points-per-miner-tick": (COUNTS, None),
}


@pytest.mark.parametrize("fleet", FLEETS)
def test_a_planned_window_lasts_window_seconds_at_the_target_rate(fleet: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The controller paces points, one tick of every node in turn: a window's points / rate is its duration."""
    if fleet == "two-points-per-miner-tick":
        _miners_log_two_points_per_tick(monkeypatch)
    counts, gpus = FLEETS[fleet]
    specs = [
        fl.NodeSpec(s.role, s.uid, s.version, gpus) if gpus and s.role == "miner" else s
        for s in fl.build_specs(counts, 8)
    ]
    rate, window_seconds = 500.0, 2.0
    plan = fl.plan_for(specs, rate, window_seconds, duration=10)
    nodes = [fl.SimNode(spec, RUN, plan, Recorder()) for spec in specs]
    logged_per_round = [sum(node.tick() for node in nodes) for _ in range(3 * plan.ticks_per_window)]
    second_window = logged_per_round[plan.ticks_per_window : 2 * plan.ticks_per_window]
    assert sum(second_window) / rate == pytest.approx(window_seconds, rel=0.02)
    # The whole run lasts about `duration` at that rate too.
    rounds = [logged_per_round[i % len(logged_per_round)] for i in range(plan.total_ticks)]
    assert sum(rounds) / rate == pytest.approx(10, rel=0.05)


def test_the_model_counts_the_points_a_node_logs_through_its_metrics_logger() -> None:
    """What `values.tick_count` says a tick and a window boundary log is what a node hands MetricsLogger.log."""
    specs = fl.build_specs(COUNTS, 9)
    plan = fl.plan_for(specs, 500, 2, 10)
    miners = plan.miner_uids
    for spec in specs:
        expected = values.tick_count(spec.role, spec.gpus, miners, len(specs))
        recorder = Recorder()
        node = fl.SimNode(spec, RUN, plan, recorder)
        calls = []
        for _ in range(2 * plan.ticks_per_window + 1):
            before = len(recorder.calls)
            node.tick()
            calls.append(len(recorder.calls) - before)
        inside = calls[1 : plan.ticks_per_window] + calls[plan.ticks_per_window + 1 : 2 * plan.ticks_per_window]
        assert set(inside) == {expected.per_tick}, spec
        for boundary in (plan.ticks_per_window, 2 * plan.ticks_per_window):
            assert calls[boundary] == expected.per_tick + expected.per_window, spec


def test_run_nodes_paces_to_the_target_count() -> None:
    specs = fl.build_specs({"miner": 3, "validator": 1, "aggregator": 0, "evaluator": 0}, 0)
    plan = fl.plan_for(specs, 400, 1, 1)
    recorders = [Recorder() for _ in specs]
    nodes = [fl.SimNode(s, RUN, plan, r) for s, r in zip(specs, recorders, strict=True)]
    outcome = load.run_nodes(nodes, 400, 0, 0.5, 0, close_timeout=1)
    logged = sum(len(r.calls) for r in recorders)
    assert outcome["points_logged"] == logged
    # 200 are due: whole ticks and window starts add a few, never a burst beyond the target;
    # a busy machine may fall short, which the report shows as a lower achieved rate.
    assert 0 < logged <= 260


def test_merge_stats_sums_counters_and_breakdowns() -> None:
    merged = load.merge_stats(
        [
            {
                "sent": 3,
                "queued": 4,
                "sent_by_key": {"a": 1, "b": 2},
                "dropped_by_reason": {"x": 1},
                "last_error": "e1",
            },
            {"sent": 5, "queued": 5, "sent_by_key": {"a": 5}, "dropped_by_reason": {}, "last_error": None},
            {},
        ]
    )
    assert merged["sent"] == 8 and merged["queued"] == 9
    assert merged["sent_by_key"] == {"a": 6, "b": 2}
    assert merged["dropped_by_reason"] == {"x": 1}
    assert merged["errors"] == ["e1"]


def test_split_deals_nodes_round_robin() -> None:
    specs = fl.build_specs({"miner": 7, "validator": 2, "aggregator": 1, "evaluator": 1}, 0)
    parts = load.split(specs, 3)
    assert sorted(s.uid for part in parts for s in part) == sorted(s.uid for s in specs)
    assert max(len(p) for p in parts) - min(len(p) for p in parts) <= 1
    assert load.split(specs[:2], 5) == [(specs[0],), (specs[1],)]


# ---------------------------------------------------------------- validation helpers


def test_macros_are_left_to_grafana_and_variables_filled_in() -> None:
    query = dash.Query("d", "D", "panel", "p", 1, "A", "influxdb", "influxdb",
                       'SELECT mean("loss") FROM "training_step" WHERE $timeFilter AND "network" =~ /^$network$/ '
                       "GROUP BY time($__interval)")  # fmt: skip
    window = dash.TimeRange(datetime(2026, 1, 1, tzinfo=UTC), datetime(2026, 1, 1, 0, 5, tzinfo=UTC))
    dashboard = {"templating": {"list": [{"name": "network", "type": "query", "multi": True, "includeAll": True}]}}
    kept = vd.interpolate(query, dashboard, {"network": "sim.net"}, window, timedelta(seconds=10), keep_macros=True)
    assert "$timeFilter" in kept and "$__interval" in kept and r"/^sim\.net$/" in kept
    full = vd.interpolate(query, dashboard, {"network": "sim.net"}, window, timedelta(seconds=10), keep_macros=False)
    assert "$" not in full.replace("$/", "") and "time(10s)" in full


def test_lines_by_level_reads_the_stream_selector() -> None:
    sent = {'{environment="n", level="info", uid="1"}': 4, '{level="error", uid="2"}': 1, '{level="info"}': 2}
    assert vd.lines_by_level(sent) == {"info": 6, "error": 1}


def test_account_reports_loss_per_key_and_waits_for_late_records() -> None:
    calls = []

    def stored(keys: Any) -> dict[str, int]:
        calls.append(1)
        return {"a": 10, "b": 4 if len(calls) < 2 else 5}

    rows = vd.account("influxdb", {"a": 10, "b": 5}, stored, settle=5)
    assert [(r.key, r.ok, r.lost) for r in rows] == [("a", True, 0), ("b", True, 0)]
    rows = vd.account("influxdb", {"a": 12}, lambda keys: {"a": 10}, settle=0)
    assert rows[0].lost == 2 and not rows[0].ok

    def broken(keys: Any) -> dict[str, int]:
        raise RuntimeError("database not found")

    rows = vd.account("influxdb", {"a": 1}, broken, settle=0)
    assert rows[0].stored is None and "database not found" in rows[0].message


def _fleet(metrics: dict[str, Any] | None = None, errors: list[str] | None = None) -> load.FleetResult:
    return load.FleetResult(RUN, 0, 1, 1.0, 10, 0, metrics or {}, {}, 0.1, 1, 1, errors=errors or [])


def _check(status: str) -> vd.QueryCheck:
    return vd.QueryCheck("d", "D", "panel", "p", 1, "A", "influxdb", status, "", 0, 0, "q")


def test_exit_code_bits() -> None:
    ok_row = vd.DeliveryRow("influxdb", "m", 5, 5)
    assert rp.exit_code(_fleet(), [_check(vd.OK), _check(vd.SKIPPED)], [ok_row]) == 0
    assert rp.exit_code(_fleet(), [_check(vd.EMPTY)], [ok_row]) == rp.EXIT_PANELS
    assert rp.exit_code(_fleet(), [_check(vd.ERROR)], [vd.DeliveryRow("influxdb", "m", 5, 4)]) == 5
    dropped = _fleet({"dropped_by_reason": {"buffer_full": 3, "sampled_out": 9}})
    assert rp.exit_code(dropped, [], [ok_row]) == rp.EXIT_LOSS
    harmless = _fleet({"dropped_by_reason": {"sampled_out": 9, "non_finite": 2}})
    assert rp.exit_code(harmless, [], [ok_row]) == 0
    assert rp.exit_code(_fleet(errors=["worker 0: boom"]), [], [vd.DeliveryRow("loki", "x", 1, None)]) == 8


def test_report_has_no_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    from simulator.cli import public_settings

    monkeypatch.setenv("INFLUXDB_TOKEN", "s3cr3t-token-value")
    args = build_parser().parse_args(["--influxdb-url", "http://127.0.0.1:1"])
    stack = resolve_stack(args)
    report = rp.build_report(public_settings(args, stack, RUN), _fleet(), [], [])
    assert "s3cr3t-token-value" not in repr(report)


def test_stack_comes_from_the_clients_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("INFLUXDB_URL", "INFLUXDB_TOKEN", "LOKI_URL", "GRAFANA_URL", "INFLUXDB_API_VERSION"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("INFLUXDB_HOST", "127.0.0.1")
    monkeypatch.setenv("INFLUXDB_PORT", "18086")
    monkeypatch.setenv("INFLUXDB_DATABASE", "bucket1")
    monkeypatch.setenv("LOKI_URL", "http://127.0.0.1:3100/")
    parser = build_parser()
    with pytest.raises(UsageError, match="INFLUXDB_TOKEN"):
        resolve_stack(parser.parse_args([]))
    monkeypatch.setenv("INFLUXDB_TOKEN", "t")
    stack = resolve_stack(parser.parse_args([]))
    assert (stack.influx_url, stack.database, stack.loki_url) == (
        "http://127.0.0.1:18086",
        "bucket1",
        "http://127.0.0.1:3100",
    )
    assert stack.read_token == "t"
    stack = resolve_stack(parser.parse_args(["--influxdb-api-version", "1", "--influxdb-database", "db2"]))
    assert stack.api_version == 1 and stack.database == "db2" and stack.read_token is None
    monkeypatch.setenv("GRAFANA_URL", "http://127.0.0.1:3000")
    monkeypatch.delenv("GRAFANA_TOKEN", raising=False)
    monkeypatch.delenv("GRAFANA_USER", raising=False)
    with pytest.raises(UsageError, match="GRAFANA_TOKEN"):
        resolve_stack(parser.parse_args([]))


def test_help_documents_every_flag(capsys: pytest.CaptureFixture[str]) -> None:
    parser = build_parser()
    with pytest.raises(SystemExit):
        parser.parse_args(["--help"])
    text = capsys.readouterr().out
    for action in parser._actions:
        for option in action.option_strings:
            assert option in text
        if action.option_strings and action.dest != "help":
            assert action.help, action.option_strings


def test_roles_cover_the_catalog() -> None:
    assert set(COUNTS) == set(ROLES) == set(fl.role_counts(1, 2, 3, 4))
    assert fl.role_counts(1, 2, 3, 4)["validator"] == 2


# ---------------------------------------------------------------- the tests' LogQL evaluator


def _entries() -> list[Any]:
    from loki_receiver import Entry

    def entry(level: str, uid: str, ts_s: int, body: dict[str, Any] | str) -> Entry:
        labels = {"environment": "net", "service": "miner", "level": level, "uid": uid}
        line = body if isinstance(body, str) else json.dumps(body)
        return Entry(labels, "", ts_s * 10**9, line, None, None)

    return [
        entry("info", "1", 10, {"message": "step", "run_id": "r1", "logger": "a"}),
        entry("info", "2", 11, {"message": "step", "run_id": "r1", "logger": "a"}),
        entry("error", "1", 12, {"message": "failed", "run_id": "r1", "logger": "b"}),
        entry("error", "2", 13, {"message": "failed", "run_id": "r2", "logger": "b"}),
        entry("warning", "1", 14, "not json at all"),
    ]


def test_logql_evaluator_counts_groups_and_filters() -> None:
    from grafana_receiver import LogQLError, label_values, logql_query

    entries, end = _entries(), 20 * 10**9

    def instant(expr: str) -> dict[tuple[tuple[str, str], ...], float]:
        data = logql_query(expr, entries, end, end, None)
        return {tuple(sorted(r["metric"].items())): float(r["value"][1]) for r in data["result"]}

    assert instant('sum by (level) (count_over_time({environment="net"}[20s]))') == {
        (("level", "info"),): 2,
        (("level", "error"),): 2,
        (("level", "warning"),): 1,
    }
    assert instant('sum(count_over_time({environment=~"ne"}[20s]))') == {}  # regexes are anchored
    assert instant('sum(count_over_time({environment="net"} | json run_id="run_id" | run_id="r1" [20s]))') == {(): 3}
    assert instant('sum(count_over_time({environment="net"} | json | __error__="" [20s]))') == {(): 4}
    assert instant('sum(count_over_time({environment="net"} |= "failed" [20s]))') == {(): 2}
    assert instant('sum(count_over_time({environment="net"}[5s]))') == {}  # nothing in (15s, 20s]
    ratio = instant('sum(rate({environment="net", level="error"}[20s])) / sum(rate({environment="net"}[20s]))')
    assert ratio == {(): pytest.approx(0.4)}
    top = instant('topk(1, sum by (uid) (count_over_time({environment="net"}[20s])))')
    assert top == {(("uid", "1"),): 3}
    streams = logql_query('{level=~"error|info"} |~ "(?i)FAILED" | json', entries, 0, end, None)
    assert sum(len(s["values"]) for s in streams["result"]) == 2
    assert label_values("uid", '{level="error"}', entries, 0, end) == ["1", "2"]
    with pytest.raises(LogQLError):
        logql_query('sum(count_over_time({environment="net"} [20x]))', entries, end, end, None)
    with pytest.raises(LogQLError):
        logql_query("sum by (level (", entries, end, end, None)


def test_log_panels_are_fetched_with_their_own_line_count(monkeypatch):
    """Grafana sends a target's maxLines as Loki's `limit`, and the data source's default where it has none."""
    dashboard = json.loads((dash.DASHBOARDS_DIR / "logs.json").read_text())
    with_lines = [q for q in dash.panel_queries(dashboard) if q.max_lines]
    assert with_lines and {q.max_lines for q in with_lines} == {250}, "the Logs panels set maxLines 250"
    asked: list[str] = []

    def fake_http(url, data, headers, timeout):
        asked.append(url)
        return 200, b'{"status":"success","data":{"resultType":"streams","result":[]}}'

    monkeypatch.setattr(vd, "_http", fake_http)
    window = dash.TimeRange.last(timedelta(hours=1))
    loki = vd.LokiQL("http://loki.invalid")
    for query in (with_lines[0], dataclasses.replace(with_lines[0], max_lines=None)):
        loki.run(query, query.text, window, timedelta(seconds=10))
    assert "limit=250" in asked[0]
    assert f"limit={vd.LOKI_DEFAULT_MAX_LINES}" in asked[1]


def test_the_count_step_asks_only_a_single_node_to_flush(monkeypatch):
    """A cluster's vmselect has no /internal/force_flush: asking it only adds a warning to its log."""
    asked: list[str] = []

    def fake_http(url, data, headers, timeout):
        asked.append(url)
        return 200, b""

    monkeypatch.setattr(victoria, "_http", fake_http)
    assert victoria.PromQL("http://vmselect.invalid:8481/select/0/prometheus").flush() is False
    assert asked == []
    assert victoria.PromQL("http://victoria.invalid:8428").flush() is True
    assert asked == ["http://victoria.invalid:8428/internal/force_flush"]


@pytest.mark.parametrize(
    ("write_url", "checked"),
    [
        ("http://vminsert.invalid:8480/insert/0/influx", "http://vminsert.invalid:8480/health"),
        ("http://victoria.invalid:8428", "http://victoria.invalid:8428/health"),
    ],
)
def test_the_victoriametrics_write_url_is_checked_at_its_health_endpoint(monkeypatch, write_url, checked):
    """A cluster's vminsert knows no /insert/<tenant>/influx/ping: it answers 400 and logs every one."""
    seen: list[str] = []

    def fake_check(url: str, what: str) -> None:
        seen.append(url)
        if len(seen) == 2:
            raise UsageError("stop here")

    monkeypatch.setattr(cli, "check_reachable", fake_check)
    monkeypatch.setenv("INFLUXDB_TOKEN", "unchecked")
    argv = [
        "--metrics-backend",
        "victoriametrics",
        "--victoriametrics-url",
        "http://vmselect.invalid:8481/select/0/prometheus",
    ]
    with pytest.raises(UsageError):
        cli.execute(build_parser().parse_args([*argv, "--influxdb-url", write_url]))
    assert seen[1] == checked
