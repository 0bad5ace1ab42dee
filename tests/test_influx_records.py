"""The record `MetricsLogger.log` queues: one dict the garbage collector does not track, unpacked by the sender."""

from __future__ import annotations

import enum
import gc
import sys
import threading

import pytest

from telemetry_client._influx import records
from telemetry_client._influx.records import TagSets, unpack_many
from telemetry_client._influx.sink import InfluxSink
from telemetry_client.metrics import MetricsLogger, encode_lines
from telemetry_client.testing import InMemoryDestination


def _queued(calls) -> tuple[list, InfluxSink]:
    """What `log()` hands its channel for each call in `calls` (kwargs of `log`), in order."""
    logger = MetricsLogger(uid=3, role="miner", destination=InMemoryDestination(), self_metrics_interval=None)
    queued: list = []
    logger._channel.submit = queued.append  # type: ignore[method-assign, union-attr]
    try:
        for call in calls:
            logger.log(**call)
    finally:
        logger.close(1)
    return queued, logger._sink


def test_a_point_of_numbers_and_strings_is_queued_as_a_record_the_collector_does_not_track():
    """A tracked record is walked by every full collection while it waits; a flood holds hundreds of thousands."""
    queued, _ = _queued(
        [
            {"measurement": "loss", "fields": {"a": 0.5, "b": 2, "text": "x"}, "timestamp": 10},
            {"measurement": "loss", "tags": {"node": "a", "gpu": 0}, "fields": {"a": 0.5}},
            {"measurement": "loss", "fields": {"a": 0.5}, "with_system_metrics": True, "with_gpu_metrics": True},
            {"measurement": "empty"},
        ]
    )
    assert [gc.is_tracked(record) for record in queued] == [False] * 4


def test_the_sender_unpacks_records_into_what_was_logged():
    queued, sink = _queued(
        [
            {"measurement": "loss", "fields": {"a": 0.5}, "timestamp": 10},
            {"measurement": "loss", "tags": {"node": "a"}, "fields": {"a": 1.5}, "timestamp": 11},
            {"measurement": "loss", "tags": {"node": "a"}, "fields": {"b": 1}, "timestamp": 12.5},
            {"measurement": "step", "tags": {"node": "b"}, "timestamp": 13, "with_gpu_metrics": True},
            {"measurement": "step", "fields": {"c": 2.0}, "timestamp": 14, "with_system_metrics": True},
        ]
    )
    expected = [
        ("loss", None, {"a": 0.5}, 10, False, False),
        ("loss", {"node": "a"}, {"a": 1.5}, 11, False, False),
        ("loss", {"node": "a"}, {"b": 1}, 12.5, False, False),
        ("step", {"node": "b"}, {}, 13, False, True),
        ("step", None, {"c": 2.0}, 14, True, False),
    ]
    unpacked = sink.unpack_many(queued)
    assert [(m, sink.tag_sets.tags(tags), *rest) for m, tags, *rest in unpacked] == expected
    assert [tags for _, tags, *_ in unpacked] == [None, 0, 0, 1, None]  # the same tags are one number


def test_a_point_asking_for_system_metrics_is_unpacked_whole_even_when_taken_at_once():
    """The sender may take a record the moment it is queued: the sink must know to look for SAMPLED by then."""
    logger = MetricsLogger(uid=3, role="miner", destination=InMemoryDestination(), self_metrics_interval=None)
    sink = logger._sink
    unpacked: list = []
    logger._channel.submit = lambda record: unpacked.extend(sink.unpack_many([record]))  # type: ignore[method-assign, union-attr]
    try:
        logger.log("step", fields={"c": 2.0}, timestamp=14, with_system_metrics=True)
        logger.log("step", fields={"c": 3.0}, timestamp=15)
    finally:
        logger.close(1)
    assert unpacked == [("step", None, {"c": 2.0}, 14, True, False), ("step", None, {"c": 3.0}, 15, False, False)]


def test_a_chunk_that_mixes_records_and_tuples_is_unpacked_one_by_one():
    """The logger's own self-metrics are queued as tuples; unhashable tags are kept as a copy (a tracked record)."""
    queued, sink = _queued(
        [
            {"measurement": "loss", "fields": {"a": 0.5}, "timestamp": 10},
            {"measurement": "loss", "tags": {"node": ["un", "hashable"]}, "fields": {"a": 1.0}, "timestamp": 11},
        ]
    )
    own = ("telemetry_client", {"sink": "influxdb"}, {"queued": 1.0}, 12, False, False)
    assert sink.unpack_many([queued[0], own, queued[1]]) == [
        ("loss", None, {"a": 0.5}, 10, False, False),
        own,
        ("loss", {"node": ["un", "hashable"]}, {"a": 1.0}, 11, False, False),
    ]


def test_records_of_dicts_alone_with_a_copy_of_tags_are_unpacked_too():
    tag_sets = TagSets()
    unhashable = {"a": 1.0, records.MEASUREMENT: "m", records.TIME: 1, records.TAGS: tag_sets.ref("m", {"k": []})}
    numbered = {"a": 2.0, records.MEASUREMENT: "m", records.TIME: 2, records.TAGS: tag_sets.ref("m", {"k": "v"})}
    assert unpack_many([unhashable, numbered]) == [
        ("m", {"k": []}, {"a": 1.0}, 1, False, False),
        ("m", 0, {"a": 2.0}, 2, False, False),
    ]
    assert tag_sets.tags(0) == {"k": "v"}


def test_tag_sets_stop_numbering_at_their_limit_and_keep_copies():
    tag_sets = TagSets()
    tag_sets.LIMIT = 2
    assert [tag_sets.ref("m", {"n": i}) for i in (0, 1, 0)] == [0, 1, 0]
    beyond = tag_sets.ref("m", {"n": 2})
    assert beyond == {"n": 2} and tag_sets.tags(beyond) == {"n": 2}


def test_threads_racing_for_a_new_set_of_tags_get_one_number_that_stands_for_it():
    """Switching threads every microsecond makes them race inside `ref` (a plain assignment for `setdefault`
    fails about one run in two)."""
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        for _ in range(5):
            tag_sets = TagSets()
            start = threading.Barrier(8)
            got: list[list] = [[] for _ in range(8)]

            def register(numbers: list, tag_sets: TagSets = tag_sets, start: threading.Barrier = start) -> None:
                start.wait()
                numbers.extend(tag_sets.ref("m", {"node": str(i)}) for i in range(200))

            threads = [threading.Thread(target=register, args=(numbers,)) for numbers in got]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            by_set = {i: {numbers[i] for numbers in got} for i in range(200)}
            assert all(len(found) == 1 for found in by_set.values())
            assert all(tag_sets.tags(found.pop()) == {"node": str(i)} for i, found in by_set.items())
    finally:
        sys.setswitchinterval(interval)


def _sent(calls) -> tuple[list[bytes], dict]:
    """The lines a logger sends for `calls` (kwargs of `log`), and its drops."""
    sent = InMemoryDestination()
    logger = MetricsLogger(uid=3, role="miner", destination=sent, self_metrics_interval=None)
    try:
        for call in calls:
            logger.log(**call)
        assert sent.flush(30) == 0
        return b"".join(request.body for request in sent.requests).splitlines(), logger.stats()["dropped_by_reason"]
    finally:
        logger.close(1)


@pytest.mark.parametrize("bad", [{"node": "x\ty"}, {"node": "x\\y"}], ids=["tab", "backslash"])
@pytest.mark.parametrize("untagged", [False, True], ids=["numbered", "numbered-and-none"])
def test_a_chunk_of_common_points_stops_at_an_invalid_series_and_builds_each_new_series_once(bad, untagged):
    """A chunk of common points (float fields, int timestamps, tags numbered or none) is encoded whole: up to a
    point whose series cannot be written, which `encode` then counts; a series new to the chunk is built once."""
    cycle = [{"node": "a"}, None, {"node": "b"}] if untagged else [{"node": "a"}, {"node": "b"}, {"node": "a"}]
    calls = [{"measurement": "m", "tags": cycle[i % 3], "fields": {"a": float(i)}, "timestamp": i} for i in range(6)]
    calls.insert(4, {"measurement": "m", "tags": bad, "fields": {"a": 9.0}, "timestamp": 9})
    queued, sink = _queued(calls)
    records = sink.unpack_many(queued)
    built = []
    series_for = sink._series_for
    sink._series_for = lambda *args: built.append(args) or series_for(*args)  # type: ignore[method-assign]
    items, index = sink.encode_many(records, 0)
    assert index == 4 and len(built) == len({str(tags) for tags in cycle}) + 1  # each series once, the bad one too
    rest, end = sink.encode_many(records, 5)
    lines = [b"m,node=a,role=miner,uid=3", b"m,role=miner,uid=3" if untagged else b"m,node=b,role=miner,uid=3"]
    lines += [b"m,node=b,role=miner,uid=3" if untagged else b"m,node=a,role=miner,uid=3"]
    expected = [b"%s a=%d %d\n" % (lines[i % 3], i, i) for i in range(6)]
    assert [line for line, _, _ in items + rest] == expected
    assert end == 7 and [key for _, _, key in items + rest] == ["m"] * 6


def test_field_names_of_a_str_subclass_are_written_as_their_text():
    """orjson refuses a key that is a str subclass (an enum's member): those points take the general path."""

    class Metric(enum.StrEnum):
        LOSS = "loss"

    calls = [{"measurement": "m", "fields": {Metric.LOSS: 0.5 + i}, "timestamp": i} for i in range(3)]
    calls.append({"measurement": "m", "fields": {"loss": 4.5}, "timestamp": 3})
    calls += [{"measurement": "m", "fields": {Metric.LOSS: 5.5}, "timestamp": 4}]
    lines, drops = _sent(calls)
    assert lines == [
        f"m,role=miner,uid=3 loss={value} {i}".encode() for i, value in enumerate((0.5, 1.5, 2.5, 4.5, 5.5))
    ]
    assert drops == {}
    assert list(encode_lines([("m", None, {Metric.LOSS: 0.5}, 1)])) == [b"m loss=0.5 1\n"]


def test_equal_tags_that_read_differently_keep_their_own_text_in_another_measurement():
    lines, _ = _sent(
        [
            {"measurement": "loss", "tags": {"gpu": True}, "fields": {"a": 1.0}, "timestamp": 1},
            {"measurement": "step", "tags": {"gpu": 1}, "fields": {"a": 1.0}, "timestamp": 2},
        ]
    )
    assert lines == [b"loss,gpu=True,role=miner,uid=3 a=1 1", b"step,gpu=1,role=miner,uid=3 a=1 2"]


def test_tags_given_as_pairs_are_still_taken():
    lines, drops = _sent([{"measurement": "m", "tags": [("node", "a")], "fields": {"a": 1.0}, "timestamp": 1}])
    assert (lines, drops) == ([b"m,node=a,role=miner,uid=3 a=1 1"], {})


def test_a_tag_value_that_is_a_list_drops_its_point_as_invalid_and_no_other(caplog):
    """Such tags cannot be numbered (nor cached): the point is counted `invalid` with a warning naming the tag."""
    lines, drops = _sent(
        [
            {"measurement": "m", "tags": {"node": ["a", "b"]}, "fields": {"a": 1.0}, "timestamp": 1},
            {"measurement": "m", "tags": {"node": "a"}, "fields": {"a": 2.0}, "timestamp": 2},
        ]
    )
    assert (lines, drops) == ([b"m,node=a,role=miner,uid=3 a=2 2"], {"invalid": 1})
    assert "tag 'node' is a list" in caplog.text
