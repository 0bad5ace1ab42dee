"""Checks what the loki role renders in render-only mode."""

import copy
import os
import subprocess
from pathlib import Path

import yaml

ROOT = os.environ["TELEMETRY_ROOT"]
REPO = Path(os.environ["MOLECULE_PROJECT_DIRECTORY"]).resolve().parents[2]
DIR = ROOT + "/opt/telemetry/loki"


def _pinned(key):
    for line in (REPO / "versions.env").read_text().splitlines():
        if line.startswith(key + "="):
            return line.split("=", 1)[1].strip()
    raise AssertionError(f"{key} is not pinned in versions.env")


def _merge(base, override):
    merged = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def _compose(host):
    return yaml.safe_load(host.file(DIR + "/container.compose.yml").content_string)


def test_config_is_the_compose_config_with_production_values(host):
    config = host.file(DIR + "/loki.yml")
    assert config.is_file
    assert config.mode == 0o640
    assert config.user == "root"
    assert config.gid == 10001
    rendered = yaml.safe_load(config.content_string)
    base = yaml.safe_load((REPO / "compose/loki/loki.yml").read_text())
    # Production ingest limits, not the compose stack's flood-test ones.
    production = yaml.safe_load((REPO / "ansible/roles/loki/defaults/main.yml").read_text())["loki_ingestion_limits"]
    assert production["max_global_streams_per_user"] < base["limits_config"]["max_global_streams_per_user"]
    expected = _merge(
        base,
        {
            "auth_enabled": True,
            "querier": {"multi_tenant_queries_enabled": True},
            "runtime_config": {"file": "/etc/loki/overrides.yml", "period": "10s"},
            "limits_config": {**production, "retention_period": "336h", "ingestion_rate_mb": 32},
            "compactor": {"retention_enabled": True},
            "analytics": {"reporting_enabled": False},
        },
    )
    assert rendered == expected


def test_per_tenant_overrides_are_written_for_lokis_runtime_configuration(host):
    overrides = host.file(DIR + "/overrides.yml")
    assert overrides.mode == 0o640 and overrides.user == "root" and overrides.gid == 10001
    defaults = yaml.safe_load((REPO / "ansible/roles/loki/defaults/main.yml").read_text())
    # The proxy's access log (every node's requests) has its own limits; no other tenant is set here.
    assert yaml.safe_load(overrides.content_string) == {"overrides": {"_edge": defaults["loki_edge_limits"]}}


def test_data_directory_belongs_to_loki(host):
    data = host.file(DIR + "/data")
    assert data.is_directory
    assert data.uid == 10001
    assert data.mode == 0o750


def test_container_mounts_the_rendered_files(host):
    service = _compose(host)["services"]["loki"]
    assert service["image"] == _pinned("LOKI_IMAGE")
    assert service["user"] == "10001:10001"
    assert service["ports"] == ["127.0.0.1:3100:3100"]
    mounts = {m["target"]: m for m in service["volumes"]}
    assert mounts["/etc/loki/loki.yml"]["source"] == DIR + "/loki.yml"
    assert mounts["/etc/loki/loki.yml"]["read_only"] is True
    assert mounts["/etc/loki/overrides.yml"] == {
        "type": "bind",
        "source": DIR + "/overrides.yml",
        "target": "/etc/loki/overrides.yml",
        "read_only": True,
    }
    assert mounts["/loki"]["source"] == DIR + "/data"
    assert service["command"] == ["-config.file=/etc/loki/loki.yml"]
    for mount in service["volumes"]:
        assert host.file(mount["source"]).exists, mount


def test_container_is_confined_limited_and_given_time_to_flush(host):
    service = _compose(host)["services"]["loki"]
    # Loki runs as 10001 from the start: no capability is needed.
    assert service["cap_drop"] == ["ALL"]
    assert "cap_add" not in service
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
