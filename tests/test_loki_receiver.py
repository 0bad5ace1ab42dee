"""The conformance receiver enforces Loki's push rules, so the handler tests can trust it."""

from __future__ import annotations

import gzip
import http.client
import json
import time
from collections.abc import Iterator

import pytest
from loki_receiver import Limits, LokiReceiver, go_time

from telemetry_client.loki_rejections import parse_rejections

NOW = 1_700_000_000_000_000_000


@pytest.fixture
def receiver() -> Iterator[LokiReceiver]:
    with LokiReceiver() as server:
        yield server


def post(
    receiver: LokiReceiver,
    body: bytes | dict,
    *,
    content_type: str = "application/json",
    encoding: str | None = None,
    method: str = "POST",
    path: str = "/loki/api/v1/push",
    headers: dict[str, str] | None = None,
) -> tuple[int, str, dict[str, str]]:
    data = json.dumps(body).encode() if isinstance(body, dict) else body
    if encoding == "gzip":
        data = gzip.compress(data)
    all_headers = {"Content-Type": content_type, **(headers or {})}
    if encoding:
        all_headers["Content-Encoding"] = encoding
    connection = http.client.HTTPConnection("127.0.0.1", receiver.port, timeout=10)
    try:
        connection.request(method, path, body=data, headers=all_headers)
        response = connection.getresponse()
        return response.status, response.read().decode(), dict(response.getheaders())
    finally:
        connection.close()


def push(*streams: tuple[dict, list]) -> dict:
    return {"streams": [{"stream": labels, "values": values} for labels, values in streams]}


def test_a_valid_push_is_stored_with_labels_timestamps_lines_and_metadata(receiver):
    status, _, _ = post(
        receiver,
        push(({"service": "miner", "level": "info"}, [[str(NOW), "a"], [str(NOW + 1), "b", {"trace_id": "t1"}]])),
    )
    assert status == 204
    entries = receiver.entries
    assert [(e.ts, e.line, e.metadata) for e in entries] == [(NOW, "a", None), (NOW + 1, "b", {"trace_id": "t1"})]
    assert entries[0].labels == {"service": "miner", "level": "info"}
    assert entries[0].stream == '{level="info", service="miner", service_name="miner"}'


def test_gzip_bodies_are_decoded_and_broken_gzip_is_refused(receiver):
    assert post(receiver, push(({"a": "b"}, [[str(NOW), "x"]])), encoding="gzip")[0] == 204
    assert post(receiver, b"not gzip at all", encoding="gzip")[0] == 400
    assert receiver.lines() == ["x"]


def test_only_json_pushes_are_accepted(receiver):
    status, text, _ = post(receiver, b"\x00\x01", content_type="application/x-protobuf")
    assert status == 415 and "protobuf" in text
    body = push(({"a": "b"}, [[str(NOW), "x"]]))
    assert post(receiver, body, content_type="text/plain")[0] == 415
    assert post(receiver, body, content_type="application/json; charset=utf-8")[0] == 204


def test_only_post_to_the_push_path(receiver):
    assert post(receiver, b"", method="GET")[0] == 405
    assert post(receiver, push(({"a": "b"}, [[str(NOW), "x"]])), path="/api/prom/push")[0] == 404


@pytest.mark.parametrize(
    "body",
    [
        {"streams": "nope"},
        {"nothing": []},
        push(({"a": 1}, [[str(NOW), "x"]])),  # label value not a string
        push(({"a": "b"}, [[NOW, "x"]])),  # timestamp as a number
        push(({"a": "b"}, [["1.5e18", "x"]])),  # not integer nanoseconds
        push(({"a": "b"}, [[str(NOW), 42]])),  # line not a string
        push(({"a": "b"}, [[str(NOW), "x", {"k": 1}]])),  # metadata value not a string
        push(({"a": "b"}, [[str(NOW)]])),
    ],
)
def test_schema_violations_fail_the_whole_push(receiver, body):
    good = ({"a": "ok"}, [[str(NOW), "kept?"]])
    body = {"streams": [*body["streams"], *push(good)["streams"]]} if isinstance(body.get("streams"), list) else body
    status, _, _ = post(receiver, body)
    assert status == 400
    assert receiver.entries == []


def test_invalid_json_is_a_400(receiver):
    assert post(receiver, b"{not json")[0] == 400


@pytest.mark.parametrize(
    ("labels", "fragment"),
    [
        ({"bad-name": "x"}, "Error parsing labels"),
        ({"__reserved": "x"}, "Error parsing labels"),
        ({"1abc": "x"}, "Error parsing labels"),
        ({f"l{i}": "v" for i in range(16)}, "has 16 label names; limit 15"),
        ({"a": "v" * 2049}, "has label value too long"),
        ({"a" * 1025: "v"}, "has label name too long"),
        ({}, "at least one label pair"),
    ],
)
def test_bad_streams_are_refused_and_other_streams_accepted(receiver, labels, fragment):
    status, text, _ = post(receiver, push((labels, [[str(NOW), "bad"]]), ({"a": "b"}, [[str(NOW), "good"]])))
    assert status == 400
    assert fragment in text
    assert receiver.lines() == ["good"]


def test_fifteen_labels_are_fine_and_service_name_is_not_counted(receiver):
    labels = {"service": "m", **{f"l{i}": "v" for i in range(14)}}
    assert post(receiver, push((labels, [[str(NOW), "x"]])))[0] == 204
    assert "service_name" in receiver.entries[0].stream


def test_an_over_long_line_is_refused_by_name_and_the_rest_accepted():
    with LokiReceiver(limits=Limits(max_line_size=100)) as receiver:
        labels = {"service": "miner", "level": "info"}
        status, text, _ = post(receiver, push((labels, [[str(NOW), "short"], [str(NOW + 1), "x" * 101]])))
        assert status == 400
        assert "Max entry size '100' bytes exceeded for stream" in text and "length '101' bytes" in text
        assert receiver.lines() == ["short"]
        (rejection,) = parse_rejections(text)
        assert rejection.matches(labels, NOW + 1, 101, None)
        assert not rejection.matches(labels, NOW, 5, None)


def test_entries_out_of_order_within_a_push_are_refused_in_strict_mode(receiver):
    labels = {"service": "miner"}
    status, text, _ = post(receiver, push((labels, [[str(NOW + 10), "b"], [str(NOW), "a"], [str(NOW + 20), "c"]])))
    assert status == 400
    assert f"entry with timestamp {go_time(NOW)} ignored, reason: 'entry out of order'" in text
    assert 'total ignored: 1 out of 3 for stream: {service="miner", service_name="miner"}' in text
    assert receiver.lines() == ["b", "c"]


def test_out_of_order_is_accepted_when_strictness_is_off():
    with LokiReceiver(strict_order=False) as receiver:
        assert post(receiver, push(({"a": "b"}, [[str(NOW + 10), "b"], [str(NOW), "a"]])))[0] == 204
        assert receiver.count() == 2


def test_identical_entries_are_stored_once_as_loki_does(receiver):
    body = push(({"a": "b"}, [[str(NOW), "same"]]))
    assert post(receiver, body)[0] == 204
    assert post(receiver, body)[0] == 204
    assert receiver.count() == 1 and receiver.duplicates == 1
    assert post(receiver, push(({"a": "b"}, [[str(NOW), "other line, same time"]])))[0] == 204
    assert receiver.count() == 2


def test_age_and_future_limits_name_the_entry():
    limits = Limits(reject_old_samples_max_age=3600, creation_grace_period=600)
    with LokiReceiver(limits=limits) as receiver:
        now = time.time_ns()
        old, future = now - 7200 * 10**9, now + 7200 * 10**9
        values = [[str(old), "old"], [str(now), "ok"], [str(future), "new"]]
        status, text, _ = post(receiver, push(({"a": "b"}, values)))
        assert status == 400
        assert "has timestamp too old" in text and "has timestamp too new" in text
        assert receiver.lines() == ["ok"]


def test_structured_metadata_limits():
    with LokiReceiver(limits=Limits(allow_structured_metadata=False)) as receiver:
        status, text, _ = post(receiver, push(({"a": "b"}, [[str(NOW), "x", {"k": "v"}], [str(NOW + 1), "y"]])))
        assert status == 400 and "structured metadata, but this feature is disallowed" in text
        assert receiver.lines() == ["y"]


def test_forced_statuses_carry_retry_after_and_store_nothing(receiver):
    receiver.fail_next(2, 429, retry_after="3")
    body = push(({"a": "b"}, [[str(NOW), "x"]]))
    for _ in range(2):
        status, _, headers = post(receiver, body)
        assert status == 429 and headers["Retry-After"] == "3"
    assert receiver.count() == 0
    assert post(receiver, body)[0] == 204


def test_refuse_and_resume_on_the_same_port(receiver):
    port = receiver.port
    receiver.refuse()
    with pytest.raises(ConnectionRefusedError):
        post(receiver, push(({"a": "b"}, [[str(NOW), "x"]])))
    receiver.resume()
    assert receiver.port == port
    assert post(receiver, push(({"a": "b"}, [[str(NOW), "x"]])))[0] == 204


def test_tenant_and_auth_are_enforced_when_configured():
    with LokiReceiver(require_tenant=True, bearer_token="s3cret") as receiver:
        body = push(({"a": "b"}, [[str(NOW), "x"]]))
        assert post(receiver, body, headers={"Authorization": "Bearer s3cret"})[0] == 401
        assert post(receiver, body, headers={"X-Scope-OrgID": "t1", "Authorization": "Bearer wrong"})[0] == 401
        assert post(receiver, body, headers={"X-Scope-OrgID": "t1", "Authorization": "Bearer s3cret"})[0] == 204
        assert receiver.entries[0].tenant == "t1"
