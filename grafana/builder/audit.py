"""The edge's audit stream in Loki: what its shipper writes, and what its panel, its alert rule and the simulator read.

The production edge (Caddy, ansible/roles/reverse_proxy) writes one JSON line per
request of a node-facing site, in Caddy's access log format. Grafana Alloy
(ansible/roles/edge_audit) ships each line unchanged into Loki's tenant
EDGE_TENANT, with the stream labels below, straight to Loki's internal push
address. No node can write to that tenant: the edge sets the tenant of every push
from the node's credential, and a node's tenant is named after the node, which
starts with [a-z0-9] where EDGE_TENANT starts with "_".

So a line counts as audit only because of its tenant, never because of its labels
(a node may push lines that look the same into its own tenant). Every query here
selects the tenant with `__tenant_id__`: Loki's multi-tenant querier matches that
matcher against the tenants of the request and removes it from the selector
(grafana/loki pkg/querier/multi_tenant_querier.go, filterValuesByMatchers), so only
EDGE_TENANT's streams are read. That holds when Grafana queries several tenants
(the nodes' and EDGE_TENANT, joined by "|"); a request naming one tenant goes to
the single-tenant querier, where the matcher meets stream labels that never carry
it, and the audit queries find nothing.
"""

from __future__ import annotations

from collections.abc import Sequence

# The tenant the shipper pushes into (loki.write's tenant_id, sent as X-Scope-OrgID).
EDGE_TENANT = "_edge"
# The `job` stream label of every audit line.
JOB = "edge-access"
# The `site` label: the node-facing site of the line, logs (Loki's push API) or metrics.
SITES: tuple[str, ...] = ("logs", "metrics")
# Every stream label the shipper sets: job and site per file, status_class ("2xx", "4xx"...) per line.
STREAM_LABELS: frozenset[str] = frozenset({"job", "site", "status_class"})
# Answers of the edge that refuse a node's request: no or an unknown credential (401),
# forbidden (403), a body over the site's size limit (413), over a rate limit (429).
REFUSED_STATUSES: tuple[int, ...] = (401, 403, 413, 429)
# Caddy's access log fields the queries read, as Loki's `| json` names them (nested keys
# joined by "_"): the node the credential map named ("-" for none), the answer's status,
# the peer's address (modules/caddyhttp/server.go logRequest, marshalers.go
# LoggableHTTPRequest; the same in Caddy 2.6 and 2.11).
FIELDS: frozenset[str] = frozenset({"user_id", "status", "request_remote_ip", "request_host", "request_uri"})
# What the edge's credential map logs as user_id for a request without a known credential.
NO_NODE = "-"


def status_class(status: int) -> str:
    """The status_class label of an answer: its first digit and "xx", as the shipper's template writes it."""
    return f"{str(status)[:1]}xx"


def selector(status_classes: Sequence[str] = ()) -> str:
    """The audit stream (of these status classes only, when given), in the edge's tenant alone."""
    matchers = [f'job="{JOB}"']
    if len(status_classes) == 1:
        matchers.append(f'status_class="{status_classes[0]}"')
    elif status_classes:
        matchers.append(f'status_class=~"{"|".join(status_classes)}"')
    matchers.append(f'__tenant_id__="{EDGE_TENANT}"')
    return "{" + ", ".join(matchers) + "}"


def _statuses(statuses: Sequence[int]) -> str:
    codes = [str(s) for s in statuses]
    return f'status="{codes[0]}"' if len(codes) == 1 else f'status=~"{"|".join(codes)}"'


def refused(statuses: Sequence[int] = REFUSED_STATUSES) -> str:
    """Audit lines of refused requests: only the streams of their status classes are read, then `| json`."""
    classes = sorted({status_class(s) for s in statuses})
    return f"{selector(classes)} | json | {_statuses(statuses)}"


def refused_count(by: Sequence[str], window: str, statuses: Sequence[int] = REFUSED_STATUSES) -> str:
    """Refused requests per group of `by` (fields of FIELDS or stream labels) in each `window`."""
    return f"sum by ({', '.join(by)}) (count_over_time({refused(statuses)} [{window}]))"
