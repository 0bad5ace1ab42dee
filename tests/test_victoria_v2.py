"""The InfluxDB v2 write path (/api/v2/write, token) delivers to a real server that implements it."""

from __future__ import annotations

import time

import pytest

from telemetry_client import BufferSettings
from telemetry_client.metrics import MetricsLogger

pytestmark = pytest.mark.slow


def _wait_for_samples(server, match: str, expected: dict[str, int], timeout: float = 30.0) -> dict[str, dict]:
    """Series by name once each holds its expected number of samples (a loaded server takes a while)."""
    deadline = time.monotonic() + timeout
    while True:
        series = {s["metric"]["__name__"]: s for s in server.wait_for_series(match, len(expected))}
        counts = {name: len(series[name]["values"]) if name in series else 0 for name in expected}
        if counts == expected or time.monotonic() > deadline:
            return series
        time.sleep(0.2)


def test_v2_write_path_delivers(victoria_server):
    logger = MetricsLogger(
        url=victoria_server.url,
        token="test-token-not-secret",
        org="o",
        database="b",
        uid=3,
        role="validator",
        buffer=BufferSettings(flush_interval=0.05),
        self_metrics_interval=None,
    )
    now = time.time_ns()
    for step in range(50):
        logger.log("v2check", fields={"loss": step / 10, "window": step}, timestamp=now + step * 1_000_000)
    assert logger.flush(10) == 0
    assert logger.stats()["sent"] == 50
    series = _wait_for_samples(victoria_server, '{__name__=~"v2check_.*"}', {"v2check_loss": 50, "v2check_window": 50})
    assert set(series) == {"v2check_loss", "v2check_window"}
    assert series["v2check_loss"]["metric"]["uid"] == "3"
    assert series["v2check_loss"]["metric"]["role"] == "validator"
    assert sorted(series["v2check_loss"]["values"]) == [step / 10 for step in range(50)]
    logger.close(1)
