"""The one model of what a simulated node logs: every catalog point it writes, step by step.

The live fleet (`simulator/fleet.py`), the backfilled history (`simulator/backfill.py`)
and the dashboard tests all draw their points from `NodeModel`, so a measurement or a
field added to the catalog (`telemetry_client/catalog.py`) is taught here once; a test
(tests/test_simulator.py) fails, naming the field, until it is.

A step is one unit of the role's work (a training step, a miner evaluated, an
aggregation round, a benchmark run); the shapes come from `simulator/signals.py`. What
differs between a live node and a written history is a parameter of the model, `Pace`:
a live node leaves the host's `system` points and its own `telemetry_client` counters to
its MetricsLogger, where the backfill and the tests have the model write them; the
backfill scores every miner once a window where a live validator scores one a tick.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from simulator import signals as sg
from telemetry_client.catalog import DELTA_SUFFIX, DROP_REASONS, LOKI_ONLY_COUNTERS, SELF_COUNTERS, SPARSE_DELTAS

# Typical GPU utilisation per role, in percent: miners train flat out, aggregators mostly wait.
BUSY: dict[str, float] = {"miner": 96.0, "validator": 70.0, "aggregator": 45.0, "evaluator": 80.0}
SINKS: tuple[str, ...] = ("influxdb", "loki")
# Per self-metrics interval of a node logging about ten points a second: what each counter grows by.
HISTORY_GROWTH: dict[str, float] = {
    "queued": 100.0,
    "sent": 100.0,
    "batches": 1.0,
    "bytes_sent": 8192.0,
    "retries": 0.01,
    "truncated": 0.0,
    "metadata_removed": 0.0,
    **{f"dropped_{reason}": 0.002 for reason in DROP_REASONS},
}


class Point(NamedTuple):
    """One point as a node hands it to `MetricsLogger.log`: a list field is written as its statistics."""

    measurement: str
    tags: dict[str, str]
    fields: dict[str, Any]
    samples_host: bool = False  # the role's per-step point: the node asks the client for `system` with it


@dataclass(frozen=True)
class ClientCounters:
    """The client's own counters (`telemetry_client`, one point per sink), when the model writes them.

    Every counter grows by its `growth` per point on average, `jitter` either way;
    the growth is whole records, so a rare event (a retry, a drop) happens now and
    then, at a different moment on every node. `sparse` writes the points as the
    client does (a zero delta of `SPARSE_DELTAS` left out, `truncated` and `metadata_removed` for Loki
    only); the dashboard tests want every field on every point instead.
    """

    every: int = 1
    growth: Mapping[str, float] = field(default_factory=lambda: dict(HISTORY_GROWTH))
    jitter: float = 0.2
    sparse: bool = True
    pending_max: int = 50
    pending_record_bytes: int = 200


@dataclass(frozen=True)
class Pace:
    """How much a node logs per step, and which points the model writes in place of the client.

    `role_every`: steps between a role's own points (a role not named: every step;
    None: once a window, at its start). `batch`: miners a validator scores, or
    benchmark tasks an evaluator runs, per role step (None: all of them).
    `host_every`: steps between `system` and GPU points (None: the client samples
    the host, and the simulated GPUs are read at each window start). `counters`:
    the client's own counters (None: the client writes its own). `tasks`: the
    evaluator's benchmarks, run in turn.
    """

    role_every: Mapping[str, int | None] = field(default_factory=dict)
    batch: int | None = 1
    tasks: tuple[str, ...] = sg.BENCHMARK_TASKS
    host_every: int | None = None
    counters: ClientCounters | None = None
    overflow_rate: float = sg.OVERFLOW_RATE


LIVE = Pace()
"""A simulated node run against a live stack: one unit of work a tick, the client samples the rest."""


class _CounterModel:
    """Cumulative counters per sink, growing by whole records, with the deltas the client writes beside them."""

    def __init__(self, rng: Any, settings: ClientCounters) -> None:
        self.rng = rng
        self.settings = settings
        unknown = set(settings.growth) - set(SELF_COUNTERS)
        if unknown:
            raise ValueError(f"growth given for counters the catalog does not define: {sorted(unknown)}")
        missing = set(SELF_COUNTERS) - set(settings.growth) - {"dropped"}  # dropped: the sum of the reasons
        if missing:
            raise ValueError(f"no growth for counter(s) {sorted(missing)} of telemetry_client: add one to {__name__}")
        names = [*settings.growth, "dropped"]
        self.totals = {sink: dict.fromkeys(names, 0.0) for sink in SINKS}
        # What is owed but not yet a whole record; a random start spreads rare events across nodes.
        self.owed = {sink: {name: rng.random() for name in settings.growth} for sink in SINKS}

    def point(self, sink: str) -> Point:
        settings, rng = self.settings, self.rng
        totals, owed = self.totals[sink], self.owed[sink]
        deltas: dict[str, float] = {}
        for name, growth in settings.growth.items():
            owed[name] += growth * (1.0 + rng.uniform(-settings.jitter, settings.jitter) if settings.jitter else 1.0)
            deltas[name] = float(math.floor(owed[name]))
            owed[name] -= deltas[name]
        deltas["dropped"] = sum(value for name, value in deltas.items() if name.startswith("dropped_"))
        fields: dict[str, float] = {}
        for name, delta in deltas.items():
            if settings.sparse and name in LOKI_ONLY_COUNTERS and sink != "loki":
                continue  # only the Loki handler shortens lines or removes metadata
            totals[name] += delta
            fields[name] = totals[name]
            if delta or not settings.sparse or name not in SPARSE_DELTAS:
                fields[name + DELTA_SUFFIX] = delta
        pending = float(rng.randint(0, settings.pending_max))
        fields["pending"] = pending
        fields["pending_bytes"] = pending * settings.pending_record_bytes
        return Point("telemetry_client", {"sink": sink}, fields)


class NodeModel:
    """Every point one node logs, step by step, from its own seeded signals.

    `points(step, window)` is one step: when `window` is a new one, the previous
    window's summary and the new window's network view, timings and (live) GPUs
    come first, then the role's work and whatever `pace` has the model sample.
    The same seed, node and pace give the same points on every run.
    """

    def __init__(
        self,
        role: str,
        uid: str,
        seed: int,
        *,
        miner_uids: Sequence[str],
        fleet_size: int,
        gpus: int,
        total_steps: int,
        pace: Pace = LIVE,
    ) -> None:
        self.role = role
        self.pace = pace
        self.rng = sg.node_rng(seed, role, uid)
        self.miner_uids = list(miner_uids)
        progress = sg.Progress.for_steps(total_steps)
        self.network = sg.NetworkSignals(self.rng, fleet_size)
        self.gpu = sg.GpuSignals(self.rng, gpus, BUSY[role])
        self.host = sg.HostSignals(self.rng, BUSY[role]) if pace.host_every else None
        self.miner = sg.MinerSignals(self.rng, progress, pace.overflow_rate) if role == "miner" else None
        self.validator = (
            sg.ValidatorSignals(self.rng, seed, self.miner_uids, progress)
            if role == "validator" and self.miner_uids
            else None
        )
        self.aggregator = sg.AggregatorSignals(self.rng, len(self.miner_uids)) if role == "aggregator" else None
        self.evaluator = sg.EvaluatorSignals(self.rng, progress) if role == "evaluator" else None
        self.counters = _CounterModel(self.rng, pace.counters) if pace.counters else None
        self.window: int | None = None
        self._queue: list[str] = []  # miners left to score in the validator's current pass
        self._evaluated = 0  # miners scored in the current window
        self._task = 0  # the evaluator's next benchmark task, in turn

    # ------------------------------------------------------------ steps

    def points(self, step: int, window: int) -> list[Point]:
        """What the node logs at `step`, in order, the step belonging to `window`."""
        out: list[Point] = []
        opened = window != self.window
        if opened:
            out += self.end_window(step)
            self.window = window
            out += self._start_window()
        every = self.pace.role_every.get(self.role, 1)
        if opened if every is None else step % every == 0:
            out += self._role_points(step)
        if self.pace.host_every and step % self.pace.host_every == 0:
            out += self._host_points()
        if self.counters is not None and step % self.counters.settings.every == 0:
            out += [self.counters.point(sink) for sink in SINKS]
        return out

    def end_window(self, step: int) -> list[Point]:
        """End the window in progress: its summary (a validator's), as a node logs it when the window ends."""
        window, self.window = self.window, None
        if self.validator is None or window is None:
            return []
        summary = self.validator.window_summary(step, self._evaluated)
        return [Point("validator_window", {}, {**summary, "window": float(window), "global_step": float(step)})]

    def _start_window(self) -> list[Point]:
        assert self.window is not None
        window = float(self.window)
        out = [
            Point("network_status", {}, {**self.network.status(), "window": window}),
            Point("performance", {}, {**self.network.performance(), "window": window}),
        ]
        if self.pace.host_every is None:
            out += [Point(name, tags, fields) for name, tags, fields in self.gpu.points()]
        if self.validator is not None:
            self._queue = self._shuffled_miners()
            self._evaluated = 0
        return out

    def _host_points(self) -> list[Point]:
        assert self.host is not None
        return [Point("system", {}, self.host.sample())] + [
            Point(name, tags, fields) for name, tags, fields in self.gpu.points()
        ]

    def _shuffled_miners(self) -> list[str]:
        order = list(self.miner_uids)
        self.rng.shuffle(order)
        return order

    def _role_points(self, step: int) -> list[Point]:
        window = float(self.window or 0)
        if self.miner is not None:
            m = self.miner
            fields = {
                "loss": m.loss(step),
                "learning_rate": m.learning_rate(step),
                "grad_norm": m.grad_norms(step),  # a list: the client writes mean/min/max/median
                "tokens_per_sec": m.tokens_per_sec(),
                "batch_tokens": m.batch_tokens,
                "window": window,
                "global_step": float(step),
            }
            return [Point("training_step", {}, fields, samples_host=True)]
        if self.role == "validator":
            if self.validator is None:  # a network without miners: nothing to evaluate, only its view
                return [Point("network_status", {}, {**self.network.status(), "window": window}, samples_host=True)]
            out = []
            for _ in range(self.pace.batch or len(self.miner_uids)):
                if not self._queue:  # scored every miner this window: start another pass
                    self._queue = self._shuffled_miners()
                eval_uid = self._queue.pop()
                self._evaluated += 1
                fields = {**self.validator.score(eval_uid), "window": window}
                out.append(Point("validator_scores", {"eval_uid": eval_uid}, fields, samples_host=True))
            return out
        if self.aggregator is not None:
            return [Point("aggregator_step", {}, {**self.aggregator.round(), "window": window}, samples_host=True)]
        assert self.evaluator is not None
        out = []
        tasks = self.pace.tasks
        for _ in range(self.pace.batch or len(tasks)):
            task = tasks[self._task % len(tasks)]
            self._task += 1
            fields = {**self.evaluator.benchmark(task, step), "global_step": float(step), "window": window}
            out.append(Point("evaluator_benchmark", {"task": task}, fields, samples_host=True))
        return out


@dataclass(frozen=True)
class TickCount:
    """Points a live node logs: on every tick, and on top at each window boundary (closing one, opening the next)."""

    per_tick: int
    per_window: int


def tick_count(role: str, gpus: int, miner_uids: Sequence[str], fleet_size: int, pace: Pace = LIVE) -> TickCount:
    """Count, on a throwaway model of such a node, what a tick inside a window and a tick opening one log.

    The load controller paces points, not ticks: the plan's ticks per window come
    from these counts, so they follow whatever the model logs.
    """
    model = NodeModel(
        role, "count", 0, miner_uids=miner_uids, fleet_size=fleet_size, gpus=gpus, total_steps=10, pace=pace
    )
    model.points(0, 0)
    inside = len(model.points(1, 0))
    opening = len(model.points(2, 1))
    return TickCount(inside, opening - inside)
