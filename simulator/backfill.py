"""Backfill a fleet's history into InfluxDB as its MetricsLoggers write it, with past timestamps.

The dashboards' cost at fleet scale depends on how many series and points a day
of a real fleet leaves behind, so the benchmark (bench/bench_dashboards.py) and
the series-budget tests write one: every node logs what a node of its role logs,
at ordinary rates, for the hours before `end`, under the standard tags its own
MetricsLogger sets. The client's own counters (`telemetry_client`, which a live
logger writes from its sender thread) are written as the logger would have
written them: cumulative values with the per-interval deltas beside them.

The lines are the client's own (its encoder, `telemetry_client.metrics.encode_lines`;
its configuration's write URL and headers; gzip as the client sends it); only the
batching differs from a live logger's, so that a day of the reference fleet is
written in minutes.
"""

from __future__ import annotations

import gzip
import multiprocessing
import random
import ssl
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime

from telemetry_client.catalog import CATALOG, DELTA_SUFFIX, DROP_REASONS, SPARSE_DELTAS
from telemetry_client.config import influxdb_config
from telemetry_client.metrics import MetricsLogger, encode_lines

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


def node_tags(uid: str, role: str) -> dict[str, str]:
    """The standard tags a real node's MetricsLogger puts on every point (computed by MetricsLogger itself)."""
    identity = MetricsLogger(
        uid=uid,
        role=role,
        network=NETWORK,
        version=VERSIONS[int(uid) % 10 == 0],
        runtime_id=f"run-{uid}",
        enabled=False,
    )
    return identity.standard_tags


def _refuse_drop(reason: str, count: int) -> None:
    raise RuntimeError(f"the client's encoder dropped {count} point(s) of the backfill: {reason}")


def node_lines(shape: FleetShape, uid: str, role: str, end_s: int) -> Iterator[bytes]:
    """One node's history as the line protocol its MetricsLogger writes: the client's own encoder (encode_lines)."""
    return encode_lines(node_points(shape, uid, role, end_s), node_tags(uid, role), on_drop=_refuse_drop)


@dataclass(frozen=True)
class _Job:
    url: str
    database: str
    api_version: int
    token: str | None
    org: str | None
    shape: FleetShape
    uid: str
    role: str
    end_s: int
    batch_bytes: int


def _write_node(job: _Job) -> int:
    """POST one node's history in large gzip'd batches to the URL its MetricsLogger would write to."""
    settings = influxdb_config(
        url=job.url, database=job.database, api_version=job.api_version, token=job.token, org=job.org
    )
    headers = {**settings.headers, "Content-Encoding": "gzip"}
    tls = ssl.create_default_context()
    if not settings.verify_tls:
        tls.check_hostname = False
        tls.verify_mode = ssl.CERT_NONE
    # Straight to the server, as the client's own connection goes: no proxy from the environment.
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=tls))
    sent = 0
    batch: list[bytes] = []
    size = 0

    def post() -> None:
        body = gzip.compress(b"".join(batch), compresslevel=1, mtime=0)  # the client's level: most of the gain
        request = urllib.request.Request(settings.write_url or "", data=body, headers=headers, method="POST")
        try:
            with opener.open(request, timeout=600) as response:
                status, answer = response.status, response.read()
        except urllib.error.HTTPError as refused:
            status, answer = refused.code, refused.read()
        if status >= 300:
            raise RuntimeError(f"node {job.uid}: the server answered {status}: {answer[:500]!r}")

    for line in node_lines(job.shape, job.uid, job.role, job.end_s):
        batch.append(line)
        size += len(line)
        if size >= job.batch_bytes:
            post()
            sent += len(batch)
            batch.clear()
            size = 0
    if batch:
        post()
        sent += len(batch)
    return sent


def backfill(
    url: str,
    database: str,
    shape: FleetShape,
    end: datetime,
    *,
    api_version: int = 1,
    token: str | None = None,
    org: str | None = None,
    workers: int = 3,
    batch_bytes: int = 4 << 20,
) -> int:
    """Write the whole fleet's history; return the points written.

    Every line is what the node's MetricsLogger writes (its standard tags, the
    client's encoder encode_lines, the endpoint and headers its configuration
    resolves to, gzip as the client sends it), but POSTed in batches of about
    `batch_bytes` by `workers` processes at once, one connection each, instead
    of through the logger's buffer and single sender thread: a day of the
    reference fleet (about 20 million points) then takes minutes, not hours.
    The heaviest nodes (the validators, one series per evaluated miner) go first.
    API v1 (InfluxDB 1.x) by default; api_version=2 with a token and org writes to
    /api/v2/write (InfluxDB 2.x, or VictoriaMetrics, which ignores both).
    """
    end_s = int(end.timestamp())
    nodes = sorted(shape.nodes(), key=lambda node: node[1] != "validator")
    jobs = [_Job(url, database, api_version, token, org, shape, uid, role, end_s, batch_bytes) for uid, role in nodes]
    if workers <= 1:
        return sum(map(_write_node, jobs))
    # Fresh interpreters, not forks: the caller may have sender threads running
    # (a fork copies their locks held); a script calling this needs the usual
    # `if __name__ == "__main__":` guard.
    with multiprocessing.get_context("spawn").Pool(workers) as pool:
        return sum(pool.imap_unordered(_write_node, jobs))
