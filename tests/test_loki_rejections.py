"""Reading Loki's 400 answers: which entries were refused, so only those are dropped."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from telemetry_client._engine.transport import HttpTransport, Response
from telemetry_client._loki.limits import label_string
from telemetry_client._loki.rejections import (
    Rejection,
    parse_answer,
    parse_go_time,
    parse_labels,
    parse_rate_limit,
    parse_rejections,
    parse_rfc3339,
    rate_limit_reason,
    same_stream,
)
from telemetry_client._loki.sink import LokiSink

T0 = 1_715_011_130_000_000_000  # 2024-05-06 15:58:50 UTC
OURS = {"service": "miner", "level": "info", "uid": "3"}
LOKI_VIEW = '{level="info", service="miner", service_name="miner", uid="3"}'


def test_go_time_strings_parse_to_exact_nanoseconds():
    assert parse_go_time("2024-05-06 15:58:50 +0000 UTC") == T0
    assert parse_go_time("2024-05-06 15:58:50.000000001 +0000 UTC") == T0 + 1
    assert parse_go_time("2024-05-06 15:58:50.12 +0000 UTC") == T0 + 120_000_000
    assert parse_go_time("2024-05-06 17:58:50.5 +0200 CEST") == T0 + 500_000_000
    assert parse_go_time("2024-05-06 15:58:50 +0000 UTC m=+3.000000001") == T0
    assert parse_go_time("yesterday") is None


def test_rfc3339_parses_with_its_precision():
    assert parse_rfc3339("2024-05-06T15:58:50Z") == (T0, 1_000_000_000)
    assert parse_rfc3339("2024-05-06T17:58:50.25+02:00") == (T0 + 250_000_000, 10_000_000)


def test_stream_selectors_parse_with_go_escapes():
    assert parse_labels('{a="x", b="say \\"hi\\"", c="tab\\there", d="\\u00e9"}') == {
        "a": "x",
        "b": 'say "hi"',
        "c": "tab\there",
        "d": "é",
    }
    assert parse_labels(label_string({"q": 'a"b', "n": "line\nbreak"})) == {"q": 'a"b', "n": "line\nbreak"}


def test_streams_loki_extended_with_service_name_are_still_ours():
    assert same_stream(parse_labels(LOKI_VIEW), OURS)
    assert same_stream({**OURS, "__stream_shard__": "1"}, OURS)
    assert not same_stream({**OURS, "other": "x"}, OURS)
    assert not same_stream({"service": "miner", "level": "error", "uid": "3"}, OURS)


def test_ingester_answer_of_loki_3_names_entries_then_the_stream():
    text = (
        "entry with timestamp 2024-05-06 15:58:50 +0000 UTC ignored, reason: "
        "'entry too far behind, oldest acceptable timestamp is: 2024-05-07T10:25:30Z',\n"
        "entry with timestamp 2024-05-06 15:58:50.5 +0000 UTC ignored, reason: 'entry out of order',\n"
        f"user 'fake', total ignored: 2 out of 5 for stream: {LOKI_VIEW}"
    )
    rejections = parse_rejections(text)
    assert Rejection("too_far_behind", parse_labels(LOKI_VIEW), ts_from=T0, ts_to=T0 + 1) in rejections
    view = parse_labels(LOKI_VIEW)
    assert Rejection("out_of_order", view, ts_from=T0 + 500_000_000, ts_to=T0 + 500_000_001) in rejections

    def refused(ts: int, labels: dict = OURS) -> bool:
        return any(r.matches(labels, ts, 10, None) for r in rejections)

    assert refused(T0) and refused(T0 + 500_000_000)
    assert refused(T0 + 3600 * 10**9)  # older than the oldest acceptable timestamp: refused too
    assert not refused(1_715_077_530_000_000_000)  # at the oldest acceptable timestamp
    assert not refused(T0, {**OURS, "level": "error"})  # another stream


def test_older_ingester_answer_with_the_stream_on_each_entry():
    text = (
        f"entry with timestamp 2024-05-06 15:58:50 +0000 UTC ignored, reason: 'entry out of order' for stream: "
        f"{LOKI_VIEW},\ntotal ignored: 1 out of 3"
    )
    (rejection,) = parse_rejections(text)
    assert rejection.matches(OURS, T0, 1, None) and not rejection.matches(OURS, T0 + 1, 1, None)


def test_distributor_answers():
    text = "\n".join(
        [
            f"entry for stream '{LOKI_VIEW}' has timestamp too old: 2024-05-06T15:58:50Z, "
            "oldest acceptable timestamp is: 2024-05-06T16:00:00Z",
            f"entry for stream '{LOKI_VIEW}' has timestamp too new: 2030-01-01T00:00:00Z",
            f"Max entry size '1000' bytes exceeded for stream '{LOKI_VIEW}' while adding an entry with length "
            "'2000' bytes",
        ]
    )
    rejections = parse_rejections(text)

    def refused(ts: int, line_bytes: int = 10) -> bool:
        return any(r.matches(OURS, ts, line_bytes, None) for r in rejections)

    assert refused(T0) and refused(T0 + 60 * 10**9)  # before 16:00:00
    assert not refused(T0 + 200 * 10**9)
    assert refused(1_893_456_000_000_000_000) and refused(1_893_456_000_000_000_000 + 1)
    assert refused(T0 + 200 * 10**9, line_bytes=1001) and not refused(T0 + 200 * 10**9, line_bytes=1000)


def test_stream_level_answers_refuse_the_whole_stream():
    for text in (
        f"stream '{LOKI_VIEW}' has label value too long: 'xxxx'",
        f"entry for stream '{LOKI_VIEW}' has 16 label names; limit 15",
        f"Error parsing labels '{LOKI_VIEW}' with error: parse error",
    ):
        (rejection,) = parse_rejections(text)
        assert rejection.matches(OURS, T0, 1, None) and rejection.matches(OURS, T0 + 99, 1, None), text
        assert not rejection.matches({**OURS, "level": "debug"}, T0, 1, None)


def test_structured_metadata_answers_select_by_metadata():
    disallowed = parse_rejections(f"stream '{LOKI_VIEW}' includes structured metadata, but this feature is disallowed.")
    assert disallowed[0].matches(OURS, T0, 1, {"k": "v"}) and not disallowed[0].matches(OURS, T0, 1, None)
    too_large = parse_rejections(
        f"stream '{LOKI_VIEW}' has structured metadata too large: '20' bytes, limit: '10' bytes."
    )
    assert too_large[0].matches(OURS, T0, 1, {"key": "0123456789"}) and not too_large[0].matches(
        OURS, T0, 1, {"k": "v"}
    )


def test_unknown_text_names_nothing():
    assert parse_rejections("something went wrong") == []
    assert parse_rejections("") == []


def _sink() -> LokiSink:
    return LokiSink(HttpTransport("http://127.0.0.1:9/loki/api/v1/push"), {"service": "miner", "uid": "3"}, 10_000)


def _items(sink: LokiSink, count: int) -> list:
    items = []
    for i in range(count):
        sink.encode((T0 + i, 20, "INFO", "l", f"m{i}", None, None, 1, "t", None, None, None), items.append, None)
    return items


def test_the_sink_counts_what_was_not_named_as_stored_and_never_resends():
    sink = _sink()
    items = _items(sink, 3)
    text = (
        f"entry with timestamp 2024-05-06 15:58:50.000000001 +0000 UTC ignored, reason: 'x',\nfor stream: {LOKI_VIEW}"
    )
    verdict = sink.on_rejected(items, Response(400, text.encode(), None))
    assert list(verdict.stored) == [items[0], items[2]] and not verdict.resend
    assert dict(verdict.refused) == {"rejected": 1}
    assert sink.on_rejected(items, Response(400, b"no idea", None)) is None
    assert sink.on_rejected(items, Response(401, text.encode(), None)) is None
    other = "entry with timestamp 2024-05-06 15:58:50 +0000 UTC ignored, reason: 'x',\nfor stream: {service=\"other\"}"
    assert sink.on_rejected(items, Response(400, other.encode(), None)) is None  # names nothing we sent


def test_the_ingester_total_counts_refused_entries_beyond_the_ten_it_lists():
    sink = _sink()
    items = _items(sink, 30)
    listed = "".join(
        f"entry with timestamp 2024-05-06 15:58:50.{i:09d} +0000 UTC ignored, reason: 'entry out of order',\n"
        for i in range(10)
    )
    text = listed + f"user 'fake', total ignored: 25 out of 30 for stream: {LOKI_VIEW}"
    verdict = sink.on_rejected(items, Response(400, text.encode(), None))
    assert dict(verdict.refused) == {"out_of_order": 25} and len(verdict.stored) == 5


CORPUS = json.loads((Path(__file__).parent / "data" / "loki_push_errors.json").read_text())


@pytest.mark.parametrize("message", CORPUS["messages"], ids=lambda m: f"{m['version']}-{m['reason']}")
def test_every_known_loki_message_selects_exactly_the_refused_entries(message):
    ours = CORPUS["stream"]
    rejections, _ = parse_answer(message["text"])
    assert message["source"] and message["version"]

    def reason(entry: list) -> str | None:
        ts, line_bytes, has_metadata = entry[:3]
        metadata = {"k": "v"} if has_metadata else None
        return next((r.reason for r in rejections if r.matches(ours, ts, line_bytes, metadata)), None)

    for entry in message["refused"]:
        assert reason(entry) == (entry[3] if len(entry) > 3 else message["reason"]), entry
    for entry in message["kept"]:
        assert reason(entry) is None, entry
    for other in ({**ours, "level": "error"}, {"service": "validator"}):
        assert not any(r.labels is not None and r.matches(other, 0, 10**6, {"k": "v"}) for r in rejections)


@pytest.mark.parametrize("message", CORPUS["messages"], ids=lambda m: f"{m['version']}-{m['reason']}")
def test_the_case_of_a_message_does_not_matter(message):
    ours = CORPUS["stream"]
    for text in (message["text"].lower(), message["text"][:1].upper() + message["text"][1:]):
        rejections, _ = parse_answer(text)
        ts, line_bytes, has_metadata = message["refused"][0][:3]
        assert any(r.matches(ours, ts, line_bytes, {"k": "v"} if has_metadata else None) for r in rejections)


@pytest.mark.parametrize("throttle", CORPUS["throttles"], ids=lambda t: f"{t['version']}-{t['reason']}")
def test_rate_limit_answers_state_their_limit_and_reason(throttle):
    assert parse_rate_limit(throttle["text"]) == throttle["limit_bytes_per_second"]
    assert rate_limit_reason(throttle["text"]) == throttle["reason"]
    assert parse_rate_limit(throttle["text"].lower()) == throttle["limit_bytes_per_second"]


def test_a_3_6_line_size_answer_counts_only_the_long_line():
    sink = _sink()
    items = _items(sink, 3)
    long_item = ((items[1][0][0], items[1][0][1], items[1][0][2], None, 300_106), items[1][1], items[1][2])
    text = (
        f"max entry size '262144' bytes exceeded for stream '{LOKI_VIEW}' while adding an entry with length "
        "'300106' bytes"
    )
    verdict = sink.on_rejected([items[0], long_item, items[2]], Response(400, text.encode(), None))
    assert dict(verdict.refused) == {"line_too_long": 1} and list(verdict.stored) == [items[0], items[2]]


def test_push_bodies_sort_each_stream_by_timestamp():
    import json

    sink = _sink()
    items: list = []
    for ts, level in ((T0 + 5, 20), (T0 + 1, 40), (T0 + 3, 20), (T0 + 2, 20)):
        sink.encode((ts, level, "X", "l", str(ts - T0), None, None, 1, "t", None, None, None), items.append, None)
    body = json.loads(sink.build_body(items))
    by_level = {s["stream"]["level"]: [int(v[0]) - T0 for v in s["values"]] for s in body["streams"]}
    assert by_level == {"info": [2, 3, 5], "error": [1]}
    assert all(isinstance(v[0], str) for s in body["streams"] for v in s["values"])
