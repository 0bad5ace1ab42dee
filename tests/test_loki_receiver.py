"""The conformance receiver enforces Loki's push rules, so the handler tests can trust it."""

from __future__ import annotations

import gzip
import http.client
import json
import time
from collections.abc import Iterator

import pytest
from grafana_receiver import TenantError, label_values, logql_query, tenant_view
from loki_receiver import Limits, LokiReceiver, datasize, go_time

from telemetry_client._loki.rejections import parse_answer, parse_rate_limit, parse_rejections

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


@pytest.mark.parametrize(("version", "first_word"), [((3, 7), "max"), ((3, 6), "max"), ((3, 5), "Max")])
def test_an_over_long_line_is_refused_by_name_and_the_rest_accepted(version, first_word):
    with LokiReceiver(limits=Limits(max_line_size=100), version=version) as receiver:
        labels = {"service": "miner", "level": "info"}
        status, text, _ = post(receiver, push((labels, [[str(NOW), "short"], [str(NOW + 1), "x" * 101]])))
        assert status == 400
        assert (
            text.startswith(f"{first_word} entry size '100' bytes exceeded for stream") and "length '101' bytes" in text
        )
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
    with LokiReceiver(auth_enabled=True, bearer_token="s3cret") as receiver:
        body = push(({"a": "b"}, [[str(NOW), "x"]]))
        assert post(receiver, body, headers={"Authorization": "Bearer s3cret"})[0] == 401
        assert post(receiver, body, headers={"X-Scope-OrgID": "t1", "Authorization": "Bearer wrong"})[0] == 401
        assert post(receiver, body, headers={"X-Scope-OrgID": "t1", "Authorization": "Bearer s3cret"})[0] == 204
        assert receiver.entries[0].tenant == "t1"


def test_without_auth_enabled_every_push_is_the_tenant_fake_whatever_the_header_says(receiver):
    body = push(({"a": "b"}, [[str(NOW), "x"]]))
    assert post(receiver, body, headers={"X-Scope-OrgID": "someone-else"})[0] == 204
    assert [entry.tenant for entry in receiver.entries] == ["fake"]


@pytest.mark.parametrize(
    ("org_id", "status", "message"),
    [
        ("a|b", 400, "multiple org IDs present"),
        ("a/b", 400, "tenant ID 'a/b' contains unsupported character '/'"),
        ("..", 400, "tenant ID is '.' or '..'"),
        ("x" * 151, 400, "tenant ID is too long: max 150 characters"),
        ("", 401, "no org id"),
    ],
)
def test_a_push_needs_exactly_one_valid_tenant_with_auth_enabled(org_id, status, message):
    with LokiReceiver(auth_enabled=True) as receiver:
        headers = {"X-Scope-OrgID": org_id} if org_id else {}
        assert post(receiver, push(({"a": "b"}, [[str(NOW), "x"]])), headers=headers)[:2] == (status, message + "\n")
        assert receiver.count() == 0


def test_each_tenant_has_its_own_rate_limit_streams_and_overrides():
    small = Limits(ingestion_rate_bytes=1000, ingestion_burst_bytes=1000, max_global_streams_per_user=2)
    with LokiReceiver(auth_enabled=True, limits=small, overrides={"big": Limits()}) as receiver:
        flood = push(({"a": "b"}, values(20, width=100)))  # 2,000 bytes: over the burst of 1,000
        status, text, _ = post(receiver, flood, headers={"X-Scope-OrgID": "flooder"})
        assert status == 429 and text.startswith("ingestion rate limit exceeded for user flooder (limit: 1000 ")
        assert post(receiver, push(({"a": "b"}, values(5))), headers={"X-Scope-OrgID": "quiet"})[0] == 204
        assert post(receiver, flood, headers={"X-Scope-OrgID": "big"})[0] == 204  # its override has no limit
        # Streams are counted per tenant: "quiet" has one, may create a second, not a third.
        assert post(receiver, push(({"a": "c"}, values(1))), headers={"X-Scope-OrgID": "quiet"})[0] == 204
        status, text, _ = post(receiver, push(({"a": "d"}, values(1))), headers={"X-Scope-OrgID": "quiet"})
        assert status == 429
        assert text == (
            'maximum active stream limit exceeded when trying to create stream {a="d", service_name="unknown_service"}'
            ", reduce the number of active streams (reduce labels or reduce label values), or contact your Loki "
            "administrator to see if the limit can be increased, user: 'quiet'\n"
        )
        assert [r.reason for r in parse_answer(text)[0]] == ["stream_limit"]  # what the client counts
        assert post(receiver, push(({"a": "d"}, values(1))), headers={"X-Scope-OrgID": "other"})[0] == 204
        assert {e.tenant for e in receiver.entries} == {"quiet", "big", "other"}


def test_queries_read_the_tenants_they_name_and_label_each_result_with_its_tenant():
    """grafana/loki pkg/querier/multi_tenant_querier.go, as the Grafana receiver's evaluator applies it."""
    with LokiReceiver(auth_enabled=True, multi_tenant_queries_enabled=True) as receiver:
        for tenant, uid in (("1", "1"), ("2", "1"), ("3", "3")):  # tenant 2 writes uid=1, as a forger would
            body = push(({"service": "m", "uid": uid}, [[str(NOW), f"from {tenant}"]]))
            assert post(receiver, body, headers={"X-Scope-OrgID": tenant})[0] == 204
        entries = receiver.entries
        both = tenant_view(receiver, "2|1")
        streams = logql_query('{service="m"}', entries, NOW - 1, NOW + 1, None, view=both)["result"]
        assert sorted((s["stream"]["__tenant_id__"], s["values"][0][1]) for s in streams) == [
            ("1", "from 1"),
            ("2", "from 2"),
        ]
        chosen = logql_query('{service="m", __tenant_id__=~"2|3"}', entries, NOW - 1, NOW + 1, None, view=both)
        assert [s["values"][0][1] for s in chosen["result"]] == ["from 2"]
        bound = 'sum by (uid) (label_replace(count_over_time({service="m"}[1m]), "uid", "$1", "__tenant_id__", "(.+)"))'
        vector = logql_query(bound, entries, NOW + 1, NOW + 1, None, view=tenant_view(receiver, "1|2|3"))["result"]
        assert {r["metric"]["uid"]: r["value"][1] for r in vector} == {"1": "1.0", "2": "1.0", "3": "1.0"}
        # One tenant: its own lines, no tenant label, so the written uid stays.
        alone = logql_query(bound, entries, NOW + 1, NOW + 1, None, view=tenant_view(receiver, "2"))["result"]
        assert [r["metric"] for r in alone] == [{"uid": "1"}]
        assert label_values("__tenant_id__", "", entries, NOW - 1, NOW + 1, both) == ["1", "2"]
        with pytest.raises(TenantError, match="no org id"):
            tenant_view(receiver, None)
    with LokiReceiver(auth_enabled=True) as single, pytest.raises(TenantError, match="multiple org IDs present"):
        tenant_view(single, "1|2")


# ---- what a real Loki does beyond validation ---------------------------------------------


def values(count: int, start: int = NOW, width: int = 0, text: str = "line") -> list[list[str]]:
    return [[str(start + i), f"{text} {i:06d}".ljust(width, ".")] for i in range(count)]


def test_too_old_entries_are_refused_grouped_and_the_valid_ones_stored():
    with LokiReceiver(limits=Limits(reject_old_samples_max_age=3600)) as receiver:
        now = time.time_ns()
        old = [[str(now - 7200 * 10**9), f"old {i}"] for i in range(35)]  # one second: one grouped message
        status, text, _ = post(receiver, push(({"app": "web"}, old + values(1001, start=now))))
        assert status == 400
        assert text.startswith(
            '35 errors like: entry for stream \'{app="web", service_name="web"}\' has timestamp too old'
        )
        assert text.count("too old") == 1
        assert receiver.count() == 1001 and len(receiver.refused) == 35


def test_distinct_problems_are_each_counted_as_loki_groups_them():
    with LokiReceiver(limits=Limits(max_line_size=10, allow_structured_metadata=False)) as receiver:
        body = push(({"a": "b"}, [[str(NOW), "x" * 11], [str(NOW + 1), "y" * 12], [str(NOW + 2), "z", {"k": "v"}]]))
        status, text, _ = post(receiver, body)
        assert status == 400 and receiver.count() == 0
        parts = text.strip().split("; ")
        assert len(parts) == 3 and all(p.startswith("1 errors like: ") for p in parts)


def test_identical_entries_are_dropped_only_inside_the_head_block():
    with LokiReceiver(limits=Limits(chunk_block_size=256 * 1024)) as receiver:
        small = push(({"a": "b"}, values(10)))
        assert post(receiver, small)[0] == 204 and post(receiver, small)[0] == 204
        assert receiver.count() == 10 and receiver.duplicates == 10  # still in the head block
        big = push(({"a": "c"}, values(600, width=483)))  # ~290 KB: the head block is cut during the push
        assert post(receiver, big)[0] == 204 and post(receiver, big)[0] == 204
        assert sum(e.labels == {"a": "c"} for e in receiver.entries) == 1200  # Loki stored every line twice


def test_only_the_last_failing_stream_is_reported():
    limits = Limits(per_stream_rate_bytes=1000, per_stream_burst_bytes=4000)
    with LokiReceiver(limits=limits) as receiver:
        heavy, light = ({"app": "heavy"}, values(400, width=20)), ({"app": "light"}, values(20))
        status, text, _ = post(receiver, push(heavy, light))
        assert status == 204 and text == ""  # the heavy stream's 429 was overwritten by the light stream's success
        assert receiver.count() == 20 and len(receiver.refused) == 400
        status, text, headers = post(
            receiver, push(({"app": "light2"}, values(5)), ({"app": "heavy2"}, values(400, width=20)))
        )
        assert status == 429 and "Retry-After" not in headers
        assert text.startswith("entry with timestamp ") and "Per stream rate limit exceeded (limit: 1000B/sec)" in text
        assert text.count("ignored, reason:") == 10  # max_returned_stream_errors
        assert 'total ignored: 400 out of 400 for stream: {app="heavy2", service_name="heavy2"}' in text


def test_per_stream_limit_entry_by_entry_stores_what_fits():
    limits = Limits(per_stream_rate_bytes=1, per_stream_burst_bytes=100, rate_limit_whole_stream=False)
    with LokiReceiver(limits=limits) as receiver:
        status, text, _ = post(receiver, push(({"a": "b"}, values(10))))  # 11 bytes each: 9 fit in 100
        assert status == 429 and receiver.count() == 9
        assert "total ignored: 1 out of 10" in text


def test_the_tenant_rate_limit_answers_429_without_retry_after_and_stores_nothing():
    with LokiReceiver(limits=Limits(ingestion_rate_bytes=104857, ingestion_burst_bytes=200_000)) as receiver:
        body = push(({"a": "b"}, values(4032, width=228)))
        status, text, headers = post(receiver, body)
        assert status == 429 and "Retry-After" not in headers and receiver.count() == 0
        # Loki 3.6 lowercased the message (pkg/validation/validate.go RateLimitedErrorMsg).
        assert text.startswith("ingestion rate limit exceeded for user fake (limit: 104857 bytes/sec) while ")
        assert "'4032' lines totaling '919296' bytes" in text
        assert parse_rate_limit(text) == 104857
        assert post(receiver, body)[0] == 429  # larger than the burst: it never fits
        assert post(receiver, push(({"a": "b"}, values(100, width=228))))[0] == 204


def test_entries_too_far_behind_the_stream_are_refused_by_the_ingester():
    with LokiReceiver(limits=Limits(max_chunk_age=7200), strict_order=False) as receiver:
        assert post(receiver, push(({"a": "b"}, [[str(NOW), "new"]])))[0] == 204
        late = NOW - 3601 * 10**9
        status, text, _ = post(receiver, push(({"a": "b"}, [[str(late), "late"], [str(NOW - 10**9), "ok"]])))
        assert status == 400 and f"entry with timestamp {go_time(late)} ignored, reason: 'entry too far behind" in text
        assert receiver.lines() == ["new", "ok"]


def test_service_name_comes_from_the_first_known_label_and_is_not_counted():
    with LokiReceiver() as receiver:
        assert post(receiver, push(({"job": "j", "app": "web"}, values(1)), ({"x": "y"}, values(1))))[0] == 204
        assert [e.stream for e in receiver.entries] == [
            '{app="web", job="j", service_name="web"}',
            '{service_name="unknown_service", x="y"}',
        ]


def test_every_refusal_the_receiver_writes_is_read_back_by_the_client_parser():
    limits = Limits(reject_old_samples_max_age=3600, creation_grace_period=600, max_line_size=50)
    with LokiReceiver(limits=limits) as receiver:
        now = time.time_ns()
        labels = {"service": "miner", "level": "info"}
        sent = [
            (now - 7200 * 10**9, "old"),
            (now + 7200 * 10**9, "new"),
            (now, "x" * 51),
            (now + 1, "fine"),
        ]
        status, text, _ = post(receiver, push((labels, [[str(ts), line] for ts, line in sent])))
        assert status == 400
        rejections, _ = parse_answer(text)
        reasons = [
            next((r.reason for r in rejections if r.matches(labels, ts, len(line), None)), None) for ts, line in sent
        ]
        assert reasons == ["greater_than_max_sample_age", "too_far_in_future", "line_too_long", None]


def test_json_fields_that_clash_with_a_stream_label_are_renamed_extracted(receiver):
    line = json.dumps({"level": "error", "message": "boom"})
    assert post(receiver, push(({"service": "m", "level": "info"}, [[str(NOW), line]])))[0] == 204
    data = logql_query('{service="m"} | json', receiver.entries, NOW - 10, NOW + 10, None)
    (stream,) = data["result"]
    assert stream["stream"]["level"] == "info" and stream["stream"]["level_extracted"] == "error"


def test_datasize_prints_like_loki():
    assert [datasize(n) for n in (3 << 20, 1536, 2048, 1000, 15 << 20)] == ["3MB", "1536B", "2KB", "1000B", "15MB"]
