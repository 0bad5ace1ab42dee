"""A local Loki push receiver that enforces Loki's documented push rules.

Used by the tests, the simulator and the benchmark in place of a real Loki (none
can run here). It listens on 127.0.0.1 and implements `POST /loki/api/v1/push`
as Loki 3.x does for JSON:

* `Content-Type: application/json` only (protobuf is refused with 415: the client
  must send JSON); `Content-Encoding: gzip` (or deflate) is decoded;
* the body must be `{"streams": [{"stream": {name: value}, "values": [[ts, line], ...]}]}`,
  a value optionally with a third element of structured metadata (string values),
  timestamps strings of integer nanoseconds; anything else fails the whole push (400);
* per stream: label name syntax `[a-zA-Z_][a-zA-Z0-9_]*` without a leading `__`,
  at most 15 label names (Loki's own `service_name` not counted), name and value
  lengths (1024 / 2048 bytes); a bad stream refuses all its entries;
* per entry: line size (256KB), age and future limits when configured, structured
  metadata limits, and (strict mode, on by default) timestamp order within one
  push, which Loki 3 would accept but a correct client never breaks;
* the valid entries are accepted and the refused ones named in a 400 answer in
  Loki's own wording; an entry identical to a stored one (stream, timestamp and
  line) is ignored, as Loki does; 204 when all is well.

Loki adds `service_name` to each stream (from `service`, `app`, ...); the receiver
does the same, so messages name streams as Loki would. Fault injection: forced
status codes with Retry-After, delayed answers, refused connections, entries
refused by content.
"""

from __future__ import annotations

import base64
import contextlib
import datetime as dt
import gzip
import json
import re
import socket
import threading
import time
import urllib.parse
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

PUSH_PATH = "/loki/api/v1/push"
LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
DIGITS = re.compile(r"[0-9]+")
SERVICE_NAME = "service_name"
# Loki's default discover_service_name: the first of these labels present names the service.
SERVICE_NAME_SOURCES = (
    "service",
    "app",
    "application",
    "name",
    "app_kubernetes_io_name",
    "container",
    "container_name",
    "component",
    "workload",
    "job",
)


@dataclass(frozen=True)
class Limits:
    """Loki 3.x `limits_config` defaults that apply to a push."""

    max_line_size: int = 256 * 1024
    max_label_names_per_series: int = 15
    max_label_name_length: int = 1024
    max_label_value_length: int = 2048
    reject_old_samples_max_age: float | None = None  # seconds (Loki: 1 week when enabled)
    creation_grace_period: float | None = None  # seconds (Loki: 10 minutes)
    allow_structured_metadata: bool = True
    max_structured_metadata_size: int = 64 * 1024
    max_structured_metadata_entries_count: int = 128
    max_body_bytes: int | None = None  # decompressed


@dataclass(frozen=True)
class Entry:
    """One accepted log entry."""

    labels: dict[str, str]  # as the client sent them
    stream: str  # Loki's selector text for the stream, service_name included
    ts: int
    line: str
    metadata: dict[str, str] | None
    tenant: str | None

    def json(self) -> Any:
        return json.loads(self.line)


@dataclass
class Request:
    """What the receiver saw of one HTTP request, and how it answered."""

    received: float  # time.monotonic()
    method: str
    path: str
    headers: dict[str, str]
    status: int = 0
    accepted: int = 0
    refused: int = 0
    message: str = ""
    body_bytes: int = 0


@dataclass
class _Fault:
    status: int
    retry_after: str | None
    body: str


@dataclass
class _State:
    entries: list[Entry] = field(default_factory=list)
    requests: list[Request] = field(default_factory=list)
    refused: list[tuple[str, int, str]] = field(default_factory=list)  # (stream, ts, reason)
    seen: set[tuple[str, int, str]] = field(default_factory=set)
    duplicates: int = 0


def go_time(ns: int) -> str:
    """Go's time.Time.String() for a UTC instant, as Loki prints entry timestamps."""
    seconds, frac = divmod(ns, 1_000_000_000)
    text = dt.datetime.fromtimestamp(seconds, dt.UTC).strftime("%Y-%m-%d %H:%M:%S")
    if frac:
        text += "." + f"{frac:09d}".rstrip("0")
    return text + " +0000 UTC"


def rfc3339(ns: int) -> str:
    """time.RFC3339 (whole seconds), as Loki's distributor prints timestamps."""
    return dt.datetime.fromtimestamp(ns // 1_000_000_000, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def selector(labels: dict[str, str]) -> str:
    """Prometheus' labels.String(): {a="x", b="y"}, sorted, values quoted."""
    return "{" + ", ".join(f"{k}={json.dumps(labels[k], ensure_ascii=False)}" for k in sorted(labels)) + "}"


class _BadRequest(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class LokiReceiver:
    """A threaded HTTP server on 127.0.0.1 that accepts Loki JSON pushes and records every entry."""

    def __init__(
        self,
        *,
        limits: Limits | None = None,
        strict_order: bool = True,
        dedupe: bool = True,
        discover_service_name: bool = True,
        require_tenant: bool = False,
        basic_auth: tuple[str, str] | None = None,
        bearer_token: str | None = None,
        port: int = 0,
    ) -> None:
        self.limits = limits or Limits()
        self.strict_order = strict_order
        self.dedupe = dedupe
        self.discover_service_name = discover_service_name
        self.require_tenant = require_tenant
        self.basic_auth = basic_auth
        self.bearer_token = bearer_token
        self.port = port
        self._state = _State()
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._faults: list[_Fault] = []
        self._delays: list[float] = []
        self._poison: list[tuple[str, str]] = []  # (substring, reason)
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._connections: set[socket.socket] = set()

    # ---- lifecycle ---------------------------------------------------------------

    def start(self) -> LokiReceiver:
        """Listen (on a free port the first time, on the same port after `refuse()`)."""
        server = ThreadingHTTPServer(("127.0.0.1", self.port), _Handler)
        server.daemon_threads = True
        server.block_on_close = False
        server.receiver = self  # type: ignore[attr-defined]
        self.port = server.server_address[1]
        thread = threading.Thread(target=server.serve_forever, args=(0.02,), name="loki-receiver", daemon=True)
        with self._lock:
            self._server, self._thread = server, thread
        thread.start()
        return self

    def stop(self) -> None:
        """Stop listening and cut every open connection (the next connection attempt is refused)."""
        with self._lock:
            server, self._server = self._server, None
            connections = list(self._connections)
        if server is not None:
            server.shutdown()
            server.server_close()
        for conn in connections:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)

    def refuse(self) -> None:
        """Outage: connections are refused until `resume()`."""
        self.stop()

    def resume(self) -> None:
        """End an outage: listen again on the same port."""
        self.start()

    def __enter__(self) -> LokiReceiver:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def push_url(self) -> str:
        return self.base_url + PUSH_PATH

    # ---- fault injection -----------------------------------------------------------

    def fail_next(self, count: int, status: int = 503, retry_after: str | None = None, body: str = "") -> None:
        """Answer the next `count` pushes with `status` (and Retry-After), storing nothing."""
        with self._lock:
            self._faults.extend(_Fault(status, retry_after, body or f"forced {status}") for _ in range(count))

    def delay_next(self, count: int, seconds: float) -> None:
        """Wait `seconds` before handling each of the next `count` pushes (to trigger client read timeouts)."""
        with self._lock:
            self._delays.extend([seconds] * count)

    def refuse_lines_containing(self, text: str, reason: str = "entry too far behind") -> None:
        """Refuse entries whose line contains `text`, naming them as Loki's ingester does."""
        with self._lock:
            self._poison.append((text, reason))

    def clear_faults(self) -> None:
        with self._lock:
            self._faults.clear()
            self._delays.clear()
            self._poison.clear()

    # ---- what was received ---------------------------------------------------------

    @property
    def entries(self) -> list[Entry]:
        with self._lock:
            return list(self._state.entries)

    @property
    def requests(self) -> list[Request]:
        with self._lock:
            return list(self._state.requests)

    @property
    def refused(self) -> list[tuple[str, int, str]]:
        """Entries refused so far: (stream, timestamp, reason)."""
        with self._lock:
            return list(self._state.refused)

    @property
    def duplicates(self) -> int:
        with self._lock:
            return self._state.duplicates

    def count(self) -> int:
        with self._lock:
            return len(self._state.entries)

    def lines(self) -> list[str]:
        return [e.line for e in self.entries]

    def wait_for(self, condition: Callable[[LokiReceiver], bool] | int, timeout: float = 10.0) -> bool:
        """Wait until `condition(self)` holds (or, given an int, that many entries are stored)."""
        if isinstance(condition, int):
            wanted = condition
            condition = lambda receiver: receiver.count() >= wanted  # noqa: E731
        deadline = time.monotonic() + timeout
        while not condition(self):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            with self._changed:
                self._changed.wait(min(remaining, 0.05))
        return True

    def reset(self) -> None:
        """Forget everything received (faults stay)."""
        with self._lock:
            self._state = _State()

    # ---- the push endpoint ---------------------------------------------------------

    def _track(self, conn: socket.socket, add: bool) -> None:
        with self._lock:
            (self._connections.add if add else self._connections.discard)(conn)

    def _take_delay(self) -> float:
        with self._lock:
            return self._delays.pop(0) if self._delays else 0.0

    def _record(self, request: Request) -> None:
        with self._changed:
            self._state.requests.append(request)
            self._changed.notify_all()

    def handle(self, request: Request, body: bytes) -> tuple[int, str, dict[str, str]]:
        """Answer one request: (status, text, extra headers)."""
        if urllib.parse.urlsplit(request.path).path != PUSH_PATH:
            return 404, "404 page not found\n", {}
        if request.method != "POST":
            return 405, f"method {request.method} not allowed on {PUSH_PATH}\n", {}
        with self._lock:
            fault = self._faults.pop(0) if self._faults else None
        if fault is not None:
            headers = {"Retry-After": fault.retry_after} if fault.retry_after is not None else {}
            return fault.status, fault.body, headers
        headers = {k.lower(): v for k, v in request.headers.items()}
        try:
            self._check_auth(headers)
            payload = self._decode(headers, body)
            streams = _parse_push(payload)
        except _BadRequest as exc:
            return exc.status, exc.message, {}
        tenant = headers.get("x-scope-orgid")
        return self._ingest(request, streams, tenant)

    def _check_auth(self, headers: dict[str, str]) -> None:
        if self.require_tenant and not headers.get("x-scope-orgid"):
            raise _BadRequest(401, "no org id\n")
        auth = headers.get("authorization", "")
        if self.basic_auth is not None:
            expected = "Basic " + base64.b64encode(":".join(self.basic_auth).encode()).decode()
            if auth != expected:
                raise _BadRequest(401, "Unauthorized\n")
        if self.bearer_token is not None and auth != f"Bearer {self.bearer_token}":
            raise _BadRequest(401, "Unauthorized\n")

    def _decode(self, headers: dict[str, str], body: bytes) -> Any:
        media = headers.get("content-type", "").split(";")[0].strip().lower()
        if media != "application/json":
            raise _BadRequest(
                415,
                f"unsupported Content-Type {media or '(none)'!r}: this receiver takes JSON pushes only "
                "(Content-Type: application/json); protobuf (application/x-protobuf) is not accepted\n",
            )
        encoding = headers.get("content-encoding", "").strip().lower()
        try:
            if encoding == "gzip":
                body = gzip.decompress(body)
            elif encoding == "deflate":
                body = zlib.decompress(body)
            elif encoding not in ("", "identity"):
                raise _BadRequest(415, f"unsupported Content-Encoding {encoding!r}\n")
        except (OSError, EOFError, zlib.error) as exc:
            raise _BadRequest(400, f"{encoding}: invalid body: {exc}\n") from None
        limit = self.limits.max_body_bytes
        if limit is not None and len(body) > limit:
            raise _BadRequest(413, f"request body too large: {len(body)} bytes, limit: {limit} bytes\n")
        try:
            return json.loads(body.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as exc:
            raise _BadRequest(400, f"loghttp.PushRequest: could not decode JSON: {exc}\n") from None

    def _loki_labels(self, labels: dict[str, str]) -> dict[str, str]:
        if not self.discover_service_name or SERVICE_NAME in labels:
            return dict(labels)
        source = next((labels[k] for k in SERVICE_NAME_SOURCES if k in labels), "unknown_service")
        return {**labels, SERVICE_NAME: source}

    def _stream_error(self, labels: dict[str, str], loki_labels: dict[str, str]) -> str | None:
        """Loki's distributor label checks; a message if the stream is refused."""
        text = selector(labels)
        if not labels:
            return "error at least one label pair is required per stream"
        limits = self.limits
        for name, value in labels.items():
            if not LABEL_NAME.fullmatch(name) or name.startswith("__"):
                return f"Error parsing labels '{text}' with error: invalid label name {name!r}"
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                return f"Error parsing labels '{text}' with error: invalid UTF-8 in value of {name}"
        count = len(loki_labels) - (1 if SERVICE_NAME in loki_labels else 0)
        if count > limits.max_label_names_per_series:
            return f"entry for stream '{text}' has {count} label names; limit {limits.max_label_names_per_series}"
        for name, value in labels.items():
            if len(name.encode()) > limits.max_label_name_length:
                return f"stream '{text}' has label name too long: '{name}'"
            if len(value.encode()) > limits.max_label_value_length:
                return f"stream '{text}' has label value too long: '{value}'"
        return None

    def _entry_error(self, stream: str, ts: int, line: str, metadata: dict[str, str] | None) -> str | None:
        """Loki's distributor entry checks; a message if the entry is refused."""
        limits = self.limits
        now = time.time_ns()
        if limits.reject_old_samples_max_age is not None:
            oldest = now - int(limits.reject_old_samples_max_age * 1e9)
            if ts < oldest:
                return (
                    f"entry for stream '{stream}' has timestamp too old: {rfc3339(ts)}, "
                    f"oldest acceptable timestamp is: {rfc3339(oldest)}"
                )
        if limits.creation_grace_period is not None and ts > now + int(limits.creation_grace_period * 1e9):
            return f"entry for stream '{stream}' has timestamp too new: {rfc3339(ts)}"
        size = len(line.encode("utf-8"))
        if size > limits.max_line_size:
            return (
                f"Max entry size '{limits.max_line_size}' bytes exceeded for stream '{stream}' "
                f"while adding an entry with length '{size}' bytes"
            )
        if metadata:
            if not limits.allow_structured_metadata:
                return (
                    f"stream '{stream}' includes structured metadata, but this feature is disallowed. "
                    "Please see `limits_config.allow_structured_metadata` or contact your Loki administrator "
                    "to enable it."
                )
            md_size = sum(len(k.encode()) + len(v.encode()) for k, v in metadata.items())
            if md_size > limits.max_structured_metadata_size:
                return (
                    f"stream '{stream}' has structured metadata too large: '{md_size}' bytes, "
                    f"limit: '{limits.max_structured_metadata_size}' bytes."
                )
            if len(metadata) > limits.max_structured_metadata_entries_count:
                return (
                    f"stream '{stream}' has too many structured metadata labels: '{len(metadata)}', "
                    f"limit: '{limits.max_structured_metadata_entries_count}'."
                )
        return None

    def _ingest(self, request: Request, streams: list[tuple[dict, list]], tenant: str | None) -> tuple[int, str, dict]:
        if not streams:
            return 422, "error at least one valid stream is required for ingestion\n", {}
        errors: list[str] = []
        accepted: list[Entry] = []
        refused: list[tuple[str, int, str]] = []
        with self._lock:
            poison = list(self._poison)
            seen = self._state.seen
            for labels, values in streams:
                loki_labels = self._loki_labels(labels)
                stream = selector(loki_labels)
                problem = self._stream_error(labels, loki_labels)
                if problem is not None:
                    errors.append(problem)
                    refused.extend((stream, ts, problem) for ts, _, _ in values)
                    continue
                ingester: list[str] = []
                last_ts: int | None = None
                for ts, line, metadata in values:
                    problem = self._entry_error(stream, ts, line, metadata)
                    if problem is not None:
                        errors.append(problem)
                        refused.append((stream, ts, problem))
                        continue
                    reason = next((r for text, r in poison if text in line), None)
                    if reason is None and self.strict_order and last_ts is not None and ts < last_ts:
                        reason = "entry out of order"
                    if reason is not None:
                        ingester.append(f"entry with timestamp {go_time(ts)} ignored, reason: '{reason}',")
                        refused.append((stream, ts, reason))
                        continue
                    last_ts = ts
                    key = (stream, ts, line)
                    if self.dedupe and key in seen:
                        self._state.duplicates += 1
                        continue
                    seen.add(key)
                    accepted.append(Entry(dict(labels), stream, ts, line, metadata, tenant))
                if ingester:
                    ingester.append(
                        f"user '{tenant or 'fake'}', total ignored: {len(ingester)} out of {len(values)} "
                        f"for stream: {stream}"
                    )
                    errors.append("\n".join(ingester))
            self._state.entries.extend(accepted)
            self._state.refused.extend(refused)
            self._changed.notify_all()
        request.accepted, request.refused = len(accepted), len(refused)
        if errors:
            return 400, "\n".join(errors) + "\n", {}
        return 204, "", {}


def _parse_push(payload: Any) -> list[tuple[dict[str, str], list[tuple[int, str, dict[str, str] | None]]]]:
    """Check the JSON push schema; any violation fails the whole push, as Loki's decoder does."""

    def bad(message: str) -> _BadRequest:
        return _BadRequest(400, f"loghttp.PushRequest: {message}\n")

    if not isinstance(payload, dict) or not isinstance(payload.get("streams"), list):
        raise bad('the body must be an object with a "streams" array')
    out = []
    for i, stream in enumerate(payload["streams"]):
        if not isinstance(stream, dict):
            raise bad(f"streams[{i}] must be an object")
        labels = stream.get("stream")
        if not isinstance(labels, dict) or not all(isinstance(v, str) for v in labels.values()):
            raise bad(f"streams[{i}].stream must be an object of string label values, got {labels!r:.200}")
        values = stream.get("values")
        if not isinstance(values, list):
            raise bad(f'streams[{i}].values must be an array of ["<ns>", "<line>"] pairs')
        entries = []
        for j, value in enumerate(values):
            where = f"streams[{i}].values[{j}]"
            if not isinstance(value, list) or len(value) not in (2, 3):
                raise bad(f'{where} must be ["<ns>", "<line>"] or ["<ns>", "<line>", {{metadata}}]')
            ts, line = value[0], value[1]
            if not isinstance(ts, str) or not DIGITS.fullmatch(ts):
                raise bad(f"{where}: the timestamp must be a string of integer nanoseconds, got {ts!r:.60}")
            if not isinstance(line, str):
                raise bad(f"{where}: the line must be a string")
            metadata = None
            if len(value) == 3:
                metadata = value[2]
                if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
                    raise bad(f"{where}: structured metadata must be an object of string values")
            entries.append((int(ts), line, metadata))
        out.append((labels, entries))
    return out


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    timeout = 30
    server: Any

    def setup(self) -> None:
        super().setup()
        self.server.receiver._track(self.connection, True)

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            self.server.receiver._track(self.connection, False)

    def log_message(self, format: str, *args: Any) -> None:
        pass  # quiet: tests read `requests` instead

    def _serve(self) -> None:
        receiver: LokiReceiver = self.server.receiver
        request = Request(time.monotonic(), self.command, self.path, dict(self.headers.items()))
        length = self.headers.get("Content-Length")
        if length is None and self.command == "POST":
            self._answer(411, "Content-Length required\n", {})
            return
        body = self.rfile.read(int(length or 0))
        request.body_bytes = len(body)
        delay = receiver._take_delay()
        if delay:
            time.sleep(delay)
        status, text, headers = receiver.handle(request, body)
        request.status, request.message = status, text
        receiver._record(request)
        self._answer(status, text, headers)

    def _answer(self, status: int, text: str, headers: dict[str, str]) -> None:
        data = text.encode()
        try:
            self.send_response(status)
            for name, value in headers.items():
                self.send_header(name, value)
            if data:
                self.send_header("Content-Type", "text/plain; charset=utf-8")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if data and status != 204:
                self.wfile.write(data)
        except OSError:
            self.close_connection = True  # the client gave up (read timeout) or the outage cut it

    do_POST = _serve
    do_GET = _serve
    do_PUT = _serve


def running_receiver(**kwargs: Any) -> Iterator[LokiReceiver]:
    """Generator for a pytest fixture: a started receiver, stopped afterwards."""
    receiver = LokiReceiver(**kwargs).start()
    try:
        yield receiver
    finally:
        receiver.stop()
