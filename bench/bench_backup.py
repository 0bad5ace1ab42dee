"""Backup and restore of a populated InfluxDB 1.6.7: restic (stack_backup) beside the old plaintext sets.

A few hundred thousand points (random values, which compress as real losses do) in one
database of Debian's influxd on loopback.
Old: `influxd backup -portable` into a set directory, plus its tar.gz (what
the old backup sets held, in full every day). New: the same staging command,
sent to a local restic repository by `python -m stack_backup run`; then a
second run after 1% more points (what a daily run costs); then the host lost
and the store restored (restic restore, `influxd restore -portable`, until
every point answers). Needs influxd and restic; figures go to docs/deployment.md.
"""

from __future__ import annotations

import json
import os
import random
import re
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from _common import ROOT

sys.path.insert(0, str(ROOT / "compose" / "backup"))
import telemetry_backup
from servers import OutageInfluxV1, require_binary
from stack_backup.space import human, tree_size

POINTS = int(os.environ.get("BENCH_BACKUP_POINTS", "300000"))
DATABASE = "bench"


def write(server: OutageInfluxV1, start: int, count: int, base_ns: int) -> None:
    batch = []
    for i in range(start, start + count):
        uid = i % 50
        value = random.random()
        batch.append(f"loss,uid={uid},role=miner value={value!r},step={i}i {base_ns + i * 10**8}")
        if len(batch) == 5000:
            urllib.request.urlopen(f"{server.url}/write?db={DATABASE}&precision=ns", "\n".join(batch).encode(), 120)
            batch = []
    if batch:
        urllib.request.urlopen(f"{server.url}/write?db={DATABASE}&precision=ns", "\n".join(batch).encode(), 120)


def count(server: OutageInfluxV1) -> int:
    series = server.query('SELECT COUNT("value") FROM "loss"', DATABASE)["results"][0].get("series", [])
    return int(series[0]["values"][0][1]) if series else 0


def stack_backup(config: Path, *args: str) -> tuple[float, subprocess.CompletedProcess[str]]:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "compose" / "backup")}
    started = time.perf_counter()
    result = subprocess.run(
        [sys.executable, "-m", "stack_backup", "--config", str(config), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=3600,
        check=False,
    )
    if result.returncode != 0:
        raise SystemExit(result.stdout + result.stderr)
    return time.perf_counter() - started, result


def main() -> None:
    influxd = require_binary("influxd")
    require_binary("restic")
    with tempfile.TemporaryDirectory(prefix="bench-backup-") as tmp:
        work = Path(tmp)
        (work / "influxd").mkdir()
        server = OutageInfluxV1(influxd, work / "influxd")
        conf = (work / "influxd" / "influxdb.conf").read_text()
        rpc = re.search(r'^bind-address = "(127\.0\.0\.1:\d+)"', conf, re.M).group(1)
        server.start()
        try:
            server.create_database(DATABASE)
            base_ns = time.time_ns() - POINTS * 10**8 - 3600 * 10**9
            write(server, 0, POINTS, base_ns)
            assert count(server) == POINTS
            data_size = tree_size(work / "influxd" / "data") + tree_size(work / "influxd" / "wal")

            # Old: a full plaintext set every time.
            started = time.perf_counter()
            old_set = work / "old" / "influxdb"
            subprocess.run(
                [influxd, "backup", "-portable", "-host", rpc, str(old_set)],
                check=True,
                capture_output=True,
                timeout=3600,
            )
            old_seconds = time.perf_counter() - started
            started = time.perf_counter()
            telemetry_backup.snapshot(old_set, work / "old" / "influxdb.tar.gz")
            tar_seconds = time.perf_counter() - started

            password = work / "password"
            password.write_text(secrets.token_urlsafe(32))
            config = work / "config.json"
            config.write_text(
                json.dumps(
                    {
                        "host": "bench",
                        "repository": str(work / "repository"),
                        "password_file": str(password),
                        "staging_dir": str(work / "backup" / "staging"),
                        "state_file": str(work / "backup" / "state.json"),
                        "lock_file": str(work / "backup" / "run.lock"),
                        "keep_within": "30d",
                        "keep_last": 7,
                        "stores": [
                            {
                                "name": "influxdb",
                                "kind": "command",
                                "size_paths": [str(work / "influxd" / "data")],
                                "argv": [influxd, "backup", "-portable", "-host", rpc, "{staging}"],
                            }
                        ],
                    }
                )
            )
            first_seconds, _ = stack_backup(config, "run")
            first_added = json.loads((work / "backup" / "state.json").read_text())["added_bytes"]
            write(server, POINTS, POINTS // 100, base_ns)
            second_seconds, _ = stack_backup(config, "run")
            second_added = json.loads((work / "backup" / "state.json").read_text())["added_bytes"]
            repository_size = tree_size(work / "repository")

            # The host is lost: restore into an empty server.
            server.stop()
            for name in ("meta", "data", "wal"):
                shutil.rmtree(work / "influxd" / name)
            server.start()
            started = time.perf_counter()
            stack_backup(config, "restore", "--store", "influxdb", "--target", str(work / "restored"))
            subprocess.run(
                [influxd, "restore", "-portable", "-host", rpc, str(work / "restored")],
                check=True,
                capture_output=True,
                timeout=3600,
            )
            expected = POINTS + POINTS // 100
            deadline = time.monotonic() + 600
            while count(server) != expected:
                if time.monotonic() > deadline:
                    raise SystemExit("the restore did not bring every point back")
                time.sleep(0.2)
            restore_seconds = time.perf_counter() - started
        finally:
            server.stop()
        print(f"InfluxDB 1.6.7, {POINTS} points (+{POINTS // 100} before the second run); data {human(data_size)}")
        print(
            f"old set: influxd backup {old_seconds:.1f} s, {human(tree_size(old_set))} plaintext; "
            f"tar.gz {tar_seconds:.1f} s, {human(tree_size(work / 'old' / 'influxdb.tar.gz'))}; "
            "a full set again each day"
        )
        print(
            f"restic:  first run {first_seconds:.1f} s, {human(first_added)} added; "
            f"second run {second_seconds:.1f} s, {human(second_added)} added; repository {human(repository_size)}"
        )
        print(f"restore: {restore_seconds:.1f} s (restic restore + influxd restore -portable, every point back)")


if __name__ == "__main__":
    main()
