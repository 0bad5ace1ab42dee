"""Fault injection against a local endpoint: refused, timeouts, 5xx/429 with Retry-After, 400, outages."""

from __future__ import annotations

import contextlib
import email.utils
import threading
import time
from collections.abc import Iterator

import pytest
from counters import assert_counters_add_up
from fault_server import Reply, fault_server
from servers import free_port, influxdb_v1_for_outages

from telemetry_client import BufferSettings
from telemetry_client._engine.retry import backoff_delay, parse_retry_after
from telemetry_client.metrics import MetricsLogger

FAST = dict(flush_interval=0.05, retry_base=0.02, retry_cap=0.1)


def _logger(url: str, read_timeout: float = 0.5, **buffer: object) -> MetricsLogger:
    settings = BufferSettings(**{**FAST, **buffer})
    return MetricsLogger(
        url=url,
        api_version=1,
        database="d",
        buffer=settings,
        self_metrics_interval=None,
        read_timeout=read_timeout,
        connect_timeout=0.5,
    )


@contextlib.contextmanager
def wake_calls(channel) -> Iterator[list[int]]:
    """The intake's length at each `wake.set()` of `channel`'s engine while the block runs."""
    engine = channel._engine
    calls: list[int] = []
    set_wake = engine.wake.set

    def recording_set() -> None:
        calls.append(len(channel._intake))
        set_wake()

    engine.wake.set = recording_set  # type: ignore[method-assign]
    try:
        yield calls
    finally:
        del engine.wake.set


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
        assert_counters_add_up(stats)
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
        assert_counters_add_up(stats)
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
        assert_counters_add_up(logger.stats())


def test_outage_that_fits_the_buffer_loses_nothing():
    port = free_port()
    logger = _logger(f"http://127.0.0.1:{port}", max_items=10_000, batch_items=100)
    for i in range(2_000):
        logger.log("m", fields={"i": i})
    time.sleep(0.5)  # connection refused, again and again
    stats = logger.stats()
    assert stats["retries"] >= 1 and stats["sent"] == 0
    assert "Connection" in stats["last_error"] or "refused" in stats["last_error"]
    assert_counters_add_up(stats)
    with fault_server(port) as server:
        assert logger.flush(20) == 0
        assert sorted(_ids(server.lines)) == list(range(2_000))
    assert logger.stats()["dropped"] == 0
    logger.close(1)
    assert_counters_add_up(logger.stats())


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
    assert received == list(range(2_000 - len(received), 2_000)), "exactly the oldest were dropped"
    assert_counters_add_up(stats)
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
    assert_counters_add_up(stats)
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
    assert_counters_add_up(stats)


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
    assert_counters_add_up(logger.stats())
    logger.close(1)


def test_close_with_the_server_down_returns_and_counts_what_is_left():
    logger = _logger(f"http://127.0.0.1:{free_port()}")
    for i in range(100):
        logger.log("m", fields={"i": i})
    left = logger.close(timeout=1.0)
    assert left == 100
    assert logger.stats()["dropped_by_reason"]["shutdown"] == 100
    assert_counters_add_up(logger.stats())
    logger.log("m", fields={"i": 1})  # after close: counted, never raises, never buffered
    assert logger.stats()["dropped_by_reason"]["shutdown"] == 101
    assert logger.stats()["pending"] == 0
    assert_counters_add_up(logger.stats())


def test_close_against_a_hanging_server_returns_and_counts_the_request_unconfirmed():
    """A request unanswered at the deadline may be stored: `unconfirmed`, never `shutdown`; its late answer counts."""
    with fault_server() as server:
        server.then(Reply(204, delay=1.0))
        logger = _logger(server.url, read_timeout=30)
        logger.log("m", fields={"i": 1})
        assert server.wait_until(lambda s: s.received == 1)
        assert logger.close(timeout=0.2) == 1
        stats = logger.stats()
        assert (stats["unconfirmed"], stats["sent"], stats["dropped"]) == (1, 0, 0)
        assert_counters_add_up(stats)
        assert server.wait_until(lambda s: s.requests == [204])
        deadline = time.monotonic() + 20
        while logger.stats()["sent"] == 0 and time.monotonic() < deadline:
            time.sleep(0.02)
        stats = logger.stats()
        assert (stats["unconfirmed"], stats["sent"], stats["dropped"]) == (0, 1, 0)
        assert_counters_add_up(stats)


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
        assert_counters_add_up(logger.stats())


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


# ---- outages, hanging servers and whole-batch refusals -------------------------------------

# Backoff settings where a full-jitter wait after one failure is up to 30 s: a test that
# delivers within its flush deadline proves the refused connection was tried again sooner.
SLOW_BACKOFF = dict(retry_base=30.0, retry_cap=30.0)


def test_a_refused_connection_is_tried_again_within_a_second_whatever_the_backoff():
    port = free_port()
    logger = _logger(f"http://127.0.0.1:{port}", **SLOW_BACKOFF)
    for i in range(100):
        logger.log("m", fields={"i": i})
    deadline = time.monotonic() + 20
    while logger.stats()["retries"] < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert logger.stats()["retries"] >= 2, "refused twice: a full-jitter wait of up to 30 s would not"
    with fault_server(port) as server:
        assert logger.flush(10) == 0
        assert sorted(_ids(server.lines)) == list(range(100))
    stats = logger.stats()
    logger.close(1)
    assert (stats["sent"], stats["dropped"]) == (100, 0)
    assert_counters_add_up(stats)


def test_the_edge_answering_502_for_a_store_that_is_down_is_tried_again_soon():
    """Caddy answers 502 Bad Gateway while the store behind it refuses: the same short wait as a refused connection."""
    with fault_server() as server:
        server.then(Reply(502), Reply(502), Reply(502))
        logger = _logger(server.url, **SLOW_BACKOFF)
        for i in range(10):
            logger.log("m", fields={"i": i})
        assert logger.flush(15) == 0
        stats = logger.stats()
        logger.close(1)
        assert server.requests == [502, 502, 502, 204]
        assert sorted(_ids(server.lines)) == list(range(10))
    assert (stats["sent"], stats["retries"], stats["dropped"]) == (10, 3, 0)
    assert_counters_add_up(stats)


def test_a_connection_reset_mid_request_is_tried_again_soon_whatever_the_backoff():
    """A server killed while it reads a request resets the connection: the next try is soon, as for a refusal."""
    with fault_server() as server:
        server.then(Reply(reset=True))
        logger = _logger(server.url, **SLOW_BACKOFF)
        for i in range(10):
            logger.log("m", fields={"i": i})
        assert logger.flush(15) == 0, "a full-jitter wait of up to 30 s would not deliver within 15 s"
        stats = logger.stats()
        logger.close(1)
        assert server.requests == [0, 204]
        assert sorted(_ids(server.lines)) == list(range(10))
    assert (stats["sent"], stats["retries"], stats["dropped"]) == (10, 1, 0)
    assert_counters_add_up(stats)


def test_the_sender_keeps_encoding_while_a_request_hangs():
    """Records must not pile up raw behind a request the server does not answer (the bounds then drop the oldest)."""
    with fault_server() as server:
        server.then(Reply(204, delay=2.0))
        logger = _logger(server.url, read_timeout=30, batch_items=100, flush_interval=60)
        for i in range(100):  # one batch: sent at once, and held by the server
            logger.log("m", fields={"i": i})
        assert server.wait_until(lambda s: s.received == 1)
        for i in range(100, 3_000):
            logger.log("m", fields={"i": i})
        channel = logger.channel
        deadline = time.monotonic() + 20
        while channel._intake and time.monotonic() < deadline:
            time.sleep(0.01)
        with server.lock:
            answered = list(server.requests)
        assert not channel._intake and answered == [], "encoded while the request was still unanswered"
        assert logger.flush(30) == 0
        stats = logger.stats()
        logger.close(1)
        assert sorted(_ids(server.lines)) == list(range(3_000))
    assert_counters_add_up(stats)


WHOLE_CONFLICT = Reply(400, body=b'{"error":"field type conflict"}\n')


def test_a_refusal_of_the_whole_batch_naming_no_line_is_split_until_the_bad_line_is_alone():
    """InfluxDB 1.x refuses a new shard's batch whole for one field type conflict: only that line is rejected.

    Four points, the last one bad: [0-3] refused whole, [0,1] stored, [2,3] refused
    whole, [2] stored, [3] refused alone. (The real server is in test_influx_partial_writes.py.)
    """
    with fault_server() as server:
        server.then(WHOLE_CONFLICT, Reply(204), WHOLE_CONFLICT, Reply(204), WHOLE_CONFLICT)
        logger = _logger(server.url, flush_interval=60)
        for i in range(4):
            logger.log("m", fields={"i": i})
        assert logger.flush(20) == 0
        stats = logger.stats()
        logger.close(1)
        assert server.requests == [400, 204, 400, 204, 400]
        assert sorted(_ids(server.lines)) == [0, 1, 2]
    assert (stats["sent"], stats["dropped_by_reason"], stats["retries"]) == (3, {"rejected": 1}, 0)
    assert "field type conflict" in stats["last_error"]
    assert_counters_add_up(stats)


def test_field_values_left_out_do_not_break_the_counters():
    """A NaN field is counted `non_finite` while its point is sent: `dropped_values` keeps the identity."""
    with fault_server() as server:
        logger = _logger(server.url)
        logger.log("m", fields={"i": 1, "x": float("nan")})  # sent without x
        logger.log("m", fields={"x": float("nan")})  # no field left: dropped whole (no_fields)
        logger.log("m", fields={"i": 2}, sample_rate=0.0)  # sampled out
        assert logger.flush(10) == 0
        logger.close(1)
        logger.log("m", fields={"i": 3})  # after close
        stats = logger.stats()
    assert stats["dropped_by_reason"] == {"non_finite": 2, "no_fields": 1, "sampled_out": 1, "shutdown": 1}
    assert (stats["queued"], stats["sent"], stats["dropped_values"]) == (4, 1, 2)
    assert_counters_add_up(stats)


TS = 1_700_000_000_000_000_000


def _log_paced(logger: MetricsLogger, first: int, count: int, rate: float) -> int:
    """Log points `first`.. at `rate` points/s (a training loop's pace); return the next id."""
    began = time.monotonic()
    for i in range(first, first + count):
        logger.log("m", fields={"i": i}, timestamp=TS + i)
        if i % 100 == 99:
            time.sleep(max(0.0, began + (i - first + 1) / rate - time.monotonic()))
    return first + count


def _stored_ids(server, database: str) -> list[int]:
    return sorted(int(row["i"]) for row in server.rows('SELECT "i" FROM "m"', database))


@pytest.mark.slow
def test_an_outage_that_fits_the_buffer_loses_nothing_on_influxdb():
    """InfluxDB killed, then restarted: delivery resumes soon enough that the buffer never overflows.

    A full-jitter wait of up to 30 s after the first refusal (SLOW_BACKOFF) would
    outlast the room left: 4,000 points buffered when the server is back, 2,000/s
    more, max_items 12,000. A refused connection is tried again within a second.
    """
    with influxdb_v1_for_outages() as server:
        server.create_database("d")
        logger = MetricsLogger(
            url=server.url,
            database="d",
            api_version=1,
            self_metrics_interval=None,
            buffer=BufferSettings(max_items=12_000, batch_items=1_000, **SLOW_BACKOFF),
        )
        logged = _log_paced(logger, 0, 2_000, rate=2_000)
        server.kill()
        logged = _log_paced(logger, logged, 4_000, rate=2_000)
        deadline = time.monotonic() + 30  # a request in flight at the kill is reset; the next one is refused
        while "refused" not in (logger.stats()["last_error"] or "") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert logger.stats()["sent"] < logged and "refused" in logger.stats()["last_error"]
        server.start()  # returns once it answers
        logged = _log_paced(logger, logged, 10_000, rate=2_000)
        assert logger.flush(60) == 0
        stats = logger.stats()
        logger.close(1)
        assert _stored_ids(server, "d") == list(range(logged))
    assert (stats["sent"], stats["dropped"]) == (logged, 0)
    assert_counters_add_up(stats)


@pytest.mark.slow
def test_callers_that_never_pause_still_get_the_senders_share_delivered(influx_db):
    """Threads logging without pause outrun the sender: their oldest records go, not the batches it encoded.

    Dropping a batch the sender has encoded but not yet sent wastes its share of
    the interpreter: with the intake full, every new batch would be the oldest
    data and be dropped, and little would reach the server until the callers stop.
    The callers spin until ten batches are delivered (or 60 s pass); most of what
    the sender encoded must have been sent.
    """
    server, database = influx_db
    logger = MetricsLogger(
        url=server.url,
        database=database,
        api_version=1,
        self_metrics_interval=None,
        buffer=BufferSettings(max_items=20_000, batch_items=1_000),
    )
    fields = {f"f{k}": k * 1.5 for k in range(10)}  # a training step's worth: encoding costs more than queueing
    stop = threading.Event()
    logged = [0, 0]

    def spin(thread: int) -> None:
        count = 0
        while not stop.is_set():
            for _ in range(100):
                logger.log("m", {"thread": str(thread)}, {"i": count, **fields}, timestamp=TS + thread * 10**12 + count)
                count += 1
        logged[thread] = count

    threads = [threading.Thread(target=spin, args=(n,)) for n in range(2)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 60
    while logger.stats()["sent"] < 10_000 and time.monotonic() < deadline:
        time.sleep(0.1)
    spinning = logger.stats()
    stop.set()
    for thread in threads:
        thread.join()
    assert logger.flush(60) == 0
    stats = logger.stats()
    logger.close(1)
    assert spinning["sent"] >= 10_000, "batches reached the server while the callers spun"
    assert spinning["dropped_by_reason"].get("buffer_full", 0) > 0, "the callers outran the sender"
    encoded = logger.channel.drained
    assert stats["sent"] >= 0.75 * encoded, f"{encoded - stats['sent']} of {encoded} encoded records dropped"
    stored = server.rows('SELECT count("i") FROM "m"', database)[0]["count"]
    assert stored == stats["sent"] == sum(logged) - stats["dropped"]
    assert set(stats["dropped_by_reason"]) == {"buffer_full"}
    assert_counters_add_up(stats)


@pytest.mark.slow
def test_a_hanging_server_costs_only_the_oldest_points_counted_exactly():
    """InfluxDB paused (SIGSTOP) for several read timeouts, then resumed: the dropped points are the oldest ones.

    While the server accepts connections and answers none, every request times out;
    the sender keeps encoding, and beyond max_items the oldest data goes, encoded or
    not, except the batch whose request is unanswered (it may be stored, and is).
    So the points lost form one run, starting within one batch of where the hang
    began, and what the server stored is exactly what is counted sent.
    """
    batch = 500
    with influxdb_v1_for_outages() as server:
        server.create_database("d")
        logger = MetricsLogger(
            url=server.url,
            database="d",
            api_version=1,
            self_metrics_interval=None,
            read_timeout=3.0,
            buffer=BufferSettings(max_items=6_000, batch_items=batch, flush_interval=0.2),
        )
        logged = _log_paced(logger, 0, 1_000, rate=3_000)
        assert logger.flush(30) == 0
        server.pause()
        try:
            logged = _log_paced(logger, logged, 30_000, rate=3_000)  # 10 s: three read timeouts
            assert logger.stats()["dropped_by_reason"].get("buffer_full", 0) > 0
        finally:
            server.resume()
        logged = _log_paced(logger, logged, 3_000, rate=3_000)
        assert logger.flush(60) == 0
        stats = logger.stats()
        logger.close(1)
        stored = _stored_ids(server, "d")
    lost = sorted(set(range(logged)) - set(stored))
    assert lost, "the hang outgrew the buffer"
    assert lost == list(range(lost[0], lost[-1] + 1)), "one run of the oldest: no point dropped while an older was kept"
    assert lost[0] <= 1_000 + batch, "the run starts where the hang began"
    assert stored[-1] == logged - 1
    assert (stats["sent"], stats["dropped_by_reason"], stats["unconfirmed"]) == (
        len(stored),
        {"buffer_full": len(lost)},
        0,
    )
    assert_counters_add_up(stats)


def test_counters_add_up_at_every_moment_under_mixed_faults():
    """Two threads log through refusals, 5xx, 429, slow and timed-out answers and an overflowing buffer.

    The identity is read while they log and the sender works, after the flush and after close.
    """
    import random
    import threading

    rng = random.Random(7)
    choices = [Reply(503), Reply(429), Reply(204, delay=0.3), Reply(204), Reply(204), WHOLE_CONFLICT, Reply(400)]
    with fault_server() as server:
        server.then(*(rng.choice(choices) for _ in range(60)))
        logger = _logger(server.url, read_timeout=0.2, max_items=300, batch_items=50)

        def log(offset: int) -> None:
            for i in range(offset, offset + 3_000):
                fields = {"i": i, "x": float("nan")} if i % 7 == 0 else {"i": i}
                logger.log("m", fields=fields, sample_rate=0.5 if i % 11 == 0 else 1.0)
                if i % 100 == 0:
                    time.sleep(0.002)

        threads = [threading.Thread(target=log, args=(k * 10_000,)) for k in range(2)]
        for thread in threads:
            thread.start()
        reads = 0
        while any(thread.is_alive() for thread in threads):
            assert_counters_add_up(logger.stats())
            reads += 1
        for thread in threads:
            thread.join()
        logger.flush(30)
        assert_counters_add_up(logger.stats())
        logger.close(1)
        stats = logger.stats()
    assert reads > 10
    assert stats["dropped_by_reason"].get("buffer_full", 0) > 0 and stats["sent"] > 0
    assert_counters_add_up(stats)


def test_every_full_batch_wakes_the_sender_not_only_the_first():
    """A caller that fills a batch wakes the sender (`wake.set()`); the sender clears `woken` as it wakes.

    Were `woken` left set after the first batch, callers would never wake the sender
    again: each later batch would wait out the sender's sleep (up to 1 s, and records
    pile up meanwhile). No timing is asserted: the calls to `wake.set()` are counted.
    """
    from telemetry_client.testing import InMemoryDestination

    sent = InMemoryDestination()
    buffer = BufferSettings(batch_items=100, max_items=1_000, flush_interval=60)  # sealed full, never by age
    logger = MetricsLogger(uid=1, role="miner", destination=sent, self_metrics_interval=None, buffer=buffer)
    engine = logger.channel._engine
    try:
        for round_ in range(1, 4):
            with wake_calls(logger.channel) as sets, logger.channel._lock:  # the sender takes nothing meanwhile
                for i in range(100):
                    logger.log("m", fields={"i": float(i)})
            assert sets, f"round {round_}: the caller that filled a batch did not wake the sender"
            assert sent.flush(60) == 0
            assert len(sent.points) == 100 * round_
            deadline = time.monotonic() + 60
            while engine.woken and time.monotonic() < deadline:  # the sender clears it at its next turn
                time.sleep(0.01)
            assert not engine.woken, f"round {round_}: the sender left `woken` set"
    finally:
        logger.close(1)


def test_an_intake_bounded_below_a_batch_wakes_the_sender_at_half_of_it():
    """With a small `max_bytes` the intake holds less than a batch: half of it wakes the sender.

    Were only a full batch to wake it, the intake would fill and drop its oldest
    while the sender sleeps (up to 1 s), however fast the server
    (`bench/bench_small_buffer.py`). Counted, not timed: the intake's length at
    each `wake.set()` while it fills.
    """
    from telemetry_client.testing import InMemoryDestination

    sent = InMemoryDestination()
    buffer = BufferSettings(max_bytes=2 * 1024 * 1024, flush_interval=60)  # room for about 2,000 raw records
    logger = MetricsLogger(uid=1, role="miner", destination=sent, self_metrics_interval=None, buffer=buffer)
    channel = logger.channel
    engine = channel._engine
    fields = {f"f{k}": k * 0.5 for k in range(10)}
    logger.log("m", fields=fields)
    assert sent.flush(60) == 0
    deadline = time.monotonic() + 60
    # The sender bounds the intake by `max_bytes` after its first delivery, and clears `woken` at its next turn.
    while (channel._intake_limit >= channel.settings.batch_items or engine.woken) and time.monotonic() < deadline:
        time.sleep(0.01)
    try:
        # The sender takes nothing and changes no bound meanwhile: only a caller can wake it.
        with wake_calls(channel) as waiting_at_wake, channel._lock:
            limit = channel._intake_limit
            assert limit < channel.settings.batch_items
            for _ in range(limit - 1):
                logger.log("m", fields=fields)
            assert waiting_at_wake, f"{limit - 1} records waiting of {limit} and the sender not woken"
            assert waiting_at_wake[0] == limit // 2
        assert sent.flush(60) == 0
    finally:
        logger.close(1)
    assert len(sent.points) == limit
    assert logger.stats()["dropped_by_reason"] == {}


def test_a_batch_ready_to_send_goes_before_more_encoding():
    """With records waiting, the sender sends each batch once it is sealed, not after a longer round of encoding.

    Encoding ahead while a batch waits leaves the server idle (up to 0.2 s per round
    of 10,000 records while callers flood the interpreter). The server here answers
    at once, so the sender encodes only between requests: each request must start
    once its batch is sealed, within one chunk of records.
    """
    from telemetry_client._engine.shipping import OVERLAP_CHUNK
    from telemetry_client.testing import InMemoryDestination

    sent = InMemoryDestination()
    # Batches are sealed full, never by age, however slow the machine.
    buffer = BufferSettings(flush_interval=60)
    logger = MetricsLogger(uid=1, role="miner", destination=sent, self_metrics_interval=None, buffer=buffer)
    channel = logger.channel
    batch = channel.settings.batch_items
    encoded_at_start: list[int] = []
    transport = channel.sink.transport
    start = transport.start

    def recording_start(body: bytes, timeout_cap: float | None = None):
        encoded_at_start.append(channel.drained)
        return start(body, timeout_cap)

    transport.start = recording_start
    with channel._lock:  # the sender waits until every record is queued
        for i in range(4 * batch):
            logger.log("m", fields={"i": float(i)})
    try:
        assert sent.flush(60) == 0
    finally:
        logger.close(1)
    assert len(sent.points) == 4 * batch
    assert len(encoded_at_start) == 4
    for index, encoded in enumerate(encoded_at_start):
        assert encoded <= (index + 1) * batch + OVERLAP_CHUNK, encoded_at_start
