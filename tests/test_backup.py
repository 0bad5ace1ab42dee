"""compose/backup/telemetry_backup.py, run for real as its callers run it.

SQLite is real here: a Grafana-shaped database written to by another process
while it is backed up, in both of SQLite's journal modes. File snapshots are of
real directories changing meanwhile. Loki's /flush cannot run here; a receiver
answers as Loki's handler does (grafana/loki pkg/ingester/flush.go,
FlushHandler: schedules the flush of every in-memory chunk and answers 204 No
Content at once; there is no other answer).
"""

from __future__ import annotations

import http.server
import os
import sqlite3
import stat
import subprocess
import sys
import tarfile
import threading
from pathlib import Path
from typing import ClassVar

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
TOOL = ROOT / "compose" / "backup" / "telemetry_backup.py"


def tool(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(TOOL), *map(str, args)], capture_output=True, text=True, timeout=300, check=False
    )


def grafana_db(path: Path, journal_mode: str) -> None:
    """The tables of Grafana's grafana.db that matter after a restore, in its shape."""
    with sqlite3.connect(path) as db:
        db.execute(f"PRAGMA journal_mode={journal_mode}")
        db.executescript(
            """
            CREATE TABLE migration_log (id INTEGER PRIMARY KEY, migration_id TEXT, success INTEGER);
            CREATE TABLE user (id INTEGER PRIMARY KEY, login TEXT UNIQUE, password TEXT, is_admin INTEGER);
            CREATE TABLE data_source (id INTEGER PRIMARY KEY, uid TEXT UNIQUE, type TEXT, secure_json_data TEXT);
            CREATE TABLE dashboard (id INTEGER PRIMARY KEY, uid TEXT UNIQUE, title TEXT, data TEXT, version INTEGER);
            CREATE TABLE dashboard_version (id INTEGER PRIMARY KEY, dashboard_id INTEGER, version INTEGER, data TEXT);
            INSERT INTO migration_log (migration_id, success) VALUES ('create user table', 1);
            INSERT INTO user (login, password, is_admin) VALUES ('admin', 'hashed', 1);
            INSERT INTO data_source (uid, type, secure_json_data) VALUES ('influxdb', 'influxdb', '{}');
            """
        )


WRITER = r"""
import sqlite3, sys, time
db = sqlite3.connect(sys.argv[1], timeout=30, isolation_level=None)
n = 0
while True:
    n += 1
    # One transaction: a new dashboard version and the dashboard pointing at it.
    # A consistent copy always has exactly one version row per dashboard version.
    db.execute("BEGIN IMMEDIATE")
    db.execute(
        "INSERT INTO dashboard (uid, title, data, version) VALUES (?, ?, ?, 1) "
        "ON CONFLICT(uid) DO UPDATE SET version = version + 1, data = excluded.data",
        (f"d{n % 50}", f"Dashboard {n % 50}", "x" * 2000),
    )
    db.execute(
        "INSERT INTO dashboard_version (dashboard_id, version, data) "
        "SELECT id, version, data FROM dashboard WHERE uid = ?",
        (f"d{n % 50}",),
    )
    db.execute("COMMIT")
    if n == 200:
        print("ready", flush=True)
"""


def consistent(path: Path) -> tuple[int, int]:
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        versions = db.execute("SELECT COALESCE(SUM(version), 0) FROM dashboard").fetchone()[0]
        rows = db.execute("SELECT COUNT(*) FROM dashboard_version").fetchone()[0]
        users = db.execute("SELECT login FROM user").fetchall()
    assert users == [("admin",)]
    return versions, rows


@pytest.mark.parametrize("journal_mode", ["delete", "wal"])
def test_sqlite_online_backup_is_one_consistent_state_while_written(tmp_path: Path, journal_mode: str) -> None:
    live = tmp_path / "grafana.db"
    grafana_db(live, journal_mode)
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(live)], stdout=subprocess.PIPE, text=True)
    try:
        assert writer.stdout is not None and writer.stdout.readline().strip() == "ready"
        backups = []
        for index in range(3):  # each while the writer commits hundreds of transactions
            destination = tmp_path / "backups" / f"{index}" / "grafana.db"
            result = tool("sqlite-backup", live, destination)
            assert result.returncode == 0, result.stderr
            backups.append(destination)
    finally:
        writer.kill()
        writer.wait()
    for destination in backups:
        versions, rows = consistent(destination)
        assert versions == rows > 0, "the copy mixes two transactions"
        assert stat.S_IMODE(destination.stat().st_mode) == 0o600
        assert not destination.with_name("grafana.db.partial").exists()
    # The live database is untouched by the backups and still consistent.
    versions, rows = consistent(live)
    assert versions == rows


def test_sqlite_restore_replaces_the_database_and_its_stale_journal(tmp_path: Path) -> None:
    backup = tmp_path / "backup.db"
    grafana_db(backup, "delete")
    with sqlite3.connect(backup) as db:
        db.execute("INSERT INTO dashboard (uid, title, data, version) VALUES ('kept', 'Kept', '{}', 3)")
    live = tmp_path / "data" / "grafana.db"
    live.parent.mkdir()
    grafana_db(live, "wal")
    with sqlite3.connect(live) as db:
        db.execute("INSERT INTO dashboard (uid, title, data, version) VALUES ('lost', 'Lost', '{}', 1)")
    (live.parent / "grafana.db-wal").write_bytes(b"stale write-ahead log of the replaced database")
    (live.parent / "grafana.db-shm").write_bytes(b"stale")
    result = tool("sqlite-restore", backup, live)
    assert result.returncode == 0, result.stderr
    with sqlite3.connect(live) as db:
        assert db.execute("SELECT uid FROM dashboard").fetchall() == [("kept",)]
    assert not (live.parent / "grafana.db-wal").exists() and not (live.parent / "grafana.db-shm").exists()
    assert stat.S_IMODE(live.stat().st_mode) == 0o600


def test_a_damaged_backup_is_never_restored(tmp_path: Path) -> None:
    live = tmp_path / "grafana.db"
    grafana_db(live, "delete")
    before = live.read_bytes()
    damaged = tmp_path / "damaged.db"
    damaged.write_bytes(b"SQLite format 3\x00" + os.urandom(4096))
    result = tool("sqlite-restore", damaged, live)
    assert result.returncode == 1
    assert result.stderr.startswith("telemetry_backup: ") and "damaged.db" in result.stderr
    assert live.read_bytes() == before
    missing = tool("sqlite-backup", tmp_path / "nothing.db", tmp_path / "out.db")
    assert missing.returncode == 1 and "does not exist" in missing.stderr


def loki_store(root: Path) -> dict[str, bytes]:
    files = {
        "chunks/fake/abc123": os.urandom(3000),
        "tsdb-shipper-active/uploader/index_20250/1-compactor.tsdb": os.urandom(500),
        "wal/00000001": os.urandom(8000),
        "compactor/deletion/delete_requests": b"",
    }
    for name, data in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return files


def test_snapshot_of_a_changing_store_restores_exactly(tmp_path: Path) -> None:
    store = tmp_path / "loki"
    files = loki_store(store)
    growing = store / "wal" / "00000002"
    growing.write_bytes(b"")
    stop = threading.Event()

    def keep_writing() -> None:  # the WAL grows and segments come and go meanwhile
        while not stop.is_set():
            with open(growing, "ab") as handle:
                handle.write(os.urandom(512))
            temporary = store / "wal" / "checkpoint.tmp"
            temporary.write_bytes(b"x")
            temporary.unlink(missing_ok=True)

    thread = threading.Thread(target=keep_writing)
    thread.start()
    try:
        archive = tmp_path / "backups" / "20260101T000000Z" / "loki.tar.gz"
        result = tool("snapshot", store, archive)
    finally:
        stop.set()
        thread.join()
    assert result.returncode == 0, result.stderr
    assert stat.S_IMODE(archive.stat().st_mode) == 0o600
    with tarfile.open(archive) as tar:
        names = set(tar.getnames())
    assert set(files) <= names

    target = tmp_path / "restored"
    (target / "stale").mkdir(parents=True)
    (target / "stale" / "old-chunk").write_bytes(b"must go")
    result = tool("restore-snapshot", archive, target, "--owner", f"{os.getuid()}:{os.getgid()}")
    assert result.returncode == 0, result.stderr
    for name, data in files.items():
        assert (target / name).read_bytes() == data, name
    assert not (target / "stale").exists()
    # The growing file was archived whole at some length, never truncated mid-write.
    restored = (target / "wal" / "00000002").read_bytes()
    assert restored == growing.read_bytes()[: len(restored)]


@pytest.mark.skipif(os.getuid() != 0, reason="only root can give files to another uid")
def test_restored_store_belongs_to_the_server_user(tmp_path: Path) -> None:
    store = tmp_path / "loki"
    loki_store(store)
    archive = tmp_path / "loki.tar.gz"
    assert tool("snapshot", store, archive).returncode == 0
    target = tmp_path / "restored"
    result = tool("restore-snapshot", archive, target, "--owner", "10001:10001")
    assert result.returncode == 0, result.stderr
    for path in [target, *target.rglob("*")]:
        assert (path.lstat().st_uid, path.lstat().st_gid) == (10001, 10001), path


def test_an_archive_reaching_outside_is_refused(tmp_path: Path) -> None:
    archive = tmp_path / "evil.tar.gz"
    payload = tmp_path / "payload"
    payload.write_bytes(b"owned")
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(payload, arcname="../escaped")
    target = tmp_path / "target"
    target.mkdir()
    (target / "kept").write_bytes(b"data")
    result = tool("restore-snapshot", archive, target)
    assert result.returncode == 1 and "outside the destination" in result.stderr
    assert not (tmp_path / "escaped").exists()
    assert (target / "kept").read_bytes() == b"data", "nothing is deleted before the archive is checked"


def test_prune_keeps_the_newest_sets_and_nothing_else_is_touched(tmp_path: Path) -> None:
    stamps = [f"202611{day:02d}T030000Z" for day in range(1, 8)]
    for stamp in stamps:
        (tmp_path / stamp).mkdir()
        (tmp_path / stamp / "grafana.db").write_bytes(b"x")
    (tmp_path / "notes.txt").write_text("operator's file")
    # A failed run's unfinished set can never be restored: it goes, however new.
    (tmp_path / "20261108T030000Z.partial").mkdir()
    (tmp_path / "20261108T030000Z.partial" / "influxdb").write_bytes(os.urandom(5000))
    (tmp_path / "notes.partial").mkdir()
    result = tool("prune", tmp_path, "--keep", "3")
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([*stamps[-3:], "notes.txt", "notes.partial"])
    assert result.stdout.count("removed ") == 5
    again = tool("prune", tmp_path, "--keep", "3")
    assert again.returncode == 0 and again.stdout == ""
    refused = tool("prune", tmp_path, "--keep", "0")
    assert refused.returncode == 1 and "--keep must be 1 or more" in refused.stderr
    assert len([p for p in tmp_path.iterdir() if p.name[0].isdigit()]) == 3


def test_stamps_sort_by_time() -> None:
    first = tool("stamp").stdout.strip()
    assert len(first) == 16 and first.endswith("Z") and first[8] == "T"


class _FlushReceiver(http.server.BaseHTTPRequestHandler):
    status = 204
    calls: ClassVar[list[tuple[str, str]]] = []

    def do_POST(self) -> None:
        type(self).calls.append((self.command, self.path))
        # Loki 3.x FlushHandler: w.WriteHeader(http.StatusNoContent), no body.
        self.send_response(self.status if self.path == "/flush" else 404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def flush_receiver():
    _FlushReceiver.calls = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _FlushReceiver)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def test_flush_posts_to_loki_and_fails_loudly(flush_receiver) -> None:
    url = f"http://127.0.0.1:{flush_receiver.server_address[1]}"
    result = tool("flush", url)
    assert result.returncode == 0, result.stderr
    assert _FlushReceiver.calls == [("POST", "/flush")]
    _FlushReceiver.status = 503
    try:
        failed = tool("flush", url + "/")
    finally:
        _FlushReceiver.status = 204
    assert failed.returncode == 1 and "HTTP 503" in failed.stderr
    closed = tool("flush", "http://127.0.0.1:9")
    assert closed.returncode == 1 and "did not answer the flush" in closed.stderr


# --- backup.yml and restore.yml parse (tests/test_backup_role.py renders them) ------


@pytest.mark.parametrize("inventory", ["inventory/local", "inventory/prod/hosts.yml"])
def test_backup_and_restore_playbooks_parse(inventory: str) -> None:
    for name in ("backup.yml", "restore.yml"):
        result = subprocess.run(
            ["ansible-playbook", "--syntax-check", "-i", inventory, name],
            cwd=ROOT,
            env={**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg")},
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert result.returncode == 0, result.stdout + result.stderr
