"""HTTP for the shipping engine: pooled connections, hard timeouts, gzip, TLS verified by default."""

from __future__ import annotations

import gzip
from dataclasses import dataclass

import urllib3


class TransportError(Exception):
    """The request did not get an HTTP answer: refused, reset, timed out, TLS failure."""


@dataclass(frozen=True)
class Response:
    status: int
    body: bytes
    retry_after: str | None


class HttpTransport:
    """POSTs request bodies to one URL over a reused connection."""

    def __init__(
        self,
        url: str,
        headers: dict[str, str] | None = None,
        *,
        verify_tls: bool = True,
        ca_certs: str | None = None,
        connect_timeout: float = 3.0,
        read_timeout: float = 10.0,
        compress: bool = True,
    ) -> None:
        self.url = url
        self.headers = dict(headers or {})
        self.verify_tls = verify_tls
        self.ca_certs = ca_certs
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self.compress = compress
        if compress:
            self.headers["Content-Encoding"] = "gzip"
        self._pool = self._new_pool()

    def _new_pool(self) -> urllib3.PoolManager:
        return urllib3.PoolManager(
            num_pools=2,
            maxsize=1,
            cert_reqs="CERT_REQUIRED" if self.verify_tls else "CERT_NONE",
            ca_certs=self.ca_certs,
            retries=False,
        )

    def reset(self) -> None:
        """Drop pooled connections; a forked child must not share its parent's sockets."""
        self._pool = self._new_pool()

    def encode_body(self, body: bytes) -> bytes:
        """Compress `body` when gzip is on (level 1: most of the gain for little CPU)."""
        return gzip.compress(body, compresslevel=1, mtime=0) if self.compress else body

    def post(self, body: bytes, timeout_cap: float | None = None) -> Response:
        """POST an already-encoded body; never waits longer than the configured timeouts."""
        read = self.read_timeout if timeout_cap is None else max(0.05, min(self.read_timeout, timeout_cap))
        connect = min(self.connect_timeout, read)
        try:
            response = self._pool.request(
                "POST",
                self.url,
                body=body,
                headers=self.headers,
                timeout=urllib3.Timeout(connect=connect, read=read),
                redirect=False,
                preload_content=True,
            )
        except urllib3.exceptions.HTTPError as exc:
            raise TransportError(f"{type(exc).__name__}: {exc}") from exc
        return Response(response.status, response.data or b"", response.headers.get("Retry-After"))

    def close(self) -> None:
        self._pool.clear()
