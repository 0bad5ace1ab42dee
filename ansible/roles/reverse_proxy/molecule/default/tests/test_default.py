"""Checks what the reverse_proxy role renders in render-only mode."""

import base64
import os
import re
import shutil
import subprocess
from pathlib import Path

import yaml

ROOT = os.environ["TELEMETRY_ROOT"]
EPHEMERAL = Path(os.environ["MOLECULE_EPHEMERAL_DIRECTORY"])
REPO = Path(os.environ["MOLECULE_PROJECT_DIRECTORY"]).resolve().parents[2]
DIR = ROOT + "/opt/telemetry/reverse_proxy"


def _pinned(key):
    for line in (REPO / "versions.env").read_text().splitlines():
        if line.startswith(key + "="):
            return line.split("=", 1)[1].strip()
    return None


def _caddyfile(host):
    return host.file(DIR + "/conf/Caddyfile").content_string


def _site(text, domain):
    """The block of one site, from its address line to its closing brace."""
    match = re.search(rf"(?ms)^{re.escape(domain)} \{{\n(.*?)^\}}$", text)
    assert match, f"no site block for {domain}"
    return match.group(1)


NODES = ("miner-01", "validator-01")


def test_private_files(host):
    secrets = [f"/secrets/nodes/{node}.loki-password" for node in NODES]
    # What Caddy reads or writes is its user's (10006); the nodes' passwords stay root's.
    caddy = ("/conf/Caddyfile", "/conf/certs/cert.pem", "/conf/certs/key.pem")
    for path in (*caddy, *secrets):
        secret = host.file(DIR + path)
        assert secret.is_file, path
        assert secret.mode == 0o600, path
        assert secret.uid == (10006 if path in caddy else 0), path
    for path in (
        "/conf",
        "/conf/certs",
        "/data",
        "/config",
        "/logs",
        "/secrets",
        "/secrets/nodes",
        "/secrets/nodes/retiring",
    ):
        directory = host.file(DIR + path)
        assert directory.is_directory
        assert directory.mode == 0o700
        assert directory.uid == (0 if path.startswith("/secrets") else 10006), path


def test_certificate_is_the_one_given(host):
    given = (EPHEMERAL / "secrets" / "cert.pem").read_text().strip()
    assert host.file(DIR + "/conf/certs/cert.pem").content_string.strip() == given


def test_grafana_is_behind_basic_auth(host):
    site = _site(_caddyfile(host), "grafana.example.test")
    hash_ = "$2b$12$" + (EPHEMERAL / "secrets" / "operator_hash").read_text().strip()
    assert f"basic_auth {{\n\t\toperator {hash_}\n\t}}" in site
    assert "reverse_proxy grafana:3000" in site
    # Grafana must not see the proxy's credentials, or its own login breaks.
    assert "header_up -Authorization" in site
    assert "tls /etc/caddy/certs/cert.pem /etc/caddy/certs/key.pem" in site


def test_loki_exposes_only_the_push_api_behind_the_nodes_logins(host):
    site = _site(_caddyfile(host), "logs.example.test")
    assert "path /loki/api/v1/push" in site
    assert "method POST" in site
    push = site[site.index("handle @push {") : site.index("\thandle {")]
    # Strangers to the node map fall back to the vault's operator users (bcrypt).
    assert "basic_auth @stranger {" in push
    assert "ops-tool $2b$12$" in push
    assert "reverse_proxy loki:3100" in push
    # The tenant is the node's uid from the credential map, never the client's header.
    assert "header_up X-Scope-OrgID {telemetry.node.tenant}" in push
    fallback = site[site.index("\thandle {") :]
    assert "respond 404" in fallback
    assert "reverse_proxy" not in fallback


def test_each_node_has_its_own_push_login(host):
    """One map entry per node: the Basic credentials of its name and the password kept for that node alone."""
    push = _site(_caddyfile(host), "logs.example.test")
    logins = {node: header for header, node in re.findall(r'(?m)^\t\t"Basic (\S+)" (\S+) ', push)}
    assert set(logins) == set(NODES)
    passwords = {node: host.file(f"{DIR}/secrets/nodes/{node}.loki-password").content_string for node in NODES}
    assert len(set(passwords.values())) == len(NODES)
    for node, password in passwords.items():
        assert len(password) >= 32
        assert base64.b64decode(logins[node]).decode() == f"{node}:{password}", node


def test_influxdb_exposes_only_write_and_health(host):
    site = _site(_caddyfile(host), "metrics.example.test")
    assert "@influxdb path /api/v2/write /write /ping /health" in site
    assert "reverse_proxy influxdb:8086" in site
    assert "basic_auth" not in site


def test_caddyfile_parses_with_caddy(host, tmp_path):
    """Real parse and provisioning by the caddy binary (Debian's package).

    Debian ships an older Caddy that still names basic_auth "basicauth"; that
    one rename aside, the rendered file is checked as it is, certificate
    files included.
    """
    caddy = shutil.which("caddy")
    assert caddy, "the caddy binary is needed for this check: apt-get install caddy"
    text = _caddyfile(host).replace("basic_auth ", "basicauth ")
    text = text.replace("/etc/caddy/certs/", DIR + "/conf/certs/")
    # The access logs: validating opens them, so not in this machine's /var/log.
    text = text.replace("/var/log/caddy/", str(tmp_path) + "/")
    config = tmp_path / "Caddyfile"
    config.write_text(text)
    env = dict(
        os.environ, HOME=str(tmp_path), XDG_DATA_HOME=str(tmp_path / "data"), XDG_CONFIG_HOME=str(tmp_path / "config")
    )
    result = subprocess.run(
        [caddy, "validate", "--adapter", "caddyfile", "--config", str(config)],
        capture_output=True,
        text=True,
        check=False,
        env=env,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_container_definition(host):
    compose = yaml.safe_load(host.file(DIR + "/container.compose.yml").content_string)
    service = compose["services"]["caddy"]
    pinned = _pinned("CADDY_IMAGE")
    assert service["image"] == (pinned or "caddy:not-pinned-in-versions-env")
    assert service["ports"] == ["0.0.0.0:80:8080", "0.0.0.0:443:8443"]
    # Confined: its own user, no capability in effect, read-only, limited.
    assert service["user"] == "10006:10006"
    assert service["cap_drop"] == ["ALL"] and service["cap_add"] == ["NET_BIND_SERVICE"]
    assert service["security_opt"] == ["no-new-privileges:true"] and service["read_only"] is True
    assert service["mem_limit"] == "512m" and service["pids_limit"] == 512
    mounts = {m["target"]: m for m in service["volumes"]}
    # The directory, not the file: the template module writes a new file (a
    # new inode) that a single-file bind mount would never show the container.
    assert mounts["/etc/caddy"]["source"] == DIR + "/conf"
    assert mounts["/etc/caddy"]["read_only"] is True
    assert host.file(DIR + "/conf").is_directory
    assert not any(target.startswith("/etc/caddy/") for target in mounts)
    # The nodes' passwords stay outside the container.
    assert not any(m["source"].startswith(DIR + "/secrets") for m in service["volumes"])
    for mount in service["volumes"]:
        assert host.file(mount["source"]).exists, mount
    result = subprocess.run(
        ["docker-compose", "-f", DIR + "/container.compose.yml", "config", "--quiet"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
