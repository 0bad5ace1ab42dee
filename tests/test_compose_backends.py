"""The local stack's metrics backend switch: METRICS_BACKEND=influxdb|victoriametrics.

`docker-compose config` renders the stack as compose/stack.sh runs it for each
backend (docker-compose.yml merged with docker-compose.<backend>.yml); stack.sh's
`env` step writes the settings and secrets of each into a temporary directory; and
the VictoriaMetrics write path runs for real: Debian's victoria-metrics and vmauth
(1.79.5) with the flags the compose services pass and the vmauth configuration
stack.sh renders, written to by MetricsLogger with the settings of node.env.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from base64 import b64encode
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from servers import _running, free_port, require_binary
from test_compose import (
    COMPOSE,
    ROOT,
    clean_env,
    compose_config,
    docker_engine,
    fake_engine,
    http_status,
    mounts,
    seconds,
    stack,
    versions,
)

from telemetry_client import BufferSettings
from telemetry_client.metrics import MetricsLogger

pytestmark = pytest.mark.slow

GRAFANA = ROOT / "grafana"
# What each backend runs; the common file adds Loki, its volume step and Grafana.
COMMON = {"loki-volume-init", "loki", "grafana"}
STORES = {
    "influxdb": {"influxdb"},
    "victoriametrics": {"victoriametrics-volume-init", "victoriametrics", "vmauth"},
}
# vmauth's answer to a token it does not know, by release (VictoriaMetrics app/vmauth/main.go):
# tag v1.79.5 (Debian's) answers 400 "cannot find the provided auth token %q in config";
# tag v1.136.0 (versions.env) 401 "Unauthorized" (requestHandler, -logInvalidAuthTokens off).
# Refused either way; the tests accept each and say which release answered.
UNKNOWN_TOKEN_ANSWERS = {
    "v1.79.5": (400, "cannot find the provided auth token"),
    "v1.136.0": (401, "Unauthorized"),
}


def unknown_token_release(status: int, text: str) -> str:
    """The release whose answer to an unknown token `status` and `text` are; fails on any other answer."""
    for release, (expected_status, words) in UNKNOWN_TOKEN_ANSWERS.items():
        if status == expected_status and words in text:
            return release
    raise AssertionError(f"not vmauth's answer to an unknown token in any known release: {status} {text!r}")


# vmauth's own endpoints, the flag whose key each needs as ?authKey=..., and the secret file holding it
# (compose/docker-compose.victoriametrics.yml). The flags are VictoriaMetrics lib/httpserver/httpserver.go's
# (metricsAuthKey, flagsAuthKey, pprofAuthKey) and app/vmauth/main.go's (reloadAuthKey), at tags v1.79.5
# and v1.136.0 alike.
AUTH_KEY_ENDPOINTS = {
    "/metrics": "metricsAuthKey",
    "/flags": "flagsAuthKey",
    "/debug/pprof/": "pprofAuthKey",
    "/-/reload": "reloadAuthKey",
}
AUTH_KEY_FILES = {
    "metricsAuthKey": "vmauth_metrics_auth_key",
    "flagsAuthKey": "vmauth_flags_auth_key",
    "pprofAuthKey": "vmauth_pprof_auth_key",
    "reloadAuthKey": "vmauth_reload_auth_key",
}
# VictoriaMetrics' own endpoint keys (docker-compose.victoriametrics.yml): flag, secret file.
VM_KEY_FILES = {
    "deleteAuthKey": "victoriametrics_delete_auth_key",
    "snapshotAuthKey": "victoriametrics_snapshot_auth_key",
    "forceMergeAuthKey": "victoriametrics_force_merge_auth_key",
    "forceFlushAuthKey": "victoriametrics_force_flush_auth_key",
}


# Where Grafana's provisioning, dashboards and alert rules come from, per backend.
GRAFANA_SOURCES = {
    "influxdb": {
        "/etc/grafana/provisioning": GRAFANA / "provisioning",
        "/etc/grafana/dashboards": GRAFANA / "dashboards",
        "/etc/telemetry/alerting": GRAFANA / "alerting",
    },
    "victoriametrics": {
        "/etc/grafana/provisioning": GRAFANA / "provisioning-victoriametrics",
        "/etc/grafana/dashboards": GRAFANA / "dashboards-victoriametrics",
        "/etc/telemetry/alerting": GRAFANA / "alerting-victoriametrics",
    },
}


def render(tmp_path: Path, backend: str, env_lines: dict[str, str] | None = None) -> dict[str, Any]:
    result = compose_config(tmp_path, env_lines, backend=backend)
    assert result.returncode == 0, result.stderr
    return yaml.safe_load(result.stdout)


def datasources(directory: Path) -> dict[str, dict[str, Any]]:
    """uid -> data source of a provisioning directory's datasources/*.yml."""
    found = {}
    for path in sorted((directory / "datasources").glob("*.y*ml")):
        for source in yaml.safe_load(path.read_text()).get("datasources", []):
            found[source["uid"]] = source
    return found


def expanded_variables(directory: Path) -> set[str]:
    """The ${VARIABLES} Grafana expands in a provisioning directory's data sources (comments aside)."""
    names = set()
    for path in (directory / "datasources").glob("*.y*ml"):
        text = re.sub(r"(?m)#.*$", "", path.read_text())
        names |= set(re.findall(r"\$\{(\w+)\}", text))
    return names


# ---------------------------------------------------------------- compose


@pytest.mark.parametrize("backend", sorted(STORES))
def test_each_backend_runs_its_own_store_and_grafana_follows(tmp_path: Path, backend: str) -> None:
    config = render(tmp_path, backend)
    services = config["services"]
    assert set(services) == COMMON | STORES[backend]
    other = next(name for name in STORES if name != backend)
    assert not STORES[other] & set(services), f"{backend} also runs {other}"

    grafana = services["grafana"]
    assert set(grafana["depends_on"]) == {"loki", backend}
    assert grafana["depends_on"][backend]["condition"] == "service_healthy"
    by_target = {target: source for source, target in mounts(grafana)}
    for target, source in GRAFANA_SOURCES[backend].items():
        assert Path(by_target[target]) == source, target
    env = grafana["environment"]
    provisioning = GRAFANA_SOURCES[backend]["/etc/grafana/provisioning"]
    # Every variable the backend's data sources expand is set; the InfluxDB token
    # comes from its file (the entrypoint), never from the environment.
    for name in expanded_variables(provisioning) - {"INFLUXDB_READ_TOKEN"}:
        assert env.get(name), f"{backend}: compose does not set {name} for Grafana"
    if backend == "victoriametrics":
        assert env["VICTORIAMETRICS_URL"] == "http://victoriametrics:8428"
        assert not any(name.startswith("INFLUXDB_") for name in env), env
        assert "/run/telemetry-tokens" not in by_target
        assert "INFLUXDB_READ_TOKEN" not in expanded_variables(provisioning)
    else:
        assert env["INFLUXDB_URL"] == "http://influxdb:8086"
        assert "VICTORIAMETRICS_URL" not in env
        assert by_target["/run/telemetry-tokens"] == "influxdb-tokens"


def test_victoriametrics_runs_confined_with_its_retention_and_only_vmauth_published(tmp_path: Path) -> None:
    config = render(tmp_path, "victoriametrics")
    services = config["services"]
    vm, vmauth, init = services["victoriametrics"], services["vmauth"], services["victoriametrics-volume-init"]
    for name in ("victoriametrics", "vmauth", "victoriametrics-volume-init"):
        service = services[name]
        assert service["cap_drop"] == ["ALL"], name
        assert "no-new-privileges:true" in service["security_opt"], name
        assert service["mem_limit"] and int(service["pids_limit"]) > 0, name
    # VictoriaMetrics runs as nobody with no capability, on a volume handed to it first.
    assert vm["user"] == "65534:65534" and "cap_add" not in vm
    assert init["entrypoint"] == ["chown", "-R", "65534:65534", "/victoria-metrics-data"]
    assert init["restart"] == "no" and set(init["cap_add"]) == {"CHOWN", "DAC_OVERRIDE"}
    assert vm["depends_on"]["victoriametrics-volume-init"]["condition"] == "service_completed_successfully"
    assert ("victoriametrics-data", "/victoria-metrics-data") in mounts(vm)
    assert "victoriametrics-data" in config["volumes"]
    assert "-storageDataPath=/victoria-metrics-data" in vm["command"]
    assert "-retentionPeriod=30d" in vm["command"]
    assert seconds(vm["stop_grace_period"]) >= 30
    # vmauth only reads its configuration and keys (0600, yours): DAC_READ_SEARCH and nothing else.
    assert vmauth["cap_add"] == ["DAC_READ_SEARCH"]
    assert sorted(s["source"] for s in vmauth["secrets"]) == sorted(["vmauth_config", *AUTH_KEY_FILES.values()])
    assert "-auth.config=/run/secrets/vmauth_config" in vmauth["command"]
    # Each of vmauth's own endpoints needs its key, which the flag reads from its secret file.
    for flag, name in AUTH_KEY_FILES.items():
        assert f"-{flag}=file:///run/secrets/{name}" in vmauth["command"], flag
    # VictoriaMetrics reads only the keys of its delete, snapshot, merge and flush endpoints.
    assert sorted(s["source"] for s in vm["secrets"]) == sorted(VM_KEY_FILES.values())
    for flag, name in VM_KEY_FILES.items():
        assert f"-{flag}=file:///run/secrets/{name}" in vm["command"], flag
    for name in ("victoriametrics", "vmauth"):
        test = services[name]["healthcheck"]["test"]
        assert test[0] == "CMD" and test[-1].endswith("/health"), name
        assert services[name]["restart"] == "unless-stopped", name
    # Nodes reach vmauth only; VictoriaMetrics itself is not published.
    assert "ports" not in vm
    assert [str(p) for p in vmauth["ports"]] == ["127.0.0.1:8428:8427/tcp"]
    published = [str(p) for s in services.values() for p in s.get("ports", [])]
    assert len(published) == 3 and all(p.startswith("127.0.0.1:") for p in published)

    changed = render(
        tmp_path,
        "victoriametrics",
        {"VICTORIAMETRICS_RETENTION": "90d", "VICTORIAMETRICS_MEMORY_LIMIT": "6g", "VICTORIAMETRICS_PORT": "18428"},
    )["services"]
    assert "-retentionPeriod=90d" in changed["victoriametrics"]["command"]
    assert changed["victoriametrics"]["mem_limit"] == "6g"
    assert [str(p) for p in changed["vmauth"]["ports"]] == ["127.0.0.1:18428:8427/tcp"]


def test_grafana_provisioning_of_the_two_backends_differs_only_in_the_metrics_store() -> None:
    influx = datasources(GRAFANA / "provisioning")
    vm = datasources(GRAFANA / "provisioning-victoriametrics")
    assert set(influx) == {"influxdb", "loki"}
    assert set(vm) == {"victoriametrics", "loki"}
    assert vm["loki"] == influx["loki"]
    source = vm["victoriametrics"]
    assert (source["name"], source["type"]) == ("VictoriaMetrics", "prometheus")
    assert source["url"] == "${VICTORIAMETRICS_URL}"
    assert source["isDefault"] is True and influx["influxdb"]["isDefault"] is True
    assert "secureJsonData" not in source and "basicAuth" not in source
    for directory in ("provisioning", "provisioning-victoriametrics"):
        assert yaml.safe_load((GRAFANA / directory / "datasources" / "datasources.yml").read_text())["prune"] is True
    # One dashboard provider, reading /etc/grafana/dashboards, whichever set is mounted there.
    providers = [
        yaml.safe_load((GRAFANA / d / "dashboards" / "dashboards.yml").read_text())
        for d in ("provisioning", "provisioning-victoriametrics")
    ]
    assert providers[0] == providers[1]
    assert providers[0]["providers"][0]["options"]["path"] == "/etc/grafana/dashboards"
    # Only these two directories are provisioned: nothing else under either.
    for directory in ("provisioning", "provisioning-victoriametrics"):
        assert {p.name for p in (GRAFANA / directory).iterdir()} == {"datasources", "dashboards"}


# ---------------------------------------------------------------- stack.sh


def test_victoriametrics_env_step_writes_private_random_settings_for_nodes_and_vmauth(tmp_path: Path) -> None:
    result = stack("env", tmp_path=tmp_path, METRICS_BACKEND="victoriametrics")
    assert result.returncode == 0, result.stderr
    env_file, secrets, node_env = tmp_path / "stack.env", tmp_path / "secrets", tmp_path / "node.env"
    assert stat.S_IMODE(env_file.stat().st_mode) == 0o600
    assert stat.S_IMODE(secrets.stat().st_mode) == 0o700
    assert "METRICS_BACKEND=victoriametrics" in env_file.read_text().splitlines()
    token = (secrets / "victoriametrics_node_token").read_text()
    assert len(token) == 64 and token.isalnum()
    for path in (secrets / "victoriametrics_node_token", secrets / "vmauth_config", node_env):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path.name
    assert token not in env_file.read_text()
    # The keys of vmauth's own endpoints: random, one each, 0600, in no other file.
    keys = {name: (secrets / name).read_text() for name in AUTH_KEY_FILES.values()}
    assert len(set(keys.values())) == len(keys) and all(len(k) >= 32 and k.isalnum() for k in keys.values())
    for name, key in keys.items():
        assert stat.S_IMODE((secrets / name).stat().st_mode) == 0o600, name
        for other in (env_file, node_env, secrets / "vmauth_config"):
            assert key not in other.read_text(), (name, other.name)

    # vmauth: the node token reaches the two write paths of the compose service, and only them.
    auth = yaml.safe_load((secrets / "vmauth_config").read_text())
    [user] = auth["users"]
    assert user["bearer_token"] == token
    [route] = user["url_map"]
    assert route["src_paths"] == ["/write", "/api/v2/write"]
    assert "url_prefix" not in user
    assert route["url_prefix"] == "http://victoriametrics:8428"

    # node.env: MetricsLogger's InfluxDB v2 settings, pointing at vmauth.
    settings = dict(line.split("=", 1) for line in node_env.read_text().splitlines() if not line.startswith("#"))
    assert settings == {
        "METRICS_BACKEND": "victoriametrics",
        "INFLUXDB_HOST": "127.0.0.1",
        "INFLUXDB_PORT": "8428",
        "INFLUXDB_TOKEN": token,
        "LOKI_URL": "http://127.0.0.1:3100",
    }

    # No default token: another stack gets another one; this one keeps its own.
    other = tmp_path / "other"
    other.mkdir()
    assert stack("env", tmp_path=other, METRICS_BACKEND="victoriametrics").returncode == 0
    assert (other / "secrets" / "victoriametrics_node_token").read_text() != token
    assert stack("env", tmp_path=tmp_path).returncode == 0
    assert (secrets / "victoriametrics_node_token").read_text() == token


def test_the_backend_is_kept_in_the_env_file_until_changed(tmp_path: Path) -> None:
    env_file = tmp_path / "stack.env"
    assert stack("env", tmp_path=tmp_path).returncode == 0
    assert "METRICS_BACKEND=influxdb" in env_file.read_text().splitlines()
    assert not (tmp_path / "node.env").exists()  # InfluxDB creates its node token at first start
    switched = stack("env", tmp_path=tmp_path, METRICS_BACKEND="victoriametrics")
    assert switched.returncode == 0, switched.stderr
    assert "Switched METRICS_BACKEND from influxdb to victoriametrics" in switched.stdout
    assert stack("env", tmp_path=tmp_path).returncode == 0  # not given: the kept one
    lines = env_file.read_text().splitlines()
    assert [line for line in lines if line.startswith("METRICS_BACKEND=")] == ["METRICS_BACKEND=victoriametrics"]
    assert stat.S_IMODE(env_file.stat().st_mode) == 0o600
    # An env file of an older stack.sh has no such line: it stays as it is and means influxdb.
    older = tmp_path / "older"
    older.mkdir()
    (older / "stack.env").write_text("BIND_ADDRESS=127.0.0.1\n")
    assert stack("env", tmp_path=older).returncode == 0
    assert (older / "stack.env").read_text() == "BIND_ADDRESS=127.0.0.1\n"


@pytest.mark.parametrize("how", ["env", "up", "make up", "kept in compose/.env"])
def test_a_wrong_backend_is_refused_in_one_sentence(tmp_path: Path, how: str) -> None:
    if how == "make up":
        result = subprocess.run(
            [require_binary("make"), "-s", "-C", str(ROOT), "up", "METRICS_BACKEND=prometheus"],
            capture_output=True,
            text=True,
            env=clean_env(
                STACK_ENV_FILE=str(tmp_path / "stack.env"),
                STACK_SECRETS_DIR=str(tmp_path / "secrets"),
                STACK_NODE_ENV_FILE=str(tmp_path / "node.env"),
            ),
            timeout=120,
            check=False,
        )
    elif how == "kept in compose/.env":
        (tmp_path / "stack.env").write_text("METRICS_BACKEND=prometheus\n")
        result = stack("env", tmp_path=tmp_path)
    else:
        result = stack(how, tmp_path=tmp_path, METRICS_BACKEND="prometheus")
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    if how == "make up":  # make adds its own line about the failed recipe ("make[1]: ***" under another make)
        lines = [line for line in lines if not re.match(r"make(\[\d+\])?: \*\*\*", line)]
    assert lines == ["METRICS_BACKEND must be influxdb or victoriametrics, not 'prometheus'."], result.stderr
    assert not (tmp_path / "secrets").exists()
    assert not (tmp_path / "node.env").exists()
    if how != "kept in compose/.env":
        assert not (tmp_path / "stack.env").exists()


def copy_of_the_stack(tmp_path: Path, grafana_dirs: list[str]) -> Path:
    """A checkout with compose/, versions.env and only the named grafana/ directories."""
    checkout = tmp_path / "checkout"
    shutil.copytree(COMPOSE, checkout / "compose", ignore=shutil.ignore_patterns("secrets", ".env", "node.env"))
    shutil.copy(ROOT / "versions.env", checkout / "versions.env")
    for name in grafana_dirs:
        shutil.copytree(GRAFANA / name, checkout / "grafana" / name)
    return checkout


def test_make_up_refuses_to_start_without_the_generated_grafana_files(tmp_path: Path) -> None:
    """The VictoriaMetrics dashboards and rules are generated: their absence stops `up` with one sentence."""
    env = fake_engine(tmp_path)
    (tmp_path / "stack.env").unlink()
    checkout = copy_of_the_stack(tmp_path, ["provisioning", "provisioning-victoriametrics", "alerting"])
    script = checkout / "compose" / "stack.sh"
    full = clean_env(
        STACK_ENV_FILE=str(tmp_path / "stack.env"),
        STACK_SECRETS_DIR=str(tmp_path / "secrets"),
        STACK_NODE_ENV_FILE=str(tmp_path / "node.env"),
        STACK_TIMEOUT="0",
        METRICS_BACKEND="victoriametrics",
        **env,
    )

    def up() -> subprocess.CompletedProcess[str]:
        return subprocess.run(["bash", str(script), "up"], capture_output=True, text=True, env=full, timeout=120)

    missing = up()
    assert missing.returncode != 0
    [line] = missing.stderr.strip().splitlines()
    assert line.startswith("grafana/dashboards-victoriametrics/ is missing or empty")
    assert "python -m grafana.build_dashboards" in line and "python -m grafana.build_alerting" in line
    assert not (tmp_path / "stack.env").exists()

    # With the generated files in place, compose starts the common file with the backend's.
    (checkout / "grafana" / "dashboards-victoriametrics").mkdir()
    (checkout / "grafana" / "dashboards-victoriametrics" / "system.json").write_text('{"uid": "system"}')
    no_rules = up()
    assert "grafana/alerting-victoriametrics/ is missing or empty" in no_rules.stderr
    shutil.copytree(GRAFANA / "alerting", checkout / "grafana" / "alerting-victoriametrics")
    started = up()
    assert "Timed out after 0s" in started.stderr  # the fake engine never reports a healthy service
    [compose_up] = [c for c in (tmp_path / "calls").read_text().splitlines() if c.endswith("up -d --remove-orphans")]
    compose_dir = checkout / "compose"
    assert f"-f {compose_dir}/docker-compose.yml -f {compose_dir}/docker-compose.victoriametrics.yml" in compose_up
    assert "vmauth=missing" in started.stderr and "victoriametrics=missing" in started.stderr


# An engine whose answers are enough for make backup and make restore to run through:
# a container id for `compose ps -q <service>`, "healthy" for `docker inspect`, and
# the backup tool's answer to vm-snapshot-create (the name VictoriaMetrics gave the
# snapshot, app/vmstorage/main.go); every call is recorded.
RECORDING_DOCKER = """#!/bin/sh
echo "$*" >>"$CALLS"
case "$*" in
  *"ps -q "*) for last; do :; done; echo "cid-$last" ;;
  inspect*) echo healthy ;;
  *vm-snapshot-create*) echo 20261201015627-18ECFE821D04ABCB ;;
  *vm-snapshot-delete*) echo deleted ;;
esac
exit 0
"""


def recording_engine(tmp_path: Path, backend: str) -> dict[str, str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "docker").write_text(RECORDING_DOCKER)
    (bin_dir / "docker").chmod(0o755)
    (tmp_path / "stack.env").write_text(f"METRICS_BACKEND={backend}\n")
    return {"PATH": f"{bin_dir}:{os.environ['PATH']}", "CALLS": str(tmp_path / "calls"), "STACK_TIMEOUT": "0"}


def test_make_up_refuses_a_malformed_retention_before_starting(tmp_path: Path) -> None:
    env = recording_engine(tmp_path, "victoriametrics")
    (tmp_path / "stack.env").write_text("METRICS_BACKEND=victoriametrics\nVICTORIAMETRICS_RETENTION=30 days\n")
    result = stack("up", tmp_path=tmp_path, **env)
    assert result.returncode != 0
    assert result.stderr.strip().splitlines()[-1].startswith("VICTORIAMETRICS_RETENTION=30 days in ")
    assert not any(" up -d " in c for c in (tmp_path / "calls").read_text().splitlines())


def test_make_backup_on_victoriametrics_archives_a_snapshot(tmp_path: Path) -> None:
    env = recording_engine(tmp_path, "victoriametrics")
    assert stack("env", tmp_path=tmp_path).returncode == 0  # the secrets `make up` writes
    result = stack("backup", tmp_path=tmp_path, STACK_BACKUP_DIR=str(tmp_path / "backups"), **env)
    assert result.returncode == 0, result.stderr
    calls = (tmp_path / "calls").read_text().splitlines()
    snapshot = "20261201015627-18ECFE821D04ABCB"
    key = "/run/secrets/snapshot_auth_key"
    with_key = f"--auth-key-file {key}"
    [create] = [i for i, c in enumerate(calls) if c.endswith(f"vm-snapshot-create http://127.0.0.1:8428 {with_key}")]
    [archive] = [i for i, c in enumerate(calls) if "telemetry_backup.py snapshot /victoria-metrics-data/" in c]
    [delete] = [
        i for i, c in enumerate(calls) if c.endswith(f"vm-snapshot-delete http://127.0.0.1:8428 {snapshot} {with_key}")
    ]
    assert create < archive < delete
    # The snapshot key reaches the tool as a read-only file, never as an argument.
    secret = (tmp_path / "secrets" / "victoriametrics_snapshot_auth_key").read_text()
    for call in (calls[create], calls[delete]):
        assert f"--volume {tmp_path}/secrets/victoriametrics_snapshot_auth_key:{key}:ro " in call
        assert "--network container:cid-victoriametrics " in call
    assert not any(secret in call for call in calls)
    assert calls[archive].startswith("run --rm --network none --volumes-from cid-victoriametrics ")
    archived = f"/victoria-metrics-data/snapshots/{snapshot} /backup/victoriametrics.tar.gz --follow-links"
    assert archived in calls[archive]
    assert not any("influx backup" in c for c in calls)
    [backup] = list((tmp_path / "backups").iterdir())
    manifest = (backup / "MANIFEST").read_text().splitlines()
    assert "METRICS_BACKEND=victoriametrics" in manifest
    assert f"VICTORIAMETRICS_IMAGE={versions()['VICTORIAMETRICS_IMAGE']}" in manifest
    assert not any(line.startswith("INFLUXDB_IMAGE=") for line in manifest)


def test_make_clean_volumes_removes_the_volumes_of_both_backends(tmp_path: Path) -> None:
    env = recording_engine(tmp_path, "victoriametrics")
    result = stack("clean", tmp_path=tmp_path, VOLUMES="1", **env)
    assert result.returncode == 0, result.stderr
    [down] = [c for c in (tmp_path / "calls").read_text().splitlines() if " down " in f"{c} "]
    files = [f"-f {COMPOSE}/docker-compose{suffix}.yml" for suffix in ("", ".influxdb", ".victoriametrics")]
    assert " ".join(files) in down and down.endswith("down --remove-orphans --volumes")
    # The compose files read together name every secret file: they exist.
    assert (tmp_path / "secrets" / "vmauth_config").is_file()
    assert (tmp_path / "secrets" / "influxdb_admin_token").is_file()


def victoriametrics_set(tmp_path: Path, backend: str = "victoriametrics") -> Path:
    pinned = versions()
    directory = tmp_path / "backups" / "20261201T020000Z"
    directory.mkdir(parents=True)
    for name in ("victoriametrics.tar.gz", "grafana.db", "loki.tar.gz"):
        (directory / name).write_bytes(b"")
    key = "VICTORIAMETRICS_IMAGE" if backend == "victoriametrics" else "INFLUXDB_IMAGE"
    (directory / "MANIFEST").write_text(
        f"stamp=20261201T020000Z\nMETRICS_BACKEND={backend}\n{key}={pinned[key]}\n"
        f"LOKI_IMAGE={pinned['LOKI_IMAGE']}\nGRAFANA_IMAGE={pinned['GRAFANA_IMAGE']}\n"
    )
    return directory


def test_make_restore_on_victoriametrics_replaces_its_data_while_it_is_stopped(tmp_path: Path) -> None:
    env = recording_engine(tmp_path, "victoriametrics")
    victoriametrics_set(tmp_path)
    result = stack("restore", tmp_path=tmp_path, STACK_BACKUP_DIR=str(tmp_path / "backups"), **env)
    assert result.returncode == 0, result.stderr
    calls = (tmp_path / "calls").read_text().splitlines()
    [stop] = [i for i, c in enumerate(calls) if c.endswith("stop victoriametrics")]
    [restore] = [i for i, c in enumerate(calls) if "restore-snapshot /backup/victoriametrics.tar.gz" in c]
    [start] = [i for i, c in enumerate(calls) if c.endswith("start victoriametrics")]
    assert stop < restore < start
    assert "--volumes-from cid-victoriametrics " in calls[restore]
    assert calls[restore].endswith("/victoria-metrics-data --owner 65534:65534")
    assert not any("influx restore" in c for c in calls)


@pytest.mark.parametrize(
    ("stack_backend", "set_backend"), [("victoriametrics", "influxdb"), ("influxdb", "victoriametrics")]
)
def test_make_restore_refuses_a_set_of_the_other_backend(tmp_path: Path, stack_backend: str, set_backend: str) -> None:
    env = recording_engine(tmp_path, stack_backend)
    victoriametrics_set(tmp_path, set_backend)
    result = stack("restore", tmp_path=tmp_path, STACK_BACKUP_DIR=str(tmp_path / "backups"), **env)
    assert result.returncode != 0
    [line] = result.stderr.strip().splitlines()
    assert f"was taken on METRICS_BACKEND={set_backend}, but the stack runs {stack_backend}" in line
    assert f"make up METRICS_BACKEND={set_backend}" in line
    calls = (tmp_path / "calls").read_text().splitlines() if (tmp_path / "calls").exists() else []
    assert [c for c in calls if not c.startswith(("info", "compose version"))] == []


@pytest.mark.parametrize("backend", sorted(STORES))
def test_grafana_entrypoint_reads_the_influxdb_token_only_for_its_data_source(tmp_path: Path, backend: str) -> None:
    fake_run = tmp_path / "run.sh"
    fake_run.write_text('#!/bin/sh\necho "started token=${INFLUXDB_READ_TOKEN:-none}"\n')
    fake_run.chmod(0o755)
    env = {
        "PATH": os.environ["PATH"],
        "GRAFANA_RUN": str(fake_run),
        "GF_PATHS_PROVISIONING": str(GRAFANA_SOURCES[backend]["/etc/grafana/provisioning"]),
        "INFLUXDB_READ_TOKEN_FILE": str(tmp_path / "no-such.token"),  # no InfluxDB wrote it
        "TELEMETRY_ALERTING_DIR": str(tmp_path / "no-alerting"),
    }
    result = subprocess.run(
        ["sh", str(COMPOSE / "grafana" / "entrypoint.sh")], env=env, capture_output=True, text=True, check=False
    )
    if backend == "victoriametrics":
        assert result.returncode == 0, result.stderr
        assert result.stdout.strip() == "started token=none"
    else:
        assert result.returncode == 1 and "make clean VOLUMES=1" in result.stderr


def test_grafana_entrypoint_renders_the_victoriametrics_rules_it_is_given(tmp_path: Path) -> None:
    """The compose file mounts grafana/alerting-victoriametrics where the entrypoint reads the rules."""
    fake_run = tmp_path / "run.sh"
    fake_run.write_text('#!/bin/sh\necho "provisioning=$GF_PATHS_PROVISIONING"\n')
    fake_run.chmod(0o755)
    sources = GRAFANA_SOURCES["victoriametrics"]
    env = {
        "PATH": os.environ["PATH"],
        "GRAFANA_RUN": str(fake_run),
        "GF_PATHS_PROVISIONING": str(sources["/etc/grafana/provisioning"]),
        "TELEMETRY_ALERTING_DIR": str(sources["/etc/telemetry/alerting"]),
        "TELEMETRY_PROVISIONING_DIR": str(tmp_path / "provisioning"),
        "ALERT_NODE_SILENT_STEPS": "7",
    }
    result = subprocess.run(
        ["sh", str(COMPOSE / "grafana" / "entrypoint.sh")], env=env, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
    rendered = tmp_path / "provisioning"
    assert (rendered / "datasources" / "datasources.yml").read_text() == (
        sources["/etc/grafana/provisioning"] / "datasources" / "datasources.yml"
    ).read_text()
    rules = (rendered / "alerting" / "rules.yaml").read_text()
    assert "${ALERT_" not in rules
    queried = {
        query["datasourceUid"]
        for group in yaml.safe_load(rules)["groups"]
        for rule in group["rules"]
        for query in rule["data"]
    }
    assert "victoriametrics" in queried and "influxdb" not in queried


@pytest.mark.parametrize("backend", ["influxdb", "victoriametrics"])
@pytest.mark.parametrize(
    ("env_lines", "state"), [({}, "OK"), ({"ALERT_BACKUP_NO_REPORT_STATE": "Alerting"}, "Alerting")]
)
def test_the_local_grafana_keeps_the_backup_rule_ok_without_reports(
    tmp_path: Path, backend: str, env_lines: dict[str, str], state: str
) -> None:
    """No backup timer runs on the local stack: its Grafana's environment makes the rule's no data OK
    (production keeps settings.env's Alerting), unless compose/.env asks for Alerting."""
    grafana = render(tmp_path, backend, env_lines)["services"]["grafana"]
    fake_run = tmp_path / "run.sh"
    fake_run.write_text("#!/bin/sh\necho started\n")
    fake_run.chmod(0o755)
    sources = dict((target, Path(source)) for source, target in mounts(grafana))
    env = {
        **{name: str(value) for name, value in grafana["environment"].items() if name.startswith("ALERT_")},
        "PATH": os.environ["PATH"],
        "INFLUXDB_READ_TOKEN": "read-token",
        "GRAFANA_RUN": str(fake_run),
        "GF_PATHS_PROVISIONING": str(sources["/etc/grafana/provisioning"]),
        "TELEMETRY_ALERTING_DIR": str(sources["/etc/telemetry/alerting"]),
        "TELEMETRY_PROVISIONING_DIR": str(tmp_path / "provisioning"),
    }
    result = subprocess.run(
        ["sh", str(COMPOSE / "grafana" / "entrypoint.sh")], env=env, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
    document = yaml.safe_load((tmp_path / "provisioning" / "alerting" / "rules.yaml").read_text())
    [rule] = [r for g in document["groups"] for r in g["rules"] if r["uid"] == "telemetry-backup-overdue"]
    assert rule["noDataState"] == state


# ---------------------------------------------------------------- the real write path


def flag_values(command: list[str]) -> dict[str, str]:
    return dict(str(arg).lstrip("-").split("=", 1) for arg in command)


def http(url: str, data: bytes | None = None, headers: dict[str, str] | None = None) -> tuple[int, str]:
    request = urllib.request.Request(url, data=data, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def exported(vm_url: str, match: str) -> list[dict]:
    """Series matching `match`, after making just-written samples searchable."""
    http(f"{vm_url}/internal/force_flush")
    status, body = http(f"{vm_url}/api/v1/export?" + urllib.parse.urlencode({"match[]": match}))
    assert status == 200, body
    return [json.loads(line) for line in body.splitlines() if line.strip()]


def wait_for_samples(vm_url: str, match: str, samples: int, deadline_s: float = 60) -> list[dict]:
    """The exported series once they hold `samples` samples (a loaded server takes a while)."""
    deadline = time.monotonic() + deadline_s
    while True:
        series = exported(vm_url, match)
        if sum(len(s["values"]) for s in series) >= samples or time.monotonic() > deadline:
            return series
        time.sleep(0.2)


@dataclass
class WritePath:
    """VictoriaMetrics behind vmauth as the VictoriaMetrics backend runs them, and the node's settings."""

    vm_url: str
    auth_url: str
    node: dict[str, str]  # compose/node.env as stack.sh wrote it (its port is the compose default)
    auth_keys: dict[str, str]  # the key of each of vmauth's own endpoints, by flag (AUTH_KEY_FILES)


def reads_flag_files(vmauth_binary: str) -> bool:
    """Whether this vmauth reads an -<flag>AuthKey=file://... value from the file, as tag v1.136.0 does.

    VictoriaMetrics lib/flagutil/password.go (v1.136.0) says so in each such flag's
    help; 1.79.5's flags are plain strings (lib/httpserver/httpserver.go), which
    would take "file://..." as the key itself.
    """
    help_text = subprocess.run([vmauth_binary, "-help"], capture_output=True, text=True, timeout=60).stdout
    return "-metricsAuthKey=file:///abs/path/to/file" in help_text


@contextmanager
def victoriametrics_behind_vmauth(tmp_path: Path) -> Iterator[WritePath]:
    """Debian's victoria-metrics and vmauth with the compose services' flags and stack.sh's configuration."""
    vm_binary, vmauth_binary = require_binary("victoria-metrics"), require_binary("vmauth")
    (tmp_path / "render").mkdir()
    services = render(tmp_path / "render", "victoriametrics")["services"]
    assert stack("env", tmp_path=tmp_path, METRICS_BACKEND="victoriametrics").returncode == 0
    node = dict(
        line.split("=", 1) for line in (tmp_path / "node.env").read_text().splitlines() if not line.startswith("#")
    )
    with tempfile.TemporaryDirectory(prefix="vm-backend-") as tmp:
        work = Path(tmp)
        # VictoriaMetrics: the compose command, with a local data path and a free loopback port.
        vm_flags = flag_values(services["victoriametrics"]["command"])
        assert set(vm_flags) == {"storageDataPath", "retentionPeriod", "httpListenAddr", *VM_KEY_FILES}
        vm_port = free_port()
        vm_flags.update(storageDataPath=str(work / "data"), httpListenAddr=f"127.0.0.1:{vm_port}")
        # Its endpoint keys (tests/test_victoriametrics_auth_keys.py), as for vmauth below.
        vm_from_files = reads_flag_files(vm_binary)
        for flag, name in VM_KEY_FILES.items():
            assert vm_flags[flag] == f"file:///run/secrets/{name}"
            secret = tmp_path / "secrets" / name
            vm_flags[flag] = f"file://{secret}" if vm_from_files else secret.read_text()
        vm_url = f"http://127.0.0.1:{vm_port}"
        # vmauth: the compose command and stack.sh's configuration, which names the
        # compose service (victoriametrics:8428): here it is on loopback.
        auth_flags = flag_values(services["vmauth"]["command"])
        assert set(auth_flags) == {"auth.config", "httpListenAddr", *AUTH_KEY_FILES}
        rendered = (tmp_path / "secrets" / "vmauth_config").read_text()
        assert rendered.count("http://victoriametrics:8428") == 1
        config = work / "vmauth.yml"
        config.write_text(rendered.replace("http://victoriametrics:8428", vm_url))
        auth_port = free_port()
        auth_flags.update({"auth.config": str(config), "httpListenAddr": f"127.0.0.1:{auth_port}"})
        auth_url = f"http://127.0.0.1:{auth_port}"
        # The endpoints' keys: the files stack.sh wrote, named as compose names them; a
        # release without file:// values (1.79.5) gets each file's content instead.
        from_files = reads_flag_files(vmauth_binary)
        auth_keys = {}
        for flag, name in AUTH_KEY_FILES.items():
            assert auth_flags[flag] == f"file:///run/secrets/{name}"
            secret = tmp_path / "secrets" / name
            auth_keys[flag] = secret.read_text()
            auth_flags[flag] = f"file://{secret}" if from_files else auth_keys[flag]
        vm_dir, auth_dir = work / "vm", work / "vmauth"
        vm_dir.mkdir()
        auth_dir.mkdir()
        with (
            _running([vm_binary, *(f"-{k}={v}" for k, v in vm_flags.items())], f"{vm_url}/health", vm_dir),
            _running([vmauth_binary, *(f"-{k}={v}" for k, v in auth_flags.items())], f"{auth_url}/health", auth_dir),
        ):
            yield WritePath(vm_url, auth_url, node, auth_keys)


@pytest.mark.timeout(300)
def test_the_node_token_writes_through_vmauth_and_nothing_else(tmp_path: Path, monkeypatch) -> None:
    """Debian's victoria-metrics and vmauth with the compose services' flags and stack.sh's configuration."""
    with victoriametrics_behind_vmauth(tmp_path) as path:
        vm_url, auth_url, node = path.vm_url, path.auth_url, path.node
        token = node["INFLUXDB_TOKEN"]
        auth_port = auth_url.rsplit(":", 1)[1]
        # No credential: vmauth answers 401 before anything reaches VictoriaMetrics
        # (app/vmauth/main.go: "missing `Authorization` request header" at tag v1.79.5,
        # "missing 'Authorization' request header" at v1.136.0; 401 in both).
        status, _ = http(f"{auth_url}/api/v2/write?bucket=telemetry", b"nocred,uid=1 loss=1")
        assert status == 401
        # A wrong token: refused, with the answer of one of the releases (UNKNOWN_TOKEN_ANSWERS).
        status, body = http(
            f"{auth_url}/api/v2/write?bucket=telemetry", b"wrongtoken,uid=1 loss=1", {"Authorization": "Token x"}
        )
        release = unknown_token_release(status, body)

        # The node's settings, as a node loads node.env, with vmauth's port of this test.
        for key, value in {**node, "INFLUXDB_PORT": str(auth_port)}.items():
            monkeypatch.setenv(key, value)
        logger = MetricsLogger(
            uid=7, role="miner", buffer=BufferSettings(flush_interval=0.05), self_metrics_interval=None
        )
        assert logger.api_version == 2  # /api/v2/write with "Authorization: Token <node token>"
        now = time.time_ns()
        for step in range(20):
            logger.log("vmbackend", fields={"loss": step / 10}, timestamp=now + step * 1_000_000)
        assert logger.flush(30) == 0
        assert logger.stats()["sent"] == 20
        logger.close(5)
        [series] = wait_for_samples(vm_url, "vmbackend_loss", 20)
        assert series["metric"]["uid"] == "7" and series["metric"]["role"] == "miner"
        assert sorted(series["values"]) == [step / 10 for step in range(20)]
        # VictoriaMetrics ignores the v2 org and bucket (app/vminsert/influx/request_handler.go
        # reads only db and precision): they become no label.
        assert not {"org", "bucket", "db"} & set(series["metric"])

        # The same logger with another token delivers nothing, and says so in its counters.
        monkeypatch.setenv("INFLUXDB_TOKEN", "not-the-node-token")
        stranger = MetricsLogger(uid=8, buffer=BufferSettings(flush_interval=0.05), self_metrics_interval=None)
        stranger.log("vmstranger", fields={"loss": 1.0})
        stranger.flush(30)
        stats = stranger.stats()
        stranger.close(5)
        assert stats["sent"] == 0 and stats["dropped"] == 1, stats
        # The client's last error is vmauth's answer, the same release's as above.
        status, words = UNKNOWN_TOKEN_ANSWERS[release]
        assert stats["last_error"].startswith(f"HTTP {status}: ") and words in stats["last_error"], stats
        assert exported(vm_url, '{__name__=~"(nocred|wrongtoken|vmstranger)_.*"}') == []

        # The node token may not read or delete: vmauth has no route for it
        # (400 "missing route for ...": app/vmauth/target_url.go at tag v1.79.5, main.go at v1.136.0).
        node_auth = {"Authorization": f"Token {token}"}
        for path in (
            "/api/v1/query?query=vmbackend_loss",
            "/api/v1/export?match[]=vmbackend_loss",
            "/api/v1/admin/tsdb/delete_series?match[]=vmbackend_loss",
        ):
            status, body = http(auth_url + path, headers=node_auth)
            assert status == 400 and "missing route" in body, (path, status, body)
        assert len(exported(vm_url, "vmbackend_loss")) == 1  # still there


@pytest.mark.timeout(300)
def test_vmauths_own_endpoints_refuse_anyone_without_their_key(tmp_path: Path) -> None:
    """/metrics (it names the users), /flags, /debug/pprof/ and /-/reload answer only with their own key.

    Without a key, or with another endpoint's or the node token as one: 401 in both releases,
    except /-/reload on 1.79.5, which answers 400 "invalid authKey" (app/vmauth/main.go, tag
    v1.79.5; CheckAuthFlag's 401 at v1.136.0). Every refusal names the flag that holds the key.
    """
    with victoriametrics_behind_vmauth(tmp_path) as path:
        token = path.node["INFLUXDB_TOKEN"]
        for endpoint, flag in AUTH_KEY_ENDPOINTS.items():
            others = [key for other, key in path.auth_keys.items() if other != flag]
            for query in ["", "?authKey=", f"?authKey={token}", *(f"?authKey={key}" for key in others)]:
                for headers in ({}, {"Authorization": f"Token {token}"}):
                    status, body = http(path.auth_url + endpoint + query, headers=headers)
                    refused = status == 401 or (endpoint == "/-/reload" and status == 400)
                    assert refused and f"-{flag}" in body, (endpoint, query, headers, status, body)
            status, body = http(f"{path.auth_url}{endpoint}?authKey={path.auth_keys[flag]}")
            assert status == 200, (endpoint, status, body)
        status, body = http(f"{path.auth_url}/metrics?authKey={path.auth_keys['metricsAuthKey']}")
        assert 'username="node"' in body  # what the key keeps from strangers
        # Writes still go through.
        status, _ = http(f"{path.auth_url}/api/v2/write", b"", {"Authorization": f"Token {token}"})
        assert status == 204


# ---------------------------------------------------------------- real stack


@pytest.mark.docker
@pytest.mark.timeout(900)
@pytest.mark.skipif(docker_engine() is not None, reason=str(docker_engine()))
def test_make_up_on_victoriametrics_serves_grafana_from_it(tmp_path: Path) -> None:
    ports = {"VICTORIAMETRICS_PORT": free_port(), "LOKI_PORT": free_port(), "GRAFANA_PORT": free_port()}
    env_file = tmp_path / "stack.env"
    env_file.write_text("".join(f"{k}={v}\n" for k, v in {**ports, "BIND_ADDRESS": "127.0.0.1"}.items()))
    env_file.chmod(0o600)
    make_env = clean_env(
        STACK_ENV_FILE=str(env_file),
        STACK_SECRETS_DIR=str(tmp_path / "secrets"),
        STACK_NODE_ENV_FILE=str(tmp_path / "node.env"),
        COMPOSE_PROJECT_NAME=f"telemetry-vm-test-{os.getpid()}",
    )
    make = require_binary("make")
    try:
        up = subprocess.run(
            [make, "-C", str(ROOT), "up", "METRICS_BACKEND=victoriametrics"],
            capture_output=True,
            text=True,
            env=make_env,
            timeout=600,
            check=False,
        )
        assert up.returncode == 0, up.stdout + up.stderr
        assert "The local stack is up (metrics: victoriametrics)." in up.stdout
        base = "http://127.0.0.1"
        auth_url = f"{base}:{ports['VICTORIAMETRICS_PORT']}"
        assert http_status(f"{auth_url}/health")[0] == 200
        assert http(f"{auth_url}/api/v2/write", b"nocred,uid=1 loss=1")[0] == 401
        node = dict(
            line.split("=", 1) for line in (tmp_path / "node.env").read_text().splitlines() if not line.startswith("#")
        )
        status, _ = http(f"{auth_url}/api/v2/write", b"", {"Authorization": f"Token {node['INFLUXDB_TOKEN']}"})
        assert status == 204
        password = (tmp_path / "secrets" / "grafana_admin_password").read_text()
        auth = {"Authorization": "Basic " + b64encode(f"admin:{password}".encode()).decode()}
        grafana = f"{base}:{ports['GRAFANA_PORT']}"
        for uid in ("victoriametrics", "loki"):
            status, body = http_status(f"{grafana}/api/datasources/uid/{uid}/health", auth)
            assert status == 200, (uid, body)
        assert http_status(f"{grafana}/api/datasources/uid/influxdb", auth)[0] == 404
        status, body = http_status(f"{grafana}/api/search?type=dash-db", auth)
        found = {d["uid"] for d in json.loads(body)}
        expected = {json.loads(p.read_text())["uid"] for p in (GRAFANA / "dashboards-victoriametrics").glob("*.json")}
        assert expected <= found
    finally:
        subprocess.run(
            [make, "-C", str(ROOT), "clean", "VOLUMES=1"], capture_output=True, env=make_env, timeout=300, check=False
        )
