"""make backup / make restore of the VictoriaMetrics backend, on Debian's victoria-metrics.

What `compose/stack.sh backup` does to VictoriaMetrics, step by step, without
Docker: ask the running server for a snapshot (`/snapshot/create`, answered
`{"status":"ok","snapshot":"<name>"}`: VictoriaMetrics app/vmstorage/main.go),
archive it with compose/backup/telemetry_backup.py `snapshot --follow-links`, delete
the snapshot; later, with the server stopped, `restore-snapshot` the archive over its
data directory and start it again.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from servers import _running, free_port, require_binary

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
TOOL = ROOT / "compose" / "backup" / "telemetry_backup.py"


def tool(*args: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(TOOL), *map(str, args)], capture_output=True, text=True, timeout=300, check=False
    )


def get(url: str, data: bytes | None = None) -> str:
    with urllib.request.urlopen(url, data=data, timeout=30) as response:
        return response.read().decode()


def samples(url: str, metric: str) -> list[float]:
    get(f"{url}/internal/force_flush")
    body = get(f"{url}/api/v1/export?match[]={metric}")
    return sorted(value for line in body.splitlines() if line.strip() for value in json.loads(line)["values"])


def wait_for_samples(url: str, metric: str, count: int, deadline_s: float = 60) -> list[float]:
    deadline = time.monotonic() + deadline_s
    while True:
        found = samples(url, metric)
        if len(found) >= count or time.monotonic() > deadline:
            return found
        time.sleep(0.2)


def test_a_snapshot_archived_with_its_links_followed_restores_the_data(tmp_path: Path) -> None:
    binary = require_binary("victoria-metrics")
    data = tmp_path / "data"
    archive = tmp_path / "set" / "victoriametrics.tar.gz"
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    argv = [binary, f"-storageDataPath={data}", f"-httpListenAddr=127.0.0.1:{port}", "-retentionPeriod=30d"]
    now_ms = int(time.time() * 1000)
    (tmp_path / "run1").mkdir()
    with _running(argv, f"{url}/health", tmp_path / "run1"):
        lines = "".join(f"backedup,uid=1 loss={i} {(now_ms - 60_000 + i) * 1_000_000}\n" for i in range(10))
        get(f"{url}/write", lines.encode())
        assert wait_for_samples(url, "backedup_loss", 10) == list(range(10))
        answer = json.loads(get(f"{url}/snapshot/create"))
        assert answer["status"] == "ok"
        name = answer["snapshot"]
        snapshot = data / "snapshots" / name
        # A snapshot is links into the data directory: archived as they are, they cannot be restored.
        assert any(p.is_symlink() for p in snapshot.rglob("*"))
        plain = tmp_path / "plain.tar.gz"
        assert tool("snapshot", snapshot, plain).returncode == 0
        refused = tool("restore-snapshot", plain, tmp_path / "elsewhere")
        assert refused.returncode == 1 and "refusing symbolic link out of the archive" in refused.stderr
        # With --follow-links the parts themselves are archived.
        made = tool("snapshot", snapshot, archive, "--follow-links")
        assert made.returncode == 0, made.stderr
        assert json.loads(get(f"{url}/snapshot/delete?snapshot={name}"))["status"] == "ok"
        # Written after the backup: gone after the restore.
        get(f"{url}/write", f"afterwards,uid=1 loss=1 {now_ms * 1_000_000}\n".encode())
        assert wait_for_samples(url, "afterwards_loss", 1) == [1]

    restored = tool("restore-snapshot", archive, data)
    assert restored.returncode == 0, restored.stderr
    assert not any(p.is_symlink() for p in data.rglob("*"))
    (tmp_path / "run2").mkdir()
    with _running(argv, f"{url}/health", tmp_path / "run2"):
        assert samples(url, "backedup_loss") == list(range(10))
        assert samples(url, "afterwards_loss") == []
        # The restored server takes new writes.
        get(f"{url}/write", f"afterrestore,uid=1 loss=2 {now_ms * 1_000_000}\n".encode())
        assert wait_for_samples(url, "afterrestore_loss", 1) == [2]
