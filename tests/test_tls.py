"""TLS verification is on by default: a certificate nobody vouched for is refused, a given CA is trusted.

Also what the transport writes per request, over HTTP and HTTPS.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import socket
import ssl
import threading
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from fault_server import fault_server

from telemetry_client import BufferSettings
from telemetry_client._engine.transport import HttpTransport
from telemetry_client.metrics import MetricsLogger

FAST = BufferSettings(flush_interval=0.05, retry_base=0.02, retry_cap=0.1)


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 (its own CA)."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "telemetry test")])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    folder = tmp_path_factory.mktemp("tls")
    cert_path, key_path = folder / "cert.pem", folder / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    key_path.chmod(0o600)
    return cert_path, key_path


def _server_context(certificate) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(*certificate)
    return context


@pytest.fixture
def https_server(certificate):
    with fault_server(tls=_server_context(certificate)) as server:
        yield server


def _logger(url: str, **kwargs: object) -> MetricsLogger:
    return MetricsLogger(url=url, token="t", buffer=FAST, self_metrics_interval=None, read_timeout=2, **kwargs)


def test_an_unknown_certificate_is_refused_by_default(https_server):
    logger = _logger(https_server.url)
    logger.log("m", fields={"x": 1})
    assert logger.flush(0.5) == 1
    assert "CERTIFICATE_VERIFY_FAILED" in logger.stats()["last_error"]
    assert https_server.lines == []
    logger.close(0.1)


def test_a_given_ca_is_trusted(https_server, certificate):
    logger = _logger(https_server.url, ca_certs=str(certificate[0]))
    logger.log("m", fields={"x": 1})
    assert logger.flush(5) == 0
    assert https_server.lines[0].startswith(b"m x=1 ")
    logger.close(1)


def test_verification_can_be_turned_off_explicitly(https_server):
    logger = _logger(https_server.url, verify_tls=False)
    logger.log("m", fields={"x": 2})
    assert logger.flush(5) == 0
    assert https_server.lines[0].startswith(b"m x=2 ")
    logger.close(1)


@pytest.mark.parametrize("scheme", ["http", "https"])
def test_a_request_goes_out_in_one_send(scheme, certificate, monkeypatch):
    """Head and body in one system call: each send releases the interpreter lock to callers that log without pause."""
    sends: list[int] = []
    me = threading.get_ident()
    for cls in (socket.socket, ssl.SSLSocket):
        original = cls.sendall

        def counting(self, data, *args, _original=original, **kwargs):
            if threading.get_ident() == me:
                sends.append(len(data))
            return _original(self, data, *args, **kwargs)

        monkeypatch.setattr(cls, "sendall", counting)
    with fault_server(tls=_server_context(certificate) if scheme == "https" else None) as server:
        transport = HttpTransport(f"{server.url}/write?db=d", ca_certs=str(certificate[0]))
        try:
            for i in range(3):
                assert transport.start(transport.encode_body(b"m f=1 %d\n" % i)).finish().status == 204
        finally:
            transport.close()
        assert len(server.wait_for_lines(3)) == 3
    assert len(sends) == 3, sends
