"""Checks what the victoriametrics role renders in single mode."""

import os
import subprocess
from pathlib import Path

import yaml

ROOT = os.environ["TELEMETRY_ROOT"]
REPO = Path(os.environ["MOLECULE_PROJECT_DIRECTORY"]).resolve().parents[2]
DIR = ROOT + "/opt/telemetry/victoriametrics"


def _pinned(key):
    for line in (REPO / "versions.env").read_text().splitlines():
        if line.startswith(key + "="):
            return line.split("=", 1)[1].strip()
    raise AssertionError(f"{key} is not pinned in versions.env")


def _service(host):
    return yaml.safe_load(host.file(DIR + "/victoriametrics.compose.yml").content_string)["services"]["victoriametrics"]


def test_one_single_node_server_and_no_cluster_service(host):
    assert host.file(DIR + "/victoriametrics.compose.yml").is_file
    for component in ("vmstorage", "vminsert", "vmselect"):
        assert not host.file(f"{DIR}/{component}.compose.yml").exists


def test_flags_retention_and_loopback_port(host):
    service = _service(host)
    assert service["image"] == _pinned("VICTORIAMETRICS_IMAGE")
    assert service["command"] == [
        "-storageDataPath=/storage",
        "-retentionPeriod=90d",
        "-httpListenAddr=:8428",
        "-cacheDataPath=/cache",
        # No node listed in the scenario: the floor of the series caps (victoriametrics_min_series), a day 4x.
        "-storage.maxHourlySeries=100000",
        "-storage.maxDailySeries=400000",
        # The endpoint keys, each read from its file (defaults/main.yml).
        "-deleteAuthKey=file:///run/secrets/delete_auth_key",
        "-snapshotAuthKey=file:///run/secrets/snapshot_auth_key",
        "-forceMergeAuthKey=file:///run/secrets/force_merge_auth_key",
        "-forceFlushAuthKey=file:///run/secrets/force_flush_auth_key",
    ]
    assert service["ports"] == ["127.0.0.1:8428:8428"]


def test_container_is_confined_and_owns_its_data(host):
    service = _service(host)
    assert service["user"] == "10005:10005"
    assert service["cap_drop"] == ["ALL"]
    assert service["security_opt"] == ["no-new-privileges:true"]
    assert service["stop_grace_period"] == "60s"
    assert service["healthcheck"]["test"] == ["CMD", "wget", "-q", "-O", "/dev/null", "http://127.0.0.1:8428/health"]
    mounts = {m["target"]: m["source"] for m in service["volumes"]}
    assert mounts == {
        "/storage": DIR + "/data",
        "/cache": DIR + "/cache",
        "/run/secrets": DIR + "/secrets/victoriametrics",
    }
    for target, source in mounts.items():
        directory = host.file(source)
        assert directory.is_directory and directory.uid == 10005
        assert directory.mode == (0o700 if target == "/run/secrets" else 0o750)
    # The endpoint keys: one file each, the service's user's only, named by its flags.
    for name in ("delete", "snapshot", "force_merge", "force_flush"):
        key = host.file(f"{DIR}/secrets/victoriametrics/{name}_auth_key")
        assert key.uid == 10005 and key.mode == 0o400 and len(key.content_string) >= 32
        assert f"file:///run/secrets/{name}_auth_key" in " ".join(service["command"])


def test_compose_definition_is_valid(host):
    result = subprocess.run(
        ["docker-compose", "-f", DIR + "/victoriametrics.compose.yml", "config", "--quiet"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
