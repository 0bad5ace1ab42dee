"""Caller cost of logging to Loki: our LokiHandler against python-logging-loki, and zero-loss throughput.

All handlers ship to the same local conformance receiver (tests/loki_receiver.py),
started in this process, in the same run. Prints:

* `logger.info()` wall time per call, p50 and p99 in microseconds, for our
  `LokiHandler`, python-logging-loki's `LokiHandler` (one blocking POST per record)
  and its `LokiQueueHandler` (a queue and a listener thread that POSTs one record
  at a time); for scale, the same call with a handler that does nothing (the cost
  of the standard logging machinery itself) and our `emit()` called directly;
* lines per second one process delivers with our handler: N lines logged as fast
  as possible, then `flush()`, checked against the receiver's count (zero loss).

Run: python bench/bench_loki_emit.py
"""

from __future__ import annotations

import gc
import logging
import queue
import time
import warnings

import logging_loki
from _common import caller_cost_us, dedicated_logger
from loki_receiver import LokiReceiver

from telemetry_client.loki import LokiHandler

SAMPLES_OURS = 50_000
SAMPLES_QUEUE = 5_000  # its listener then POSTs every record one by one, so keep this modest
SAMPLES_BLOCKING = 1_000  # one HTTP round trip per call
THROUGHPUT_LINES = 100_000
WARMUP = 500
TAGS = {"service": "bench"}


def _call(logger: logging.Logger):
    return lambda: logger.info("step %d loss %.4f", 12, 0.4321)


def _measure(call, samples: int) -> tuple[float, float]:
    for _ in range(WARMUP):
        call()
    gc.collect()
    return caller_cost_us(call, samples)


class _NoopHandler(logging.Handler):
    """Does nothing: what remains is the standard library's own cost of a logging call."""

    def handle(self, record: logging.LogRecord) -> bool:
        return True

    def emit(self, record: logging.LogRecord) -> None:
        pass


def bench_baseline() -> tuple[float, float]:
    return _measure(_call(dedicated_logger(_NoopHandler())), SAMPLES_OURS)


def _measure_delivered(handler: LokiHandler, call) -> tuple[float, float]:
    """Caller cost of our handler, then a check that every line measured reached the receiver."""
    result = _measure(call, SAMPLES_OURS)
    left = handler.close(30)
    assert left == 0, f"{left} lines undelivered"
    return result


def bench_ours(receiver: LokiReceiver) -> tuple[float, float]:
    handler = LokiHandler(receiver.base_url, TAGS)
    return _measure_delivered(handler, _call(dedicated_logger(handler)))


def bench_ours_emit_only(receiver: LokiReceiver) -> tuple[float, float]:
    handler = LokiHandler(receiver.base_url, TAGS)
    record = logging.LogRecord("bench", logging.INFO, __file__, 1, "step %d loss %.4f", (12, 0.4321), None)
    return _measure_delivered(handler, lambda: handler.emit(record))


def bench_theirs_blocking(receiver: LokiReceiver) -> tuple[float, float]:
    handler = logging_loki.LokiHandler(url=receiver.push_url, tags=TAGS, version="1")
    result = _measure(_call(dedicated_logger(handler)), SAMPLES_BLOCKING)
    handler.close()
    return result


def bench_theirs_queue(receiver: LokiReceiver) -> tuple[float, float, float]:
    handler = logging_loki.LokiQueueHandler(queue.Queue(-1), url=receiver.push_url, tags=TAGS, version="1")
    result = _measure(_call(dedicated_logger(handler)), SAMPLES_QUEUE)
    start = time.perf_counter()
    handler.listener.stop()  # waits until the listener has POSTed every queued record
    drain = time.perf_counter() - start
    handler.close()
    return result[0], result[1], drain


def bench_throughput(receiver: LokiReceiver) -> tuple[float, float]:
    """(lines/s delivered end to end, lines/s accepted by emit) with zero loss."""
    receiver.reset()
    handler = LokiHandler(receiver.base_url, TAGS)
    logger = dedicated_logger(handler)
    gc.collect()
    start = time.perf_counter()
    for i in range(THROUGHPUT_LINES):
        logger.info("line %d", i)
    emitted = time.perf_counter()
    left = handler.flush(120)
    delivered = time.perf_counter()
    stats = handler.stats()
    handler.close(5)
    count = receiver.count()
    assert left == 0 and stats["dropped"] == 0, stats
    assert count == THROUGHPUT_LINES, f"receiver has {count} of {THROUGHPUT_LINES} lines"
    return THROUGHPUT_LINES / (delivered - start), THROUGHPUT_LINES / (emitted - start)


def main() -> None:
    warnings.simplefilter("ignore", DeprecationWarning)
    with LokiReceiver(strict_order=True) as receiver:
        baseline = bench_baseline()
        ours = bench_ours(receiver)
        emit_only = bench_ours_emit_only(receiver)
        queued = bench_theirs_queue(receiver)
        blocking = bench_theirs_blocking(receiver)
        delivered, accepted = bench_throughput(receiver)
        refused = receiver.refused
    print("logger.info() caller cost with one Loki handler (µs), receiver on 127.0.0.1 in the same process")
    print(f"{'':44} {'calls':>7} {'p50':>8} {'p99':>8}")
    rows = (
        ("stdlib logging alone (no-op handler)", SAMPLES_OURS, baseline),
        ("telemetry_client LokiHandler", SAMPLES_OURS, ours),
        ("  its emit() called directly", SAMPLES_OURS, emit_only),
        ("python-logging-loki LokiQueueHandler", SAMPLES_QUEUE, queued[:2]),
        ("python-logging-loki LokiHandler", SAMPLES_BLOCKING, blocking),
    )
    for name, calls, (p50, p99) in rows:
        print(f"{name:44} {calls:7d} {p50:8.2f} {p99:8.2f}")
    print(f"LokiQueueHandler's listener needed {queued[2]:.2f} s afterwards to POST its {SAMPLES_QUEUE} queued records")
    print(
        f"throughput, {THROUGHPUT_LINES} lines, zero loss: {delivered:,.0f} lines/s delivered "
        f"(emit alone: {accepted:,.0f} lines/s)"
    )
    print(f"entries the receiver refused in the whole run: {len(refused)}")


if __name__ == "__main__":
    main()
