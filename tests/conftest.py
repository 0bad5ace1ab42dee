"""Shared fixtures: real InfluxDB 1.6.7 and VictoriaMetrics servers on loopback.

.ci/run may start the servers itself and pass their URLs in TEST_INFLUXDB_V1_URL and
TEST_VICTORIA_URL; otherwise each test session starts its own throwaway servers.
"""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from servers import InfluxV1, VictoriaMetrics, influxdb_v1, victoria_metrics


@pytest.fixture(scope="session")
def influx_server() -> Iterator[InfluxV1]:
    url = os.environ.get("TEST_INFLUXDB_V1_URL")
    if url:
        yield InfluxV1(url)
        return
    with influxdb_v1() as server:
        yield server


@pytest.fixture
def influx_db(influx_server: InfluxV1) -> tuple[InfluxV1, str]:
    """A fresh database on the shared InfluxDB 1.6.7 server."""
    name = f"test_{uuid.uuid4().hex[:10]}"
    influx_server.create_database(name)
    return influx_server, name


@pytest.fixture(scope="session")
def victoria_server() -> Iterator[VictoriaMetrics]:
    url = os.environ.get("TEST_VICTORIA_URL")
    if url:
        yield VictoriaMetrics(url)
        return
    with victoria_metrics() as server:
        yield server
