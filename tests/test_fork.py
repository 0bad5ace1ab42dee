"""Fork safety: a child gets a fresh engine, delivers its own points, and never resends its parent's."""

from __future__ import annotations

import os

import pytest

from telemetry_client import BufferSettings
from telemetry_client.metrics import MetricsLogger

pytestmark = pytest.mark.slow


def test_child_delivers_and_nothing_is_sent_twice(influx_db):
    server, database = influx_db
    # A long flush interval keeps the parent's points buffered at the moment of the fork.
    logger = MetricsLogger(
        url=server.url,
        database=database,
        api_version=1,
        self_metrics_interval=None,
        buffer=BufferSettings(flush_interval=30.0),
    )
    for i in range(100):
        logger.log("forked", tags={"who": "parent"}, fields={"i": i})
    assert logger.stats()["pending"] == 100

    pid = os.fork()
    if pid == 0:  # the child
        code = 1
        try:
            assert logger.stats()["pending"] == 0, "the child must not inherit the parent's buffer"
            for i in range(50):
                logger.log("forked", tags={"who": "child"}, fields={"i": i})
            code = 0 if logger.flush(10) == 0 and logger.stats()["sent"] == 50 else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0

    assert logger.flush(10) == 0
    rows = server.rows('SELECT count("i") FROM "forked" GROUP BY "who"', database)
    assert {row["who"]: row["count"] for row in rows} == {"parent": 100, "child": 50}
    logger.close(1)
