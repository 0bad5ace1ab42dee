"""Shared fixtures: real InfluxDB 1.6.7 and VictoriaMetrics servers on loopback; the fast tier's rule.

Each test session starts its own throwaway servers, on first use: under pytest-xdist
(`make test`) each worker has its own, so no test sees another worker's writes. A
module's tests run in one worker, where its module fixtures are built once, unless the
module sets `SPREAD_ACROSS_WORKERS = True` (its tests share nothing and are long).

Two tiers: `make check` runs `pytest -m "not slow"` while editing, `make test` runs everything.
The rule for the `slow` marker: a test that starts a server or a process (influxd,
victoria-metrics, caddy, ansible-playbook, docker-compose, a Python child, wandb's service,
os.fork), uses the real servers (the `influx_server`, `influx_db` and `victoria_server`
fixtures), or waits or computes for seconds by design (a Retry-After, an outage, a long
property test; `pytest --durations=20` shows them) is slow.
In-process receivers (tests/loki_receiver.py, tests/fault_server.py, tests/grafana_receiver.py)
are fast. Mark a module whose tests are mostly slow with `pytestmark = pytest.mark.slow` right
after its imports, and a slow test in an otherwise fast module with `@pytest.mark.slow`.

The first two parts of the rule are enforced so that the fast tier cannot grow slow unnoticed:
a test not marked slow fails when it asks for a real-server fixture, or when it or a fixture it
sets up starts a process (subprocess.Popen, os.fork).
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from servers import InfluxV1, VictoriaMetrics, influxdb_v1, victoria_metrics

REAL_SERVER_FIXTURES = frozenset({"influx_server", "influx_db", "victoria_server"})
RULE = "mark it slow (tests/conftest.py says when and how)"


def _is_slow(item: pytest.Item) -> bool:
    return item.get_closest_marker("slow") is not None


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Refuse a fast test that asks for a real server, before the fixture starts or reaches one."""
    used = sorted(REAL_SERVER_FIXTURES.intersection(getattr(item, "fixturenames", ())))
    if used and not _is_slow(item):
        pytest.fail(f"{item.nodeid} uses the real server fixture(s) {', '.join(used)}: {RULE}", pytrace=False)


_current_test: pytest.Item | None = None


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[object]:
    """Remember which test runs, module and session fixtures included, for the process guard below."""
    global _current_test
    _current_test = item
    try:
        return (yield)
    finally:
        _current_test = None


def _refuse_a_process_in_a_fast_test(what: str) -> None:
    if _current_test is not None and not _is_slow(_current_test):
        pytest.fail(f"{_current_test.nodeid} {what}: {RULE}", pytrace=False)


class _GuardedPopen(subprocess.Popen):
    """subprocess.Popen itself, refused while a test not marked slow (or its fixtures) runs."""

    def __init__(self, args: object, *rest: object, **options: object) -> None:
        _refuse_a_process_in_a_fast_test(f"starts a process ({args!r})")
        super().__init__(args, *rest, **options)


_real_fork = os.fork


def _guarded_fork() -> int:
    _refuse_a_process_in_a_fast_test("forks")
    return _real_fork()


def pytest_configure(config: pytest.Config) -> None:
    subprocess.Popen = _GuardedPopen  # type: ignore[misc]
    os.fork = _guarded_fork


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own hook, which reads the groups into the test ids
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Group each module's tests for pytest-xdist's `--dist loadgroup` (see the module docstring)."""
    for item in items:
        module = getattr(item, "module", None)
        if module is not None and not getattr(module, "SPREAD_ACROSS_WORKERS", False):
            item.add_marker(pytest.mark.xdist_group(module.__name__))


@pytest.fixture(scope="session")
def influx_server() -> Iterator[InfluxV1]:
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
    with victoria_metrics() as server:
        yield server
