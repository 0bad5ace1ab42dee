"""`telemetry_client.testing`: what the loggers would have sent, recorded through the real encoder and buffer."""

from __future__ import annotations

import logging
import os

import pytest

from telemetry_client import (
    BufferSettings,
    ConfigurationError,
    Connection,
    LokiHandler,
    MetricsLogger,
    setup_loki_logger,
)
from telemetry_client.metrics import encode_lines
from telemetry_client.testing import InMemoryDestination, LogEntry, Point


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> InMemoryDestination:
    monkeypatch.setenv("INFLUXDB_URL", "http://127.0.0.1:9")  # must not be read: the destination replaces it
    monkeypatch.setenv("LOKI_URL", "http://127.0.0.1:9")
    return InMemoryDestination()


def test_a_text_field_holding_a_newline_is_read_back_whole(sent: InMemoryDestination) -> None:
    """Line protocol keeps a newline inside a quoted field: the body is not split at it."""
    logger = MetricsLogger(uid=7, role="miner", destination=sent, self_metrics_interval=None)
    logger.log("notes", fields={"note": "two\nlines", "loss": 0.5}, timestamp=1)
    logger.log("notes", fields={"note": "one line"}, timestamp=2)
    assert sent.flush(60) == 0
    assert [(point.fields, point.timestamp) for point in sent.points] == [
        ({"loss": 0.5, "note": "two\nlines"}, 1),
        ({"note": "one line"}, 2),
    ]
    assert logger.stats()["sent"] == 2
    logger.close(1)


def test_points_are_what_the_encoder_writes_with_the_loggers_tags(sent: InMemoryDestination) -> None:
    logger = MetricsLogger(uid=7, role="miner", prefix="V", destination=sent, self_metrics_interval=None)
    fields = {"loss": 0.25, "note": 'said "hi" \\ ok', "steps": 3, "flag": True}
    logger.log("training step", tags={"phase": "a b,c=d"}, fields=fields, timestamp=1_700_000_000_000_000_000)
    assert sent.flush() == 0
    [point] = sent.points
    assert point == Point(
        "Vtraining step",
        {"phase": "a b,c=d", "role": "miner", "uid": "7"},
        {"loss": 0.25, "note": 'said "hi" \\ ok', "steps": 3.0, "flag": 1.0},
        1_700_000_000_000_000_000,
        point.line,
    )
    [line] = encode_lines(
        [("Vtraining step", {"phase": "a b,c=d"}, fields, 1_700_000_000_000_000_000)], {"role": "miner", "uid": "7"}
    )
    assert point.line.encode() + b"\n" == line
    assert sent.requests[0].headers["Content-Encoding"] == "gzip"
    assert logger.stats()["sent"] == 1 and "memory://" in repr(logger)
    logger.close(1)


def test_drops_are_counted_as_in_production(sent: InMemoryDestination) -> None:
    logger = MetricsLogger(destination=sent, max_string_bytes=16, self_metrics_interval=None)
    logger.log("m", fields={"x": float("nan")})
    logger.log("m", fields={"s": "x" * 17})
    logger.log("bad\nname", fields={"x": 1})
    logger.log("m", fields={"x": 1}, timestamp=5)
    assert sent.flush() == 0
    assert [p.line for p in sent.points] == ["m x=1 5"]
    assert logger.stats()["dropped_by_reason"] == {"non_finite": 1, "no_fields": 2, "too_large": 1, "invalid": 1}
    logger.close(1)


def test_the_buffer_bound_applies(sent: InMemoryDestination) -> None:
    logger = MetricsLogger(
        destination=sent, buffer=BufferSettings(max_items=10, batch_items=10), self_metrics_interval=None
    )
    for i in range(200):
        logger.log("m", fields={"i": i}, timestamp=i + 1)
    assert sent.flush() == 0
    stats = logger.stats()
    assert stats["sent"] == len(sent.points) and stats["sent"] + stats["dropped_by_reason"].get("buffer_full", 0) == 200
    logger.close(1)


def test_loki_entries_carry_labels_line_and_metadata(sent: InMemoryDestination) -> None:
    node = setup_loki_logger(
        "miner", uid=7, destination=sent, console=False, structured_metadata=True, logger_name="testing.loki"
    )
    node.log_with_context("info", "window done", window=3)
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        node.logger.exception("failed")
    assert sent.flush() == 0
    info, error = sent.entries
    assert info.labels == {
        "service": "miner",
        "environment": "unknown",
        "host": info.labels["host"],
        "uid": "7",
        "role": "miner",
        "level": "info",
    }
    assert (info.record["message"], info.record["window"], info.metadata) == ("window done", 3, {"window": "3"})
    assert isinstance(info, LogEntry) and info.timestamp > 0
    assert error.labels["level"] == "error" and "RuntimeError: boom" in error.record["exception"]
    assert node.settings.url == sent.url and node.settings.setting("environment").source == "default"
    node.close(1)


def test_one_destination_serves_metrics_and_a_bare_handler(sent: InMemoryDestination) -> None:
    logger = MetricsLogger(destination=sent, self_metrics_interval=None)
    handler = LokiHandler(tags={"app": "x"}, destination=sent)
    records = logging.getLogger("testing.bare")
    records.addHandler(handler)
    records.warning("hello")
    logger.log("m", fields={"x": 1}, timestamp=1)
    assert sent.flush() == 0
    assert [p.measurement for p in sent.points] == ["m"] and [e.record["message"] for e in sent.entries] == ["hello"]
    sent.clear()
    assert sent.points == [] and sent.entries == []
    records.removeHandler(handler)
    handler.close(1)
    logger.close(1)


def test_a_destination_and_a_server_are_not_given_together(sent: InMemoryDestination) -> None:
    with pytest.raises(ConfigurationError, match="url="):
        MetricsLogger(url="http://127.0.0.1:8086", destination=sent)
    with pytest.raises(ConfigurationError, match="url="):
        MetricsLogger(connection=Connection(url="http://127.0.0.1:8086"), destination=sent)
    with pytest.raises(ConfigurationError, match="not both"):
        LokiHandler("http://127.0.0.1:3100", destination=sent)
    with pytest.raises(ConfigurationError, match="url="):
        setup_loki_logger("miner", url="http://127.0.0.1:3100", destination=sent)
    with pytest.raises(ConfigurationError, match="needs the Loki url"):
        LokiHandler()
    assert os.environ["INFLUXDB_URL"]  # the fixture's variable was there all along, and never used
