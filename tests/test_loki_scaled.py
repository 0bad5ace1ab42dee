"""Loki in scaled mode: the whole playbook rendered for three Loki hosts, and the
reverse proxy's balancing run for real.

- `site.yml` is rendered (render-only mode, no Docker) with the production
  inventory plus two more Loki hosts and `loki_mode=scaled`: every Loki host gets
  the cluster configuration, the proxy host a Caddyfile that balances pushes
  over the three of them.
- Debian's `caddy` adapts that Caddyfile, then serves its Loki site on loopback
  in front of three stub Loki hosts, one of which fails its readiness check:
  pushes go, in turn, to the two ready ones only. Grafana's read route (the
  proxy's internal site its Loki data source points at) runs the same way:
  reads are balanced over the ready hosts and still answered once one is gone.
- The loki role's `scaled` molecule scenario (three hosts converged into scratch
  roots, idempotence, the configuration rules) runs as well.

Nothing here needs the network; the stub hosts and Caddy listen on 127.0.0.1.
"""

from __future__ import annotations

import contextlib
import http.server
import json
import os
import re
import secrets
import shutil
import string
import subprocess
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from base64 import b64encode
from collections import Counter
from pathlib import Path

import pytest
import yaml
from firewall_rules import admitted
from servers import free_port, require_binary

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
OUTPUT_TAIL = 12000
CLUSTER = {"metrics_prod": "10.0.0.20", "loki_b": "10.0.0.21", "loki_c": "10.0.0.22"}
PROXY_HOST = "grafana_prod"


def _env() -> dict[str, str]:
    return dict(
        os.environ,
        ANSIBLE_NOCOLOR="1",
        ANSIBLE_FORCE_COLOR="0",
        NO_COLOR="1",
        PY_COLORS="0",
        ANSIBLE_CONFIG=str(REPO / "ansible.cfg"),
    )


def _run(cmd: list[str], cwd: Path = REPO, timeout: int = 900) -> subprocess.CompletedProcess:
    if shutil.which(cmd[0]) is None:
        pytest.fail(f"{cmd[0]} is not installed (pip install -e '.[dev]')")
    result = subprocess.run(cmd, cwd=cwd, env=_env(), capture_output=True, text=True, timeout=timeout, check=False)
    output = (result.stdout + "\n" + result.stderr)[-OUTPUT_TAIL:]
    assert result.returncode == 0, f"$ {' '.join(cmd)}\nexit {result.returncode}\n{output}"
    return result


def _bcrypt_like() -> str:
    alphabet = "./" + string.ascii_letters + string.digits
    return "$2b$12$" + "".join(secrets.choice(alphabet) for _ in range(53))


@pytest.fixture(scope="module")
def push_password() -> str:
    return secrets.token_urlsafe(18)


@pytest.fixture(scope="module")
def scaled(tmp_path_factory, push_password) -> tuple[Path, list[str]]:
    """The production inventory with three Loki hosts in scaled mode: a scratch
    directory and the ansible-playbook arguments that name it and its secrets."""
    caddy = require_binary("caddy")
    node_hash = subprocess.run(
        [caddy, "hash-password", "--plaintext", push_password], capture_output=True, text=True, check=True
    ).stdout.strip()
    tmp = tmp_path_factory.mktemp("scaled")
    root = tmp / "root"
    # Two more Loki hosts next to the production inventory's metrics_prod; every
    # host renders into its own root. Addresses are never contacted.
    hosts = {name: {"telemetry_root": str(root / name)} for name in [*CLUSTER, PROXY_HOST]}
    for name in ("loki_b", "loki_c"):
        hosts[name].update(telemetry_private_address=CLUSTER[name], ansible_host=CLUSTER[name])
    extra_inventory = {
        "all": {
            "children": {"telemetry": {"children": {"loki": {"hosts": {"loki_b": None, "loki_c": None}}}}},
            "hosts": hosts,
        }
    }
    inventory = tmp / "scaled.yml"
    inventory.write_text(yaml.safe_dump(extra_inventory))
    values = {
        "vault_influxdb_admin_password": secrets.token_urlsafe(24),
        "vault_influxdb_admin_token": secrets.token_urlsafe(48),
        "vault_grafana_admin_password": secrets.token_urlsafe(24),
        "vault_grafana_secret_key": secrets.token_urlsafe(32),
        "vault_backup_restic_password": secrets.token_urlsafe(32),
        "vault_grafana_influxdb_token": secrets.token_urlsafe(64),
        "vault_reverse_proxy_grafana_users": [{"username": "operator", "password_hash": _bcrypt_like()}],
        "vault_reverse_proxy_loki_users": [{"username": "node", "password_hash": node_hash}],
        "vault_loki_s3_access_key_id": secrets.token_hex(10).upper(),
        "vault_loki_s3_secret_access_key": secrets.token_urlsafe(30),
        "loki_mode": "scaled",
        "loki_s3_endpoint": "s3.example.org",
        "loki_s3_bucket": "telemetry-logs",
        # Short enough for the loopback test below to see two checks quickly.
        "reverse_proxy_loki_health_interval": "1s",
        "reverse_proxy_loki_health_timeout": "1s",
        "telemetry_render_only": True,
        "ansible_connection": "local",
        "ansible_python_interpreter": "{{ ansible_playbook_python }}",
    }
    extra_vars = tmp / "vars.json"
    extra_vars.write_text(json.dumps(values))
    extra_vars.chmod(0o600)
    return tmp, ["-i", "inventory/prod/hosts.yml", "-i", str(inventory), "-e", f"@{extra_vars}"]


@pytest.fixture(scope="module")
def rendered(scaled) -> Path:
    """site.yml rendered for the production inventory with three Loki hosts."""
    tmp, arguments = scaled
    _run(["ansible-playbook", "site.yml", *arguments])
    return tmp / "root"


def _loki_config(root: Path, host: str) -> dict:
    return yaml.safe_load((root / host / "opt/telemetry/loki/loki.yml").read_text())


def _caddyfile(root: Path) -> str:
    return (root / PROXY_HOST / "opt/telemetry/reverse_proxy/conf/Caddyfile").read_text()


def _site(text: str, domain: str) -> str:
    match = re.search(rf"(?ms)^{re.escape(domain)} \{{\n(.*?)^\}}$", text)
    assert match, f"no site block for {domain}"
    return match.group(1)


def test_every_loki_host_joins_the_same_cluster(rendered):
    join = sorted(f"{address}:7946" for address in CLUSTER.values())
    for host, address in CLUSTER.items():
        config = _loki_config(rendered, host)
        assert config["target"] == "all"
        assert config["common"]["ring"]["kvstore"]["store"] == "memberlist"
        assert config["common"]["instance_addr"] == address
        assert sorted(config["memberlist"]["join_members"]) == join
        assert config["common"]["replication_factor"] == 3
        assert set(config["common"]["storage"]) == {"s3"}
        assert config["common"]["storage"]["s3"]["bucketnames"] == "telemetry-logs"
        assert config["common"]["storage"]["s3"]["s3forcepathstyle"] is True
        assert config["common"]["storage"]["s3"]["insecure"] is False
        assert {p["object_store"] for p in config["schema_config"]["configs"]} == {"s3"}
    assert not (rendered / PROXY_HOST / "opt/telemetry/loki").exists()


def test_proxy_balances_pushes_over_every_loki_host(rendered):
    site = _site(_caddyfile(rendered), "logs.example.org")
    upstreams = " ".join(f"{address}:3100" for address in CLUSTER.values())
    assert f"reverse_proxy {upstreams} {{" in site
    for line in ("lb_policy round_robin", "health_uri /ready", "health_status 200", "header_up -Authorization"):
        assert line in site, line


READ_SITE = "http://:3101"


def _compose(root: Path, host: str, service: str) -> dict:
    return yaml.safe_load((root / host / f"opt/telemetry/{service}/container.compose.yml").read_text())


def test_grafana_reads_loki_through_the_proxy_on_its_host(rendered):
    """Not the first Loki host: the proxy's read route, by container name on the network both share."""
    [(grafana_name, grafana)] = _compose(rendered, PROXY_HOST, "grafana")["services"].items()
    [(proxy_name, proxy)] = _compose(rendered, PROXY_HOST, "reverse_proxy")["services"].items()
    assert grafana["environment"]["LOKI_URL"] == f"http://{proxy['container_name']}:3101", grafana_name
    assert set(grafana["networks"]) & set(proxy["networks"]), (grafana_name, proxy_name)
    # Only reachable on that network: the read port is not published.
    assert not any(":3101" in port for port in proxy["ports"])
    site = _site(_caddyfile(rendered), READ_SITE)
    upstreams = " ".join(f"{address}:3100" for address in CLUSTER.values())
    assert f"reverse_proxy {upstreams} {{" in site
    for line in ("lb_policy round_robin", "lb_try_duration", "health_uri /ready", "health_status 200"):
        assert line in site, line


def test_grafana_on_a_host_without_the_proxy_is_refused_before_any_change(scaled, tmp_path):
    """The read route is on the proxy host's Docker network only: a Grafana elsewhere could not reach it."""
    _, arguments = scaled
    elsewhere = tmp_path / "elsewhere.yml"
    grafana_b = {"telemetry_private_address": "10.0.0.30", "ansible_host": "10.0.0.30"}
    grafana_b |= {"telemetry_root": str(tmp_path / "root"), "grafana_domain": "grafana-b.example.org"}
    grafana_b |= {"grafana_influxdb_host": "10.0.0.20", "grafana_influxdb_token_host": "metrics_prod"}
    elsewhere.write_text(
        yaml.safe_dump(
            {
                "all": {
                    "children": {"telemetry": {"children": {"grafana": {"hosts": {"grafana_b": None}}}}},
                    "hosts": {"grafana_b": grafana_b},
                }
            }
        )
    )
    command = ["ansible-playbook", "site.yml", *arguments, "-i", str(elsewhere), "--limit", "grafana_b"]
    result = subprocess.run(command, cwd=REPO, env=_env(), capture_output=True, text=True, timeout=900, check=False)
    output = result.stdout + result.stderr
    assert result.returncode != 0, output[-OUTPUT_TAIL:]
    assert "put grafana_b in group reverse_proxy too" in output, output[-OUTPUT_TAIL:]
    assert "Check the Grafana settings" in output  # failed in the checks before anything changes
    assert not (tmp_path / "root").exists()


def _for_caddy_2_6(text: str, tmp: Path) -> str:
    # Debian's Caddy 2.6 still spells the directive "basicauth" (renamed in 2.8); the access
    # logs go to the scratch directory, not to this machine's /var/log.
    return text.replace("basic_auth ", "basicauth ").replace("/var/log/caddy/", f"{tmp}/")


def _caddy_env(tmp: Path) -> dict[str, str]:
    return dict(os.environ, HOME=str(tmp), XDG_DATA_HOME=str(tmp / "data"), XDG_CONFIG_HOME=str(tmp / "config"))


def test_caddy_adapts_the_balancing_configuration(rendered, tmp_path):
    caddy = require_binary("caddy")
    caddyfile = tmp_path / "Caddyfile"
    # The certificate lines stay out: tls_mode acme needs no file.
    caddyfile.write_text(_for_caddy_2_6(_caddyfile(rendered), tmp_path))
    result = subprocess.run(
        [caddy, "adapt", "--adapter", "caddyfile", "--config", str(caddyfile)],
        capture_output=True,
        text=True,
        check=False,
        env=_caddy_env(tmp_path),
    )
    assert result.returncode == 0, result.stderr
    proxies = []

    def walk(node):
        if isinstance(node, dict):
            if node.get("handler") == "reverse_proxy":
                proxies.append(node)
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(json.loads(result.stdout))
    balanced = [p for p in proxies if len(p.get("upstreams", [])) > 1]
    assert len(balanced) == 2  # the pushes, and Grafana's reads
    for loki in balanced:
        assert [u["dial"] for u in loki["upstreams"]] == [f"{a}:3100" for a in CLUSTER.values()]
        assert loki["load_balancing"]["selection_policy"] == {"policy": "round_robin"}
        assert loki["load_balancing"]["try_duration"] > 0
        assert loki["health_checks"]["active"]["uri"] == "/ready"
        assert loki["health_checks"]["active"]["expect_status"] == 200
        assert loki["health_checks"]["passive"]["fail_duration"] > 0
    validate = subprocess.run(
        [caddy, "validate", "--adapter", "caddyfile", "--config", str(caddyfile)],
        capture_output=True,
        text=True,
        check=False,
        env=_caddy_env(tmp_path),
    )
    assert validate.returncode == 0, validate.stdout + validate.stderr


class StubLoki:
    """A Loki host as the proxy sees it: /ready, the push endpoint and a log query.

    Loki answers GET /ready with 200 "ready" once its ring has settled and 503
    before (grafana/loki pkg/loki/loki.go, readyHandler); a push it accepts
    answers 204 (grafana/loki docs/sources/reference/loki-http-api.md, "Ingest logs");
    a log query over a range answers 200 with `{"status": "success", "data":
    {"resultType": "streams", "result": [...]}}` (same page, "Query logs within a
    range of time"). Grafana's Loki data source sends its queries as GET requests
    (grafana/grafana pkg/tsdb/loki/api.go, makeDataRequest).
    """

    def __init__(self, ready: bool):
        self.ready = ready
        self.checks = 0
        self.pushes = 0
        self.reads = 0
        self.saw_authorization = False
        stub = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                if self.path == "/ready":
                    stub.checks += 1
                    body = b"ready" if stub.ready else b"Ingester not ready: waiting for 15s after being ready"
                    self.send_response(200 if stub.ready else 503)
                elif self.path.startswith("/loki/api/v1/query_range?"):
                    stub.reads += 1
                    result = {"status": "success", "data": {"resultType": "streams", "result": []}}
                    body = json.dumps(result).encode()
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                else:
                    body = b"404 page not found\n"
                    self.send_response(404)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_POST(self):
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if self.path == "/loki/api/v1/push":
                    stub.pushes += 1
                    stub.saw_authorization |= "Authorization" in self.headers
                    self.send_response(204)
                else:
                    self.send_response(404)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.address = f"127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def _wait_for(condition, what: str, deadline_s: float = 60) -> None:
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.1)
    pytest.fail(f"timed out waiting for {what}")


@contextlib.contextmanager
def _serving(site: str, stubs: list[StubLoki], tmp_path: Path):
    """Caddy serving one rendered site on a loopback port, in front of the stubs instead of the Loki hosts."""
    caddy = require_binary("caddy")
    upstreams = " ".join(f"{address}:3100" for address in CLUSTER.values())
    site = site.replace(upstreams, " ".join(stub.address for stub in stubs))
    site = "\n".join(line for line in site.splitlines() if not line.strip().startswith("tls "))
    port = free_port()
    caddyfile = tmp_path / "Caddyfile"
    caddyfile.write_text(_for_caddy_2_6(f"{{\n\tadmin off\n}}\n\nhttp://127.0.0.1:{port} {{\n{site}\n}}\n", tmp_path))
    log = (tmp_path / "caddy.log").open("w")
    process = subprocess.Popen(
        [caddy, "run", "--adapter", "caddyfile", "--config", str(caddyfile)],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=_caddy_env(tmp_path),
    )
    try:
        # A second readiness check of the failing host means the first one's 503 was applied.
        _wait_for(lambda: all(stub.checks >= 2 for stub in stubs) or process.poll() is not None, "health checks")
        assert process.poll() is None, (tmp_path / "caddy.log").read_text()[-4000:]
        yield port
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()
        for stub in stubs:
            stub.close()


def test_pushes_go_in_turn_to_the_ready_hosts_only(rendered, tmp_path, push_password):
    stubs = [StubLoki(ready=True), StubLoki(ready=True), StubLoki(ready=False)]
    with _serving(_site(_caddyfile(rendered), "logs.example.org"), stubs, tmp_path) as port:
        token = b64encode(f"node:{push_password}".encode()).decode()
        statuses = Counter()
        body = json.dumps({"streams": [{"stream": {"service": "miner"}, "values": [["1", "line"]]}]}).encode()
        for _ in range(30):
            request = urllib.request.Request(
                f"http://127.0.0.1:{port}/loki/api/v1/push",
                data=body,
                method="POST",
                headers={"Content-Type": "application/json", "Authorization": f"Basic {token}"},
            )
            with urllib.request.urlopen(request, timeout=30) as response:
                statuses[response.status] += 1
        assert statuses == {204: 30}
        ready, failing = stubs[:2], stubs[2]
        assert failing.pushes == 0
        # Round robin over the two ready hosts: an even split.
        assert sorted(stub.pushes for stub in ready) == [15, 15]
        assert not any(stub.saw_authorization for stub in stubs)
        # Without credentials, and off the push path, nothing reaches Loki.
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(
                urllib.request.Request(f"http://127.0.0.1:{port}/loki/api/v1/push", data=body, method="POST"),
                timeout=30,
            )
        assert refused.value.code == 401
        with pytest.raises(urllib.error.HTTPError) as hidden:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/loki/api/v1/labels", timeout=30)
        assert hidden.value.code == 404
        assert sum(stub.pushes for stub in stubs) == 30

        # The failing host becomes ready: it gets its turn again.
        failing.ready = True
        checks = failing.checks
        _wait_for(lambda: failing.checks >= checks + 2, "the recovered host's health checks")
        for _ in range(6):
            request = urllib.request.Request(
                f"http://127.0.0.1:{port}/loki/api/v1/push",
                data=body,
                method="POST",
                headers={"Content-Type": "application/json", "Authorization": f"Basic {token}"},
            )
            urllib.request.urlopen(request, timeout=30).close()
        assert failing.pushes == 2


def test_grafana_reads_are_balanced_and_survive_a_lost_host(rendered, tmp_path):
    stubs = [StubLoki(ready=True), StubLoki(ready=True), StubLoki(ready=False)]
    with _serving(_site(_caddyfile(rendered), READ_SITE), stubs, tmp_path) as port:
        base = f"http://127.0.0.1:{port}"
        query = urllib.parse.urlencode({"query": '{service="miner"}', "start": "1", "end": "2", "limit": "10"})

        def read() -> dict:
            with urllib.request.urlopen(f"{base}/loki/api/v1/query_range?{query}", timeout=30) as response:
                assert response.status == 200
                return json.loads(response.read())

        for _ in range(30):
            assert read()["status"] == "success"
        ready, failing = stubs[:2], stubs[2]
        assert sorted(stub.reads for stub in ready) == [15, 15]
        assert failing.reads == 0
        # Reads only: a push, or anything off Loki's query API, reaches no host.
        body = json.dumps({"streams": []}).encode()
        with pytest.raises(urllib.error.HTTPError) as push:
            urllib.request.urlopen(
                urllib.request.Request(f"{base}/loki/api/v1/push", data=body, method="POST"), timeout=30
            )
        assert push.value.code == 404
        with pytest.raises(urllib.error.HTTPError) as ready_page:
            urllib.request.urlopen(f"{base}/ready", timeout=30)
        assert ready_page.value.code == 404
        assert sum(stub.pushes for stub in stubs) == 0

        # One ready host is lost (its port now refuses connections): every read is still answered.
        lost, left = ready
        lost.close()
        reads_before = left.reads
        for _ in range(10):
            assert read()["status"] == "success"
        assert left.reads == reads_before + 10
        assert failing.reads == 0


@pytest.mark.timeout(900)
def test_molecule_scaled_scenario():
    result = _run(["molecule", "test", "-s", "scaled"], cwd=REPO / "ansible/roles/loki")
    output = result.stdout + result.stderr
    assert re.search(r"idempotence.*Executed: Successful", output), output[-OUTPUT_TAIL:]
    assert re.search(r"verify.*Executed: Successful", output), output[-OUTPUT_TAIL:]
    assert re.search(r"\d+ passed", output), output[-OUTPUT_TAIL:]


def test_only_loki_peers_reach_the_cluster_ports(rendered):
    """gRPC and memberlist carry no authentication: DOCKER-USER lets only the Loki hosts through to them,
    and only the proxy and Grafana (both on grafana_prod) through to Loki's HTTP API."""
    peers = sorted(CLUSTER.values())
    proxy = _compose(rendered, PROXY_HOST, "reverse_proxy")
    for host, address in CLUSTER.items():
        (rules_file,) = (rendered / host).rglob("firewall/docker-user.rules")
        expected = {
            (address, "tcp", 3100): ["10.0.0.10"],
            (address, "tcp", 9096): peers,
            (address, "tcp", 7946): peers,
        }
        if host == "metrics_prod":  # InfluxDB's host too
            expected[(address, "tcp", 8086)] = ["10.0.0.10"]
        assert admitted(rules_file.read_text()) == expected, host
        # Memberlist gossips over TCP only (dskit's TCPTransport): nothing is published on UDP.
        ports = _compose(rendered, host, "loki")["services"]["loki"]["ports"]
        assert ports == [f"{address}:3100:3100", f"{address}:9096:9096", f"{address}:7946:7946"], host
    assert not any("udp" in port for port in next(iter(proxy["services"].values()))["ports"])
