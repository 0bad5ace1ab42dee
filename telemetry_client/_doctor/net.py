"""One HTTP request taken apart step by step (DNS, TCP, TLS, HTTP), each step timed.

The shipping transport (`_engine.transport`) only needs to know that a request
failed; an operator needs to know *where*: a name that does not resolve, a port
that refuses, a certificate nobody vouched for, or a server that answered 401.
So this opens the connection by hand, one step at a time, with the same TLS
rules as the transport (verification on, the system trust store unless a CA
file is given) and keeps what each step saw: the addresses, the certificate's
names and expiry, the answer's status, headers and the server's clock.
"""

from __future__ import annotations

import datetime as dt
import email.utils
import http.client
import socket
import ssl
import time
import urllib.parse
from dataclasses import dataclass, field

MAX_BODY_BYTES = 64 * 1024


@dataclass
class TlsInfo:
    """What the TLS handshake showed, whether or not verification passed."""

    trust: str  # the CA file in use, "the system trust store (...)", or "verification off"
    verified: bool
    error: str | None = None  # the verification failure, in OpenSSL's words
    names: list[str] = field(default_factory=list)  # subjectAltName DNS names and IPs, else the CN
    issuer: str | None = None
    not_after: dt.datetime | None = None
    version: str | None = None

    def days_left(self, now: dt.datetime | None = None) -> float | None:
        if self.not_after is None:
            return None
        now = now or dt.datetime.now(dt.UTC)
        return (self.not_after - now).total_seconds() / 86_400


@dataclass
class Probe:
    """The outcome of one request: the step that failed (if any) and what every step saw."""

    url: str
    host: str
    port: int
    steps_ms: dict[str, float] = field(default_factory=dict)
    addresses: list[str] = field(default_factory=list)
    failed_step: str | None = None  # "dns", "tcp", "tls" or "http"
    error: str | None = None
    tls: TlsInfo | None = None
    status: int | None = None
    headers: dict[str, str] = field(default_factory=dict)  # lower-case names
    body: bytes = b""
    sent_at: float | None = None  # time.time() when the request was sent
    answered_at: float | None = None  # time.time() when the answer's headers arrived

    @property
    def answered(self) -> bool:
        return self.status is not None

    def text(self, limit: int = 300) -> str:
        """The answer's body as one line of text, shortened."""
        text = self.body.decode("utf-8", "replace").strip().replace("\n", " ")
        return text if len(text) <= limit else text[:limit] + "…"

    def server_date(self) -> dt.datetime | None:
        """The answer's `Date` header (one-second resolution), or None."""
        value = self.headers.get("date")
        if not value:
            return None
        try:
            parsed = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        return parsed if parsed.tzinfo else parsed.replace(tzinfo=dt.UTC)

    def clock_skew(self) -> float | None:
        """Seconds the server's clock is ahead of this machine's (negative: behind), from `Date`.

        The server stamps `Date` between our sending and our receiving, so the
        local reference is the midpoint; `Date` has whole seconds, so this is
        good to about one second plus half the round trip.
        """
        date = self.server_date()
        if date is None or self.sent_at is None or self.answered_at is None:
            return None
        local_mid = (self.sent_at + self.answered_at) / 2
        return date.timestamp() + 0.5 - local_mid  # +0.5: Date truncates to the second

    def describe_steps(self) -> str:
        return ", ".join(f"{step} {ms:.0f} ms" for step, ms in self.steps_ms.items())


def shown_url(url: str) -> str:
    """`url` without any user:password@ it may carry, so that it can be printed."""
    parts = urllib.parse.urlsplit(url)
    if "@" not in parts.netloc:
        return url
    return urllib.parse.urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))


def trust_description(verify: bool, ca_certs: str | None) -> str:
    if not verify:
        return "verification off"
    if ca_certs:
        return f"CA file {ca_certs}"
    paths = ssl.get_default_verify_paths()
    where = paths.cafile or paths.capath or paths.openssl_cafile
    return f"the system trust store ({where})"


def tls_context(verify: bool, ca_certs: str | None) -> ssl.SSLContext:
    """The same context the shipping transport builds."""
    context = ssl.create_default_context(cafile=ca_certs)
    if not verify:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    return context


def _certificate_facts(der: bytes | None, info: TlsInfo) -> None:
    """Names, issuer and expiry from the server's certificate (needs `cryptography`; skipped without it)."""
    if not der:
        return
    try:
        from cryptography import x509
    except ImportError:
        return
    try:
        cert = x509.load_der_x509_certificate(der)
    except ValueError:
        return
    info.not_after = cert.not_valid_after_utc
    info.issuer = cert.issuer.rfc4514_string()
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        info.names = [str(n) for n in san.get_values_for_type(x509.DNSName)] + [
            str(ip) for ip in san.get_values_for_type(x509.IPAddress)
        ]
    except x509.ExtensionNotFound:
        info.names = [a.value for a in cert.subject.get_attributes_for_oid(x509.oid.NameOID.COMMON_NAME)]


def _summary_facts(cert: dict, info: TlsInfo) -> None:
    """Names, issuer and expiry from `ssl`'s summary of a verified certificate."""
    info.names = [value for kind, value in cert.get("subjectAltName", ()) if kind in ("DNS", "IP Address")]
    info.issuer = ", ".join(f"{k}={v}" for rdn in cert.get("issuer", ()) for k, v in rdn) or None
    if cert.get("notAfter"):
        info.not_after = dt.datetime.fromtimestamp(ssl.cert_time_to_seconds(cert["notAfter"]), dt.UTC)


def _peer_certificate(address: tuple, host: str, timeout: float) -> bytes | None:
    """The certificate a server presents, fetched without verifying it (only to describe it)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    try:
        with (
            socket.create_connection(address[:2], timeout=timeout) as raw,
            context.wrap_socket(raw, server_hostname=host) as tls,
        ):
            return tls.getpeercert(binary_form=True)
    except (OSError, ssl.SSLError):
        return None


def _ms(start: float) -> float:
    return (time.perf_counter() - start) * 1000


def probe(
    url: str,
    *,
    method: str = "GET",
    body: bytes | None = None,
    headers: dict[str, str] | None = None,
    verify: bool = True,
    ca_certs: str | None = None,
    timeout: float = 5.0,
    max_body: int = MAX_BODY_BYTES,
) -> Probe:
    """Send one request to `url`, timing DNS, TCP, TLS and HTTP; never raises for network trouble."""
    parsed = urllib.parse.urlsplit(url)
    https = parsed.scheme == "https"
    host = parsed.hostname or ""
    port = parsed.port or (443 if https else 80)
    result = Probe(shown_url(url), host, port)
    target = (parsed.path or "/") + (f"?{parsed.query}" if parsed.query else "")

    start = time.perf_counter()
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        result.steps_ms["dns"] = _ms(start)
        result.failed_step, result.error = "dns", f"{host!r} does not resolve ({exc})"
        return result
    result.steps_ms["dns"] = _ms(start)
    result.addresses = list(dict.fromkeys(info[4][0] for info in infos))

    start = time.perf_counter()
    sock: socket.socket | None = None
    address: tuple = ()
    errors = []
    for family, kind, proto, _, address in infos:
        candidate = socket.socket(family, kind, proto)
        candidate.settimeout(timeout)
        try:
            candidate.connect(address)
            sock = candidate
            break
        except OSError as exc:
            candidate.close()
            reason = "connection refused" if isinstance(exc, ConnectionRefusedError) else str(exc) or "timed out"
            errors.append(f"{address[0]}: {reason}")
    result.steps_ms["tcp"] = _ms(start)
    if sock is None:
        result.failed_step, result.error = "tcp", "; ".join(errors)
        return result

    try:
        if https:
            result.tls = TlsInfo(trust_description(verify, ca_certs), verified=verify)
            start = time.perf_counter()
            try:
                sock = tls_context(verify, ca_certs).wrap_socket(sock, server_hostname=host)
            except ssl.SSLCertVerificationError as exc:
                result.steps_ms["tls"] = _ms(start)
                result.tls.verified = False
                result.tls.error = exc.verify_message or str(exc)
                result.failed_step, result.error = "tls", f"certificate verification failed: {result.tls.error}"
                _certificate_facts(_peer_certificate(address, host, timeout), result.tls)
                return result
            except (ssl.SSLError, OSError) as exc:
                result.steps_ms["tls"] = _ms(start)
                result.failed_step, result.error = "tls", f"TLS handshake failed: {exc}"
                return result
            result.steps_ms["tls"] = _ms(start)
            assert isinstance(sock, ssl.SSLSocket)
            result.tls.version = sock.version()
            _certificate_facts(sock.getpeercert(binary_form=True), result.tls)
            if result.tls.not_after is None and verify:  # without `cryptography`: the verified certificate's summary
                _summary_facts(sock.getpeercert() or {}, result.tls)

        connection = http.client.HTTPConnection(host, port, timeout=timeout)
        connection.sock = sock
        request_headers = {"User-Agent": "telemetry-client-doctor", **(headers or {})}
        start = time.perf_counter()
        result.sent_at = time.time()
        try:
            connection.request(method, target, body=body, headers=request_headers)
            response = connection.getresponse()
            result.answered_at = time.time()
            result.status = response.status
            result.headers = {k.lower(): v for k, v in response.getheaders()}
            result.body = response.read(max_body)
        except (OSError, http.client.HTTPException) as exc:
            result.failed_step = "http"
            result.error = "timed out waiting for the answer" if isinstance(exc, TimeoutError) else str(exc)
        result.steps_ms["http"] = _ms(start)
        return result
    finally:
        sock.close()
