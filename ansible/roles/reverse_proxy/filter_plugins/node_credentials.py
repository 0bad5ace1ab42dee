"""The nodes' credentials, one set for every proxy host (tasks/node_passwords.yml).

Each proxy host keeps a copy of every node's passwords in
``secrets/nodes/<node>.<kind>-password`` and, while a node is being rotated, its
previous ones in ``secrets/nodes/retiring/``. The role reads the copies of every
proxy host, merges them here into one set, generates what none of them has, and
writes that set to each host, so that a node's credential works on all of them,
a wiped host gets its copies back, and a second proxy host is possible.

Which copy wins: each file's modification time is the time its credential was
generated (the role sets it on every copy it writes; ``mv``, restic and tar keep
it). The newest copy wins; between copies of the same age, the first host of
``reverse_proxy_credential_hosts`` (the inventory's order). A current password
no newer than a previous one of the same node (in ``retiring/`` on any host)
predates that rotation: a host that missed ``make node-rotate`` still has it as
current, and it is not taken.
"""

from __future__ import annotations

import base64
import hashlib
import os
import secrets
import string
import time
from typing import Any

# 40 letters and digits: about 238 bits; Caddy compares the exact header, no hashing.
PASSWORD_LENGTH = 40
_ALPHABET = string.ascii_letters + string.digits
RETIRING = "retiring/"

Copy = dict[str, Any]  # {"password": str, "generated": int}


def _file_name(node: str, kind: str) -> str:
    return f"{node}.{kind}-password"


def _copies_of_host(found: dict[str, Any], read: dict[str, Any] | None, nodes_dir: str) -> dict[str, Copy]:
    """One host's files as {relative path: copy}: mtimes from `find`, contents from `grep --null`."""
    contents: dict[str, list[str]] = {}
    for line in ((read or {}).get("stdout") or "").split("\n"):
        path, separator, text = line.partition("\0")
        if separator:
            contents.setdefault(path, []).append(text)
    copies = {}
    for entry in found.get("files") or []:
        password = "\n".join(contents.get(entry["path"], [])).strip()
        if password:  # an empty file holds no credential: as if missing
            relative = os.path.relpath(entry["path"], nodes_dir)
            copies[relative] = {"password": password, "generated": int(entry["mtime"])}
    return copies


def _newest(candidates: list[tuple[int, Copy]]) -> Copy:
    """The newest copy; between equally old ones, that of the first host."""
    return max(candidates, key=lambda item: (item[1]["generated"], -item[0]))[1]


def new_password() -> str:
    return "".join(secrets.choice(_ALPHABET) for _ in range(PASSWORD_LENGTH))


def node_credentials_merge(
    finds: list[dict[str, Any]],
    reads: list[dict[str, Any]],
    dirs: dict[str, str],
    nodes: list[str],
    kinds: list[str],
    retire_after: dict[str, Any],
    today: str,
    now: int | None = None,
) -> dict[str, Any]:
    """Merge every host's copies into the one set each host must hold.

    finds, reads: the loop results of the role's `find` and `grep` over
    reverse_proxy_credential_hosts (item: the host), in that order. Returns
    {"hosts": {host: {path: copy}}, "wanted": {path: copy}, "generated": [path]},
    paths relative to secrets/nodes/.
    """
    generated_at = int(time.time() if now is None else now)
    reads_by_host = {result["item"]: result for result in reads if not result.get("skipped")}
    hosts = {
        result["item"]: _copies_of_host(result, reads_by_host.get(result["item"]), dirs[result["item"]])
        for result in finds
    }
    order = [result["item"] for result in finds]
    wanted: dict[str, Copy] = {}
    generated = []
    for kind in kinds:
        for node in nodes:
            current_path = _file_name(node, kind)
            retiring_path = RETIRING + current_path
            retiring = [(i, hosts[h][retiring_path]) for i, h in enumerate(order) if retiring_path in hosts[h]]
            # Every previous copy counts against a stale current one, kept or not.
            rotated_at = max((copy["generated"] for _, copy in retiring), default=None)
            rotated_passwords = {copy["password"] for _, copy in retiring}
            current = [
                (i, hosts[h][current_path])
                for i, h in enumerate(order)
                if current_path in hosts[h]
                and hosts[h][current_path]["password"] not in rotated_passwords
                and (rotated_at is None or hosts[h][current_path]["generated"] > rotated_at)
            ]
            # A previous credential works while its node is listed and its date has not passed.
            if retiring and str(retire_after.get(node) or "") >= today:
                wanted[retiring_path] = _newest(retiring)
            if current:
                wanted[current_path] = _newest(current)
            else:
                wanted[current_path] = {"password": new_password(), "generated": generated_at}
                generated.append(current_path)
    return {"hosts": hosts, "wanted": wanted, "generated": generated}


def node_credentials_changes(wanted: dict[str, Copy], held: dict[str, Copy]) -> dict[str, list]:
    """What one host must write (missing, different or differently dated) and remove (not wanted)."""
    write = [{"path": path, **copy} for path, copy in sorted(wanted.items()) if held.get(path) != copy]
    remove = sorted(path for path in held if path not in wanted)
    return {"write": write, "remove": remove}


def node_credential_fingerprint(node: str, password: str) -> str:
    """First 16 hex digits of the SHA-256 of the token the node sends, base64 of "<node>:<password>"."""
    token = base64.b64encode(f"{node}:{password}".encode()).decode()
    return hashlib.sha256(token.encode()).hexdigest()[:16]


def node_credentials_facts(wanted: dict[str, Copy], kinds: list[str]) -> dict[str, dict]:
    """The set as the Caddyfile's templates read it: passwords, previous ones and fingerprints by kind and node."""
    facts: dict[str, dict] = {"passwords": {}, "retiring": {}, "fingerprints": {}}
    for kind in kinds:
        facts["passwords"][kind], facts["retiring"][kind] = {}, {}
        facts["fingerprints"][kind] = {"current": {}, "retiring": {}}
    for path, copy in wanted.items():
        generation = "retiring" if path.startswith(RETIRING) else "current"
        node, _, rest = path.removeprefix(RETIRING).rpartition(".")
        kind = rest.removesuffix("-password")
        if kind not in facts["passwords"]:
            continue
        facts["passwords" if generation == "current" else "retiring"][kind][node] = copy["password"]
        facts["fingerprints"][kind][generation][node] = node_credential_fingerprint(node, copy["password"])
    return facts


def node_credentials_retire_used(wanted: dict[str, Copy], seen: str) -> dict[str, Copy]:
    """Leave out the previous credentials of nodes whose new one the access logs show (seen: zgrep's output)."""
    kept = {}
    for path, copy in wanted.items():
        if path.startswith(RETIRING):
            current = wanted.get(path.removeprefix(RETIRING))
            node = path.removeprefix(RETIRING).rpartition(".")[0]
            if current and node_credential_fingerprint(node, current["password"]) in seen:
                continue
        kept[path] = copy
    return kept


class FilterModule:
    """Filters of the reverse_proxy role for its nodes' credentials."""

    def filters(self) -> dict[str, Any]:
        return {
            "node_credentials_merge": node_credentials_merge,
            "node_credentials_changes": node_credentials_changes,
            "node_credentials_facts": node_credentials_facts,
            "node_credentials_retire_used": node_credentials_retire_used,
        }
