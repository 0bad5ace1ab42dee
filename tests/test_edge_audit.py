"""The edge's audit trail in Loki: shipper, simulator, panel and alert rule read one stream, in one tenant.

- the shipper's configuration (ansible/roles/edge_audit) sets the labels, job and tenant that
  grafana/builder/audit.py's queries read, for the files the reverse_proxy role writes;
- the simulator's audit lines (simulator/edge.py) reach the Loki receiver in the edge's tenant,
  and the Telemetry health panel's and the alert rule's queries count them there, and never
  lines of the same labels that a node pushed into its own tenant;
- a real Caddy 2.6 (/usr/bin/caddy) writes the fields those queries read, and the fields the
  simulator writes, and its own refused requests are what the rule counts.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml
from grafana_receiver import TenantView, logql_query
from loki_receiver import LokiReceiver, production_loki

from grafana.alerting_src import render
from grafana.alerting_src import settings as st
from grafana.builder import audit
from simulator import edge
from simulator import faults as ft
from simulator.fleet import NodeSpec

ROOT = Path(__file__).resolve().parents[1]
ROLE = ROOT / "ansible" / "roles" / "edge_audit"
RULE_UID = "telemetry-edge-refused-credentials"
PANEL_TITLE = "Refused requests at the edge, by node"
NODES = [NodeSpec("miner", str(n), "1.0.0", 0) for n in range(3)]


def _panel_expr() -> str:
    board = json.loads((ROOT / "grafana" / "dashboards" / "telemetry-health.json").read_text())
    [panel] = [p for p in board["panels"] if p["title"] == PANEL_TITLE]
    [target] = panel["targets"]
    return target["expr"]


def _rule_expr() -> str:
    text = render.fill((ROOT / "grafana" / "alerting" / "rules.yaml").read_text(), st.defaults())
    [rule] = [r for g in yaml.safe_load(text)["groups"] for r in g["rules"] if r["uid"] == RULE_UID]
    return next(q["model"]["expr"] for q in rule["data"] if q["datasourceUid"] == "loki")


def _vector(expr: str, entries: list[Any], at_ns: int, window: str) -> dict[tuple[tuple[str, str], ...], float]:
    """The instant vector Grafana gets reading every tenant (the edge's and each node's), as production does."""
    text = expr.replace("$__range", window).replace("$__auto", window)
    view = TenantView(tuple(sorted({e.tenant for e in entries} | {audit.EDGE_TENANT, "0"})), multi_tenant=True)
    data = logql_query(text, entries, at_ns, at_ns, None, view=view)
    return {tuple(sorted(r["metric"].items())): float(r["value"][1]) for r in data["result"]}


def _push_as(receiver: LokiReceiver, tenant: str, labels: dict[str, str], lines: list[tuple[int, str]]) -> None:
    body = json.dumps({"streams": [{"stream": labels, "values": [[str(ts), line] for ts, line in lines]}]}).encode()
    request = urllib.request.Request(receiver.push_url, data=body, method="POST")
    request.add_header("Content-Type", "application/json")
    request.add_header("X-Scope-OrgID", tenant)
    with urllib.request.urlopen(request, timeout=10) as answer:
        assert answer.status == 204


# ---------------------------------------------------------------- the shipper's configuration


def test_the_shipper_writes_the_labels_job_and_tenant_the_queries_read() -> None:
    defaults = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
    assert defaults["edge_audit_tenant"] == audit.EDGE_TENANT and defaults["edge_audit_job"] == audit.JOB
    # The tenant cannot be a node's: node names start with [a-z0-9] (ansible/nodes.yml).
    assert audit.EDGE_TENANT.startswith("_")
    template = (ROLE / "templates" / "config.alloy.j2").read_text()
    [target] = re.findall(r"\{\"__path__\" = [^\n]*\}", template)
    target_labels = set(re.findall(r'"(\w+)" = ', target)) - {"__path__"}
    source_labels = set(re.findall(r"^\s+(\w+) = \"\",$", template.split("stage.labels", 1)[1], re.M))
    assert target_labels | source_labels == audit.STREAM_LABELS
    assert 'values = ["filename"]' in template  # loki.source.file's own label goes
    assert 'tenant_id = "{{ edge_audit_tenant }}"' in template
    # The status class as audit.status_class writes it: the status's first digit and "xx".
    assert "{{ with .status }}{{ trunc 1 . }}xx{{ end }}" in template
    assert [audit.status_class(s) for s in (204, 401, 429, 502)] == ["2xx", "4xx", "4xx", "5xx"]
    proxy = yaml.safe_load((ROOT / "ansible" / "roles" / "reverse_proxy" / "defaults" / "main.yml").read_text())
    assert set(proxy["reverse_proxy_access_log_files"]) == set(audit.SITES) == set(edge.SITES)


# ---------------------------------------------------------------- the simulator's lines and the queries


def test_simulated_lines_land_in_the_edge_tenant_with_the_shipper_s_labels() -> None:
    started = time.time_ns()
    faults = ft.resolve([ft.Fault.parse(f"{edge.FAULT}@4")], {"0": "miner"}, 10.0)
    answered = edge.requests(NODES, faults, started, 10.0)
    with production_loki() as loki:
        assert edge.push(loki.base_url, answered) == len(answered)
        entries = loki.entries
    assert {entry.tenant for entry in entries} == {audit.EDGE_TENANT}
    assert {frozenset(entry.labels) for entry in entries} == {audit.STREAM_LABELS}
    by_status: dict[tuple[str, int], int] = {}
    for entry in entries:
        body = entry.json()
        assert entry.labels["status_class"] == audit.status_class(body["status"])
        assert abs(entry.ts - body["ts"] * 1e9) < 1e3  # its time is its ts, as the shipper's stage.timestamp
        assert body["request"]["headers"]["Authorization"] == []
        key = (body["user_id"], body["status"])
        by_status[key] = by_status.get(key, 0) + 1
    # Each node's pushes at both sites, the deploy's two checks, the fault's 20 a second for 6 s.
    assert by_status == {
        **{(edge.node_name(spec), 204): 2 * 10 for spec in NODES},
        (audit.NO_NODE, 401): 2 + 6 * edge.REFUSED_PER_SECOND,
    }


def test_the_rule_and_the_panel_count_the_edge_tenant_alone() -> None:
    started = time.time_ns()
    faults = ft.resolve([ft.Fault.parse(f"{edge.FAULT}@4")], {"0": "miner"}, 10.0)
    answered = edge.requests(NODES, faults, started, 10.0)
    end = started + 10 * 1_000_000_000
    with production_loki() as loki:
        edge.push(loki.base_url, answered)
        # A node pushes lines that look the same into its own tenant: forged refusals blaming another address.
        forged = [r for r in answered if r.status == 401][:50]
        forged = [edge.Request(r.ts_ns + 1, r.site, 401, audit.NO_NODE, "198.18.9.9") for r in forged]
        for labels, lines in edge.streams(forged).items():
            _push_as(loki, "miner-0", dict(labels), lines)
        entries = loki.entries
    assert len({e.tenant for e in entries}) == 2

    refused = _vector(_rule_expr(), entries, end, "10s")
    assert refused == {
        (("request_remote_ip", edge.STRANGER_ADDRESS),): 6 * edge.REFUSED_PER_SECOND,
        (("request_remote_ip", edge.DEPLOY_ADDRESS),): 2,
    }
    threshold = float(st.defaults()["ALERT_EDGE_REFUSED_MIN"])
    assert refused[(("request_remote_ip", edge.DEPLOY_ADDRESS),)] < threshold  # a clean edge stays quiet

    panel = _vector(_panel_expr(), entries, end, "10s")
    assert {dict(k)["request_remote_ip"] for k in panel} == {edge.STRANGER_ADDRESS, edge.DEPLOY_ADDRESS}
    assert {dict(k)["user_id"] for k in panel} == {audit.NO_NODE}
    assert sum(panel.values()) == 2 + 6 * edge.REFUSED_PER_SECOND  # the 204s are not refused

    # Without the tenant matcher the forged lines would count: the matcher is what makes it an audit.
    untrusted = _rule_expr().replace(f', __tenant_id__="{audit.EDGE_TENANT}"', "")
    assert (("request_remote_ip", "198.18.9.9"),) in _vector(untrusted, entries, end, "10s")


def test_a_refused_node_is_named_by_its_credential() -> None:
    """413 and 429 come after the credential was known: the panel names the node, not "-"."""
    at = time.time_ns()
    answered = [
        edge.Request(at, "logs", 413, "miner-7", edge.node_address(7)),
        edge.Request(at + 1, "metrics", 429, "miner-7", edge.node_address(7)),
        edge.Request(at + 2, "metrics", 204, "miner-8", edge.node_address(8)),
    ]
    with production_loki() as loki:
        edge.push(loki.base_url, answered)
        entries = loki.entries
    panel = _vector(_panel_expr(), entries, at + 1_000_000_000, "5s")
    assert {(dict(k)["user_id"], dict(k)["status"], dict(k)["site"]) for k in panel} == {
        ("miner-7", "413", "logs"),
        ("miner-7", "429", "metrics"),
    }


def test_a_refused_push_of_the_audit_lines_says_what_loki_answered() -> None:
    with production_loki() as loki:
        loki.fail_next(1, status=401, body="no org id")
        with pytest.raises(RuntimeError, match="HTTP 401 no org id"):
            edge.push(loki.base_url, edge.requests(NODES[:1], [], time.time_ns(), 2.0))


# ---------------------------------------------------------------- a real Caddy's lines


def _flat(value: Any, prefix: str = "") -> set[str]:
    """The field names Loki's `| json` gives a line (nested keys joined by "_"; arrays are not fields)."""
    if isinstance(value, dict):
        return set().union(*(_flat(v, f"{prefix}_{k}" if prefix else k) for k, v in value.items()))
    return set() if isinstance(value, list) else {prefix}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.slow  # runs Caddy
def test_real_caddy_writes_the_fields_the_queries_read_and_the_simulator_writes(tmp_path: Path) -> None:
    caddy = shutil.which("caddy")
    assert caddy, "the caddy binary is needed for this check: apt-get install caddy"
    port, log = _free_port(), tmp_path / "logs-access.log"
    # The edge's credential map and access log, as the reverse_proxy role writes them (one credential).
    (tmp_path / "Caddyfile").write_text(
        "{\n\tadmin off\n\tauto_https off\n}\n"
        f"http://:{port} {{\n\tlog {{\n\t\toutput file {log}\n\t\tformat json\n\t}}\n"
        "\tmap {http.request.header.Authorization} {http.auth.user.id} {telemetry.node.known} {\n"
        '\t\t"Basic bWluZXItMDE6cw==" miner-01 yes\n\t\tdefault - no\n\t}\n'
        "\t@stranger vars {telemetry.node.known} no\n\trespond @stranger 401\n\trespond 204\n}\n"
    )
    env = dict(os.environ, HOME=str(tmp_path), XDG_DATA_HOME=str(tmp_path / "d"), XDG_CONFIG_HOME=str(tmp_path / "c"))
    server = subprocess.Popen(
        [caddy, "run", "--adapter", "caddyfile", "--config", str(tmp_path / "Caddyfile")],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        statuses = []
        for authorization in ("Basic bWluZXItMDE6cw==", "Basic bm9ib2R5Ong=", None):
            request = urllib.request.Request(f"http://127.0.0.1:{port}/loki/api/v1/push", data=b"{}", method="POST")
            if authorization:
                request.add_header("Authorization", authorization)
            for _ in range(100):
                try:
                    with urllib.request.urlopen(request, timeout=5) as answer:
                        statuses.append(answer.status)
                    break
                except urllib.error.HTTPError as exc:
                    statuses.append(exc.code)
                    break
                except OSError:
                    time.sleep(0.1)  # not listening yet
        assert statuses == [204, 401, 401]
    finally:
        server.terminate()
        server.wait(timeout=30)
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert [(line["user_id"], line["status"]) for line in lines] == [("miner-01", 204), ("-", 401), ("-", 401)]

    caddy_fields = set.intersection(*(_flat(line) for line in lines))
    assert caddy_fields >= audit.FIELDS
    simulated = _flat(json.loads(edge.access_line(edge.Request(time.time_ns(), "logs", 401, "-", "198.18.0.9"))))
    # Caddy 2.11 (the production image) adds bytes_read and client_ip, and TLS fields on HTTPS.
    assert caddy_fields <= simulated
    assert all(isinstance(line["ts"], float) and isinstance(line["status"], int) for line in lines)

    # The real lines, labelled as the shipper labels them, through the rule's query.
    with production_loki() as loki:
        for line in lines:
            labels = {"job": audit.JOB, "site": "logs", "status_class": audit.status_class(line["status"])}
            _push_as(loki, audit.EDGE_TENANT, labels, [(int(line["ts"] * 1e9), json.dumps(line))])
        entries = loki.entries
    end = max(e.ts for e in entries) + 1
    assert _vector(_rule_expr(), entries, end, "60s") == {(("request_remote_ip", "127.0.0.1"),): 2}
