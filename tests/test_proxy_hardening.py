"""The internet-facing Caddy of the reverse_proxy role: how its container is confined, and HSTS.

The role is rendered (render-only mode, as tests/test_victoriametrics_deploy.py
does); Debian's Caddy serves the rendered Caddyfile on loopback, and
docker-compose validates the rendered container definition.
"""

from __future__ import annotations

import http.client
import socket
import ssl
import subprocess
from pathlib import Path

import pytest
import yaml
from servers import require_binary
from test_victoriametrics_deploy import LOGS_DOMAIN, METRICS_DOMAIN, MetricsProxy, _assert_ok, _run

pytestmark = pytest.mark.slow

ROLE = Path(__file__).resolve().parents[1] / "ansible" / "roles" / "reverse_proxy"
GRAFANA_DOMAIN = "grafana.localhost"
HSTS = "max-age=31536000"


def _certificate(tmp_path: Path) -> tuple[Path, Path]:
    """One certificate for the three sites (the proxy's own covers two)."""
    cert, key = tmp_path / "sites-cert.pem", tmp_path / "sites-key.pem"
    names = ",".join(f"DNS:{name}" for name in (METRICS_DOMAIN, LOGS_DOMAIN, GRAFANA_DOMAIN))
    request = ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"]
    subject = ["-days", "2", "-subj", f"/CN={METRICS_DOMAIN}", "-addext", f"subjectAltName={names}"]
    _assert_ok(_run([*request, *subject, "-keyout", str(key), "-out", str(cert)]))
    return cert, key


def _answer(
    proxy: MetricsProxy, host: str, method: str, path: str, headers: dict | None = None
) -> http.client.HTTPResponse:
    """One HTTPS request to `host` (SNI and Host) on the proxy's port, the certificate verified."""
    context = ssl.create_default_context(cafile=str(proxy.cert))
    raw = socket.create_connection(("127.0.0.1", proxy.https_port), timeout=30)
    conn = http.client.HTTPSConnection(host, proxy.https_port, context=context, timeout=30)
    conn.sock = context.wrap_socket(raw, server_hostname=host)
    conn.request(method, path, headers=headers or {})
    response = conn.getresponse()
    response.read()
    conn.close()
    return response


@pytest.fixture
def three_sites(tmp_path):
    """The role rendered with Grafana, Loki and the metrics site; their upstreams are not running."""
    proxy = MetricsProxy(tmp_path, ["127.0.0.1:9"])
    proxy.cert, proxy.key = _certificate(tmp_path)
    proxy.converge(
        ["miner-01"],
        reverse_proxy_tls_certificate=proxy.cert.read_text(),
        reverse_proxy_tls_private_key=proxy.key.read_text(),
        reverse_proxy_loki_domain=LOGS_DOMAIN,
        reverse_proxy_loki_upstream="127.0.0.1:9",
        reverse_proxy_grafana_domain=GRAFANA_DOMAIN,
        reverse_proxy_grafana_upstream="127.0.0.1:9",
        reverse_proxy_grafana_basic_auth=False,
    )
    return proxy


def test_every_tls_site_sends_hsts_on_every_answer(three_sites):
    proxy = three_sites
    proxy.start()
    try:
        answers = {
            # Grafana (its upstream down: 502), a refused push (401), a path that is not
            # served (404), and the metrics site's health (502, VictoriaMetrics down).
            (GRAFANA_DOMAIN, "GET", "/api/health"): 502,
            (LOGS_DOMAIN, "POST", "/loki/api/v1/push"): 401,
            (LOGS_DOMAIN, "GET", "/loki/api/v1/labels"): 404,
            (METRICS_DOMAIN, "POST", "/api/v2/write"): 401,
            (METRICS_DOMAIN, "GET", "/health"): 502,
        }
        for (host, method, path), status in answers.items():
            response = _answer(proxy, host, method, path)
            assert response.status == status, (host, path)
            assert response.getheader("Strict-Transport-Security") == HSTS, (host, path)
    finally:
        proxy.stop()


def test_oversized_request_headers_are_refused_so_an_audit_line_stays_bounded(three_sites):
    """Caddy's max_header_size (the role's 16KB): Go's server answers 431 and no site sees the request.

    Go reads up to 4096 bytes above MaxHeaderBytes before it refuses (net/http/server.go,
    readRequest and the "431 Request Header Fields Too Large" answer), hence the margins here.
    Without the option Go allows 1 MB (http.DefaultMaxHeaderBytes) and the access log keeps it all.
    """
    proxy = three_sites
    proxy.start()
    try:
        for host, path in ((METRICS_DOMAIN, "/api/v2/write"), (LOGS_DOMAIN, "/loki/api/v1/push")):
            assert _answer(proxy, host, "POST", path, {"X-Pad": "a" * 4000}).status == 401, host
            assert _answer(proxy, host, "POST", path, {"X-Pad": "b" * 64_000}).status == 431, host
        logs = "".join(path.read_text() for path in proxy.logs.glob("*.log"))
        assert "a" * 4000 in logs  # the ordinary request is logged with its headers
        assert "b" * 1000 not in logs
        assert max(len(line) for line in logs.splitlines()) < 20_000
    finally:
        proxy.stop()


def test_hsts_can_be_left_out_and_a_malformed_value_is_refused(tmp_path):
    proxy = MetricsProxy(tmp_path, ["127.0.0.1:9"])
    proxy.converge(["miner-01"], reverse_proxy_hsts="")
    assert "Strict-Transport-Security" not in proxy.caddyfile.read_text()
    with pytest.raises(AssertionError, match="reverse_proxy_hsts"):
        proxy.converge(["miner-01"], reverse_proxy_hsts='max-age=1" evil')


def test_the_caddy_container_is_confined_and_compose_accepts_it(three_sites):
    proxy = three_sites
    rendered = proxy.dir / "container.compose.yml"
    result = subprocess.run(
        [require_binary("docker-compose"), "-f", str(rendered), "config"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    [caddy] = yaml.safe_load(result.stdout)["services"].values()
    assert caddy["user"] == "10006:10006"
    assert caddy["cap_drop"] == ["ALL"] and caddy["cap_add"] == ["NET_BIND_SERVICE"]
    assert caddy["security_opt"] == ["no-new-privileges:true"]
    assert caddy["read_only"] is True
    assert [entry.split(":", 1)[0] for entry in caddy["tmpfs"]] == ["/tmp"]
    assert caddy["mem_limit"] and int(caddy["pids_limit"]) > 0
    # Certificates and the ACME account (/data) and the autosave (/config) stay on the host.
    binds = {volume["target"]: volume for volume in caddy["volumes"]}
    assert binds["/data"]["type"] == "bind" and not binds["/data"].get("read_only")
    assert binds["/config"]["type"] == "bind"
    # The public ports, 80 and 443, reach the ones Caddy listens on (the test's own
    # here); by default unprivileged ones, which a process without capabilities binds.
    assert caddy["ports"] == [f"0.0.0.0:80:{proxy.http_port}/tcp", f"0.0.0.0:443:{proxy.https_port}/tcp"]
    defaults = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
    assert (defaults["reverse_proxy_listen_http_port"], defaults["reverse_proxy_listen_https_port"]) == (8080, 8443)
    # What Caddy reads is its user's, what it holds of the nodes' passwords is not mounted.
    for path in (proxy.conf, proxy.conf / "Caddyfile", proxy.conf / "certs" / "key.pem", proxy.dir / "data"):
        assert path.stat().st_uid == 10006, path
    assert (proxy.dir / "secrets").stat().st_uid == 0
