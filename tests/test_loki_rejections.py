"""Reading Loki's 400 answers: which entries were refused, so only those are dropped."""

from __future__ import annotations

from telemetry_client.loki_limits import label_string
from telemetry_client.loki_rejections import (
    Rejection,
    parse_go_time,
    parse_labels,
    parse_rejections,
    parse_rfc3339,
    same_stream,
)
from telemetry_client.loki_sink import LokiSink
from telemetry_client.transport import HttpTransport, Response

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
    assert Rejection(parse_labels(LOKI_VIEW), ts_from=T0, ts_to=T0 + 1) in rejections
    assert Rejection(parse_labels(LOKI_VIEW), ts_from=T0 + 500_000_000, ts_to=T0 + 500_000_001) in rejections

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


def test_the_sink_keeps_what_was_not_named_and_drops_the_batch_otherwise():
    sink = _sink()
    items = _items(sink, 3)
    text = (
        f"entry with timestamp 2024-05-06 15:58:50.000000001 +0000 UTC ignored, reason: 'x',\nfor stream: {LOKI_VIEW}"
    )
    verdict = sink.on_rejected(items, Response(400, text.encode(), None))
    assert list(verdict.resend) == [items[0], items[2]]
    assert dict(verdict.refused) == {"rejected": 1}
    assert sink.on_rejected(items, Response(400, b"no idea", None)) is None
    assert sink.on_rejected(items, Response(401, text.encode(), None)) is None
    other = "entry with timestamp 2024-05-06 15:58:50 +0000 UTC ignored, reason: 'x',\nfor stream: {service=\"other\"}"
    assert sink.on_rejected(items, Response(400, other.encode(), None)) is None  # names nothing we sent


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
