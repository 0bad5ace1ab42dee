"""Fault scenarios: what goes wrong, on which node, from when; and which alert rule must notice.

`--fault KIND[:uid=N][@SECONDS]`, repeatable: KIND on node N (default: the first node
of a role the fault fits), from SECONDS after the load starts (default: half-way).
Node faults change what the node sends, through the same client as always; the store
faults (metrics-down, loki-down) point the rule evaluation at a closed port, as a
Grafana whose data source refuses connections would see it; the edge fault
(refused-credentials) adds refused requests to the edge's audit stream
(simulator/edge.py); the backup fault (backup-overdue) makes one stateful host's backup
reports overdue (simulator/backups.py). `influxdb-down` is the older name of
`metrics-down` and still works.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

# Kind to (what it does, the roles it fits; () for a store fault).
KINDS: dict[str, tuple[str, tuple[str, ...]]] = {
    "silent": (
        "the node stops sending anything (a hung or killed process)",
        ("miner", "validator", "aggregator", "evaluator"),
    ),
    "loss-divergence": ("the miner's loss jumps fourfold and every third loss is NaN", ("miner",)),
    "window-stall": ("the validator keeps scoring but its window stops advancing", ("validator",)),
    "gpu-oom": (
        "the node's first GPU fills up to 99% of its memory",
        ("miner", "validator", "aggregator", "evaluator"),
    ),
    "memory-full": (
        "the node's host reports 98% of its memory in use",
        ("miner", "validator", "aggregator", "evaluator"),
    ),
    "disk-full": ("the node's host reports 97% of its disk in use", ("miner", "validator", "aggregator", "evaluator")),
    "drops": (
        "the node logs None values, which its client drops (none_value)",
        ("miner", "validator", "aggregator", "evaluator"),
    ),
    "error-burst": ("every log line of the node is an error", ("miner", "validator", "aggregator", "evaluator")),
    "refused-credentials": (
        "requests with a credential the edge does not know come from one address that is no node's, 20 a "
        "second, refused with 401 (a revoked node, or someone guessing; needs --edge-audit)",
        (),
    ),
    "backup-overdue": (
        "one stateful host's backup run fails at the fault's start, when its last success is already 26 h "
        "(ALERT_BACKUP_MAX_AGE_SECONDS) old: from then on its reports are overdue (needs --backup-status)",
        (),
    ),
    "metrics-down": ("the rules' metrics store (InfluxDB or VictoriaMetrics) refuses connections", ()),
    "loki-down": ("the rules' Loki refuses connections", ()),
}
# Older names that still work.
ALIASES: dict[str, str] = {"influxdb-down": "metrics-down"}
# Drop reasons a fault causes on purpose: not counted as lost records.
EXPECTED_DROPS: dict[str, frozenset[str]] = {"drops": frozenset({"none_value"})}
# Faults of no node: what reaches the edge, the stack's own backups, and the stores.
EDGE_FAULTS = frozenset({"refused-credentials"})
BACKUP_FAULTS = frozenset({"backup-overdue"})
STORE_FAULTS = frozenset(kind for kind, (_, roles) in KINDS.items() if not roles) - EDGE_FAULTS - BACKUP_FAULTS

_SPEC = re.compile(r"^(?P<kind>[a-z-]+)(?::uid=(?P<uid>[^@\s]+))?(?:@(?P<at>[0-9]+(?:\.[0-9]+)?)s?)?$")


@dataclass(frozen=True)
class Fault:
    """A fault as given on the command line (uid and start may be left to the defaults)."""

    kind: str
    uid: str | None = None
    at: float | None = None

    @classmethod
    def parse(cls, text: str) -> Fault:
        match = _SPEC.match(text.strip())
        kind = ALIASES.get(match.group("kind"), match.group("kind")) if match else ""
        if not match or kind not in KINDS:
            raise ValueError(f"bad fault {text!r}: expected KIND[:uid=N][@SECONDS] with KIND one of {', '.join(KINDS)}")
        at = match.group("at")
        return cls(kind, match.group("uid"), float(at) if at is not None else None)


@dataclass(frozen=True)
class ActiveFault:
    """A fault resolved for a run: which node (None for a store fault), from when."""

    kind: str
    uid: str | None
    at: float

    def to_dict(self) -> dict[str, object]:
        return {"kind": self.kind, "uid": self.uid, "at_seconds": self.at}


def resolve(faults: Sequence[Fault], roles_by_uid: dict[str, str], duration: float) -> list[ActiveFault]:
    """Pick the node and start of each fault; ValueError when a fault cannot apply to this fleet."""
    out = []
    # Faults given without a uid each get a node of their own: a silent node cannot also
    # burst errors, so two faults on one node would make one of them unobservable.
    taken = {f.uid for f in faults if f.uid is not None}
    for fault in faults:
        roles = KINDS[fault.kind][1]
        at = duration / 2 if fault.at is None else fault.at
        if at >= duration:
            raise ValueError(f"fault {fault.kind} starts at {at:g}s, after the load ends ({duration:g}s)")
        if not roles:
            out.append(ActiveFault(fault.kind, None, at))
            continue
        uid = fault.uid
        if uid is None:
            fitting = [u for u, role in roles_by_uid.items() if role in roles]
            fitting.sort(key=lambda u: (roles.index(roles_by_uid[u]), int(u) if u.isdigit() else 0, u))
            if not fitting:
                raise ValueError(f"fault {fault.kind} needs a {' or '.join(roles)} in the fleet")
            free = [u for u in fitting if u not in taken]
            if not free:
                raise ValueError(
                    f"fault {fault.kind}: every {' or '.join(roles)} of the fleet already has a fault; "
                    "give it a node with :uid=N, or a larger fleet"
                )
            uid = free[0]
            taken.add(uid)
        elif uid not in roles_by_uid:
            raise ValueError(f"fault {fault.kind}: no node with uid {uid} (uids are 0 to {len(roles_by_uid) - 1})")
        elif roles_by_uid[uid] not in roles:
            raise ValueError(f"fault {fault.kind} fits a {' or '.join(roles)}; node {uid} is a {roles_by_uid[uid]}")
        out.append(ActiveFault(fault.kind, uid, at))
    return out


# What each store fault takes away from the rules: the data source uids they query.
DOWN_DATASOURCES: dict[str, frozenset[str]] = {
    "metrics-down": frozenset({"influxdb", "victoriametrics"}),
    "loki-down": frozenset({"loki"}),
}


def down_datasources(faults: Sequence[ActiveFault]) -> frozenset[str]:
    """The data source uids the run's store faults make refuse every query."""
    return frozenset().union(*(DOWN_DATASOURCES.get(f.kind, frozenset()) for f in faults))


def for_node(faults: Sequence[ActiveFault], uid: str) -> tuple[ActiveFault, ...]:
    return tuple(f for f in faults if f.uid == uid)


def expected_drops(faults: Sequence[ActiveFault]) -> frozenset[str]:
    reasons: set[str] = set()
    for fault in faults:
        reasons |= EXPECTED_DROPS.get(fault.kind, frozenset())
    return frozenset(reasons)
