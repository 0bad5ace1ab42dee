"""The disk check of site.yml's last play (role health), with the real `df`.

In render-only mode InfluxDB's and Loki's data directories are below the scratch
root, on one filesystem: exactly the case the check must not keep silent.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]


def health(tmp_path: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    root = tmp_path / "root"
    (root / "opt/telemetry/influxdb").mkdir(parents=True, exist_ok=True)
    (root / "opt/telemetry/loki/data").mkdir(parents=True, exist_ok=True)
    playbook = tmp_path / "health.yml"
    playbook.write_text("- hosts: localhost\n  gather_facts: false\n  roles:\n    - health\n")
    env = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1"}
    return subprocess.run(
        [
            "ansible-playbook",
            "-i",
            "inventory/local",
            "-e",
            "telemetry_render_only=true",
            "-e",
            f"telemetry_root={root}",
            *list(extra),
            str(playbook),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def df_free_percent(path: Path) -> float:
    line = subprocess.run(["df", "-P", "-B1", str(path)], capture_output=True, text=True, check=True).stdout
    fields = line.splitlines()[1].split()
    return int(fields[3]) * 100 / int(fields[1])


def test_a_shared_filesystem_is_reported_with_its_figures(tmp_path: Path) -> None:
    result = health(tmp_path)
    assert result.returncode == 0, result.stdout[-4000:]
    match = re.search(
        r"InfluxDB and Loki share (\S+) mounted on (\S+): ([\d.]+) GiB free of ([\d.]+) GiB \(([\d.]+) % free",
        result.stdout,
    )
    assert match, result.stdout[-4000:]
    assert "One full disk stops both." in result.stdout
    assert abs(float(match.group(5)) - df_free_percent(tmp_path)) < 1.0
    assert "WARNING" not in result.stdout or df_free_percent(tmp_path) < 20


def test_low_space_warns_then_fails(tmp_path: Path) -> None:
    warned = health(tmp_path, "-e", "health_disk_warn_percent=101")
    assert warned.returncode == 0
    assert "WARNING: InfluxDB and Loki share" in warned.stdout
    failed = health(tmp_path, "-e", "health_disk_fail_percent=101")
    assert failed.returncode != 0
    assert "InfluxDB's data" in failed.stdout and "% free" in failed.stdout and "GiB of" in failed.stdout
