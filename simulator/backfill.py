"""Backfill a fleet's history into InfluxDB through MetricsLogger, with past timestamps.

The dashboards' cost at fleet scale depends on how many series and points a day
of a real fleet leaves behind, so the benchmark (bench/bench_dashboards.py) and
the series-budget test write one: every node has its own MetricsLogger, as real
nodes do, and logs what a node of its role logs, at ordinary rates, for the hours
before `end`. The client's own counters (`telemetry_client`, which a live logger
writes from its sender thread) are written here as the logger would have written
them: cumulative values with the per-interval deltas beside them.
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime

from telemetry_client.catalog import CATALOG, DELTA_SUFFIX, DROP_REASONS, SPARSE_DELTAS
from telemetry_client.metrics import MetricsLogger
from telemetry_client.shipping import BufferSettings

NETWORK = "finney"
VERSIONS = ("1.4.2", "1.4.1")
TASKS = ("hellaswag", "arc_easy", "mmlu", "piqa")
SINKS = ("influxdb", "loki")


@dataclass(frozen=True)
class FleetShape:
    """How many nodes of each role, what they log how often, and for how long.

    The defaults are the reference fleet: 256 miners, 16 validators, an
    aggregator and an evaluator; a training step every 10 s, system and GPU
    metrics every 30 s, window points every 60 s, self-metrics every 10 s.
    """

    miners: int = 256
    validators: int = 16
    aggregators: int = 1
    evaluators: int = 1
    gpus_per_node: int = 4
    hours: float = 24.0
    step_s: int = 10
    system_s: int = 30
    window_s: int = 60
    self_metrics_s: int = 10
    benchmark_s: int = 600

    def nodes(self) -> list[tuple[str, str]]:
        """(uid, role) of every node; uids are unique across roles."""
        out: list[tuple[str, str]] = []
        for role, count in (
            ("miner", self.miners),
            ("validator", self.validators),
            ("aggregator", self.aggregators),
            ("evaluator", self.evaluators),
        ):
            out.extend((str(len(out) + i), role) for i in range(count))
        return out

    def miner_uids(self) -> list[str]:
        return [uid for uid, role in self.nodes() if role == "miner"]


Point = tuple[str, dict[str, str] | None, dict[str, float], int]


def _ticks(shape: FleetShape, end_s: int, every_s: int) -> Iterator[tuple[int, int]]:
    """(index, unix seconds) of every sample of a period `every_s` in the backfilled hours."""
    count = int(shape.hours * 3600) // every_s
    for i in range(count + 1):
        yield i, end_s - (count - i) * every_s


def node_points(shape: FleetShape, uid: str, role: str, end_s: int, seed: int = 1) -> Iterator[Point]:
    """Every point one node logs over the backfilled hours, oldest first per measurement."""
    rng = random.Random(f"{seed}-{uid}")
    ns = 1_000_000_000
    base_speed = rng.uniform(8000, 12000)
    slow = rng.random() < 0.05  # a few miners are slow, as on a real network
    if role == "miner":
        for i, t in _ticks(shape, end_s, shape.step_s):
            fields = {
                "loss": 3.2 * (0.9998**i) + rng.uniform(-0.05, 0.05),
                "learning_rate": 3e-4,
                "tokens_per_sec": base_speed * (0.3 if slow else 1.0) * rng.uniform(0.9, 1.1),
                "batch_tokens": 65536.0,
                "window": float(t // shape.window_s),
                "global_step": float(i),
            }
            for stat in ("mean", "min", "max", "median"):
                fields[f"grad_norm_{stat}"] = rng.uniform(0.5, 2.5)
            yield "training_step", None, fields, t * ns
    miners = shape.miner_uids()
    for i, t in _ticks(shape, end_s, shape.window_s):
        window = float(t // shape.window_s)
        yield (
            "network_status",
            None,
            {
                "active_peers": float(rng.randint(max(1, len(miners) - 5), max(1, len(miners)))),
                "sync_lag_windows": float(rng.random() < 0.05),
                "is_synced": float(rng.random() > 0.02),
                "gather_success_rate": rng.uniform(0.85, 1.0),
                "window": window,
            },
            t * ns,
        )
        yield (
            "performance",
            None,
            {
                "compression_ratio": rng.uniform(20, 40),
                "gather_time_s": rng.uniform(2, 8),
                "put_time_s": rng.uniform(0.5, 2),
                "step_time_s": rng.uniform(8, 15),
                "window": window,
            },
            t * ns,
        )
        if role == "validator":
            before = 3.1 * (0.9998**i)
            after = before * rng.uniform(0.96, 0.99)
            yield (
                "validator_window",
                None,
                {
                    "loss_before": before,
                    "loss_after": after,
                    "improvement": (before - after) / before,
                    "evaluated_uids": float(len(miners)),
                    "window": window,
                    "global_step": float(i),
                },
                t * ns,
            )
            for eval_uid in miners:
                yield (
                    "validator_scores",
                    {"eval_uid": eval_uid},
                    {
                        "score": rng.random(),
                        "moving_avg_score": rng.uniform(0.2, 0.8),
                        "weight": rng.uniform(0.0, 1.0 / max(1, len(miners))),
                        "window": window,
                    },
                    t * ns,
                )
        if role == "aggregator":
            yield (
                "aggregator_step",
                None,
                {
                    "gradients_gathered": float(len(miners)),
                    "gather_success_rate": rng.uniform(0.85, 1.0),
                    "aggregation_time_s": rng.uniform(1, 3),
                    "window": window,
                },
                t * ns,
            )
    if role == "evaluator":
        for i, t in _ticks(shape, end_s, shape.benchmark_s):
            for task in TASKS:
                yield (
                    "evaluator_benchmark",
                    {"task": task},
                    {
                        "score": rng.uniform(0.3, 0.8),
                        "duration_s": rng.uniform(30, 90),
                        "global_step": float(i * 60),
                        "window": float(t // shape.window_s),
                    },
                    t * ns,
                )
    yield from _system_points(shape, rng, end_s)
    yield from _self_metrics_points(shape, rng, end_s)


def _system_points(shape: FleetShape, rng: random.Random, end_s: int) -> Iterator[Point]:
    ns = 1_000_000_000
    for _, t in _ticks(shape, end_s, shape.system_s):
        used = rng.uniform(2e10, 6e10)
        yield (
            "system",
            None,
            {
                "cpu_percent": rng.uniform(10, 95),
                "memory_used_bytes": used,
                "memory_total_bytes": 6.4e10,
                "memory_percent": used / 6.4e10 * 100,
                "process_rss_bytes": rng.uniform(4e9, 8e9),
            },
            t * ns,
        )
        for gpu in range(shape.gpus_per_node):
            index = str(gpu)
            uuid = f"GPU-{gpu}"
            yield (
                "gpu",
                {"gpu_uuid": uuid, "gpu_index": index, "gpu_name": "NVIDIA_H100"},
                {
                    "memory_used_bytes": rng.uniform(4e10, 7.5e10),
                    "memory_total_bytes": 8e10,
                    "utilization_percent": rng.uniform(50, 100),
                    "temperature_c": rng.uniform(40, 80),
                    "power_w": rng.uniform(200, 650),
                },
                t * ns,
            )
            yield (
                "gpu_memory",
                {"gpu_uuid": uuid, "gpu_index": index},
                {
                    "allocated_bytes": rng.uniform(2e10, 6e10),
                    "reserved_bytes": rng.uniform(6e10, 7e10),
                    "max_allocated_bytes": 7e10,
                    "segments": float(rng.randint(100, 400)),
                },
                t * ns,
            )


# Counters of the client's own measurement that grow, and what they grow by per
# self-metrics interval (roughly a node logging ten points a second).
_GROWTH = {"queued": 100.0, "sent": 100.0, "batches": 1.0, "bytes_sent": 8192.0, "retries": 0.0, "truncated": 0.0}


def _self_metrics_points(shape: FleetShape, rng: random.Random, end_s: int) -> Iterator[Point]:
    ns = 1_000_000_000
    counters = CATALOG["telemetry_client"]
    cumulative = {sink: dict.fromkeys(counters.field_names, 0.0) for sink in SINKS}
    for _, t in _ticks(shape, end_s, shape.self_metrics_s):
        for sink in SINKS:
            totals = cumulative[sink]
            deltas = {name: growth * rng.uniform(0.8, 1.2) for name, growth in _GROWTH.items()}
            deltas["retries"] = float(rng.random() < 0.01)
            for reason in DROP_REASONS:
                deltas[f"dropped_{reason}"] = float(rng.random() < 0.002)
            deltas["dropped"] = sum(deltas[f"dropped_{reason}"] for reason in DROP_REASONS)
            fields: dict[str, float] = {}
            for name, delta in deltas.items():
                if name == "truncated" and sink != "loki":
                    continue
                totals[name] += round(delta)
                fields[name] = totals[name]
                if round(delta) or name not in SPARSE_DELTAS:  # as the client writes them
                    fields[name + DELTA_SUFFIX] = float(round(delta))
            fields["pending"] = float(rng.randint(0, 50))
            fields["pending_bytes"] = fields["pending"] * 200
            yield "telemetry_client", {"sink": sink}, fields, t * ns


def backfill(
    url: str,
    database: str,
    shape: FleetShape,
    end: datetime,
    *,
    api_version: int = 1,
    token: str | None = None,
    org: str | None = None,
) -> int:
    """Write the whole fleet's history through one MetricsLogger per node; return points sent.

    API v1 (InfluxDB 1.x) by default; api_version=2 with a token and org writes to
    /api/v2/write (InfluxDB 2.x, or VictoriaMetrics, which ignores both).

    Loggers are closed (drained) one by one; a logger never holds more than its
    buffer bound, so the write waits for the sender whenever the backlog is large.
    """
    end_s = int(end.timestamp())
    sent = 0
    buffer = BufferSettings(max_items=200_000, batch_items=5_000, flush_interval=0.2)
    for uid, role in shape.nodes():
        logger = MetricsLogger(
            url=url,
            database=database,
            api_version=api_version,
            token=token,
            org=org,
            uid=uid,
            role=role,
            network=NETWORK,
            version=VERSIONS[int(uid) % 10 == 0],
            runtime_id=f"run-{uid}",
            self_metrics_interval=None,
            buffer=buffer,
        )
        for count, (measurement, tags, fields, ts) in enumerate(node_points(shape, uid, role, end_s)):
            if count % 20_000 == 19_999:
                while logger.stats()["pending"] > 100_000:
                    time.sleep(0.05)
            logger.log(measurement, tags, fields, timestamp=ts)
        if logger.close(120) != 0:
            raise RuntimeError(f"node {uid}: could not drain within 120 s: {logger.stats()}")
        stats = logger.stats()
        if stats["dropped"]:
            raise RuntimeError(f"node {uid}: the backfill dropped points: {stats}")
        sent += stats["sent"]
    return sent
