"""The production edge's audit stream, as its shipper puts it into Loki, for a run that has no edge.

In production the edge (Caddy, ansible/roles/reverse_proxy) writes one JSON line per
request of a node-facing site, and Grafana Alloy (ansible/roles/edge_audit) ships each
line unchanged into Loki's tenant `_edge`, labelled job, site and status_class
(grafana/builder/audit.py). The simulator's nodes write to the stores directly, so with
`--edge-audit` it writes the lines such an edge would have written over the load and
pushes them as the shipper does: the same labels, each line's time its `ts`, the
tenant in X-Scope-OrgID, straight to `--loki-url`.

What the run's edge saw:

- every node's pushes, accepted: one request per node, site and second of the load
  (204, the node's name as user_id, from the node's own address);
- the deploy's health checks (ansible/roles/reverse_proxy/tasks/container.yml): one
  POST without a credential to each site, refused with 401 from the operator's
  address. A healthy edge refuses a little too, far below the alert rule's threshold;
- under the refused-credentials fault, from its start to the end of the load:
  REFUSED_PER_SECOND requests a second with a credential the edge does not know, from
  one address that is no node's, refused with 401 (user_id "-").

A line has the fields and order of Caddy 2.11's access log (modules/caddyhttp/server.go
logRequest; marshalers.go LoggableHTTPRequest and LoggableTLSConnState; the level is
error from 500 up; modules/logging/encoders.go: `ts` in Unix seconds with a fraction),
with the Authorization header logged empty as Caddy does (LoggableHTTPHeader).
"""

from __future__ import annotations

import ipaddress
import json
import urllib.error
import urllib.request
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from grafana.builder import audit
from simulator.faults import ActiveFault
from simulator.fleet import NodeSpec

PUSH_PATH = "/loki/api/v1/push"
# The sites' public names and the write path a node uses on each.
SITES: dict[str, tuple[str, str]] = {
    "logs": ("logs.example.org", "/loki/api/v1/push"),
    "metrics": ("metrics.example.org", "/api/v2/write?precision=ns"),
}
# Addresses from 198.18.0.0/15, the range set aside for benchmarks (RFC 2544): the
# operator's (the deploy's checks), the one of the refused-credentials fault, the nodes' from BASE.
DEPLOY_ADDRESS = "198.18.0.1"
STRANGER_ADDRESS = "198.19.255.1"
NODE_ADDRESS_BASE = ipaddress.ip_address("198.18.1.0")
REFUSED_PER_SECOND = 20
FAULT = "refused-credentials"
# A batch as the shipper sends them (loki.write's default batch_size: 1MiB).
BATCH_BYTES = 1 << 20


@dataclass(frozen=True)
class Request:
    """One request the edge answered."""

    ts_ns: int
    site: str
    status: int
    user_id: str
    remote_ip: str
    size: int = 0
    bytes_read: int = 0


def node_name(spec: NodeSpec) -> str:
    """A node's name, as its credential names it (the inventory's name, not its uid)."""
    return f"{spec.role}-{spec.uid}"


def node_address(index: int) -> str:
    return str(NODE_ADDRESS_BASE + index)


def access_line(request: Request) -> str:
    """The request as a line of Caddy's JSON access log."""
    host, uri = SITES[request.site]
    line: dict[str, Any] = {
        "level": "error" if request.status >= 500 else "info",
        "ts": request.ts_ns / 1e9,
        "logger": "http.log.access.log0",
        "msg": "handled request",
        "request": {
            "remote_ip": request.remote_ip,
            "remote_port": "43210",
            "client_ip": request.remote_ip,
            "proto": "HTTP/2.0",
            "method": "POST",
            "host": host,
            "uri": uri,
            "headers": {
                "Authorization": [],
                "Content-Type": ["application/json" if request.site == "logs" else "text/plain; charset=utf-8"],
                "User-Agent": ["python-urllib3"],
            },
            "tls": {"resumed": False, "version": 772, "cipher_suite": 4865, "proto": "h2", "server_name": host},
        },
        "bytes_read": request.bytes_read,
        "user_id": request.user_id,
        "duration": 0.0012,
        "size": request.size,
        "status": request.status,
        "resp_headers": {"Server": ["Caddy"]},
    }
    return json.dumps(line, separators=(",", ":"))


def requests(
    specs: Sequence[NodeSpec], faults: Sequence[ActiveFault], started_ns: int, load_seconds: float
) -> list[Request]:
    """Every request the run's edge answered, in time order."""
    out: list[Request] = []
    whole_seconds = int(load_seconds)
    for index, spec in enumerate(specs):
        # Spread the nodes over each second, so that no two lines of a stream share a time.
        offset_ns = int(1e9 * (index + 0.5) / (len(specs) + 1))
        for second in range(whole_seconds):
            for site in SITES:
                out.append(
                    Request(
                        started_ns + second * 1_000_000_000 + offset_ns,
                        site,
                        204,
                        node_name(spec),
                        node_address(index),
                        bytes_read=4096,
                    )
                )
    for number, site in enumerate(SITES):
        out.append(Request(started_ns + (number + 1) * 1_000_000, site, 401, audit.NO_NODE, DEPLOY_ADDRESS))
    for fault in faults:
        if fault.kind != FAULT:
            continue
        first = started_ns + int(fault.at * 1e9)
        count = int((load_seconds - fault.at) * REFUSED_PER_SECOND)
        step = 1_000_000_000 // REFUSED_PER_SECOND
        sites = list(SITES)
        for n in range(count):
            out.append(Request(first + n * step, sites[n % len(sites)], 401, audit.NO_NODE, STRANGER_ADDRESS))
    out.sort(key=lambda r: r.ts_ns)
    return out


def streams(answered: Iterable[Request]) -> dict[tuple[tuple[str, str], ...], list[tuple[int, str]]]:
    """The lines per stream, labelled as the shipper labels them (job, site, status_class)."""
    out: dict[tuple[tuple[str, str], ...], list[tuple[int, str]]] = {}
    for request in answered:
        labels = (("job", audit.JOB), ("site", request.site), ("status_class", audit.status_class(request.status)))
        out.setdefault(labels, []).append((request.ts_ns, access_line(request)))
    return out


def push(loki_url: str, answered: Sequence[Request], timeout: float = 30.0) -> int:
    """Push the lines into the edge's tenant in batches of up to BATCH_BYTES; how many lines were pushed.

    RuntimeError with Loki's answer when a push is refused.
    """
    url = loki_url.rstrip("/") + PUSH_PATH
    batch: list[dict[str, Any]] = []
    size = pushed = 0

    def send() -> None:
        body = json.dumps({"streams": batch}).encode()
        request = urllib.request.Request(url, data=body, method="POST")
        request.add_header("Content-Type", "application/json")
        request.add_header("X-Scope-OrgID", audit.EDGE_TENANT)
        try:
            with urllib.request.urlopen(request, timeout=timeout) as answer:
                answer.read()
        except urllib.error.HTTPError as exc:
            text = exc.read().decode("utf-8", "replace")[:300]
            raise RuntimeError(f"Loki refused the edge's audit lines: HTTP {exc.code} {text}") from None
        except OSError as exc:
            raise RuntimeError(f"cannot push the edge's audit lines to {url}: {exc}") from None

    for labels, values in streams(answered).items():
        for ts_ns, line in values:
            if batch and size + len(line) > BATCH_BYTES:
                send()
                batch, size = [], 0
            if not batch or batch[-1]["stream"] != dict(labels):
                batch.append({"stream": dict(labels), "values": []})
            batch[-1]["values"].append([str(ts_ns), line])
            size += len(line)
            pushed += 1
    if batch:
        send()
    return pushed


WITHOUT_AUDIT = "no edge audit stream in this run (--edge-audit)"


def reads_audit(text: str) -> bool:
    """Whether a LogQL query reads the edge's audit stream (it selects the edge's tenant)."""
    return f'__tenant_id__="{audit.EDGE_TENANT}"' in text
