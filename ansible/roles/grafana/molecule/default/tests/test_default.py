"""Checks what the grafana role renders in render-only mode."""

import filecmp
import os
import re
import subprocess
from pathlib import Path

import yaml

ROOT = os.environ["TELEMETRY_ROOT"]
EPHEMERAL = Path(os.environ["MOLECULE_EPHEMERAL_DIRECTORY"])
REPO = Path(os.environ["MOLECULE_PROJECT_DIRECTORY"]).resolve().parents[2]
DIR = ROOT + "/opt/telemetry/grafana"
# Where molecule.yml generated the test secrets.
SECRETS = Path(os.environ.get("TELEMETRY_TEST_SECRETS_DIR") or EPHEMERAL / "secrets")


def _pinned(key):
    for line in (REPO / "versions.env").read_text().splitlines():
        if line.startswith(key + "="):
            return line.split("=", 1)[1].strip()
    raise AssertionError(f"{key} is not pinned in versions.env")


def _env(host):
    """The container's environment, plus what Grafana's processes read from files."""
    environment = dict(_service(host)["environment"])
    for key in [k for k in environment if k.endswith("_FILE")]:
        environment[key.removesuffix("__FILE").removesuffix("_FILE")] = "(from " + environment[key] + ")"
    return environment


def _service(host):
    compose = yaml.safe_load(host.file(DIR + "/container.compose.yml").content_string)
    return compose["services"]["grafana"]


def _generated(name):
    return (SECRETS / name).read_text().strip()


def test_secret_files_are_readable_by_grafana_only(host):
    directory = host.file(DIR + "/secrets")
    assert directory.is_directory
    assert directory.mode == 0o700
    assert directory.uid == 472
    for name, generated in (
        ("grafana_admin_password", "grafana_admin_password"),
        ("grafana_secret_key", "grafana_secret_key"),
        ("influxdb_read_token", "grafana_influxdb_token"),
    ):
        secret = host.file(f"{DIR}/secrets/{name}")
        assert secret.mode == 0o400, name
        assert secret.uid == 472 and secret.gid == 0, name
        assert secret.content_string == _generated(generated), name
    assert not host.file(DIR + "/grafana.env").exists


def test_secrets_are_files_never_environment_values(host):
    service = _service(host)
    environment = service["environment"]
    secrets = [_generated(n) for n in ("grafana_admin_password", "grafana_secret_key", "grafana_influxdb_token")]
    assert not any(secret in str(value) for value in environment.values() for secret in secrets)
    assert "env_file" not in service
    assert environment["GF_SECURITY_ADMIN_PASSWORD__FILE"] == "/run/secrets/grafana_admin_password"
    assert environment["GF_SECURITY_SECRET_KEY__FILE"] == "/run/secrets/grafana_secret_key"
    assert environment["INFLUXDB_READ_TOKEN_FILE"] == "/run/secrets/influxdb_read_token"
    mounts = {m["target"]: m for m in service["volumes"]}
    assert mounts["/run/secrets"] == {
        "type": "bind",
        "source": DIR + "/secrets",
        "target": "/run/secrets",
        "read_only": True,
    }
    # The same wrapper as the local stack turns the token file into INFLUXDB_READ_TOKEN.
    assert service["entrypoint"] == ["/bin/sh", "/etc/telemetry/grafana-entrypoint.sh"]
    assert mounts["/etc/telemetry/grafana-entrypoint.sh"]["source"] == DIR + "/entrypoint.sh"
    assert filecmp.cmp(REPO / "compose" / "grafana" / "entrypoint.sh", DIR + "/entrypoint.sh", shallow=False)


def test_environment_holds_the_settings(host):
    env = _env(host)
    assert env["GF_SERVER_ROOT_URL"] == "https://grafana.example.test/"
    assert env["GF_SECURITY_COOKIE_SECURE"] == "true"
    assert env["GF_AUTH_ANONYMOUS_ENABLED"] == "false"
    assert env["GF_USERS_ALLOW_SIGN_UP"] == "false"
    assert env["GF_SNAPSHOTS_EXTERNAL_ENABLED"] == "false"
    assert env["INFLUXDB_URL"] == "http://influxdb:8086"
    assert env["LOKI_URL"] == "http://loki:3100"
    # Every listed node's Loki tenant (its uid, else its name), the edge's and the operator login's.
    assert env["LOKI_TENANTS"] == "7|miner-02|_edge|ops-tool"
    assert all(value for value in env.values()), env.keys()


def test_secrets_stay_out_of_world_readable_files(host):
    secrets = [_generated(n) for n in ("grafana_admin_password", "grafana_secret_key", "grafana_influxdb_token")]
    for path in Path(DIR).rglob("*"):
        if path.is_file() and path.stat().st_mode & 0o044:
            text = path.read_text(errors="replace")
            assert not any(secret in text for secret in secrets), path


def test_provisioning_is_the_repository_copy(host):
    for name in ("provisioning", "dashboards", "alerting"):
        source = REPO / "grafana" / name
        deployed = Path(DIR) / name
        expected = sorted(p.relative_to(source) for p in source.rglob("*") if p.is_file())
        found = sorted(p.relative_to(deployed) for p in deployed.rglob("*") if p.is_file())
        assert found == expected
        for relative in expected:
            assert filecmp.cmp(source / relative, deployed / relative, shallow=False), relative
            assert host.file(str(deployed / relative)).mode == 0o644


def test_datasources_only_expand_variables_grafana_gets(host):
    env = _env(host)
    for path in (Path(DIR) / "provisioning" / "datasources").glob("*.yml"):
        text = re.sub(r"(?m)#.*$", "", path.read_text())
        for name in re.findall(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?", text):
            assert name in env, f"{path.name} expands ${name}, which Grafana's environment lacks"


def test_dashboard_provider_reads_the_mounted_directory(host):
    mounts = {m["target"]: m for m in _service(host)["volumes"]}
    for path in (Path(DIR) / "provisioning" / "dashboards").glob("*.yml"):
        for provider in yaml.safe_load(path.read_text())["providers"]:
            target = provider["options"]["path"]
            assert target in mounts, target
            assert mounts[target]["source"] == DIR + "/dashboards"
            assert mounts[target]["read_only"] is True
    provisioning = mounts["/etc/grafana/provisioning"]
    assert provisioning["source"] == DIR + "/provisioning"


def test_container_definition(host):
    service = _service(host)
    assert service["image"] == _pinned("GRAFANA_IMAGE")
    assert service["user"] == "472:0"
    assert service["ports"] == ["127.0.0.1:3000:3000"]
    assert service["cap_drop"] == ["ALL"]
    assert "cap_add" not in service
    assert service["security_opt"] == ["no-new-privileges:true"]
    assert service["mem_limit"] == "1g"
    assert service["pids_limit"] == 512
    for mount in service["volumes"]:
        assert host.file(mount["source"]).exists, mount
    data = host.file(DIR + "/data")
    assert data.uid == 472
    assert data.mode == 0o750


def test_compose_definition_is_valid(host):
    result = subprocess.run(
        ["docker-compose", "-f", DIR + "/container.compose.yml", "config", "--quiet"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr


def test_alerting_is_mounted_with_its_settings_and_the_webhook_as_a_secret_file(host):
    service = _service(host)
    mounts = {m["target"]: m for m in service["volumes"]}
    assert mounts["/etc/telemetry/alerting"] == {
        "type": "bind",
        "source": DIR + "/alerting",
        "target": "/etc/telemetry/alerting",
        "read_only": True,
    }
    env = service["environment"]
    assert env["ALERT_GPU_MEMORY_PERCENT"] == "97" and env["ALERT_WEBHOOK_TYPE"] == "slack"
    assert env["ALERTING_EMAIL_ADDRESSES"] == "ops@example.test"
    assert env["ALERTING_WEBHOOK_URL_FILE"] == "/run/secrets/alerting_webhook_url"
    secret = host.file(DIR + "/secrets/alerting_webhook_url")
    assert secret.content_string == "https://hooks.example.test/services/T0/B0/molecule"
    assert secret.mode == 0o400
    assert "hooks.example.test" not in str(env)
