"""versions.env is the only place an image version is written.

The local stack (compose/docker-compose.yml) and the production roles
(ansible/roles/*) must run the same images. These tests fail as soon as one of
them names an image on its own: a literal tag anywhere in compose/ or ansible/,
a compose service whose image is not a required ${..._IMAGE} expansion of a key
that versions.env sets, or a role whose *_image default does not resolve, through
Ansible itself, to the value versions.env holds.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
ROLES = ROOT / "ansible" / "roles"
# Image names the stack uses, followed by a tag: never written outside versions.env.
# (A host:port such as influxdb:8086 has no dot in its "tag".)
LITERAL_TAG = re.compile(
    r"(?<![\w/.-])(?:influxdb|grafana/loki|grafana/grafana|grafana/alloy|caddy|python|victoriametrics/[\w-]+)"
    r":(?:v?\d+\.\d+|latest\b)"
)


def versions(path: Path = ROOT / "versions.env") -> dict[str, str]:
    found = {}
    for line in path.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            key, _, value = line.partition("=")
            found[key] = value
    return found


def test_no_image_tag_is_written_outside_versions_env() -> None:
    offenders = []
    for base in (ROOT / "compose", ROOT / "ansible", ROOT / "Makefile"):
        files = [base] if base.is_file() else [p for p in base.rglob("*") if p.is_file()]
        for path in files:
            if path.suffix in {".pyc"}:
                continue
            for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
                if LITERAL_TAG.search(line):
                    offenders.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not offenders, "image tags must come from versions.env:\n" + "\n".join(offenders)


def test_every_compose_image_is_a_required_versions_env_key() -> None:
    pinned = versions()
    # The common file and each metrics backend's file (compose/stack.sh merges them).
    files = sorted((ROOT / "compose").glob("docker-compose*.yml"))
    assert {p.name for p in files} >= {
        "docker-compose.yml",
        "docker-compose.influxdb.yml",
        "docker-compose.victoriametrics.yml",
    }
    services = [
        (f"{path.name}:{name}", service)
        for path in files
        for name, service in yaml.safe_load(path.read_text())["services"].items()
        if "image" in service  # a backend file may only add to a common service
    ]
    images = {name.split(":")[1] for name, _ in services}
    assert {"influxdb", "victoriametrics", "vmauth", "loki", "grafana"} <= images
    for name, service in services:
        match = re.fullmatch(r"\$\{([A-Z_]+):\?[^}]+\}", service["image"])
        assert match, f"{name}: image {service['image']!r} is not a required ${{..._IMAGE:?}} expansion"
        assert match.group(1) in pinned, f"{name}: {match.group(1)} is not set in versions.env"


def _role_image_defaults() -> dict[str, str]:
    """{variable: raw default} of every *_image default of every role."""
    found = {}
    for defaults in sorted(ROLES.glob("*/defaults/main.yml")):
        for key, value in (yaml.safe_load(defaults.read_text()) or {}).items():
            if key.endswith("_image"):
                found[key] = str(value)
    return found


def test_every_role_image_default_is_a_versions_env_lookup() -> None:
    pinned = versions()
    defaults = _role_image_defaults()
    assert {
        "influxdb_image",
        "loki_image",
        "grafana_image",
        "reverse_proxy_image",
        "edge_audit_image",
        "victoriametrics_image",
        "victoriametrics_vmstorage_image",
        "victoriametrics_vminsert_image",
        "victoriametrics_vmselect_image",
    } <= set(defaults)
    for variable, value in defaults.items():
        match = re.search(r"lookup\('ansible\.builtin\.ini',\s*'([A-Z_]+)',\s*file=[^)]*'/versions\.env'", value)
        assert match, f"{variable} does not read versions.env: {value}"
        assert match.group(1) in pinned, f"{variable} reads {match.group(1)}, which versions.env does not set"


def _resolve_role_images(repo_root: Path, tmp_path: Path) -> dict[str, str]:
    """Each role's *_image as Ansible resolves it with telemetry_repo_root=repo_root."""
    binary = shutil.which("ansible-playbook")
    if binary is None:
        pytest.fail("ansible-playbook is not installed (pip install -e '.[dev]')")
    names = sorted(_role_image_defaults())
    playbook = tmp_path / "images.yml"
    playbook.write_text(
        yaml.safe_dump(
            [
                {
                    "name": "Resolve the image of every role",
                    "hosts": "localhost",
                    "gather_facts": False,
                    "vars_files": [str(p) for p in sorted(ROLES.glob("*/defaults/main.yml"))],
                    "tasks": [
                        {
                            "name": "Write the resolved images",
                            "ansible.builtin.copy": {
                                "content": "{{ {" + ", ".join(f"'{n}': {n}" for n in names) + "} | to_json }}",
                                "dest": str(tmp_path / "images.json"),
                                "mode": "0600",
                            },
                        }
                    ],
                }
            ]
        )
    )
    result = subprocess.run(
        [
            binary,
            "-i",
            "localhost,",
            "-c",
            "local",
            "-e",
            "ansible_python_interpreter={{ ansible_playbook_python }}",
            "-e",
            f"telemetry_repo_root={repo_root}",
            "-e",
            "role_path=/nonexistent",
            str(playbook),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    return json.loads((tmp_path / "images.json").read_text())


@pytest.mark.slow
def test_roles_resolve_the_same_images_as_compose(tmp_path: Path) -> None:
    pinned = versions()
    resolved = _resolve_role_images(ROOT, tmp_path)
    expected = {
        "influxdb_image": pinned["INFLUXDB_IMAGE"],
        "loki_image": pinned["LOKI_IMAGE"],
        "grafana_image": pinned["GRAFANA_IMAGE"],
        "reverse_proxy_image": pinned["CADDY_IMAGE"],
        "edge_audit_image": pinned["ALLOY_IMAGE"],
        "victoriametrics_image": pinned["VICTORIAMETRICS_IMAGE"],
        "victoriametrics_vmstorage_image": pinned["VMSTORAGE_IMAGE"],
        "victoriametrics_vminsert_image": pinned["VMINSERT_IMAGE"],
        "victoriametrics_vmselect_image": pinned["VMSELECT_IMAGE"],
    }
    assert {k: resolved[k] for k in expected} == expected

    # A changed versions.env changes what the roles run: the value is read, not copied.
    other = tmp_path / "checkout"
    other.mkdir()
    bumped = {key: value + "-bumped" for key, value in pinned.items()}
    (other / "versions.env").write_text("".join(f"{k}={v}\n" for k, v in bumped.items()))
    moved = _resolve_role_images(other, tmp_path)
    assert moved["loki_image"] == bumped["LOKI_IMAGE"]
    assert moved["influxdb_image"] == bumped["INFLUXDB_IMAGE"]
    assert moved["victoriametrics_vminsert_image"] == bumped["VMINSERT_IMAGE"]
    assert moved["edge_audit_image"] == bumped["ALLOY_IMAGE"]


def test_cluster_images_are_one_release_of_the_single_node() -> None:
    """vmstorage, vminsert and vmselect speak one RPC protocol: pin them to one release, the single node's."""
    pinned = versions()
    release = pinned["VICTORIAMETRICS_IMAGE"].rpartition(":")[2]
    for key in ("VMSTORAGE_IMAGE", "VMINSERT_IMAGE", "VMSELECT_IMAGE"):
        name, _, tag = pinned[key].partition(":")
        assert name == "victoriametrics/" + key.removesuffix("_IMAGE").lower(), pinned[key]
        assert tag == release + "-cluster", pinned[key]
