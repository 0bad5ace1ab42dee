"""The Loki handler against the conformance receiver: delivery, labels, body, context, limits, setup."""

from __future__ import annotations

import inspect
import io
import json
import logging
import subprocess
import sys
import threading
import uuid
from collections import Counter
from collections.abc import Callable, Iterator

import logging_loki
import pytest
from fault_server import fault_server
from loki_receiver import Limits, LokiReceiver

from telemetry_client import ConfigurationError
from telemetry_client._engine.shipping import BufferSettings, Channel, get_engine
from telemetry_client._loki.console import ONE_LINE_FORMAT, DropMessagesMatching, OneLineFormatter, console_handler
from telemetry_client._loki.context import bind, clear_context, current_context, log_context, unbind
from telemetry_client._loki.limits import TRUNCATION_MARKER
from telemetry_client.loki import LokiHandler, LokiLogger, log_with_context, push_url, setup_loki_logger
from telemetry_client.metrics import MetricsLogger

FAST = BufferSettings(flush_interval=0.05, retry_base=0.02, retry_cap=0.1)
STANDARD_LABELS = {"service", "environment", "host", "level", "uid", "role", "version"}


@pytest.fixture
def receiver() -> Iterator[LokiReceiver]:
    with LokiReceiver() as server:
        yield server


@pytest.fixture
def cleanup() -> Iterator[Callable]:
    """Register handlers or LokiLoggers to close (and detach) after the test."""
    things: list = []
    yield things.append
    for thing in things:
        if isinstance(thing, LokiLogger):
            for handler in list(thing.logger.handlers):
                thing.logger.removeHandler(handler)
                handler.close()
        thing.close(1)


def fresh_logger(level: int = logging.DEBUG) -> logging.Logger:
    logger = logging.getLogger(f"test.loki.{uuid.uuid4().hex[:8]}")
    logger.propagate = False
    logger.setLevel(level)
    return logger


def attach(receiver: LokiReceiver, cleanup: Callable, **kwargs) -> tuple[logging.Logger, LokiHandler]:
    handler = LokiHandler(receiver.base_url, {"service": "test"}, **{"buffer": FAST, **kwargs})
    cleanup(handler)
    logger = fresh_logger()
    logger.addHandler(handler)
    return logger, handler


def node(receiver: LokiReceiver, cleanup: Callable, **kwargs) -> LokiLogger:
    kwargs = {"console": False, "buffer": FAST, "logger_name": f"test.node.{uuid.uuid4().hex[:8]}", **kwargs}
    log = setup_loki_logger("miner", 7, "1.2.3", "testnet", receiver.base_url, **kwargs)
    cleanup(log)
    return log


def bodies(receiver: LokiReceiver) -> list[dict]:
    return [entry.json() for entry in receiver.entries]


# ---- delivery, labels and the JSON line ------------------------------------------------


def test_setup_ships_lines_with_the_standard_labels_and_a_json_body(receiver, cleanup):
    log = node(receiver, cleanup, host="gpu-01")
    log.info("step %d done", 3)
    log.warning("slow")
    assert log.flush(10) == 0
    first, second = receiver.entries
    assert first.labels == {
        "service": "miner",
        "environment": "testnet",
        "host": "gpu-01",
        "uid": "7",
        "role": "miner",
        "version": "1.2.3",
        "level": "info",
    }
    assert second.labels["level"] == "warning"
    body = first.json()
    assert body["message"] == "step 3 done"
    assert body["level"] == "info"
    assert body["logger"] == log.logger.name
    assert body["thread"] == threading.current_thread().name
    assert isinstance(body["pid"], int)
    request = receiver.requests[0]
    assert request.headers["Content-Encoding"] == "gzip"
    assert request.headers["Content-Type"] == "application/json"


def test_extra_labels_and_role_are_labels_and_nothing_else_is(receiver, cleanup):
    log = node(receiver, cleanup, role="validator", labels={"network": "finney"})
    log.log_with_context("info", "hello", window=12, trace_id="abc")
    log.flush(10)
    (entry,) = receiver.entries
    assert set(entry.labels) == STANDARD_LABELS | {"network"}
    assert entry.labels["role"] == "validator" and entry.labels["network"] == "finney"
    assert entry.json()["window"] == 12 and entry.json()["trace_id"] == "abc"


def test_levels_become_five_lowercase_label_values(receiver, cleanup):
    logger, handler = attach(receiver, cleanup)
    logger.setLevel(1)
    for level in (5, logging.DEBUG, logging.INFO, 25, logging.WARNING, logging.ERROR, logging.CRITICAL, 60):
        logger.log(level, f"at {level}")
    handler.flush(10)
    labels = {json.loads(e.line)["message"]: e.labels["level"] for e in receiver.entries}
    assert labels == {
        "at 5": "debug",
        "at 10": "debug",
        "at 20": "info",
        "at 25": "warning",
        "at 30": "warning",
        "at 40": "error",
        "at 50": "critical",
        "at 60": "critical",
    }


def test_many_threads_every_line_arrives_exactly_once(receiver, cleanup):
    logger, handler = attach(receiver, cleanup)
    threads, per_thread = 8, 2_000
    start = threading.Barrier(threads)

    def work(t: int) -> None:
        start.wait()
        for i in range(per_thread):
            logger.info("line %s", f"{t}-{i}")

    workers = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert handler.flush(30) == 0
    ids = Counter(body["message"].split()[1] for body in bodies(receiver))
    assert len(ids) == threads * per_thread
    assert set(ids.values()) == {1}
    assert receiver.refused == [] and receiver.duplicates == 0  # in order within every push, nothing resent
    stats = handler.stats()
    assert stats["sent"] == threads * per_thread and stats["dropped"] == 0


def test_exception_traceback_is_in_the_body(receiver, cleanup):
    logger, handler = attach(receiver, cleanup)
    try:
        {}["missing"]
    except KeyError:
        logger.exception("lookup failed")
    handler.flush(10)
    body = bodies(receiver)[0]
    assert body["message"] == "lookup failed"
    assert "Traceback (most recent call last)" in body["exception"]
    assert "KeyError: 'missing'" in body["exception"]


def test_a_formatter_on_the_handler_sets_the_message(receiver, cleanup):
    logger, handler = attach(receiver, cleanup)
    handler.setFormatter(logging.Formatter("[%(levelname)s] %(message)s"))
    logger.error("disk full")
    handler.flush(10)
    assert bodies(receiver)[0]["message"] == "[ERROR] disk full"


def test_values_json_cannot_encode_still_make_a_valid_line(receiver, cleanup):
    logger, handler = attach(receiver, cleanup)
    circular: dict = {}
    circular["self"] = circular
    logger.info(
        "odd values",
        extra={"nan": float("nan"), "inf": float("-inf"), "blob": b"\xffbytes", "obj": object(), "loop": circular},
    )
    logger.info("surrogate \udcff in a file name")
    handler.flush(10)
    first, second = bodies(receiver)
    assert first["nan"] == "NaN" and first["inf"] == "-Infinity"
    assert first["blob"] == "\ufffdbytes"
    assert first["obj"].startswith("<object object")
    assert second["message"] == "surrogate \ufffd in a file name"


def test_structured_metadata_carries_context_as_strings(receiver, cleanup):
    logger, handler = attach(receiver, cleanup, structured_metadata=True)
    with log_context(step=5, trace_id="abc"):
        logger.info("with metadata", extra={"loss": 0.25, "weird key!": "x"})
    logger.info("no context")
    handler.flush(10)
    first, second = receiver.entries
    assert first.metadata == {"step": "5", "trace_id": "abc", "loss": "0.25", "weird_key_": "x"}
    assert second.metadata is None


# ---- context ------------------------------------------------------------------------------


def test_extra_log_context_and_log_with_context_all_reach_the_body(receiver, cleanup):
    log = node(receiver, cleanup)
    with log_context(trace_id="t-1", step=1):
        log.info("from extra", extra={"batch": 4})
        log.log_with_context("info", "from call", step=2, loss=0.5)
        log_with_context("warning", "module level", peer="p9")
    log.flush(10)
    extra, call, module = bodies(receiver)
    assert (extra["trace_id"], extra["step"], extra["batch"]) == ("t-1", 1, 4)
    assert (call["trace_id"], call["step"], call["loss"]) == ("t-1", 2, 0.5)  # the call's value wins
    assert (module["message"], module["peer"], module["level"]) == ("module level", "p9", "warning")


def test_reserved_keys_in_context_get_a_prefix(receiver, cleanup):
    log = node(receiver, cleanup)
    log.log_with_context("info", "real message", message="shadow", level="x", pid=0, logger="y")
    log.flush(10)
    body = bodies(receiver)[0]
    assert body["message"] == "real message" and body["level"] == "info"
    assert (body["ctx_message"], body["ctx_level"], body["ctx_pid"], body["ctx_logger"]) == ("shadow", "x", 0, "y")


def test_log_with_context_reports_the_callers_location():
    captured: list[logging.LogRecord] = []
    logger = fresh_logger()
    handler = logging.Handler()
    handler.emit = captured.append  # type: ignore[method-assign]
    logger.addHandler(handler)
    LokiLogger(logger).log_with_context("info", "here")
    assert captured[0].funcName == "test_log_with_context_reports_the_callers_location"


def test_context_bound_on_one_thread_never_reaches_another(receiver, cleanup):
    logger, handler = attach(receiver, cleanup)
    bound, logged = threading.Event(), threading.Event()

    def binder() -> None:
        with log_context(secret="thread-a"):
            bind(also="thread-a")
            bound.set()
            logged.wait(10)
            logger.info("from a")

    def other() -> None:
        bound.wait(10)
        logger.info("from b")
        logged.set()

    threads = [threading.Thread(target=binder), threading.Thread(target=other)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    handler.flush(10)
    by_message = {body["message"]: body for body in bodies(receiver)}
    assert by_message["from a"]["secret"] == "thread-a" and by_message["from a"]["also"] == "thread-a"
    assert "secret" not in by_message["from b"] and "also" not in by_message["from b"]


def test_context_is_captured_when_logging_not_when_sending(receiver, cleanup):
    logger, handler = attach(receiver, cleanup, buffer=BufferSettings(flush_interval=30))
    with log_context(step=1):
        logger.info("first")
    with log_context(step=2):
        handler.flush(10)  # encoded now, long after the record was logged
    assert bodies(receiver)[0]["step"] == 1


def test_bind_unbind_and_clear():
    clear_context()
    bind(a=1, b=2)
    unbind("a", "not-bound")
    assert dict(current_context()) == {"b": 2}
    with log_context(c=3):
        assert dict(current_context()) == {"b": 2, "c": 3}
    assert dict(current_context()) == {"b": 2}
    clear_context()
    assert dict(current_context()) == {}


# ---- labels and limits ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "labels",
    [
        {"bad-name": "x"},
        {"1starts_with_digit": "x"},
        {"__reserved": "x"},
        {"level": "x"},  # set per record
        {"service": "other"},  # a standard label
        {f"extra_{i}": "v" for i in range(9)},  # 7 standard + level... over 15
        {"big": "v" * 2049},
    ],
)
def test_invalid_extra_labels_are_a_configuration_error_at_setup(receiver, labels):
    with pytest.raises(ConfigurationError):
        setup_loki_logger("miner", 1, "1", "test", receiver.base_url, labels=labels, console=False)


def test_the_largest_allowed_label_set_is_accepted_by_loki(receiver, cleanup):
    log = node(receiver, cleanup, labels={f"extra_{i}": "v" for i in range(8)})
    log.info("fifteen labels")
    log.flush(10)
    assert len(receiver.entries[0].labels) == 15 and receiver.refused == []


def test_an_over_long_line_is_truncated_with_a_marker_and_stays_json(cleanup):
    with LokiReceiver(limits=Limits(max_line_size=2048)) as receiver:
        logger, handler = attach(receiver, cleanup, max_line_bytes=2048)
        logger.info("x" * 10_000, extra={"step": 9})
        logger.info("short")
        handler.flush(10)
        long_entry, short_entry = receiver.entries
        assert len(long_entry.line.encode()) <= 2048
        body = long_entry.json()
        assert body["message"].startswith("xxxx") and body["message"].endswith(TRUNCATION_MARKER)
        assert body["truncated"] is True and body["step"] == 9
        assert "truncated" not in short_entry.json()
        assert receiver.refused == []
        assert handler.truncated == 1 and handler.stats()["truncated"] == 1
        assert handler.stats()["dropped"] == 0


def test_a_huge_context_is_truncated_too(cleanup):
    with LokiReceiver(limits=Limits(max_line_size=4096)) as receiver:
        logger, handler = attach(receiver, cleanup, max_line_bytes=4096)
        logger.info("big context", extra={"values": list(range(5000)), "text": "é" * 3000})
        handler.flush(10)
        (entry,) = receiver.entries
        assert len(entry.line.encode()) <= 4096
        assert entry.json()["message"] == "big context"


# ---- what the handler must ignore, and must never do ----------------------------------------


def test_own_warnings_and_sender_thread_records_are_not_shipped(receiver, cleanup):
    logger, handler = attach(receiver, cleanup)
    own = logging.getLogger("telemetry_client.test_probe")
    own.addHandler(handler)
    own.propagate = False
    try:
        own.warning("the client's own warning")

        class ProbeSink:
            """A channel whose encoder logs, as a library would on the sender thread."""

            name = "probe"
            transport = handler.channel.sink.transport

            def encode(self, record, emit, drop) -> None:
                logger.info("logged on the sender thread")

            def build_body(self, items) -> bytes:
                return b""

            def on_rejected(self, items, response):
                return None

            def on_idle(self, now: float) -> None:
                pass

        probe = Channel(ProbeSink(), FAST)
        probe.submit("anything")
        probe.flush(5)
        probe.close(1)
        logger.info("normal line")
        handler.flush(10)
    finally:
        own.removeHandler(handler)
    assert [body["message"] for body in bodies(receiver)] == ["normal line"]


def test_emit_never_blocks_or_raises_without_a_server(cleanup):
    handler = LokiHandler("http://127.0.0.1:9", buffer=FAST, connect_timeout=0.2, read_timeout=0.2)
    cleanup(handler)
    logger = fresh_logger()
    logger.addHandler(handler)
    for i in range(1000):
        logger.info("nobody listens %d", i)
    assert handler.stats()["queued"] == 1000
    assert handler.close(0.3) > 0


def test_records_after_close_are_ignored(receiver, cleanup):
    logger, handler = attach(receiver, cleanup)
    logger.info("before")
    handler.close(5)
    logger.info("after")
    assert [e.json()["message"] for e in receiver.entries] == ["before"]
    assert handler.stats()["queued"] == 1


# ---- setup ----------------------------------------------------------------------------------


def test_setup_twice_keeps_one_handler_and_closes_the_previous(receiver, cleanup):
    name = f"test.twice.{uuid.uuid4().hex[:8]}"
    first = setup_loki_logger("miner", 1, "1", "t", receiver.base_url, logger_name=name, buffer=FAST)
    first.info("from the first setup")
    second = setup_loki_logger("miner", 1, "1", "t", receiver.base_url, logger_name=name, buffer=FAST)
    cleanup(second)
    logger = logging.getLogger(name)
    assert sum(isinstance(h, LokiHandler) for h in logger.handlers) == 1
    assert len(logger.handlers) == 2  # Loki and console
    assert first.loki_handler.channel.closed
    assert receiver.lines() and bodies(receiver)[0]["message"] == "from the first setup"  # drained on replace
    second.info("from the second")
    second.flush(10)
    assert [b["message"] for b in bodies(receiver)] == ["from the first setup", "from the second"]


def test_url_and_credentials_come_from_the_environment_when_called(monkeypatch, cleanup):
    with LokiReceiver(basic_auth=("node", "pw"), auth_enabled=True) as receiver:
        monkeypatch.setenv("LOKI_URL", receiver.base_url)
        monkeypatch.setenv("LOKI_USERNAME", "node")
        monkeypatch.setenv("LOKI_PASSWORD", "pw")
        monkeypatch.setenv("LOKI_TENANT_ID", "tenant-a")
        log = setup_loki_logger(
            "miner", 1, "1", "t", console=False, buffer=FAST, logger_name=f"test.env.{uuid.uuid4().hex[:8]}"
        )
        cleanup(log)
        log.info("authenticated")
        assert log.flush(10) == 0
        assert receiver.entries[0].tenant == "tenant-a"


def test_bearer_token_is_sent(cleanup):
    with LokiReceiver(bearer_token="tok") as receiver:
        log = node(receiver, cleanup, bearer_token="tok")
        log.info("x")
        log.flush(10)
        assert receiver.count() == 1


def test_no_url_turns_loki_off_and_counts_unless_strict(monkeypatch):
    monkeypatch.delenv("LOKI_URL", raising=False)
    monkeypatch.delenv("TELEMETRY_STRICT", raising=False)
    log = setup_loki_logger("miner", 1, "1", "t", console=False, logger_name="test.off")
    assert log.loki_handler is None and "LOKI_URL" in log.settings.disabled_reason
    log.info("counted, not sent")
    log.debug("below the level: not counted")
    assert log.stats()["dropped_by_reason"] == {"disabled": 1}
    with pytest.raises(ConfigurationError, match="LOKI_URL"):
        setup_loki_logger("miner", 1, "1", "t", console=False, strict=True, logger_name="test.strict")
    log = setup_loki_logger("miner", 1, "1", "t", enabled=False, console=False, logger_name="test.disabled")
    assert log.loki_handler is None
    log.info("goes nowhere, raises nothing")


def test_push_url_accepts_base_or_full_urls():
    assert push_url("http://loki:3100") == "http://loki:3100/loki/api/v1/push"
    assert push_url("https://logs.example.org/") == "https://logs.example.org/loki/api/v1/push"
    assert push_url("https://gw.example.org/tenant-a") == "https://gw.example.org/tenant-a/loki/api/v1/push"
    assert push_url("http://loki:3100/loki/api/v1/push") == "http://loki:3100/loki/api/v1/push"
    for bad in ("loki:3100", "ftp://loki", "http://loki:3100/api/prom/push"):
        with pytest.raises(ConfigurationError):
            push_url(bad)


def test_credentials_in_the_url_become_basic_auth_and_leave_the_url(cleanup):
    with LokiReceiver(basic_auth=("user", "p@ss")) as receiver:
        handler = LokiHandler(f"http://user:p%40ss@127.0.0.1:{receiver.port}", buffer=FAST)
        cleanup(handler)
        assert "p@ss" not in handler.url and "p%40ss" not in repr(handler)
        logger = fresh_logger()
        logger.addHandler(handler)
        logger.info("x")
        handler.flush(10)
        assert receiver.count() == 1


def test_metrics_logger_writes_the_handlers_counters_as_self_metrics(receiver, cleanup):
    with fault_server() as influx:
        metrics = MetricsLogger(url=influx.url, token="t", uid=1, role="miner", self_metrics_interval=0.05, buffer=FAST)
        cleanup(metrics)
        log = node(receiver, cleanup, metrics_logger=metrics)
        log.info("counted")
        log.flush(10)
        lines = influx.wait_for_lines(1, timeout=10)
        assert any(line.startswith(b"telemetry_client,") and b"sink=loki" in line for line in lines)


def test_filters_drop_the_subtensor_warning_by_default_and_custom_patterns(receiver, cleanup):
    log = node(receiver, cleanup)
    log.warning("Verify your local subtensor is running on port 9944")
    log.info("kept")
    log.flush(10)
    assert [b["message"] for b in bodies(receiver)] == ["kept"]

    receiver.reset()
    log = node(receiver, cleanup, filters=[DropMessagesMatching(["heartbeat", __import__("re").compile(r"peer \d+")])])
    log.info("heartbeat ok")
    log.info("peer 12 slow")
    log.warning("Verify your local subtensor is running on port 9944")  # default filter replaced
    log.flush(10)
    assert [b["message"] for b in bodies(receiver)] == ["Verify your local subtensor is running on port 9944"]


def test_console_is_one_plain_line_per_record_when_not_a_terminal():
    stream = io.StringIO()
    handler = console_handler(logging.INFO, stream)
    assert type(handler) is logging.StreamHandler and isinstance(handler.formatter, OneLineFormatter)
    assert handler.formatter._fmt == ONE_LINE_FORMAT
    logger = fresh_logger()
    logger.addHandler(handler)
    try:
        raise ValueError("bad\nvalue")
    except ValueError:
        logger.exception("two\nlines")
    output = stream.getvalue()
    assert output.count("\n") == 1 and "two\\nlines" in output and "ValueError: bad\\nvalue" in output


def test_console_uses_rich_on_a_terminal():
    from rich.logging import RichHandler

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    assert isinstance(console_handler(logging.INFO, Terminal()), RichHandler)


# ---- compatibility and import ------------------------------------------------------------------


def test_constructor_matches_python_logging_loki(cleanup):
    ours = list(inspect.signature(LokiHandler).parameters)[:4]
    theirs = list(inspect.signature(logging_loki.LokiHandler).parameters)[:4]
    assert ours == theirs == ["url", "tags", "auth", "version"]
    with LokiReceiver(basic_auth=("u", "p")) as receiver:
        handler = LokiHandler(receiver.push_url, {"application": "trainer"}, ("u", "p"), "1")
        cleanup(handler)
        logger = fresh_logger()
        logger.addHandler(handler)
        logger.info("switched by changing an import", extra={"tags": {"request": "r1"}})
        handler.flush(10)
        (entry,) = receiver.entries
        assert entry.labels == {"application": "trainer", "level": "info"}
        assert entry.json()["tags"] == {"request": "r1"}  # per-record tags stay out of the labels
    with pytest.raises(ConfigurationError):
        LokiHandler("http://127.0.0.1:3100", version="0")


@pytest.mark.slow
def test_importing_configures_nothing_and_starts_no_thread():
    code = (
        "import logging, threading, telemetry_client.loki\n"
        "import telemetry_client._loki.console, telemetry_client._loki.context\n"
        "assert not logging.getLogger().handlers\n"
        "assert threading.active_count() == 1, threading.enumerate()\n"
        "import telemetry_client._engine.shipping as s\n"
        "assert s._engine is None\n"
        "assert 'rich' not in __import__('sys').modules\n"
    )
    env = {"PATH": "/usr/bin:/bin", "LOKI_URL": "http://127.0.0.1:1"}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=_root())
    assert result.returncode == 0, result.stderr


def _root() -> str:
    import pathlib

    return str(pathlib.Path(__file__).resolve().parent.parent)


def test_the_engine_thread_is_shared(receiver, cleanup):
    (first_logger, first), (second_logger, second) = attach(receiver, cleanup), attach(receiver, cleanup)
    first_logger.info("one")
    second_logger.info("two")
    assert first.flush(10) == 0 and second.flush(10) == 0
    assert first.channel._engine is second.channel._engine is get_engine()
    assert sum(t.name == "telemetry-sender" for t in threading.enumerate()) == 1
