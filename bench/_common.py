"""Helpers shared by the benchmark scripts: servers from tests/, percentiles, a logger of its own."""

from __future__ import annotations

import io
import json
import logging
import os
import subprocess
import sys
import tarfile
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))


def percentile(sorted_values: list[float], fraction: float) -> float:
    """The value at `fraction` (0..1) of an already sorted list."""
    return sorted_values[min(len(sorted_values) - 1, int(len(sorted_values) * fraction))]


def caller_cost_us(call, samples: int) -> tuple[float, float]:
    """p50 and p99 of one call's wall time in microseconds, over `samples` calls."""
    import time

    timings = []
    clock = time.perf_counter_ns
    for _ in range(samples):
        start = clock()
        call()
        timings.append(clock() - start)
    timings.sort()
    return percentile(timings, 0.50) / 1000, percentile(timings, 0.99) / 1000


def influx_v1_logger(url: str, database: str, buffer: object) -> object:
    """A MetricsLogger writing to an InfluxDB 1.x database as miner 1, without self-metrics."""
    from telemetry_client.metrics import MetricsLogger

    return MetricsLogger(
        url=url, database=database, api_version=1, uid=1, role="miner", self_metrics_interval=None, buffer=buffer
    )


def dedicated_logger(handler: logging.Handler, prefix: str = "bench") -> logging.Logger:
    """A fresh logger that sends only to `handler`: no root handlers, nothing left from an earlier run."""
    logger = logging.getLogger(f"{prefix}.{uuid.uuid4().hex[:8]}")
    logger.propagate = False
    logger.setLevel(logging.INFO)
    logger.addHandler(handler)
    return logger


def run_client(code: Path, script: str, args: list[str], stdin: str | None = None) -> dict:
    """`python -c script args` with the client under `code` (see `extract`); its last line of output, as JSON.

    The script prints a JSON object whose "client" is `telemetry_client.__file__`:
    checked to be under `code`, so that a comparison never runs one client twice.
    """
    child = subprocess.run(
        [sys.executable, "-c", script, *args],
        input=stdin,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(code)},
        cwd=code,  # `python -c` imports from the working directory first
        timeout=600,
        check=False,
    )
    if child.returncode != 0:
        raise RuntimeError(f"the client's process ended with {child.returncode}: {child.stderr[-2000:]}")
    result = json.loads(child.stdout.splitlines()[-1])
    if not Path(result["client"]).is_relative_to(code):
        raise RuntimeError(f"the child imported {result['client']}, not the client under {code}")
    return result


def extract(revision: str, into: Path) -> Path:
    """`telemetry_client/` as of `revision`, written under `into`; the directory to put on PYTHONPATH."""
    archive = subprocess.run(
        ["git", "archive", revision, "telemetry_client"], cwd=ROOT, check=True, capture_output=True
    ).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    return into
