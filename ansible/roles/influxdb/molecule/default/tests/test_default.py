"""Checks what the influxdb role renders in render-only mode."""

import os
import subprocess
from pathlib import Path

import yaml

ROOT = os.environ["TELEMETRY_ROOT"]
REPO = Path(os.environ["MOLECULE_PROJECT_DIRECTORY"]).resolve().parents[2]
DIR = ROOT + "/opt/telemetry/influxdb"
# Where molecule.yml generated the test secrets.
EPHEMERAL = Path(os.environ["MOLECULE_EPHEMERAL_DIRECTORY"])
SECRETS = Path(os.environ.get("TELEMETRY_TEST_SECRETS_DIR") or EPHEMERAL / "secrets")


def _pinned(key):
    for line in (REPO / "versions.env").read_text().splitlines():
        if line.startswith(key + "="):
            return line.split("=", 1)[1].strip()
    raise AssertionError(f"{key} is not pinned in versions.env")


def _compose(host):
    return yaml.safe_load(host.file(DIR + "/container.compose.yml").content_string)


def test_directories(host):
    assert host.file(DIR).is_directory
    assert host.file(DIR).mode == 0o755
    secrets = host.file(DIR + "/secrets")
    assert secrets.is_directory
    assert secrets.mode == 0o700
    assert secrets.user == "root"


def test_container_uses_the_pinned_image(host):
    service = _compose(host)["services"]["influxdb"]
    assert service["image"] == _pinned("INFLUXDB_IMAGE")
    assert service["restart"] == "unless-stopped"


def test_container_publishes_on_loopback_only(host):
    service = _compose(host)["services"]["influxdb"]
    assert service["ports"] == ["127.0.0.1:8086:8086"]


def test_container_keeps_data_in_named_volumes(host):
    compose = _compose(host)
    service = compose["services"]["influxdb"]
    targets = {m["target"]: m for m in service["volumes"]}
    assert targets["/var/lib/influxdb2"]["type"] == "volume"
    assert targets["/etc/influxdb2"]["type"] == "volume"
    assert set(compose["volumes"]) == {"influxdb-data", "influxdb-config"}


def test_no_secret_in_the_container_environment(host):
    environment = _compose(host)["services"]["influxdb"]["environment"]
    assert environment["INFLUXD_REPORTING_DISABLED"] == "true"
    # The setup goes through the API; no password or token is handed to the container.
    assert not any("PASSWORD" in key or "TOKEN" in key for key in environment)
    text = host.file(DIR + "/container.compose.yml").content_string
    for name in ("influxdb_admin_password", "influxdb_admin_token"):
        generated = SECRETS / name
        assert generated.read_text().strip() not in text


def test_container_is_confined_limited_and_given_time_to_flush(host):
    service = _compose(host)["services"]["influxdb"]
    # The image's entrypoint chowns the data directories and drops to its user.
    assert service["cap_drop"] == ["ALL"]
    assert service["cap_add"] == ["CHOWN", "DAC_OVERRIDE", "FOWNER", "SETGID", "SETUID"]
    assert service["security_opt"] == ["no-new-privileges:true"]
    assert service["mem_limit"] == "4g"
    assert service["pids_limit"] == 1024
    assert service["stop_grace_period"] == "60s"


def test_compose_definition_is_valid(host):
    result = subprocess.run(
        ["docker-compose", "-f", DIR + "/container.compose.yml", "config", "--quiet"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
