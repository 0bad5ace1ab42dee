"""Several proxy hosts: a node's credentials are the same on every one of them.

`site.yml` is rendered (render-only mode) for the production inventory with a
second host in group reverse_proxy, `edge_prod`, each host below a root of its
own, with metrics_backend victoriametrics, so that both kinds of node password
the proxy checks (Loki pushes, metrics writes) are exercised. Both rendered
Caddyfiles run on Debian's Caddy (2.6) on loopback, in front of Debian's
victoria-metrics and of the test Loki receiver (tests/loki_receiver.py), and
are reloaded by the role's handler after each deploy. `make node-*` is played as
the Makefile plays it (ansible/nodes.yml, then site.yml):

- one node's env file writes and pushes through both proxies;
- node-rotate: the previous and the new credentials work on both during the
  overlap; node-retire: the previous ones get 401 on both;
- a wiped proxy host gets the credentials back from the other at its next
  (limited) run; a node added in a run limited to one proxy host gets the same
  password on the other at its own limited run; a run that cannot read the
  other proxy host stops before it writes anything.
"""

from __future__ import annotations

import base64
import hashlib
import http.client
import json
import os
import secrets
import shutil
import socket
import ssl
import string
import subprocess
import time
from contextlib import ExitStack
from pathlib import Path

import pytest
import yaml
from firewall_rules import admitted
from loki_receiver import LokiReceiver
from servers import bind_caddy_to_loopback, free_port, listening_addresses, require_binary, victoria_metrics

pytestmark = pytest.mark.slow  # ansible-playbook, Caddy and VictoriaMetrics

REPO = Path(__file__).resolve().parents[1]
OUTPUT_TAIL = 12000
PROXIES = ["grafana_prod", "edge_prod"]
METRICS_DOMAIN = "localhost"
LOGS_DOMAIN = "logs.localhost"
NODE = "miner-01"
NODES = [NODE, "validator-01"]
IDENTITIES = {NODE: {"uid": "m1", "role": "miner"}, "validator-01": {"uid": "v1", "role": "validator"}}


def _env() -> dict[str, str]:
    return dict(
        os.environ,
        ANSIBLE_NOCOLOR="1",
        ANSIBLE_FORCE_COLOR="0",
        NO_COLOR="1",
        PY_COLORS="0",
        ANSIBLE_CONFIG=str(REPO / "ansible.cfg"),
    )


def _run(cmd: list[str], check: bool = True) -> subprocess.CompletedProcess:
    if shutil.which(cmd[0]) is None:
        pytest.fail(f"{cmd[0]} is not installed (pip install -e '.[dev]')")
    result = subprocess.run(cmd, cwd=REPO, env=_env(), capture_output=True, text=True, timeout=1200, check=False)
    if check:
        output = (result.stdout + "\n" + result.stderr)[-OUTPUT_TAIL:]
        assert result.returncode == 0, f"$ {' '.join(cmd)}\nexit {result.returncode}\n{output}"
    return result


def _bcrypt_like() -> str:
    alphabet = "./" + string.ascii_letters + string.digits
    return "$2b$12$" + "".join(secrets.choice(alphabet) for _ in range(53))


def _closed_port() -> int:
    """A loopback port nothing listens on (an SSH connection to it is refused)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Proxy:
    """One proxy host: its scratch root, the ports its Caddy serves on, the Caddy process."""

    def __init__(self, tmp: Path, name: str):
        self.name = name
        self.tmp = tmp / name
        self.tmp.mkdir()
        self.root = self.tmp / "root"
        self.dir = self.root / "opt" / "telemetry" / "reverse_proxy"
        self.nodes_dir = self.dir / "secrets" / "nodes"
        self.https_port, self.http_port, self.admin_port = free_port(), free_port(), free_port()
        self.server: subprocess.Popen | None = None

    @property
    def caddyfile(self) -> Path:
        return self.dir / "conf" / "Caddyfile"

    def host_vars(self, loki: str, victoria: str) -> dict:
        """What the inventory gives this host: its root, its ports, and the loopback servers as upstreams."""
        return {
            "ansible_connection": "local",
            "ansible_python_interpreter": "{{ ansible_playbook_python }}",
            "telemetry_root": str(self.root),
            "reverse_proxy_config_mount": str(self.dir / "conf"),
            "reverse_proxy_log_mount": str(self.dir / "logs"),
            "reverse_proxy_admin_address": f"localhost:{self.admin_port}",
            "reverse_proxy_listen_http_port": self.http_port,
            "reverse_proxy_listen_https_port": self.https_port,
            "reverse_proxy_loki_upstream": loki,
            "reverse_proxy_victoriametrics_upstreams": [victoria],
            # Caddy writes to VictoriaMetrics itself: the edge vmauth is a container this
            # test does not run (tests/test_edge_budget.py runs it).
            "reverse_proxy_node_write_concurrency": 0,
        }

    def _caddy_env(self) -> dict[str, str]:
        return dict(
            os.environ,
            HOME=str(self.tmp),
            XDG_DATA_HOME=str(self.tmp / "xdg-data"),
            XDG_CONFIG_HOME=str(self.tmp / "xdg-config"),
        )

    def start(self, cert: Path) -> None:
        caddy = require_binary("caddy")
        bind_caddy_to_loopback(self.caddyfile)
        self.log = (self.tmp / "caddy.log").open("w")
        self.server = subprocess.Popen(
            [caddy, "run", "--config", str(self.caddyfile), "--adapter", "caddyfile"],
            env=self._caddy_env(),
            stdout=self.log,
            stderr=self.log,
        )
        deadline = time.monotonic() + 120
        while True:
            try:
                self.request(cert, "GET", "/health", {})
                assert listening_addresses(self.server.pid) == {"127.0.0.1"}, listening_addresses(self.server.pid)
                return
            except OSError:
                assert self.server.poll() is None, (self.tmp / "caddy.log").read_text()[-OUTPUT_TAIL:]
                assert time.monotonic() < deadline, (self.tmp / "caddy.log").read_text()[-OUTPUT_TAIL:]
                time.sleep(0.5)

    def reload(self) -> None:
        """The role's reload handler (caddy reload --force), as it runs inside the container."""
        handlers = yaml.safe_load((REPO / "ansible/roles/reverse_proxy/handlers/main.yml").read_text())
        [handler] = [h for h in handlers if h["name"] == "Reload caddy"]
        argv = [
            arg.replace("{{ reverse_proxy_config_mount }}", str(self.dir / "conf"))
            for arg in handler["community.docker.docker_container_exec"]["argv"]
        ]
        if "\tdefault_bind 127.0.0.1\n" not in self.caddyfile.read_text():  # a run limited to another host left it
            bind_caddy_to_loopback(self.caddyfile)
        result = subprocess.run(argv, env=self._caddy_env(), capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stdout + result.stderr

    def stop(self) -> None:
        if self.server is not None:
            self.server.terminate()
            self.server.wait(timeout=60)
            self.log.close()

    def request(self, cert: Path, method: str, path: str, headers: dict, body: bytes = b"") -> int:
        context = ssl.create_default_context(cafile=str(cert))
        conn = http.client.HTTPSConnection(METRICS_DOMAIN, self.https_port, context=context, timeout=30)
        try:
            conn.request(method, path, body=body or None, headers=headers)
            response = conn.getresponse()
            response.read()
            return response.status
        finally:
            conn.close()

    def files(self) -> dict[str, tuple[str, int, int]]:
        """The credential files: {path below secrets/nodes: (digest of the content, mode, mtime)}."""
        return {
            str(path.relative_to(self.nodes_dir)): (
                hashlib.sha256(path.read_bytes()).hexdigest()[:16],
                path.stat().st_mode & 0o777,
                int(path.stat().st_mtime),
            )
            for path in sorted(self.nodes_dir.rglob("*-password"))
        }


class Deployment:
    """The production inventory with two proxy hosts, rendered; both Caddys; the node tooling."""

    def __init__(self, tmp: Path, loki: LokiReceiver, victoria: str):
        self.tmp = tmp
        self.loki = loki
        self.proxies = {name: Proxy(tmp, name) for name in PROXIES}
        self.metrics_root = tmp / "metrics_prod"
        self.inventory = tmp / "inventory" / "prod"
        shutil.copytree(REPO / "inventory" / "prod", self.inventory)
        self.hosts = yaml.safe_load((self.inventory / "hosts.yml").read_text())
        self.hosts["all"]["children"]["telemetry"]["children"]["reverse_proxy"]["hosts"]["edge_prod"] = None
        self.hosts["all"]["hosts"]["edge_prod"] = {
            "ansible_host": "203.0.113.11",
            "telemetry_private_address": "10.0.0.11",
        }
        self.hosts["all"]["hosts"]["metrics_prod"].update(
            ansible_connection="local",
            ansible_python_interpreter="{{ ansible_playbook_python }}",
            telemetry_root=str(self.metrics_root),
        )
        for name, proxy in self.proxies.items():
            self.hosts["all"]["hosts"][name].update(proxy.host_vars(f"127.0.0.1:{loki.port}", victoria))
        self.write_hosts()
        # Laid out as the production file: `make node-add` inserts "  - <name>" lines.
        listed = "".join(f"  - {node}\n" for node in NODES)
        identities = yaml.safe_dump({"telemetry_node_identities": IDENTITIES})
        self.nodes_file.write_text(f"---\ntelemetry_nodes:\n{listed}{identities}telemetry_node_retire_after:\n")
        self.cert, key = tmp / "cert.pem", tmp / "key.pem"
        _run(
            [
                "openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                "-days", "2", "-subj", f"/CN={METRICS_DOMAIN}",
                "-addext", f"subjectAltName=DNS:{METRICS_DOMAIN},DNS:{LOGS_DOMAIN}",
                "-keyout", str(key), "-out", str(self.cert),
            ]
        )  # fmt: skip
        values = {
            "vault_influxdb_admin_password": secrets.token_urlsafe(24),
            "vault_influxdb_admin_token": secrets.token_urlsafe(48),
            "vault_grafana_admin_password": secrets.token_urlsafe(24),
            "vault_grafana_secret_key": secrets.token_urlsafe(32),
            "vault_grafana_influxdb_token": secrets.token_urlsafe(64),
            "vault_reverse_proxy_grafana_users": [{"username": "operator", "password_hash": _bcrypt_like()}],
            **{
                f"vault_victoriametrics_{name}_auth_key": secrets.token_hex(20)
                for name in ("delete", "snapshot", "force_merge", "force_flush")
            },
            "vault_backup_restic_password": secrets.token_urlsafe(32),
            "vault_reverse_proxy_tls_certificate": self.cert.read_text(),
            "vault_reverse_proxy_tls_private_key": key.read_text(),
        }
        self.secrets = tmp / "secrets.json"
        self.secrets.write_text(json.dumps(values))
        self.secrets.chmod(0o600)
        # Every host's own settings stay in the inventory: extra variables would override them.
        self.settings = {
            "telemetry_render_only": True,
            "metrics_backend": "victoriametrics",
            "reverse_proxy_tls_mode": "files",
            "reverse_proxy_basic_auth_directive": "basicauth",  # Caddy 2.6
            "reverse_proxy_loki_domain": LOGS_DOMAIN,
            "reverse_proxy_influxdb_domain": METRICS_DOMAIN,
        }
        self.env_dir = tmp / "env"

    @property
    def nodes_file(self) -> Path:
        return self.inventory / "group_vars" / "all" / "nodes.yml"

    def write_hosts(self) -> None:
        (self.inventory / "hosts.yml").write_text(yaml.safe_dump(self.hosts))

    def _extra(self) -> list[str]:
        return ["-e", f"@{self.secrets}", "-e", json.dumps(self.settings)]

    def site(self, *arguments: str, check: bool = True) -> subprocess.CompletedProcess:
        """site.yml (as make node-* deploys), then the reload of every running Caddy."""
        inventory = ["-i", str(self.inventory / "hosts.yml")]
        result = _run(["ansible-playbook", "site.yml", *inventory, *self._extra(), *arguments], check=check)
        if result.returncode == 0:
            for proxy in self.proxies.values():
                if proxy.server is not None:
                    proxy.reload()
        return result

    def tooling(self, action: str, node: str = NODE, *extra: str) -> None:
        """ansible/nodes.yml, as `make node-<action> NODE=<node>` runs it."""
        local = [
            "-e",
            "ansible_become=false",
            "-e",
            "metrics_backend=victoriametrics",
            "-e",
            f"node_env_dir={self.env_dir}",
        ]
        command = ["ansible-playbook", "-i", str(self.inventory / "hosts.yml"), "ansible/nodes.yml"]
        _run([*command, "-e", f"node={node}", "-e", f"node_action={action}", *local, *extra])

    def env(self, node: str = NODE) -> dict[str, str]:
        text = (self.env_dir / f"{node}.env").read_text()
        return dict(line.split("=", 1) for line in text.splitlines() if line and not line.startswith("#"))

    def write(self, proxy: str, token: str, node: str = NODE) -> int:
        """A metrics write with the node's INFLUXDB_TOKEN, through one proxy."""
        headers = {"Authorization": "Token " + token}
        body = f"probe,via={proxy} v=1 {time.time_ns()}".encode()
        return self.proxies[proxy].request(self.cert, "POST", "/api/v2/write?precision=ns", headers, body)

    def push(self, proxy: str, password: str, node: str = NODE) -> int:
        """A Loki push with the node's LOKI_USERNAME and LOKI_PASSWORD, through one proxy."""
        credentials = base64.b64encode(f"{node}:{password}".encode()).decode()
        headers = {
            "Host": f"{LOGS_DOMAIN}:{self.proxies[proxy].https_port}",
            "Authorization": "Basic " + credentials,
            "Content-Type": "application/json",
        }
        body = json.dumps({"streams": [{"stream": {"via": proxy}, "values": [[str(time.time_ns()), "probe"]]}]})
        return self.proxies[proxy].request(self.cert, "POST", "/loki/api/v1/push", headers, body.encode())

    def statuses(self, env: dict[str, str], node: str = NODE) -> dict[str, tuple[int, int]]:
        """{proxy: (metrics write status, Loki push status)} for one env file's credentials."""
        return {
            name: (self.write(name, env["INFLUXDB_TOKEN"], node), self.push(name, env["LOKI_PASSWORD"], node))
            for name in self.proxies
        }

    def assert_same_credentials(self) -> dict[str, tuple[str, int, int]]:
        first, second = (proxy.files() for proxy in self.proxies.values())
        assert first == second, (first, second)
        assert first and all(mode == 0o600 for _, mode, _ in first.values())
        return first


@pytest.fixture
def deployment(tmp_path):
    with ExitStack() as stack:
        server = stack.enter_context(victoria_metrics())
        loki = stack.enter_context(LokiReceiver())
        net = Deployment(tmp_path, loki, server.url.removeprefix("http://"))
        net.victoria = server
        net.site()
        for proxy in net.proxies.values():
            stack.callback(proxy.stop)
            proxy.start(net.cert)
        net.tooling("credentials")
        yield net


ACCEPTED = {name: (204, 204) for name in PROXIES}
REFUSED = {name: (401, 401) for name in PROXIES}


@pytest.mark.timeout(2400)
def test_a_node_writes_through_both_proxies_and_rotates_on_both(deployment):
    net = deployment
    files = net.assert_same_credentials()
    assert sorted(files) == sorted(f"{node}.{kind}-password" for node in NODES for kind in ("loki", "metrics"))
    # metrics_prod's firewall admits both proxy hosts to VictoriaMetrics and Loki.
    # (rendered, the firewall role writes below <telemetry_root>/<host>: roles/firewall/defaults/main.yml)
    rules = (net.metrics_root / "metrics_prod/opt/telemetry/firewall/docker-user.rules").read_text()
    for port in (8428, 3100):
        assert {"10.0.0.10", "10.0.0.11"} <= set(admitted(rules)[("10.0.0.20", "tcp", port)]), admitted(rules)
    previous = net.env()
    assert net.statuses(previous) == ACCEPTED
    # VictoriaMetrics stored the node's writes through both, under the node's identity.
    series = net.victoria.wait_for_series('probe_v{uid="m1"}', len(PROXIES), timeout=60)
    assert {s["metric"]["via"] for s in series} == set(PROXIES)

    # make node-rotate: new credentials beside the previous ones, on both.
    net.tooling("rotate", NODE, "-e", "node_retire_after=2999-12-31")
    net.site()
    net.tooling("credentials")
    new = net.env()
    assert new["INFLUXDB_TOKEN"] != previous["INFLUXDB_TOKEN"] and new["LOKI_PASSWORD"] != previous["LOKI_PASSWORD"]
    files = net.assert_same_credentials()
    assert {path for path in files if path.startswith("retiring/")} == {
        f"retiring/{NODE}.loki-password",
        f"retiring/{NODE}.metrics-password",
    }
    assert net.statuses(previous) == ACCEPTED
    assert net.statuses(new) == ACCEPTED

    # make node-retire: the previous ones stop on both, the new ones go on.
    net.tooling("retire")
    net.site()
    files = net.assert_same_credentials()
    assert not any(path.startswith("retiring/") for path in files)
    assert net.statuses(previous) == REFUSED
    assert net.statuses(new) == ACCEPTED


@pytest.mark.timeout(2400)
def test_a_wiped_proxy_gets_the_credentials_back_and_a_limited_run_forks_nothing(deployment):
    net = deployment
    before = net.assert_same_credentials()
    env = net.env()

    # edge_prod loses its secrets; a run limited to it takes them from grafana_prod.
    shutil.rmtree(net.proxies["edge_prod"].nodes_dir)
    net.site("--limit", "edge_prod")
    assert net.assert_same_credentials() == before
    assert net.statuses(env) == ACCEPTED

    # A node added and deployed to one proxy host only, then to the other alone: one password.
    net.tooling("add", "miner-02")
    net.site("--limit", "edge_prod")
    edge = net.proxies["edge_prod"].files()
    assert "miner-02.loki-password" in edge and "miner-02.loki-password" not in net.proxies["grafana_prod"].files()
    net.site("--limit", "grafana_prod")
    assert net.assert_same_credentials() == edge
    net.tooling("credentials", "miner-02")
    assert net.statuses(net.env("miner-02"), "miner-02") == ACCEPTED

    # A run that cannot read edge_prod's copies writes nothing, and says why.
    net.tooling("add", "miner-03")
    reachable = dict(net.hosts["all"]["hosts"]["edge_prod"])
    net.hosts["all"]["hosts"]["edge_prod"].update(
        ansible_connection="ssh", ansible_host="127.0.0.1", ansible_port=_closed_port()
    )
    net.write_hosts()
    refused = net.site("--limit", "grafana_prod", check=False)
    output = refused.stdout + refused.stderr
    assert refused.returncode != 0, output[-OUTPUT_TAIL:]
    assert "Could not read the nodes' passwords on edge_prod" in output, output[-OUTPUT_TAIL:]
    assert net.proxies["grafana_prod"].files() == edge
    net.hosts["all"]["hosts"]["edge_prod"] = reachable
    net.write_hosts()
