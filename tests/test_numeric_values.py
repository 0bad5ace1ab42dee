"""Every real number a training loop passes is written as `float(value)` would be.

NumPy 2 scalars print as `np.float64(0.25)`; written through `repr` that is invalid
line protocol (InfluxDB 1.6.7 answers "invalid number", VictoriaMetrics stores 0).
The property test sends NumPy scalars and 0-d arrays of every real dtype through
the real InfluxDB 1.6.7 and reads them back.
"""

from __future__ import annotations

import decimal
import fractions
import math
import time
import uuid

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from telemetry_client import BufferSettings
from telemetry_client._influx.fields import FieldEncoder
from telemetry_client.metrics import MetricsLogger

FAST = BufferSettings(flush_interval=0.05, retry_base=0.05, retry_cap=0.2)
REAL_DTYPES = [
    np.dtype(name)
    for name in (
        "bool",
        "int8",
        "int16",
        "int32",
        "int64",
        "uint8",
        "uint16",
        "uint32",
        "uint64",
        "float16",
        "float32",
        "float64",
        "longdouble",
    )
]


def _encode(fields: dict) -> tuple[str, list[str]]:
    drops: list[str] = []
    return FieldEncoder().encode(fields, lambda reason, n: drops.append(reason)).decode(), drops


@pytest.mark.parametrize("dtype", REAL_DTYPES, ids=str)
def test_numpy_scalars_and_0d_arrays_are_written_as_float_would(dtype):
    value = np.ones((), dtype=dtype) * (1 if dtype.kind == "b" else 3)
    scalar = value[()]
    expected = repr(float(scalar)).removesuffix(".0")
    for given_value in (scalar, value):
        text, drops = _encode({"v": given_value})
        assert (text, drops) == (f"v={expected}", []), type(given_value)


def test_numpy_float64_is_not_written_through_its_repr():
    assert repr(np.float64(0.25)) == "np.float64(0.25)"  # NumPy 2: the old encoder wrote this text
    assert _encode({"loss": np.float64(0.25), "lr": np.float32(0.001)})[0] == "loss=0.25,lr=0.0010000000474974513"


def test_other_real_numbers_and_what_is_not_one():
    text, drops = _encode(
        {
            "fraction": fractions.Fraction(1, 4),
            "decimal": decimal.Decimal("2.5"),
            "flag": np.bool_(False),
            "complex": np.complex128(1 + 2j),
            "text_0d": np.array("x"),
            "nan": np.float32("nan"),
        }
    )
    assert text == "decimal=2.5,flag=0,fraction=0.25"
    assert sorted(drops) == ["non_finite", "unsupported_type", "unsupported_type"]


def test_torch_0d_tensors_when_torch_is_installed():
    torch = pytest.importorskip("torch")
    text, drops = _encode({"loss": torch.tensor(0.25), "step": torch.tensor(3), "ok": torch.tensor(True)})
    assert (text, drops) == ("loss=0.25,ok=1,step=3", [])


@pytest.mark.slow
def test_numpy_timestamps_are_accepted(influx_db):
    server, database = influx_db
    logger = MetricsLogger(url=server.url, database=database, api_version=1, buffer=FAST, self_metrics_interval=None)
    logger.log("ts", fields={"v": 1.0}, timestamp=np.int64(1_700_000_000_000_000_001))
    logger.log("ts", fields={"v": 2.0}, timestamp=np.float64(1_700_000_001.5))
    assert logger.flush(10) == 0
    rows = server.rows("SELECT v FROM ts", database)
    logger.close(1)
    assert [row["time"] for row in rows] == [1_700_000_000_000_000_001, 1_700_000_001_500_000_000]


def _numpy_values():
    return st.sampled_from(REAL_DTYPES).flatmap(
        lambda dtype: hnp.from_dtype(dtype).flatmap(
            lambda scalar: st.sampled_from([scalar, np.array(scalar, dtype=dtype)])
        )
    )


@pytest.mark.slow
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(values=st.lists(_numpy_values(), min_size=1, max_size=12))
def test_numpy_values_round_trip_through_influxdb(influx_db, values):
    server, database = influx_db
    measurement = f"np_{uuid.uuid4().hex[:8]}"
    fields = {f"f{i}": value for i, value in enumerate(values)}
    expected = {}
    for key, value in fields.items():
        number = float(value)
        if math.isfinite(number):
            expected[key] = number
    logger = MetricsLogger(url=server.url, database=database, api_version=1, buffer=FAST, self_metrics_interval=None)
    logger.log(measurement, fields=fields, timestamp=1_700_000_000_000_000_000)
    assert logger.flush(10) == 0
    stats = logger.stats()
    logger.close(1)
    rows = server.rows(f'SELECT * FROM "{measurement}"', database)
    dropped = stats["dropped_by_reason"]
    if not expected:
        assert rows == [] and dropped.get("no_fields") == 1
        return
    assert stats["sent"] == 1 and "rejected" not in dropped
    assert len(rows) == 1
    # InfluxDB's JSON writes a large float without exponent (61467752442547530): read it back as a float
    stored = {key: float(value) for key, value in rows[0].items() if key != "time" and value is not None}
    assert stored == expected
    assert dropped.get("non_finite", 0) == len(fields) - len(expected)


@pytest.mark.slow
def test_numpy_scalars_reach_victoria_metrics_by_the_v2_path(victoria_server):
    logger = MetricsLogger(
        url=victoria_server.url,
        token="test-token-not-secret",
        database="b",
        buffer=FAST,
        self_metrics_interval=None,
    )
    now = time.time_ns()
    logger.log("npv2", fields={"loss": np.float64(0.25), "step": np.int64(7), "lr": np.array(0.5)}, timestamp=now)
    assert logger.flush(10) == 0 and logger.stats()["sent"] == 1
    logger.close(1)
    deadline = time.monotonic() + 30
    while True:
        series = {
            s["metric"]["__name__"]: s["values"] for s in victoria_server.wait_for_series('{__name__=~"npv2_.*"}', 3)
        }
        if len(series) == 3 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert series == {"npv2_loss": [0.25], "npv2_step": [7], "npv2_lr": [0.5]}
