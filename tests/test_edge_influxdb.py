"""On the InfluxDB backend the edge does not bind identity: a node's writes keep whatever uid and role it wrote.

InfluxDB checks its own credentials, scoped to a database (a bucket in
InfluxDB 2), never to a tag, and the reverse_proxy role passes InfluxDB's write
endpoints through as they are. Debian's Caddy (2.6) serves the Caddyfile the
role renders for metrics_backend influxdb, on loopback, in front of Debian's
InfluxDB 1.6.7 with authentication on; the node's write-only credential is an
InfluxDB user with WRITE on the database alone (what a node's write-only token
for one bucket is in InfluxDB 2). This is what docs/deployment.md's threat model
says a node can forge there, and why the preflight warns about nodes that are
not the operator's own (tests/test_ansible.py,
test_influxdb_preflight_warns_about_nodes_that_are_not_the_operators_own);
tests/test_edge_identity.py shows the VictoriaMetrics backend binding them.
"""

from __future__ import annotations

import json
import secrets
import time
import urllib.error
import urllib.parse
import urllib.request

import pytest
from servers import influxdb_v1
from test_victoriametrics_deploy import MetricsProxy

from telemetry_client import BufferSettings
from telemetry_client.metrics import MetricsLogger

pytestmark = pytest.mark.slow  # runs Caddy, InfluxDB and ansible-playbook

ADMIN = ("admin", secrets.token_urlsafe(16))


def _query(url: str, q: str, credentials: tuple[str, str] = ADMIN) -> dict:
    """InfluxQL as `credentials` (InfluxDB 1.6 takes u and p from the URL's query only)."""
    login = urllib.parse.urlencode({"u": credentials[0], "p": credentials[1]})
    data = urllib.parse.urlencode({"q": q, "db": "tplr"}).encode()
    with urllib.request.urlopen(f"{url}/query?{login}", data=data, timeout=30) as response:
        return json.loads(response.read())["results"][0]


@pytest.mark.timeout(900)
def test_on_influxdb_a_node_stores_points_under_any_uid_and_role(tmp_path):
    with influxdb_v1(auth_enabled=True) as server:
        # The first user is the admin, created without credentials (InfluxDB 1.x).
        data = urllib.parse.urlencode({"q": f"CREATE USER {ADMIN[0]} WITH PASSWORD '{ADMIN[1]}' WITH ALL PRIVILEGES"})
        urllib.request.urlopen(f"{server.url}/query", data=data.encode(), timeout=30).read()
        miner = ("miner-01", secrets.token_urlsafe(16))
        for statement in (
            "CREATE DATABASE tplr",
            f"CREATE USER \"{miner[0]}\" WITH PASSWORD '{miner[1]}'",
            f'GRANT WRITE ON tplr TO "{miner[0]}"',
        ):
            assert "error" not in _query(server.url, statement), statement
        with pytest.raises(urllib.error.HTTPError) as refused:  # it writes, never reads
            _query(server.url, "SELECT * FROM validator_scores", miner)
        assert refused.value.code in (401, 403)

        proxy = MetricsProxy(tmp_path, [])
        proxy.converge(
            ["miner-01", "validator-01"],
            metrics_backend="influxdb",
            reverse_proxy_influxdb_upstream=server.url.removeprefix("http://"),
            telemetry_node_identities={"miner-01": {"uid": "m1", "role": "miner"}},
        )
        proxy.start()
        try:
            # The miner's own credential, told it is the validator.
            with MetricsLogger(
                url=proxy.url(),
                api_version=1,
                database="tplr",
                username=miner[0],
                password=miner[1],
                uid="v1",
                role="validator",
                ca_certs=str(proxy.cert),
                buffer=BufferSettings(flush_interval=0.05),
                self_metrics_interval=None,
                system_metrics_interval=0,
            ) as logger:
                logger.log("validator_scores", fields={"score": 1.0}, timestamp=time.time_ns())
                assert logger.flush(30) == 0
                assert logger.stats()["sent"] == 1
        finally:
            proxy.stop()

        result = _query(server.url, "SELECT score, uid, role FROM validator_scores")
        [series] = result["series"]
        assert [row[1:] for row in series["values"]] == [[1.0, "v1", "validator"]]
