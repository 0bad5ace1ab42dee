"""The fast encoder writes exactly what influxdb_client's Point writes, for every input it accepts."""

from __future__ import annotations

import math
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from influxdb_client import Point

from telemetry_client._engine.transport import HttpTransport
from telemetry_client._influx import line_protocol as lp
from telemetry_client._influx.fields import FieldEncoder
from telemetry_client._influx.sink import InfluxSink
from telemetry_client.errors import ConfigurationError
from telemetry_client.metrics import encode_lines

# Text with the characters line protocol treats specially, plus unicode.
tricky_text = st.text(
    alphabet=st.sampled_from(list(",= \"'\\\n\t\r#_abcXYZ019é漢🚀\x01")) | st.characters(),
    min_size=1,
    max_size=20,
)
numbers = st.floats(allow_nan=True, allow_infinity=True) | st.integers(-(2**60), 2**60)


@pytest.mark.slow
@settings(max_examples=600, deadline=None)
@given(
    measurement=tricky_text,
    tags=st.dictionaries(tricky_text, tricky_text, max_size=5),
    fields=st.dictionaries(tricky_text, numbers | tricky_text, min_size=1, max_size=6),
    timestamp=st.integers(0, 2**62),
)
def test_encoder_matches_point_on_everything_it_accepts(measurement, tags, fields, timestamp):
    accepted = (
        lp.valid_measurement(measurement)
        and all(lp.valid_key(k) and lp.valid_name(v) for k, v in tags.items())
        and all(lp.valid_key(k) for k in fields)
    )
    # The typing rule: every number is a float; NaN and infinities are left out.
    finite = {k: v if isinstance(v, str) else float(v) for k, v in fields.items()}
    finite = {k: v for k, v in finite.items() if isinstance(v, str) or math.isfinite(v)}
    if not accepted or not finite:
        return
    point = Point(measurement).time(timestamp)
    for key, value in tags.items():
        point.tag(key, value)
    for key, value in finite.items():
        point.field(key, value)
    expected = point.to_line_protocol()
    # The sender's cached encoder (both its all-numbers fast path and its general path).
    try:
        encoded = FieldEncoder().encode(fields, lambda reason, count: None).decode()
    except UnicodeEncodeError:  # a lone surrogate, which UTF-8 cannot hold: the sink drops the point `invalid`
        with pytest.raises(UnicodeEncodeError):
            expected.encode()
        return
    assert f"{lp.series_key(measurement, tags)} {encoded} {timestamp}" == expected


# Keys the fast path writes through orjson as they are (some holding the text of the floats it rewrites into
# `repr`'s form: "e-7", "0.00001"), and keys it must not (what line protocol escapes, what JSON or the fast
# path rewrites: colons, braces).
field_keys = st.sampled_from(["loss", "lr", "b", "a", "rate-e-7", "x0.00001", "é/漢", "a:b", "{c}", "p=q", "s t"])
# Every magnitude: orjson writes floats as `repr` does except from 1e-9 up to 1e-4.
any_float = st.floats(allow_nan=False, allow_infinity=False) | st.builds(
    lambda mantissa, exponent: mantissa * 10.0**exponent, st.floats(-10, 10), st.integers(-12, -3)
)


@settings(max_examples=2000, deadline=None)
@given(fields=st.dictionaries(field_keys, any_float | st.integers(-(10**16) + 1, 10**16 - 1), min_size=1))
def test_field_text_is_reprs_for_every_float_and_key(fields):
    """The field text (orjson's where it is `repr`'s, `repr` where not) against `format_float`, which is `repr`."""
    expected = ",".join(f"{lp.escape_key(key)}={lp.format_float(float(fields[key]))}" for key in sorted(fields))
    assert FieldEncoder().encode(fields, lambda reason, count: None).decode() == expected


def test_refuses_what_influxdb_cannot_store_exactly():
    for bad in ("", "a\nb", "a\tb", "a\rb", "trailing\\", "back\\slash"):
        assert not lp.valid_name(bad), bad
    assert not lp.valid_key("time")
    assert not lp.valid_key("_measurement")
    assert not lp.valid_measurement("#comment")
    assert lp.valid_measurement("has space, comma=equals")
    assert not lp.valid_name(42)


def test_format_float_matches_point_rules():
    assert lp.format_float(1.0) == "1"
    assert lp.format_float(0.5) == "0.5"
    assert lp.format_float(1e20) == "1e+20"
    assert lp.format_float(5e-324) == "5e-324"
    assert lp.format_field('say "hi" \\o/') == '"say \\"hi\\" \\\\o/"'


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(
    points=st.lists(
        st.tuples(tricky_text, st.dictionaries(tricky_text, numbers | tricky_text, min_size=1, max_size=4)),
        min_size=1,
        max_size=8,
    )
)
def test_a_batch_body_gives_back_its_items_when_each_is_one_line(points):
    """What a sealed InfluxDB batch keeps (its body) is enough to rebuild its items, keys included."""
    sink = InfluxSink(HttpTransport("http://127.0.0.1:9/write"), {"uid": "1"}, 1024, 10.0, None)
    items: list = []
    for measurement, fields in points:
        sink.encode((measurement, None, fields, 1, False, False), items.append, lambda reason, count: None)
    body = sink.build_body(items)
    rebuildable = sink.items_in_body(body, len(items))
    assert rebuildable == all(item[0].count(b"\n") == 1 for item in items)
    if rebuildable:
        assert sink.items_from_body(sink.transport.decode_body(sink.transport.encode_body(body))) == items


@settings(max_examples=200, deadline=None)
@given(
    points=st.lists(
        st.tuples(
            tricky_text,
            st.none() | st.dictionaries(tricky_text, tricky_text, max_size=3),
            st.dictionaries(tricky_text, numbers | tricky_text, max_size=4),
        ),
        min_size=1,
        max_size=8,
    )
)
def test_encode_lines_writes_what_a_loggers_sink_writes(points):
    """The public encoder for history is the logger's own: same lines, same drops with the same reasons."""
    tags = {"uid": "7", "role": "miner"}
    sink = InfluxSink(HttpTransport("http://127.0.0.1:9/write"), tags, 1024, 10.0, None)
    expected: list[bytes] = []
    expected_drops: list[tuple[str, int]] = []
    for measurement, point_tags, fields in points:
        record = (measurement, point_tags, fields, 1_700_000_000.5, False, False)
        sink.encode(record, lambda item: expected.append(item[0]), lambda *drop: expected_drops.append(drop))
    drops: list[tuple[str, int]] = []
    history = [(measurement, point_tags, fields, 1_700_000_000.5) for measurement, point_tags, fields in points]
    lines = list(encode_lines(history, tags, max_string_bytes=1024, on_drop=lambda *drop: drops.append(drop)))
    assert lines == expected
    assert drops == expected_drops


def test_encode_lines_refuses_by_default_what_a_logger_would_drop():
    assert list(encode_lines([("m", None, {"x": 1}, 5)], {"uid": "1"})) == [b"m,uid=1 x=1 5\n"]
    with pytest.raises(ValueError, match="no_fields"):
        list(encode_lines([("m", None, {}, 5)]))


def test_encode_lines_refuses_standard_tags_a_logger_refuses():
    """A standard tag goes into every line: one holding a newline would split each line in two."""
    with pytest.raises(ConfigurationError, match=re.escape("tag host='a\\nb' cannot be written to InfluxDB exactly")):
        list(encode_lines([("m", None, {"x": 1.0}, 5)], {"host": "a\nb"}))


def test_encode_lines_counts_a_measurement_that_is_not_text_and_goes_on(caplog):
    drops: list = []
    points = [(["m"], None, {"x": 1.0}, 5), ("m", None, {"x": 2.0}, 6)]
    assert list(encode_lines(points, on_drop=lambda *drop: drops.append(drop))) == [b"m x=2 6\n"]
    assert drops == [("invalid", 1)] and "measurement is a list" in caplog.text


# A few series and key sets, so that records repeat them (the fast path takes a series seen before).
_pool_names = st.sampled_from(["loss", "step", "bad\nname", "gpu"])
_pool_tags = st.none() | st.sampled_from([{"node": "a"}, {"node": "b", "gpu": "0"}, {"node": "x\ty"}, {}])
_pool_keys = st.lists(st.sampled_from(["a", "b", "c", "time", "d e"]), min_size=0, max_size=4, unique=True)
_pool_values = (
    st.floats(allow_nan=True, allow_infinity=True)
    | st.integers(-(2**60), 2**60)
    | st.booleans()
    | st.sampled_from(["text", "\ud800"])
)


@st.composite
def _records(draw):
    keys = draw(_pool_keys)
    fields = {key: draw(_pool_values) for key in keys}
    timestamp = draw(st.integers(-(2**64), 2**64) | st.floats(0, 2e9) | st.just("soon"))
    return (draw(_pool_names), draw(_pool_tags), fields, timestamp, False, False)


@st.composite
def _common_records(draw):
    """The point the fast path takes once its series has been seen: valid names, finite floats, an int timestamp."""
    keys = draw(st.lists(st.sampled_from(["a", "b", "c", "d e"]), min_size=1, max_size=4, unique=True))
    fields = {key: draw(st.floats(allow_nan=False, allow_infinity=False)) for key in keys}
    name = draw(st.sampled_from(["loss", "step"]))
    tags = draw(st.none() | st.sampled_from([{"node": "a"}, {"node": "b", "gpu": "0"}]))
    return (name, tags, fields, draw(st.integers(0, 2**62)), False, False)


def _channel_and_encode(records) -> tuple[int, int, int]:
    """Each record logged through a logger's channel and encoded by `encode` alone: the bytes and the drops
    must be the same. Returns (items the channel's fast path made, those of them a whole chunk's, records)."""
    from telemetry_client.metrics import MetricsLogger
    from telemetry_client.testing import InMemoryDestination

    sent = InMemoryDestination()
    logger = MetricsLogger(uid=3, role="miner", destination=sent, self_metrics_interval=None)
    sink = logger._sink
    reference = InfluxSink(
        HttpTransport("http://127.0.0.1:9/write"), sink.standard_tags, sink.fields.max_string_bytes, 10.0, None
    )
    fast = 0
    encode_many = logger.channel._encode_many

    def counted(chunk, start):
        nonlocal fast
        items, index = encode_many(chunk, start)
        fast += len(items)
        return items, index

    logger.channel._encode_many = counted
    chunked = 0
    plain_many = sink.fields.plain_many

    def counted_chunk(field_sets):
        nonlocal chunked
        texts = plain_many(field_sets)
        chunked += len(texts or ())
        return texts

    sink.fields.plain_many = counted_chunk
    expected: list[bytes] = []
    drops: dict[str, int] = {}

    def drop(reason: str, count: int = 1) -> None:
        drops[reason] = drops.get(reason, 0) + count

    drop.part = drop  # type: ignore[attr-defined]
    for record in records:
        reference.encode(record, lambda item: expected.append(item[0]), drop)
        logger.log(record[0], record[1], record[2], timestamp=record[3])
    try:
        assert sent.flush(30) == 0
        assert b"".join(request.body for request in sent.requests) == b"".join(expected)
        assert logger.stats()["dropped_by_reason"] == drops
    finally:
        logger.close(1)
    return fast, chunked, len(records)


@settings(max_examples=100, deadline=None)
@given(records=st.lists(_records() | _common_records() | _common_records(), min_size=1, max_size=60))
def test_the_channels_fast_path_writes_what_encode_writes(records):
    """A logger's channel (its `encode_many` and `encode`) writes the bytes and counts the drops of `encode` alone."""
    _channel_and_encode(records)


@settings(max_examples=100, deadline=None)
@given(records=st.lists(_common_records(), min_size=1, max_size=60))
def test_a_chunk_of_common_points_is_written_as_encode_writes_it(records):
    """Chunks of common points alone: most go through `_encode_chunk` whole (some hold a key or a float it leaves
    to the loop)."""
    _channel_and_encode(records)


def test_the_fast_path_takes_every_common_point_in_whole_chunks():
    """The property tests above prove nothing unless the fast paths encode: here every point is written by a
    chunk's one `plain_many` call, the first point of each series too."""
    records = [("loss", {"node": "a"}, {"a": i * 0.5, "b": float(i)}, 10**18 + i, False, False) for i in range(50)]
    records += [("step", None, {"c": 1.25, "n": i}, 10**18 + i, False, False) for i in range(50)]
    fast, chunked, count = _channel_and_encode(records)
    assert fast == chunked == count


@pytest.mark.parametrize(
    ("field_sets", "texts"),
    [
        ([{"a": 1.0, "b": 2}, {"a": 0.5, "b": -0.0}], [b"a=1,b=2", b"a=0.5,b=-0"]),
        ([{"b": 1e16, "a": 1e-4}], [b"a=0.0001,b=1e+16"]),  # sorted; repr's forms
        # orjson writes 0.00001, -1.5e-7 where repr writes 1e-05, -1.5e-07: rewritten
        ([{"a": 1e-5, "b": -0.000015}, {"a": -1.5e-7, "b": 9e-9}], [b"a=1e-05,b=-1.5e-05", b"a=-1.5e-07,b=9e-09"]),
        ([{"a": 1e-10, "b": 1e-4, "c": -2e-300}], [b"a=1e-10,b=0.0001,c=-2e-300"]),  # the same in both
        ([{"a": 1.0}, {"a": True}], None),  # a bool is a field of its own type
        ([{"a": 1.0}, {"a": 2**53 + 1}], None),  # an int a float cannot hold: its text is not the float's
        ([{"a": 1.0}, {}], None),  # no fields: `encode` counts it
        ([{"a": 1.0}, {"d e": 2.0}], None),  # a key line protocol escapes
        ([{"a": 1.0}, {"time": 2.0}], None),  # a key InfluxDB refuses
        ([{"a": 1.0}, {"a": float("nan")}], None),
        ([{"rate-e-7": 1e-7, "x0.00001": 1.0}], [b"rate-e-7=1e-07,x0.00001=1"]),  # keys holding the forms' text
    ],
)
def test_plain_many_writes_a_chunk_or_leaves_it(field_sets, texts):
    encoder = FieldEncoder()
    assert encoder.plain_many(field_sets) == texts
    if texts is not None:
        assert texts == [encoder.encode(fields, lambda reason, count: None) for fields in field_sets]
