"""Backfill a fleet's history into InfluxDB as its MetricsLoggers write it, with past timestamps.

The dashboards' cost at fleet scale depends on how many series and points a day
of a real fleet leaves behind, so the benchmark (bench/bench_dashboards.py) and
the series-budget tests write one: every node logs what a node of its role logs,
at ordinary rates, for the hours before `end`, under the standard tags its own
MetricsLogger sets. The values are the live simulator's (`simulator/values.py`,
at the pace `FleetShape.pace` sets); the host's `system` points and the client's
own counters (`telemetry_client`, which a live logger writes from its sender
thread) are written by the model as the logger would have written them:
cumulative values with the per-interval deltas beside them.

The lines are the client's own (its encoder, `telemetry_client.metrics.encode_lines`;
its configuration's write URL and headers; gzip as the client sends it); only the
batching differs from a live logger's, so that a day of the reference fleet is
written in minutes.
"""

from __future__ import annotations

import gzip
import multiprocessing
import ssl
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from simulator import values
from telemetry_client.config import influxdb_config
from telemetry_client.metrics import MetricsLogger, encode_lines

NETWORK = "finney"
VERSIONS = ("1.4.2", "1.4.1")
TASKS = ("hellaswag", "arc_easy", "mmlu", "piqa")  # the reference evaluator's benchmarks (cardinality's --tasks 4)


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

    def pace(self) -> values.Pace:
        """The model's pace for these rates, in training steps: the history writes the host and client points too."""

        def steps(every_s: int, what: str) -> int:
            if every_s % self.step_s:
                raise ValueError(f"{what} ({every_s} s) must be a multiple of the step ({self.step_s} s)")
            return every_s // self.step_s

        steps(self.window_s, "the window")
        return values.Pace(
            # A validator scores every miner once a window, the aggregator merges once a window.
            role_every={"validator": None, "aggregator": None, "evaluator": steps(self.benchmark_s, "benchmarks")},
            batch=None,
            tasks=TASKS,
            host_every=steps(self.system_s, "system metrics"),
            counters=values.ClientCounters(every=steps(self.self_metrics_s, "self-metrics")),
            overflow_rate=0.0,  # the encoder would drop an infinite norm, and the backfill refuses any drop
        )


Point = tuple[str, dict[str, str] | None, dict[str, Any], int]


def node_points(shape: FleetShape, uid: str, role: str, end_s: int, seed: int = 1) -> Iterator[Point]:
    """Every point one node logs over the backfilled hours, oldest first, from the fleet's model (values.py)."""
    steps = int(shape.hours * 3600) // shape.step_s
    start_s = end_s - steps * shape.step_s
    model = values.NodeModel(
        role,
        uid,
        seed,
        miner_uids=shape.miner_uids(),
        fleet_size=len(shape.nodes()),
        gpus=shape.gpus_per_node,
        total_steps=steps + 1,
        pace=shape.pace(),
    )
    for step in range(steps + 1):
        t = start_s + step * shape.step_s
        for point in model.points(step, t // shape.window_s):
            yield point.measurement, point.tags or None, point.fields, t * 1_000_000_000


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
