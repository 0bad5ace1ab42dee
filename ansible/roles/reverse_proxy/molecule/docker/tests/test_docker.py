"""Caddy really in front: TLS, and basic auth where there must be some."""

import json
import os
import time
from pathlib import Path

SECRETS = Path(os.environ["MOLECULE_EPHEMERAL_DIRECTORY"]) / "secrets"
CA = "/tmp/telemetry-molecule/reverse_proxy/reverse_proxy/data/caddy/pki/authorities/local/root.crt"


def _status(host, url, *args):
    return host.check_output(f"curl -sS --cacert {CA} -o /dev/null -w '%{{http_code}}' {' '.join(args)} {url}")


def _password(name):
    return (SECRETS / f"{name}.password").read_text().strip()


def test_grafana_needs_the_proxy_credentials(host):
    url = "https://grafana.localhost:18443/api/health"
    assert _status(host, url) == "401"
    assert _status(host, url, f"-u 'operator:{_password('operator')}'") == "200"


def test_loki_push_needs_the_node_credentials(host):
    url = "https://logs.localhost:18443/loki/api/v1/push"
    body = json.dumps(
        {"streams": [{"stream": {"service": "molecule"}, "values": [[str(time.time_ns()), "through the proxy"]]}]}
    )
    args = ["-H 'Content-Type: application/json'", f"--data-raw '{body}'"]
    assert _status(host, url, *args) == "401"
    assert _status(host, url, *args, "-u 'node:wrong-password'") == "401"
    assert _status(host, url, *args, f"-u 'node:{_password('node')}'") == "204"


def test_loki_query_api_is_not_exposed(host):
    url = "https://logs.localhost:18443/loki/api/v1/labels"
    assert _status(host, url, f"-u 'node:{_password('node')}'") == "404"


def test_influxdb_health_through_the_proxy(host):
    assert _status(host, "https://metrics.localhost:18443/health") == "200"
    assert _status(host, "https://metrics.localhost:18443/api/v2/buckets") == "404"
