"""HTTP for the shipping engine: one kept-alive connection, hard timeouts, gzip, TLS verified by default.

A request is split in two (`start` sends it, `Pending.finish` reads the answer)
so that the sender thread can encode the next batch while the server works on
this one. That is why this uses `http.client` directly rather than urllib3 or
requests, whose calls send and wait in one step.
"""

from __future__ import annotations

import gzip
import http.client
import select
import socket
import ssl
import time
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from isal import isal_zlib

from telemetry_client._engine.settings import Timeouts

GZIP_WBITS = 31  # a window of 2**15 with a gzip header and trailer (zlib's convention, which isal_zlib keeps)


class TransportError(Exception):
    """The request did not get an HTTP answer: refused, reset, timed out, TLS failure.

    `refused`: nothing listens on the server's port (the connection was refused), so
    the server cannot have seen the request, and trying again costs it nothing.
    `lost`: the connection broke before the answer (reset, closed), as when the
    server is killed mid-request; the next attempt finds out whether it is gone.
    """

    def __init__(self, message: str, refused: bool = False, lost: bool = False) -> None:
        super().__init__(message)
        self.refused = refused
        self.lost = lost


@dataclass(frozen=True)
class Response:
    status: int
    body: bytes
    retry_after: str | None


class Answer(Protocol):
    """A request sent: whether its answer has come, and the answer.

    Optional: `wait(timeout) -> bool`, which waits up to `timeout` seconds and says
    whether `finish()` would now return at once (answered, or timed out). With it the
    engine keeps encoding while a request hangs; without it `finish()` may block.
    """

    def answered(self) -> bool: ...

    def finish(self) -> Response: ...


class Transport(Protocol):
    """What the engine and the sinks use of a transport: `HttpTransport`, or a test's in-memory one."""

    url: str
    headers: dict[str, str]

    def reset(self) -> None: ...

    def encode_body(self, body: bytes) -> bytes: ...

    def decode_body(self, body: bytes) -> bytes: ...

    def start(self, body: bytes, timeout_cap: float | None = None) -> Answer: ...

    def close(self) -> None: ...


class Destination(Protocol):
    """Where a logger given `destination=` sends instead of a server (`telemetry_client.testing`)."""

    url: str  # what the logger shows as its target

    def open(self, sink: str, headers: Mapping[str, str], compress: bool) -> Transport:
        """A transport for one logger's channel; `sink` is "influxdb" or "loki" (the body's format)."""
        ...


class _OneSend:
    """A request's head and body in one system call; `http.client` sends them in two.

    Each send releases the interpreter lock, and a caller that logs without pause
    then holds it for up to the switch interval (5 ms). During `request()`, the
    first `send` (the head) is kept and goes out with the next (the body), or alone
    at the end (a request without a body). A request that fails discards its
    connection, and a head kept with it.
    """

    _holding = False
    _head: bytes | None = None

    def request(self, *args: Any, **kwargs: Any) -> None:
        self._holding = True
        try:
            super().request(*args, **kwargs)  # type: ignore[misc]
        finally:
            self._holding = False
            head, self._head = self._head, None
        if head is not None:
            super().send(head)  # type: ignore[misc]

    def send(self, data: Any) -> None:
        if self._holding and self._head is None:
            self._head = data
            return
        head, self._head = self._head, None
        self._holding = False
        super().send(head + bytes(data) if head is not None else data)  # type: ignore[misc]


class _OneSendHTTPConnection(_OneSend, http.client.HTTPConnection):
    pass


class _OneSendHTTPSConnection(_OneSend, http.client.HTTPSConnection):
    pass


def gzip_body(body: bytes) -> bytes:
    """`body` gzipped by ISA-L at its level 1 (most of the gain for little CPU).

    One call writes the gzip header, the data and its checksum (`wbits` 31), with
    the interpreter lock released throughout. ISA-L's level 1 takes about a third
    of zlib's level-1 time here and writes a few percent fewer bytes; any gzip
    reader reads it (it is one ordinary gzip member).
    """
    return isal_zlib.compress(body, 1, wbits=GZIP_WBITS)


class Pending:
    """A request that has been sent; `finish()` waits for and returns its response."""

    def __init__(self, transport: HttpTransport, connection: http.client.HTTPConnection, read_timeout: float) -> None:
        self._transport = transport
        self._connection = connection
        self._read_timeout = read_timeout
        self._deadline = time.monotonic() + read_timeout  # the answer must start by then
        self._started = False  # the answer has started to come (a look at the socket said so)

    def answered(self) -> bool:
        """True once the server has started to answer (reading would not wait)."""
        return self._readable(0.0)

    def wait(self, timeout: float) -> bool:
        """Wait up to `timeout` s for the answer; True once `finish()` would not wait (answered, or timed out)."""
        remaining = self._deadline - time.monotonic()
        return remaining <= 0 or self._readable(min(timeout, remaining)) or time.monotonic() >= self._deadline

    def _readable(self, timeout: float) -> bool:
        sock = self._connection.sock
        if sock is None or self._started:
            return True
        if isinstance(sock, ssl.SSLSocket) and sock.pending():
            self._started = True
            return True
        try:
            self._started = bool(select.select([sock], [], [], timeout)[0])
        except (OSError, ValueError):
            return True
        return self._started

    def finish(self) -> Response:
        """The answer. Its first byte must come within the read timeout of the request's start, as a whole."""
        try:
            sock = self._connection.sock
            if sock is not None and not self.answered():
                # Not started yet: what is left of the read timeout, as a whole. Once
                # it has started, the socket keeps the read timeout `start` gave it.
                _set_timeout(sock, max(0.001, self._deadline - time.monotonic()))
            response = self._connection.getresponse()
            body = response.read()
            if response.will_close:
                self._transport.disconnect()
            return Response(response.status, body, response.getheader("Retry-After"))
        except (OSError, http.client.HTTPException) as exc:
            self._transport.disconnect()
            raise TransportError(_describe(exc), lost=isinstance(exc, ConnectionError)) from exc


class HttpTransport:
    """POSTs request bodies to one URL over one reused connection."""

    def __init__(
        self,
        url: str,
        headers: dict[str, str] | None = None,
        *,
        verify_tls: bool = True,
        ca_certs: str | None = None,
        connect_timeout: float = Timeouts.connect,
        read_timeout: float = Timeouts.read,
        compress: bool = True,
    ) -> None:
        self.url = url
        parsed = urllib.parse.urlsplit(url)
        if parsed.scheme not in ("http", "https") or not parsed.hostname:
            raise ValueError(f"not an http(s) URL: {url!r}")
        self._https = parsed.scheme == "https"
        self._host = parsed.hostname
        self._port = parsed.port or (443 if self._https else 80)
        self._target = parsed.path + (f"?{parsed.query}" if parsed.query else "")
        self.headers = dict(headers or {})
        self.verify_tls = verify_tls
        self.ca_certs = ca_certs
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self.compress = compress
        if compress:
            self.headers["Content-Encoding"] = "gzip"
        self._tls: ssl.SSLContext | None = None
        self._connection: _OneSendHTTPConnection | _OneSendHTTPSConnection | None = None

    def _tls_context(self) -> ssl.SSLContext:
        if self._tls is None:
            context = ssl.create_default_context(cafile=self.ca_certs)
            if not self.verify_tls:
                context.check_hostname = False
                context.verify_mode = ssl.CERT_NONE
            self._tls = context
        return self._tls

    def _connect(self, timeout: float) -> _OneSendHTTPConnection | _OneSendHTTPSConnection:
        if self._https:
            connection: _OneSendHTTPConnection | _OneSendHTTPSConnection = _OneSendHTTPSConnection(
                self._host, self._port, timeout=timeout, context=self._tls_context()
            )
        else:
            connection = _OneSendHTTPConnection(self._host, self._port, timeout=timeout)
        connection.connect()
        connection.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return connection

    def disconnect(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None

    def reset(self) -> None:
        """Forget the connection without closing it: a forked child must not touch its parent's socket."""
        self._connection = None

    def encode_body(self, body: bytes) -> bytes:
        """Compress `body` when gzip is on."""
        return gzip_body(body) if self.compress else body

    def decode_body(self, body: bytes) -> bytes:
        """The uncompressed form of a body `encode_body` made."""
        return gzip.decompress(body) if self.compress else body

    def start(self, body: bytes, timeout_cap: float | None = None) -> Pending:
        """Send a POST of an already-encoded body; the caller reads the answer with `finish()`."""
        read = self.read_timeout if timeout_cap is None else max(0.05, min(self.read_timeout, timeout_cap))
        connect = min(self.connect_timeout, read)
        for attempt in (1, 2):
            reused = self._connection is not None
            try:
                if self._connection is None:
                    self._connection = self._connect(connect)
                connection = self._connection
                _set_timeout(connection.sock, read)
                connection.request("POST", self._target, body=body, headers=self.headers)
                return Pending(self, connection, read)
            except (OSError, http.client.HTTPException) as exc:
                self.disconnect()
                if not (reused and attempt == 1):  # a kept-alive socket the server closed: one fresh try
                    refused = isinstance(exc, ConnectionRefusedError)
                    lost = isinstance(exc, ConnectionError) and not refused
                    raise TransportError(_describe(exc), refused=refused, lost=lost) from exc
        raise AssertionError("unreachable")

    def post(self, body: bytes, timeout_cap: float | None = None) -> Response:
        """Send and wait: `start` then `finish`."""
        return self.start(body, timeout_cap).finish()

    def close(self) -> None:
        self.disconnect()


def _set_timeout(sock: socket.socket, timeout: float) -> None:
    """Set a socket's timeout only when it changes: each setting is a system call that releases the interpreter
    lock, which a caller logging without pause then holds for up to the switch interval (5 ms)."""
    if sock.gettimeout() != timeout:
        sock.settimeout(timeout)


def _describe(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError | socket.timeout):
        return f"timed out ({exc})" if str(exc) else "timed out"
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    return f"{type(exc).__name__}: {exc}"
