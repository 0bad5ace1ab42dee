"""Rotating a node's credentials loses nothing: the previous ones work beside the new ones until they retire.

Debian's Caddy (2.6) serves the Caddyfile the reverse_proxy role renders for
metrics_backend victoriametrics, on loopback, in front of Debian's
victoria-metrics (1.79.5) and of the test Loki receiver (tests/loki_receiver.py).
`make node-rotate`, `node-retire` and `node-credentials` are played as the
Makefile does: ansible/nodes.yml on a copy of the production inventory whose two
hosts are this machine (below the proxy's scratch root), then the role (the
deploy) and the role's reload handler. The node's clients are a real
MetricsLogger and a real LokiHandler, which drop a batch answered 401 as
`rejected`:

- after node-rotate the node's running clients, on their previous credentials,
  keep delivering, and clients on the new env file deliver too, under the same
  identity; after node-retire the previous credentials get 401 and the new ones
  deliver; nothing is counted `rejected` but the requests sent on purpose with a
  retired credential;
- the first deploy after the retirement date retires them too;
- with telemetry_rotation_retire_on_use, a deploy retires a previous credential
  once the access log shows a request with the new one (its fingerprint), each
  kind (Loki push, metrics write) on its own.
"""

from __future__ import annotations

import base64
import itertools
import json
import logging
import shutil
import time
from pathlib import Path

import pytest
import yaml
from loki_receiver import LokiReceiver
from servers import victoria_metrics
from test_victoriametrics_deploy import LOGS_DOMAIN, REPO, MetricsProxy, _assert_ok, _logger, _run, _samples

from telemetry_client import BufferSettings
from telemetry_client.loki import LokiHandler

pytestmark = pytest.mark.slow  # runs Caddy, VictoriaMetrics and ansible-playbook

NODE = "miner-01"
IDENTITIES = {NODE: {"uid": "m1", "role": "miner"}, "validator-01": {"uid": "v1", "role": "validator"}}
NODES = [NODE, "validator-01"]
KINDS = ("loki", "metrics")


class Network:
    """The proxy rendered by the role, the node tooling on an inventory of this machine, and the node's clients."""

    def __init__(self, tmp_path: Path, proxy: MetricsProxy, loki: LokiReceiver):
        self.tmp, self.proxy, self.loki = tmp_path, proxy, loki
        self.inventory = tmp_path / "inventory" / "prod"
        shutil.copytree(REPO / "inventory" / "prod", self.inventory)
        nodes = {"telemetry_nodes": NODES, "telemetry_node_identities": IDENTITIES}
        # The retirement dates last, under their bare key, as in the production inventory.
        self.nodes_file.write_text("---\n" + yaml.safe_dump(nodes) + "telemetry_node_retire_after:\n")
        self.env_dir = tmp_path / "env"
        self.steps = itertools.count()

    @property
    def nodes_file(self) -> Path:
        return self.inventory / "group_vars" / "all" / "nodes.yml"

    def retire_after(self) -> dict[str, str]:
        return yaml.safe_load(self.nodes_file.read_text())["telemetry_node_retire_after"] or {}

    def tooling(self, action: str, *extra: str) -> None:
        """ansible/nodes.yml, as `make node-<action> NODE=miner-01` runs it."""
        local = [
            "-e",
            f"telemetry_root={self.proxy.root}",
            "-e",
            "ansible_connection=local",
            "-e",
            "ansible_become=false",
            "-e",
            "ansible_python_interpreter={{ ansible_playbook_python }}",
            "-e",
            "metrics_backend=victoriametrics",
            "-e",
            f"node_env_dir={self.env_dir}",
        ]
        command = ["ansible-playbook", "-i", str(self.inventory / "hosts.yml"), "ansible/nodes.yml"]
        _assert_ok(_run([*command, "-e", f"node={NODE}", "-e", f"node_action={action}", *local, *extra]))

    def deploy(self, **variables) -> None:
        """The role with the inventory's retirement dates (site.yml), then Caddy's reload (the role's handler)."""
        settings = {
            "telemetry_node_identities": IDENTITIES,
            "telemetry_node_retire_after": self.retire_after(),
            "reverse_proxy_loki_domain": LOGS_DOMAIN,
            "reverse_proxy_loki_upstream": f"127.0.0.1:{self.loki.port}",
        }
        self.proxy.converge(NODES, **{**settings, **variables})
        if self.proxy.server is not None:
            self.proxy.reload()

    def env(self) -> dict[str, str]:
        """The node's env file, as `make node-credentials` wrote it."""
        text = (self.env_dir / f"{NODE}.env").read_text()
        return dict(line.split("=", 1) for line in text.splitlines() if line and not line.startswith("#"))

    def password(self, kind: str) -> str:
        return (self.proxy.dir / "secrets" / "nodes" / f"{NODE}.{kind}-password").read_text().strip()

    def loki_handler(self, password: str) -> LokiHandler:
        # The test resolves no name but localhost: the Host header picks the Loki site.
        return LokiHandler(
            self.proxy.url(),
            auth=(NODE, password),
            headers={"Host": f"{LOGS_DOMAIN}:{self.proxy.https_port}"},
            ca_certs=str(self.proxy.cert),
            buffer=BufferSettings(flush_interval=0.05),
        )

    def deliver(self, metrics, logs: LokiHandler, count: int = 3) -> list[int]:
        """`count` points and lines from one node's pair of clients; all delivered (nothing left over)."""
        steps = [next(self.steps) for _ in range(count)]
        logger = logging.getLogger(f"rotation-{id(logs)}")
        logger.propagate = False
        if logs not in logger.handlers:
            logger.addHandler(logs)
        for step in steps:
            metrics.log("training_step", fields={"step": step}, timestamp=time.time_ns())
            logger.warning("step %d", step)
        assert metrics.flush(30) == 0
        assert logs.flush(30) == 0
        assert _dropped(metrics, logs) == {}  # a 401 would show here as `rejected`
        return steps

    def logged_steps(self) -> list[int]:
        """The steps of the lines Loki stored (the probes of `_push_status` aside)."""
        messages = [entry.json()["message"] for entry in self.loki.entries if entry.line.startswith("{")]
        return sorted(int(message.split()[1]) for message in messages)


def _dropped(*clients) -> dict[str, int]:
    dropped: dict[str, int] = {}
    for client in clients:
        for reason, count in client.stats()["dropped_by_reason"].items():
            dropped[reason] = dropped.get(reason, 0) + count
    return dropped


@pytest.fixture
def network(tmp_path):
    with victoria_metrics() as server, LokiReceiver() as loki:
        proxy = MetricsProxy(tmp_path, [server.url.removeprefix("http://")])
        net = Network(tmp_path, proxy, loki)
        net.deploy()
        proxy.start()
        try:
            yield net, server
        finally:
            proxy.stop()


def _write_status(net: Network, token: str) -> int:
    return net.proxy.request("POST", "/api/v2/write?precision=ns", {"Authorization": "Token " + token}, b"probe v=1")[0]


def _push_status(net: Network, password: str) -> int:
    credentials = base64.b64encode(f"{NODE}:{password}".encode()).decode()
    headers = {
        "Host": f"{LOGS_DOMAIN}:{net.proxy.https_port}",
        "Authorization": "Basic " + credentials,
        "Content-Type": "application/json",
    }
    body = json.dumps({"streams": [{"stream": {"probe": "yes"}, "values": [[str(time.time_ns()), "probe"]]}]})
    return net.proxy.request("POST", "/loki/api/v1/push", headers, body.encode())[0]


@pytest.mark.timeout(1200)
def test_a_rotated_node_keeps_delivering_until_node_retire(network):
    net, server = network
    previous = {"metrics": net.proxy.token(NODE), "loki": net.password("loki")}
    # The node's processes run with the env file it was given.
    old_metrics, old_logs = _logger(net.proxy, previous["metrics"], "m1"), net.loki_handler(previous["loki"])
    delivered = net.deliver(old_metrics, old_logs)

    # make node-rotate: new credentials beside the previous ones.
    net.tooling("rotate")
    net.deploy()
    net.tooling("credentials")
    # The running node, not yet told, goes on delivering; the new env file delivers too.
    delivered += net.deliver(old_metrics, old_logs)
    env = net.env()
    assert env["INFLUXDB_TOKEN"] == net.proxy.token(NODE) != previous["metrics"]
    assert env["LOKI_PASSWORD"] == net.password("loki") != previous["loki"]
    caddyfile = net.proxy.caddyfile.read_text()
    # Both credentials of each kind map to the node's own identity.
    for token in (previous["metrics"], env["INFLUXDB_TOKEN"]):
        assert f'"Token {token}" {NODE} m1 miner yes ' in caddyfile
    for password in (previous["loki"], env["LOKI_PASSWORD"]):
        assert f'"Basic {base64.b64encode(f"{NODE}:{password}".encode()).decode()}" {NODE} m1 miner yes ' in caddyfile
    # The inventory says until when the previous ones work.
    retire_after = net.retire_after()
    assert list(retire_after) == [NODE] and retire_after[NODE] >= time.strftime("%Y-%m-%d", time.gmtime())

    new_metrics, new_logs = _logger(net.proxy, env["INFLUXDB_TOKEN"], "m1"), net.loki_handler(env["LOKI_PASSWORD"])
    delivered += net.deliver(new_metrics, new_logs)
    delivered += net.deliver(old_metrics, old_logs)
    # The node switches: its old processes stop with everything delivered.
    assert old_metrics.close(30) == 0 and old_logs.close(30) == 0

    # A second rotation before the first one is done is refused: it would stop the credentials in use.
    refused = _run(
        [
            "ansible-playbook",
            "-i",
            str(net.inventory / "hosts.yml"),
            "ansible/nodes.yml",
            "-e",
            f"node={NODE}",
            "-e",
            "node_action=rotate",
        ]
    )
    assert refused.returncode != 0 and f"{NODE} is being rotated" in refused.stdout, refused.stdout[-3000:]

    # make node-retire: the previous credentials stop working; the new ones go on.
    net.tooling("retire")
    assert net.retire_after() == {}
    net.deploy()
    assert _write_status(net, previous["metrics"]) == 401
    assert _push_status(net, previous["loki"]) == 401
    delivered += net.deliver(new_metrics, new_logs)
    assert _write_status(net, env["INFLUXDB_TOKEN"]) == 204
    assert _push_status(net, env["LOKI_PASSWORD"]) == 204
    assert not list((net.proxy.dir / "secrets" / "nodes" / "retiring").iterdir())

    assert _dropped(old_metrics, old_logs, new_metrics, new_logs) == {}
    assert new_metrics.close(30) == 0 and new_logs.close(30) == 0
    assert _samples(server, "training_step_step", "m1", len(delivered)) == delivered
    assert net.logged_steps() == delivered
    # A client still on a retired credential is refused (and counts it): the reason to rotate without loss.
    late = net.loki_handler(previous["loki"])
    logging.getLogger("rotation-late").addHandler(late)
    logging.getLogger("rotation-late").warning("step -1")
    late.flush(30)
    assert _dropped(late) == {"rejected": 1}
    late.close(5)


@pytest.mark.timeout(1200)
def test_the_first_deploy_after_the_retirement_date_retires_the_previous_credentials(network):
    net, server = network
    previous = {"metrics": net.proxy.token(NODE), "loki": net.password("loki")}
    other = net.proxy.token("validator-01")
    today = time.strftime("%Y-%m-%d", time.gmtime())
    net.tooling("rotate", "-e", f"node_retire_after={today}")
    net.deploy()  # on the date itself: still working
    assert _write_status(net, previous["metrics"]) == 204
    assert _push_status(net, previous["loki"]) == 204
    assert net.retire_after() == {NODE: today}

    # The first run after the date (the inventory's date, as a later day sees it).
    net.deploy(telemetry_node_retire_after={NODE: "2000-01-01"})
    assert _write_status(net, previous["metrics"]) == 401
    assert _push_status(net, previous["loki"]) == 401
    assert _write_status(net, net.proxy.token(NODE)) == 204
    assert _push_status(net, net.password("loki")) == 204
    assert _write_status(net, other) == 204  # other nodes are not touched
    # Every write, on either credential of the node, is stored under its own identity.
    assert sorted(s["metric"]["uid"] for s in server.wait_for_series("probe_v", 2)) == ["m1", "v1"]


@pytest.mark.timeout(1200)
def test_with_retire_on_use_a_deploy_retires_what_the_access_log_shows_replaced(network):
    net, _ = network
    previous = {"metrics": net.proxy.token(NODE), "loki": net.password("loki")}
    net.tooling("rotate")
    net.deploy()
    on_use = {"telemetry_rotation_retire_on_use": True}
    # Only the previous credentials were used since: nothing retires.
    assert _write_status(net, previous["metrics"]) == 204
    assert _push_status(net, previous["loki"]) == 204
    net.deploy(**on_use)
    assert _write_status(net, previous["metrics"]) == 204
    assert _push_status(net, previous["loki"]) == 204

    # The node pushes with its new Loki password: that kind retires, the metrics one stays.
    assert _push_status(net, net.password("loki")) == 204
    _wait_for_fingerprints(net, "logs-access.log", 2)
    net.deploy(**on_use)
    assert _push_status(net, previous["loki"]) == 401
    assert _write_status(net, previous["metrics"]) == 204

    assert _write_status(net, net.proxy.token(NODE)) == 204
    _wait_for_fingerprints(net, "metrics-access.log", 2)
    net.deploy(**on_use)
    assert _write_status(net, previous["metrics"]) == 401
    assert _write_status(net, net.proxy.token(NODE)) == 204
    assert _push_status(net, net.password("loki")) == 204


def _wait_for_fingerprints(net: Network, log: str, expected: int) -> None:
    """Until the access log shows `expected` different fingerprints for the node (its two credentials)."""
    path = net.proxy.logs / log
    deadline = time.monotonic() + 60
    while True:
        entries = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
        seen = {tuple(e["resp_headers"].get("Telemetry-Credential", [])) for e in entries if e["user_id"] == NODE} - {
            ()
        }
        if len(seen) >= expected or time.monotonic() > deadline:
            assert len(seen) == expected, entries
            return
        time.sleep(0.2)
