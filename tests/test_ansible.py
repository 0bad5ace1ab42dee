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

import json
import os
import re
import secrets
import shutil
import string
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
ROLES_DIR = REPO / "ansible" / "roles"
ROLES = ["docker", "influxdb", "loki", "grafana", "reverse_proxy"]
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
    return {
        host: int(changed)
        for host, changed in re.findall(r"^(\S+)\s+: ok=\d+\s+changed=(\d+)", output, re.M)
    }


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
def test_molecule_default_scenario(role):
    result = _run(["molecule", "test", "-s", "default"], cwd=ROLES_DIR / role)
    _assert_ok(result)
    output = result.stdout + result.stderr
    # The sequence really converged twice and verified.
    assert re.search(r"idempotence.*Executed: Successful", output), output[-OUTPUT_TAIL:]
    assert re.search(r"verify.*Executed: Successful", output), output[-OUTPUT_TAIL:]
    assert re.search(r"\d+ passed", output), output[-OUTPUT_TAIL:]


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
        "vault_reverse_proxy_grafana_users": [
            {"username": "operator", "password_hash": _bcrypt_like()}
        ],
        "vault_reverse_proxy_loki_users": [{"username": "node", "password_hash": _bcrypt_like()}],
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
    second = _run(cmd)
    _assert_ok(second)
    changed = _recap_changed(second.stdout)
    assert changed and not any(changed.values()), second.stdout[-OUTPUT_TAIL:]

    base = root / "opt" / "telemetry"
    for path in (
        "influxdb/container.compose.yml",
        "loki/loki.yml",
        "grafana/grafana.env",
        "grafana/provisioning/datasources/datasources.yml",
        "reverse_proxy/Caddyfile",
    ):
        assert (base / path).is_file(), path
    for secret_file in ("grafana/grafana.env", "reverse_proxy/Caddyfile"):
        assert (base / secret_file).stat().st_mode & 0o777 == 0o600, secret_file
    values = json.loads(test_secrets.read_text())
    env = (base / "grafana" / "grafana.env").read_text()
    assert f"GF_SECURITY_ADMIN_PASSWORD={values['vault_grafana_admin_password']}" in env
    assert f"INFLUXDB_READ_TOKEN={values['vault_grafana_influxdb_token']}" in env
    if name == "prod":
        # Grafana and the proxy reach InfluxDB and Loki on metrics_prod's private address.
        assert "INFLUXDB_URL=http://10.0.0.20:8086" in env
        assert "LOKI_URL=http://10.0.0.20:3100" in env
        caddyfile = (base / "reverse_proxy" / "Caddyfile").read_text()
        assert "reverse_proxy 10.0.0.20:3100 {" in caddyfile
        assert "reverse_proxy grafana:3000 {" in caddyfile
        assert "email ops@example.org" in caddyfile


@pytest.mark.parametrize(
    ("missing", "message"),
    [
        ("vault_influxdb_admin_token", "InfluxDB secrets are missing"),
        ("vault_grafana_secret_key", "Grafana secrets are missing"),
        ("vault_reverse_proxy_loki_users", "needs at least one basic auth user"),
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
    drivers = subprocess.run(
        ["molecule", "drivers"], capture_output=True, text=True, timeout=60, check=False
    )
    if "docker" not in drivers.stdout:
        return "molecule's docker driver is not installed (pip install 'molecule-plugins[docker]')"
    return None


@pytest.mark.docker
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("role", ROLES)
def test_molecule_docker_scenario(role):
    reason = _docker_unavailable_reason()
    if reason:
        pytest.skip(reason)
    result = _run(["molecule", "test", "-s", "docker"], cwd=ROLES_DIR / role, timeout=1800)
    _assert_ok(result)
