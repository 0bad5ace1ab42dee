"""`doctor --send-test`: one point and one log line, marked as a test, sent through the real client and read back.

This is the only part of the doctor that stores anything, and only when asked.
The point goes to measurement `telemetry_doctor_test` and the line to a stream
labelled `service="telemetry_doctor"`; both carry a `run_id` field naming this
run, so the read-back finds exactly them and a dashboard never mistakes them
for a node's data.
"""

from __future__ import annotations

import json
import secrets
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from telemetry_client._doctor.net import probe
from telemetry_client._doctor.report import Check, fail, ok, warn
from telemetry_client._doctor.server import Endpoint

if TYPE_CHECKING:
    from telemetry_client.loki import LokiHandler
    from telemetry_client.metrics import MetricsLogger

TEST_MEASUREMENT = "telemetry_doctor_test"
TEST_SERVICE = "telemetry_doctor"


@dataclass
class ReadAccess:
    """How to read back: InfluxQL `/query` credentials, and where Loki's query API is."""

    influx_headers: dict[str, str]
    loki_url: str | None = None
    loki_headers: dict[str, str] | None = None


def new_run_id() -> str:
    return "doctor-" + secrets.token_hex(6)


def send_point(make_logger: Callable[[], MetricsLogger], run_id: str, timeout: float) -> Check:
    """Log one point through a MetricsLogger built from the node's configuration and wait until it is sent."""
    logger = make_logger()
    logger.log(TEST_MEASUREMENT, tags={"test": "true"}, fields={"value": 1.0, "run_id": run_id})
    left = logger.flush(timeout)
    stats = logger.stats()
    logger.close(0.5)
    if left or stats.get("sent", 0) < 1:
        return fail(
            "Test point",
            f"the point was not delivered within {timeout:.0f} s (last error: {stats.get('last_error')}).",
            "Fix the InfluxDB checks above first; the client keeps retrying what it could not deliver.",
            stats={k: stats.get(k) for k in ("sent", "retries", "dropped", "last_error")},
        )
    return ok("Test point", f"1 point ({TEST_MEASUREMENT}, run_id={run_id}) delivered.", run_id=run_id)


def send_line(make_handler: Callable[[], LokiHandler], run_id: str, timeout: float) -> Check:
    """Emit one log line through a LokiHandler built from the node's configuration and wait until it is sent."""
    import logging

    handler = make_handler()
    record = logging.LogRecord(TEST_SERVICE, logging.INFO, __file__, 0, "telemetry doctor test line", (), None)
    record.run_id = run_id  # an `extra=` field: it lands in the JSON line, not in the labels
    record.doctor_test = True
    handler.handle(record)
    left = handler.flush(timeout)
    stats = handler.stats()
    handler.close(0.5)
    if left or stats.get("sent", 0) < 1:
        return fail(
            "Test line",
            f"the line was not delivered within {timeout:.0f} s (last error: {stats.get('last_error')}).",
            "Fix the Loki checks above first; the client keeps retrying what it could not deliver.",
            stats={k: stats.get(k) for k in ("sent", "retries", "dropped", "last_error")},
        )
    return ok("Test line", f'1 line (service="{TEST_SERVICE}", run_id={run_id}) delivered.', run_id=run_id)


def read_point(endpoint: Endpoint, access: ReadAccess, run_id: str, timeout: float) -> Check:
    """Find the test point through InfluxQL `/query` (InfluxDB 1.x, and 2.x's v1-compatible API)."""
    name = "Test point read back"
    query = f'SELECT "value" FROM "{TEST_MEASUREMENT}" WHERE "run_id" = \'{run_id}\''
    params = {"db": endpoint.database or "", "q": query}
    url = f"{endpoint.base_url}/query?{urllib.parse.urlencode(params)}"
    deadline = time.monotonic() + timeout
    while True:
        result = probe(url, headers=access.influx_headers, verify=endpoint.verify, ca_certs=endpoint.ca_certs)
        rows = _influx_rows(result.body) if result.status == 200 else None
        if rows or time.monotonic() > deadline or result.status != 200:
            break
        time.sleep(0.5)
    if result.status in (401, 403):
        return warn(
            name,
            f"the read credentials were refused ({result.status}: {result.text()}).",
            "Pass credentials that may read the database: --read-token, or --read-username/--read-password.",
        )
    if result.status != 200:
        return warn(
            name,
            f"InfluxQL /query answered {result.status or result.error}: this server cannot be read back this way.",
            "Check the point on a dashboard instead (measurement telemetry_doctor_test).",
        )
    if not rows:
        return fail(
            name,
            f"the point was delivered but is not in database {endpoint.database!r} after {timeout:.0f} s.",
            "Check INFLUXDB_DATABASE (and INFLUXDB_RETENTION_POLICY): the node writes where the "
            "dashboards do not read.",
        )
    return ok(name, f"found {rows} point(s) with run_id={run_id} in {endpoint.database!r}.")


def _influx_rows(body: bytes) -> int:
    try:
        results = json.loads(body).get("results", [])
    except (ValueError, AttributeError):
        return 0
    return sum(len(s.get("values", [])) for r in results for s in r.get("series", []))


def read_line(access: ReadAccess, run_id: str, timeout: float, verify: bool, ca_certs: str | None) -> Check:
    """Find the test line through Loki's `GET /loki/api/v1/query_range`."""
    name = "Test line read back"
    assert access.loki_url is not None
    now = time.time_ns()
    params = {
        "query": f'{{service="{TEST_SERVICE}"}} |= "{run_id}"',
        "start": str(now - 3_600_000_000_000),
        "end": str(now + 600_000_000_000),
        "limit": "10",
    }
    url = f"{access.loki_url.rstrip('/')}/loki/api/v1/query_range?{urllib.parse.urlencode(params)}"
    deadline = time.monotonic() + timeout
    while True:
        result = probe(url, headers=access.loki_headers or {}, verify=verify, ca_certs=ca_certs)
        lines = _loki_lines(result.body) if result.status == 200 else 0
        if lines or time.monotonic() > deadline or result.status != 200:
            break
        time.sleep(0.5)
    if result.status in (401, 403):
        return warn(
            name,
            f"Loki's query API refused these credentials ({result.status}): a write-only credential cannot read back.",
            "Pass --loki-read-url with credentials that may query, or check Grafana's Logs dashboard.",
        )
    if result.status != 200:
        return warn(
            name,
            f"Loki's query API answered {result.status or result.error}.",
            "Pass --loki-read-url pointing at Loki's query API, or check Grafana's Logs dashboard.",
        )
    if not lines:
        return fail(
            name,
            f"the line was delivered but not found after {timeout:.0f} s.",
            "Check LOKI_TENANT_ID: the node may push to another tenant than the one read.",
        )
    return ok(name, f"found {lines} line(s) with run_id={run_id}.")


def _loki_lines(body: bytes) -> int:
    try:
        data = json.loads(body).get("data", {})
    except (ValueError, AttributeError):
        return 0
    return sum(len(stream.get("values", [])) for stream in data.get("result", []))
