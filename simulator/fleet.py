"""Simulated nodes: each one uses telemetry_client exactly as a real node does.

A node has its own MetricsLogger (uid, role, version, network and a runtime_id
unique to the run) and its own Loki logger. `tick()` performs one unit of the
role's work and logs what a real node logs for it; `log_line()` writes one log
line at a realistic level, with context, and with a real traceback for errors.

The points come from the fleet's one model of values (`simulator/values.py`), driven
by the node's step counter and seeded RNG, so a run is reproducible. Windows advance
every `ticks_per_window` ticks; `plan_for` picks that number from what the model says
a tick and a window boundary log, so that windows last about `--window-seconds`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from simulator import signals as sg
from simulator import values
from simulator.faults import ActiveFault, for_node
from telemetry_client import BufferSettings

DEFAULT_VERSION = "1.4.2"
PREVIOUS_VERSION = "1.4.1"  # a share of the fleet has not upgraded yet, as on a real network
# Level mix of a healthy node's logs (weights), DEBUG included.
LEVEL_WEIGHTS: tuple[tuple[str, float], ...] = (
    ("debug", 0.15),
    ("info", 0.70),
    ("warning", 0.10),
    ("error", 0.045),
    ("critical", 0.005),
)


NS_PER_MS = 1_000_000
# A series of one node: its measurement and the point's own tags (the logger's standard tags are the node's).
SeriesKey = tuple[str, tuple[tuple[str, str], ...]]
# The series of the `system` point the client adds to a point logged with_system_metrics (same timestamp).
SYSTEM_SERIES: SeriesKey = ("system", ())


class MetricsSink(Protocol):
    """The part of MetricsLogger a node uses (a recorder stands in for it in unit tests)."""

    def log(
        self,
        measurement: str,
        tags: Mapping[str, Any] | None = None,
        fields: Mapping[str, Any] | None = None,
        timestamp: int | None = None,
        with_system_metrics: bool = False,
        with_gpu_metrics: bool = False,
    ) -> None: ...


@dataclass(frozen=True)
class NodeSpec:
    """Who a simulated node is."""

    role: str
    uid: str
    version: str
    gpus: int


@dataclass(frozen=True)
class RunIdentity:
    """What every node of one run shares; `run_id` scopes the accounting to this run."""

    run_id: str
    network: str
    seed: int

    def runtime_id(self, uid: str) -> str:
        return f"{self.run_id}-{uid}"


@dataclass(frozen=True)
class Targets:
    """Where the fleet sends metrics and logs (picklable, handed to worker processes)."""

    influx_url: str
    database: str
    api_version: int = 2
    token: str | None = None
    org: str | None = None
    username: str | None = None
    password: str | None = None
    loki_url: str | None = None
    loki_tenant_per_node: bool = False  # X-Scope-OrgID: the node's uid, as the edge sets it in production
    system_interval: float = 1.0
    self_metrics_interval: float | None = 1.0
    buffer: BufferSettings = field(default_factory=BufferSettings)


@dataclass(frozen=True)
class Plan:
    """The run's shape as the nodes see it: steps per window and steps in the whole run."""

    ticks_per_window: int
    total_ticks: int
    miner_uids: tuple[str, ...]
    fleet_size: int
    faults: tuple[ActiveFault, ...] = ()  # injected faults (simulator/faults.py), for every node to pick its own


def build_specs(counts: Mapping[str, int], seed: int) -> list[NodeSpec]:
    """Nodes in uid order: validators, aggregators and evaluators first, then miners."""
    specs: list[NodeSpec] = []
    uid = 0
    for role in ("validator", "aggregator", "evaluator", "miner"):
        for _ in range(max(0, counts.get(role, 0))):
            rng = sg.node_rng(seed, role, str(uid))
            version = PREVIOUS_VERSION if rng.random() < 0.2 else DEFAULT_VERSION
            gpus = rng.choice((1, 2, 4, 8)) if role == "miner" else 1
            specs.append(NodeSpec(role, str(uid), version, gpus))
            uid += 1
    return specs


# ------------------------------------------------------------ real exceptions
# Small functions that fail the way a node's I/O fails, so an error line carries a
# real traceback with real frames.


def _fetch_gradient(peer: str, timeout: float) -> bytes:
    raise TimeoutError(f"timed out after {timeout:.1f}s fetching the gradient of peer {peer}")


def _decompress(peer: str, payload: bytes) -> list[float]:
    if not payload:
        raise ValueError(f"corrupt gradient from peer {peer}: empty payload after decompression")
    return [float(b) for b in payload]


def _peer_bucket(peers: Mapping[str, str], peer: str) -> str:
    return peers[peer]  # KeyError: the peer left the metagraph


def _load_checkpoint(window: int) -> bytes:
    raise FileNotFoundError(f"checkpoint for window {window} not found in the bucket")


FAILURES: tuple[tuple[str, Callable[[str, int], object]], ...] = (
    ("Failed to gather gradient", lambda peer, window: _fetch_gradient(peer, 10.0)),
    ("Discarded invalid gradient", lambda peer, window: _decompress(peer, b"")),
    ("Peer missing from metagraph", lambda peer, window: _peer_bucket({}, peer)),
    ("Could not load checkpoint", lambda peer, window: _load_checkpoint(window)),
)

MESSAGES: dict[str, dict[str, tuple[str, ...]]] = {
    "miner": {
        "debug": ("Loaded batch", "Heartbeat", "Optimizer state synced"),
        "info": ("Completed training step", "Uploaded gradient", "Gathered gradients from peers", "Applied update"),
        "warning": ("Peer gradient arrived late", "Slow training step", "Retrying gradient upload"),
    },
    "validator": {
        "debug": ("Sampled evaluation batch", "Heartbeat"),
        "info": ("Evaluated miner", "Set weights on chain", "Started evaluation window"),
        "warning": ("Miner gradient missing", "Weights not set: rate limited", "Sync lag detected"),
    },
    "aggregator": {
        "debug": ("Merging gradient", "Heartbeat"),
        "info": ("Aggregated gradients", "Published aggregated state"),
        "warning": ("Gather below quorum", "Slow aggregation round"),
    },
    "evaluator": {
        "debug": ("Loading benchmark data", "Heartbeat"),
        "info": ("Benchmark finished", "Loaded checkpoint"),
        "warning": ("Benchmark took longer than expected", "Checkpoint is behind the network"),
    },
}


class SimNode:
    """One simulated node of the network."""

    def __init__(
        self,
        spec: NodeSpec,
        run: RunIdentity,
        plan: Plan,
        metrics: MetricsSink,
        logger: Any = None,
        close: Callable[[float], None] | None = None,
        stats: Callable[[], tuple[dict, dict]] | None = None,
    ) -> None:
        self.spec = spec
        self.run = run
        self.plan = plan
        self.metrics = metrics
        self.logger = logger
        self._close = close
        self._stats = stats
        self.log_rng = sg.node_rng(run.seed, f"{spec.role}/logs", spec.uid)
        self.model = values.NodeModel(
            spec.role,
            spec.uid,
            run.seed,
            miner_uids=plan.miner_uids,
            fleet_size=plan.fleet_size,
            gpus=spec.gpus,
            total_steps=plan.total_ticks,
        )
        self.step = 0
        self.window = -1
        self._last_ts = 0
        self._last_ms: dict[SeriesKey, int] = {}  # the millisecond of each series' latest point
        self.points = 0
        self.lines = 0
        self.peers = [u for u in plan.miner_uids if u != spec.uid] or [spec.uid]
        self.faults = for_node(plan.faults, spec.uid)
        self.load_started = time.monotonic()  # set again by the load controller when the load starts
        self._active: frozenset[str] = frozenset()
        self._fault_points_at = 0.0
        self._stalled_window: int | None = None

    # ---------------------------------------------------------------- faults

    def _update_faults(self) -> None:
        """Which of the node's faults have started by now."""
        elapsed = time.monotonic() - self.load_started
        active = frozenset(f.kind for f in self.faults if elapsed >= f.at)
        if "gpu-oom" in active - self._active:
            self.model.gpu.exhaust()
        self._active = active

    def _fault_points(self) -> None:
        """What a faulty host reports, a few times a second (the client's own samples go on)."""
        now = time.monotonic()
        if now - self._fault_points_at < 0.2:
            return
        self._fault_points_at = now
        if self._active & {"memory-full", "disk-full"}:
            # One point with both fields (the other at a healthy level), so that every system point
            # carries memory_percent: the delivery count takes the fullest column as the point count.
            full = {"memory_percent": 98.0 if "memory-full" in self._active else 40.0}
            full["disk_percent"] = 97.0 if "disk-full" in self._active else 40.0
            self._log("system", full)
        if "drops" in self._active:
            self._log("performance", {"step_time_s": None, "window": float(max(0, self.window))})

    # ---------------------------------------------------------------- metrics

    def _timestamp(self, series: Sequence[SeriesKey]) -> int:
        """Now, in ns, strictly increasing per node, and in a millisecond none of `series` has had yet.

        VictoriaMetrics stores milliseconds, and a replicated cluster's deduplication
        (-dedup.minScrapeInterval=1ms) keeps one sample of a series per millisecond
        (docs/scaling.md): a point that shared its series' last millisecond would be
        lost there, so it moves to the next one. Only a series logged more than 1,000
        times a second runs ahead of the clock.
        """
        ts = max(time.time_ns(), self._last_ts + 1)
        for key in series:
            taken = self._last_ms.get(key)
            if taken is not None and ts // NS_PER_MS <= taken:
                ts = (taken + 1) * NS_PER_MS
        for key in series:
            self._last_ms[key] = ts // NS_PER_MS
        self._last_ts = ts
        return ts

    def _log(
        self, measurement: str, fields: Mapping[str, Any], tags: Mapping[str, str] | None = None, system: bool = False
    ) -> None:
        series = [(measurement, tuple(sorted(tags.items())) if tags else ())]
        if system:
            series.append(SYSTEM_SERIES)  # the client writes its `system` sample with this point's timestamp
        self.metrics.log(measurement, tags, fields, timestamp=self._timestamp(series), with_system_metrics=system)
        self.points += 1

    def tick(self) -> int:
        """One unit of the role's work; returns how many points it logged."""
        if self.faults:
            self._update_faults()
            if "silent" in self._active:
                return 0
        before = self.points
        window = self.step // self.plan.ticks_per_window
        if "window-stall" in self._active:
            self._stalled_window = self.window if self._stalled_window is None else self._stalled_window
            window = self._stalled_window
        self.window = window
        for point in self.model.points(self.step, window):
            self._log_point(point)
        if self._active:
            self._fault_points()
        self.step += 1
        return self.points - before

    def finish(self) -> None:
        """At shutdown: log the summary of the window in progress, as a validator does when stopped."""
        for point in self.model.end_window(self.step):
            self._log_point(point)
        self.window = -1

    def _log_point(self, point: values.Point) -> None:
        fields = point.fields
        if point.measurement == "training_step" and "loss-divergence" in self._active:
            fields = {**fields, "loss": float("nan") if self.step % 3 == 0 else 4.0 * fields["loss"]}
        self._log(point.measurement, fields, point.tags or None, system=point.samples_host)

    # ---------------------------------------------------------------- logs

    def log_line(self) -> int:
        """Write one log line; returns 1 when a line was handed to the logger, else 0."""
        if self.logger is None or "silent" in self._active:
            return 0
        rng = self.log_rng
        level = rng.choices([lv for lv, _ in LEVEL_WEIGHTS], [w for _, w in LEVEL_WEIGHTS])[0]
        if "error-burst" in self._active:
            level = "error"
        peer = rng.choice(self.peers)
        context = {
            "window": max(0, self.window),
            "step": self.step,
            "peer": peer,
            "trace_id": f"{rng.getrandbits(64):016x}",
            "run_id": self.run.run_id,
        }
        if level in ("error", "critical"):
            message, fail = FAILURES[rng.randrange(len(FAILURES))]
            try:
                fail(peer, max(0, self.window))
            except Exception:
                write_log(self.logger, level, message, context, exc_info=True)
        else:
            messages = MESSAGES[self.spec.role][level]
            write_log(self.logger, level, messages[rng.randrange(len(messages))], context)
        self.lines += 1
        return 1

    # ---------------------------------------------------------------- lifecycle

    def close(self, timeout: float) -> None:
        if self._close is not None:
            self._close(timeout)

    def stats(self) -> tuple[dict, dict]:
        """(metrics counters, log counters) of this node's channels."""
        return self._stats() if self._stats is not None else ({}, {})


_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
    "critical": logging.CRITICAL,
}


def write_log(logger: Any, level: str, message: str, context: Mapping[str, Any], exc_info: bool = False) -> None:
    """Log as a node does: `log_with_context` for plain lines, `exc_info` inside an except block."""
    if exc_info:
        logger.log(_LEVELS[level], message, exc_info=True, extra=dict(context))
    else:
        logger.log_with_context(level, message, **context)


# ------------------------------------------------------------ real nodes


def make_node(spec: NodeSpec, run: RunIdentity, plan: Plan, targets: Targets) -> SimNode:
    """A node with a real MetricsLogger and, when a Loki URL is set, a real Loki logger."""
    from telemetry_client.metrics import MetricsLogger

    metrics = MetricsLogger(
        url=targets.influx_url,
        database=targets.database,
        token=targets.token,
        org=targets.org,
        api_version=targets.api_version,
        username=targets.username,
        password=targets.password,
        uid=spec.uid,
        role=spec.role,
        version=spec.version,
        network=run.network,
        runtime_id=run.runtime_id(spec.uid),
        group=run.network,
        job_type=spec.role,
        buffer=targets.buffer,
        system_metrics_interval=targets.system_interval,
        self_metrics_interval=targets.self_metrics_interval,
    )
    logger = make_loki_logger(spec, run, targets, metrics) if targets.loki_url else None

    def close(timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for owner in (logger, metrics):  # logs first: their counters also go out as metrics
            if owner is not None:
                owner.close(max(0.1, deadline - time.monotonic()))

    def stats() -> tuple[dict, dict]:
        return metrics.stats(), logger.stats() if logger is not None else {}

    return SimNode(spec, run, plan, metrics, logger, close, stats)


def make_loki_logger(spec: NodeSpec, run: RunIdentity, targets: Targets, metrics: Any) -> Any:
    """setup_loki_logger as a node calls it: its own labels, host and logger, counters watched by metrics."""
    from telemetry_client.loki import setup_loki_logger

    logger = setup_loki_logger(
        service=spec.role,
        uid=spec.uid,
        version=spec.version,
        environment=run.network,
        url=targets.loki_url,
        tenant_id=spec.uid if targets.loki_tenant_per_node else None,
        role=spec.role,
        host=f"{run.network}-{spec.role}-{spec.uid}",
        level="DEBUG",
        console=False,
        buffer=targets.buffer,
        metrics_logger=metrics,
        logger_name=f"simulator.{run.run_id}.{spec.role}.{spec.uid}",
    )
    logger.logger.propagate = False  # the fleet's lines go to Loki only, not to the simulator's console
    return logger


def role_counts(miners: int, validators: int, aggregators: int, evaluators: int) -> dict[str, int]:
    """Nodes per role, keyed by the catalog's role names (a test checks they cover ROLES)."""
    return {"miner": miners, "validator": validators, "aggregator": aggregators, "evaluator": evaluators}


def plan_for(specs: Sequence[NodeSpec], points_per_sec: float, window_seconds: float, duration: float) -> Plan:
    """Ticks per window so that, at the target rate, a window lasts about `window_seconds`.

    The load controller paces points and ticks the nodes round-robin, so a window of
    `t` ticks writes `t * per_tick + per_window` points across the fleet, counted from
    the model (`values.tick_count`): a role whose tick logs several points, or GPUs
    read at every window start, shorten the window in ticks, not lengthen it in time.
    """
    nodes = max(1, len(specs))
    miner_uids = tuple(s.uid for s in specs if s.role == "miner")
    counts: dict[tuple[str, int], values.TickCount] = {}
    per_tick = per_window = 0
    for spec in specs:
        key = (spec.role, spec.gpus)
        if key not in counts:
            counts[key] = values.tick_count(spec.role, spec.gpus, miner_uids, nodes)
        per_tick += counts[key].per_tick
        per_window += counts[key].per_window
    per_tick = max(1, per_tick)
    rate = max(points_per_sec, 1.0)
    ticks_per_window = max(1, round((window_seconds * rate - per_window) / per_tick))
    points_per_round = per_tick + per_window / ticks_per_window  # one tick of every node
    return Plan(
        ticks_per_window=ticks_per_window,
        total_ticks=max(10, round(duration * rate / points_per_round)),
        miner_uids=miner_uids,
        fleet_size=nodes,
    )
