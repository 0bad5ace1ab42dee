"""The production deployment (ansible/, inventory/): lint, syntax, molecule.

Every check runs the real tool as a subprocess from the repository and shows
its output when it fails:

- yamllint (the repository's .yamllint) and ansible-lint (production profile);
- ansible-playbook --syntax-check of site.yml with both inventories;
- `molecule test` of each role's default scenario: the role converges in
  render-only mode into a scratch root on this machine, a second converge must
  change nothing, and testinfra checks the rendered files;
- the whole playbook rendered with each inventory (twice: the second run must
  change nothing), and refused before any change when a secret is missing;
- each role's `docker` scenario, which runs real containers: it needs a Docker
  engine and molecule's docker driver, and is skipped with the reason elsewhere.

Nothing here needs the network: molecule's galaxy dependency step is disabled
and only the collections bundled with the ansible package are used.
"""

from __future__ import annotations

import base64
import datetime
import hashlib
import http.client
import http.server
import itertools
import json
import os
import re
import secrets
import shutil
import socket
import ssl
import string
import subprocess
import threading
import time
import urllib.parse
from pathlib import Path

import pytest
import yaml
from firewall_rules import admitted, capped

pytestmark = pytest.mark.slow
# Every test renders or deploys its own site: nothing to share, and together they take
# a third of the suite, so pytest-xdist spreads them over the workers (tests/conftest.py).
SPREAD_ACROSS_WORKERS = True

REPO = Path(__file__).resolve().parents[1]
ROLES_DIR = REPO / "ansible" / "roles"
ROLES = ["docker", "firewall", "influxdb", "loki", "victoriametrics", "grafana", "reverse_proxy", "edge_audit"]
# Roles with a `docker` scenario (real containers). edge_audit has none: Alloy's image is never run here.
DOCKER_ROLES = [role for role in ROLES if (ROLES_DIR / role / "molecule" / "docker").is_dir()]
OUTPUT_TAIL = 12000


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        ANSIBLE_NOCOLOR="1",
        ANSIBLE_FORCE_COLOR="0",
        NO_COLOR="1",
        PY_COLORS="0",
        ANSIBLE_CONFIG=str(REPO / "ansible.cfg"),
    )
    return env


def _run(cmd: list[str], cwd: Path = REPO, timeout: int = 600, env=None):
    if shutil.which(cmd[0]) is None:
        pytest.fail(f"{cmd[0]} is not installed (pip install -e '.[dev]')")
    return subprocess.run(
        cmd,
        cwd=cwd,
        env=env or _env(),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def _assert_ok(result: subprocess.CompletedProcess) -> None:
    output = (result.stdout + "\n" + result.stderr)[-OUTPUT_TAIL:]
    assert result.returncode == 0, f"$ {' '.join(result.args)}\nexit {result.returncode}\n{output}"


def _recap_changed(output: str) -> dict[str, int]:
    """changed= count per host from the PLAY RECAP."""
    return {host: int(changed) for host, changed in re.findall(r"^(\S+)\s+: ok=\d+\s+changed=(\d+)", output, re.M)}


def _pinned(key: str) -> str | None:
    for line in (REPO / "versions.env").read_text().splitlines():
        if line.startswith(key + "="):
            return line.split("=", 1)[1].strip()
    return None


# --- lint and syntax ---------------------------------------------------------


def test_yamllint():
    _assert_ok(_run(["yamllint", "--strict", "."]))


def test_ansible_lint_production_profile():
    result = _run(["ansible-lint", "--offline", "--profile", "production"])
    _assert_ok(result)
    assert "Profile 'production' was required, and it passed" in result.stdout + result.stderr


@pytest.mark.parametrize("inventory", ["inventory/prod/hosts.yml", "inventory/local"])
def test_syntax_check(inventory):
    _assert_ok(_run(["ansible-playbook", "--syntax-check", "-i", inventory, "site.yml"]))


# --- molecule: render-only scenarios -------------------------------------------


@pytest.mark.timeout(600)
@pytest.mark.parametrize("role", ROLES)
def test_molecule_default_scenario(role, tmp_path):
    # molecule.yml generates the test secrets here, so that they can be looked for;
    # check-mode runs mark their plays and tasks with [CHECK MODE].
    # Its own ephemeral directory: molecule derives the default one from the role's
    # name alone, so two checkouts testing the same role at once would share it.
    secrets_dir = tmp_path / "secrets"
    env = {
        **_env(),
        "MOLECULE_EPHEMERAL_DIRECTORY": str(tmp_path / "molecule"),
        "TELEMETRY_TEST_SECRETS_DIR": str(secrets_dir),
        "ANSIBLE_CHECK_MODE_MARKERS": "1",
    }
    result = _run(["molecule", "test", "-s", "default"], cwd=ROLES_DIR / role, env=env)
    _assert_ok(result)
    output = result.stdout + result.stderr
    # The sequence really converged twice and verified.
    assert re.search(r"idempotence.*Executed: Successful", output), output[-OUTPUT_TAIL:]
    assert re.search(r"verify.*Executed: Successful", output), output[-OUTPUT_TAIL:]
    assert re.search(r"\d+ passed", output), output[-OUTPUT_TAIL:]
    scenario = yaml.safe_load((ROLES_DIR / role / "molecule" / "default" / "molecule.yml").read_text())
    if "check" in scenario["scenario"]["test_sequence"]:
        # `--check --diff` against what converge left runs to the end and changes nothing.
        assert re.search(r"check.*Executed: Successful", output), output[-OUTPUT_TAIL:]
        playbook_output = re.sub(r"[│ \t]*\n[│ \t]*", "\n", result.stdout)
        _, marker, check_run = playbook_output.partition("[CHECK MODE]")
        assert marker, playbook_output[-OUTPUT_TAIL:]
        recap = check_run.partition("PLAY RECAP")[2].partition("PLAY [")[0]
        assert _recap_changed(recap)["instance"] == 0, check_run[:OUTPUT_TAIL]
    # Every run shows its diff (molecule.yml), and no secret appears in any of them.
    if "TELEMETRY_TEST_SECRETS_DIR" in (ROLES_DIR / role / "molecule" / "default" / "molecule.yml").read_text():
        assert any(secrets_dir.glob("*")), "the scenario generated no secret where the test looks"
    for secret in secrets_dir.glob("*"):
        value = secret.read_text().strip()
        assert value and value not in output, f"{secret.name} appears in the molecule output"


# --- the whole playbook in render-only mode ----------------------------------------


def _bcrypt_like() -> str:
    alphabet = "./" + string.ascii_letters + string.digits
    return "$2b$12$" + "".join(secrets.choice(alphabet) for _ in range(53))


@pytest.fixture
def test_secrets(tmp_path) -> Path:
    """Stand-in vault values, generated for this run only (mode 0600)."""
    values = {
        "vault_influxdb_admin_password": secrets.token_urlsafe(24),
        "vault_influxdb_admin_token": secrets.token_urlsafe(48),
        "vault_grafana_admin_password": secrets.token_urlsafe(24),
        "vault_grafana_secret_key": secrets.token_urlsafe(32),
        "vault_grafana_influxdb_token": secrets.token_urlsafe(64),
        "vault_reverse_proxy_grafana_users": [{"username": "operator", "password_hash": _bcrypt_like()}],
        "vault_reverse_proxy_loki_users": [{"username": "node", "password_hash": _bcrypt_like()}],
        "vault_backup_restic_password": secrets.token_urlsafe(32),
        **{
            f"vault_victoriametrics_{name}_auth_key": secrets.token_hex(20)
            for name in ("delete", "snapshot", "force_merge", "force_flush")
        },
    }
    path = tmp_path / "secrets.json"
    path.write_text(json.dumps(values))
    path.chmod(0o600)
    return path


def _render_args(root: Path, extra: list[str]) -> list[str]:
    args = ["-e", "telemetry_render_only=true", "-e", f"telemetry_root={root}", *extra]
    if _pinned("CADDY_IMAGE") is None:
        # Render-only mode never pulls it; deploying refuses to run without the pin.
        args += ["-e", "reverse_proxy_image=caddy:not-pinned-in-versions-env"]
    return args


INVENTORIES = {
    "local": ["-i", "inventory/local"],
    # Both production hosts rendered on this machine: checks how the inventory
    # wires services that run on different hosts.
    "prod": [
        "-i",
        "inventory/prod/hosts.yml",
        "-e",
        "ansible_connection=local",
        "-e",
        "ansible_python_interpreter={{ ansible_playbook_python }}",
    ],
}


@pytest.mark.parametrize("name", sorted(INVENTORIES))
@pytest.mark.timeout(900)
def test_site_renders_and_is_idempotent(name, tmp_path, test_secrets):
    root = tmp_path / "root"
    cmd = [
        "ansible-playbook",
        "site.yml",
        *INVENTORIES[name],
        *_render_args(root, ["-e", f"@{test_secrets}"]),
    ]
    first = _run(cmd)
    _assert_ok(first)
    assert any(_recap_changed(first.stdout).values()), first.stdout[-OUTPUT_TAIL:]
    # InfluxDB, the default backend, takes writes from a node that is not the operator's own.
    warnings = [line for line in first.stdout.splitlines() if "WARNING: metrics_backend is influxdb" in line]
    assert len(warnings) == (1 if name == "prod" else 0), warnings
    assert all("example-miner-01." in line and "metrics_backend: victoriametrics" in line for line in warnings)
    second = _run(cmd)
    _assert_ok(second)
    changed = _recap_changed(second.stdout)
    assert changed and not any(changed.values()), second.stdout[-OUTPUT_TAIL:]

    base = root / "opt" / "telemetry"
    for path in (
        "influxdb/container.compose.yml",
        "loki/loki.yml",
        "grafana/secrets/grafana_admin_password",
        "grafana/provisioning/datasources/datasources.yml",
        "reverse_proxy/conf/Caddyfile",
        "edge_audit/conf/config.alloy",
    ):
        assert (base / path).is_file(), path
    assert (base / "reverse_proxy/conf/Caddyfile").stat().st_mode & 0o777 == 0o600
    # One push user per node of the inventory's list, each with its own password.
    nodes = yaml.safe_load((REPO / "inventory" / name / "group_vars" / "all" / "nodes.yml").read_text())
    caddyfile = (base / "reverse_proxy" / "conf" / "Caddyfile").read_text()
    for node in nodes["telemetry_nodes"]:
        assert re.search(rf'(?m)^\t\t"Basic [A-Za-z0-9+/=]+" {re.escape(node)} ', caddyfile), node
        password = base / "reverse_proxy" / "secrets" / "nodes" / f"{node}.loki-password"
        assert password.stat().st_mode & 0o777 == 0o600
    values = json.loads(test_secrets.read_text())
    grafana_secrets = base / "grafana" / "secrets"
    assert (grafana_secrets / "grafana_admin_password").read_text() == values["vault_grafana_admin_password"]
    assert (grafana_secrets / "influxdb_read_token").read_text() == values["vault_grafana_influxdb_token"]
    for secret_file in grafana_secrets.iterdir():
        assert secret_file.stat().st_mode & 0o777 == 0o400, secret_file
    env = "\n".join(
        f"{key}={value}"
        for key, value in yaml.safe_load((base / "grafana" / "container.compose.yml").read_text())["services"][
            "grafana"
        ]["environment"].items()
    )
    assert "GF_SNAPSHOTS_EXTERNAL_ENABLED=false" in env.splitlines()
    assert "GF_SECURITY_SECRET_KEY__FILE=/run/secrets/grafana_secret_key" in env.splitlines()
    # The audit shipper reads the files the Caddyfile writes and pushes where the proxy pushes, directly.
    alloy = (base / "edge_audit" / "conf" / "config.alloy").read_text()
    logged = re.findall(r"output file /var/log/caddy/(\S+) \{", caddyfile)
    assert sorted(logged) == ["logs-access.log", "metrics-access.log"]
    assert sorted(re.findall(r'"__path__" = "/var/log/caddy/([^"]+)"', alloy)) == sorted(logged)
    loki = "10.0.0.20:3100" if name == "prod" else "loki:3100"
    assert f'url       = "http://{loki}/loki/api/v1/push"' in alloy and 'tenant_id = "_edge"' in alloy
    if name == "prod":
        # Grafana and the proxy reach InfluxDB and Loki on metrics_prod's private address.
        assert "INFLUXDB_URL=http://10.0.0.20:8086" in env
        assert "LOKI_URL=http://10.0.0.20:3100" in env
        assert "reverse_proxy 10.0.0.20:3100 {" in caddyfile
        assert "reverse_proxy grafana:3000 {" in caddyfile
        assert "email ops@example.org" in caddyfile
        # metrics_prod publishes InfluxDB and Loki on its private address: only
        # grafana_prod (Grafana reads, the proxy writes) gets through DOCKER-USER.
        rules = (root / "metrics_prod" / "opt" / "telemetry" / "firewall" / "docker-user.rules").read_text()
        assert admitted(rules) == {("10.0.0.20", "tcp", 8086): ["10.0.0.10"], ("10.0.0.20", "tcp", 3100): ["10.0.0.10"]}
        grafana_rules = (root / "grafana_prod" / "opt" / "telemetry" / "firewall" / "docker-user.rules").read_text()
        # Grafana on loopback, Caddy public by design: open to all, a cap of connections per address.
        assert admitted(grafana_rules) == {} and capped(grafana_rules) == {80: 256, 443: 256}
    else:
        # Everything on one machine, on loopback: no source list; the proxy's public ports keep their cap.
        rules = (root / "localhost" / "opt" / "telemetry" / "firewall" / "docker-user.rules").read_text()
        assert admitted(rules) == {} and capped(rules) == {80: 256, 443: 256}


@pytest.mark.parametrize(
    ("missing", "message"),
    [
        ("vault_influxdb_admin_token", "InfluxDB secrets are missing"),
        ("vault_grafana_secret_key", "Grafana secrets are missing"),
        ("vault_reverse_proxy_grafana_users", "Grafana needs at least one basic auth user"),
    ],
)
def test_missing_secret_stops_before_any_change(missing, message, tmp_path, test_secrets):
    values = json.loads(test_secrets.read_text())
    del values[missing]
    test_secrets.write_text(json.dumps(values))
    root = tmp_path / "root"
    result = _run(
        [
            "ansible-playbook",
            "site.yml",
            *INVENTORIES["local"],
            *_render_args(root, ["-e", f"@{test_secrets}"]),
        ]
    )
    output = result.stdout + result.stderr
    assert result.returncode != 0, output[-OUTPUT_TAIL:]
    assert message in output, output[-OUTPUT_TAIL:]
    assert "Check inventory and secrets before changing anything" in output
    assert not root.exists(), "files were rendered although a secret was missing"


def test_placeholder_secret_is_refused(tmp_path, test_secrets):
    values = json.loads(test_secrets.read_text())
    values["vault_grafana_admin_password"] = "CHANGE_ME with something long"
    test_secrets.write_text(json.dumps(values))
    result = _run(
        [
            "ansible-playbook",
            "site.yml",
            *INVENTORIES["local"],
            *_render_args(tmp_path / "root", ["-e", f"@{test_secrets}"]),
        ]
    )
    assert result.returncode != 0
    assert "Grafana secrets are missing" in result.stdout + result.stderr


@pytest.mark.timeout(900)
def test_site_check_diff_changes_nothing_and_shows_no_secret(tmp_path, test_secrets):
    """`ansible-playbook site.yml --check --diff` against what a run left behind."""
    root = tmp_path / "root"
    cmd = ["ansible-playbook", "site.yml", *INVENTORIES["local"], *_render_args(root, ["-e", f"@{test_secrets}"])]
    _assert_ok(_run(cmd))
    check = _run([*cmd, "--check", "--diff"], env={**_env(), "ANSIBLE_CHECK_MODE_MARKERS": "1"})
    _assert_ok(check)
    output = check.stdout + check.stderr
    assert "[CHECK MODE]" in output
    assert "Check the disk space of the data stores" in output, "the run did not reach the last play"
    changed = _recap_changed(check.stdout)
    assert changed and not any(changed.values()), check.stdout[-OUTPUT_TAIL:]
    values = json.loads(test_secrets.read_text())
    for name, value in values.items():
        for secret in value if isinstance(value, list) else [value]:
            for text in secret.values() if isinstance(secret, dict) else [secret]:
                if len(str(text)) >= 12:
                    assert str(text) not in output, f"{name} appears in the --check --diff output"


def _changed_tasks(output: str) -> list[str]:
    """Names of the tasks that reported a change (once each, in order)."""
    names = []
    for name, body in re.findall(r"(?ms)^TASK \[(.+?)\] \*+\n(.*?)(?=^TASK |^RUNNING HANDLER |^PLAY )", output):
        if re.search(r"(?m)^changed: ", body) and name not in names:
            names.append(name)
    return names


@pytest.mark.timeout(900)
@pytest.mark.parametrize("backend", ["influxdb", "victoriametrics"])
def test_site_check_reports_what_a_new_node_would_get(tmp_path, test_secrets, backend):
    """`make node-add` lists a node; `site.yml --check --diff` before the deploy reports
    the node's passwords and users as changes, and writes nothing."""
    inventory = tmp_path / "inventory"
    shutil.copytree(REPO / "inventory" / "local", inventory)
    root = tmp_path / "root"
    extra = ["-e", f"@{test_secrets}", "-e", f"metrics_backend={backend}"]
    cmd = ["ansible-playbook", "site.yml", "-i", str(inventory), *_render_args(root, extra)]
    _assert_ok(_run(cmd))
    _assert_ok(_nodes_play(inventory, "miner-99", "add"))
    conf = root / "opt" / "telemetry" / "reverse_proxy" / "conf"
    before = {path: path.read_text() for path in conf.rglob("*") if path.is_file()}
    kinds = ["loki", "metrics"] if backend == "victoriametrics" else ["loki"]

    check = _run([*cmd, "--check", "--diff"])
    _assert_ok(check)
    assert "Check the disk space of the data stores" in check.stdout, "the run did not reach the last play"
    # With VictoriaMetrics the edge vmauth gets the node's budget (its auth config, reloaded in place).
    vmauth = ["reverse_proxy : Write the edge vmauth's auth config (checked by vmauth itself, mode 0600)"]
    assert _changed_tasks(check.stdout) == [
        "reverse_proxy : Write the nodes' passwords, the same on every proxy host (mode 0600)",
        *(vmauth if backend == "victoriametrics" else []),
        "reverse_proxy : Write the Caddyfile (checked by Caddy itself before it is used)",
        # Grafana's Loki data source reads the new node's tenant too (LOKI_TENANTS).
        "grafana : Render the container definition (render-only mode)",
    ], check.stdout[-OUTPUT_TAIL:]
    nodes_dir = root / "opt" / "telemetry" / "reverse_proxy" / "secrets" / "nodes"
    for kind in kinds:
        assert not (nodes_dir / f"miner-99.{kind}-password").exists()
    assert {path: path.read_text() for path in conf.rglob("*") if path.is_file()} == before

    # The deploy then does what --check reported.
    deploy = _run(cmd)
    _assert_ok(deploy)
    for kind in kinds:
        assert (nodes_dir / f"miner-99.{kind}-password").stat().st_mode & 0o777 == 0o600
    caddy_config = "".join(path.read_text() for path in conf.rglob("*") if path.is_file())
    users = re.findall(r'(?m)^\t+"(?:Basic|Token) [A-Za-z0-9+/=]+" miner-99 ', caddy_config)
    assert len(users) == len(kinds), caddy_config


# --- molecule: docker scenarios (real containers) ---------------------------------


def _docker_unavailable_reason() -> str | None:
    if shutil.which("docker") is None:
        return "no docker CLI on this machine"
    try:
        info = subprocess.run(
            ["docker", "info", "--format", "{{.ServerVersion}}"],
            capture_output=True,
            text=True,
            timeout=20,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return "`docker info` timed out: no Docker engine answers"
    if info.returncode != 0:
        detail = (info.stderr.strip().splitlines() or ["no output"])[-1]
        return f"no Docker engine answers `docker info`: {detail}"
    drivers = subprocess.run(["molecule", "drivers"], capture_output=True, text=True, timeout=60, check=False)
    if "docker" not in drivers.stdout:
        return "molecule's docker driver is not installed (pip install 'molecule-plugins[docker]')"
    return None


@pytest.mark.docker
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("role", DOCKER_ROLES)
def test_molecule_docker_scenario(role):
    reason = _docker_unavailable_reason()
    if reason:
        pytest.skip(reason)
    result = _run(["molecule", "test", "-s", "docker"], cwd=ROLES_DIR / role, timeout=1800)
    _assert_ok(result)


# --- the influxdb role's API setup against a stand-in InfluxDB 2 API ---------------
#
# No InfluxDB 2 can run here, so the role's setup tasks (tasks/setup.yml) run
# against a small HTTP server that follows the documented InfluxDB 2 API for
# the calls the role makes, strictly: JSON types as InfluxDB's decoder wants
# them, the operator token on every call after setup, 422 for a second setup.
#
# Tokens behave as in InfluxDB 2.9, which hashes them by default (release notes
# of 2.9.0, docs.influxdata.com/influxdb/v2/reference/release-notes/influxdb/:
# "Token hashing enabled by default"; docs .../admin/tokens/view-tokens/: "full
# tokens are only visible immediately after the token is created"):
# - the server keeps a SHA-512 hash only, the setup's operator token included
#   (influxdata/influxdb v2.9, authorization/storage.go: "New tokens generated are
#   stored only as hashes"; storage_authorization.go encodeAuthorization clears
#   Token before storing; a presented token is checked by its hash);
# - POST /api/v2/authorizations answers 201 with the new token's value, once
#   (authorization/http_server.go handlePostAuthorization: the response is built
#   from the in-memory record, before redaction);
# - GET /api/v2/authorizations lists every token with "token": "" (the same
#   newAuthResponse copies the stored, cleared Token field);
# - DELETE /api/v2/authorizations/{id} answers 204, or 404 "authorization not
#   found" (http_server.go handleDeleteAuthorization, authorization/error.go);
# - PATCH /api/v2/authorizations/{id} changes the status and the description
#   only, the token's value stays, and answers 200 with the token as the list
#   shows it, or 404 (http_server.go handleUpdateAuthorization: "updates the
#   authorization's status and desc").


def _sha512(token: str) -> str:
    return hashlib.sha512(token.encode()).hexdigest()


class FakeInfluxDB:
    def __init__(self):
        self.lock = threading.Lock()
        self.ids = (f"{n:016x}" for n in itertools.count(0x0A00000000000001))
        self.setup_done = False
        self.admin_token = None
        self.orgs, self.buckets, self.dbrps, self.auths, self.tasks = [], [], [], [], []
        self.issued: dict[str, str] = {}
        self.calls: list[tuple[str, str]] = []

    def _new_id(self):
        return next(self.ids)

    def handle(self, method, url, headers, body):
        parsed = urllib.parse.urlsplit(url)
        path, query = parsed.path, dict(urllib.parse.parse_qsl(parsed.query))
        self.calls.append((method, path))
        if path == "/health":
            return 200, {"status": "pass"}
        if path == "/api/v2/setup":
            if method == "GET":
                return 200, {"allowed": not self.setup_done}
            if self.setup_done:
                return 422, {"code": "conflict", "message": "onboarding has already been completed"}
            for key, kind in (
                ("username", str),
                ("password", str),
                ("org", str),
                ("bucket", str),
                ("token", str),
                ("retentionPeriodSeconds", int),
            ):
                if not isinstance(body.get(key), kind) or isinstance(body.get(key), bool):
                    return 400, {"code": "invalid", "message": f"bad {key}"}
            org = {"id": self._new_id(), "name": body["org"]}
            self.orgs.append(org)
            self.buckets.append(self._bucket(org["id"], body["bucket"], body["retentionPeriodSeconds"]))
            self.admin_token = body["token"]
            self.auths.append(
                {
                    "id": self._new_id(),
                    "hashedToken": _sha512(body["token"]),
                    "status": "active",
                    "description": f"{body['username']}'s Token",
                    "orgID": org["id"],
                    "permissions": [{"action": "write", "resource": {"type": "orgs"}}],
                }
            )
            self.setup_done = True
            return 201, {"org": org}
        token = headers.get("Authorization", "").removeprefix("Token ")
        if not self.setup_done or not token:
            return 401, {"code": "unauthorized", "message": "unauthorized access"}
        reader = next((a for a in self.auths if a["hashedToken"] == _sha512(token) and a["status"] == "active"), None)
        if reader is None:
            return 401, {"code": "unauthorized", "message": "unauthorized access"}
        if token != self.admin_token:
            # Only what the role asks of the read token: reading its bucket.
            bucket_id = path.rsplit("/", 1)[-1]
            allowed = any(p["action"] == "read" and p["resource"].get("id") == bucket_id for p in reader["permissions"])
            if method == "GET" and path.startswith("/api/v2/buckets/") and allowed:
                return 200, next(b for b in self.buckets if b["id"] == bucket_id)
            return 403, {"code": "forbidden", "message": "insufficient permissions"}
        if path == "/api/v2/orgs":
            if method == "GET":
                found = [o for o in self.orgs if o["name"] == query.get("org", o["name"])]
                if "org" in query and not found:
                    return 404, {"code": "not found", "message": "organization not found"}
                return 200, {"orgs": found}
            org = {"id": self._new_id(), "name": body["name"]}
            self.orgs.append(org)
            return 201, org
        if path == "/api/v2/buckets":
            if method == "GET":
                found = [
                    b
                    for b in self.buckets
                    if b["orgID"] == query.get("orgID") and b["name"] == query.get("name", b["name"])
                ]
                if "name" in query and not found:
                    return 404, {"code": "not found", "message": "bucket not found"}
                return 200, {"buckets": found}
            rules = body.get("retentionRules")
            if not self._valid_rules(rules):
                return 400, {"code": "invalid", "message": "bad retentionRules"}
            bucket = self._bucket(body["orgID"], body["name"], rules[0]["everySeconds"])
            self.buckets.append(bucket)
            return 201, bucket
        if path.startswith("/api/v2/buckets/"):
            bucket = next((b for b in self.buckets if b["id"] == path.rsplit("/", 1)[-1]), None)
            if bucket is None:
                return 404, {"code": "not found", "message": "bucket not found"}
            if method == "PATCH":
                if not self._valid_rules(body.get("retentionRules")):
                    return 400, {"code": "invalid", "message": "bad retentionRules"}
                bucket["retentionRules"] = body["retentionRules"]
            return 200, bucket
        if path == "/api/v2/dbrps":
            if method == "GET":
                if "orgID" not in query:
                    return 400, {"code": "invalid", "message": "either org or orgID must be provided"}
                found = [
                    d
                    for d in self.dbrps
                    if d["orgID"] == query["orgID"]
                    and d["database"] == query.get("db", d["database"])
                    and d["retention_policy"] == query.get("rp", d["retention_policy"])
                ]
                return 200, {"content": found}
            if not all(isinstance(body.get(k), str) for k in ("orgID", "bucketID", "database", "retention_policy")):
                return 400, {"code": "invalid", "message": "bad dbrp"}
            dbrp = {"id": self._new_id(), **body}
            self.dbrps.append(dbrp)
            return 201, dbrp
        if path == "/api/v2/authorizations":
            if method == "GET":
                listed = [a for a in self.auths if a["orgID"] == query.get("orgID", a["orgID"])]
                # Hashed: the value is gone; the field is there, empty.
                return 200, {"authorizations": [self._public(a, token="") for a in listed]}
            if not body.get("permissions") or not body.get("orgID"):
                return 400, {"code": "invalid", "message": "authorization must include permissions"}
            token = secrets.token_urlsafe(64)
            auth = {
                "id": self._new_id(),
                "hashedToken": _sha512(token),
                "status": body.get("status", "active"),
                "description": body["description"],
                "orgID": body["orgID"],
                "permissions": body["permissions"],
            }
            self.auths.append(auth)
            self.issued[auth["id"]] = token  # what the caller got: for the test's assertions only
            return 201, self._public(auth, token=token)
        if path.startswith("/api/v2/authorizations/") and method in ("DELETE", "PATCH"):
            auth = next((a for a in self.auths if a["id"] == path.rsplit("/", 1)[-1]), None)
            if auth is None:
                return 404, {"code": "not found", "message": "authorization not found"}
            if method == "DELETE":
                self.auths.remove(auth)
                return 204, None
            if not isinstance(body.get("description", ""), str) or body.get("status", "active") not in (
                "active",
                "inactive",
            ):
                return 400, {"code": "invalid", "message": "bad authorization update"}
            auth.update({key: body[key] for key in ("description", "status") if key in body})
            return 200, self._public(auth, token="")
        # Tasks (InfluxDB OSS 2 API, tag Tasks: GET /api/v2/tasks filters by orgID and
        # name; POST takes orgID and flux and reads name and every from the script's
        # `option task`, 400 without it; PATCH /api/v2/tasks/{taskID} replaces flux).
        if path == "/api/v2/tasks":
            if method == "GET":
                found = [k for k in self.tasks if k["orgID"] == query.get("orgID", k["orgID"])]
                return 200, {"tasks": [k for k in found if k["name"] == query.get("name", k["name"])], "links": {}}
            option = re.search(r'option task = \{name: "([^"]+)", every: (\w+)', body.get("flux") or "")
            if not body.get("orgID") or option is None:
                return 400, {"code": "invalid", "message": "task must contain an option task statement"}
            task = {"id": self._new_id(), "orgID": body["orgID"], "name": option.group(1), "every": option.group(2)}
            task.update(status=body.get("status", "active"), flux=body["flux"])
            self.tasks.append(task)
            return 201, task
        if path.startswith("/api/v2/tasks/") and method == "PATCH":
            task = next((k for k in self.tasks if k["id"] == path.rsplit("/", 1)[-1]), None)
            if task is None:
                return 404, {"code": "not found", "message": "task not found"}
            task["flux"] = body["flux"]
            return 200, task
        return 404, {"code": "not found", "message": f"path not found: {path}"}

    @staticmethod
    def _public(auth, token):
        return {k: v for k, v in auth.items() if k != "hashedToken"} | {"token": token}

    def _bucket(self, org_id, name, seconds):
        return {
            "id": self._new_id(),
            "orgID": org_id,
            "name": name,
            "retentionRules": [{"type": "expire", "everySeconds": seconds}],
        }

    @staticmethod
    def _valid_rules(rules):
        return (
            isinstance(rules, list)
            and len(rules) == 1
            and rules[0].get("type") == "expire"
            and isinstance(rules[0].get("everySeconds"), int)
            and not isinstance(rules[0].get("everySeconds"), bool)
        )


@pytest.fixture
def fake_influxdb():
    fake = FakeInfluxDB()

    class Handler(http.server.BaseHTTPRequestHandler):
        def _serve(self):
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            try:
                body = json.loads(raw) if raw else {}
            except ValueError:
                body = None
            with fake.lock:
                if body is None:
                    status, payload = 400, {"code": "invalid", "message": "invalid json"}
                else:
                    status, payload = fake.handle(self.command, self.path, self.headers, body)
            data = b"" if payload is None else json.dumps(payload).encode()
            self.send_response(status)
            if payload is not None:
                self.send_header("Content-Type", "application/json; charset=utf-8")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_PATCH = do_DELETE = _serve

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    fake.url = f"http://127.0.0.1:{server.server_address[1]}"
    yield fake
    server.shutdown()
    server.server_close()


def _run_influxdb_setup(fake, tmp_path, *cli, **extra):
    playbook = tmp_path / "setup.yml"
    playbook.write_text(
        "- name: InfluxDB setup through the API\n"
        "  hosts: localhost\n"
        "  gather_facts: false\n"
        "  tasks:\n"
        "    - name: Run the influxdb role's API setup\n"
        "      ansible.builtin.include_role:\n"
        "        name: influxdb\n"
        "        tasks_from: setup.yml\n"
    )
    variables = {
        "influxdb_api_url": fake.url,
        "influxdb_dir": str(tmp_path / "influxdb"),
        "influxdb_admin_password": "stand-in-" + secrets.token_hex(8),
        "influxdb_admin_token": fake.admin_token or secrets.token_urlsafe(48),
        "influxdb_retention_days": 30,
        "influxdb_nodes": ["miner-01", "validator-01"],
        "influxdb_no_log": False,
        **extra,
    }
    (tmp_path / "influxdb" / "secrets").mkdir(parents=True, exist_ok=True, mode=0o700)
    extra_vars = tmp_path / "vars.json"
    extra_vars.write_text(json.dumps(variables))
    extra_vars.chmod(0o600)
    fake.calls.clear()
    return _run(
        [
            "ansible-playbook",
            "-i",
            "localhost,",
            "-c",
            "local",
            "-e",
            "ansible_python_interpreter={{ ansible_playbook_python }}",
            "-e",
            f"@{extra_vars}",
            *cli,
            str(playbook),
        ]
    )


def _auth(fake, description):
    [auth] = [a for a in fake.auths if a["description"] == description]
    return auth


def _mutations(fake):
    return [c for c in fake.calls if c[0] in ("POST", "PATCH", "DELETE")]


NODE_WRITE = "telemetry node {}: write telemetry"


@pytest.mark.timeout(900)
def test_influxdb_api_setup_is_idempotent_and_applies_retention(fake_influxdb, tmp_path):
    fake = fake_influxdb
    first = _run_influxdb_setup(fake, tmp_path)
    _assert_ok(first)
    assert fake.setup_done
    bucket, downsampled = fake.buckets
    assert bucket["name"] == "telemetry"
    assert bucket["retentionRules"] == [{"type": "expire", "everySeconds": 30 * 86400}]
    assert downsampled["name"] == "telemetry_downsampled"
    assert downsampled["retentionRules"] == [{"type": "expire", "everySeconds": 400 * 86400}]
    dbrp, downsampled_dbrp = fake.dbrps
    assert (dbrp["database"], dbrp["retention_policy"], dbrp["bucketID"], dbrp["default"]) == (
        "telemetry",
        "autogen",
        bucket["id"],
        True,
    )
    assert (downsampled_dbrp["database"], downsampled_dbrp["retention_policy"], downsampled_dbrp["default"]) == (
        "telemetry",
        "downsampled",
        False,
    )
    assert downsampled_dbrp["bucketID"] == downsampled["id"]
    scripts = sorted((REPO / "grafana/downsampling/tasks").glob("*.flux"))
    assert sorted(k["name"] for k in fake.tasks) == sorted(f"downsample_{s.stem}" for s in scripts)
    for task in fake.tasks:
        assert 'from(bucket: "telemetry")' in task["flux"] and 'to(bucket: "telemetry_downsampled")' in task["flux"]
        assert task["every"] == "1m" and task["status"] == "active"
    read = _auth(fake, "grafana: read telemetry")
    assert read["permissions"] == [
        {"action": "read", "resource": {"type": "buckets", "id": b["id"], "orgID": bucket["orgID"]}}
        for b in (bucket, downsampled)
    ]
    secrets_dir = tmp_path / "influxdb" / "secrets"
    files = {"grafana-read.token": read}
    for node in ("miner-01", "validator-01"):
        write = _auth(fake, NODE_WRITE.format(node))
        # Write-only, on the bucket only: a node cannot read or administer anything.
        assert write["permissions"] == [
            {"action": "write", "resource": {"type": "buckets", "id": bucket["id"], "orgID": bucket["orgID"]}}
        ]
        files[f"nodes/{node}.token"] = write
    for name, auth in files.items():
        # The value came from the creation answer only: the list never shows it.
        assert (secrets_dir / name).read_text() == fake.issued[auth["id"]]
        assert (secrets_dir / name).stat().st_mode & 0o777 == 0o600
    assert (secrets_dir / "nodes").stat().st_mode & 0o777 == 0o700
    assert not (secrets_dir / "node-write.token").exists()

    # A second run changes nothing, in InfluxDB or on disk.
    before = {name: (secrets_dir / name).read_text() for name in files}
    second = _run_influxdb_setup(fake, tmp_path)
    _assert_ok(second)
    assert _recap_changed(second.stdout) == {"localhost": 0}, second.stdout[-OUTPUT_TAIL:]
    assert not _mutations(fake), fake.calls
    assert len(fake.auths) == 4 and len(fake.buckets) == 2 and len(fake.dbrps) == 2
    assert len(fake.tasks) == len(scripts)
    assert {name: (secrets_dir / name).read_text() for name in files} == before

    # --check --diff against the deployed stand-in: no change reported, none made, no token shown.
    checked = _run_influxdb_setup(fake, tmp_path, "--check", "--diff", influxdb_no_log=True)
    _assert_ok(checked)
    assert _recap_changed(checked.stdout) == {"localhost": 0}, checked.stdout[-OUTPUT_TAIL:]
    assert not _mutations(fake), fake.calls
    assert not any(value in checked.stdout + checked.stderr for value in before.values())

    # A changed retention period is applied to the existing bucket.
    third = _run_influxdb_setup(fake, tmp_path, influxdb_retention_days=7)
    _assert_ok(third)
    assert ("PATCH", f"/api/v2/buckets/{bucket['id']}") in fake.calls
    assert fake.buckets[0]["retentionRules"] == [{"type": "expire", "everySeconds": 7 * 86400}]
    assert len(fake.buckets) == 2

    # A task whose script changed (an older version of the role) is brought up to date.
    fake.tasks[0]["flux"] = 'option task = {name: "' + fake.tasks[0]["name"] + '", every: 1h}\n'
    _assert_ok(_run_influxdb_setup(fake, tmp_path, influxdb_retention_days=7))
    assert 'to(bucket: "telemetry_downsampled")' in fake.tasks[0]["flux"]
    assert len(fake.tasks) == len(scripts)

    # A lost token file: that token is deleted in InfluxDB and created anew;
    # the other node's token and file are left alone.
    old_miner = _auth(fake, NODE_WRITE.format("miner-01"))
    validator = _auth(fake, NODE_WRITE.format("validator-01"))
    (secrets_dir / "nodes" / "miner-01.token").unlink()
    fourth = _run_influxdb_setup(fake, tmp_path, influxdb_retention_days=7)
    _assert_ok(fourth)
    new_miner = _auth(fake, NODE_WRITE.format("miner-01"))
    assert new_miner["id"] != old_miner["id"]
    assert _mutations(fake) == [
        ("DELETE", f"/api/v2/authorizations/{old_miner['id']}"),
        ("POST", "/api/v2/authorizations"),
    ]
    assert (secrets_dir / "nodes" / "miner-01.token").read_text() == fake.issued[new_miner["id"]]
    assert _auth(fake, NODE_WRITE.format("validator-01")) is validator
    assert (secrets_dir / "nodes" / "validator-01.token").read_text() == before["nodes/validator-01.token"]

    # A token deleted in InfluxDB is created again and its file updated.
    fake.auths.remove(read)
    fifth = _run_influxdb_setup(fake, tmp_path, influxdb_retention_days=7)
    _assert_ok(fifth)
    new_read = _auth(fake, "grafana: read telemetry")
    new_value = (secrets_dir / "grafana-read.token").read_text()
    assert new_value == fake.issued[new_read["id"]] != before["grafana-read.token"]


@pytest.mark.timeout(900)
def test_influxdb_node_removed_from_the_list_is_revoked(fake_influxdb, tmp_path):
    fake = fake_influxdb
    _assert_ok(_run_influxdb_setup(fake, tmp_path))
    # The single shared write token of earlier versions is revoked as well.
    fake.auths.append(
        {
            "id": fake._new_id(),
            "hashedToken": _sha512("shared"),
            "status": "active",
            "description": "telemetry nodes: write telemetry",
            "orgID": fake.orgs[0]["id"],
            "permissions": [],
        }
    )
    (tmp_path / "influxdb" / "secrets" / "node-write.token").write_text("shared")
    miner = _auth(fake, NODE_WRITE.format("miner-01"))
    validator = _auth(fake, NODE_WRITE.format("validator-01"))
    result = _run_influxdb_setup(fake, tmp_path, influxdb_nodes=["validator-01"])
    _assert_ok(result)
    descriptions = {a["description"] for a in fake.auths}
    assert NODE_WRITE.format("miner-01") not in descriptions
    assert "telemetry nodes: write telemetry" not in descriptions
    assert ("DELETE", f"/api/v2/authorizations/{miner['id']}") in fake.calls
    assert not [c for c in fake.calls if c[0] == "POST"], fake.calls
    assert _auth(fake, NODE_WRITE.format("validator-01")) is validator
    nodes_dir = tmp_path / "influxdb" / "secrets" / "nodes"
    assert sorted(p.name for p in nodes_dir.glob("*.token")) == ["validator-01.token"]
    assert not (tmp_path / "influxdb" / "secrets" / "node-write.token").exists()
    # The operator's own token (from the setup) is not the role's to delete.
    assert any(a["description"].endswith("'s Token") for a in fake.auths)


RETIRING_WRITE = "telemetry node {} (retiring): write telemetry"


@pytest.mark.timeout(900)
def test_influxdb_rotated_token_works_beside_the_new_one_until_it_retires(fake_influxdb, tmp_path):
    fake = fake_influxdb
    _assert_ok(_run_influxdb_setup(fake, tmp_path))
    nodes_dir = tmp_path / "influxdb" / "secrets" / "nodes"
    previous = _auth(fake, NODE_WRITE.format("miner-01"))
    validator = _auth(fake, NODE_WRITE.format("validator-01"))
    previous_value = (nodes_dir / "miner-01.token").read_text()

    # make node-rotate moved the node's file aside (ansible/nodes.yml) and dated its retirement.
    assert (nodes_dir / "retiring").stat().st_mode & 0o777 == 0o700  # the role made it
    (nodes_dir / "miner-01.token").rename(nodes_dir / "retiring" / "miner-01.token")
    rotating = {"influxdb_retire_after": {"miner-01": "2999-12-31"}}
    _assert_ok(_run_influxdb_setup(fake, tmp_path, **rotating))
    new = _auth(fake, NODE_WRITE.format("miner-01"))
    # The previous token is renamed, not deleted: its value, in the moved file, still writes.
    assert _mutations(fake) == [
        ("PATCH", f"/api/v2/authorizations/{previous['id']}"),
        ("POST", "/api/v2/authorizations"),
    ]
    assert _auth(fake, RETIRING_WRITE.format("miner-01")) is previous and previous["status"] == "active"
    assert (nodes_dir / "retiring" / "miner-01.token").read_text() == previous_value == fake.issued[previous["id"]]
    assert (nodes_dir / "miner-01.token").read_text() == fake.issued[new["id"]] != previous_value
    assert new["permissions"] == previous["permissions"]
    assert _auth(fake, NODE_WRITE.format("validator-01")) is validator

    # While the date has not passed, a run changes nothing, nor does --check.
    again = _run_influxdb_setup(fake, tmp_path, **rotating)
    _assert_ok(again)
    assert _recap_changed(again.stdout) == {"localhost": 0} and not _mutations(fake), again.stdout[-OUTPUT_TAIL:]
    checked = _run_influxdb_setup(fake, tmp_path, "--check", **rotating)
    _assert_ok(checked)
    assert _recap_changed(checked.stdout) == {"localhost": 0} and not _mutations(fake), checked.stdout[-OUTPUT_TAIL:]

    # The first run after the date deletes the previous token and its file; the new one stays.
    _assert_ok(_run_influxdb_setup(fake, tmp_path, influxdb_retire_after={"miner-01": "2000-01-01"}))
    assert _mutations(fake) == [("DELETE", f"/api/v2/authorizations/{previous['id']}")]
    assert not (nodes_dir / "retiring" / "miner-01.token").exists()
    assert _auth(fake, NODE_WRITE.format("miner-01")) is new

    # Rotated again, its earlier retiring file replaced by a later rotation whose run never came:
    # the token that file held is deleted, the one now in it renamed.
    (nodes_dir / "miner-01.token").rename(nodes_dir / "retiring" / "miner-01.token")
    _assert_ok(_run_influxdb_setup(fake, tmp_path, **rotating))
    (nodes_dir / "miner-01.token").rename(nodes_dir / "retiring" / "miner-01.token")
    stale = _auth(fake, RETIRING_WRITE.format("miner-01"))
    middle = _auth(fake, NODE_WRITE.format("miner-01"))
    _assert_ok(_run_influxdb_setup(fake, tmp_path, **rotating))
    assert _mutations(fake) == [
        ("DELETE", f"/api/v2/authorizations/{stale['id']}"),
        ("PATCH", f"/api/v2/authorizations/{middle['id']}"),
        ("POST", "/api/v2/authorizations"),
    ]
    assert (nodes_dir / "retiring" / "miner-01.token").read_text() == fake.issued[middle["id"]]

    # Revoked while being rotated: both of its tokens and files go.
    _assert_ok(_run_influxdb_setup(fake, tmp_path, influxdb_nodes=["validator-01"], **rotating))
    assert not {NODE_WRITE.format("miner-01"), RETIRING_WRITE.format("miner-01")} & {
        a["description"] for a in fake.auths
    }
    assert sorted(p.name for p in nodes_dir.rglob("*.token")) == ["validator-01.token"]


def test_influxdb_api_setup_fails_on_a_wrong_admin_token(fake_influxdb, tmp_path):
    _assert_ok(_run_influxdb_setup(fake_influxdb, tmp_path))
    fake_influxdb.admin_token = "wrong-operator-token"
    result = _run_influxdb_setup(fake_influxdb, tmp_path)
    assert result.returncode != 0
    assert "Look up the organisation" in result.stdout


def _run_influxdb_preflight(tmp_path: Path, **variables) -> subprocess.CompletedProcess:
    """The influxdb role's preflight (site.yml's first play includes it with metrics_backend influxdb)."""
    playbook = tmp_path / "preflight.yml"
    playbook.write_text(
        "- name: InfluxDB preflight\n  hosts: localhost\n  gather_facts: false\n  tasks:\n"
        "    - name: Run the influxdb role's preflight\n      ansible.builtin.include_role:\n"
        "        name: influxdb\n        tasks_from: preflight.yml\n"
    )
    extra_vars = tmp_path / "preflight-vars.json"
    extra_vars.write_text(
        json.dumps(
            {
                "influxdb_admin_password": "stand-in-" + secrets.token_hex(8),
                "influxdb_admin_token": secrets.token_urlsafe(48),
                "telemetry_nodes": ["miner-01", "miner-02", "validator-01"],
                **variables,
            }
        )
    )
    extra_vars.chmod(0o600)
    return _run(["ansible-playbook", "-i", "localhost,", "-c", "local", "-e", f"@{extra_vars}", str(playbook)])


WARNING = "WARNING: metrics_backend is influxdb"


def test_influxdb_preflight_warns_about_nodes_that_are_not_the_operators_own(tmp_path):
    result = _run_influxdb_preflight(tmp_path, telemetry_operator_nodes=["validator-01"])
    _assert_ok(result)
    [warning] = [line for line in result.stdout.splitlines() if WARNING in line]
    assert "2 of its 3 nodes are not the operator's own" in warning
    assert "miner-01, miner-02." in warning and "validator-01" not in warning
    assert "Set metrics_backend: victoriametrics" in warning
    # No list: no node is the operator's own.
    assert "3 of its 3 nodes" in _run_influxdb_preflight(tmp_path).stdout
    # All of them the operator's own: nothing to warn about.
    own = _run_influxdb_preflight(tmp_path, telemetry_operator_nodes=["miner-01", "miner-02", "validator-01"])
    _assert_ok(own)
    assert WARNING not in own.stdout
    refused = _run_influxdb_preflight(tmp_path, telemetry_operator_nodes="miner-01")
    assert refused.returncode != 0 and "telemetry_operator_nodes must be a list" in refused.stdout


# --- the reverse proxy's Caddyfile, run by a real Caddy ------------------------------
#
# Debian's caddy (2.6) runs the Caddyfile that the reverse_proxy role renders,
# on loopback, in front of a stand-in Loki that accepts every push. Only two
# settings differ from a deployment, both role variables: the configuration
# directory is the rendered one (where the container mounts it), and 2.6 still
# calls the basic auth directive "basicauth" (renamed basic_auth in Caddy 2.8).

PUSH_PATH = "/loki/api/v1/push"
LOGS_DOMAIN = "logs.example.test"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def fake_loki():
    """Accepts every push with 204 (Loki's answer) and records what reached it."""
    seen: list[dict[str, str]] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            seen.append({"path": self.path, "authorization": self.headers.get("Authorization", "")})
            self.send_response(204)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"127.0.0.1:{server.server_address[1]}", seen
    server.shutdown()
    server.server_close()


class ProxySite:
    """The role rendered into a scratch root, and the ports Caddy serves it on."""

    def __init__(self, tmp_path: Path, upstream: str):
        self.tmp = tmp_path
        self.root = tmp_path / "root"
        self.dir = self.root / "opt" / "telemetry" / "reverse_proxy"
        self.conf = self.dir / "conf"
        self.https_port, self.http_port, self.admin_port = _free_port(), _free_port(), _free_port()
        self.upstream = upstream
        self.cert = tmp_path / "cert.pem"
        key = tmp_path / "key.pem"
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
                    f"/CN={LOGS_DOMAIN}",
                    "-addext",
                    f"subjectAltName=DNS:{LOGS_DOMAIN}",
                    "-keyout",
                    str(key),
                    "-out",
                    str(self.cert),
                ]
            )
        )
        self.key = key

    def converge(self, nodes: list[str]) -> subprocess.CompletedProcess:
        playbook = self.tmp / "proxy.yml"
        playbook.write_text(
            "- name: Render the reverse proxy\n"
            "  hosts: localhost\n"
            "  gather_facts: false\n"
            "  roles:\n"
            "    - role: reverse_proxy\n"
        )
        variables = {
            "telemetry_render_only": True,
            "telemetry_root": str(self.root),
            "telemetry_nodes": nodes,
            "reverse_proxy_image": "caddy:not-pulled-in-render-only-mode",
            "reverse_proxy_tls_mode": "files",
            "reverse_proxy_tls_certificate": self.cert.read_text(),
            "reverse_proxy_tls_private_key": self.key.read_text(),
            "reverse_proxy_loki_domain": LOGS_DOMAIN,
            "reverse_proxy_loki_upstream": self.upstream,
            "reverse_proxy_config_mount": str(self.conf),
            "reverse_proxy_admin_address": f"localhost:{self.admin_port}",
            "reverse_proxy_listen_http_port": self.http_port,
            "reverse_proxy_listen_https_port": self.https_port,
            "reverse_proxy_basic_auth_directive": "basicauth",
            "reverse_proxy_log_mount": str(self.tmp / "logs"),
        }
        extra_vars = self.tmp / "proxy-vars.json"
        extra_vars.write_text(json.dumps(variables))
        extra_vars.chmod(0o600)
        return _run(
            [
                "ansible-playbook",
                "-i",
                "localhost,",
                "-c",
                "local",
                "-e",
                "ansible_python_interpreter={{ ansible_playbook_python }}",
                "-e",
                f"@{extra_vars}",
                str(playbook),
            ]
        )

    def password(self, node: str) -> str:
        return (self.dir / "secrets" / "nodes" / f"{node}.loki-password").read_text()

    def push(self, user: str | None = None, password: str | None = None) -> int:
        context = ssl.create_default_context(cafile=str(self.cert))
        raw = socket.create_connection(("127.0.0.1", self.https_port), timeout=30)
        conn = http.client.HTTPSConnection(LOGS_DOMAIN, self.https_port, context=context, timeout=30)
        conn.sock = context.wrap_socket(raw, server_hostname=LOGS_DOMAIN)
        headers = {"Content-Type": "application/json"}
        if user is not None:
            headers["Authorization"] = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
        try:
            conn.request("POST", PUSH_PATH, body=b'{"streams": []}', headers=headers)
            return conn.getresponse().status
        finally:
            conn.close()


def _reload_argv(conf: Path) -> list[str]:
    """The reverse_proxy role's reload handler, as it runs inside the container."""
    handlers = yaml.safe_load((ROLES_DIR / "reverse_proxy" / "handlers" / "main.yml").read_text())
    [reload] = [h for h in handlers if h["name"] == "Reload caddy"]
    return [arg.replace("{{ reverse_proxy_config_mount }}", str(conf)) for arg in reload[_EXEC]["argv"]]


_EXEC = "community.docker.docker_container_exec"


@pytest.mark.timeout(900)
def test_revoked_node_is_refused_by_caddy_after_one_run(tmp_path, fake_loki):
    caddy = shutil.which("caddy")
    if caddy is None:
        pytest.fail("the caddy binary is needed (Debian package caddy: apt-get install caddy)")
    upstream, seen = fake_loki
    site = ProxySite(tmp_path, upstream)
    _assert_ok(site.converge(["miner-01", "validator-01"]))
    caddyfile = site.conf / "Caddyfile"
    env = dict(os.environ, HOME=str(tmp_path), XDG_DATA_HOME=str(tmp_path / "xdg-data"))
    env["XDG_CONFIG_HOME"] = str(tmp_path / "xdg-config")
    log = (tmp_path / "caddy.log").open("w")
    server = subprocess.Popen(
        [caddy, "run", "--config", str(caddyfile), "--adapter", "caddyfile"], env=env, stdout=log, stderr=log
    )
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                status = site.push()
                break
            except OSError:
                assert server.poll() is None, (tmp_path / "caddy.log").read_text()[-OUTPUT_TAIL:]
                assert time.monotonic() < deadline, (tmp_path / "caddy.log").read_text()[-OUTPUT_TAIL:]
                time.sleep(0.5)
        assert status == 401
        miner, validator = site.password("miner-01"), site.password("validator-01")
        assert site.push("miner-01", miner) == 204
        assert site.push("validator-01", validator) == 204
        assert site.push("miner-01", validator) == 401  # one node's password is not another's
        assert site.push("miner-01", miner + "x") == 401
        assert [s["authorization"] for s in seen] == ["", ""], "Loki must not see the node's credentials"

        # Revoke miner-01: one run rewrites the Caddyfile, as a new file.
        inode = caddyfile.stat().st_ino
        second = site.converge(["validator-01"])
        _assert_ok(second)
        assert caddyfile.stat().st_ino != inode, "the role wrote the Caddyfile in place"
        assert not (site.dir / "secrets" / "nodes" / "miner-01.loki-password").exists()
        # ... and its handler reloads what is in the directory.
        reload = subprocess.run(_reload_argv(site.conf), env=env, capture_output=True, text=True, timeout=120)
        assert reload.returncode == 0, reload.stdout + reload.stderr
        assert site.push("miner-01", miner) == 401
        assert site.push("validator-01", validator) == 204
        assert len(seen) == 3
    finally:
        server.terminate()
        server.wait(timeout=60)
        log.close()


# --- the node credential tooling (ansible/nodes.yml, make node-*) -----------------


def _nodes_play(inventory: Path, node: str, action: str, *extra: str) -> subprocess.CompletedProcess:
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
            *extra,
        ]
    )


def test_credentials_of_a_node_not_yet_deployed_say_to_deploy_first(tmp_path):
    inventory = tmp_path / "inventory" / "prod"
    shutil.copytree(REPO / "inventory" / "prod", inventory)
    _assert_ok(_nodes_play(inventory, "miner-08", "add"))
    root = tmp_path / "root"
    local = ["-e", f"telemetry_root={root}", "-e", "ansible_connection=local", "-e", "ansible_become=false"]
    local += ["-e", "ansible_python_interpreter={{ ansible_playbook_python }}", "-e", f"node_env_dir={tmp_path}/env"]
    for extra in ([], ["--check"]):
        result = _nodes_play(inventory, "miner-08", "credentials", *local, *extra)
        output = result.stdout + result.stderr
        assert result.returncode != 0, output[-OUTPUT_TAIL:]
        assert "miner-08 has no credentials yet" in output, output[-OUTPUT_TAIL:]
        assert "miner-08.token" in output and "miner-08.loki-password" in output
        assert not (tmp_path / "env").exists()


@pytest.mark.timeout(900)
def test_node_add_refuses_a_uid_taken_or_one_of_the_stacks_own_names(tmp_path):
    """make node-add: another node's uid, or an identity the preflight refuses (a leading "_", . or .., a character
    outside its set), writes nothing."""
    inventory = tmp_path / "inventory" / "prod"
    shutil.copytree(REPO / "inventory" / "prod", inventory)
    nodes_file = inventory / "group_vars" / "all" / "nodes.yml"
    text = nodes_file.read_text()
    # example-miner-01 is uid "1"; the new nodes' identities are given before they are added.
    entries = {
        "miner-07": '{uid: "1", role: miner}',
        "miner-08": '{uid: "_edge"}',
        "miner-09": "{uid: m9, role: _x}",
        "miner-11": '{uid: ".."}',
        "miner-12": '{uid: "a/b"}',
        "miner-13": "{uid: m13, role: Validator}",
    }
    lines = "".join(f"  {node}: {entry}\n" for node, entry in entries.items())
    nodes_file.write_text(text.replace("telemetry_node_identities:\n", "telemetry_node_identities:\n" + lines, 1))
    before = nodes_file.read_text()
    refusals = {
        "miner-07": "already the uid of example-miner-01",
        "miner-08": 'miner-08 would be stored as uid "_edge", role "miner"',
        "miner-09": 'miner-09 would be stored as uid "m9", role "_x"',
        "miner-11": 'miner-11 would be stored as uid ".."',
        "miner-12": 'miner-12 would be stored as uid "a/b"',
        "miner-13": 'miner-13 would be stored as uid "m13", role "Validator"',
    }
    for node, reason in refusals.items():
        result = _nodes_play(inventory, node, "add")
        output = result.stdout + result.stderr
        assert result.returncode != 0, output[-OUTPUT_TAIL:]
        assert reason in output, output[-OUTPUT_TAIL:]
        assert nodes_file.read_text() == before
    # A uid of its own is fine.
    _assert_ok(_nodes_play(inventory, "miner-10", "add"))
    assert "miner-10" in yaml.safe_load(nodes_file.read_text())["telemetry_nodes"]


@pytest.mark.timeout(900)
def test_node_tooling_adds_rotates_writes_credentials_and_revokes(tmp_path):
    inventory = tmp_path / "inventory" / "prod"
    shutil.copytree(REPO / "inventory" / "prod", inventory)
    nodes_file = inventory / "group_vars" / "all" / "nodes.yml"

    def listed():
        return yaml.safe_load(nodes_file.read_text())["telemetry_nodes"]

    before = listed()
    _assert_ok(_nodes_play(inventory, "miner-07", "add"))
    assert listed() == ["miner-07", *before]
    again = _nodes_play(inventory, "miner-07", "add")
    _assert_ok(again)
    assert listed() == ["miner-07", *before]
    assert _recap_changed(again.stdout)["localhost"] == 0

    # Both production hosts are this machine, below a scratch root.
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
    ]
    token = root / "opt" / "telemetry" / "influxdb" / "secrets" / "nodes" / "miner-07.token"
    password = root / "opt" / "telemetry" / "reverse_proxy" / "secrets" / "nodes" / "miner-07.loki-password"
    for path, value in ((token, secrets.token_urlsafe(64)), (password, secrets.token_urlsafe(30))):
        path.parent.mkdir(parents=True)
        path.write_text(value)
    env_dir = tmp_path / "env"
    _assert_ok(_nodes_play(inventory, "miner-07", "credentials", *local, "-e", f"node_env_dir={env_dir}"))
    env_file = env_dir / "miner-07.env"
    assert env_file.stat().st_mode & 0o777 == 0o600
    assert env_dir.stat().st_mode & 0o777 == 0o700
    env = dict(line.split("=", 1) for line in env_file.read_text().splitlines() if not line.startswith("#"))
    assert env == {
        "INFLUXDB_URL": "https://metrics.example.org",
        "INFLUXDB_TOKEN": token.read_text(),
        "INFLUXDB_ORG": "tplr",
        "INFLUXDB_DATABASE": "tplr",
        "LOKI_URL": "https://logs.example.org",
        "LOKI_USERNAME": "miner-07",
        "LOKI_PASSWORD": password.read_text(),
    }

    # Rotate: the node's files move aside, where the next site.yml run keeps them working beside
    # the new ones it makes, until the date written into the inventory.
    identities = yaml.safe_load(nodes_file.read_text())["telemetry_node_identities"]
    values = {path: path.read_text() for path in (token, password)}
    _assert_ok(_nodes_play(inventory, "miner-07", "rotate", *local, "-e", "node_retire_after=2999-12-31"))
    assert not token.exists() and not password.exists()
    for path, value in values.items():
        moved = path.parent / "retiring" / path.name
        assert moved.read_text() == value
        assert moved.parent.stat().st_mode & 0o777 == 0o700
    settings = yaml.safe_load(nodes_file.read_text())
    assert settings["telemetry_node_retire_after"] == {"miner-07": "2999-12-31"}
    assert settings["telemetry_node_identities"] == identities
    assert listed() == ["miner-07", *before]
    # Not again until that is done: the files in retiring/ are the ones the node may still use.
    again = _nodes_play(inventory, "miner-07", "rotate", *local)
    assert again.returncode != 0 and "miner-07 is being rotated" in again.stdout, again.stdout[-OUTPUT_TAIL:]
    assert all((path.parent / "retiring" / path.name).read_text() == value for path, value in values.items())
    # The default date is telemetry_rotation_grace_days (14) ahead.
    _assert_ok(_nodes_play(inventory, "miner-01", "add"))
    for wrong in ("2000-01-01", "soon"):
        refused = _nodes_play(inventory, "miner-01", "rotate", *local, "-e", f"node_retire_after={wrong}")
        assert refused.returncode != 0 and "must be a date, YYYY-MM-DD, today" in refused.stdout, wrong
    days_ahead = [(datetime.datetime.now(datetime.UTC) + datetime.timedelta(days=14)).strftime("%Y-%m-%d")]
    _assert_ok(_nodes_play(inventory, "miner-01", "rotate", *local))
    days_ahead.append((datetime.datetime.now(datetime.UTC) + datetime.timedelta(days=14)).strftime("%Y-%m-%d"))
    dates = yaml.safe_load(nodes_file.read_text())["telemetry_node_retire_after"]
    assert dates.pop("miner-01") in days_ahead and dates == {"miner-07": "2999-12-31"}
    grace = yaml.safe_load(nodes_file.read_text())["telemetry_node_retire_after"]["miner-01"]

    # Retire: the previous files go, and the date; the next site.yml run stops them.
    _assert_ok(_nodes_play(inventory, "miner-07", "retire", *local))
    assert not any((path.parent / "retiring" / path.name).exists() for path in values)
    assert yaml.safe_load(nodes_file.read_text())["telemetry_node_retire_after"] == {"miner-01": grace}

    _assert_ok(_nodes_play(inventory, "miner-07", "revoke"))
    _assert_ok(_nodes_play(inventory, "miner-01", "revoke"))
    assert listed() == before
    assert yaml.safe_load(nodes_file.read_text())["telemetry_node_retire_after"] is None
    refused = _nodes_play(inventory, "Miner 07", "add")
    assert refused.returncode != 0 and "Give NODE=<name>" in refused.stdout
    assert listed() == before


def test_influxdb_preflight_refuses_an_operator_token_shorter_than_32_random_bytes(tmp_path):
    # 42 characters of base64 hold 31.5 bytes; 43 hold 32.
    short = _run_influxdb_preflight(tmp_path, influxdb_admin_token=secrets.token_urlsafe(32)[:42])
    assert short.returncode != 0 and "43 characters or more" in short.stdout
    _assert_ok(_run_influxdb_preflight(tmp_path, influxdb_admin_token=secrets.token_urlsafe(32)))


def _run_grafana_alert_checks(tmp_path: Path, settings: dict[str, str]) -> subprocess.CompletedProcess:
    """The grafana role's checks of grafana_alerting_settings (tasks/alerting.yml), on the controller only."""
    playbook = tmp_path / "alerting.yml"
    playbook.write_text(
        "- name: Alert settings\n  hosts: localhost\n  gather_facts: false\n  tasks:\n"
        "    - name: Run the grafana role's alert setting checks\n      ansible.builtin.include_role:\n"
        "        name: grafana\n        tasks_from: alerting.yml\n"
    )
    extra_vars = tmp_path / "alerting-vars.json"
    extra_vars.write_text(
        json.dumps({"grafana_alerting_src": str(REPO / "grafana" / "alerting"), "grafana_alerting_settings": settings})
    )
    return _run(["ansible-playbook", "-i", "localhost,", "-c", "local", "-e", f"@{extra_vars}", str(playbook)])


def test_grafana_role_takes_a_choice_setting_only_among_its_words(tmp_path):
    """settings.env lists each choice setting's words; the role refuses any other by the setting's name."""
    chosen = {"ALERT_BACKUP_NO_REPORT_STATE": "OK", "ALERT_WEBHOOK_TYPE": "slack"}
    _assert_ok(_run_grafana_alert_checks(tmp_path, chosen))
    for name, value in (("ALERT_BACKUP_NO_REPORT_STATE", "Firing"), ("ALERT_WEBHOOK_TYPE", "teams")):
        refused = _run_grafana_alert_checks(tmp_path, {name: value})
        assert refused.returncode != 0 and f"grafana_alerting_settings.{name} must be one of" in refused.stdout
