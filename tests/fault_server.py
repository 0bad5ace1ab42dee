"""A local HTTP write endpoint whose answers the test scripts: statuses, Retry-After, delays.

It decodes what it accepts (gzip, line protocol) so tests can count every line
that arrived and prove that nothing was lost or sent twice. With `upstream` it is
a proxy: a request it would accept is forwarded there, after the scripted delay,
and the upstream's answer is returned (a slow edge in front of a real server).
"""

from __future__ import annotations

import contextlib
import gzip
import http.client
import socket
import ssl
import struct
import threading
import time
import urllib.parse
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass
class Reply:
    """One scripted answer: an HTTP status, optional Retry-After, optional delay before answering.

    `reset`: read the request, then reset the connection without an answer, as a
    server killed mid-request does (recorded as status 0).
    """

    status: int = 204
    retry_after: str | None = None
    delay: float = 0.0
    body: bytes = b""
    reset: bool = False


@dataclass
class FaultServer:
    port: int
    scheme: str = "http"
    script: deque[Reply] = field(default_factory=deque)
    lines: list[bytes] = field(default_factory=list)
    requests: list[int] = field(default_factory=list)  # status answered, in order
    received: int = 0  # requests read, including those still held by a delay
    upstream: str | None = None  # forward accepted requests to this base URL (a proxy)
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.port}"

    def then(self, *replies: Reply) -> None:
        """Answer the next requests with `replies`, in order; afterwards 204."""
        with self.lock:
            self.script.extend(replies)

    def wait_until(self, condition: Callable[[FaultServer], bool], timeout: float = 60.0) -> bool:
        """Poll `condition(self)` (under the lock) until it holds or `timeout` passes."""
        deadline = time.monotonic() + timeout
        while True:
            with self.lock:
                if condition(self):
                    return True
            if time.monotonic() > deadline:
                return False
            time.sleep(0.02)

    def wait_for_lines(self, count: int, timeout: float = 20.0) -> list[bytes]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                if len(self.lines) >= count:
                    return list(self.lines)
            time.sleep(0.02)
        with self.lock:
            return list(self.lines)


def _handler(state: FaultServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:
            pass

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            with state.lock:
                state.received += 1
                reply = state.script.popleft() if state.script else Reply()
            if reply.delay:
                time.sleep(reply.delay)
            if reply.reset:
                with state.lock:
                    state.requests.append(0)
                self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                self.close_connection = True
                self.connection.close()
                return
            status, answer = reply.status, reply.body
            if reply.status < 300 and state.upstream is not None:
                status, answer = _forward(state.upstream, self.path, self.headers.get("Content-Encoding"), body)
            if status < 300:
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                with state.lock:
                    state.lines.extend(line for line in body.split(b"\n") if line)
            with state.lock:
                state.requests.append(status)
            with contextlib.suppress(OSError):  # the client may be gone (a process killed mid-request)
                self.send_response(status)
                if reply.retry_after is not None:
                    self.send_header("Retry-After", reply.retry_after)
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

    return Handler


def _forward(upstream: str, path: str, encoding: str | None, body: bytes) -> tuple[int, bytes]:
    """POST `body` to `upstream` + `path` as received; the upstream's status and body."""
    parsed = urllib.parse.urlsplit(upstream)
    connection = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=60)
    try:
        headers = {"Content-Encoding": encoding} if encoding else {}
        connection.request("POST", path, body=body, headers=headers)
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


@contextmanager
def fault_server(
    port: int = 0, tls: ssl.SSLContext | None = None, upstream: str | None = None
) -> Iterator[FaultServer]:
    """Serve on 127.0.0.1:`port` (0: any free port) until the block ends; HTTPS with `tls`; a proxy to `upstream`."""
    state = FaultServer(port, upstream=upstream)
    server = ThreadingHTTPServer(("127.0.0.1", port), _handler(state))
    server.daemon_threads = True
    if tls is not None:
        server.socket = tls.wrap_socket(server.socket, server_side=True)
        state.scheme = "https"
    state.port = server.server_address[1]
    # A short poll interval: shutdown() waits for it, and the default 0.5 s would end every test late.
    thread = threading.Thread(target=server.serve_forever, args=(0.02,), daemon=True)
    thread.start()
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()
