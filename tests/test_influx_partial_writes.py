"""After a refusal the counters match what InfluxDB stored, exactly, on each API version.

The real InfluxDB 1.6.7 stores the valid lines of a batch and answers 400 naming or
counting the others. InfluxDB 2.x and 3.x cannot run here: their answers are the
texts their sources and documentation give (cited in telemetry_client/_influx/rejections.py),
played by the fault server.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest
from counters import assert_counters_add_up
from fault_server import Reply, fault_server

from telemetry_client import BufferSettings
from telemetry_client._engine.transport import HttpTransport, Response
from telemetry_client._influx.rejections import Refusal, read_refusal
from telemetry_client._influx.sink import InfluxSink
from telemetry_client.metrics import MetricsLogger

# One batch: nothing is sealed before flush() (flush_interval far away, batch_items large).
ONE_BATCH = BufferSettings(flush_interval=60, retry_base=0.02, retry_cap=0.1)
TS = 1_700_000_000_000_000_000


def _v1_logger(server, database: str) -> MetricsLogger:
    return MetricsLogger(url=server.url, database=database, api_version=1, buffer=ONE_BATCH, self_metrics_interval=None)


def _write_raw(server, database: str, body: bytes) -> None:
    request = urllib.request.Request(f"{server.url}/write?db={database}&precision=n", data=body, method="POST")
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.status == 204


@pytest.mark.slow
def test_field_type_conflict_on_influxdb_1x(influx_db):
    server, database = influx_db
    # An integer field, as another client wrote it, in the same shard (field types are fixed per shard).
    _write_raw(server, database, f"steps count=1i {TS - 10}\n".encode())
    logger = _v1_logger(server, database)
    logger.log("steps", fields={"count": 2}, timestamp=TS)  # written as a float: refused by the shard
    logger.log("steps", fields={"loss": 0.5}, timestamp=TS + 1)
    logger.log("other", fields={"loss": 0.7}, timestamp=TS + 2)
    assert logger.flush(10) == 0
    stats = logger.stats()
    logger.close(1)
    assert_counters_add_up(stats)
    stored = server.rows("SELECT * FROM steps, other", database)
    assert len(stored) - 1 == 2  # the pre-existing integer point, then the two valid lines
    assert (stats["sent"], stats["dropped_by_reason"]) == (2, {"rejected": 1})
    assert stats["sent_by_key"] == {"steps": 1, "other": 1}
    assert "field type conflict" in stats["last_error"]


@pytest.mark.slow
@pytest.mark.parametrize("bad", [[37], [0, 99]], ids=["one-bad-value", "first-and-last"])
def test_a_new_shard_refusing_the_whole_batch_costs_only_the_bad_lines_on_influxdb_1x(influx_db, bad):
    """A field new in the shard gets a float and a string in one batch: 1.6.7 answers `field type conflict`.

    The first batch into a new shard is then refused whole, naming no line (see
    `_influx/rejections.py`); sent again in halves, the answers name the lines, and
    only the lines whose type lost are counted `rejected`. The field takes the type
    of its first value in the batch: a string first makes the floats the bad lines.
    """
    server, database = influx_db
    logger = _v1_logger(server, database)
    for i in range(100):
        value = "n/a" if i in bad else i * 0.5  # a string beside numbers is stored as that string
        logger.log("step", fields={"loss": value, "i": i}, timestamp=TS + i)
    assert logger.flush(30) == 0
    stats = logger.stats()
    logger.close(1)
    refused = 100 - len(bad) if bad[0] == 0 else len(bad)
    rows = server.rows('SELECT "i", "loss" FROM "step"', database)
    assert len(rows) == 100 - refused
    assert (stats["sent"], stats["dropped_by_reason"]) == (100 - refused, {"rejected": refused})
    assert stats["sent_by_key"] == {"step": 100 - refused}
    assert_counters_add_up(stats)


@pytest.mark.slow
@pytest.mark.parametrize("note", ["one line", "two\nlines"], ids=["rebuilt-from-body", "kept-items"])
def test_a_refusal_of_a_sealed_batch_counts_each_measurement_exactly(influx_db, note):
    """A sealed batch keeps only its gzip body; after a refusal its lines are read back from it.

    Measurement names with a comma and a space must come back as the keys they
    were counted under. A text field holding a newline (InfluxDB 1.6.7 stores it)
    makes a line span two: then the batch keeps its items instead.
    """
    server, database = influx_db
    _write_raw(server, database, f"steps count=1i {TS - 10}\n".encode())
    logger = _v1_logger(server, database)
    logger.log("steps", fields={"count": 2}, timestamp=TS)  # a float: refused by the shard
    logger.log("my,odd name", fields={"loss": 0.5}, timestamp=TS + 1)
    logger.log("other", fields={"note": note}, timestamp=TS + 2)
    assert logger.flush(10) == 0
    stats = logger.stats()
    logger.close(1)
    assert_counters_add_up(stats)
    assert [row["note"] for row in server.rows("SELECT note FROM other", database)] == [note]
    assert len(server.rows('SELECT loss FROM "my,odd name"', database)) == 1
    assert (stats["sent"], stats["dropped_by_reason"]) == (2, {"rejected": 1})
    assert stats["sent_by_key"] == {"my,odd name": 1, "other": 1}


def _post(server, database: str, body: bytes) -> Response:
    request = urllib.request.Request(f"{server.url}/write?db={database}&precision=n", data=body, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return Response(answer.status, answer.read(), None)
    except urllib.error.HTTPError as error:
        return Response(error.code, error.read(), None)


def _items(lines: list[str]) -> list:
    return [((line + "\n").encode(), len(line) + 1, line.split(" ", 1)[0]) for line in lines]


def _sink() -> InfluxSink:
    return InfluxSink(HttpTransport("http://127.0.0.1:9/write", {}), {}, 1024, 10.0, None)


@pytest.mark.slow
def test_unparsable_lines_on_influxdb_1x(influx_db):
    """The encoder writes no line InfluxDB cannot parse, so the batch is posted as is and its answer read."""
    server, database = influx_db
    lines = [f"m v=1 {TS}", f"m v=np.float64(0.25) {TS + 1}", f"m v=3 {TS + 2}", f"m v=2 {10**21}"]
    answer = _post(server, database, "".join(line + "\n" for line in lines).encode())
    items = _items(lines)
    verdict = _sink().on_rejected(items, answer)
    assert answer.status == 400 and b"partial write: unable to parse" in answer.body
    assert [row["v"] for row in server.rows("SELECT v FROM m", database)] == [1, 3]
    assert (list(verdict.stored), dict(verdict.refused), list(verdict.resend)) == (
        [items[0], items[2]],
        {"rejected": 2},
        [],
    )


@pytest.mark.slow
def test_a_batch_of_only_bad_lines_on_influxdb_1x(influx_db):
    server, database = influx_db
    lines = [f"m v=np.float64(0.25) {TS}"]
    answer = _post(server, database, f"{lines[0]}\n".encode())
    verdict = _sink().on_rejected(_items(lines), answer)
    assert server.rows("SELECT v FROM m", database) == []
    assert (list(verdict.stored), dict(verdict.refused), list(verdict.resend)) == ([], {"rejected": 1}, [])


@pytest.mark.slow
def test_timestamps_influxdb_cannot_store_are_counted_invalid_before_sending(influx_db):
    server, database = influx_db
    logger = _v1_logger(server, database)
    logger.log("m", fields={"v": 1.0}, timestamp=TS)
    logger.log("m", fields={"v": 2.0}, timestamp=10**21)  # an int is nanoseconds: year 33658
    logger.log("m", fields={"v": 3.0}, timestamp=1.7e18)  # nanoseconds passed as a float (seconds)
    assert logger.flush(10) == 0
    stats = logger.stats()
    logger.close(1)
    assert_counters_add_up(stats)
    assert [row["v"] for row in server.rows("SELECT v FROM m", database)] == [1]
    assert (stats["sent"], stats["dropped_by_reason"]) == (1, {"invalid": 2})


# Answers as InfluxDB 1.6.7 gave them (recorded from the real server) and as the
# sources and documentation of 2.x and 3.x write them.
V1_CONFLICT = (
    '{"error":"partial write: field type conflict: input field \\"v\\" on measurement \\"m\\" is type float, '
    'already exists as type integer dropped=1"}\n'
)
V1_PARSE = (
    '{"error":"partial write: unable to parse \'m v=np.float64(0.25) 6\': invalid number\\n'
    "unable to parse 'm v=np.float64(0.5) 8': invalid number dropped=0\"}\n"
)
V1_NONE_PARSED = '{"error":"unable to parse \'m x=bad 4\': invalid boolean"}\n'
V2_CONFLICT = json.dumps(
    {
        "code": "unprocessable entity",
        "message": "failure writing points to database: partial write: field type conflict: "
        'input field "v" on measurement "m" is type float, already exists as type integer dropped=1',
    }
)
V2_RETENTION = json.dumps(
    {
        "code": "unprocessable entity",
        "message": "failure writing points to database: partial write: dropped 2 points outside retention policy "
        "of duration 72h0m0s - oldest point m v=1 at 2025-08-26T03:26:38Z dropped because it violates a Retention "
        "Policy Lower Bound at 2025-09-02T09:04:10Z, newest point m v=2 at 2025-08-26T03:31:28Z dropped because it "
        "violates a Retention Policy Lower Bound at 2025-09-02T09:04:10Z dropped=2 for database: 0a1b2c3d4e5f6071 "
        "for retention policy: autogen",
    }
)
V2_PARSE = json.dumps({"code": "invalid", "message": "unable to parse 'm v=2 x': bad timestamp"})
V3_PARTIAL = json.dumps(
    {
        "error": "partial write of line protocol occurred",
        "data": [
            {
                "original_line": "m v=x 2",
                "line_number": 2,
                "error_message": "invalid column type for column 'v', expected iox::column_type::field::float, "
                "got iox::column_type::field::string",
            }
        ],
    }
)
V3_ATOMIC = json.dumps(
    {
        "error": "parsing failed for write_lp endpoint",
        "data": {"original_line": "m v= 2", "line_number": 2, "error_message": "No fields were provided"},
    }
)
CLOUD = json.dumps(
    {
        "code": "invalid",
        "line": 2,
        "message": "failed to parse line protocol: errors encountered on line(s):\n"
        "error parsing line 2 (1-based): Invalid measurement was provided\n"
        "error parsing line 3 (1-based): Unable to parse timestamp value '123461000000000000000000000000'",
    }
)


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (V1_CONFLICT, Refusal(others_stored=True, dropped=1, measurement="m")),
        (V1_PARSE, Refusal(others_stored=True, lines=("m v=np.float64(0.25) 6", "m v=np.float64(0.5) 8"))),
        (V1_NONE_PARSED, Refusal(others_stored=False, lines=("m x=bad 4",))),
        (V2_CONFLICT, Refusal(others_stored=True, dropped=1, measurement="m")),
        (V2_RETENTION, Refusal(others_stored=True, dropped=2)),
        (V2_PARSE, Refusal(others_stored=False, lines=("m v=2 x",))),
        (V3_PARTIAL, Refusal(others_stored=True, line_numbers=(2,))),
        (V3_ATOMIC, Refusal(others_stored=False, line_numbers=(2,))),
        (CLOUD, Refusal(others_stored=False, line_numbers=(2, 3))),
        ('{"error":"field type conflict"}\n', Refusal(others_stored=False, whole=True)),
        ('{"error":"database not found: \\"nope\\""}', None),
        ('{"code":"unauthorized","message":"unauthorized access"}', None),
        ("404 page not found\n", None),
    ],
)
def test_refusal_texts_are_read(body, expected):
    assert read_refusal(body.encode()) == expected


@pytest.fixture
def server():
    with fault_server() as srv:
        yield srv


def _v2_logger(url: str) -> MetricsLogger:
    return MetricsLogger(url=url, token="t", database="b", buffer=ONE_BATCH, self_metrics_interval=None)


def _log_three(logger: MetricsLogger) -> None:
    for i in range(3):
        logger.log("m", fields={"v": float(i)}, timestamp=TS + i)


@pytest.mark.parametrize(
    ("status", "body"),
    [(422, V2_CONFLICT), (400, V3_PARTIAL)],
)
def test_partial_write_answers_count_the_stored_lines_sent_without_sending_them_again(server, status, body):
    server.then(Reply(status, body=body.encode()))
    logger = _v2_logger(server.url)
    _log_three(logger)
    assert logger.flush(10) == 0
    stats = logger.stats()
    logger.close(1)
    assert_counters_add_up(stats)
    assert (stats["sent"], stats["dropped_by_reason"], server.requests) == (2, {"rejected": 1}, [status])


def test_influxdb_2x_parse_error_stores_nothing_so_the_other_lines_are_sent_again(server):
    logger = _v2_logger(server.url)
    _log_three(logger)
    bad = f"m v=1 {TS + 1}"  # the text 2.x would quote for line 2
    server.then(Reply(400, body=json.dumps({"code": "invalid", "message": f"unable to parse '{bad}': x"}).encode()))
    assert logger.flush(10) == 0
    stats = logger.stats()
    logger.close(1)
    assert_counters_add_up(stats)
    assert server.requests == [400, 204]
    assert server.lines == [f"m v=0 {TS}".encode(), f"m v=2 {TS + 2}".encode()]
    assert (stats["sent"], stats["dropped_by_reason"]) == (2, {"rejected": 1})


def test_cloud_line_numbers_resend_the_lines_not_named(server):
    server.then(Reply(400, body=CLOUD.encode()))
    logger = _v2_logger(server.url)
    _log_three(logger)
    assert logger.flush(10) == 0
    stats = logger.stats()
    logger.close(1)
    assert_counters_add_up(stats)
    assert server.lines == [f"m v=0 {TS}".encode()]
    assert (stats["sent"], stats["dropped_by_reason"]) == (1, {"rejected": 2})


def test_a_refusal_naming_no_line_rejects_the_batch(server):
    server.then(Reply(404, body=b'{"code":"not found","message":"bucket \\"b\\" not found"}'))
    logger = _v2_logger(server.url)
    _log_three(logger)
    assert logger.flush(10) == 0
    stats = logger.stats()
    logger.close(1)
    assert_counters_add_up(stats)
    assert (stats["sent"], stats["dropped_by_reason"], server.requests) == (0, {"rejected": 3}, [404])
