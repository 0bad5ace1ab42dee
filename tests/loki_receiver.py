"""A local Loki push receiver that models what a real Loki does with a push.

Used by the tests, the simulator and the benchmarks in place of a real Loki (none
can run here). It listens on 127.0.0.1 and implements `POST /loki/api/v1/push`
for JSON. Each rule below names the Loki source it models (grafana/loki, the
3.x line unless said otherwise; the stack pins 3.7):

* decoding: `Content-Type: application/json` only (protobuf is refused with 415:
  the client must send JSON); gzip/deflate bodies; any schema violation fails
  the whole push with 400 and stores nothing (pkg/loghttp/push, pkg/util/unmarshal);
* distributor validation, per stream then per entry (pkg/distributor/distributor.go
  Push, pkg/distributor/validator.go, messages from pkg/validation/validate.go):
  label syntax and counts refuse a whole stream; an entry too old
  (`reject_old_samples_max_age`), too new (`creation_grace_period`), longer than
  `max_line_size`, or with structured metadata when it is disallowed or too large
  is refused alone. The messages are grouped by text as pkg/util/errors.go
  GroupedErrors writes them ("N errors like: ...; ..."). Loki 3.6 lowercased
  the line-size message ("max entry size ..."); `version` selects the wording;
* the tenant's ingestion rate limit (pkg/distributor/distributor.go: one
  `AllowN(validated bytes)` per push on a token bucket of `ingestion_rate_mb` and
  `ingestion_burst_size_mb`, golang.org/x/time/rate semantics): when refused, the
  push is answered 429 with RateLimitedErrorMsg, no Retry-After, nothing stored;
  a push larger than the burst can never pass;
* the ingester, stream by stream (pkg/ingester/instance.go Push): only the result
  of the LAST stream of the push is returned, so an earlier stream's refusal is
  lost when a later stream succeeds (204). Per stream (pkg/ingester/stream.go):
  an entry identical to the stream's last line is skipped; the per-stream rate
  limit (`per_stream_rate_limit` / `_burst`) refuses the whole stream with 429
  when `shard_streams` is enabled (the 3.x default), else entry by entry; with
  `max_chunk_age` set, entries older than the stream's newest minus half of it are
  "too far behind"; the refused entries are listed (at most
  `max_returned_stream_errors`, 10) with the stream's total;
* de-duplication only inside the stream's head block (pkg/chunkenc unordered head
  block: an identical timestamp and line is dropped while it is in the head
  block, which is cut at `chunk_block_size`, 256KB): a resend after the block
  was cut is stored again;
* if no ingester error, the distributor's validation error is answered (400) after
  the valid entries were stored; otherwise the ingester's error replaces it;
* tenants (grafana/loki v3.7, vendored grafana/dskit): with `auth_enabled` a push
  without `X-Scope-OrgID` is answered 401 "no org id" (dskit
  middleware/http_auth.go AuthenticateUser, user/id.go ErrNoOrgID); the push handler
  takes exactly one valid tenant ID or answers 400 with dskit's message
  (pkg/distributor/http.go pushHandler calls tenant.TenantID: "multiple org IDs
  present" for `a|b`, tenant/tenant.go ValidTenantID for characters outside
  `a-zA-Z0-9!-_.*'()`, more than 150 bytes, `.` or `..`). Without it every push is
  the tenant `fake` whatever the header says (pkg/util/fakeauth/fake_auth.go). Every
  limit is the tenant's: `limits_config` for all, `overrides` per tenant as
  Loki's runtime configuration gives them (pkg/runtime/config.go, the tenant's
  override or else the defaults); streams, rate buckets and stream counts are
  kept per tenant. A new stream beyond `max_global_streams_per_user` is refused
  by the ingester with 429 StreamLimitErrorMsg (pkg/ingester/instance.go
  onStreamCreationError; one ingester, so the global limit is the local one);
* Loki adds `service_name` to each stream (pkg/distributor/distributor.go
  parseStreamLabels, `discover_service_name` defaults in pkg/validation/limits.go),
  not counted toward `max_label_names_per_series` (pkg/distributor/validator.go).

Switches (`Limits`) set every limit so tests can use a real server's values;
`Limits.loki_defaults()` gives Loki 3.x's. Fault injection: forced status codes
with Retry-After, delayed answers, refused connections, entries refused by content.
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
MB = 1 << 20  # Loki's *_mb limits are MiB (pkg/validation/limits.go bytesInMB)
# Loki 3.x's default discover_service_name (pkg/validation/limits.go): the first label present names the service.
SERVICE_NAME_SOURCES = (
    "service",
    "app",
    "application",
    "app_name",
    "name",
    "app_kubernetes_io_name",
    "container",
    "container_name",
    "k8s_container_name",
    "component",
    "workload",
    "job",
    "k8s_job_name",
)


@dataclass(frozen=True)
class Limits:
    """`limits_config` and ingester settings that apply to a push.

    The defaults are permissive where Loki's would make unrelated tests depend on
    the clock or on volume (no age window, no rate limits); `loki_defaults()` gives
    Loki 3.x's own values (pkg/validation/limits.go, pkg/ingester/ingester.go).
    """

    max_line_size: int = 256 * 1024  # "256KB"
    max_label_names_per_series: int = 15
    max_label_name_length: int = 1024
    max_label_value_length: int = 2048
    reject_old_samples_max_age: float | None = None  # seconds (Loki: 1 week, reject_old_samples on)
    creation_grace_period: float | None = None  # seconds (Loki: 10 minutes)
    allow_structured_metadata: bool = True
    max_structured_metadata_size: int = 64 * 1024
    max_structured_metadata_entries_count: int = 128
    max_body_bytes: int | None = None  # decompressed
    ingestion_rate_bytes: float | None = None  # per tenant, bytes/s (Loki: ingestion_rate_mb 4)
    ingestion_burst_bytes: int | None = None  # (Loki: ingestion_burst_size_mb 6)
    per_stream_rate_bytes: float | None = None  # bytes/s (Loki: per_stream_rate_limit 3MB)
    per_stream_burst_bytes: int | None = None  # (Loki: per_stream_rate_limit_burst 15MB)
    rate_limit_whole_stream: bool = True  # shard_streams.enabled, true by default in 3.x
    max_chunk_age: float | None = None  # seconds; entries older than newest - age/2 are too far behind (Loki: 2h)
    max_returned_stream_errors: int = 10
    chunk_block_size: int = 262_144  # head block size: the de-duplication window
    max_global_streams_per_user: int | None = None  # active streams per tenant (Loki: 5000)

    @classmethod
    def from_limits_config(cls, config: dict[str, Any], **overrides: Any) -> Limits:
        """The push limits of a Loki `limits_config` mapping (as a role renders it), over the receiver's defaults.

        Sizes are flagext.ByteSize strings ("64KB", "2MB": KB is 1024 bytes); the
        `*_mb` rates and bursts are MiB (pkg/validation/limits.go bytesInMB).
        """
        sizes = {
            "max_line_size": "max_line_size",
            "per_stream_rate_limit": "per_stream_rate_bytes",
            "per_stream_rate_limit_burst": "per_stream_burst_bytes",
        }
        values: dict[str, Any] = {}
        for key, value in config.items():
            if key in sizes:
                values[sizes[key]] = _byte_size(value)
            elif key == "ingestion_rate_mb":
                values["ingestion_rate_bytes"] = float(value) * MB
            elif key == "ingestion_burst_size_mb":
                values["ingestion_burst_bytes"] = int(float(value) * MB)
            elif key in ("max_global_streams_per_user", "max_label_names_per_series"):
                values[key] = int(value)
        values.update(overrides)
        return cls(**values)

    @classmethod
    def loki_defaults(cls, **overrides: Any) -> Limits:
        """Loki 3.x's defaults, with `overrides`."""
        values: dict[str, Any] = dict(
            reject_old_samples_max_age=7 * 86400.0,
            creation_grace_period=600.0,
            ingestion_rate_bytes=4.0 * MB,
            ingestion_burst_bytes=6 * MB,
            per_stream_rate_bytes=3.0 * MB,
            per_stream_burst_bytes=15 * MB,
            max_chunk_age=7200.0,
            max_global_streams_per_user=5000,
        )
        values.update(overrides)
        return cls(**values)


def _byte_size(text: str | int) -> int:
    """c2h5oh/datasize's parse of a flagext.ByteSize ("256KB", "3MB", "1024"): units of 1024."""
    found = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)B?\s*", str(text), re.I)
    if found is None:
        raise ValueError(f"not a byte size: {text!r}")
    return int(float(found.group(1)) * 1024 ** " KMGT".index(found.group(2).upper() or " "))


class TokenBucket:
    """golang.org/x/time/rate's Limiter as Loki uses it: AllowN takes n tokens or refuses, never waits.

    It starts full; n larger than the burst is never allowed.
    """

    def __init__(self, rate: float, burst: int) -> None:
        self.rate = rate
        self.burst = burst
        self.tokens = float(burst)
        self.last = time.monotonic()

    def allow(self, n: int) -> bool:
        now = time.monotonic()
        self.tokens = min(float(self.burst), self.tokens + (now - self.last) * self.rate)
        self.last = now
        if n > self.tokens:
            return False
        self.tokens -= n
        return True


def datasize(n: float) -> str:
    """c2h5oh/datasize ByteSize.String(), which Loki's flagext.ByteSize prints: the largest exact unit."""
    n = int(n)
    for unit, size in (("GB", 1 << 30), ("MB", 1 << 20), ("KB", 1 << 10)):
        if n and n % size == 0:
            return f"{n // size}{unit}"
    return f"{n}B"


@dataclass(frozen=True)
class Entry:
    """One accepted log entry."""

    labels: dict[str, str]  # as the client sent them
    stream: str  # Loki's selector text for the stream, service_name included
    ts: int
    line: str
    metadata: dict[str, str] | None
    tenant: str  # "fake" when the receiver runs without auth_enabled, as Loki does

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
class _Stream:
    """An ingester stream: its last line, newest timestamp, head block and rate limiter."""

    last_line: tuple[int, str] | None = None
    highest: int | None = None
    head: set[tuple[int, str]] = field(default_factory=set)
    head_bytes: int = 0
    limiter: TokenBucket | None = None


@dataclass
class _State:
    entries: list[Entry] = field(default_factory=list)
    requests: list[Request] = field(default_factory=list)
    refused: list[tuple[str, int, str]] = field(default_factory=list)  # (stream, ts, reason)
    streams: dict[tuple[str, str], _Stream] = field(default_factory=dict)  # (tenant, stream)
    tenants: dict[str, TokenBucket] = field(default_factory=dict)
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


# The tenant of every push when auth_enabled is false (pkg/util/fakeauth/fake_auth.go).
SINGLE_TENANT = "fake"
MAX_TENANT_ID_LENGTH = 150  # dskit tenant/tenant.go MaxTenantIDLength
_TENANT_CHARACTERS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789!-_.*'()")


def tenant_ids(org_id: str) -> list[str]:
    """dskit tenant.TenantIDs: the `|`-separated IDs, each validated, sorted and de-duplicated.

    Raises ValueError with dskit's message for an invalid ID (tenant/tenant.go ValidTenantID).
    """
    ids = org_id.split("|")
    for tenant in ids:
        bad = next((c for c in tenant if c not in _TENANT_CHARACTERS), None)
        if bad is not None:
            raise ValueError(f"tenant ID '{tenant}' contains unsupported character '{bad}'")
        if len(tenant.encode()) > MAX_TENANT_ID_LENGTH:
            raise ValueError(f"tenant ID is too long: max {MAX_TENANT_ID_LENGTH} characters")
        if tenant in (".", ".."):
            raise ValueError("tenant ID is '.' or '..'")
    return sorted(set(ids))


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
        auth_enabled: bool = False,
        overrides: dict[str, Limits] | None = None,
        multi_tenant_queries_enabled: bool = False,
        basic_auth: tuple[str, str] | None = None,
        bearer_token: str | None = None,
        port: int = 0,
        version: tuple[int, int] = (3, 7),
    ) -> None:
        self.limits = limits or Limits()
        self.version = version
        self.strict_order = strict_order
        self.dedupe = dedupe
        self.discover_service_name = discover_service_name
        self.auth_enabled = auth_enabled
        self.overrides = dict(overrides or {})
        # The querier's multi_tenant_queries_enabled: read by the query side (tests/grafana_receiver.py).
        self.multi_tenant_queries_enabled = multi_tenant_queries_enabled
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
        placeholder, self._placeholder = getattr(self, "_placeholder", None), None
        if placeholder is not None:
            placeholder.close()
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
        """Outage: connections are refused until `resume()`.

        The port stays bound, without listening, so that no other server (another
        test worker's) can take it meanwhile: a connection to it is still refused.
        """
        self.stop()
        placeholder = socket.socket()
        placeholder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        placeholder.bind(("127.0.0.1", self.port))
        self._placeholder = placeholder

    def resume(self) -> None:
        """End an outage: listen again on the same port."""
        self.start()

    def __enter__(self) -> LokiReceiver:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
        placeholder, self._placeholder = getattr(self, "_placeholder", None), None
        if placeholder is not None:
            placeholder.close()

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
            tenant = self._tenant(headers)
            self._check_auth(headers)
            payload = self._decode(headers, body)
            streams = _parse_push(payload)
        except _BadRequest as exc:
            return exc.status, exc.message, {}
        return self._ingest(request, streams, tenant)

    def limits_for(self, tenant: str) -> Limits:
        """The tenant's limits: its runtime override, else `limits_config` (pkg/validation Overrides)."""
        return self.overrides.get(tenant, self.limits)

    def _tenant(self, headers: dict[str, str]) -> str:
        """The push's tenant, or the answer Loki gives when there is none it can use."""
        if not self.auth_enabled:
            return SINGLE_TENANT
        org_id = headers.get("x-scope-orgid", "")
        if not org_id:
            raise _BadRequest(401, "no org id\n")
        try:
            ids = tenant_ids(org_id)
        except ValueError as exc:
            raise _BadRequest(400, f"{exc}\n") from None
        if len(ids) > 1:
            raise _BadRequest(400, "multiple org IDs present\n")
        return ids[0]

    def _check_auth(self, headers: dict[str, str]) -> None:
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

    def _stream_error(self, labels: dict[str, str], loki_labels: dict[str, str], limits: Limits) -> str | None:
        """The distributor's label checks (pkg/distributor/validator.go ValidateLabels); a message if refused."""
        text = selector(labels)
        if not labels:
            return "error at least one label pair is required per stream"
        for name, value in labels.items():
            if not LABEL_NAME.fullmatch(name) or name.startswith("__"):
                return f"Error parsing labels '{text}' with error: invalid label name {name!r}"
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                return f"Error parsing labels '{text}' with error: invalid UTF-8 in value of {name}"
        stream = selector(loki_labels)
        count = len(loki_labels) - (1 if SERVICE_NAME in loki_labels else 0)
        if count > limits.max_label_names_per_series:
            return f"entry for stream '{stream}' has {count} label names; limit {limits.max_label_names_per_series}"
        for name, value in labels.items():
            if len(name.encode()) > limits.max_label_name_length:
                return f"stream '{stream}' has label name too long: '{name}'"
            if len(value.encode()) > limits.max_label_value_length:
                return f"stream '{stream}' has label value too long: '{value}'"
        return None

    def _entry_error(
        self, stream: str, ts: int, line: str, metadata: dict[str, str] | None, now: int, limits: Limits
    ) -> str | None:
        """The distributor's entry checks (pkg/distributor/validator.go ValidateEntry, in its order)."""
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
            # pkg/validation/validate.go LineTooLongErrorMsg; Loki 3.6 starts it in lowercase.
            first = "max" if self.version >= (3, 6) else "Max"
            return (
                f"{first} entry size '{limits.max_line_size}' bytes exceeded for stream '{stream}' "
                f"while adding an entry with length '{size}' bytes"
            )
        if metadata:
            if not limits.allow_structured_metadata:
                return (
                    f"stream '{stream}' includes structured metadata, but this feature is disallowed. "
                    "Please see `limits_config.allow_structured_metadata` or contact your Loki administrator "
                    "to enable it."
                )
            md_size = _metadata_size(metadata)
            if md_size > limits.max_structured_metadata_size:
                return (
                    f"stream '{stream}' has structured metadata too large: '{md_size}' bytes, "
                    f"limit: '{limits.max_structured_metadata_size}' bytes. Please see "
                    "`limits_config.max_structured_metadata_size` or contact your Loki administrator to increase it."
                )
            if len(metadata) > limits.max_structured_metadata_entries_count:
                return (
                    f"stream '{stream}' has too many structured metadata labels: '{len(metadata)}', "
                    f"limit: '{limits.max_structured_metadata_entries_count}'. Please see "
                    "`limits_config.max_structured_metadata_entries_count` or contact your Loki administrator "
                    "to increase it."
                )
        return None

    def _ingest(self, request: Request, streams: list[tuple[dict, list]], tenant: str) -> tuple[int, str, dict]:
        """pkg/distributor/distributor.go Push: validate, rate-limit the tenant, then the ingester."""
        if not streams:
            return 422, "error at least one valid stream is required for ingestion\n", {}
        now = time.time_ns()
        errors: list[str] = []
        refused: list[tuple[str, int, str]] = []
        valid: list[tuple[dict[str, str], str, list[tuple[int, str, dict[str, str] | None]]]] = []
        validated_bytes = validated_lines = 0
        limits = self.limits_for(tenant)
        for labels, values in streams:
            if not values:
                continue  # "Return early if stream does not contain any entries"
            loki_labels = self._loki_labels(labels)
            stream = selector(loki_labels)
            problem = self._stream_error(labels, loki_labels, limits)
            if problem is not None:
                errors.append(problem)
                refused.extend((stream, ts, problem) for ts, _, _ in values)
                continue
            kept = []
            for ts, line, metadata in values:
                problem = self._entry_error(stream, ts, line, metadata, now, limits)
                if problem is not None:
                    errors.append(problem)
                    refused.append((stream, ts, problem))
                    continue
                kept.append((ts, line, metadata))
                validated_bytes += _entry_size(line, metadata)  # util.EntryTotalSize
                validated_lines += 1
            if kept:
                valid.append((labels, stream, kept))
        validation = (400, grouped(errors) + "\n", {}) if errors else (204, "", {})
        accepted: list[Entry] = []
        with self._changed:
            state = self._state
            refused_before = len(state.refused)
            state.refused.extend(refused)
            answer = validation
            bucket = None
            if valid and limits.ingestion_rate_bytes is not None:
                bucket = state.tenants.get(tenant)
                if bucket is None:
                    burst = limits.ingestion_burst_bytes or int(limits.ingestion_rate_bytes)
                    bucket = state.tenants[tenant] = TokenBucket(limits.ingestion_rate_bytes, burst)
            if bucket is not None and not bucket.allow(validated_bytes):
                first = "ingestion" if self.version >= (3, 6) else "Ingestion"  # lowercased in 3.6
                message = (
                    f"{first} rate limit exceeded for user {tenant} (limit: {int(bucket.rate)} bytes/sec) "
                    f"while attempting to ingest '{validated_lines}' lines totaling '{validated_bytes}' bytes, "
                    "reduce log volume or contact your Loki administrator to see if the limit can be increased"
                )
                for _, stream, kept in valid:
                    state.refused.extend((stream, ts, "rate_limited") for ts, _, _ in kept)
                # pkg/distributor/distributor.go (3.x): httpgrpc.Errorf(http.StatusTooManyRequests, ...), no header.
                answer = (429, message + "\n", {})
            elif valid:
                ingester_error: tuple[int, str, dict] | None = None
                for labels, stream, kept in valid:
                    # pkg/ingester/instance.go (3.x): `_, appendErr = s.Push(...)`: the last stream's result wins.
                    ingester_error = self._push_stream(labels, stream, kept, tenant, accepted)
                if ingester_error is not None:
                    answer = ingester_error
            state.entries.extend(accepted)
            request.accepted, request.refused = len(accepted), len(state.refused) - refused_before
            self._changed.notify_all()
        return answer

    def _push_stream(
        self,
        labels: dict[str, str],
        stream: str,
        values: list[tuple[int, str, dict[str, str] | None]],
        tenant: str,
        accepted: list[Entry],
    ) -> tuple[int, str, dict] | None:
        """pkg/ingester/stream.go Push for one stream: the error it returns, or None."""
        limits = self.limits_for(tenant)
        state = self._state
        st = state.streams.get((tenant, stream))
        if st is None:
            cap = limits.max_global_streams_per_user
            if cap is not None and sum(1 for t, _ in state.streams if t == tenant) >= cap:
                state.refused.extend((stream, ts, "stream_limit") for ts, _, _ in values)
                first = "maximum" if self.version >= (3, 6) else "Maximum"  # lowercased in 3.6
                message = (
                    f"{first} active stream limit exceeded when trying to create stream {stream}, reduce the "
                    "number of active streams (reduce labels or reduce label values), or contact your Loki "
                    f"administrator to see if the limit can be increased, user: '{tenant}'"
                )
                return 429, message + "\n", {}
            st = state.streams[(tenant, stream)] = _Stream()
            if limits.per_stream_rate_bytes is not None:
                burst = limits.per_stream_burst_bytes or int(limits.per_stream_rate_bytes)
                st.limiter = TokenBucket(limits.per_stream_rate_bytes, burst)
        failed: list[tuple[int, str]] = []  # (ts, reason)
        to_store: list[tuple[int, str, dict[str, str] | None]] = []
        last_line, highest = st.last_line, st.highest
        valid_bytes = 0
        push_last: int | None = None
        poison = list(self._poison)
        for ts, line, metadata in values:
            # validateEntries: an entry identical to the stream's last line is skipped silently.
            if self.dedupe and last_line == (ts, line):
                state.duplicates += 1
                continue
            size = _entry_size(line, metadata)
            if not limits.rate_limit_whole_stream and st.limiter is not None and not st.limiter.allow(size):
                failed.append((ts, self._stream_rate_error(st.limiter, stream, size)))
                continue
            if limits.max_chunk_age is not None and highest is not None:
                cutoff = highest - int(limits.max_chunk_age * 1e9) // 2
                if ts < cutoff:
                    failed.append(
                        (
                            ts,
                            f"entry too far behind, entry timestamp is: {rfc3339(ts)}, "
                            f"oldest acceptable timestamp is: {rfc3339(cutoff)}",
                        )
                    )
                    continue
            reason = next((r for text, r in poison if text in line), None)  # fault injection
            if reason is None and self.strict_order and push_last is not None and ts < push_last:
                reason = "entry out of order"  # a client check within one push (Loki 3 accepts unordered writes)
            if reason is not None:
                failed.append((ts, reason))
                continue
            valid_bytes += size
            last_line, push_last = (ts, line), ts
            highest = ts if highest is None else max(highest, ts)
            to_store.append((ts, line, metadata))
        if limits.rate_limit_whole_stream and st.limiter is not None and to_store and not st.limiter.allow(valid_bytes):
            state.refused.extend((stream, ts, reason) for ts, reason in failed)  # refused before the limit
            failed = [
                (ts, self._stream_rate_error(st.limiter, stream, _entry_size(line, md))) for ts, line, md in to_store
            ]
            state.refused.extend((stream, ts, "per_stream_rate_limit") for ts, _ in failed)
            return self._ingester_error(failed, len(values), stream, tenant, rate_limited=True)
        for ts, line, metadata in to_store:
            key = (ts, line)
            if self.dedupe and key in st.head:  # the head block drops an identical entry
                state.duplicates += 1
            else:
                accepted.append(Entry(dict(labels), stream, ts, line, metadata, tenant))
                st.head.add(key)
                st.head_bytes += len(line.encode("utf-8"))
                if st.head_bytes >= limits.chunk_block_size:  # MemChunk cuts the head block
                    st.head, st.head_bytes = set(), 0
            st.last_line = key
            st.highest = ts if st.highest is None else max(st.highest, ts)
        state.refused.extend((stream, ts, reason) for ts, reason in failed)
        if not failed:
            return None
        return self._ingester_error(failed, len(values), stream, tenant, rate_limited="rate limit" in failed[-1][1])

    def _stream_rate_error(self, limiter: TokenBucket, stream: str, size: int) -> str:
        """pkg/validation/validate.go ErrStreamRateLimit.Error()."""
        return (
            f"Per stream rate limit exceeded (limit: {datasize(limiter.rate)}/sec) while attempting to ingest for "
            f"stream '{stream}' totaling {datasize(size)}, consider splitting a stream via additional labels or "
            "contact your Loki administrator to see if the limit can be increased"
        )

    def _ingester_error(
        self, failed: list[tuple[int, str]], total: int, stream: str, tenant: str, rate_limited: bool
    ) -> tuple[int, str, dict]:
        """pkg/ingester/stream.go errorForFailedEntries: listed entries (at most N), then the stream's total."""
        lines = [
            f"entry with timestamp {go_time(ts)} ignored, reason: '{reason}',"
            for ts, reason in failed[: self.limits_for(tenant).max_returned_stream_errors]
        ]
        lines.append(f"user '{tenant}', total ignored: {len(failed)} out of {total} for stream: {stream}")
        return (429 if rate_limited else 400), "\n".join(lines) + "\n", {}


def _metadata_size(metadata: dict[str, str] | None) -> int:
    return sum(len(k.encode()) + len(v.encode()) for k, v in (metadata or {}).items())


def _entry_size(line: str, metadata: dict[str, str] | None) -> int:
    """pkg/util EntryTotalSize: the line's bytes plus the structured metadata's names and values."""
    return len(line.encode("utf-8")) + _metadata_size(metadata)


def grouped(messages: list[str]) -> str:
    """pkg/util/errors.go GroupedErrors.Error(): each distinct text once, counted when needed.

    Go's map iteration makes Loki's order unspecified; this keeps first-seen order.
    """
    counts: dict[str, int] = {}
    for message in messages:
        counts[message] = counts.get(message, 0) + 1
    many = len(counts) > 1
    return "; ".join(f"{n} errors like: {m}" if many or n > 1 else m for m, n in counts.items())


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


def production_loki(**kwargs: Any) -> LokiReceiver:
    """A receiver set up as the production Loki (the loki role): a tenant per node, queries across tenants."""
    return LokiReceiver(auth_enabled=True, multi_tenant_queries_enabled=True, **kwargs)


def running_receiver(**kwargs: Any) -> Iterator[LokiReceiver]:
    """Generator for a pytest fixture: a started receiver, stopped afterwards."""
    receiver = LokiReceiver(**kwargs).start()
    try:
        yield receiver
    finally:
        receiver.stop()
