"""Fault injection against the conformance receiver: refusals, timeouts, 429/5xx, outages, partial 400s."""

from __future__ import annotations

import logging
import os
import time
import uuid
from collections import Counter
from collections.abc import Iterator

import pytest
from counters import assert_counters_add_up
from loki_receiver import Limits, LokiReceiver

from telemetry_client import BufferSettings
from telemetry_client.loki import LokiHandler

FAST = dict(flush_interval=0.05, retry_base=0.02, retry_cap=0.1)


@pytest.fixture
def receiver() -> Iterator[LokiReceiver]:
    with LokiReceiver() as server:
        yield server


@pytest.fixture
def handlers() -> Iterator[list[LokiHandler]]:
    made: list[LokiHandler] = []
    yield made
    for handler in made:
        handler.close(1)


def shipping_logger(
    receiver: LokiReceiver,
    handlers: list[LokiHandler],
    read_timeout: float = 2.0,
    structured_metadata: bool = False,
    **buffer: object,
) -> tuple[logging.Logger, LokiHandler]:
    handler = LokiHandler(
        receiver.base_url,
        {"service": "faults"},
        buffer=BufferSettings(**{**FAST, **buffer}),
        connect_timeout=0.5,
        read_timeout=read_timeout,
        structured_metadata=structured_metadata,
    )
    handlers.append(handler)
    logger = logging.getLogger(f"test.faults.{uuid.uuid4().hex[:8]}")
    logger.propagate = False
    logger.setLevel(logging.INFO)
    logger.addHandler(handler)
    return logger, handler


def received_ids(receiver: LokiReceiver) -> Counter[str]:
    return Counter(entry.json()["id"] for entry in receiver.entries)


def log_ids(logger: logging.Logger, ids: range, text: str = "line") -> None:
    for i in ids:
        logger.info(text, extra={"id": str(i)})


def test_refused_connections_are_retried_until_the_server_is_back(receiver, handlers):
    logger, handler = shipping_logger(receiver, handlers)
    receiver.refuse()
    log_ids(logger, range(50))
    assert handler.flush(0.5) == 50  # nothing can be delivered yet
    receiver.resume()
    assert handler.flush(20) == 0
    assert received_ids(receiver) == Counter({str(i): 1 for i in range(50)})
    stats = handler.stats()
    assert stats["retries"] >= 1 and stats["dropped"] == 0
    assert "refused" in stats["last_error"]


def test_a_read_timeout_is_retried_and_nothing_is_stored_twice(receiver, handlers):
    logger, handler = shipping_logger(receiver, handlers, read_timeout=0.3)
    receiver.delay_next(1, 1.0)  # the first push is answered after the client gave up
    log_ids(logger, range(20))
    assert handler.flush(20) == 0
    assert receiver.wait_for(lambda r: len(r.requests) >= 2, timeout=5)
    assert received_ids(receiver) == Counter({str(i): 1 for i in range(20)})
    assert handler.stats()["retries"] >= 1
    assert "timed out" in handler.stats()["last_error"]


def test_429_with_retry_after_is_honoured(receiver, handlers):
    logger, handler = shipping_logger(receiver, handlers)
    receiver.fail_next(1, 429, retry_after="1")
    log_ids(logger, range(10))
    assert handler.flush(20) == 0
    first, second = receiver.requests[:2]
    assert first.status == 429 and second.status == 204
    assert second.received - first.received >= 0.9  # waited for Retry-After, not the 0.1 s backoff cap
    assert received_ids(receiver) == Counter({str(i): 1 for i in range(10)})
    assert handler.stats()["retries"] == 1


@pytest.mark.parametrize("status", [500, 502, 503, 504])
def test_5xx_is_retried_and_nothing_is_lost(receiver, handlers, status):
    logger, handler = shipping_logger(receiver, handlers)
    receiver.fail_next(3, status)
    log_ids(logger, range(30))
    assert handler.flush(20) == 0
    assert [r.status for r in receiver.requests[:4]] == [status, status, status, 204]
    assert received_ids(receiver) == Counter({str(i): 1 for i in range(30)})
    assert handler.stats()["retries"] == 3


def test_an_outage_is_buffered_and_delivered_after_recovery(receiver, handlers):
    logger, handler = shipping_logger(receiver, handlers, batch_items=500)
    receiver.refuse()
    log_ids(logger, range(0, 1500))
    time.sleep(0.3)  # several failed attempts during the outage
    log_ids(logger, range(1500, 3000))
    receiver.resume()
    assert handler.flush(30) == 0
    assert received_ids(receiver) == Counter({str(i): 1 for i in range(3000)})
    assert handler.stats()["dropped"] == 0


def test_beyond_the_bound_the_oldest_lines_are_dropped_and_counted(receiver, handlers):
    logger, handler = shipping_logger(receiver, handlers, max_items=100, batch_items=50)
    receiver.refuse()
    log_ids(logger, range(1000))
    assert handler.flush(0.5) > 0
    receiver.resume()
    assert handler.flush(20) == 0
    ids = received_ids(receiver)
    assert set(ids.values()) == {1}
    assert str(999) in ids  # the newest survive
    stats = handler.stats()
    assert stats["dropped_by_reason"]["buffer_full"] == 1000 - len(ids)
    assert stats["sent"] == len(ids)


def test_a_400_naming_an_entry_drops_only_that_entry(receiver, handlers):
    logger, handler = shipping_logger(receiver, handlers, flush_interval=30)  # one batch, sent by flush()
    receiver.refuse_lines_containing("POISON")
    log_ids(logger, range(0, 10))
    logger.info("POISON", extra={"id": "bad"})
    log_ids(logger, range(10, 20))
    assert handler.flush(20) == 0
    assert received_ids(receiver) == Counter({str(i): 1 for i in range(20)})
    assert receiver.duplicates == 0 and len(receiver.requests) == 1  # Loki stored the rest: nothing is resent
    stats = handler.stats()
    assert stats["dropped_by_reason"] == {"too_far_behind": 1}
    assert stats["sent"] == 20
    assert "entry too far behind" in stats["last_error"]


def test_a_400_for_a_too_old_entry_drops_only_it():
    with LokiReceiver(limits=Limits(reject_old_samples_max_age=3600)) as receiver:
        handlers: list[LokiHandler] = []
        try:
            logger, handler = shipping_logger(receiver, handlers)
            log_ids(logger, range(5))
            old = logger.makeRecord(logger.name, logging.INFO, __file__, 1, "replayed", (), None, extra={"id": "old"})
            old.created -= 7200
            logger.handle(old)
            log_ids(logger, range(5, 10))
            assert handler.flush(20) == 0
            assert received_ids(receiver) == Counter({str(i): 1 for i in range(10)})
            assert handler.stats()["dropped_by_reason"] == {"greater_than_max_sample_age": 1}
            assert handler.stats()["sent"] == 10 and receiver.duplicates == 0
        finally:
            for h in handlers:
                h.close(1)


def test_a_400_that_names_nothing_drops_the_batch(receiver, handlers):
    logger, handler = shipping_logger(receiver, handlers, flush_interval=30)
    receiver.fail_next(1, 400, body="something unexpected")
    log_ids(logger, range(7))
    assert handler.flush(10) == 0
    assert receiver.count() == 0
    assert handler.stats()["dropped_by_reason"] == {"rejected": 7}
    log_ids(logger, range(7, 9))
    assert handler.flush(10) == 0
    assert sorted(received_ids(receiver)) == ["7", "8"]


def test_close_gives_up_at_its_deadline_and_counts_what_is_left(receiver, handlers):
    logger, handler = shipping_logger(receiver, handlers)
    receiver.refuse()
    log_ids(logger, range(25))
    left = handler.close(0.5)
    assert left == 25
    assert handler.stats()["dropped_by_reason"] == {"shutdown": 25}


@pytest.mark.slow
def test_a_forked_child_ships_its_own_lines_and_never_its_parents(receiver, handlers):
    logger, handler = shipping_logger(receiver, handlers, flush_interval=30)  # the parent's lines stay buffered
    log_ids(logger, range(0, 100), text="parent")
    assert handler.stats()["pending"] == 100
    pid = os.fork()
    if pid == 0:  # the child
        code = 1
        try:
            assert handler.stats()["pending"] == 0, "the child must not inherit the parent's buffer"
            log_ids(logger, range(100, 150), text="child")
            code = 0 if handler.flush(10) == 0 and handler.stats()["sent"] == 50 else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert handler.flush(10) == 0
    assert received_ids(receiver) == Counter({str(i): 1 for i in range(150)})
    assert {e.json()["pid"] for e in receiver.entries if e.json()["message"] == "child"} == {pid}


# ---- exact accounting against Loki's behaviour: what Loki stored is counted sent, once -------------


def exact(receiver: LokiReceiver, handler: LokiHandler, logged: int) -> dict:
    """Every line logged is either stored once and counted sent, or counted dropped with a reason."""
    stats = handler.stats()
    ids = received_ids(receiver)
    assert set(ids.values()) <= {1}, "a line was stored twice"
    assert receiver.duplicates == 0
    assert stats["sent"] == receiver.count() == len(ids)
    assert stats["sent"] + stats["dropped"] == logged
    assert_counters_add_up(stats)
    return stats


def old_record(logger: logging.Logger, ident: str, seconds: float) -> logging.LogRecord:
    record = logger.makeRecord(logger.name, logging.INFO, __file__, 1, "replayed", (), None, extra={"id": ident})
    record.created -= seconds
    return record


@pytest.mark.slow
@pytest.mark.parametrize("heavy_first", [True, False])
def test_a_stream_over_its_rate_limit_is_never_lost_behind_another_stream(handlers, heavy_first):
    limits = Limits(per_stream_rate_bytes=40_000, per_stream_burst_bytes=20_000)
    with LokiReceiver(limits=limits) as receiver:
        logger, handler = shipping_logger(receiver, handlers, flush_interval=30)
        heavy = lambda: [logger.info("heavy %s", "x" * 100, extra={"id": f"h{i}"}) for i in range(400)]  # noqa: E731
        light = lambda: [logger.error("light", extra={"id": f"l{i}"}) for i in range(20)]  # noqa: E731
        for part in (heavy, light) if heavy_first else (light, heavy):
            part()
        assert handler.flush(60) == 0
        stats = exact(receiver, handler, 420)
        assert stats["sent"] == 420  # the heavy stream was split until it fitted its burst
        assert any(r.status == 429 for r in receiver.requests)


def test_35_too_old_and_1001_valid_lines_are_stored_once_and_counted_exactly(handlers):
    with LokiReceiver(limits=Limits(reject_old_samples_max_age=3600)) as receiver:
        logger, handler = shipping_logger(receiver, handlers, flush_interval=30)
        for i in range(35):
            logger.handle(old_record(logger, f"old{i}", 7200))
        log_ids(logger, range(1001))
        assert handler.flush(20) == 0
        stats = exact(receiver, handler, 1036)
        assert stats["sent"] == 1001 and stats["dropped_by_reason"] == {"greater_than_max_sample_age": 35}
        assert len(receiver.requests) == 1  # nothing resent


def test_lines_within_the_second_of_the_age_cut_off_are_counted_as_loki_stored_them(handlers):
    """Loki prints the cut-off to the second; its grouped message counts the refused lines of that second."""
    with LokiReceiver(limits=Limits(reject_old_samples_max_age=600)) as receiver:
        logger, handler = shipping_logger(receiver, handlers, flush_interval=30)
        for i in range(300):  # 3 s of lines around the cut-off, 10 ms apart
            logger.handle(old_record(logger, f"edge{i}", 601.5 - i * 0.01))
        assert handler.flush(20) == 0
        stats = exact(receiver, handler, 300)
    refused = stats["dropped_by_reason"].get("greater_than_max_sample_age", 0)
    assert 0 < refused < 300 and stats["sent"] == 300 - refused
    assert len(receiver.requests) == 1  # nothing resent


def test_600_lines_pushed_with_a_refused_one_are_stored_once_and_the_limit_is_named(handlers, caplog):
    with LokiReceiver(limits=Limits(max_line_size=2000), version=(3, 6)) as receiver:
        logger, handler = shipping_logger(receiver, handlers, flush_interval=30)
        for i in range(600):
            logger.info("%s", "y" * 420, extra={"id": str(i)})  # ~290 KB in all: beyond Loki's head block
        logger.error("%s", "traceback " * 400, extra={"id": "long"})
        with caplog.at_level(logging.WARNING, logger="telemetry_client"):
            assert handler.flush(20) == 0
        stats = exact(receiver, handler, 601)
        assert stats["sent"] == 600 and stats["dropped_by_reason"] == {"line_too_long": 1}
        assert "max_line_size is 2000 bytes, below max_line_bytes=256000" in caplog.text


def test_entries_loki_refuses_for_their_metadata_are_sent_again_without_it(handlers, caplog):
    """Loki refuses an entry with structured metadata when it disallows it; the line itself holds every field."""
    with LokiReceiver(limits=Limits(allow_structured_metadata=False)) as receiver:
        logger, handler = shipping_logger(receiver, handlers, structured_metadata=True, flush_interval=30)
        with caplog.at_level(logging.WARNING, logger="telemetry_client"):
            for i in range(10):
                logger.info("plain", extra={"id": str(i)} if i % 2 else None)
            assert handler.flush(20) == 0
            for i in range(10, 14):
                logger.info("later", extra={"id": str(i)})  # sent without metadata from the start
            assert handler.flush(20) == 0
        stats = handler.stats()
        assert stats["sent"] == receiver.count() == 14 and stats["dropped"] == 0 and receiver.duplicates == 0
        assert stats["metadata_removed"] == 5
        assert_counters_add_up(stats)
        assert [r.status for r in receiver.requests] == [400, 204, 204]
        assert stats["batches"] == 3, "the push Loki stored in part counts as a batch"
        assert caplog.text.count("Loki refuses structured metadata") == 1


def test_a_batch_larger_than_the_tenant_burst_is_split_until_it_fits(handlers):
    limits = Limits(ingestion_rate_bytes=400_000, ingestion_burst_bytes=100_000)
    with LokiReceiver(limits=limits) as receiver:
        logger, handler = shipping_logger(receiver, handlers, flush_interval=30)
        for i in range(2000):
            logger.info("%s", "z" * 150, extra={"id": str(i)})  # ~450 KB: one batch, 4x the burst
        assert handler.flush(60) == 0
        stats = exact(receiver, handler, 2000)
        assert stats["sent"] == 2000
        first = receiver.requests[0]
        assert first.status == 429 and first.message.startswith("ingestion rate limit exceeded for user fake")


def test_an_entry_larger_than_the_burst_is_dropped_and_the_limit_named(handlers, caplog):
    limits = Limits(ingestion_rate_bytes=5_000, ingestion_burst_bytes=10_000)
    with LokiReceiver(limits=limits) as receiver:
        logger, handler = shipping_logger(receiver, handlers, flush_interval=30)
        log_ids(logger, range(5))
        logger.info("%s", "w" * 50_000, extra={"id": "huge"})
        log_ids(logger, range(5, 10))
        with caplog.at_level(logging.WARNING, logger="telemetry_client"):
            assert handler.flush(60) == 0
        stats = exact(receiver, handler, 11)
        assert stats["sent"] == 10 and stats["dropped_by_reason"] == {"rate_limited": 1}
        assert "larger than the 5000 bytes/s it allows" in caplog.text


def test_entries_a_stream_limit_refuses_one_by_one_are_sent_again_alone(handlers):
    limits = Limits(per_stream_rate_bytes=2_000, per_stream_burst_bytes=3_000, rate_limit_whole_stream=False)
    with LokiReceiver(limits=limits) as receiver:
        logger, handler = shipping_logger(receiver, handlers, flush_interval=30)
        log_ids(logger, range(30))  # about 4 KB: what fits the 3 KB burst is stored, the rest refused by name
        assert handler.flush(30) == 0
        first = receiver.requests[0]
        assert first.status == 429 and 0 < first.accepted < 30 and first.refused <= 10
        stats = exact(receiver, handler, 30)
        assert stats["sent"] == 30
