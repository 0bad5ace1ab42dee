"""Against a real InfluxDB 1.6.7 (API v1): what the logger accepts round-trips exactly; the rest is counted."""

from __future__ import annotations

import math
import uuid

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from telemetry_client import BufferSettings
from telemetry_client._influx import line_protocol as lp
from telemetry_client.metrics import MetricsLogger

pytestmark = pytest.mark.slow

FAST = BufferSettings(flush_interval=0.05, retry_base=0.05, retry_cap=0.2)

# Mostly characters that line protocol escapes, some unicode, and now and then one
# it cannot carry (tab, newline, backslash), which must be refused and counted.
SPECIAL = list(",= \"'#_aZ9é漢🚀\x01") * 3 + ["\n", "\t", "\\", "\x00"]
tricky_text = st.text(
    alphabet=st.sampled_from(SPECIAL) | st.characters(blacklist_categories=("Cs",), blacklist_characters="\n\t\r\\"),
    min_size=1,
    max_size=12,
)
values = (
    st.floats(allow_nan=True, allow_infinity=True)
    | st.sampled_from([0.0, -0.0, 1e308, -1e308, 5e-324, 2.2250738585072014e-308, 1e-300])
    | st.integers(-(2**53), 2**53)
    | st.text(max_size=30)
    | st.none()
)


def _logger(server, database: str) -> MetricsLogger:
    return MetricsLogger(url=server.url, database=database, api_version=1, buffer=FAST, self_metrics_interval=None)


def _read_back(server, database: str) -> list[dict]:
    result = server.query("SELECT * FROM /.*/ GROUP BY *", database)["results"][0]
    assert "error" not in result, result
    return result.get("series", [])


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    measurement=tricky_text,
    tags=st.dictionaries(tricky_text, tricky_text, max_size=4),
    fields=st.dictionaries(tricky_text, values, min_size=1, max_size=5),
)
def test_accepted_points_round_trip_exactly(influx_server, measurement, tags, fields):
    fields = {k: v for k, v in fields.items() if k not in tags}
    if not fields:
        return
    database = f"rt_{uuid.uuid4().hex[:10]}"
    influx_server.create_database(database)
    logger = _logger(influx_server, database)
    timestamp = 1_700_000_000_123_456_789
    logger.log(measurement, tags=tags, fields=fields, timestamp=timestamp)
    assert logger.flush(10) == 0
    stats = logger.stats()
    series = _read_back(influx_server, database)
    logger.close(1)
    influx_server.query(f'DROP DATABASE "{database}"')

    point_ok = lp.valid_measurement(measurement) and all(lp.valid_key(k) and lp.valid_name(v) for k, v in tags.items())
    expected = {}
    for key, value in fields.items():
        if not lp.valid_key(key) or value is None:
            continue
        if isinstance(value, str):
            expected[key] = value
        elif math.isfinite(value):
            expected[key] = float(value)
    if not point_ok or not expected:
        event("refused")
        assert series == []
        assert stats["dropped"] >= 1, "a refused point must be counted"
        return
    event("accepted")
    assert stats["sent"] == 1
    assert len(series) == 1
    assert series[0]["name"] == measurement
    assert series[0].get("tags", {}) == tags
    row = dict(zip(series[0]["columns"], series[0]["values"][0], strict=True))
    assert row.pop("time") == timestamp
    stored = {k: v for k, v in row.items() if v is not None}
    assert stored.keys() == expected.keys()
    for key, value in expected.items():
        if isinstance(value, str):
            assert stored[key] == value
        else:
            assert float(stored[key]) == value
    assert stats["dropped"] == len(fields) - len(expected)


def test_int_then_float_never_conflicts(influx_db):
    server, database = influx_db
    logger = _logger(server, database)
    logger.log("conflict", fields={"x": 1, "flag": True})
    logger.log("conflict", fields={"x": 0.5, "flag": False})
    assert logger.flush(10) == 0
    assert logger.stats()["dropped"] == 0
    rows = server.rows('SELECT "x", "flag" FROM "conflict"', database)
    assert [(r["x"], r["flag"]) for r in rows] == [(1, 1), (0.5, 0)]


@pytest.mark.parametrize("api_version", [1])
def test_standard_tags_and_list_statistics_are_stored(influx_db, api_version):
    server, database = influx_db
    logger = MetricsLogger(
        url=server.url,
        database=database,
        api_version=api_version,
        uid=42,
        role="miner",
        version="1.2.3",
        network="testnet",
        group="g1",
        job_type="training",
        runtime_id="r1",
        buffer=FAST,
        self_metrics_interval=None,
    )
    logger.log("training_step", fields={"loss": 2.5, "grad_norm": [1.0, 2.0, 3.0, 10.0]})
    assert logger.flush(10) == 0
    rows = server.rows('SELECT * FROM "training_step" GROUP BY *', database)
    assert len(rows) == 1
    row = rows[0]
    assert {k: row[k] for k in ("uid", "role", "version", "network", "group", "job_type", "runtime_id")} == {
        "uid": "42",
        "role": "miner",
        "version": "1.2.3",
        "network": "testnet",
        "group": "g1",
        "job_type": "training",
        "runtime_id": "r1",
    }
    assert (row["grad_norm_mean"], row["grad_norm_min"], row["grad_norm_max"], row["grad_norm_median"]) == (
        4,
        1,
        10,
        2.5,
    )
