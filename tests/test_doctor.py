"""The doctor against real servers: InfluxDB 1.6.7 (with auth), VictoriaMetrics, the Loki receiver,
TLS certificates that fail in each way, a refused port and servers whose clock is off.

Each case checks the verdict and that the fix sentence names the setting to change,
and the servers are asked afterwards what they stored: nothing, unless --send-test.
"""

from __future__ import annotations

import base64
import contextlib
import datetime as dt
import email.utils
import ipaddress
import json
import os
import ssl
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from fault_server import Reply, fault_server
from grafana_receiver import GrafanaReceiver, InfluxSource, LokiSource
from loki_receiver import LokiReceiver
from servers import free_port, influxdb_v1

from telemetry_client._doctor.report import Status
from telemetry_client._doctor.server import (
    Endpoint,
    authorisation_probe,
    clock_check,
    influx_authorisation,
    loki_authorisation,
    loki_limits,
    reachability,
    tls_check,
)
from telemetry_client._doctor.stack import StackSettings, stack_checks

pytestmark = pytest.mark.slow

# ---- servers ---------------------------------------------------------------------------

NODE = ("node", "node-password-1")
READER = ("reader", "reader-password-1")
ADMIN = ("admin", "admin-password-1")


def _basic(user: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


def _influx_query(url: str, q: str, auth: tuple[str, str] = ADMIN, db: str | None = None) -> dict:
    params = {"q": q, **({"db": db} if db else {})}
    request = urllib.request.Request(
        f"{url}/query", data=urllib.parse.urlencode(params).encode(), headers=_basic(*auth)
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


@pytest.fixture(scope="module")
def influx_auth() -> Iterator[str]:
    """InfluxDB 1.6.7 with auth-enabled: an admin, a node user that may only write, a reader that may only read."""
    with influxdb_v1(auth_enabled=True) as server:
        first = urllib.request.Request(
            f"{server.url}/query",
            data=urllib.parse.urlencode(
                {"q": f"CREATE USER {ADMIN[0]} WITH PASSWORD '{ADMIN[1]}' WITH ALL PRIVILEGES"}
            ).encode(),
        )
        urllib.request.urlopen(first, timeout=30).close()
        for statement in (
            "CREATE DATABASE telemetry",
            f"CREATE USER {NODE[0]} WITH PASSWORD '{NODE[1]}'",
            f"GRANT WRITE ON telemetry TO {NODE[0]}",
            f"CREATE USER {READER[0]} WITH PASSWORD '{READER[1]}'",
            f"GRANT READ ON telemetry TO {READER[0]}",
        ):
            _as_admin_once_known(server.url, statement)
        yield server.url


def _as_admin_once_known(url: str, statement: str, deadline_s: float = 120.0) -> None:
    """Run `statement` as the admin, waiting while InfluxDB still refuses it (403).

    In a run of the suite beside other work, the statements right after the admin
    was created were refused 403; alone they pass. Waiting on the answer, not on a
    fixed time, keeps the fixture from failing on a slow machine.
    """
    give_up = time.monotonic() + deadline_s
    while True:
        try:
            _influx_query(url, statement)
            return
        except urllib.error.HTTPError as exc:
            if exc.code != 403 or time.monotonic() > give_up:
                raise
            time.sleep(0.5)


def _stored_series(url: str) -> list:
    result = _influx_query(url, "SHOW SERIES", db="telemetry")["results"][0]
    return result.get("series", [])


def _influx_v1(url: str, auth: tuple[str, str] | None, database: str = "telemetry") -> Endpoint:
    return Endpoint(
        "InfluxDB",
        f"{url}/write?{urllib.parse.urlencode({'db': database, 'precision': 'n'})}",
        _basic(*auth) if auth else {},
        api_version=1,
        database=database,
        url_setting="INFLUXDB_URL",
        credential_setting="INFLUXDB_USERNAME/INFLUXDB_PASSWORD",
        verify_setting="INFLUXDB_VERIFY_TLS",
    )


def _influx_v2(url: str, token: str | None = "t0ken") -> Endpoint:
    return Endpoint(
        "InfluxDB",
        f"{url}/api/v2/write?org=telemetry&bucket=telemetry&precision=ns",
        {"Authorization": f"Token {token}"} if token else {},
        api_version=2,
        database="telemetry",
        org="telemetry",
        url_setting="INFLUXDB_URL",
        credential_setting="INFLUXDB_TOKEN",
        verify_setting="INFLUXDB_VERIFY_TLS",
    )


def _loki(url: str, headers: dict[str, str] | None = None) -> Endpoint:
    return Endpoint(
        "Loki",
        url.rstrip("/") + "/loki/api/v1/push",
        headers or {},
        url_setting="LOKI_URL",
        credential_setting="LOKI_USERNAME/LOKI_PASSWORD or LOKI_BEARER_TOKEN",
        verify_setting="verify_tls",
    )


# ---- authorisation without writing ---------------------------------------------------------


@pytest.mark.parametrize(
    ("auth", "status", "setting", "answer"),
    [
        (NODE, Status.OK, None, 204),
        (None, Status.FAIL, "INFLUXDB_USERNAME/INFLUXDB_PASSWORD", 401),
        ((NODE[0], "wrong"), Status.FAIL, "INFLUXDB_USERNAME/INFLUXDB_PASSWORD", 401),
        (READER, Status.FAIL, "INFLUXDB_USERNAME/INFLUXDB_PASSWORD", 403),
    ],
    ids=["write-user", "no-credentials", "wrong-password", "read-only-user"],
)
def test_influxdb_1x_credentials_are_judged_by_an_empty_write(influx_auth, auth, status, setting, answer):
    endpoint = _influx_v1(influx_auth, auth)
    result = authorisation_probe(endpoint)
    check = influx_authorisation(endpoint, result)
    assert result.status == answer
    assert check.status is status, check
    assert reachability(endpoint, result).status is Status.OK
    if setting:
        assert setting in check.fix
    assert _stored_series(influx_auth) == []  # the empty write stored nothing


def test_a_204_says_whether_the_server_checked_the_credentials(influx_auth, influx_server):
    checked_endpoint = _influx_v1(influx_auth, NODE)
    checked = influx_authorisation(checked_endpoint, authorisation_probe(checked_endpoint))
    assert "checked these credentials" in checked.evidence
    assert checked.details["unknown_credential_status"] == 401
    assert checked.evidence.startswith("InfluxDB 1.6.7")
    influx_server.create_database("telemetry")
    open_endpoint = _influx_v1(influx_server.url, NODE)  # auth off: anyone may write
    unchecked = influx_authorisation(open_endpoint, authorisation_probe(open_endpoint))
    assert unchecked.status is Status.OK
    assert "checks no credentials" in unchecked.evidence


def test_influxdb_1x_missing_credentials_and_wrong_password_are_told_apart(influx_auth):
    missing = influx_authorisation(_influx_v1(influx_auth, None), authorisation_probe(_influx_v1(influx_auth, None)))
    wrong_endpoint = _influx_v1(influx_auth, (NODE[0], "wrong"))
    wrong = influx_authorisation(wrong_endpoint, authorisation_probe(wrong_endpoint))
    assert "no credentials were sent" in missing.evidence
    assert "refused" in wrong.evidence
    assert "wrong" not in json.dumps(wrong.as_dict())  # the password is never shown


def test_influxdb_1x_unknown_database_names_the_database_setting(influx_auth):
    endpoint = _influx_v1(influx_auth, NODE, database="nope")
    check = influx_authorisation(endpoint, authorisation_probe(endpoint))
    assert check.status is Status.FAIL
    assert "INFLUXDB_DATABASE" in check.fix
    assert "database not found" in check.evidence


def test_influxdb_1x_asked_for_api_v2_says_to_use_api_version_1(influx_auth):
    endpoint = _influx_v2(influx_auth)
    check = influx_authorisation(endpoint, authorisation_probe(endpoint))
    assert check.status is Status.FAIL
    assert "INFLUXDB_API_VERSION=1" in check.fix


def _stored(server) -> list[str]:
    """Every sample the VictoriaMetrics server holds, in an order that does not depend on the export's."""
    return sorted(json.dumps(series, sort_keys=True) for series in server.export('{__name__=~".+"}'))


def test_victoria_metrics_v2_write_is_accepted_and_stores_nothing(victoria_server):
    # The server is shared by the session: compare what it holds before and after.
    victoria_server.flush()
    before = _stored(victoria_server)
    endpoint = _influx_v2(victoria_server.url)
    result = authorisation_probe(endpoint)
    check = influx_authorisation(endpoint, result)
    assert result.status == 204
    assert check.status is Status.OK
    assert "checks no credentials" in check.evidence
    assert check.details["unknown_credential_status"] == 204
    assert check.evidence.startswith("the server (answering as InfluxDB 1.8.0)")  # not InfluxDB itself
    victoria_server.flush()
    assert _stored(victoria_server) == before


def test_an_influxdb_2x_style_answer_reads_as_authorised():
    """InfluxDB 2.x checks the token's write permission before it refuses the empty body (write_handler.go)."""
    body = b'{"code":"invalid","message":"writing requires points"}'
    with fault_server() as server:
        server.then(Reply(400, body=body))
        endpoint = _influx_v2(server.url)
        check = influx_authorisation(endpoint, authorisation_probe(endpoint))
        assert check.status is Status.OK
        server.then(Reply(403, body=b'{"code":"forbidden","message":"insufficient permissions for write"}'))
        check = influx_authorisation(endpoint, authorisation_probe(endpoint))
        assert check.status is Status.FAIL
        assert "INFLUXDB_TOKEN" in check.fix
        assert server.lines == []


def test_loki_empty_push_proves_credentials_without_storing():
    with LokiReceiver(basic_auth=("node", "secret-pw")) as receiver:
        good = _loki(receiver.base_url, _basic("node", "secret-pw"))
        result = authorisation_probe(good)
        assert result.status == 422
        assert loki_authorisation(good, result).status is Status.OK
        bad = _loki(receiver.base_url, _basic("node", "nope"))
        check = loki_authorisation(bad, authorisation_probe(bad))
        assert check.status is Status.FAIL
        assert "LOKI_USERNAME/LOKI_PASSWORD" in check.fix
        missing = loki_authorisation(_loki(receiver.base_url), authorisation_probe(_loki(receiver.base_url)))
        assert "no credentials were sent" in missing.evidence
        assert receiver.count() == 0


def test_loki_without_tenant_names_the_tenant_setting():
    with LokiReceiver(auth_enabled=True) as receiver:
        endpoint = _loki(receiver.base_url)
        check = loki_authorisation(endpoint, authorisation_probe(endpoint))
        assert check.status is Status.FAIL
        assert "LOKI_TENANT_ID" in check.fix
        with_tenant = _loki(receiver.base_url, {"X-Scope-OrgID": "fleet"})
        assert loki_authorisation(with_tenant, authorisation_probe(with_tenant)).status is Status.OK
        assert receiver.count() == 0


def test_loki_url_pointing_elsewhere_is_a_404_naming_loki_url(influx_auth):
    endpoint = _loki(influx_auth)  # InfluxDB has no /loki/api/v1/push
    check = loki_authorisation(endpoint, authorisation_probe(endpoint))
    assert check.status is Status.FAIL
    assert "LOKI_URL" in check.fix


# ---- reachability ------------------------------------------------------------------------


def test_a_refused_port_fails_reachability_naming_the_url_setting():
    port = free_port()  # nothing listens there
    endpoint = _influx_v2(f"http://127.0.0.1:{port}")
    result = authorisation_probe(endpoint)
    check = reachability(endpoint, result)
    assert result.failed_step == "tcp"
    assert check.status is Status.FAIL
    assert "connection refused" in check.evidence
    assert "INFLUXDB_URL" in check.fix
    assert set(check.details["steps_ms"]) == {"dns", "tcp"}
    assert influx_authorisation(endpoint, result) is None  # no answer, no authorisation verdict


def test_a_name_that_does_not_resolve_fails_at_dns():
    endpoint = _loki("http://no-such-host.invalid:3100")
    result = authorisation_probe(endpoint)
    check = reachability(endpoint, result)
    assert result.failed_step == "dns"
    assert check.status is Status.FAIL
    assert "LOKI_URL" in check.fix


def test_every_step_is_timed_on_success(victoria_server):
    endpoint = _influx_v2(victoria_server.url)
    check = reachability(endpoint, authorisation_probe(endpoint))
    assert check.status is Status.OK
    assert list(check.details["steps_ms"]) == ["dns", "tcp", "http"]
    assert all(ms >= 0 for ms in check.details["steps_ms"].values())


# ---- TLS ---------------------------------------------------------------------------------


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A test CA, and certificates signed by it: good, expired, for another name; plus a self-signed one."""
    folder = tmp_path_factory.mktemp("doctor-tls")
    now = dt.datetime.now(dt.UTC)
    ca_key = _key()
    ca = (
        x509.CertificateBuilder()
        .subject_name(_name("doctor test CA"))
        .issuer_name(_name("doctor test CA"))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(days=30))
        .not_valid_after(now + dt.timedelta(days=30))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    paths = {"ca": folder / "ca.pem"}
    paths["ca"].write_bytes(ca.public_bytes(serialization.Encoding.PEM))

    def leaf(label: str, san: x509.GeneralName, before: dt.datetime, after: dt.datetime, self_signed: bool = False):
        key = _key()
        issuer_key, issuer = (key, _name("self-signed doctor test")) if self_signed else (ca_key, ca.subject)
        cert = (
            x509.CertificateBuilder()
            .subject_name(_name(f"doctor {label}") if not self_signed else issuer)
            .issuer_name(issuer)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(before)
            .not_valid_after(after)
            .add_extension(x509.SubjectAlternativeName([san]), critical=False)
            .sign(issuer_key, hashes.SHA256())
        )
        paths[f"{label}.crt"] = folder / f"{label}.crt"
        paths[f"{label}.key"] = folder / f"{label}.key"
        paths[f"{label}.crt"].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        paths[f"{label}.key"].write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            )
        )

    loopback = x509.IPAddress(ipaddress.ip_address("127.0.0.1"))
    leaf("good", loopback, now - dt.timedelta(days=1), now + dt.timedelta(days=90))
    leaf("soon", loopback, now - dt.timedelta(days=80), now + dt.timedelta(days=5))
    leaf("expired", loopback, now - dt.timedelta(days=20), now - dt.timedelta(days=2))
    leaf("wrongname", x509.DNSName("influx.example.org"), now - dt.timedelta(days=1), now + dt.timedelta(days=90))
    leaf("selfsigned", loopback, now - dt.timedelta(days=1), now + dt.timedelta(days=90), self_signed=True)
    return paths


@contextlib.contextmanager
def _https(pki: dict[str, Path], label: str) -> Iterator[str]:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(pki[f"{label}.crt"], pki[f"{label}.key"])
    with fault_server(tls=context) as server:
        yield server.url


def _tls_verdicts(url: str, ca: Path | None) -> tuple:
    endpoint = _influx_v2(url)
    endpoint.ca_certs = str(ca) if ca else None
    result = authorisation_probe(endpoint)
    return result, reachability(endpoint, result), tls_check(endpoint, result)


def test_a_trusted_certificate_shows_its_names_expiry_and_ca(pki):
    with _https(pki, "good") as url:
        _, reach, tls = _tls_verdicts(url, pki["ca"])
    assert reach.status is Status.OK and tls.status is Status.OK
    assert "tls" in reach.details["steps_ms"]
    assert "127.0.0.1" in tls.details["names"]
    assert str(pki["ca"]) in tls.details["trust"]
    assert tls.details["not_after"]


def test_an_expired_certificate_fails_with_its_date(pki):
    with _https(pki, "expired") as url:
        _, reach, tls = _tls_verdicts(url, pki["ca"])
    assert reach.status is Status.FAIL and tls.status is Status.FAIL
    assert "expired" in tls.evidence
    assert "renew" in tls.fix and "INFLUXDB_VERIFY_TLS" in tls.fix


def test_a_certificate_for_another_name_says_which_names_it_has(pki):
    with _https(pki, "wrongname") as url:
        _, _, tls = _tls_verdicts(url, pki["ca"])
    assert tls.status is Status.FAIL
    assert "influx.example.org" in tls.fix and "INFLUXDB_URL" in tls.fix


def test_a_certificate_from_an_unknown_ca_says_how_to_trust_it(pki):
    with _https(pki, "selfsigned") as url:
        _, _, tls = _tls_verdicts(url, None)
    assert tls.status is Status.FAIL
    assert "system trust store" in tls.evidence
    assert "ca_certs=" in tls.fix and "SSL_CERT_FILE" in tls.fix


def test_a_certificate_close_to_expiry_is_a_warning(pki):
    with _https(pki, "soon") as url:
        _, reach, tls = _tls_verdicts(url, pki["ca"])
    assert reach.status is Status.OK
    assert tls.status is Status.WARN
    assert "expires in" in tls.evidence


def test_plain_http_on_an_https_url_says_to_use_http(victoria_server):
    endpoint = _influx_v2(victoria_server.url.replace("http://", "https://"))
    check = reachability(endpoint, authorisation_probe(endpoint))
    assert check.status is Status.FAIL
    assert "http://" in check.fix and "INFLUXDB_URL" in check.fix


# ---- clock -----------------------------------------------------------------------------


@contextlib.contextmanager
def skewed_server(offset_s: float, config_yaml: str | None = None) -> Iterator[str]:
    """A tiny HTTP server whose `Date` header is `offset_s` off; it answers every POST 204 and GET /config."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:
            pass

        def date_time_string(self, timestamp: float | None = None) -> str:
            return email.utils.formatdate(time.time() + offset_s, usegmt=True)

        def _reply(self, status: int, body: bytes = b"") -> None:
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            self._reply(204)

        def do_GET(self) -> None:
            if self.path == "/config" and config_yaml is not None:
                self._reply(200, config_yaml.encode())
            else:
                self._reply(404, b"404 page not found\n")

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize(
    ("server_offset", "status", "words"),
    [
        (0, Status.OK, "accepts lines"),
        (-20 * 60, Status.FAIL, "timestamp too new"),  # the node is 20 min ahead: past the 10 min grace
        (8 * 86400, Status.FAIL, "timestamp too old"),  # the node is 8 days behind: past the 7 day max age
        (-5 * 60, Status.WARN, "short of being refused"),
    ],
    ids=["in-sync", "node-ahead", "node-behind", "drifting"],
)
def test_clock_skew_against_loki_says_what_it_costs(server_offset, status, words):
    with skewed_server(server_offset) as url:
        endpoint = _loki(url)
        result = authorisation_probe(endpoint)
    check = clock_check(endpoint, result)
    assert check.status is status, check
    assert words in check.evidence
    if status is not Status.OK:
        assert "NTP" in check.fix
    assert abs(check.details["server_minus_node_seconds"] - server_offset) < 3


def test_clock_skew_against_influxdb_is_a_warning_only():
    with skewed_server(-600) as url:
        endpoint = _influx_v2(url)
        check = clock_check(endpoint, authorisation_probe(endpoint))
    assert check.status is Status.WARN
    assert "drawn 10 min off" in check.evidence


def test_the_server_own_grace_period_is_used_when_it_shows_its_config():
    with skewed_server(-20 * 60) as url:  # node 20 min ahead
        endpoint = _loki(url)
        result = authorisation_probe(endpoint)
    relaxed = {"creation_grace_period": "1h", "reject_old_samples": "true", "reject_old_samples_max_age": "168h"}
    assert clock_check(endpoint, result, relaxed).status is Status.WARN


# ---- limits ------------------------------------------------------------------------------

LOKI_CONFIG = """\
server:
  http_listen_port: 3100
limits_config:
  ingestion_rate_mb: 16
  ingestion_burst_size_mb: 32
  max_line_size: 100KB
  creation_grace_period: 30m
  per_stream_rate_limit: 8MB
schema_config:
  configs: []
"""


def test_limits_from_the_server_config_are_compared_with_the_node_settings():
    with skewed_server(0, LOKI_CONFIG) as url:
        check, limits = loki_limits(_loki(url), node_max_line_bytes=256_000, node_batch_bytes=1 << 20)
    assert check.status is Status.WARN
    assert limits["max_line_size"] == "100KB" and limits["creation_grace_period"] == "30m"
    assert limits["reject_old_samples_max_age"] == "7d"  # not shown: the default
    assert "max_line_bytes=102400" in check.fix  # Loki's KB is 1024 bytes
    assert check.details["source"] == "server"


STREAM_BURST_CONFIG = """\
limits_config:
  ingestion_rate_mb: 16
  ingestion_burst_size_mb: 32
  per_stream_rate_limit_burst: 256KB
  allow_structured_metadata: false
"""


def test_a_batch_above_the_stream_burst_is_named_and_disallowed_metadata_reported():
    """One push holds one stream: the tenant's burst is not the only bound a batch must fit."""
    with skewed_server(0, STREAM_BURST_CONFIG) as url:
        check, limits = loki_limits(_loki(url), node_max_line_bytes=100_000, node_batch_bytes=1 << 20)
    assert check.status is Status.WARN
    assert "per_stream_rate_limit_burst" in check.evidence and "below 262144 bytes" in check.fix
    assert "structured metadata disallowed" in check.evidence and "metadata_removed" in check.evidence
    assert limits["allow_structured_metadata"] == "false"


def test_limits_fall_back_to_loki_defaults_when_config_is_hidden():
    with LokiReceiver() as receiver:
        check, limits = loki_limits(_loki(receiver.base_url), node_max_line_bytes=256_000, node_batch_bytes=1 << 20)
    assert check.status is Status.OK
    assert check.details["source"] == "defaults"
    assert "documented defaults" in check.evidence
    assert limits["max_line_size"] == "256KB"


# ---- the stack (make doctor) --------------------------------------------------------------


@contextlib.contextmanager
def loki_ready(status: int = 200, text: str = "ready\n") -> Iterator[str]:
    """Loki's `GET /ready`: 200 "ready" once the instance accepts traffic, 503 before (Loki HTTP API reference).

    The Loki receiver models the push API only, so readiness is this one-route server.
    """

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            body = text.encode() if self.path == "/ready" else b"404 page not found\n"
            self.send_response(status if self.path == "/ready" else 404)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def _grafana_dir(tmp_path: Path) -> Path:
    """A copy of the repository's provisioning: its data source file, dashboards and alert rules."""
    repository = Path(__file__).resolve().parent.parent / "grafana"
    root = tmp_path / "grafana"
    for folder, pattern in (
        ("provisioning/datasources", "*.yml"),
        ("dashboards", "*.json"),
        ("alerting", "rules.yaml"),
    ):
        (root / folder).mkdir(parents=True)
        for path in (repository / folder).glob(pattern):
            (root / folder / path.name).write_text(path.read_text())
    return root


def _alert_rules(grafana_dir: Path) -> list[dict]:
    """The rules as Grafana's provisioning API lists them once loaded (uid and title are what the doctor reads)."""
    document = yaml.safe_load((grafana_dir / "alerting" / "rules.yaml").read_text())
    return [rule for group in document["groups"] for rule in group["rules"]]


def _dashboards(grafana_dir: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted((grafana_dir / "dashboards").glob("*.json"))]


def _grafana_influx(url: str, auth: tuple[str, str]) -> InfluxSource:
    return InfluxSource(url, "telemetry", headers=tuple(_basic(*auth).items()))


def _by_name(checks: list) -> dict:
    return {c.name: c for c in checks}


def test_a_healthy_stack_passes_every_check(influx_auth, tmp_path):
    grafana_dir = _grafana_dir(tmp_path)
    rules = _alert_rules(grafana_dir)
    with (
        LokiReceiver() as loki,
        loki_ready() as loki_url,
        GrafanaReceiver(
            {"influxdb": _grafana_influx(influx_auth, READER), "loki": LokiSource(loki)},
            basic_auth=("admin", "grafana-pw"),
            dashboards=_dashboards(grafana_dir),
            alert_rules=rules,
        ) as grafana,
    ):
        settings = StackSettings(
            influxdb_url=influx_auth,
            loki_url=loki_url,
            grafana_url=grafana.url,
            api_version=1,
            node_headers=_basic(*NODE),
            read_headers=_basic(*READER),
            grafana_headers=_basic("admin", "grafana-pw"),
            grafana_dir=grafana_dir,
        )
        checks = stack_checks(settings)
    failing = [c for c in checks if c.status is not Status.OK]
    assert failing == []
    names = _by_name(checks)
    assert {"Grafana data source 'influxdb'", "Grafana data source 'loki'"} <= set(names)
    assert "all 6 provisioned dashboards" in names["Grafana dashboards"].evidence
    assert f"all {len(rules)} provisioned alert rules" in names["Grafana alert rules"].evidence
    assert len(rules) >= 1
    assert NODE[1] not in json.dumps([c.as_dict() for c in checks])
    assert _stored_series(influx_auth) == []  # the write checks stored nothing


def test_a_broken_stack_names_what_to_fix(influx_auth, tmp_path):
    grafana_dir = _grafana_dir(tmp_path)
    rules = _alert_rules(grafana_dir)
    loaded = _dashboards(grafana_dir)[1:]  # one dashboard failed to load
    with (
        LokiReceiver() as loki,
        loki_ready(503, "Ingester not ready: waiting for 15s after being ready\n") as loki_url,
        GrafanaReceiver(
            # Grafana's InfluxDB source reads with a credential InfluxDB refuses
            {"influxdb": _grafana_influx(influx_auth, NODE), "loki": LokiSource(loki)},
            basic_auth=("admin", "grafana-pw"),
            dashboards=loaded,
            alert_rules=rules[1:],  # one rule failed to load
        ) as grafana,
    ):
        loki.stop()  # Grafana's Loki source cannot connect
        settings = StackSettings(
            influxdb_url=influx_auth,
            loki_url=loki_url,
            grafana_url=grafana.url,
            api_version=1,
            node_headers=_basic(*READER),  # a node given the read credential: it reads and cannot write
            read_headers=_basic(*NODE),  # Grafana given the write credential
            grafana_headers=_basic("admin", "grafana-pw"),
            grafana_dir=grafana_dir,
        )
        checks = _by_name(stack_checks(settings))
        wrong_admin = _by_name(
            stack_checks(StackSettings(**{**settings.__dict__, "grafana_headers": _basic("admin", "x")}))
        )
    assert checks["Loki service"].status is Status.FAIL and "503" in checks["Loki service"].evidence
    assert checks["Grafana data source 'influxdb'"].status is Status.FAIL
    assert "INFLUXDB_READ_TOKEN" in checks["Grafana data source 'influxdb'"].fix
    assert checks["Grafana data source 'loki'"].status is Status.FAIL
    assert checks["Grafana dashboards"].status is Status.FAIL
    assert "python -m grafana.build_dashboards" in checks["Grafana dashboards"].fix
    assert checks["Grafana alert rules"].status is Status.FAIL
    assert rules[0]["uid"] in checks["Grafana alert rules"].evidence
    assert checks["Node token"].status is Status.FAIL
    assert "may not write and may read" in checks["Node token"].evidence
    assert checks["Grafana read token"].status is Status.FAIL
    assert "may write and may not read" in checks["Grafana read token"].evidence
    assert "INFLUXDB_READ_TOKEN" in checks["Grafana read token"].fix
    assert wrong_admin["Grafana dashboards"].status is Status.FAIL
    assert "GRAFANA_USER/GRAFANA_PASSWORD" in wrong_admin["Grafana dashboards"].fix


def test_a_stopped_stack_says_to_start_it():
    port = free_port()
    settings = StackSettings(
        influxdb_url=f"http://127.0.0.1:{port}",
        loki_url=f"http://127.0.0.1:{port}",
        grafana_url=f"http://127.0.0.1:{port}",
    )
    checks = _by_name(stack_checks(settings))
    for service in ("InfluxDB service", "Loki service", "Grafana service"):
        assert checks[service].status is Status.FAIL
        assert "make up" in checks[service].fix


# ---- the command, as an operator runs it ---------------------------------------------------

_CLEAN = ("INFLUXDB_", "LOKI_", "WANDB_", "TELEMETRY_", "GRAFANA_", "SSL_CERT")


def _doctor(env: dict[str, str], *args: str, home: Path) -> tuple[int, dict, str]:
    """Run `python -m telemetry_client doctor --json` in a fresh process with only `env` configured."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(_CLEAN)}
    full = {**base, "HOME": str(home), "WANDB_MODE": "disabled", **env}
    root = Path(__file__).resolve().parent.parent
    full["PYTHONPATH"] = os.pathsep.join(filter(None, [str(root), base.get("PYTHONPATH")]))
    process = subprocess.run(
        [sys.executable, "-m", "telemetry_client", "doctor", "--json", "--timeout", "10", *args],
        env=full,
        cwd=home,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert process.stdout, process.stderr
    return process.returncode, json.loads(process.stdout), process.stdout + process.stderr


def _verdicts(report: dict) -> dict[str, dict]:
    return {c["name"]: c for c in report["checks"]}


def _node_env(influx_url: str, loki_url: str, password: str = NODE[1]) -> dict[str, str]:
    return {
        "INFLUXDB_URL": influx_url,
        "INFLUXDB_API_VERSION": "1",
        "INFLUXDB_USERNAME": NODE[0],
        "INFLUXDB_PASSWORD": password,
        "LOKI_URL": loki_url,
        "LOKI_USERNAME": "node",
        "LOKI_PASSWORD": "loki-secret-pw",
    }


def test_a_working_node_exits_0_and_stores_nothing(influx_auth, tmp_path):
    with LokiReceiver(basic_auth=("node", "loki-secret-pw")) as loki:
        code, report, output = _doctor(_node_env(influx_auth, loki.base_url), home=tmp_path)
        assert loki.count() == 0
    verdicts = _verdicts(report)
    assert code == 0, [c for c in report["checks"] if c["status"] != "OK"]
    assert report["status"] == "OK"
    assert {
        "InfluxDB reachability",
        "InfluxDB authorisation",
        "InfluxDB clock",
        "Loki authorisation",
        "Loki limits",
    } <= set(verdicts)
    assert _stored_series(influx_auth) == []
    for secret in (NODE[1], "loki-secret-pw"):
        assert secret not in output  # secrets are never printed...
    assert (
        "characters, sha256" in verdicts["InfluxDB configuration"]["evidence"]
    )  # ...only their length and fingerprint


def test_wrong_credentials_exit_2_with_the_setting_to_change(influx_auth, tmp_path):
    with LokiReceiver(basic_auth=("node", "loki-secret-pw")) as loki:
        env = {**_node_env(influx_auth, loki.base_url, password="not-the-password"), "LOKI_PASSWORD": "nope-nope"}
        code, report, output = _doctor(env, home=tmp_path)
    verdicts = _verdicts(report)
    assert code == 2 and report["status"] == "FAIL"
    assert verdicts["InfluxDB authorisation"]["status"] == "FAIL"
    assert "INFLUXDB_USERNAME/INFLUXDB_PASSWORD" in verdicts["InfluxDB authorisation"]["fix"]
    assert verdicts["Loki authorisation"]["status"] == "FAIL"
    assert "LOKI_USERNAME/LOKI_PASSWORD" in verdicts["Loki authorisation"]["fix"]
    assert "not-the-password" not in output and "nope-nope" not in output


def test_missing_credentials_and_a_refused_port(influx_auth, tmp_path):
    port = free_port()
    env = {"INFLUXDB_URL": influx_auth, "INFLUXDB_API_VERSION": "1", "LOKI_URL": f"http://127.0.0.1:{port}"}
    code, report, _ = _doctor(env, home=tmp_path)
    verdicts = _verdicts(report)
    assert code == 2
    assert "no credentials were sent" in verdicts["InfluxDB authorisation"]["evidence"]
    assert verdicts["Loki reachability"]["status"] == "FAIL"
    assert "connection refused" in verdicts["Loki reachability"]["evidence"]
    assert "LOKI_URL" in verdicts["Loki reachability"]["fix"]


def test_configuration_errors_and_ignored_settings_name_the_variable(tmp_path):
    code, report, _ = _doctor({"INFLUXDB_HOST": "127.0.0.1", "INFLUXDB_PORT": "eighty"}, home=tmp_path)
    config = _verdicts(report)["InfluxDB configuration"]
    assert code == 2 and config["status"] == "FAIL"
    assert "port" in config["evidence"]
    assert "INFLUXDB_PORT" in config["fix"]

    env = {"INFLUXDB_URL": f"http://127.0.0.1:{free_port()}", "INFLUXDB_HOST": "elsewhere", "INFLUXDB_TOKEN": "t"}
    _, report, _ = _doctor(env, home=tmp_path)
    ignored = _verdicts(report)["InfluxDB configuration: ignored settings"]
    assert ignored["status"] == "WARN"
    assert "INFLUXDB_HOST" in ignored["evidence"] and "INFLUXDB_HOST" in ignored["fix"]


def test_the_process_settings_are_shown_and_a_bad_sigterm_switch_fails(tmp_path):
    code, report, _ = _doctor({"TELEMETRY_HANDLE_SIGTERM": "0", "TELEMETRY_EXIT_TIMEOUT": "5"}, home=tmp_path)
    process = _verdicts(report)["Process configuration"]
    assert process["status"] == "OK"
    assert process["details"]["settings"] == {
        "exit_timeout": {"value": 5.0, "source": "env TELEMETRY_EXIT_TIMEOUT"},
        "handle_sigterm": {"value": False, "source": "env TELEMETRY_HANDLE_SIGTERM"},
    }
    code, report, _ = _doctor({"TELEMETRY_HANDLE_SIGTERM": "maybe"}, home=tmp_path)
    process = _verdicts(report)["Process configuration"]
    assert code == 2 and process["status"] == "FAIL"
    assert "'maybe'" in process["evidence"] and "TELEMETRY_HANDLE_SIGTERM" in process["fix"]
    _, report, _ = _doctor({"TELEMETRY_EXIT_TIMEOUT": "3s"}, home=tmp_path)
    process = _verdicts(report)["Process configuration"]
    assert process["status"] == "WARN" and "'3s' is not a number" in process["evidence"]
    assert "TELEMETRY_EXIT_TIMEOUT" in process["fix"] and process["details"]["settings"]["exit_timeout"]["value"] == 3.0


def test_nothing_configured_warns_and_says_what_to_set(tmp_path):
    code, report, _ = _doctor({}, home=tmp_path)
    verdicts = _verdicts(report)
    assert code == 1
    assert "INFLUXDB_URL" in verdicts["InfluxDB configuration"]["fix"]
    assert "LOKI_URL" in verdicts["Loki configuration"]["fix"]
    assert verdicts["W&B"]["status"] == "OK" and "disabled" in verdicts["W&B"]["evidence"]


def test_send_test_stores_exactly_one_point_and_one_line_and_reads_them_back(influx_auth, tmp_path):
    with (
        LokiReceiver(basic_auth=("node", "loki-secret-pw")) as loki,
        GrafanaReceiver({"loki": LokiSource(loki)}, token="unused") as loki_query_api,
    ):
        code, report, _ = _doctor(
            _node_env(influx_auth, loki.base_url),
            "--send-test",
            "--read-username",
            READER[0],
            "--read-password",
            READER[1],
            "--loki-read-url",
            loki_query_api.url,
            home=tmp_path,
        )
        lines = loki.lines()
    verdicts = _verdicts(report)
    assert code == 0, [c for c in report["checks"] if c["status"] != "OK"]
    for name in ("Test point", "Test point read back", "Test line", "Test line read back"):
        assert verdicts[name]["status"] == "OK", verdicts[name]
    run_id = verdicts["Test point"]["details"]["run_id"]
    rows = _influx_query(influx_auth, "SELECT * FROM telemetry_doctor_test", db="telemetry")["results"][0]["series"]
    assert [len(s["values"]) for s in rows] == [1]
    assert run_id in json.dumps(rows)
    assert len(lines) == 1 and run_id in lines[0]
    _influx_query(influx_auth, "DROP MEASUREMENT telemetry_doctor_test", db="telemetry")


def test_an_unknown_ca_fails_until_ssl_cert_file_trusts_it(pki, tmp_path):
    with _https(pki, "good") as url:
        env = {"INFLUXDB_URL": url, "INFLUXDB_TOKEN": "node-token-123"}
        code, report, _ = _doctor(env, home=tmp_path)
        _, trusted, _ = _doctor({**env, "SSL_CERT_FILE": str(pki["ca"])}, home=tmp_path)
    refused = _verdicts(report)["InfluxDB TLS"]
    assert code == 2 and refused["status"] == "FAIL"
    assert "SSL_CERT_FILE" in refused["fix"]
    tls = _verdicts(trusted)["InfluxDB TLS"]
    assert tls["status"] == "OK", tls
    assert str(pki["ca"]) in tls["details"]["trust"]
    assert _verdicts(trusted)["InfluxDB authorisation"]["status"] == "OK"


def test_wandb_online_checks_its_server_and_lists_run_id_files(tmp_path):
    wandb_dir = tmp_path / "wandb-runs"
    wandb_dir.mkdir()
    (wandb_dir / "wandb_run_id_miner7.txt").write_text("abc123\n")
    env = {"WANDB_MODE": "online", "WANDB_API_KEY": "k" * 40, "WANDB_DIR": str(wandb_dir)}
    with skewed_server(0) as url:  # any HTTP answer: the API server is reachable
        _, report, output = _doctor({**env, "WANDB_BASE_URL": url}, home=tmp_path)
    verdicts = _verdicts(report)
    assert verdicts["W&B"]["status"] == "OK"
    assert "wandb_run_id_miner7.txt" in verdicts["W&B"]["evidence"]
    assert "40 characters" in verdicts["W&B"]["evidence"] and "k" * 40 not in output
    assert verdicts["W&B reachability"]["status"] == "OK"

    _, report, _ = _doctor({**env, "WANDB_BASE_URL": f"http://127.0.0.1:{free_port()}"}, home=tmp_path)
    unreachable = _verdicts(report)["W&B reachability"]
    assert unreachable["status"] == "WARN"  # initialize_wandb continues offline: late, not lost
    assert "WANDB_BASE_URL" in unreachable["fix"] and "offline" in unreachable["evidence"]

    _, report, _ = _doctor({"WANDB_MODE": "online", "WANDB_DIR": str(wandb_dir)}, home=tmp_path)
    no_key = _verdicts(report)["W&B"]
    assert no_key["status"] == "WARN" and "WANDB_API_KEY" in no_key["fix"]
    assert "W&B reachability" not in _verdicts(report)


def test_a_proxy_in_the_environment_is_named_when_the_server_is_unreachable(monkeypatch):
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.example:3128")
    endpoint = _influx_v2(f"http://127.0.0.1:{free_port()}")
    check = reachability(endpoint, authorisation_probe(endpoint))
    assert "HTTPS_PROXY is set, but the client does not use proxies" in check.fix


def test_the_authorisation_verdict_says_which_api_version_was_checked(influx_auth, victoria_server):
    v1 = _influx_v1(influx_auth, NODE)
    assert "API v1, /write" in influx_authorisation(v1, authorisation_probe(v1)).evidence
    v2 = _influx_v2(victoria_server.url)
    assert "API v2, /api/v2/write" in influx_authorisation(v2, authorisation_probe(v2)).evidence


def test_certificate_facts_without_cryptography_come_from_ssl(pki, monkeypatch):
    """`cryptography` is not a dependency of the client: a verified certificate is still described."""
    import builtins

    real_import = builtins.__import__

    def no_cryptography(name, *args, **kwargs):
        if name.startswith("cryptography"):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    with _https(pki, "good") as url:
        monkeypatch.setattr(builtins, "__import__", no_cryptography)
        _, _, tls = _tls_verdicts(url, pki["ca"])
        monkeypatch.setattr(builtins, "__import__", real_import)
    assert tls.status is Status.OK
    assert "127.0.0.1" in tls.details["names"]
    assert tls.details["not_after"]


def test_a_password_written_in_the_url_is_never_printed(influx_auth, tmp_path):
    with_password = influx_auth.replace("http://", f"http://{NODE[0]}:{NODE[1]}@")
    env = {"INFLUXDB_URL": with_password, "INFLUXDB_API_VERSION": "1", "LOKI_URL": with_password}
    code, report, output = _doctor(env, home=tmp_path)
    assert NODE[1] not in output
    verdicts = _verdicts(report)
    assert verdicts["InfluxDB credentials in the URL"]["status"] == "WARN"
    assert "INFLUXDB_USERNAME/INFLUXDB_PASSWORD" in verdicts["InfluxDB credentials in the URL"]["fix"]
    assert "no credentials were sent" in verdicts["InfluxDB authorisation"]["evidence"]  # as the client sends none
    assert verdicts["Loki authorisation"]["status"] == "FAIL" and code == 2


def test_the_module_entry_point_knows_one_command():
    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))}

    def run(*args: str) -> subprocess.CompletedProcess:
        command = [sys.executable, "-m", "telemetry_client", *args]
        return subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)

    assert run("doctor", "--help").returncode == 0
    unknown = run("diagnose")
    assert unknown.returncode == 2 and "doctor" in unknown.stderr
    assert run().returncode == 2
