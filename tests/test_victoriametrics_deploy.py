"""VictoriaMetrics as the production metrics backend (the victoriametrics role).

- The role's `cluster` molecule scenario: three vmstorage hosts (vminsert on each,
  vmselect on two), replication factor 2, each converged into its own scratch
  root, idempotence, and the rendered flags checked against VictoriaMetrics'
  cluster documentation.
- The preflight refuses a replication factor above the number of vmstorage
  hosts, before anything is written, and says why.

Nothing here needs the network or a Docker engine.
"""

from __future__ import annotations

import base64
import http.client
import json
import os
import re
import secrets
import shutil
import socket
import ssl
import string
import subprocess
import time
from pathlib import Path

import pytest
import yaml
from firewall_rules import by_port
from servers import bind_caddy_to_loopback, free_port, listening_addresses, require_binary, victoria_metrics

from telemetry_client import BufferSettings
from telemetry_client.metrics import MetricsLogger

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
ROLE = REPO / "ansible" / "roles" / "victoriametrics"
OUTPUT_TAIL = 12000


def _env(**extra: str) -> dict[str, str]:
    return dict(
        os.environ,
        ANSIBLE_NOCOLOR="1",
        ANSIBLE_FORCE_COLOR="0",
        NO_COLOR="1",
        PY_COLORS="0",
        ANSIBLE_CONFIG=str(REPO / "ansible.cfg"),
        **extra,
    )


def _run(cmd: list[str], cwd: Path = REPO, timeout: int = 900, env=None) -> subprocess.CompletedProcess:
    if shutil.which(cmd[0]) is None:
        pytest.fail(f"{cmd[0]} is not installed (pip install -e '.[dev]')")
    return subprocess.run(cmd, cwd=cwd, env=env or _env(), capture_output=True, text=True, timeout=timeout, check=False)


def _assert_ok(result: subprocess.CompletedProcess) -> None:
    output = (result.stdout + "\n" + result.stderr)[-OUTPUT_TAIL:]
    assert result.returncode == 0, f"$ {' '.join(result.args)}\nexit {result.returncode}\n{output}"


@pytest.mark.timeout(900)
def test_molecule_cluster_scenario(tmp_path):
    result = _run(
        ["molecule", "test", "-s", "cluster"],
        cwd=ROLE,
        env=_env(MOLECULE_EPHEMERAL_DIRECTORY=str(tmp_path / "molecule")),
    )
    _assert_ok(result)
    output = result.stdout + result.stderr
    assert re.search(r"idempotence.*Executed: Successful", output), output[-OUTPUT_TAIL:]
    assert re.search(r"verify.*Executed: Successful", output), output[-OUTPUT_TAIL:]
    assert re.search(r"\d+ passed", output), output[-OUTPUT_TAIL:]


# The endpoint keys the role requires (its defaults), made for this run only.
AUTH_KEYS = {
    f"victoriametrics_{name}_auth_key": secrets.token_hex(20)
    for name in ("delete", "snapshot", "force_merge", "force_flush")
}


def _converge(tmp_path: Path, storage_hosts: int, **variables) -> subprocess.CompletedProcess:
    """The role alone, in cluster mode, on `storage_hosts` hosts rendered on this machine."""
    hosts = {f"vm-{n}": {"telemetry_private_address": f"192.0.2.{50 + n}"} for n in range(1, storage_hosts + 1)}
    inventory = {
        "all": {
            "vars": {
                "ansible_connection": "local",
                "ansible_python_interpreter": "{{ ansible_playbook_python }}",
                "telemetry_render_only": True,
                "telemetry_root": str(tmp_path / "root" / "{{ inventory_hostname }}"),
                "victoriametrics_mode": "cluster",
            },
            "children": {"vmstorage": {"hosts": hosts}},
        }
    }
    (tmp_path / "hosts.yml").write_text(yaml.safe_dump(inventory))
    playbook = tmp_path / "play.yml"
    playbook.write_text(
        "- name: Converge\n  hosts: vmstorage\n  gather_facts: false\n  roles:\n    - role: victoriametrics\n"
    )
    extra = tmp_path / "vars.json"
    extra.write_text(json.dumps({**AUTH_KEYS, **variables}))
    extra.chmod(0o600)
    return _run(
        ["ansible-playbook", "-i", str(tmp_path / "hosts.yml"), "-e", f"@{extra}", str(playbook)],
        env=_env(ANSIBLE_ROLES_PATH=str(ROLE.parent)),
    )


@pytest.mark.timeout(600)
def test_replication_factor_above_the_storage_hosts_is_refused(tmp_path):
    result = _converge(tmp_path, storage_hosts=2, victoriametrics_replication_factor=3)
    output = result.stdout + result.stderr
    assert result.returncode != 0, output[-OUTPUT_TAIL:]
    assert "victoriametrics_replication_factor is 3 but the cluster has 2 vmstorage host(s)" in output
    assert "writes every sample to that many distinct vmstorage nodes" in output
    assert not (tmp_path / "root").exists(), "files were rendered although the preflight failed"


@pytest.mark.timeout(600)
def test_replication_without_deduplication_is_refused(tmp_path):
    result = _converge(tmp_path, storage_hosts=3, victoriametrics_dedup_min_scrape_interval="")
    output = result.stdout + result.stderr
    assert result.returncode != 0, output[-OUTPUT_TAIL:]
    assert "counts each copy unless -dedup.minScrapeInterval is set" in " ".join(output.split())
    assert not (tmp_path / "root").exists(), "files were rendered although the preflight failed"


@pytest.mark.timeout(600)
def test_a_changed_replication_factor_recreates_vminsert_and_vmselect_only(tmp_path):
    _assert_ok(_converge(tmp_path, storage_hosts=3))
    files = sorted((tmp_path / "root").rglob("*.compose.yml"))
    before = {path: path.read_text() for path in files}
    _assert_ok(_converge(tmp_path, storage_hosts=3, victoriametrics_replication_factor=3))
    changed = sorted({path.name for path in files if path.read_text() != before[path]})
    # Each service's flags are its container's definition: only these two change.
    assert changed == ["vminsert.compose.yml", "vmselect.compose.yml"]
    assert (
        "-replicationFactor=3"
        in (tmp_path / "root" / "vm-1" / "opt/telemetry/victoriametrics/vminsert.compose.yml").read_text()
    )


# --- the proxy's write route, run by a real Caddy in front of a real VictoriaMetrics ---
#
# Debian's caddy (2.6) serves the Caddyfile the reverse_proxy role renders for
# metrics_backend victoriametrics (single node), on loopback with a certificate
# made here, in front of Debian's victoria-metrics (1.79.5), which accepts
# InfluxDB's /api/v2/write as the single node's image does. Nodes write with
# MetricsLogger exactly as in production: https URL, "Authorization: Token <token>".
# Two role variables differ from a deployment: the configuration directory is the
# rendered one, and Caddy 2.6 still calls the directive "basicauth". The rendered
# file gets one global option of the test's own: Caddy binds every interface
# unless told, and a test's listens on loopback only (`default_bind 127.0.0.1`).

METRICS_DOMAIN = "localhost"
LOGS_DOMAIN = "logs.localhost"  # the Loki site, when a test renders it (reached by SNI on 127.0.0.1)


def _certificate(tmp_path: Path) -> tuple[Path, Path]:
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    _assert_ok(
        _run(
            [
                "openssl",
                "req",
                "-x509",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:P-256",
                "-nodes",
                "-days",
                "2",
                "-subj",
                f"/CN={METRICS_DOMAIN}",
                "-addext",
                f"subjectAltName=DNS:{METRICS_DOMAIN},DNS:{LOGS_DOMAIN}",
                "-keyout",
                str(key),
                "-out",
                str(cert),
            ]
        )
    )
    return cert, key


class MetricsProxy:
    """The reverse_proxy role rendered for VictoriaMetrics, and the ports Caddy serves it on."""

    def __init__(self, tmp_path: Path, upstreams: list[str], mode: str = "single", vmauth: str | None = None):
        """`vmauth`: the binary of the edge vmauth that keeps each node's write budget, run from the
        role's rendered config and flags; without it the role is rendered without a budget (Caddy
        writes to VictoriaMetrics itself), as Debian's vmauth 1.79.5 cannot keep one."""
        self.tmp = tmp_path
        self.vmauth_binary = vmauth
        self.vmauth_port = free_port()
        self.vmauth: subprocess.Popen | None = None
        self.root = tmp_path / "root"
        self.dir = self.root / "opt" / "telemetry" / "reverse_proxy"
        self.conf = self.dir / "conf"
        self.logs = self.dir / "logs"
        self.https_port, self.http_port, self.admin_port = free_port(), free_port(), free_port()
        self.upstreams = upstreams
        self.mode = mode
        self.cert, self.key = _certificate(tmp_path)
        self.server: subprocess.Popen | None = None

    def converge(self, nodes: list[str], **extra_variables) -> None:
        playbook = self.tmp / "proxy.yml"
        playbook.write_text(
            "- name: Render the reverse proxy\n  hosts: localhost\n  gather_facts: false\n"
            "  roles:\n    - role: reverse_proxy\n"
        )
        variables = {
            "telemetry_render_only": True,
            "telemetry_root": str(self.root),
            "telemetry_nodes": nodes,
            "metrics_backend": "victoriametrics",
            "victoriametrics_mode": self.mode,
            "reverse_proxy_victoriametrics_upstreams": self.upstreams,
            "reverse_proxy_image": "caddy:not-pulled-in-render-only-mode",
            "reverse_proxy_tls_mode": "files",
            "reverse_proxy_tls_certificate": self.cert.read_text(),
            "reverse_proxy_tls_private_key": self.key.read_text(),
            "reverse_proxy_influxdb_domain": METRICS_DOMAIN,
            "reverse_proxy_config_mount": str(self.conf),
            "reverse_proxy_admin_address": f"localhost:{self.admin_port}",
            "reverse_proxy_listen_http_port": self.http_port,
            "reverse_proxy_listen_https_port": self.https_port,
            "reverse_proxy_basic_auth_directive": "basicauth",
            "reverse_proxy_log_mount": str(self.logs),
            **(
                {"reverse_proxy_vmauth_address": f"127.0.0.1:{self.vmauth_port}"}
                if self.vmauth_binary
                else {"reverse_proxy_node_write_concurrency": 0}
            ),
            **extra_variables,
        }
        extra = self.tmp / "proxy-vars.json"
        extra.write_text(json.dumps(variables))
        extra.chmod(0o600)
        _assert_ok(
            _run(
                [
                    "ansible-playbook",
                    "-i",
                    "localhost,",
                    "-c",
                    "local",
                    "-e",
                    "ansible_python_interpreter={{ ansible_playbook_python }}",
                    "-e",
                    f"@{extra}",
                    str(playbook),
                ]
            )
        )
        bind_caddy_to_loopback(self.caddyfile)

    @property
    def caddyfile(self) -> Path:
        return self.conf / "Caddyfile"

    def _caddy_env(self) -> dict[str, str]:
        return dict(
            os.environ,
            HOME=str(self.tmp),
            XDG_DATA_HOME=str(self.tmp / "xdg-data"),
            XDG_CONFIG_HOME=str(self.tmp / "xdg-config"),
        )

    def vmauth_flags(self) -> list[str]:
        """The edge vmauth's command line as the role renders it, with its directory and a loopback port."""
        compose = yaml.safe_load((self.dir / "container.compose.yml").read_text())
        [command] = [s["command"] for name, s in compose["services"].items() if name != "caddy"]
        mount = "/etc/vmauth"
        flags = [arg.replace(f"file://{mount}/", f"file://{self.dir}/vmauth/") for arg in command]
        flags = [arg.replace(f"={mount}/", f"={self.dir}/vmauth/") for arg in flags]
        listen = f"-httpListenAddr=127.0.0.1:{self.vmauth_port}"
        return [listen if arg.startswith("-httpListenAddr=") else arg for arg in flags]

    def vmauth_key(self, flag: str) -> str:
        """The key of one of the edge vmauth's own endpoints (-metricsAuthKey, ...), as the role wrote it."""
        [value] = [a.split("=", 1)[1] for a in self.vmauth_flags() if a.startswith(f"-{flag}=")]
        return Path(value.removeprefix("file://")).read_text().strip()

    def _start_vmauth(self) -> None:
        self.vmauth_log = (self.tmp / "vmauth.log").open("w")
        self.vmauth = subprocess.Popen(
            [self.vmauth_binary, *self.vmauth_flags()], stdout=self.vmauth_log, stderr=self.vmauth_log
        )
        deadline = time.monotonic() + 120
        while True:
            try:
                with socket.create_connection(("127.0.0.1", self.vmauth_port), timeout=5):
                    return
            except OSError:
                assert self.vmauth.poll() is None, (self.tmp / "vmauth.log").read_text()[-OUTPUT_TAIL:]
                assert time.monotonic() < deadline, (self.tmp / "vmauth.log").read_text()[-OUTPUT_TAIL:]
                time.sleep(0.2)

    def start(self) -> None:
        if self.vmauth_binary:
            self._start_vmauth()
        caddy = require_binary("caddy")
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
                self.request("GET", "/health")
                assert listening_addresses(self.server.pid) == {"127.0.0.1"}, listening_addresses(self.server.pid)
                return
            except OSError:
                assert self.server.poll() is None, (self.tmp / "caddy.log").read_text()[-OUTPUT_TAIL:]
                assert time.monotonic() < deadline, (self.tmp / "caddy.log").read_text()[-OUTPUT_TAIL:]
                time.sleep(0.5)

    def reload(self) -> None:
        """The role's reload handler, as it runs inside the container."""
        handlers = yaml.safe_load((REPO / "ansible/roles/reverse_proxy/handlers/main.yml").read_text())
        [handler] = [h for h in handlers if h["name"] == "Reload caddy"]
        argv = [
            arg.replace("{{ reverse_proxy_config_mount }}", str(self.conf))
            for arg in handler["community.docker.docker_container_exec"]["argv"]
        ]
        result = subprocess.run(argv, env=self._caddy_env(), capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stdout + result.stderr

    def stop(self) -> None:
        if self.server is not None:
            self.server.terminate()
            self.server.wait(timeout=60)
            self.log.close()
        if self.vmauth is not None:
            self.vmauth.terminate()
            self.vmauth.wait(timeout=60)
            self.vmauth_log.close()

    def url(self) -> str:
        return f"https://{METRICS_DOMAIN}:{self.https_port}"

    def token(self, node: str) -> str:
        """What `make node-credentials` hands the node as INFLUXDB_TOKEN."""
        password = (self.dir / "secrets" / "nodes" / f"{node}.metrics-password").read_text().strip()
        return base64.b64encode(f"{node}:{password}".encode()).decode()

    def request(self, method: str, path: str, headers: dict | None = None, body: bytes = b"") -> tuple[int, bytes]:
        context = ssl.create_default_context(cafile=str(self.cert))
        conn = http.client.HTTPSConnection(METRICS_DOMAIN, self.https_port, context=context, timeout=30)
        try:
            conn.request(method, path, body=body or None, headers=headers or {})
            response = conn.getresponse()
            return response.status, response.read()
        finally:
            conn.close()


def _logger(proxy: MetricsProxy, token: str, uid: str) -> MetricsLogger:
    return MetricsLogger(
        url=proxy.url(),
        token=token,
        org="tplr",
        database="tplr",
        uid=uid,
        role="miner",
        ca_certs=str(proxy.cert),
        buffer=BufferSettings(flush_interval=0.05),
        self_metrics_interval=None,
        system_metrics_interval=0,
    )


def _samples(server, name: str, uid: str, expected: int, timeout: float = 60.0) -> list[float]:
    deadline = time.monotonic() + timeout
    while True:
        series = server.wait_for_series(f'{name}{{uid="{uid}"}}', 1, timeout=5)
        values = sorted(v for s in series for v in s["values"])
        if len(values) >= expected or time.monotonic() > deadline:
            return values
        time.sleep(0.2)


@pytest.mark.timeout(900)
def test_node_writes_reach_victoriametrics_through_caddy_and_a_revoked_node_gets_401(tmp_path):
    with victoria_metrics() as server:
        upstream = server.url.removeprefix("http://")
        proxy = MetricsProxy(tmp_path, [upstream])
        # The uids the nodes write below are the ones the inventory gives them (the proxy sets them).
        identities = {"miner-01": {"uid": "m1", "role": "miner"}, "validator-01": {"uid": "v1", "role": "validator"}}
        proxy.converge(["miner-01", "validator-01"], telemetry_node_identities=identities)
        caddyfile = proxy.caddyfile.read_text()
        assert proxy.caddyfile.stat().st_mode & 0o777 == 0o600
        for node in ("miner-01", "validator-01"):
            secret = proxy.dir / "secrets" / "nodes" / f"{node}.metrics-password"
            assert secret.stat().st_mode & 0o777 == 0o600
            # The Caddyfile (0600) maps the node's exact Authorization header to its name: no bcrypt hash.
            assert re.search(rf'(?m)^\t+"Token {re.escape(proxy.token(node))}" {re.escape(node)} ', caddyfile), node
        assert "$2b$" not in caddyfile
        assert "/insert/" not in caddyfile  # the single node takes /api/v2/write as it is
        proxy.start()
        try:
            miner, validator = proxy.token("miner-01"), proxy.token("validator-01")
            # MetricsLogger, as a node runs it, with its own token.
            now = time.time_ns()
            with _logger(proxy, miner, "m1") as logger:
                for step in range(20):
                    logger.log("training_step", fields={"loss": step / 4}, timestamp=now + step * 1_000_000)
                assert logger.flush(30) == 0
                assert logger.stats()["sent"] == 20, logger.stats()
            assert _samples(server, "training_step_loss", "m1", 20) == [step / 4 for step in range(20)]

            line = b"training_step,uid=x loss=1"
            write = "/api/v2/write?org=tplr&bucket=tplr&precision=ns"
            assert proxy.request("POST", write, body=line)[0] == 401
            assert proxy.request("POST", write, {"Authorization": "Token " + miner + "x"}, line)[0] == 401
            # One node's password under another node's name is refused.
            swapped = base64.b64encode(b"miner-01:" + base64.b64decode(validator).split(b":", 1)[1]).decode()
            assert proxy.request("POST", write, {"Authorization": "Token " + swapped}, line)[0] == 401
            assert proxy.request("POST", write, {"Authorization": "Token " + validator}, line)[0] == 204
            # Only writes and health are exposed: VictoriaMetrics' query and admin API are not.
            assert proxy.request("GET", "/health")[0] == 200
            assert proxy.request("GET", "/ping")[0] == 200
            assert proxy.request("GET", "/api/v1/query?query=up")[0] == 404
            assert proxy.request("GET", "/api/v1/export?match[]=up", {"Authorization": "Token " + miner})[0] == 404

            # Revoke miner-01: one run rewrites the Caddyfile and deletes its password;
            # the handler's reload applies it.
            proxy.converge(["validator-01"], telemetry_node_identities=identities)
            assert not (proxy.dir / "secrets" / "nodes" / "miner-01.metrics-password").exists()
            proxy.reload()
            assert proxy.request("POST", write, {"Authorization": "Token " + miner}, line)[0] == 401
            with _logger(proxy, miner, "m2") as revoked:
                revoked.log("training_step", fields={"loss": 1.0})
                revoked.flush(10)
                stats = revoked.stats()
            assert stats["sent"] == 0, stats
            with _logger(proxy, validator, "v1") as logger:
                logger.log("training_step", fields={"loss": 2.5})
                assert logger.flush(30) == 0
            # With the raw line above that said uid=x: stored under the validator's own uid.
            assert _samples(server, "training_step_loss", "v1", 2) == [1, 2.5]
            server.flush()
            assert server.export('training_step_loss{uid="m2"}') == []
        finally:
            proxy.stop()


# --- the whole playbook with the cluster ----------------------------------------------
#
# site.yml rendered (render-only mode, no Docker) with the production inventory
# plus two more hosts: vmstorage and vminsert on all three, vmselect on two of
# them; every host renders into its own root. The addresses are never contacted.

CLUSTER = {"metrics_prod": "10.0.0.20", "vm_b": "10.0.0.21", "vm_c": "10.0.0.22"}
SELECT = ["metrics_prod", "vm_b"]
PROXY_HOST = "grafana_prod"
GENERATED = [
    "grafana/provisioning-victoriametrics",
    "grafana/dashboards-victoriametrics",
    "grafana/alerting-victoriametrics",
]


def _generated_missing() -> list[str]:
    return [path for path in GENERATED if not (REPO / path).is_dir()]


def _vault_values() -> dict:
    alphabet = "./" + string.ascii_letters + string.digits
    return {
        "vault_grafana_admin_password": secrets.token_urlsafe(24),
        "vault_grafana_secret_key": secrets.token_urlsafe(32),
        "vault_backup_restic_password": secrets.token_urlsafe(32),
        **{f"vault_{name}": value for name, value in AUTH_KEYS.items()},
        "vault_reverse_proxy_grafana_users": [
            {"username": "operator", "password_hash": "$2b$12$" + "".join(secrets.choice(alphabet) for _ in range(53))}
        ],
    }


@pytest.fixture(scope="module")
def cluster_site(tmp_path_factory) -> Path:
    missing = _generated_missing()
    if missing:
        pytest.skip(f"not generated in this checkout yet: {', '.join(missing)}")
    tmp = tmp_path_factory.mktemp("vm-cluster")
    root = tmp / "root"
    hosts = {name: {"telemetry_root": str(root / name)} for name in [*CLUSTER, PROXY_HOST]}
    for name in ("vm_b", "vm_c"):
        hosts[name].update(telemetry_private_address=CLUSTER[name], ansible_host=CLUSTER[name])
    extra_inventory = {
        "all": {
            "children": {
                "telemetry": {
                    "children": {
                        "vmstorage": {"hosts": dict.fromkeys(CLUSTER)},
                        "vmselect": {"hosts": dict.fromkeys(SELECT)},
                    }
                }
            },
            "hosts": hosts,
        }
    }
    inventory = tmp / "cluster.yml"
    inventory.write_text(yaml.safe_dump(extra_inventory))
    values = {
        **_vault_values(),
        "metrics_backend": "victoriametrics",
        "victoriametrics_mode": "cluster",
        "telemetry_render_only": True,
        "ansible_connection": "local",
        "ansible_python_interpreter": "{{ ansible_playbook_python }}",
    }
    extra = tmp / "vars.json"
    extra.write_text(json.dumps(values))
    extra.chmod(0o600)
    cmd = ["ansible-playbook", "site.yml", "-i", "inventory/prod/hosts.yml", "-i", str(inventory), "-e", f"@{extra}"]
    first = _run(cmd)
    _assert_ok(first)
    second = _run(cmd)
    _assert_ok(second)
    changed = _recap_changed(second.stdout)
    assert changed and not any(changed.values()), second.stdout[-OUTPUT_TAIL:]
    return root


def _recap_changed(output: str) -> dict[str, int]:
    return {host: int(changed) for host, changed in re.findall(r"^(\S+)\s+: ok=\d+\s+changed=(\d+)", output, re.M)}


def _flags(root: Path, host: str, component: str) -> dict[str, str]:
    path = root / host / "opt/telemetry/victoriametrics" / f"{component}.compose.yml"
    command = yaml.safe_load(path.read_text())["services"][component]["command"]
    return dict(flag.lstrip("-").split("=", 1) for flag in command)


def _metrics_site(root: Path) -> str:
    text = (root / PROXY_HOST / "opt/telemetry/reverse_proxy/conf/Caddyfile").read_text()
    match = re.search(r"(?ms)^metrics\.example\.org \{\n(.*?)^\}$", text)
    assert match, "no site block for metrics.example.org"
    return match.group(1)


# The first test to use the module's rendered site waits for two runs of site.yml.
@pytest.mark.timeout(1800)
def test_cluster_hosts_run_their_services_and_no_influxdb(cluster_site):
    for host in CLUSTER:
        rendered = sorted(p.name for p in (cluster_site / host / "opt/telemetry/victoriametrics").glob("*.compose.yml"))
        expected = ["vminsert", "vmstorage"] + (["vmselect"] if host in SELECT else [])
        assert rendered == sorted(f"{c}.compose.yml" for c in expected), host
        nodes = _flags(cluster_site, host, "vminsert")["storageNode"].split(",")
        assert sorted(nodes) == sorted(
            "vmstorage:8400" if other == host else f"{other_address}:8400" for other, other_address in CLUSTER.items()
        )
        assert _flags(cluster_site, host, "vminsert")["replicationFactor"] == "2"
        assert _flags(cluster_site, host, "vmstorage")["dedup.minScrapeInterval"] == "1ms"
        assert _flags(cluster_site, host, "vmstorage")["retentionPeriod"] == "30d"
        if host in SELECT:
            assert _flags(cluster_site, host, "vmselect")["dedup.minScrapeInterval"] == "1ms"
            assert len(_flags(cluster_site, host, "vmselect")["storageNode"].split(",")) == 3
    assert not (cluster_site / "metrics_prod/opt/telemetry/influxdb").exists()


@pytest.mark.timeout(1800)
def test_the_rendered_series_caps_are_flags_victoriametrics_takes_and_bound_new_series(cluster_site):
    flags = _flags(cluster_site, next(iter(CLUSTER)), "vmstorage")
    caps = [f"-{name}={flags[name]}" for name in ("storage.maxHourlySeries", "storage.maxDailySeries")]
    assert all(int(cap.split("=")[1]) > 0 for cap in caps)
    with victoria_metrics(*caps) as server:  # victoria-metrics refuses to start on a flag it does not know
        _write_lines(server.url, [f"capped,uid={uid} value=1" for uid in range(5)])
        assert len(server.wait_for_series("capped_value", 5)) == 5
    # What the caps do (the docs rely on it): a series beyond the hour's cap is dropped, the others stored.
    with victoria_metrics("-storage.maxHourlySeries=2") as server:
        _write_lines(server.url, [f"capped,uid={uid} value=1" for uid in range(5)])
        server.wait_for_series("capped_value", 5, timeout=5)
        server.flush()
        # The limiter is a Bloom filter (lib/bloomfilter): it may let a few more series through
        # than the cap (3 of 5 at a cap of 2 was seen once), never fewer than the cap.
        assert 2 <= len(server.export("capped_value")) < 5


def _write_lines(url: str, lines: list[str]) -> None:
    connection = http.client.HTTPConnection(url.removeprefix("http://"), timeout=30)
    try:
        connection.request("POST", "/api/v2/write", body="\n".join(lines).encode())
        response = connection.getresponse()
        response.read()
        assert response.status == 204, response.status
    finally:
        connection.close()


@pytest.mark.timeout(1800)
def test_proxy_checks_tokens_and_balances_writes_over_every_vminsert(cluster_site):
    site = _metrics_site(cluster_site)
    # The writes go to the edge vmauth (each node's write budget), which spreads them over every vminsert.
    assert site.count("reverse_proxy vmauth-edge:8427 {") == 2  # /api/v2/write and /write
    assert 'header_up Authorization "Bearer {telemetry.node.vmauth}"' in site
    vmauth_dir = cluster_site / PROXY_HOST / "opt/telemetry/reverse_proxy/vmauth"
    for user in yaml.safe_load((vmauth_dir / "auth.yml").read_text())["users"]:
        [route] = user["url_map"]
        assert [prefix.split("/?")[0] for prefix in route["url_prefix"]] == [
            f"http://{address}:8480" for address in CLUSTER.values()
        ]
    # /health is still balanced and health-checked by Caddy itself.
    upstreams = " ".join(f"{address}:8480" for address in CLUSTER.values())
    assert f"reverse_proxy {upstreams} {{" in site
    # The cluster's InfluxDB endpoint is below /insert/<tenant>/influx (Cluster-VictoriaMetrics.md, "URL format"),
    # on a fixed path: the client's own path and query are not forwarded.
    identity = "extra_label=uid={telemetry.node.uid}&extra_label=role={telemetry.node.role}"
    assert f"rewrite * /insert/0/influx/api/v2/write?precision={{http.request.uri.query.precision}}&{identity}" in site
    assert "{path}" not in site and "{query}" not in site
    for line in ("lb_policy round_robin", "health_uri /health", "health_status 200"):
        assert line in site, line
    route = site.split("route {", 1)[1]
    # The refusal of a stranger, then the rewrite and the upstream: in this order.
    order = [route.index(s) for s in ("respond @stranger 401", "rewrite *", "reverse_proxy")]
    assert order == sorted(order), route
    nodes = yaml.safe_load((REPO / "inventory/prod/group_vars/all/nodes.yml").read_text())["telemetry_nodes"]
    for node in nodes:
        assert re.search(rf'(?m)^\t+"Token [A-Za-z0-9+/=]+" {re.escape(node)} ', site), node


@pytest.mark.timeout(1800)
def test_proxy_balances_grafanas_reads_over_the_vmselect_hosts(cluster_site):
    text = (cluster_site / PROXY_HOST / "opt/telemetry/reverse_proxy/conf/Caddyfile").read_text()
    match = re.search(r"(?ms)^http://:8491 \{\n(.*?)^\}$", text)
    assert match, "no internal read route"
    route = match.group(1)
    assert "path /select/0/prometheus/api/v1/*" in route
    assert "method GET POST" in route
    assert f"reverse_proxy {' '.join(CLUSTER[h] + ':8481' for h in SELECT)} {{" in route
    for line in ("lb_policy round_robin", "health_uri /health", "health_status 200", "respond 404"):
        assert line in route, line
    # Internal only: the proxy publishes 80 and 443 (to Caddy's 8080 and 8443), nothing else.
    compose = yaml.safe_load(
        (cluster_site / PROXY_HOST / "opt/telemetry/reverse_proxy/container.compose.yml").read_text()
    )
    assert [port.split(":")[-2] for port in compose["services"]["caddy"]["ports"]] == ["80", "443"]


@pytest.mark.timeout(1800)
def test_caddy_adapts_the_cluster_route(cluster_site, tmp_path):
    caddy = require_binary("caddy")
    caddyfile = tmp_path / "Caddyfile"
    text = (cluster_site / PROXY_HOST / "opt/telemetry/reverse_proxy/conf/Caddyfile").read_text()
    caddyfile.write_text(text.replace("basic_auth ", "basicauth "))  # Caddy 2.6 spelling
    env = dict(os.environ, HOME=str(tmp_path), XDG_DATA_HOME=str(tmp_path / "d"), XDG_CONFIG_HOME=str(tmp_path / "c"))
    result = subprocess.run(
        [caddy, "adapt", "--adapter", "caddyfile", "--config", str(caddyfile)],
        capture_output=True,
        text=True,
        check=False,
        env=env,
    )
    assert result.returncode == 0, result.stderr
    adapted = json.loads(result.stdout)
    found = {"rewrite": [], "proxies": []}

    def walk(node):
        if isinstance(node, dict):
            if node.get("handler") == "rewrite":
                found["rewrite"].append(node.get("uri"))
            if node.get("handler") == "reverse_proxy":
                found["proxies"].append(node)
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(adapted)
    assert any(uri.startswith("/insert/0/influx/api/v2/write?") for uri in found["rewrite"]), found["rewrite"]
    edge = [p for p in found["proxies"] if [u["dial"] for u in p["upstreams"]] == ["vmauth-edge:8427"]]
    assert len(edge) == 2, found["proxies"]  # the two write routes, through the nodes' budget
    vminsert = [p for p in found["proxies"] if any(u["dial"] == "10.0.0.21:8480" for u in p["upstreams"])]
    assert vminsert, found["proxies"]
    for proxy in vminsert:
        assert sorted(u["dial"] for u in proxy["upstreams"]) == sorted(f"{a}:8480" for a in CLUSTER.values())
        assert proxy["health_checks"]["active"]["uri"] == "/health"
        assert proxy["load_balancing"]["selection_policy"]["policy"] == "round_robin"
    vmselect = [p for p in found["proxies"] if any(u["dial"].endswith(":8481") for u in p["upstreams"])]
    assert len(vmselect) == 1, found["proxies"]
    assert sorted(u["dial"] for u in vmselect[0]["upstreams"]) == sorted(f"{CLUSTER[h]}:8481" for h in SELECT)
    assert vmselect[0]["health_checks"]["active"]["uri"] == "/health"


@pytest.mark.timeout(1800)
def test_firewall_admits_each_cluster_port_to_its_own_clients(cluster_site):
    """vmstorage's ports to vminsert and vmselect (every vmstorage host runs vminsert here), vminsert's and
    vmselect's HTTP ports to the proxy and Grafana (grafana_prod); no other host of the inventory."""
    storage_clients, select_clients = sorted(CLUSTER.values()), sorted(CLUSTER[h] for h in SELECT)
    for host, address in CLUSTER.items():
        # The firewall role renders each host below <telemetry_root>/<host>.
        rules = (cluster_site / host / host / "opt/telemetry/firewall/docker-user.rules").read_text()
        expected = {8400: storage_clients, 8401: select_clients, 8480: ["10.0.0.10"]}
        if host in SELECT:
            expected[8481] = ["10.0.0.10"]
        if host == "metrics_prod":
            expected[3100] = ["10.0.0.10"]
        # vmstorage's HTTP port (snapshots, deletes) is on loopback only: never published beyond it.
        assert by_port(rules) == expected, host
        assert f"--ctorigdst {address} " in rules, host


@pytest.mark.timeout(1800)
def test_grafana_reads_vmselect_with_the_victoriametrics_provisioning(cluster_site):
    grafana = cluster_site / PROXY_HOST / "opt/telemetry/grafana"
    service = yaml.safe_load((grafana / "container.compose.yml").read_text())["services"]["grafana"]
    # Two vmselect hosts and the proxy on Grafana's host: reads go through its balancing route.
    assert service["environment"]["VICTORIAMETRICS_URL"] == "http://caddy:8491/select/0/prometheus"
    datasources = yaml.safe_load((grafana / "provisioning/datasources/datasources.yml").read_text())["datasources"]
    [vm] = [d for d in datasources if d["uid"] == "victoriametrics"]
    assert vm["type"] == "prometheus" and vm["url"] == "${VICTORIAMETRICS_URL}"
    assert "influxdb" not in {d["uid"] for d in datasources}
    deployed = sorted(p.name for p in (grafana / "dashboards").glob("*.json"))
    assert deployed == sorted(p.name for p in (REPO / "grafana/dashboards-victoriametrics").glob("*.json"))
    for name in deployed:
        assert (grafana / "dashboards" / name).read_text() == (
            REPO / "grafana/dashboards-victoriametrics" / name
        ).read_text()
    assert not (grafana / "secrets" / "influxdb_read_token").exists()


@pytest.mark.timeout(1800)
def test_site_check_diff_with_victoriametrics_changes_nothing(tmp_path):
    """`ansible-playbook site.yml --check --diff` on the local inventory with the VictoriaMetrics backend."""
    missing = _generated_missing()
    if missing:
        pytest.skip(f"not generated in this checkout yet: {', '.join(missing)}")
    values = {**_vault_values(), "metrics_backend": "victoriametrics"}
    extra = tmp_path / "vars.json"
    extra.write_text(json.dumps(values))
    extra.chmod(0o600)
    root = tmp_path / "root"
    cmd = [
        "ansible-playbook",
        "site.yml",
        "-i",
        "inventory/local",
        "-e",
        "telemetry_render_only=true",
        "-e",
        f"telemetry_root={root}",
        "-e",
        f"@{extra}",
    ]
    _assert_ok(_run(cmd))
    base = root / "opt/telemetry"
    assert (base / "victoriametrics/victoriametrics.compose.yml").is_file()
    assert not (base / "influxdb").exists()
    check = _run([*cmd, "--check", "--diff"], env=_env(ANSIBLE_CHECK_MODE_MARKERS="1"))
    _assert_ok(check)
    output = check.stdout + check.stderr
    assert "Check the disk space of the data stores" in output, "the run did not reach the last play"
    changed = _recap_changed(check.stdout)
    assert changed and not any(changed.values()), check.stdout[-OUTPUT_TAIL:]
    for node in yaml.safe_load((REPO / "inventory/local/group_vars/all/nodes.yml").read_text())["telemetry_nodes"]:
        password = (base / "reverse_proxy/secrets/nodes" / f"{node}.metrics-password").read_text()
        assert password not in output, f"{node}'s metrics password appears in the --check --diff output"
    for value in (values["vault_grafana_admin_password"], values["vault_grafana_secret_key"]):
        assert value not in output


@pytest.mark.timeout(900)
def test_node_credentials_hand_out_the_metrics_token_and_rotate_moves_it_aside(tmp_path):
    """`make node-credentials` / `node-rotate` (ansible/nodes.yml) with the VictoriaMetrics backend."""
    inventory = tmp_path / "inventory" / "prod"
    shutil.copytree(REPO / "inventory" / "prod", inventory)
    root = tmp_path / "root"
    local = [
        "-e",
        f"telemetry_root={root}",
        "-e",
        "ansible_connection=local",
        "-e",
        "ansible_become=false",
        "-e",
        "ansible_python_interpreter={{ ansible_playbook_python }}",
        "-e",
        "metrics_backend=victoriametrics",
    ]
    node = yaml.safe_load((inventory / "group_vars/all/nodes.yml").read_text())["telemetry_nodes"][0]
    nodes_dir = root / "opt/telemetry/reverse_proxy/secrets/nodes"
    nodes_dir.mkdir(parents=True)
    password, push = secrets.token_urlsafe(30), secrets.token_urlsafe(30)
    (nodes_dir / f"{node}.metrics-password").write_text(password)
    (nodes_dir / f"{node}.loki-password").write_text(push)

    def play(action: str, *extra: str) -> subprocess.CompletedProcess:
        return _run(
            [
                "ansible-playbook",
                "-i",
                str(inventory / "hosts.yml"),
                "ansible/nodes.yml",
                "-e",
                f"node={node}",
                "-e",
                f"node_action={action}",
                *local,
                *extra,
            ]
        )

    env_dir = tmp_path / "env"
    _assert_ok(play("credentials", "-e", f"node_env_dir={env_dir}"))
    env_file = env_dir / f"{node}.env"
    assert env_file.stat().st_mode & 0o777 == 0o600
    env = dict(line.split("=", 1) for line in env_file.read_text().splitlines() if not line.startswith("#"))
    assert env["INFLUXDB_URL"] == "https://metrics.example.org"
    # What Caddy reads as Basic credentials: the node's name and its metrics password.
    assert base64.b64decode(env["INFLUXDB_TOKEN"]).decode() == f"{node}:{password}"
    assert env["LOKI_USERNAME"] == node and env["LOKI_PASSWORD"] == push
    assert not (root / "opt/telemetry/influxdb").exists()

    _assert_ok(play("rotate"))
    assert not (nodes_dir / f"{node}.metrics-password").exists()
    assert not (nodes_dir / f"{node}.loki-password").exists()
    # Aside, where the next deploy keeps them working beside the new ones (tests/test_rotation.py).
    assert (nodes_dir / "retiring" / f"{node}.metrics-password").read_text() == password
    assert (nodes_dir / "retiring" / f"{node}.loki-password").read_text() == push
    assert not (root / "opt/telemetry/influxdb").exists()


def test_the_proxy_and_grafana_reach_each_service_at_the_port_its_host_gives_it(tmp_path):
    """Ports set in the inventory (victoriametrics_vminsert_port, _vmselect_port, victoriametrics_port) are used."""
    ports = {"vm_a": (18480, 18481), "vm_b": (8480, 8481)}
    hosts = {
        "all": {
            "vars": {
                "metrics_backend": "victoriametrics",
                "victoriametrics_mode": "cluster",
                "ansible_python_interpreter": "{{ ansible_playbook_python }}",
            },
            "children": {
                group: {
                    "hosts": {name: {"telemetry_private_address": f"10.0.0.{i + 1}"} for i, name in enumerate(ports)}
                }
                for group in ("vmstorage", "vminsert", "vmselect")
            }
            | {"reverse_proxy": {"hosts": {"proxy": {}}}},
        }
    }
    for group in ("vmstorage", "vminsert", "vmselect"):
        for name, (insert, select) in ports.items():
            hosts["all"]["children"][group]["hosts"][name].update(
                victoriametrics_vminsert_port=insert, victoriametrics_vmselect_port=select
            )
    (tmp_path / "hosts.yml").write_text(yaml.safe_dump(hosts))
    play = [
        {
            "hosts": "proxy",
            "connection": "local",
            "gather_facts": False,
            "vars_files": [
                str(REPO / "ansible/roles/reverse_proxy/defaults/main.yml"),
                str(REPO / "ansible/roles/grafana/defaults/main.yml"),
            ],
            "tasks": [
                {
                    "ansible.builtin.copy": {
                        "dest": str(tmp_path / "out.json"),
                        "content": "{{ {'writes': reverse_proxy_victoriametrics_upstreams, "
                        "'reads': reverse_proxy_victoriametrics_read_upstreams} | to_json }}",
                        "mode": "0600",
                    }
                }
            ],
        }
    ]
    (tmp_path / "play.yml").write_text(yaml.safe_dump(play))
    result = _run(["ansible-playbook", "-i", str(tmp_path / "hosts.yml"), str(tmp_path / "play.yml")])
    assert result.returncode == 0, result.stdout[-OUTPUT_TAIL:] + result.stderr[-OUTPUT_TAIL:]
    found = json.loads((tmp_path / "out.json").read_text())
    assert found == {"writes": ["10.0.0.1:18480", "10.0.0.2:8480"], "reads": ["10.0.0.1:18481", "10.0.0.2:8481"]}
