"""Fault injection against a local endpoint: refused, timeouts, 5xx/429 with Retry-After, 400, outages."""

from __future__ import annotations

import email.utils
import time

import pytest
from fault_server import Reply, fault_server
from servers import free_port

from telemetry_client import BufferSettings
from telemetry_client._engine.retry import backoff_delay, parse_retry_after
from telemetry_client.metrics import MetricsLogger

FAST = dict(flush_interval=0.05, retry_base=0.02, retry_cap=0.1)


def _logger(url: str, **buffer: object) -> MetricsLogger:
    settings = BufferSettings(**{**FAST, **buffer})
    return MetricsLogger(
        url=url,
        api_version=1,
        database="d",
        buffer=settings,
        self_metrics_interval=None,
        read_timeout=0.5,
        connect_timeout=0.5,
    )


def _ids(lines: list[bytes]) -> list[int]:
    return [int(line.split(b"i=")[1].split(b" ")[0]) for line in lines]


def test_5xx_and_429_are_retried_and_nothing_is_lost():
    with fault_server() as server:
        server.then(Reply(500), Reply(503, retry_after="0"), Reply(429, retry_after="0"), Reply(502))
        logger = _logger(server.url)
        for i in range(100):
            logger.log("m", fields={"i": i})
        assert logger.flush(20) == 0
        stats = logger.stats()
        assert stats["retries"] == 4
        assert stats["dropped"] == 0
        assert sorted(_ids(server.lines)) == list(range(100))
        assert server.requests[:4] == [500, 503, 429, 502]
        logger.close(1)


@pytest.mark.slow
def test_retry_after_is_honoured_over_the_backoff():
    with fault_server() as server:
        server.then(Reply(503, retry_after="2"))
        logger = _logger(server.url)
        logger.log("m", fields={"i": 1})
        time.sleep(0.5)  # well past the 0.1 s backoff cap, well before Retry-After
        assert server.lines == [] and server.requests == [503]
        assert logger.flush(10) == 0
        assert len(server.lines) == 1
        logger.close(1)


def test_400_is_not_retried_and_is_counted_as_rejected():
    with fault_server() as server:
        server.then(Reply(400, body=b'{"error":"partial write: field type conflict"}'))
        logger = _logger(server.url)
        for i in range(10):
            logger.log("m", fields={"i": i})
        assert logger.flush(10) == 0
        stats = logger.stats()
        assert stats["dropped_by_reason"] == {"rejected": 10}
        assert stats["retries"] == 0
        assert "field type conflict" in stats["last_error"]
        logger.log("m", fields={"i": 99})
        assert logger.flush(10) == 0
        assert _ids(server.lines) == [99]
        logger.close(1)


def test_read_timeouts_are_retried():
    with fault_server() as server:
        server.then(Reply(204, delay=1.5))  # longer than the 0.5 s read timeout
        logger = _logger(server.url)
        logger.log("m", fields={"i": 7})
        assert logger.flush(20) == 0
        assert logger.stats()["retries"] >= 1
        assert "Timeout" in logger.stats()["last_error"] or "timed out" in logger.stats()["last_error"]
        assert 7 in _ids(server.lines)  # the timed-out request may also have landed: at-least-once
        logger.close(1)


def test_outage_that_fits_the_buffer_loses_nothing():
    port = free_port()
    logger = _logger(f"http://127.0.0.1:{port}", max_items=10_000, batch_items=100)
    for i in range(2_000):
        logger.log("m", fields={"i": i})
    time.sleep(0.5)  # connection refused, again and again
    stats = logger.stats()
    assert stats["retries"] >= 1 and stats["sent"] == 0
    assert "Connection" in stats["last_error"] or "refused" in stats["last_error"]
    with fault_server(port) as server:
        assert logger.flush(20) == 0
        assert sorted(_ids(server.lines)) == list(range(2_000))
    assert logger.stats()["dropped"] == 0
    logger.close(1)


def test_outage_that_overflows_drops_the_oldest_and_counts_them():
    port = free_port()
    logger = _logger(f"http://127.0.0.1:{port}", max_items=500, batch_items=100)
    for i in range(2_000):
        logger.log("m", fields={"i": i})
    time.sleep(0.5)
    with fault_server(port) as server:
        assert logger.flush(20) == 0
        received = sorted(_ids(server.lines))
    stats = logger.stats()
    assert received[-1] == 1_999, "the newest points survive"
    assert 0 not in received, "the oldest points were dropped"
    assert stats["dropped_by_reason"]["buffer_full"] == 2_000 - len(received)
    assert stats["sent"] == len(received)
    logger.close(1)


@pytest.mark.slow
def test_an_outage_holds_sealed_batches_compressed_only():
    """A sealed batch keeps only its gzip body, so the same max_bytes keeps many more points through an outage.

    Points of about 150 bytes: max_bytes 128 KiB holds fewer than 900 of them
    uncompressed (as sealed batches once did, lines and body), their gzip bodies
    several thousand.
    """
    port = free_port()
    max_bytes = 128 * 1024
    logger = _logger(f"http://127.0.0.1:{port}", max_bytes=max_bytes, batch_bytes=32 * 1024, batch_items=500)
    fields = {f"field_{k}": k * 0.5 for k in range(9)}
    points = 30_000
    for i in range(points):
        logger.log("outage", fields={**fields, "i": i})
        if i % 100 == 99:
            time.sleep(0.005)  # the pace of a training loop: the sender encodes and seals as it goes
    time.sleep(0.5)  # connection refused, again and again
    with fault_server(port) as server:
        assert logger.flush(30) == 0
        received = sorted(_ids(server.lines))
        raw_bytes = sum(len(line) + 1 for line in server.lines)
    stats = logger.stats()
    logger.close(1)
    assert received[-1] == points - 1, "the newest points survive"
    assert (stats["sent"], stats["dropped_by_reason"]) == (len(received), {"buffer_full": points - len(received)})
    assert raw_bytes > 4 * max_bytes, f"only {len(received)} points ({raw_bytes} bytes) kept in {max_bytes} bytes"


def test_a_batch_refused_twice_with_429_is_split_from_its_compressed_body():
    """InfluxDB Cloud answers 429 past its write rate; the batch, kept compressed, is sent in halves."""
    with fault_server() as server:
        server.then(Reply(429), Reply(429))
        logger = _logger(server.url, flush_interval=60)
        for i in range(6):
            logger.log("m", fields={"i": i})
        assert logger.flush(20) == 0
        stats = logger.stats()
        logger.close(1)
        assert server.requests == [429, 429, 204, 204]
        assert sorted(_ids(server.lines)) == list(range(6))
    assert (stats["sent"], stats["batches"], stats["dropped"]) == (6, 2, 0)


def test_buffered_data_past_max_age_expires_counted():
    port = free_port()
    logger = _logger(f"http://127.0.0.1:{port}", max_age=0.2)
    for i in range(10):
        logger.log("m", fields={"i": i})
    time.sleep(0.8)
    with fault_server(port) as server:
        logger.log("m", fields={"i": 100})
        assert logger.flush(10) == 0
        assert _ids(server.lines) == [100]
    assert logger.stats()["dropped_by_reason"] == {"expired": 10}
    logger.close(1)


def test_close_with_the_server_down_returns_and_counts_what_is_left():
    logger = _logger(f"http://127.0.0.1:{free_port()}")
    for i in range(100):
        logger.log("m", fields={"i": i})
    left = logger.close(timeout=1.0)
    assert left == 100
    assert logger.stats()["dropped_by_reason"]["shutdown"] == 100
    logger.log("m", fields={"i": 1})  # after close: counted, never raises, never buffered
    assert logger.stats()["dropped_by_reason"]["shutdown"] == 101
    assert logger.stats()["pending"] == 0


def test_close_against_a_hanging_server_returns():
    with fault_server() as server:
        server.then(*[Reply(204, delay=3.0)] * 3)
        logger = _logger(server.url)
        logger.log("m", fields={"i": 1})
        assert logger.close(timeout=0.5) in (0, 1)


def test_parse_retry_after_seconds_and_http_date():
    assert parse_retry_after("120") == 120.0
    now = time.time()
    assert parse_retry_after(email.utils.formatdate(now + 30, usegmt=True), now=now) == pytest.approx(30, abs=1)
    assert parse_retry_after(email.utils.formatdate(now - 30, usegmt=True), now=now) == 0.0
    assert parse_retry_after("soon") is None
    assert parse_retry_after(None) is None


def test_backoff_is_full_jitter_under_the_cap():
    delays = [backoff_delay(attempt, 0.5, 8.0) for attempt in range(1, 12) for _ in range(50)]
    assert all(0.0 <= d <= 8.0 for d in delays)
    assert max(backoff_delay(1, 0.5, 8.0) for _ in range(200)) <= 0.5
    assert max(delays) > 4.0, "later attempts reach up to the cap"


def test_close_while_a_batch_is_being_sealed_loses_nothing():
    """close() must see a batch the sender is sealing at that moment (it once counted it as shutdown)."""
    with fault_server() as server:
        logger = _logger(server.url)
        sink = logger._sink
        real_build_body = sink.build_body

        def slow_build_body(items):
            time.sleep(0.5)  # the batch is now in neither the partial batch nor the backlog
            return real_build_body(items)

        sink.build_body = slow_build_body
        for i in range(10):
            logger.log("m", fields={"i": i})
        time.sleep(0.25)  # the partial batch is sealed at 0.05 s: close lands mid-seal
        assert logger.close(10) == 0
        assert (logger.stats()["sent"], logger.stats()["dropped"]) == (10, 0)
        assert sorted(_ids(server.lines)) == list(range(10))


def test_lock_free_counter_counts_every_bump_from_many_threads():
    import threading

    from telemetry_client._engine.shipping import Counter

    counter = Counter()
    assert counter.value == 0
    threads = [threading.Thread(target=lambda: [counter.add() for _ in range(20_000)]) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert counter.value == 80_000
