"""VictoriaMetrics as the production metrics backend (the victoriametrics role).

- The role's `cluster` molecule scenario: three vmstorage hosts (vminsert on each,
  vmselect on two), replication factor 2, each converged into its own scratch
  root, idempotence, and the rendered flags checked against VictoriaMetrics'
  cluster documentation.
- The preflight refuses a replication factor above the number of vmstorage
  hosts, before anything is written, and says why.

Nothing here needs the network or a Docker engine.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
ROLE = REPO / "ansible" / "roles" / "victoriametrics"
OUTPUT_TAIL = 12000


def _env(**extra: str) -> dict[str, str]:
    return dict(
        os.environ,
        ANSIBLE_NOCOLOR="1",
        ANSIBLE_FORCE_COLOR="0",
        NO_COLOR="1",
        PY_COLORS="0",
        ANSIBLE_CONFIG=str(REPO / "ansible.cfg"),
        **extra,
    )


def _run(cmd: list[str], cwd: Path = REPO, timeout: int = 900, env=None) -> subprocess.CompletedProcess:
    if shutil.which(cmd[0]) is None:
        pytest.fail(f"{cmd[0]} is not installed (pip install -e '.[dev]')")
    return subprocess.run(cmd, cwd=cwd, env=env or _env(), capture_output=True, text=True, timeout=timeout, check=False)


def _assert_ok(result: subprocess.CompletedProcess) -> None:
    output = (result.stdout + "\n" + result.stderr)[-OUTPUT_TAIL:]
    assert result.returncode == 0, f"$ {' '.join(result.args)}\nexit {result.returncode}\n{output}"


@pytest.mark.timeout(900)
def test_molecule_cluster_scenario(tmp_path):
    result = _run(
        ["molecule", "test", "-s", "cluster"],
        cwd=ROLE,
        env=_env(MOLECULE_EPHEMERAL_DIRECTORY=str(tmp_path / "molecule")),
    )
    _assert_ok(result)
    output = result.stdout + result.stderr
    assert re.search(r"idempotence.*Executed: Successful", output), output[-OUTPUT_TAIL:]
    assert re.search(r"verify.*Executed: Successful", output), output[-OUTPUT_TAIL:]
    assert re.search(r"\d+ passed", output), output[-OUTPUT_TAIL:]


def _converge(tmp_path: Path, storage_hosts: int, **variables) -> subprocess.CompletedProcess:
    """The role alone, in cluster mode, on `storage_hosts` hosts rendered on this machine."""
    hosts = {f"vm-{n}": {"telemetry_private_address": f"192.0.2.{50 + n}"} for n in range(1, storage_hosts + 1)}
    inventory = {
        "all": {
            "vars": {
                "ansible_connection": "local",
                "ansible_python_interpreter": "{{ ansible_playbook_python }}",
                "telemetry_render_only": True,
                "telemetry_root": str(tmp_path / "root" / "{{ inventory_hostname }}"),
                "victoriametrics_mode": "cluster",
            },
            "children": {"vmstorage": {"hosts": hosts}},
        }
    }
    (tmp_path / "hosts.yml").write_text(yaml.safe_dump(inventory))
    playbook = tmp_path / "play.yml"
    playbook.write_text(
        "- name: Converge\n  hosts: vmstorage\n  gather_facts: false\n  roles:\n    - role: victoriametrics\n"
    )
    extra = tmp_path / "vars.json"
    extra.write_text(json.dumps(variables))
    return _run(
        ["ansible-playbook", "-i", str(tmp_path / "hosts.yml"), "-e", f"@{extra}", str(playbook)],
        env=_env(ANSIBLE_ROLES_PATH=str(ROLE.parent)),
    )


@pytest.mark.timeout(600)
def test_replication_factor_above_the_storage_hosts_is_refused(tmp_path):
    result = _converge(tmp_path, storage_hosts=2, victoriametrics_replication_factor=3)
    output = result.stdout + result.stderr
    assert result.returncode != 0, output[-OUTPUT_TAIL:]
    assert "victoriametrics_replication_factor is 3 but the cluster has 2 vmstorage host(s)" in output
    assert "writes every sample to that many distinct vmstorage nodes" in output
    assert not (tmp_path / "root").exists(), "files were rendered although the preflight failed"


@pytest.mark.timeout(600)
def test_replication_without_deduplication_is_refused(tmp_path):
    result = _converge(tmp_path, storage_hosts=3, victoriametrics_dedup_min_scrape_interval="")
    output = result.stdout + result.stderr
    assert result.returncode != 0, output[-OUTPUT_TAIL:]
    assert "counts each copy unless -dedup.minScrapeInterval is set" in " ".join(output.split())
    assert not (tmp_path / "root").exists(), "files were rendered although the preflight failed"


@pytest.mark.timeout(600)
def test_a_changed_replication_factor_recreates_vminsert_and_vmselect_only(tmp_path):
    _assert_ok(_converge(tmp_path, storage_hosts=3))
    files = sorted((tmp_path / "root").rglob("*.compose.yml"))
    before = {path: path.read_text() for path in files}
    _assert_ok(_converge(tmp_path, storage_hosts=3, victoriametrics_replication_factor=3))
    changed = sorted({path.name for path in files if path.read_text() != before[path]})
    # Each service's flags are its container's definition: only these two change.
    assert changed == ["vminsert.compose.yml", "vmselect.compose.yml"]
    assert (
        "-replicationFactor=3"
        in (tmp_path / "root" / "vm-1" / "opt/telemetry/victoriametrics/vminsert.compose.yml").read_text()
    )
