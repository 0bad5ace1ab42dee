"""The benchmark's backfill stores exactly what the nodes' own MetricsLoggers store.

The backfill batches differently from a live logger (large requests from several
processes), so this proves the part that matters for the dashboards' figures:
the same measurements, tags, fields, values and timestamps land in a real
InfluxDB 1.6.7 either way.
"""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from servers import InfluxV1

from simulator.backfill import NETWORK, VERSIONS, FleetShape, backfill, node_points
from telemetry_client.metrics import MetricsLogger

pytestmark = pytest.mark.slow

SHAPE = FleetShape(miners=3, validators=1, aggregators=1, evaluators=1, gpus_per_node=2, hours=0.2)


def _through_loggers(url: str, database: str, end_s: int) -> int:
    """The same history, each node through its own MetricsLogger as a live node logs."""
    logged = 0
    for uid, role in SHAPE.nodes():
        logger = MetricsLogger(
            url=url,
            database=database,
            api_version=1,
            uid=uid,
            role=role,
            network=NETWORK,
            version=VERSIONS[int(uid) % 10 == 0],
            runtime_id=f"run-{uid}",
            self_metrics_interval=None,
        )
        for measurement, tags, fields, ts in node_points(SHAPE, uid, role, end_s):
            logger.log(measurement, tags, fields, timestamp=ts)
            logged += 1
        assert logger.close(60) == 0
        stats = logger.stats()
        assert stats["dropped"] == 0 and stats["sent"] == stats["queued"], stats
    return logged


def _everything(server: InfluxV1, database: str) -> dict[tuple[str, tuple], list]:
    result = server.query("SELECT * FROM /.*/ GROUP BY *", database)["results"][0]
    assert "error" not in result, result
    return {
        (s["name"], tuple(sorted(s.get("tags", {}).items()))): [s["columns"], s["values"]] for s in result["series"]
    }


@pytest.mark.parametrize("workers", [1, 2])
def test_the_backfill_stores_what_the_loggers_store(influx_server: InfluxV1, workers: int) -> None:
    end = datetime.now(UTC).replace(microsecond=0)
    end_s = int(end.timestamp())
    for database in ("via_loggers", "via_backfill"):
        influx_server.create_database(database)
    try:
        logged = _through_loggers(influx_server.url, "via_loggers", end_s)
        assert backfill(influx_server.url, "via_backfill", SHAPE, end, workers=workers, batch_bytes=64 << 10) == logged
        expected = _everything(influx_server, "via_loggers")
        stored = _everything(influx_server, "via_backfill")
        assert len(expected) > 40  # every measurement of every role, GPUs and sinks apart
        assert stored.keys() == expected.keys()
        assert stored == expected
    finally:
        for database in ("via_loggers", "via_backfill"):
            influx_server.query(f'DROP DATABASE "{database}"')


def test_a_refused_batch_stops_the_backfill(influx_server: InfluxV1) -> None:
    end = datetime.now(UTC).replace(microsecond=0)
    with pytest.raises(RuntimeError, match="database not found"):  # InfluxDB 1.6.7's answer, as the issue quotes
        backfill(influx_server.url, "no_such_database", SHAPE, end, workers=1)
