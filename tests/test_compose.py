"""The local stack: compose files, Loki config, init scripts and compose/stack.sh.

Everything but the last test runs here: `docker-compose config` (Debian's
docker-compose 1.29) validates and renders the compose files without an engine.
The last test starts the stack for real and runs only where `docker info` works.
These tests render the default InfluxDB backend (docker-compose.yml with
docker-compose.influxdb.yml); tests/test_compose_backends.py covers the switch
and the VictoriaMetrics backend.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import stat
import subprocess
import urllib.error
import urllib.request
from base64 import b64encode
from pathlib import Path
from typing import Any

import pytest
import yaml
from servers import free_port, require_binary

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
COMPOSE = ROOT / "compose"
COMPOSE_FILE = COMPOSE / "docker-compose.yml"
# The backend files compose/stack.sh merges onto COMPOSE_FILE (METRICS_BACKEND).
BACKEND_FILES = {
    "influxdb": COMPOSE / "docker-compose.influxdb.yml",
    "victoriametrics": COMPOSE / "docker-compose.victoriametrics.yml",
}
STACK = COMPOSE / "stack.sh"
# The secret files stack.sh writes into compose/secrets/, with values made for each
# run (no credential is kept in the repository, not even a test's).
SECRET_NAMES = (
    "influxdb_admin_password",
    "influxdb_admin_token",
    "grafana_admin_password",
    "grafana_secret_key",
    "victoriametrics_node_token",
    "vmauth_metrics_auth_key",
    "vmauth_flags_auth_key",
    "vmauth_pprof_auth_key",
    "vmauth_reload_auth_key",
    "victoriametrics_delete_auth_key",
    "victoriametrics_snapshot_auth_key",
    "victoriametrics_force_merge_auth_key",
    "victoriametrics_force_flush_auth_key",
)
SECRETS = {name: secrets.token_hex(12) for name in SECRET_NAMES}
# vmauth's configuration, which stack.sh renders from victoriametrics_node_token.
RENDERED_SECRETS = {"vmauth_config": "users: []\n"}
# Secrets the operator may fill in; stack.sh creates them empty.
OPTIONAL_SECRETS = ("alerting_webhook_url",)
# Names an older stack.sh kept these secrets under, in compose/.env.
LEGACY_SECRET_NAMES = {name.upper(): name for name in SECRETS}
LONG_RUNNING = ("influxdb", "loki", "grafana")


def versions() -> dict[str, str]:
    """versions.env as Ansible's properties lookup reads it: KEY=value lines."""
    found = {}
    for line in (ROOT / "versions.env").read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        assert sep and re.fullmatch(r"[A-Z][A-Z0-9_]*", key), line
        assert value == value.strip() and " " not in value and '"' not in value, line
        found[key] = value
    return found


def clean_env(**extra: str) -> dict[str, str]:
    """The process environment without anything the stack reads, plus `extra`."""
    names = {
        *LEGACY_SECRET_NAMES,
        *versions(),
        "STACK_SECRETS_DIR",
        "BIND_ADDRESS",
        "COMPOSE_PROJECT_NAME",
        "INFLUXDB_PORT",
        "LOKI_PORT",
        "GRAFANA_PORT",
        "INFLUXDB_BUCKET",
        "INFLUXDB_ORG",
        "METRICS_BACKEND",
        "VICTORIAMETRICS_PORT",
        "VICTORIAMETRICS_RETENTION",
    }
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in names and not k.endswith(("_MEMORY_LIMIT", "_PIDS_LIMIT", "_STOP_GRACE_PERIOD"))
    }
    env.update(versions())
    env.update(extra)
    return env


def write_secrets(tmp_path: Path) -> Path:
    """The secret files as stack.sh writes them (a 0700 directory)."""
    directory = tmp_path / "secrets"
    directory.mkdir(mode=0o700, exist_ok=True)
    for name, value in {**SECRETS, **RENDERED_SECRETS}.items():
        (directory / name).write_text(value)
    return directory


def compose_config(
    tmp_path: Path, env_lines: dict[str, str] | None = None, backend: str = "influxdb", **extra: str
) -> subprocess.CompletedProcess[str]:
    """`docker-compose config` of the stack as stack.sh runs it for `backend`."""
    binary = require_binary("docker-compose")
    env_file = tmp_path / "test.env"
    env_file.write_text("".join(f"{k}={v}\n" for k, v in (env_lines or {}).items()))
    secrets_dir = write_secrets(tmp_path)
    files = ["-f", str(COMPOSE_FILE), "-f", str(BACKEND_FILES[backend])]
    return subprocess.run(
        [binary, "-p", "telemetry-test", *files, "--env-file", str(env_file), "config"],
        capture_output=True,
        text=True,
        env=clean_env(STACK_SECRETS_DIR=str(secrets_dir), **extra),
        timeout=120,
        check=False,
    )


@pytest.fixture
def config(tmp_path: Path) -> dict[str, Any]:
    result = compose_config(tmp_path)
    assert result.returncode == 0, result.stderr
    return yaml.safe_load(result.stdout)


def mounts(service: dict[str, Any]) -> list[tuple[str, str]]:
    """(source, target) of each mount, whatever syntax the compose version prints."""
    found = []
    for volume in service.get("volumes", []):
        if isinstance(volume, dict):
            found.append((volume.get("source", ""), volume["target"]))
        else:
            source, target = volume.split(":")[:2]
            found.append((source, target))
    return found


# ---------------------------------------------------------------- versions


def test_versions_env_pins_current_majors_never_latest() -> None:
    pinned = versions()
    assert {
        "INFLUXDB_IMAGE",
        "LOKI_IMAGE",
        "GRAFANA_IMAGE",
        "CADDY_IMAGE",
        "PYTHON_IMAGE",
        "VICTORIAMETRICS_IMAGE",
        "VMAUTH_IMAGE",
    } <= set(pinned)
    for key, image in pinned.items():
        assert key.endswith("_IMAGE"), key
        assert not image.endswith(":latest") and re.search(r":v?\d+\.\d+\.\d+(-alpine|-cluster)?$", image), image
    # The backup helper of make backup / make restore (compose/stack.sh).
    assert pinned["PYTHON_IMAGE"].startswith("python:3.")
    assert pinned["INFLUXDB_IMAGE"].startswith("influxdb:2.")
    assert pinned["LOKI_IMAGE"].startswith("grafana/loki:3.")
    assert pinned["GRAFANA_IMAGE"].startswith("grafana/grafana:13.")
    assert pinned["CADDY_IMAGE"].startswith("caddy:2.")  # the production reverse proxy (Ansible)
    # The VictoriaMetrics backend: the single node and its vmauth, one release.
    assert pinned["VICTORIAMETRICS_IMAGE"].startswith("victoriametrics/victoria-metrics:v1.")
    assert pinned["VMAUTH_IMAGE"] == pinned["VICTORIAMETRICS_IMAGE"].replace("/victoria-metrics:", "/vmauth:")


# ---------------------------------------------------------------- compose file


def test_compose_file_validates_and_uses_versions_env(config: dict[str, Any]) -> None:
    services = config["services"]
    pinned = versions()
    assert services["influxdb"]["image"] == pinned["INFLUXDB_IMAGE"]
    assert services["loki"]["image"] == pinned["LOKI_IMAGE"]
    assert services["grafana"]["image"] == pinned["GRAFANA_IMAGE"]
    for name, service in services.items():
        assert not service["image"].endswith(":latest"), name
        assert ":" in service["image"], name


def test_no_secret_passes_through_a_container_environment(tmp_path: Path, config: dict[str, Any]) -> None:
    """`docker inspect` shows a container's environment: secrets come as files."""
    declared = config["secrets"]
    assert set(declared) == {
        "influxdb_admin_password",
        "influxdb_admin_token",
        "grafana_admin_password",
        "grafana_secret_key",
    } | set(OPTIONAL_SECRETS)
    for name, secret in declared.items():
        assert Path(secret["file"]) == tmp_path / "secrets" / name
    for service_name, service in config["services"].items():
        environment = service.get("environment") or {}
        for key, value in environment.items():
            assert str(value) not in SECRETS.values(), f"{service_name}: {key} holds a secret"
        mounted = {s["source"] if isinstance(s, dict) else s for s in service.get("secrets", [])}
        for key, value in environment.items():
            if key.endswith("_FILE") and str(value).startswith("/run/secrets/"):
                assert str(value).removeprefix("/run/secrets/") in mounted, f"{service_name}: {key}"
    # Each secret reaches the service that needs it, and only that one.
    assert {s["source"] for s in config["services"]["influxdb"]["secrets"]} == {
        "influxdb_admin_password",
        "influxdb_admin_token",
    }
    assert {s["source"] for s in config["services"]["grafana"]["secrets"]} == {
        "grafana_admin_password",
        "grafana_secret_key",
        "alerting_webhook_url",
    }
    assert "secrets" not in config["services"]["loki"]


def test_containers_are_confined_and_limited(tmp_path: Path, config: dict[str, Any]) -> None:
    services = config["services"]
    for name, service in services.items():
        assert service["cap_drop"] == ["ALL"], name
        assert "no-new-privileges:true" in service["security_opt"], name
        assert service.get("mem_limit"), name
        assert int(service["pids_limit"]) > 0, name
    # Only InfluxDB's entrypoint (chown, then setpriv to its user) and the one-shot
    # chown step keep capabilities; Loki and Grafana run as their users from the start.
    assert set(services["influxdb"]["cap_add"]) == {"CHOWN", "DAC_OVERRIDE", "FOWNER", "SETGID", "SETUID"}
    assert set(services["loki-volume-init"]["cap_add"]) == {"CHOWN", "DAC_OVERRIDE"}
    assert "cap_add" not in services["loki"] and "cap_add" not in services["grafana"]
    # InfluxDB and Loki get time to flush before SIGKILL (Docker's default is 10 s).
    for name in ("influxdb", "loki"):
        assert seconds(services[name]["stop_grace_period"]) >= 30, name
    # The limits are settings of compose/.env.
    result = compose_config(tmp_path, {"INFLUXDB_MEMORY_LIMIT": "6g", "LOKI_PIDS_LIMIT": "2048"})
    assert result.returncode == 0, result.stderr
    changed = yaml.safe_load(result.stdout)["services"]
    assert changed["influxdb"]["mem_limit"] == "6g"
    assert int(changed["loki"]["pids_limit"]) == 2048


def seconds(duration: str) -> float:
    """A compose duration such as 1m30s in seconds."""
    units = {"h": 3600, "m": 60, "s": 1, "ms": 0.001}
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|h|m|s)", str(duration))
    assert parts, duration
    return sum(float(number) * units[unit] for number, unit in parts)


@pytest.mark.parametrize("backend", sorted(BACKEND_FILES))
def test_compose_refuses_to_start_without_versions(tmp_path: Path, backend: str) -> None:
    env_file = tmp_path / "test.env"
    env_file.write_text("INFLUXDB_ADMIN_USER=admin\n")
    env = {k: v for k, v in clean_env(STACK_SECRETS_DIR=str(write_secrets(tmp_path))).items() if k not in versions()}
    files = ["-f", str(COMPOSE_FILE), "-f", str(BACKEND_FILES[backend])]
    result = subprocess.run(
        [require_binary("docker-compose"), *files, "--env-file", str(env_file), "config"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert result.returncode != 0
    assert "_IMAGE" in result.stderr


def test_every_service_has_a_healthcheck_and_a_restart_policy(config: dict[str, Any]) -> None:
    services = config["services"]
    assert set(LONG_RUNNING) <= set(services)
    for name in LONG_RUNNING:
        service = services[name]
        assert service["restart"] == "unless-stopped", name
        test = service["healthcheck"]["test"]
        assert test[0] in ("CMD", "CMD-SHELL") and len(test) > 1, name
    # Any other service is a one-shot step that a long-running one waits for.
    waited_for = {
        dep: cond["condition"]
        for service in services.values()
        for dep, cond in (service.get("depends_on") or {}).items()
    }
    for name in set(services) - set(LONG_RUNNING):
        assert services[name]["restart"] == "no", name
        assert waited_for.get(name) == "service_completed_successfully", name


def test_loki_health_check_needs_no_shell(config: dict[str, Any]) -> None:
    assert config["services"]["loki"]["healthcheck"]["test"] == ["CMD", "/usr/bin/loki", "-health"]


def test_grafana_waits_for_healthy_backends(config: dict[str, Any]) -> None:
    depends = config["services"]["grafana"]["depends_on"]
    assert depends["influxdb"]["condition"] == "service_healthy"
    assert depends["loki"]["condition"] == "service_healthy"


def test_ports_bind_to_loopback_unless_configured(tmp_path: Path, config: dict[str, Any]) -> None:
    def published(cfg: dict[str, Any]) -> list[str]:
        return [str(p) for s in cfg["services"].values() for p in s.get("ports", [])]

    ports = published(config)
    assert len(ports) == 3
    assert all(p.startswith("127.0.0.1:") for p in ports), ports
    result = compose_config(tmp_path, {"BIND_ADDRESS": "0.0.0.0"})
    assert result.returncode == 0, result.stderr
    assert all(p.startswith("0.0.0.0:") for p in published(yaml.safe_load(result.stdout)))


def test_data_lives_in_named_volumes(config: dict[str, Any]) -> None:
    declared = set(config["volumes"])
    data_paths = {
        "influxdb": {"/var/lib/influxdb2", "/etc/influxdb2"},
        "loki": {"/loki"},
        "grafana": {"/var/lib/grafana"},
    }
    for name, paths in data_paths.items():
        by_target = {target: source for source, target in mounts(config["services"][name])}
        for path in paths:
            assert by_target.get(path) in declared, f"{name}:{path} is not a named volume"
    for name, service in config["services"].items():
        for source, target in mounts(service):
            if not source.startswith("/"):
                assert source in declared, f"{name}: {source}:{target}"


def test_loki_runs_as_10001_on_a_volume_handed_to_it(config: dict[str, Any]) -> None:
    services = config["services"]
    assert services["loki"]["user"] == "10001:10001"
    init = services["loki-volume-init"]
    assert init["entrypoint"] == ["chown", "-R", "10001:10001", "/loki"]
    assert ("loki-data", "/loki") in mounts(init)
    assert ("loki-data", "/loki") in mounts(services["loki"])


def test_grafana_is_locked_down_and_provisioned_from_the_repo(config: dict[str, Any]) -> None:
    grafana = config["services"]["grafana"]
    env = grafana["environment"]
    assert env["GF_AUTH_ANONYMOUS_ENABLED"] == "false"
    assert env["GF_USERS_ALLOW_SIGN_UP"] == "false"
    assert env["GF_SECURITY_ADMIN_PASSWORD__FILE"] == "/run/secrets/grafana_admin_password"
    assert "GF_SECURITY_ADMIN_PASSWORD" not in env
    # Its own random secret_key (never Grafana's public default), and no publishing
    # of snapshots to snapshots.raintank.io.
    assert env["GF_SECURITY_SECRET_KEY__FILE"] == "/run/secrets/grafana_secret_key"
    assert "GF_SECURITY_SECRET_KEY" not in env
    assert env["GF_SNAPSHOTS_EXTERNAL_ENABLED"] == "false"
    by_target = {target: source for source, target in mounts(grafana)}
    assert Path(by_target["/etc/grafana/provisioning"]) == ROOT / "grafana" / "provisioning"
    assert Path(by_target["/etc/grafana/dashboards"]) == ROOT / "grafana" / "dashboards"
    assert Path(by_target["/etc/telemetry/alerting"]) == ROOT / "grafana" / "alerting"
    # The variables the provisioned data sources expand.
    datasources = (ROOT / "grafana/provisioning/datasources/datasources.yml").read_text()
    for name in set(re.findall(r"\$\{(\w+)\}", datasources)) - {"INFLUXDB_READ_TOKEN"}:
        assert env.get(name), f"compose does not set {name} for Grafana"
    assert env["INFLUXDB_READ_TOKEN_FILE"].startswith("/run/telemetry-tokens/")


def test_influxdb_is_set_up_from_the_environment(config: dict[str, Any]) -> None:
    influx = config["services"]["influxdb"]
    env = influx["environment"]
    assert env["DOCKER_INFLUXDB_INIT_MODE"] == "setup"
    assert env["DOCKER_INFLUXDB_INIT_PASSWORD_FILE"] == "/run/secrets/influxdb_admin_password"
    assert env["DOCKER_INFLUXDB_INIT_ADMIN_TOKEN_FILE"] == "/run/secrets/influxdb_admin_token"
    assert "DOCKER_INFLUXDB_INIT_PASSWORD" not in env and "DOCKER_INFLUXDB_INIT_ADMIN_TOKEN" not in env
    assert re.fullmatch(r"\d+[dhw]", env["DOCKER_INFLUXDB_INIT_RETENTION"])
    by_target = {target: source for source, target in mounts(influx)}
    assert Path(by_target["/docker-entrypoint-initdb.d"]) == COMPOSE / "influxdb" / "init"
    assert by_target["/run/telemetry-tokens"] == "influxdb-tokens"


@pytest.mark.parametrize("path", [COMPOSE_FILE, *BACKEND_FILES.values()], ids=lambda p: p.name)
def test_compose_file_holds_no_secret(path: Path) -> None:
    """Secret-bearing settings name files; the files live outside the repository."""
    raw = yaml.safe_load(path.read_text())
    for service in raw["services"].values():
        for key, value in (service.get("environment") or {}).items():
            if re.search(r"PASSWORD|TOKEN|SECRET", key):
                assert key.endswith(("_FILE", "_DIR")) and str(value).startswith("/run/"), key
        # A flag that takes a credential names a secret file (-auth.config=/run/secrets/...).
        for arg in service.get("command") or []:
            flag, _, value = str(arg).partition("=")
            if re.search(r"password|token|auth", flag, re.I):
                assert value.startswith(("/run/secrets/", "file:///run/secrets/")), arg
    for name, secret in raw["secrets"].items():
        assert secret["file"] == "${STACK_SECRETS_DIR:-./secrets}/" + name
    assert "secrets/" in (COMPOSE / ".gitignore").read_text().splitlines()


# ---------------------------------------------------------------- loki config


def test_loki_config_matches_the_stack_requirements() -> None:
    cfg = yaml.safe_load((COMPOSE / "loki" / "loki.yml").read_text())
    schema = cfg["schema_config"]["configs"][-1]
    assert (schema["store"], schema["schema"], schema["object_store"]) == ("tsdb", "v13", "filesystem")
    limits = cfg["limits_config"]
    assert limits["allow_structured_metadata"] is True
    assert cfg["compactor"]["retention_enabled"] is True
    assert cfg["compactor"]["delete_request_store"] == "filesystem"
    assert re.fullmatch(r"\d+h", limits["retention_period"])
    assert cfg["analytics"]["reporting_enabled"] is False
    assert cfg["auth_enabled"] is False
    # A simulator flood (tens of thousands of 300-byte lines/s) fits the limits.
    assert limits["ingestion_rate_mb"] >= 64 and limits["ingestion_burst_size_mb"] >= 128
    assert int(limits["per_stream_rate_limit"].rstrip("MB")) >= 16
    assert limits["max_label_names_per_series"] >= 7
    for path in cfg["common"]["storage"]["filesystem"].values():
        assert path.startswith(cfg["common"]["path_prefix"])


# ---------------------------------------------------------------- scripts


def test_scripts_parse_and_the_init_script_is_executable() -> None:
    init = COMPOSE / "influxdb" / "init" / "10-tokens.sh"
    # The InfluxDB image runs only executable *.sh files of its init directory.
    assert init.stat().st_mode & stat.S_IXUSR
    for script in (init, STACK):
        subprocess.run(["bash", "-n", str(script)], check=True)
    subprocess.run(["sh", "-n", str(COMPOSE / "grafana" / "entrypoint.sh")], check=True)


def test_grafana_entrypoint_exports_the_token_from_the_shared_file(tmp_path: Path) -> None:
    token = tmp_path / "grafana-read.token"
    token.write_text("read-only-token-value")
    fake_run = tmp_path / "run.sh"
    fake_run.write_text('#!/bin/sh\necho "token=$INFLUXDB_READ_TOKEN"\n')
    fake_run.chmod(0o755)
    env = {"PATH": os.environ["PATH"], "INFLUXDB_READ_TOKEN_FILE": str(token), "GRAFANA_RUN": str(fake_run)}
    result = subprocess.run(
        ["sh", str(COMPOSE / "grafana" / "entrypoint.sh")], env=env, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "token=read-only-token-value"
    token.unlink()
    missing = subprocess.run(
        ["sh", str(COMPOSE / "grafana" / "entrypoint.sh")], env=env, capture_output=True, text=True, check=False
    )
    assert missing.returncode == 1
    assert "make clean VOLUMES=1" in missing.stderr


def stack(*args: str, tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    full = clean_env(
        STACK_ENV_FILE=str(tmp_path / "stack.env"),
        STACK_NODE_ENV_FILE=str(tmp_path / "node.env"),
        STACK_SECRETS_DIR=str(tmp_path / "secrets"),
        **env,
    )
    return subprocess.run(
        ["bash", str(STACK), *args], capture_output=True, text=True, env=full, timeout=600, check=False
    )


@pytest.mark.parametrize("command", ["up", "backup", "restore"])
def test_make_up_without_an_engine_says_what_is_missing(tmp_path: Path, command: str) -> None:
    result = stack(command, tmp_path=tmp_path, DOCKER_HOST=f"unix://{tmp_path}/no-engine.sock")
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Docker engine" in lines[0] and "install" in lines[0], lines
    assert "Traceback" not in result.stderr + result.stdout
    assert not (tmp_path / "stack.env").exists()
    assert not (tmp_path / "backups").exists()


FAKE_DOCKER = """#!/bin/sh
# An engine that answers `docker info` and `docker compose version`, and records
# every other call: restore must refuse before it asks the engine to change anything.
echo "$*" >>"$CALLS"
exit 0
"""


def fake_engine(tmp_path: Path) -> dict[str, str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "docker").write_text(FAKE_DOCKER)
    (bin_dir / "docker").chmod(0o755)
    (tmp_path / "stack.env").write_text("BIND_ADDRESS=127.0.0.1\n")
    return {"PATH": f"{bin_dir}:{os.environ['PATH']}", "CALLS": str(tmp_path / "calls")}


def backup_set(tmp_path: Path, **images: str) -> Path:
    pinned = {k: versions()[k] for k in ("INFLUXDB_IMAGE", "LOKI_IMAGE", "GRAFANA_IMAGE")}
    pinned.update(images)
    directory = tmp_path / "backups" / "20261130T030000Z"
    (directory / "influxdb").mkdir(parents=True)
    (directory / "grafana.db").write_bytes(b"")
    (directory / "loki.tar.gz").write_bytes(b"")
    (directory / "MANIFEST").write_text("".join(f"{k}={v}\n" for k, v in pinned.items()))
    return directory


def changing_calls(tmp_path: Path) -> list[str]:
    calls = (tmp_path / "calls").read_text().splitlines() if (tmp_path / "calls").exists() else []
    return [c for c in calls if not c.startswith(("info", "compose version"))]


def test_restore_refuses_a_backup_of_other_image_versions(tmp_path: Path) -> None:
    env = fake_engine(tmp_path)
    backup_set(tmp_path, GRAFANA_IMAGE="grafana/grafana:12.4.0")
    result = stack("restore", tmp_path=tmp_path, STACK_BACKUP_DIR=str(tmp_path / "backups"), **env)
    assert result.returncode != 0
    assert "was taken with GRAFANA_IMAGE=grafana/grafana:12.4.0" in result.stderr
    assert changing_calls(tmp_path) == []


def test_restore_refuses_an_incomplete_or_missing_backup(tmp_path: Path) -> None:
    env = fake_engine(tmp_path)
    none = stack("restore", tmp_path=tmp_path, STACK_BACKUP_DIR=str(tmp_path / "backups"), **env)
    assert none.returncode != 0 and "run 'make backup' first" in none.stderr
    directory = backup_set(tmp_path)
    (directory / "loki.tar.gz").unlink()
    result = stack(
        "restore", tmp_path=tmp_path, STACK_BACKUP_DIR=str(tmp_path / "backups"), BACKUP=directory.name, **env
    )
    assert result.returncode != 0 and "loki.tar.gz is missing" in result.stderr
    assert changing_calls(tmp_path) == []


def test_make_up_without_docker_installed_says_so(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("bash", "dirname", "timeout"):
        (bin_dir / tool).symlink_to(shutil.which(tool) or f"/usr/bin/{tool}")
    result = stack("up", tmp_path=tmp_path, PATH=str(bin_dir))
    assert result.returncode != 0
    assert result.stderr.strip().startswith("Docker is not installed")
    assert len(result.stderr.strip().splitlines()) == 1


def read_secrets(directory: Path) -> dict[str, str]:
    return {name: (directory / name).read_text() for name in SECRETS}


def test_env_file_and_secret_files_are_random_private_and_kept(tmp_path: Path) -> None:
    first = stack("env", tmp_path=tmp_path)
    assert first.returncode == 0, first.stderr
    path = tmp_path / "stack.env"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    secrets_dir = tmp_path / "secrets"
    assert stat.S_IMODE(secrets_dir.stat().st_mode) == 0o700
    values = read_secrets(secrets_dir)
    for name, value in values.items():
        assert len(value) >= 32 and value.isalnum(), name
    assert len(set(values.values())) == len(values)
    # Root in the InfluxDB container reads its files; Grafana (uid 472) reads its
    # own through the 0700 directory, which nobody else on this machine can enter.
    assert stat.S_IMODE((secrets_dir / "influxdb_admin_password").stat().st_mode) == 0o600
    assert stat.S_IMODE((secrets_dir / "influxdb_admin_token").stat().st_mode) == 0o600
    assert stat.S_IMODE((secrets_dir / "grafana_admin_password").stat().st_mode) == 0o644
    assert stat.S_IMODE((secrets_dir / "grafana_secret_key").stat().st_mode) == 0o644
    assert len(values["grafana_secret_key"]) == 40
    # Only stack.sh reads the VictoriaMetrics node token; vmauth reads its configuration as root.
    assert stat.S_IMODE((secrets_dir / "victoriametrics_node_token").stat().st_mode) == 0o600
    assert stat.S_IMODE((secrets_dir / "vmauth_config").stat().st_mode) == 0o600
    settings = path.read_text()
    assert not any(value in settings for value in values.values()), "the env file holds a secret"
    assert stack("env", tmp_path=tmp_path).returncode == 0
    assert path.read_text() == settings, "an existing env file must be kept"
    assert read_secrets(secrets_dir) == values, "existing secrets must be kept"
    other = tmp_path / "other"
    other.mkdir()
    assert stack("env", tmp_path=other).returncode == 0
    assert read_secrets(other / "secrets") != values


def test_secrets_of_an_older_env_file_move_into_files(tmp_path: Path) -> None:
    """A stack set up by an older stack.sh keeps its credentials: InfluxDB has them."""
    legacy = {"INFLUXDB_ADMIN_PASSWORD": "kept-influx-password", "GRAFANA_ADMIN_PASSWORD": "kept-grafana-pw"}
    path = tmp_path / "stack.env"
    path.write_text("".join(f"{k}={v}\n" for k, v in legacy.items()) + "BIND_ADDRESS=127.0.0.1\n")
    result = stack("env", tmp_path=tmp_path)
    assert result.returncode == 0, result.stderr
    values = read_secrets(tmp_path / "secrets")
    assert values["influxdb_admin_password"] == "kept-influx-password"
    assert values["grafana_admin_password"] == "kept-grafana-pw"
    assert len(values["influxdb_admin_token"]) == 64
    assert path.read_text() == "BIND_ADDRESS=127.0.0.1\n"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_stack_refuses_a_floating_version(tmp_path: Path) -> None:
    floating = tmp_path / "versions.env"
    floating.write_text((ROOT / "versions.env").read_text().replace(versions()["LOKI_IMAGE"], "grafana/loki:latest"))
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    docker = fake_bin / "docker"  # an engine that answers, so the version check runs
    docker.write_text("#!/bin/sh\nexit 0\n")
    docker.chmod(0o755)
    result = stack("up", tmp_path=tmp_path, VERSIONS_FILE=str(floating), PATH=f"{fake_bin}:{os.environ['PATH']}")
    assert result.returncode != 0
    assert "LOKI_IMAGE must pin a version" in result.stderr
    assert not (tmp_path / "stack.env").exists()


# ---------------------------------------------------------------- real stack


def docker_engine() -> str | None:
    """Why the real-stack test cannot run here, or None when it can."""
    if not shutil.which("docker"):
        return "the docker CLI is not installed"
    try:
        result = subprocess.run(["docker", "info"], capture_output=True, timeout=30, check=False)
    except subprocess.TimeoutExpired:
        return "docker info timed out"
    return None if result.returncode == 0 else "no Docker engine is reachable (docker info failed)"


def http_status(url: str, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


@pytest.mark.docker
@pytest.mark.timeout(900)
@pytest.mark.skipif(docker_engine() is not None, reason=str(docker_engine()))
def test_make_up_brings_every_service_up_healthy(tmp_path: Path) -> None:
    ports = {"INFLUXDB_PORT": free_port(), "LOKI_PORT": free_port(), "GRAFANA_PORT": free_port()}
    env_file = tmp_path / "stack.env"
    env_file.write_text("".join(f"{k}={v}\n" for k, v in {**ports, "BIND_ADDRESS": "127.0.0.1"}.items()))
    env_file.chmod(0o600)
    make_env = {
        "STACK_ENV_FILE": str(env_file),
        "STACK_SECRETS_DIR": str(tmp_path / "secrets"),
        "STACK_NODE_ENV_FILE": str(tmp_path / "node"),
        "COMPOSE_PROJECT_NAME": f"telemetry-test-{os.getpid()}",
    }
    make = require_binary("make")
    try:
        up = subprocess.run(
            [make, "-C", str(ROOT), "up"],
            capture_output=True,
            text=True,
            env=clean_env(**make_env),
            timeout=600,
            check=False,
        )
        assert up.returncode == 0, up.stdout + up.stderr
        assert "The local stack is up." in up.stdout
        base = "http://127.0.0.1"
        assert http_status(f"{base}:{ports['INFLUXDB_PORT']}/health")[0] == 200
        assert http_status(f"{base}:{ports['LOKI_PORT']}/ready")[0] == 200
        status, body = http_status(f"{base}:{ports['GRAFANA_PORT']}/api/health")
        assert status == 200 and b'"database"' in body
        password = (tmp_path / "secrets" / "grafana_admin_password").read_text()
        auth = {"Authorization": "Basic " + b64encode(f"admin:{password}".encode()).decode()}
        for uid in ("influxdb", "loki"):
            status, body = http_status(f"{base}:{ports['GRAFANA_PORT']}/api/datasources/uid/{uid}/health", auth)
            assert status == 200, (uid, body)
        assert http_status(f"{base}:{ports['GRAFANA_PORT']}/api/search")[0] == 401
        node_env = (tmp_path / "node").read_text()
        assert "INFLUXDB_TOKEN=" in node_env

        # make backup, then the restore drill of docs/local-stack.md.
        backups = tmp_path / "backups"
        backup_env = clean_env(**make_env, STACK_BACKUP_DIR=str(backups), BACKUP_KEEP="1")
        for _ in range(2):
            made = subprocess.run(
                [make, "-C", str(ROOT), "backup"], capture_output=True, text=True, env=backup_env, timeout=600
            )
            assert made.returncode == 0, made.stdout + made.stderr
        [backup] = list(backups.iterdir())  # BACKUP_KEEP=1 pruned the first one
        assert (backup / "influxdb").is_dir() and any((backup / "influxdb").iterdir())
        assert (backup / "grafana.db").stat().st_size > 0 and (backup / "loki.tar.gz").stat().st_size > 0
        restored = subprocess.run(
            [make, "-C", str(ROOT), "restore"], capture_output=True, text=True, env=backup_env, timeout=600
        )
        assert restored.returncode == 0, restored.stdout + restored.stderr
        status, body = http_status(f"{base}:{ports['GRAFANA_PORT']}/api/datasources/uid/influxdb/health", auth)
        assert status == 200, body
    finally:
        subprocess.run(
            [make, "-C", str(ROOT), "clean", "VOLUMES=1"],
            capture_output=True,
            env=clean_env(**make_env),
            timeout=300,
            check=False,
        )


FAKE_INFLUX = r"""#!/bin/bash
# Stands in for the influx CLI: records its arguments, answers like influx 2.x.
# Table rows with --hide-headers, columns as the CLI reference lists them
# (docs.influxdata.com/influxdb/v2/reference/cli/influx/): bucket list: ID, Name,
# Retention, Shard group duration, Organization ID, Schema Type; task list: ID,
# Name, Organization ID, Organization, Status, Every, Cron.
echo "$*" >>"$CALLS"
case "$1 $2 $3" in
  "v1 dbrp list")
    case "$*" in
      *"--rp downsampled"*) [ -n "$DOWNSAMPLED_DBRP_EXISTS" ] && printf 'id2\ttelemetry\tds456\tdownsampled\tfalse\n' ;;
      *) [ -n "$DBRP_EXISTS" ] && printf 'id1\ttelemetry\tbucket123\tautogen\ttrue\n' ;;
    esac
    exit 0 ;;
  "v1 dbrp create") exit 0 ;;
esac
case "$1 $2" in
  "bucket list")
    if [ -n "$DOWNSAMPLED_EXISTS" ] || grep -q "^bucket create" "$CALLS"; then
      printf 'ds456\ttelemetry_downsampled\t9600h0m0s\t24h0m0s\torg123\timplicit\n'
    fi
    exit 0 ;;
  "bucket create") exit 0 ;;
  "task list")
    [ -n "$TASKS_EXIST" ] && printf 'tk1\tdownsample_system\torg123\ttelemetry\tactive\t5m\t\n'
    exit 0 ;;
  "task create") cp "$6" "$TASK_COPIES/$(grep -o 'name: "[a-z_]*"' "$6" | cut -d'"' -f2).flux"; exit 0 ;;
esac
if [ "$1 $2" = "auth create" ]; then
  case "$*" in
    *--write-bucket*) token="write-Tok_en==" ;;
    *) token="read-Tok_en==" ;;
  esac
  printf '{\n\t"id": "0a1",\n\t"description": "x",\n\t"token": "%s",\n\t"status": "active"\n}\n' "$token"
  exit 0
fi
exit 3
"""


@pytest.mark.parametrize("mapping_exists", [False, True])
def test_init_script_stores_a_write_and_a_read_token(tmp_path: Path, mapping_exists: bool) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    influx = bin_dir / "influx"
    influx.write_text(FAKE_INFLUX)
    influx.chmod(0o755)
    tokens = tmp_path / "tokens"
    calls = tmp_path / "calls"
    env = {
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "CALLS": str(calls),
        "DBRP_EXISTS": "1" if mapping_exists else "",
        "TELEMETRY_TOKENS_DIR": str(tokens),
        "GRAFANA_UID": str(os.getuid()),
        "DOCKER_INFLUXDB_INIT_ORG_ID": "org123",
        "DOCKER_INFLUXDB_INIT_BUCKET_ID": "bucket123",
        "DOCKER_INFLUXDB_INIT_BUCKET": "telemetry",
    }
    result = subprocess.run(
        ["bash", str(COMPOSE / "influxdb/init/10-tokens.sh")], env=env, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
    assert (tokens / "node-write.token").read_text() == "write-Tok_en=="
    assert (tokens / "grafana-read.token").read_text() == "read-Tok_en=="
    assert stat.S_IMODE((tokens / "node-write.token").stat().st_mode) == 0o400
    assert stat.S_IMODE((tokens / "grafana-read.token").stat().st_mode) == 0o440
    assert stat.S_IMODE(tokens.stat().st_mode) == 0o711
    made = calls.read_text().splitlines()
    writes = [c for c in made if c.startswith("auth create") and "--write-bucket bucket123" in c]
    reads = [c for c in made if c.startswith("auth create") and "--read-bucket bucket123" in c]
    assert len(writes) == 1 and len(reads) == 1
    assert not any("--read-bucket" in c for c in writes)
    assert not any("--write-bucket" in c for c in reads)
    created = [c for c in made if c.startswith("v1 dbrp create")]
    if mapping_exists:
        assert created == []
    else:
        assert created and "--db telemetry --rp autogen --default" in created[0]


@pytest.mark.parametrize("already_there", [False, True])
def test_downsampling_init_creates_the_bucket_mapping_and_tasks(tmp_path: Path, already_there: bool) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    influx = bin_dir / "influx"
    influx.write_text(FAKE_INFLUX)
    influx.chmod(0o755)
    calls, copies = tmp_path / "calls", tmp_path / "tasks"
    calls.write_text("")
    copies.mkdir()
    there = "1" if already_there else ""
    env = {
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "CALLS": str(calls),
        "TASK_COPIES": str(copies),
        "DOWNSAMPLED_EXISTS": there,
        "DOWNSAMPLED_DBRP_EXISTS": there,
        "TASKS_EXIST": there,
        "DOCKER_INFLUXDB_INIT_ORG_ID": "org123",
        "DOCKER_INFLUXDB_INIT_BUCKET": "telemetry",
        "INFLUXDB_DOWNSAMPLED_RETENTION": "400d",
        "TELEMETRY_DOWNSAMPLING_TASKS": str(ROOT / "grafana/downsampling/tasks"),
    }
    script = COMPOSE / "influxdb/init/05-downsampling.sh"
    assert script.stat().st_mode & stat.S_IXUSR
    result = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    made = calls.read_text().splitlines()
    buckets = [c for c in made if c.startswith("bucket create")]
    mappings = [c for c in made if c.startswith("v1 dbrp create")]
    flux_files = sorted(p.stem for p in (ROOT / "grafana/downsampling/tasks").glob("*.flux"))
    if already_there:
        assert buckets == [] and mappings == []
        assert sorted(p.stem for p in copies.iterdir()) == [f"downsample_{n}" for n in flux_files if n != "system"]
    else:
        assert buckets == ["bucket create --org-id org123 --name telemetry_downsampled --retention 400d"]
        assert mappings == ["v1 dbrp create --org-id org123 --bucket-id ds456 --db telemetry --rp downsampled"]
        assert sorted(p.stem for p in copies.iterdir()) == [f"downsample_{n}" for n in flux_files]
    for task in copies.iterdir():
        text = task.read_text()
        assert 'from(bucket: "telemetry")' in text and 'to(bucket: "telemetry_downsampled")' in text
        assert "@" not in text


def test_grafana_read_token_reads_the_downsampled_copy_too(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    influx = bin_dir / "influx"
    influx.write_text(FAKE_INFLUX)
    influx.chmod(0o755)
    calls = tmp_path / "calls"
    calls.write_text("")
    env = {
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "CALLS": str(calls),
        "DOWNSAMPLED_EXISTS": "1",
        "TELEMETRY_TOKENS_DIR": str(tmp_path / "tokens"),
        "GRAFANA_UID": str(os.getuid()),
        "DOCKER_INFLUXDB_INIT_ORG_ID": "org123",
        "DOCKER_INFLUXDB_INIT_BUCKET_ID": "bucket123",
        "DOCKER_INFLUXDB_INIT_BUCKET": "telemetry",
    }
    result = subprocess.run(
        ["bash", str(COMPOSE / "influxdb/init/10-tokens.sh")], env=env, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
    reads = [c for c in calls.read_text().splitlines() if c.startswith("auth create") and "--read-bucket" in c]
    assert len(reads) == 1 and "--read-bucket bucket123 --read-bucket ds456" in reads[0]
    writes = [c for c in calls.read_text().splitlines() if c.startswith("auth create") and "--write-bucket" in c]
    assert "ds456" not in writes[0]


def test_an_older_grafana_volume_keeps_the_key_its_secrets_were_encrypted_with(tmp_path: Path) -> None:
    """A Grafana volume that exists without a secret_key file was set up with the built-in key."""
    env = fake_engine(tmp_path)  # answers every call, `docker volume inspect` included
    result = stack("up", tmp_path=tmp_path, STACK_TIMEOUT="0", **env)
    assert (tmp_path / "secrets" / "grafana_secret_key").read_text() == "SW2YcwTIb9zpOOhoPsMm"
    assert "predates its own secret_key" in result.stderr
    # Without the volume (a new stack) the key is random.
    other = tmp_path / "new"
    other.mkdir()
    assert stack("env", tmp_path=other).returncode == 0
    assert (other / "secrets" / "grafana_secret_key").read_text() != "SW2YcwTIb9zpOOhoPsMm"
