"""The backup role (backup.yml, restore.yml, site.yml's preflight) rendered, and what it renders run for real.

No Docker engine runs here, so the role renders in render-only mode; then the
rendered settings file is run by the tool itself with restic for real, and the
Docker steps it names go to a recording `docker` stand-in that models the three
commands the settings use (docs.docker.com, CLI reference):
  docker exec -e NAME CONTAINER CMD...  runs CMD in the container with NAME taken from
                                        the client's own environment ("--env": a
                                        variable without a value is passed through);
                                        here `influx backup ... /backup-staging/influxdb`
                                        writes into the host directory the influxdb role
                                        bind-mounts there
  docker pause / unpause CONTAINER      freezes / thaws every process of the container
                                        (cgroup freezer); answers with the name
"""

from __future__ import annotations

import json
import os
import secrets
import sqlite3
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from servers import require_binary

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]

STAND_IN = r"""#!/usr/bin/env python3
import json, os, sys
from pathlib import Path
args = sys.argv[1:]
with open(os.environ["DOCKER_LOG"], "a") as log:
    log.write(json.dumps({"argv": args, "env_token": os.environ.get("INFLUX_TOKEN", "")}) + "\n")
if args[0] in ("pause", "unpause"):
    print(args[1])
    sys.exit(0)
if args[0] == "exec":
    rest = args[1:]
    passed = []
    while rest[0] == "-e":
        passed.append(rest[1]); rest = rest[2:]
    container, command = rest[0], rest[1:]
    if container != "influxdb" or command[:2] != ["influx", "backup"]:
        sys.exit(f"stand-in: unexpected exec {args}")
    if "INFLUX_TOKEN" not in passed or not os.environ.get("INFLUX_TOKEN"):
        sys.exit("Error: must specify a token")
    target = Path(os.environ["STAGING_MOUNT"]) / Path(command[-1]).relative_to("/backup-staging")
    target.mkdir(parents=True, exist_ok=True)
    (target / "20260101T000000Z.manifest").write_text(json.dumps({"files": ["shard"]}))
    (target / "20260101T000000Z.s1.tar.gz").write_bytes(os.urandom(4096))
    sys.exit(0)
sys.exit(f"stand-in: unexpected docker {args}")
"""


def playbook(name: str, root: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1"}
    return subprocess.run(
        [
            "ansible-playbook",
            name,
            "-i",
            "inventory/local",
            "-e",
            "telemetry_render_only=true",
            "-e",
            f"telemetry_root={root}",
            *extra,
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


def settings(tmp_path: Path, values: dict) -> str:
    path = tmp_path / "extra-vars.json"
    path.write_text(json.dumps(values))
    path.chmod(0o600)
    return f"@{path}"


def test_backup_playbook_renders_what_the_tool_then_runs(tmp_path: Path) -> None:
    require_binary("restic")
    root = tmp_path / "root"
    base = root / "opt" / "telemetry"
    database = base / "grafana" / "data" / "grafana.db"
    database.parent.mkdir(parents=True)
    with sqlite3.connect(database) as db:
        db.execute("CREATE TABLE dashboard (uid TEXT)")
        db.execute("INSERT INTO dashboard VALUES ('d1')")
    loki = base / "loki" / "data"
    (loki / "wal").mkdir(parents=True)
    (loki / "wal" / "00000001").write_bytes(os.urandom(3000))
    tokens = base / "influxdb" / "secrets" / "nodes"
    tokens.mkdir(parents=True)
    (tokens / "miner-01.token").write_text(secrets.token_urlsafe(40))
    legacy = base / "backups"
    (legacy / "20261101T030000Z.partial").mkdir(parents=True)
    (legacy / "20261101T030000Z.partial" / "influxdb").write_bytes(os.urandom(5000))
    (legacy / "20261031T030000Z").mkdir()
    operator_token = secrets.token_urlsafe(48)
    password = secrets.token_urlsafe(32)
    values = {
        "backup_repository": str(tmp_path / "repository"),
        "backup_restic_password": password,
        "backup_opt_out": False,
        "backup_credential_paths": [str(tokens)],
        "influxdb_admin_token": operator_token,
    }
    first = playbook("backup.yml", root, "-e", settings(tmp_path, values))
    assert first.returncode == 0, first.stdout[-6000:] + first.stderr[-2000:]
    second = playbook("backup.yml", root, "-e", settings(tmp_path, values))
    assert second.returncode == 0 and "changed=0" in second.stdout, second.stdout[-4000:]

    # An earlier release's unfinished plaintext set is gone; a complete one is the operator's to delete.
    assert sorted(p.name for p in legacy.iterdir()) == ["20261031T030000Z"]
    home = root / "localhost" / "opt" / "telemetry" / "backup"
    config_file = home / "config.json"
    config = json.loads(config_file.read_text())
    assert [s["name"] for s in config["stores"]] == ["influxdb", "loki", "grafana", "credentials"]
    for path in (config_file, *(home / "secrets").iterdir()):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    assert (home / "secrets" / "restic_password").read_text() == password
    for path in (home, home / "secrets", home / "staging"):
        assert stat.S_IMODE(path.stat().st_mode) == 0o700, path
    units = root / "localhost" / "etc" / "systemd" / "system"
    timer = (units / "telemetry-backup.timer").read_text()
    assert "OnCalendar=*-*-* 03:00:00" in timer and "RandomizedDelaySec=1h" in timer and "Persistent=true" in timer
    assert "OnUnitActiveSec=15min" in (units / "telemetry-backup-report.timer").read_text()
    service = (units / "telemetry-backup.service").read_text()
    assert "-m stack_backup --config /opt/telemetry/backup/config.json run" in service
    assert "Environment=PYTHONPATH=/opt/telemetry/backup/tool" in service
    report = (units / "telemetry-backup-report.service").read_text()
    assert "--config /opt/telemetry/backup/config.json report" in report
    # No secret in the settings, the units, or any command line.
    rendered = config_file.read_text() + service + report
    assert operator_token not in rendered and password not in rendered

    # What was rendered, run: restic for real, Docker's steps by the stand-in.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "docker").write_text(STAND_IN.replace("/usr/bin/env python3", sys.executable, 1))
    (bin_dir / "docker").chmod(0o755)
    log = tmp_path / "docker.log"
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "PYTHONPATH": str(home / "tool"),
        "DOCKER_LOG": str(log),
        "STAGING_MOUNT": config["staging_dir"],
    }
    run = subprocess.run(
        [sys.executable, "-m", "stack_backup", "--config", str(config_file), "run"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    assert [c["argv"][0] for c in calls] == ["exec", "pause", "unpause"]
    assert calls[0]["env_token"] == operator_token and operator_token not in json.dumps([c["argv"] for c in calls])
    assert calls[1]["argv"] == ["pause", "loki"] and calls[2]["argv"] == ["unpause", "loki"]
    listed = subprocess.run(
        [sys.executable, "-m", "stack_backup", "--config", str(config_file), "snapshots"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    tags = {t for s in json.loads(listed.stdout) for t in s["tags"]}
    assert {t for t in tags if t.startswith("store=")} == {
        f"store={n}" for n in ("credentials", "grafana", "influxdb", "loki")
    }
    # Each snapshot carries its store's image, as versions.env pins it.
    lines = (ROOT / "versions.env").read_text().splitlines()
    pins = dict(line.split("=", 1) for line in lines if "=" in line and not line.startswith("#"))
    assert {t for t in tags if not t.startswith("store=")} == {
        f"{key}={pins[key]}" for key in ("INFLUXDB_IMAGE", "LOKI_IMAGE", "GRAFANA_IMAGE")
    }
    assert list(Path(config["staging_dir"]).iterdir()) == []

    # restore.yml renders too (nothing to stop or start in render-only mode).
    restored = playbook("restore.yml", root, "-e", settings(tmp_path, values))
    assert restored.returncode == 0, restored.stdout[-6000:] + restored.stderr[-2000:]


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (
            {"backup_opt_out": False},
            "localhost holds influxdb, loki, grafana, credentials but backup_repository is not set",
        ),
        (
            {"backup_repository": "/mnt/backup/restic", "backup_restic_password": "short"},
            "The backup settings are incomplete: backup_restic_password",
        ),
        (
            {
                "backup_repository": "/mnt/backup/restic",
                "backup_restic_password": "x" * 40,
                "backup_keep_within": "30 days",
            },
            "backup_keep_within (a restic duration",
        ),
    ],
)
def test_a_stateful_host_without_a_usable_repository_is_refused(tmp_path: Path, values: dict, message: str) -> None:
    result = playbook("backup.yml", tmp_path / "root", "-e", settings(tmp_path, values))
    assert result.returncode != 0 and message in result.stdout, result.stdout[-4000:]
    assert not (tmp_path / "root" / "localhost").exists()


def test_opting_out_warns() -> None:
    """The local inventory opts out (backup_opt_out: true): the render goes on, with a warning."""
    result = playbook("backup.yml", Path("/nonexistent-render-root"), "--check")
    assert result.returncode == 0, result.stdout[-4000:]
    assert "WARNING: backup_opt_out is true and backup_repository is empty" in result.stdout
