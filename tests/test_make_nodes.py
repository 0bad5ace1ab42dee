"""The Makefile's node-* targets hand NODE to ansible-playbook as data, never as shell code.

A fake ansible-playbook on PATH records its arguments, so nothing is deployed.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.slow


def _make(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess, list[str]]:
    """Run `make` in the checkout with a recording ansible-playbook; its calls, one line each."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    calls = tmp_path / "calls"
    fake = bin_dir / "ansible-playbook"
    fake.write_text(f'#!/bin/sh\nprintf "%s|" "$@" >>"{calls}"\necho >>"{calls}"\n')
    fake.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    result = subprocess.run(
        ["make", "--no-print-directory", "-C", str(ROOT), *args, "ANSIBLE_ARGS="],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    lines = calls.read_text().splitlines() if calls.exists() else []
    return result, lines


@pytest.mark.parametrize("target", ["node-add", "node-rotate", "node-retire", "node-revoke", "node-credentials"])
def test_a_node_value_with_shell_characters_runs_nothing(tmp_path, target):
    marker = tmp_path / "ran"
    result, calls = _make(tmp_path, target, f"NODE=x; touch {marker}; echo")
    assert not marker.exists(), "a command in NODE was run"
    assert result.returncode != 0
    assert "NODE must be a node name" in result.stderr
    assert calls == [], "ansible-playbook ran with a refused NODE"


def test_a_node_value_with_a_space_is_refused(tmp_path):
    result, calls = _make(tmp_path, "node-credentials", "NODE=miner 07")
    assert result.returncode != 0 and calls == []


def test_a_node_name_reaches_the_play_as_one_argument(tmp_path):
    result, calls = _make(tmp_path, "node-rotate", "NODE=miner-07", "RETIRE_AFTER=2030-01-31")
    assert result.returncode == 0, result.stderr
    first = calls[0].split("|")
    assert "node=miner-07" in first and "node_action=rotate" in first
    assert "node_retire_after=2030-01-31" in first
    assert len(calls) == 3  # the node's play, site.yml, the node's credentials
