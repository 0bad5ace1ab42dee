"""compose/backup/stack_backup: encrypted, off-host backup runs with restic, for real.

restic is Debian's (package restic); the SFTP repository is served by Debian's
OpenSSH server on a loopback port (tests/sshd.py). The stores here are real
files, a real SQLite database and a real process frozen while its directory is
copied; the InfluxDB and VictoriaMetrics drills are in test_backup_drill.py.
"""

from __future__ import annotations

import fcntl
import json
import os
import secrets
import sqlite3
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from servers import influxdb_v1, require_binary, victoria_metrics
from sshd import sshd

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
TOOL_DIR = ROOT / "compose" / "backup"


def stack_backup(config: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """`python3 -m stack_backup --config ... <args>`, as the systemd unit runs it."""
    env = {**os.environ, "PYTHONPATH": str(TOOL_DIR)}
    return subprocess.run(
        [sys.executable, "-m", "stack_backup", "--config", str(config), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def write_config(tmp_path: Path, stores: list[dict], repository: str | None = None, **settings: object) -> Path:
    """A settings file like the role's, everything under tmp_path; a generated repository password."""
    require_binary("restic")
    password = tmp_path / "secrets" / "restic-password"
    if not password.exists():
        password.parent.mkdir(parents=True, exist_ok=True)
        password.write_text(secrets.token_urlsafe(32))
        password.chmod(0o600)
    data = {
        "host": "metrics_prod",
        "repository": str(tmp_path / "repository") if repository is None else repository,
        "password_file": str(password),
        "staging_dir": str(tmp_path / "backup" / "staging"),
        "state_file": str(tmp_path / "backup" / "state.json"),
        "lock_file": str(tmp_path / "backup" / "run.lock"),
        "keep_within": "30d",
        "keep_last": 7,
        "stores": stores,
        **settings,
    }
    path = tmp_path / "backup" / "config.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))
    path.chmod(0o600)
    return path


def credentials(tmp_path: Path, marker: str) -> tuple[list[dict], dict[str, bytes]]:
    """A files store of credentials holding marker, and what each file holds."""
    secrets_dir = tmp_path / "live" / "secrets"
    (secrets_dir / "nodes").mkdir(parents=True)
    files = {
        secrets_dir / "nodes" / "miner-01.token": f"{marker}-token".encode(),
        secrets_dir / "nodes" / "miner-01.loki-password": f"{marker}-password".encode(),
        secrets_dir / "acme.json": json.dumps({"key": marker}).encode(),
    }
    for path, data in files.items():
        path.write_bytes(data)
        path.chmod(0o600)
    store = {
        "name": "credentials",
        "kind": "files",
        "paths": [str(secrets_dir / "nodes"), str(secrets_dir / "acme.json")],
    }
    return [store], {str(p.relative_to("/")): d for p, d in files.items()}


def grafana_store(tmp_path: Path, marker: str) -> tuple[dict, Path]:
    database = tmp_path / "live" / "grafana" / "grafana.db"
    database.parent.mkdir(parents=True)
    with sqlite3.connect(database) as db:
        db.execute("PRAGMA journal_mode=wal")
        db.execute("CREATE TABLE dashboard (uid TEXT PRIMARY KEY, data TEXT)")
        db.executemany("INSERT INTO dashboard VALUES (?, ?)", [(f"d{i}", f"{marker} {i}") for i in range(200)])
    return {"name": "grafana", "kind": "sqlite", "path": str(database)}, database


WRITER = r"""
import os, sys, time
root = sys.argv[1]
n = 0
while True:
    n += 1
    with open(os.path.join(root, "wal", f"{n:08d}"), "wb") as out:
        out.write(os.urandom(256))
    with open(os.path.join(root, "zz", "index.tmp"), "w") as out:
        out.write(str(n))
    os.replace(os.path.join(root, "zz", "index.tmp"), os.path.join(root, "zz", "index"))
    if n == 1000:
        print("ready", flush=True)
    if n % 100 == 0:
        time.sleep(0.01)
"""


def files_of(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def repository_holds(repository: Path, marker: str) -> bool:
    needle = marker.encode()
    return any(needle in p.read_bytes() for p in repository.rglob("*") if p.is_file())


def test_a_run_stages_each_store_consistently_and_the_repository_is_encrypted(tmp_path: Path) -> None:
    marker = f"MARKER{secrets.token_hex(8)}"
    stores, credential_files = credentials(tmp_path, marker)
    grafana, database = grafana_store(tmp_path, marker)
    # A "Loki" that keeps writing: frozen (SIGSTOP, as docker pause freezes a container) while copied.
    loki_dir = tmp_path / "live" / "loki"
    (loki_dir / "wal").mkdir(parents=True)
    (loki_dir / "zz").mkdir()
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(loki_dir)], stdout=subprocess.PIPE, text=True)
    try:
        assert writer.stdout is not None and writer.stdout.readline().strip() == "ready"
        loki = {
            "name": "loki",
            "kind": "paused-copy",
            "data_dir": str(loki_dir),
            "pause": ["kill", "-STOP", str(writer.pid)],
            "resume": ["kill", "-CONT", str(writer.pid)],
        }
        config = write_config(tmp_path, [*stores, grafana, loki])
        result = stack_backup(config, "run")
        assert result.returncode == 0, result.stdout + result.stderr
        # Thawed again: it keeps writing.
        count = len(list((loki_dir / "wal").iterdir()))
        deadline = time.monotonic() + 60
        while len(list((loki_dir / "wal").iterdir())) == count:
            assert time.monotonic() < deadline, "the server stayed frozen after the backup"
            time.sleep(0.05)
    finally:
        writer.kill()
        writer.wait()

    repository = tmp_path / "repository"
    assert (repository / "config").is_file()
    assert not repository_holds(repository, marker), "a secret is readable in the repository"
    staging = tmp_path / "backup" / "staging"
    assert list(staging.iterdir()) == [] and stat.S_IMODE(staging.stat().st_mode) == 0o700
    state = json.loads((tmp_path / "backup" / "state.json").read_text())
    assert stat.S_IMODE((tmp_path / "backup" / "state.json").stat().st_mode) == 0o600
    assert state["last_run_ok"] is True and state["last_success"] >= state["installed"] > 0
    assert state["added_bytes"] > 0 and set(state["stores"]) == {"credentials", "grafana", "loki"}
    snapshots = json.loads(stack_backup(config, "snapshots").stdout)
    assert sorted(tag for s in snapshots for tag in s["tags"]) == ["store=credentials", "store=grafana", "store=loki"]
    assert {s["hostname"] for s in snapshots} == {"metrics_prod"}

    # Each store comes back exactly.
    restored = tmp_path / "restored"
    for name in ("credentials", "grafana", "loki"):
        result = stack_backup(config, "restore", "--store", name, "--target", str(restored / name))
        assert result.returncode == 0, result.stderr
    assert files_of(restored / "credentials") == credential_files
    token = restored / "credentials" / next(iter(credential_files))
    assert stat.S_IMODE(token.stat().st_mode) == 0o600
    with sqlite3.connect(restored / "grafana" / "grafana.db") as db:
        assert db.execute("SELECT COUNT(*) FROM dashboard").fetchone() == (200,)
    copy = restored / "loki"
    # One moment: the index names the newest WAL segment of the copy (or the one before, when
    # frozen between the two writes). Copied while written, the index (copied after the WAL)
    # would name segments the copy does not have.
    segments = sorted(int(p.name) for p in (copy / "wal").iterdir())
    assert segments == list(range(1, len(segments) + 1))
    assert int((copy / "zz" / "index").read_text()) in (segments[-1], segments[-1] - 1)
    assert database.exists()


def test_sftp_repository_on_a_loopback_sshd_holds_only_ciphertext(tmp_path: Path) -> None:
    marker = f"MARKER{secrets.token_hex(8)}"
    stores, credential_files = credentials(tmp_path, marker)
    remote = tmp_path / "remote" / "restic"
    with sshd(tmp_path / "sshd") as server:
        config = write_config(
            tmp_path,
            stores,
            repository=server.repository(remote),
            restic_options=[f"sftp.command={server.ssh_command}"],
        )
        first = stack_backup(config, "run")
        assert first.returncode == 0, first.stdout + first.stderr
        assert "created the restic repository" in first.stdout
        second = stack_backup(config, "run")
        assert second.returncode == 0, second.stdout + second.stderr
        assert "created the restic repository" not in second.stdout
        result = stack_backup(config, "restore", "--store", "credentials", "--target", str(tmp_path / "back"))
        assert result.returncode == 0, result.stderr
    assert files_of(tmp_path / "back") == credential_files
    assert (remote / "config").is_file() and len(list((remote / "snapshots").iterdir())) == 2
    assert not repository_holds(remote, marker)
    # Nothing changed between the runs: the second one added (almost) nothing.
    state = json.loads((tmp_path / "backup" / "state.json").read_text())
    assert state["added_bytes"] < 4096


def test_free_space_is_checked_before_staging_with_the_figures(tmp_path: Path) -> None:
    stores, _ = credentials(tmp_path, "x")
    grafana, _ = grafana_store(tmp_path, "x")
    config = write_config(tmp_path, [grafana, *stores], space_reserve_bytes=10**18)
    result = stack_backup(config, "run")
    assert result.returncode == 1
    assert "not staging grafana: it needs about" in result.stderr and "TiB" in result.stderr
    assert "free" in result.stderr and "not staging credentials" in result.stderr
    assert list((tmp_path / "backup" / "staging").iterdir()) == []
    state = json.loads((tmp_path / "backup" / "state.json").read_text())
    assert state["last_run_ok"] is False and state["last_success"] == 0.0
    assert "not staging grafana" in state["last_error"]
    assert json.loads(stack_backup(config, "snapshots").stdout) == []


def test_a_failed_store_leaves_no_staging_and_leftovers_of_earlier_runs_go(tmp_path: Path) -> None:
    stores, _ = credentials(tmp_path, "x")
    failing = {
        "name": "influxdb",
        "kind": "command",
        "argv": [
            "sh",
            "-c",
            'head -c 100000 /dev/urandom > "$1/part" && echo "backup API refused" >&2 && exit 4',
            "sh",
            "{staging}",
        ],
    }
    config = write_config(tmp_path, [failing, *stores])
    staging = tmp_path / "backup" / "staging"
    (staging / "influxdb").mkdir(parents=True)
    (staging / "influxdb" / "killed-midway").write_bytes(os.urandom(10000))
    (staging / "victoriametrics.partial").mkdir()
    result = stack_backup(config, "run")
    assert result.returncode == 1
    assert "removed what an earlier run left" in result.stdout and "victoriametrics.partial" in result.stdout
    assert "influxdb: the backup command failed (exit 4): backup API refused" in result.stderr
    assert list(staging.iterdir()) == []
    state = json.loads((tmp_path / "backup" / "state.json").read_text())
    # The other store was still backed up; the run failed, so last_success did not move.
    assert state["stores"]["credentials"]["ok"] is True and state["stores"]["influxdb"]["ok"] is False
    assert state["last_run_ok"] is False and state["last_success"] == 0.0


def test_retention_keeps_the_newest_per_store_and_prunes(tmp_path: Path) -> None:
    stores, _ = credentials(tmp_path, "x")
    changing = tmp_path / "live" / "secrets" / "nodes" / "miner-01.token"
    config = write_config(tmp_path, stores, keep_within="0d", keep_last=2)
    for n in range(3):
        changing.write_bytes(os.urandom(2000 + n))
        result = stack_backup(config, "run")
        assert result.returncode == 0, result.stdout + result.stderr
    snapshots = json.loads(stack_backup(config, "snapshots").stdout)
    assert len(snapshots) == 2
    restored = tmp_path / "restored"
    assert stack_backup(config, "restore", "--store", "credentials", "--target", str(restored)).returncode == 0
    assert (restored / changing.relative_to("/")).read_bytes() == changing.read_bytes()


def test_a_second_run_waits_for_nothing_and_refuses_while_one_holds_the_lock(tmp_path: Path) -> None:
    stores, _ = credentials(tmp_path, "x")
    config = write_config(tmp_path, stores)
    lock = tmp_path / "backup" / "run.lock"
    with lock.open("w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        held.write("4242\n")
        held.flush()
        result = stack_backup(config, "run")
    assert result.returncode == 3
    assert f"another backup run holds {lock} (pid 4242)" in result.stderr
    assert not (tmp_path / "repository").exists()
    assert stack_backup(config, "run").returncode == 0


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"keep_within": "30 days"}, "keep_within '30 days' must be a restic duration"),
        ({"keep_last": 0}, "keep_last must be 1 or more"),
        ({"repository": ""}, "repository is required"),
        ({"staging_dir": "/"}, "staging_dir / must be an absolute path of its own"),
        ({"stores": [{"name": "influxdb", "kind": "tar"}]}, "stores[0].kind 'tar' must be one of"),
        ({"stores": [{"name": "grafana", "kind": "sqlite"}]}, "stores[0] (grafana): path is required"),
        ({"report": {"url": "influx:8086"}}, "report.url 'influx:8086' must be an http:// or https:// URL"),
        ({"space_margin": "lots"}, "space_margin must be a number, not 'lots'"),
        ({"space_reserve_bytes": 1.5}, "space_reserve_bytes must be a whole number, not 1.5"),
        ({"space_reserve_bytes": -1}, "space_reserve_bytes must be 0 or more"),
        ({"report": {"timeout_seconds": True}}, "report.timeout_seconds must be a number, not True"),
        ({"report": {"timeout_seconds": 0}}, "report.timeout_seconds must be more than 0"),
        ({"keep_last": "7"}, "keep_last must be a whole number, not '7'"),
        ({"space_margin": float("nan")}, "space_margin must be a number, not nan"),
        ({"restic": 7}, "restic must be a string, not 7"),
        ({"report": {"url": 8086}}, "report.url must be a string, not 8086"),
    ],
)
def test_a_wrong_setting_is_named_before_anything_runs(tmp_path: Path, change: dict, message: str) -> None:
    stores, _ = credentials(tmp_path, "x")
    settings = dict(change)
    config = write_config(tmp_path, settings.pop("stores", stores), **settings)
    result = stack_backup(config, "run")
    assert result.returncode == 1 and message in result.stderr, result.stderr
    assert not (tmp_path / "backup" / "staging").exists()


@pytest.mark.parametrize("saved", ["{not json", "[]", '{"installed": "yesterday"}', '{"last_run_ok": 1}'])
def test_an_unusable_state_file_is_named_by_report_and_run(tmp_path: Path, saved: str) -> None:
    stores, _ = credentials(tmp_path, "x")
    config = write_config(tmp_path, stores)
    state_file = tmp_path / "backup" / "state.json"
    state_file.write_text(saved)
    for command in ("report", "run"):
        result = stack_backup(config, command)
        assert result.returncode == 1, result.stderr
        assert f"the state file {state_file} is unusable" in result.stderr and "move it aside" in result.stderr
        assert "Traceback" not in result.stderr
    assert state_file.read_text() == saved  # left for the operator to look at


def test_an_unusable_state_file_still_reports_a_failing_point_that_ages(tmp_path: Path, monkeypatch) -> None:
    """Runs stop writing the file, so the point's age, counted from its last change, reaches the overdue alert."""
    monkeypatch.syspath_prepend(str(TOOL_DIR))
    from stack_backup import config as settings
    from stack_backup import run, state

    stores, _ = credentials(tmp_path, "x")
    config = settings.load(write_config(tmp_path, stores, report={"url": "http://127.0.0.1:9/write"}))
    config.state_file.write_text("{not json")
    os.utime(config.state_file, (1_000.0, 1_000.0))
    written: list[str] = []
    monkeypatch.setattr(state, "write_metric", lambda report, line: written.append(line))
    with pytest.raises(state.StateError, match="is unusable"):
        run.report(config, now=101_000.0)
    assert written == [
        "stack_backup,host=metrics_prod last_success=0.0,age_seconds=100000.0,last_run_ok=0i,"
        "last_duration_seconds=0.0,added_bytes=0i 101000000000000\n"
    ]


def test_a_repository_password_is_never_printed(tmp_path: Path) -> None:
    stores, _ = credentials(tmp_path, "x")
    config = write_config(tmp_path, stores, repository="rest:https://backup:s3@cr3t@127.0.0.1:9/metrics_prod/")
    result = stack_backup(config, "check-config")
    assert result.returncode == 0, result.stderr
    assert "rest:https://backup:***@127.0.0.1:9/metrics_prod/" in result.stdout
    assert "cr3t" not in result.stdout + result.stderr


def test_a_missing_password_file_fails_the_run_and_says_so(tmp_path: Path) -> None:
    stores, _ = credentials(tmp_path, "x")
    config = write_config(tmp_path, stores)
    (tmp_path / "secrets" / "restic-password").unlink()
    result = stack_backup(config, "run")
    assert result.returncode == 1 and "restic-password does not exist" in result.stderr


def test_the_metric_reaches_influxdb_1_and_victoriametrics(tmp_path: Path) -> None:
    """The stack_backup point as metric-contract.md fixes it, on real servers of both backends."""
    stores, _ = credentials(tmp_path, "x")
    with influxdb_v1() as influx, victoria_metrics("-search.latencyOffset=0s") as victoria:
        influx.create_database("backups")
        config = write_config(tmp_path, stores, report={"url": f"{influx.url}/write?db=backups&precision=ns"})
        never = stack_backup(config, "report")
        assert never.returncode == 0, never.stderr
        assert never.stdout.startswith("stack_backup,host=metrics_prod last_success=0.0,age_seconds=")
        assert ",last_run_ok=0i," in never.stdout and ",added_bytes=0i " in never.stdout
        result = stack_backup(config, "run")
        assert result.returncode == 0, result.stdout + result.stderr
        rows = influx.rows("SELECT * FROM stack_backup ORDER BY time", "backups")
        assert len(rows) == 2 and {r["host"] for r in rows} == {"metrics_prod"}
        state = json.loads((tmp_path / "backup" / "state.json").read_text())
        assert rows[0]["last_success"] == 0 and rows[0]["last_run_ok"] == 0
        assert rows[1]["last_success"] == pytest.approx(state["last_success"])
        assert rows[1]["last_run_ok"] == 1 and rows[1]["added_bytes"] == state["added_bytes"] > 0
        assert 0 <= rows[1]["age_seconds"] < 600 and rows[1]["last_duration_seconds"] > 0

        config = write_config(tmp_path, stores, report={"url": f"{victoria.url}/write"})
        assert stack_backup(config, "report").returncode == 0
        series = victoria.wait_for_series("stack_backup_age_seconds", 1)
        assert [s["metric"] for s in series] == [{"__name__": "stack_backup_age_seconds", "host": "metrics_prod"}]
        assert victoria.wait_for_series('stack_backup_last_run_ok{host="metrics_prod"}', 1)[0]["values"] == [1]

    # The metrics store is down: the backup stands, the exit status says the report failed.
    config = write_config(tmp_path, stores, report={"url": f"{influx.url}/write?db=backups&u=ops&p=secretvalue"})
    result = stack_backup(config, "run")
    assert result.returncode == 2 and "did not take the stack_backup metric" in result.stderr
    assert "secretvalue" not in result.stderr


def test_one_store_before_an_image_change_leaves_the_state_of_complete_runs(tmp_path: Path) -> None:
    stores, _ = credentials(tmp_path, "x")
    grafana, _ = grafana_store(tmp_path, "x")
    config = write_config(tmp_path, [grafana, *stores])
    result = stack_backup(config, "run", "--store", "grafana")
    assert result.returncode == 0, result.stdout + result.stderr
    snapshots = json.loads(stack_backup(config, "snapshots").stdout)
    assert [s["tags"] for s in snapshots] == [["store=grafana"]]
    state = json.loads((tmp_path / "backup" / "state.json").read_text())
    assert state["last_success"] == 0.0 and state["last_run"] == 0.0 and state["installed"] > 0
    unknown = stack_backup(config, "run", "--store", "loki")
    assert unknown.returncode == 1 and "no store named loki" in unknown.stderr


def test_put_back_replaces_a_store_and_fill_missing_keeps_newer_credentials(tmp_path: Path) -> None:
    stores, _ = credentials(tmp_path, "x")
    config = write_config(tmp_path, stores)
    assert stack_backup(config, "run").returncode == 0
    live = tmp_path / "live" / "secrets" / "nodes"
    (live / "miner-01.token").write_text("rotated since the backup")
    (live / "miner-01.loki-password").unlink()
    restored = tmp_path / "restored"
    assert stack_backup(config, "restore", "--store", "credentials", "--target", str(restored)).returncode == 0
    filled = stack_backup(config, "fill-missing", "--source", str(restored))
    assert filled.returncode == 0 and filled.stdout.count("restored ") == 1
    assert (live / "miner-01.token").read_text() == "rotated since the backup"
    assert (live / "miner-01.loki-password").read_bytes() == b"x-password"

    store = tmp_path / "store"
    (store / "stale").mkdir(parents=True)
    (store / "stale" / "chunk").write_bytes(b"old")
    put = stack_backup(config, "put-back", "--source", str(restored), "--target", str(store))
    assert put.returncode == 0, put.stderr
    assert files_of(store) == files_of(restored) and not (store / "stale").exists()
    empty = tmp_path / "empty"
    empty.mkdir()
    refused = stack_backup(config, "put-back", "--source", str(empty), "--target", str(store))
    assert refused.returncode == 1 and "refusing to replace" in refused.stderr
    assert files_of(store) == files_of(restored)


def test_a_snapshot_of_another_image_is_refused_before_anything_is_restored(tmp_path: Path) -> None:
    grafana, _ = grafana_store(tmp_path, "x")
    grafana["tags"] = ["GRAFANA_IMAGE=grafana/grafana:12.0.0"]
    config = write_config(tmp_path, [grafana])
    assert stack_backup(config, "run").returncode == 0
    target = tmp_path / "restored"
    refused = stack_backup(
        config,
        "restore",
        "--store",
        "grafana",
        "--target",
        str(target),
        "--expect-tag=GRAFANA_IMAGE=grafana/grafana:13.0.0",
    )
    assert refused.returncode == 1 and "was taken with GRAFANA_IMAGE=grafana/grafana:12.0.0" in refused.stderr
    assert not target.exists()
    same = stack_backup(
        config,
        "restore",
        "--store",
        "grafana",
        "--target",
        str(target),
        "--expect-tag=GRAFANA_IMAGE=grafana/grafana:12.0.0",
    )
    assert same.returncode == 0 and (target / "grafana.db").is_file()
    missing = stack_backup(config, "restore", "--store", "loki", "--target", str(tmp_path / "none"))
    assert missing.returncode == 1 and "no snapshot latest of loki from metrics_prod" in missing.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="giving files another owner needs root, as the backup timer has")
def test_restored_credentials_keep_their_owner_and_mode(tmp_path: Path) -> None:
    """A credential comes back owned by its server's user, in a directory as private as before.

    Caddy and vmauth run as users of their own: a secret restored as root's, or into
    a directory root made, is one they cannot read.
    """
    owner = (4242, 4343)
    stores, _ = credentials(tmp_path, "x")
    nodes = tmp_path / "live" / "secrets" / "nodes"
    nodes.chmod(0o750)
    for path in (nodes, *nodes.iterdir()):
        os.chown(path, *owner)
    config = write_config(tmp_path, stores)
    assert stack_backup(config, "run").returncode == 0
    token = (nodes / "miner-01.token").read_bytes()
    for path in nodes.iterdir():
        path.unlink()
    nodes.rmdir()
    restored = tmp_path / "restored"
    assert stack_backup(config, "restore", "--store", "credentials", "--target", str(restored)).returncode == 0
    filled = stack_backup(config, "fill-missing", "--source", str(restored))
    assert filled.returncode == 0, filled.stderr
    assert (nodes / "miner-01.token").read_bytes() == token
    for path, mode in ((nodes, 0o750), (nodes / "miner-01.token", 0o600), (nodes / "miner-01.loki-password", 0o600)):
        status = path.stat()
        assert (status.st_uid, status.st_gid, stat.S_IMODE(status.st_mode)) == (*owner, mode), path
