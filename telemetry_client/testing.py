"""An in-memory destination for a node's own tests: what its loggers would have sent, without a server.

```python
from telemetry_client import MetricsLogger, setup_loki_logger
from telemetry_client.testing import InMemoryDestination

sent = InMemoryDestination()
metrics = MetricsLogger(uid=7, role="miner", destination=sent)
log = setup_loki_logger("miner", uid=7, destination=sent, console=False)
run_one_window(metrics, log)  # the node's code
sent.flush()
assert [p.fields["loss"] for p in sent.points_of("training_step")] == [...]
assert sent.entries[0].record["message"] == "window done"
```

Why a destination passed explicitly (`destination=` of `MetricsLogger`,
`setup_loki_logger` and `LokiHandler`) and not a `memory://` URL or a global
switch: a test sees in its own code where the data goes, nothing changes for a
logger built elsewhere in the process, and no INFLUXDB_*/LOKI_* variable of the
machine running the tests is read (a developer's shell pointing at a real server
cannot leak into a test, nor a test's points into that server). Everything else
is the production path: the logger's tags, the field typing rule, validation,
the encoder, the buffer and its bounds, batching and gzip, on the real sender
thread; only the HTTP request is replaced by decoding the body it would have
carried. So what `points` and `entries` hold is what the server would have been
sent, and what the client drops (invalid fields, too large, buffer full) is
counted in the logger's `stats()` exactly as in production. The destination
answers every request as a server that stores everything (204).

The contract between a logger and a destination is `open(sink, headers,
compress)`, which returns the transport of one channel (see
`telemetry_client._engine.transport.Destination`); `InMemoryDestination` is the
one the client provides.
"""

from __future__ import annotations

import gzip
import json
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from telemetry_client._engine.shipping import Channel, get_engine
from telemetry_client._engine.transport import Response, gzip_body

__all__ = ["InMemoryDestination", "LogEntry", "Point", "Request"]

STORED = Response(204, b"", None)


@dataclass(frozen=True)
class Point:
    """One line of line protocol a MetricsLogger sent: as InfluxDB would store it."""

    measurement: str
    tags: dict[str, str]
    fields: dict[str, float | str]
    timestamp: int  # nanoseconds
    line: str  # the line as sent, without its newline


@dataclass(frozen=True)
class LogEntry:
    """One entry of a Loki push: its stream's labels, timestamp, line and structured metadata."""

    labels: dict[str, str]
    timestamp: int  # nanoseconds
    line: str
    metadata: dict[str, str] = field(default_factory=dict)

    @property
    def record(self) -> dict[str, Any]:
        """The JSON line decoded: `message`, `level`, `logger`, the context fields, `pid`, `thread`..."""
        return json.loads(self.line)


@dataclass(frozen=True)
class Request:
    """One request a logger made: which sink, its headers and its body (uncompressed)."""

    sink: str
    headers: dict[str, str]
    body: bytes


class _Answered:
    """The answer of an in-memory request: there at once."""

    def answered(self) -> bool:
        return True

    def finish(self) -> Response:
        return STORED


class _MemoryTransport:
    """A channel's transport that decodes each body into its destination instead of posting it."""

    def __init__(self, destination: InMemoryDestination, sink: str, headers: Mapping[str, str], compress: bool):
        self.destination = destination
        self.sink = sink
        self.url = f"{destination.url}/{sink}"
        self.headers = dict(headers)
        self.compress = compress
        if compress:
            self.headers["Content-Encoding"] = "gzip"

    def reset(self) -> None:
        pass

    def encode_body(self, body: bytes) -> bytes:
        return gzip_body(body) if self.compress else body

    def decode_body(self, body: bytes) -> bytes:
        return gzip.decompress(body) if self.compress else body

    def start(self, body: bytes, timeout_cap: float | None = None) -> _Answered:
        self.destination._record(Request(self.sink, dict(self.headers), self.decode_body(body)))
        return _Answered()

    def close(self) -> None:
        pass


class InMemoryDestination:
    """Records what the loggers given it (`destination=`) send; one may serve a MetricsLogger and a Loki logger.

    `points`, `entries` and `requests` are copies, safe to read while the sender
    thread delivers; call `flush()` first to wait for what was logged.
    """

    url = "memory://telemetry"

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._requests: list[Request] = []
        self._points: list[Point] = []
        self._entries: list[LogEntry] = []
        self._transports: list[_MemoryTransport] = []

    def __repr__(self) -> str:
        return f"<InMemoryDestination {len(self._points)} points, {len(self._entries)} log entries>"

    def open(self, sink: str, headers: Mapping[str, str], compress: bool) -> _MemoryTransport:
        """The transport of one logger's channel (called by the logger; `sink` is "influxdb" or "loki")."""
        if sink not in ("influxdb", "loki"):
            raise ValueError(f"unknown sink {sink!r}")
        transport = _MemoryTransport(self, sink, headers, compress)
        with self._lock:
            self._transports.append(transport)
        return transport

    def _record(self, request: Request) -> None:
        """Decode one request's body (sender thread)."""
        if request.sink == "influxdb":
            points = parse_lines(request.body.decode("utf-8"))
            entries: list[LogEntry] = []
        else:
            points, entries = [], parse_push(request.body)
        with self._lock:
            self._requests.append(request)
            self._points += points
            self._entries += entries

    @property
    def points(self) -> list[Point]:
        """Every point delivered so far, in the order each logger sent them."""
        with self._lock:
            return list(self._points)

    def points_of(self, measurement: str) -> list[Point]:
        """The points of one measurement (prefix included, as sent)."""
        return [point for point in self.points if point.measurement == measurement]

    @property
    def entries(self) -> list[LogEntry]:
        """Every Loki entry delivered so far, in the order of the pushes (each push sorted by time)."""
        with self._lock:
            return list(self._entries)

    @property
    def requests(self) -> list[Request]:
        """Every request made, with its headers and uncompressed body."""
        with self._lock:
            return list(self._requests)

    def clear(self) -> None:
        """Forget what was recorded (the loggers stay attached)."""
        with self._lock:
            self._requests.clear()
            self._points.clear()
            self._entries.clear()

    def _channels(self) -> list[Channel]:
        with self._lock:
            ours = list(self._transports)
        return [c for c in get_engine().channels if any(c.sink.transport is t for t in ours)]

    def flush(self, timeout: float = 5.0) -> int:
        """Wait until every attached logger has delivered what it holds (at most `timeout` s); return what is left."""
        deadline = time.monotonic() + timeout
        return sum(channel.flush(max(0.0, deadline - time.monotonic())) for channel in self._channels())


# ---- reading the bodies back ------------------------------------------------------------


def _read_name(text: str, start: int, stops: str) -> tuple[str, int]:
    """An escaped name from `start` up to the first unescaped character of `stops`: (name, its end)."""
    out = []
    i = start
    while i < len(text) and text[i] not in stops:
        if text[i] == "\\" and i + 1 < len(text):
            i += 1
        out.append(text[i])
        i += 1
    return "".join(out), i


def _read_string(text: str, start: int) -> tuple[str, int]:
    """A quoted string field value starting at the quote: (value, the index after the closing quote)."""
    out = []
    i = start + 1
    while text[i] != '"':
        if text[i] == "\\" and text[i + 1] in '"\\':
            i += 1
        out.append(text[i])
        i += 1
    return "".join(out), i + 1


def parse_line(line: str) -> Point:
    """One line as the client writes it: escaped names, sorted tags, float and string fields, a ns timestamp."""
    return _parse_at(line, 0)[0]


def parse_lines(body: str) -> list[Point]:
    """Every line of a request body, in order; a text field may hold a newline of its own."""
    points = []
    position = 0
    while position < len(body):
        if body[position] == "\n":
            position += 1
            continue
        point, position = _parse_at(body, position)
        points.append(point)
    return points


def _parse_at(text: str, start: int) -> tuple[Point, int]:
    """The line starting at `start`, and where the next one starts (after the newline that ends its timestamp)."""
    measurement, i = _read_name(text, start, ", ")
    tags: dict[str, str] = {}
    while text[i] == ",":
        key, i = _read_name(text, i + 1, "=")
        tags[key], i = _read_name(text, i + 1, ", ")
    fields: dict[str, float | str] = {}
    i += 1  # the space before the fields
    while True:
        key, i = _read_name(text, i, "=")
        if text[i + 1] == '"':
            fields[key], i = _read_string(text, i + 1)
        else:
            number, i = _read_name(text, i + 1, ", ")
            fields[key] = float(number)
        if text[i] == " ":
            break
        i += 1  # the comma before the next field
    end = text.find("\n", i)
    end = len(text) if end < 0 else end
    return Point(measurement, tags, fields, int(text[i + 1 : end]), text[start:end]), end + 1


def parse_push(body: bytes) -> list[LogEntry]:
    """The entries of a Loki push body (`{"streams": [{"stream": ..., "values": [[ts, line, meta?]]}]}`)."""
    entries = []
    for stream in json.loads(body)["streams"]:
        labels = dict(stream["stream"])
        for value in stream["values"]:
            metadata = dict(value[2]) if len(value) > 2 else {}
            entries.append(LogEntry(labels, int(value[0]), value[1], metadata))
    return entries
