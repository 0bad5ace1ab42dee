"""Which copy of a node's credentials wins when the proxy hosts disagree (filter_plugins/node_credentials.py).

The rules, each with the situation that makes it matter: the newest copy wins
(a host restored from an old backup); between copies of the same age, the first
host's (the inventory's order); a current password no newer than a previous
one of the same node is stale (a host that missed `make node-rotate`); a
previous password works only while its node is listed and its date has not
passed; what no host has is generated once, for all of them. The role's tasks
that feed these filters run in tests/test_proxy_hosts.py.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

PLUGIN = Path(__file__).resolve().parents[1] / "ansible/roles/reverse_proxy/filter_plugins/node_credentials.py"
_spec = importlib.util.spec_from_file_location("node_credentials", PLUGIN)
credentials = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(credentials)

DIRS = {"a": "/a/secrets/nodes", "b": "/b/secrets/nodes"}
TODAY = "2030-01-10"


def _results(copies: dict[str, dict[str, tuple[str, int]]]) -> tuple[list[dict], list[dict]]:
    """The role's find and grep loop results for {host: {relative path: (password, mtime)}}."""
    finds, reads = [], []
    for host, files in copies.items():
        paths = {f"{DIRS[host]}/{name}": value for name, value in files.items()}
        finds.append({"item": host, "files": [{"path": p, "mtime": float(m) + 0.25} for p, (_, m) in paths.items()]})
        reads.append({"item": host, "stdout": "\n".join(f"{p}\0{pw}" for p, (pw, _) in paths.items())})
    return finds, reads


def _merge(copies, nodes=("n1",), retire_after=None, now=5000):
    finds, reads = _results(copies)
    return credentials.node_credentials_merge(
        finds, reads, DIRS, list(nodes), ["loki"], retire_after or {}, TODAY, now=now
    )


def _wanted(merged) -> dict[str, tuple[str, int]]:
    return {path: (copy["password"], copy["generated"]) for path, copy in merged["wanted"].items()}


def test_the_newest_copy_wins_and_equal_ages_go_to_the_first_host():
    assert _wanted(_merge({"a": {"n1.loki-password": ("old", 100)}, "b": {"n1.loki-password": ("new", 200)}})) == {
        "n1.loki-password": ("new", 200)
    }
    assert _wanted(_merge({"a": {"n1.loki-password": ("first", 100)}, "b": {"n1.loki-password": ("other", 100)}})) == {
        "n1.loki-password": ("first", 100)
    }


def test_a_wiped_host_gets_the_copies_of_the_other():
    merged = _merge({"a": {}, "b": {"n1.loki-password": ("kept", 100)}})
    assert _wanted(merged) == {"n1.loki-password": ("kept", 100)}
    assert merged["generated"] == []
    changes = credentials.node_credentials_changes(merged["wanted"], merged["hosts"]["a"])
    assert changes == {"write": [{"path": "n1.loki-password", "password": "kept", "generated": 100}], "remove": []}
    assert credentials.node_credentials_changes(merged["wanted"], merged["hosts"]["b"]) == {"write": [], "remove": []}


def test_what_no_host_has_is_generated_once_for_all():
    merged = _merge({"a": {}, "b": {}}, nodes=["n1", "n2"])
    assert sorted(merged["generated"]) == ["n1.loki-password", "n2.loki-password"]
    passwords = [copy["password"] for copy in merged["wanted"].values()]
    assert len(set(passwords)) == 2
    assert all(len(p) == credentials.PASSWORD_LENGTH and p.isalnum() for p in passwords)
    assert {copy["generated"] for copy in merged["wanted"].values()} == {5000}


def test_a_host_that_missed_the_rotation_does_not_bring_the_previous_password_back_as_current():
    # a: rotated (the previous password moved to retiring/, the new one not issued yet); b: missed it.
    copies = {"a": {"retiring/n1.loki-password": ("previous", 100)}, "b": {"n1.loki-password": ("previous", 100)}}
    merged = _merge(copies, retire_after={"n1": "2030-01-20"})
    wanted = _wanted(merged)
    assert wanted["retiring/n1.loki-password"] == ("previous", 100)
    assert wanted["n1.loki-password"][0] not in ("previous",) and merged["generated"] == ["n1.loki-password"]
    # Even an older current one from a restored backup, with another content.
    copies["b"] = {"n1.loki-password": ("older", 50)}
    assert _wanted(_merge(copies, retire_after={"n1": "2030-01-20"}))["n1.loki-password"][0] != "older"


def test_a_previous_password_works_until_its_date_and_while_its_node_is_listed():
    copies = {
        "a": {"n1.loki-password": ("new", 200), "retiring/n1.loki-password": ("previous", 100)},
        "b": {"n1.loki-password": ("new", 200), "retiring/n1.loki-password": ("previous", 100)},
    }
    assert "retiring/n1.loki-password" in _wanted(_merge(copies, retire_after={"n1": TODAY}))
    for dates, nodes in (({"n1": "2030-01-09"}, ["n1"]), ({}, ["n1"]), ({"n1": TODAY}, [])):
        merged = _merge(copies, nodes=nodes, retire_after=dates)
        assert "retiring/n1.loki-password" not in merged["wanted"]
        assert (
            "retiring/n1.loki-password"
            in credentials.node_credentials_changes(merged["wanted"], merged["hosts"]["b"])["remove"]
        )


def test_a_copy_of_another_date_is_dated_again():
    merged = _merge({"a": {"n1.loki-password": ("same", 200)}, "b": {"n1.loki-password": ("same", 150)}})
    assert credentials.node_credentials_changes(merged["wanted"], merged["hosts"]["b"])["write"] == [
        {"path": "n1.loki-password", "password": "same", "generated": 200}
    ]


def test_retire_on_use_leaves_out_the_previous_password_of_a_node_seen_with_its_new_one():
    wanted = {
        "n1.loki-password": {"password": "new1", "generated": 200},
        "retiring/n1.loki-password": {"password": "old1", "generated": 100},
        "n2.loki-password": {"password": "new2", "generated": 200},
        "retiring/n2.loki-password": {"password": "old2", "generated": 100},
    }
    seen = '"Telemetry-Credential":["' + credentials.node_credential_fingerprint("n1", "new1") + '"]'
    assert sorted(credentials.node_credentials_retire_used(wanted, seen)) == [
        "n1.loki-password",
        "n2.loki-password",
        "retiring/n2.loki-password",
    ]
    facts = credentials.node_credentials_facts(wanted, ["loki", "metrics"])
    assert facts["passwords"] == {"loki": {"n1": "new1", "n2": "new2"}, "metrics": {}}
    assert facts["retiring"]["loki"] == {"n1": "old1", "n2": "old2"}
    assert facts["fingerprints"]["loki"]["current"]["n1"] == credentials.node_credential_fingerprint("n1", "new1")
