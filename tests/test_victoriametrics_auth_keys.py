"""VictoriaMetrics' destructive and heavy endpoints answer only with their keys.

Debian's victoria-metrics (1.79.5) runs with the key flags that the victoriametrics
role and the local stack's compose file render, and refuses delete_series,
/snapshot/*, force_merge and force_flush without the key, and does them with it.
The pinned v1.136.0 reads a flag's value from file:///... (lib/flagutil/password.go);
1.79.5 takes the value itself, so there the test hands it the file's contents.
The backup tool's snapshot commands and the force-flush of the simulator and of the
test helper send the key.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import yaml
from servers import require_binary, victoria_metrics
from test_compose import BACKEND_FILES, COMPOSE_FILE, clean_env, write_secrets
from test_victoriametrics_deploy import AUTH_KEYS, REPO, ROLE, _assert_ok, _converge, _env, _run

from simulator import victoria as vm

pytestmark = pytest.mark.slow

TOOL = REPO / "compose" / "backup" / "telemetry_backup.py"
# Flag -> the file name of its key, as the role and the compose file name them.
ROLE_FILES = {
    "deleteAuthKey": "delete_auth_key",
    "snapshotAuthKey": "snapshot_auth_key",
    "forceMergeAuthKey": "force_merge_auth_key",
    "forceFlushAuthKey": "force_flush_auth_key",
}
COMPOSE_FILES = {flag: f"victoriametrics_{name}" for flag, name in ROLE_FILES.items()}


def _auth_flags(command: list[str]) -> dict[str, str]:
    """The -<name>AuthKey=<value> flags of a command line, by name."""
    flags = dict(arg.lstrip("-").split("=", 1) for arg in command if "=" in arg)
    return {name: value for name, value in flags.items() if name.endswith("AuthKey")}


def _for_debian(flags: dict[str, str], secrets_dir: Path) -> tuple[list[str], dict[str, str]]:
    """The flags as Debian's 1.79.5 takes them (the key itself), and each key by flag."""
    keys = {}
    for name, value in flags.items():
        assert value.startswith("file:///run/secrets/"), (name, value)
        keys[name] = (secrets_dir / value.removeprefix("file:///run/secrets/")).read_text().strip()
    return [f"-{name}={key}" for name, key in keys.items()], keys


def _render_single(tmp_path: Path) -> Path:
    """The role in single mode, rendered; returns its directory."""
    inventory = {
        "all": {
            "vars": {
                "ansible_connection": "local",
                "ansible_python_interpreter": "{{ ansible_playbook_python }}",
                "telemetry_render_only": True,
                "telemetry_root": str(tmp_path / "root"),
            },
            "children": {"victoriametrics": {"hosts": {"vm": {}}}},
        }
    }
    (tmp_path / "hosts.yml").write_text(yaml.safe_dump(inventory))
    playbook = tmp_path / "play.yml"
    playbook.write_text("- name: Render\n  hosts: victoriametrics\n  gather_facts: false\n  roles: [victoriametrics]\n")
    extra = tmp_path / "vars.json"
    extra.write_text(json.dumps(AUTH_KEYS))
    extra.chmod(0o600)
    argv = ["ansible-playbook", "-i", str(tmp_path / "hosts.yml"), "-e", f"@{extra}", str(playbook)]
    result = _run(argv, env=_env(ANSIBLE_ROLES_PATH=str(ROLE.parent)))
    _assert_ok(result)
    return tmp_path / "root" / "opt" / "telemetry" / "victoriametrics"


def _call(url: str, path: str, key: str | None = None) -> tuple[int, str]:
    """POST `path`, with the key as the authKey form argument when given."""
    data = urllib.parse.urlencode({"authKey": key} if key else {}).encode()
    try:
        with urllib.request.urlopen(f"{url}{path}", data=data, timeout=60) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def _series(url: str, key: str) -> list[dict]:
    _call(url, "/internal/force_flush", key)
    with urllib.request.urlopen(f"{url}/api/v1/export?match[]=doomed_value", timeout=30) as response:
        return [json.loads(line) for line in response.read().splitlines() if line.strip()]


def _refused(answer: tuple[int, str]) -> bool:
    """A refusal for the key: 401 from v1.136.0 (lib/httpserver/httpserver.go, CheckAuthFlag), 400 from 1.79.5."""
    status, body = answer
    return status in (400, 401) and "authKey" in body


def _assert_each_endpoint_wants_its_key(url: str, keys: dict[str, str]) -> None:
    # force_flush, refused without a key and with another endpoint's
    assert _refused(_call(url, "/internal/force_flush"))
    assert _refused(_call(url, "/internal/force_flush", keys["deleteAuthKey"]))
    assert _call(url, "/internal/force_flush", keys["forceFlushAuthKey"])[0] == 200
    # delete_series: refused without its key, and nothing is deleted.
    request = urllib.request.Request(f"{url}/api/v2/write?precision=ns", data=b"doomed value=1", method="POST")
    with urllib.request.urlopen(request, timeout=30) as response:
        assert response.status == 204
    deadline = time.monotonic() + 30
    while not _series(url, keys["forceFlushAuthKey"]) and time.monotonic() < deadline:
        time.sleep(0.2)
    delete = "/api/v1/admin/tsdb/delete_series?match[]=doomed_value"
    assert _refused(_call(url, delete))
    assert _refused(_call(url, delete, keys["snapshotAuthKey"]))
    assert [s["metric"]["__name__"] for s in _series(url, keys["forceFlushAuthKey"])] == ["doomed_value"]
    assert _call(url, delete, keys["deleteAuthKey"])[0] == 204
    assert _series(url, keys["forceFlushAuthKey"]) == []
    # snapshots
    for path in ("/snapshot/create", "/snapshot/list", "/snapshot/delete_all"):
        assert _refused(_call(url, path)), path
        assert _refused(_call(url, path, keys["deleteAuthKey"])), path
    status, body = _call(url, "/snapshot/create", keys["snapshotAuthKey"])
    assert status == 200 and json.loads(body)["status"] == "ok", body
    assert _call(url, "/snapshot/delete_all", keys["snapshotAuthKey"])[0] == 200
    # force_merge
    assert _refused(_call(url, "/internal/force_merge"))
    assert _call(url, "/internal/force_merge", keys["forceMergeAuthKey"])[0] == 200


def test_the_role_s_single_node_refuses_every_destructive_call_without_its_key(tmp_path):
    directory = _render_single(tmp_path)
    service = yaml.safe_load((directory / "victoriametrics.compose.yml").read_text())["services"]["victoriametrics"]
    flags = _auth_flags(service["command"])
    assert flags == {name: f"file:///run/secrets/{file}" for name, file in ROLE_FILES.items()}
    secrets_dir = directory / "secrets" / "victoriametrics"
    mount = {v["target"]: v for v in service["volumes"]}["/run/secrets"]
    assert Path(mount["source"]) == secrets_dir and mount["read_only"] is True
    for name, file in ROLE_FILES.items():
        path = secrets_dir / file
        assert path.stat().st_mode & 0o777 == 0o400 and path.stat().st_uid == 10005
        role_name = "victoriametrics_" + file.removesuffix("_auth_key") + "_auth_key"
        assert path.read_text() == AUTH_KEYS[role_name], name
    debian_flags, keys = _for_debian(flags, secrets_dir)
    with victoria_metrics(*debian_flags) as server:
        _assert_each_endpoint_wants_its_key(server.url, keys)


def test_the_cluster_s_vmstorage_and_vmselect_check_the_keys_of_their_own_endpoints(tmp_path):
    _assert_ok(_converge(tmp_path, storage_hosts=1, victoriametrics_replication_factor=1))
    directory = tmp_path / "root" / "vm-1" / "opt" / "telemetry" / "victoriametrics"

    def flags(service: str) -> dict[str, str]:
        command = yaml.safe_load((directory / f"{service}.compose.yml").read_text())["services"][service]["command"]
        return _auth_flags(command)

    # v1.136.0-cluster: vmstorage serves /snapshot/*, /internal/force_merge and
    # /internal/force_flush (app/vmstorage/main.go), vmselect delete_series
    # (app/vmselect/main.go); vminsert none of them.
    assert flags("vmstorage") == {n: f"file:///run/secrets/{ROLE_FILES[n]}" for n in ROLE_FILES if n != "deleteAuthKey"}
    assert flags("vmselect") == {"deleteAuthKey": "file:///run/secrets/delete_auth_key"}
    assert flags("vminsert") == {}
    assert sorted(p.name for p in (directory / "secrets" / "vmselect").iterdir()) == ["delete_auth_key"]
    assert not (directory / "secrets" / "vminsert").exists()


def test_a_missing_or_short_key_stops_the_role_before_it_writes(tmp_path):
    result = _converge(
        tmp_path, storage_hosts=1, victoriametrics_replication_factor=1, victoriametrics_snapshot_auth_key="short"
    )
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert "set vault_victoriametrics_snapshot_auth_key (32 characters or more" in " ".join(output.split())
    assert not (tmp_path / "root").exists()


def test_the_local_stack_s_victoriametrics_refuses_every_destructive_call_without_its_key(tmp_path):
    binary = require_binary("docker-compose")
    secrets_dir = write_secrets(tmp_path)
    env_file = tmp_path / "test.env"
    env_file.write_text("")
    files = ["-f", str(COMPOSE_FILE), "-f", str(BACKEND_FILES["victoriametrics"])]
    result = subprocess.run(
        [binary, "-p", "telemetry-test", *files, "--env-file", str(env_file), "config"],
        capture_output=True,
        text=True,
        env=clean_env(STACK_SECRETS_DIR=str(secrets_dir)),
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    config = yaml.safe_load(result.stdout)
    service = config["services"]["victoriametrics"]
    flags = _auth_flags(service["command"])
    assert flags == {name: f"file:///run/secrets/{file}" for name, file in COMPOSE_FILES.items()}
    assert {s["source"] for s in service["secrets"]} == set(COMPOSE_FILES.values())
    for file in COMPOSE_FILES.values():
        assert Path(config["secrets"][file]["file"]) == secrets_dir / file
    debian_flags, keys = _for_debian(flags, secrets_dir)
    with victoria_metrics(*debian_flags) as server:
        _assert_each_endpoint_wants_its_key(server.url, keys)


def _backup_tool():
    spec = importlib.util.spec_from_file_location("telemetry_backup", TOOL)
    module = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    sys.modules["telemetry_backup"] = module
    spec.loader.exec_module(module)
    return module


def test_the_backup_tool_and_the_flush_helpers_send_their_keys(tmp_path):
    key_file = tmp_path / "snapshot_auth_key"
    key_file.write_text("s" * 40 + "\n")
    with victoria_metrics("-snapshotAuthKey=" + "s" * 40, "-forceFlushAuthKey=" + "f" * 40) as server:
        tool = _backup_tool()
        with pytest.raises(tool.BackupError, match="refused /snapshot/create"):
            tool.victoriametrics_snapshot(server.url, "create")
        name = tool.victoriametrics_snapshot(server.url, "create", key_file)
        listed = json.loads(_call(server.url, "/snapshot/list", "s" * 40)[1])["snapshots"]
        assert listed == [name]
        cli = subprocess.run(
            [sys.executable, str(TOOL), "vm-snapshot-delete", server.url, name, "--auth-key-file", str(key_file)],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert cli.returncode == 0, cli.stderr
        assert json.loads(_call(server.url, "/snapshot/list", "s" * 40)[1])["snapshots"] == []
        # The simulator's flush: refused (no error) without the key, done with it.
        assert vm.PromQL(server.url).flush() is False
        assert vm.PromQL(server.url, flush_key="f" * 40).flush() is True
        server.flush()  # the test helper knows the key it started the server with
