"""How many series the catalog implies: per node of each role, and for a fleet.

A series is a measurement with one set of tag values. Every process writes its
standard tags (uid, role, version, network, runtime_id, group, job_type: one
combination per process), so a node's series are its measurements times their own
tags' values: GPUs for `gpu` and `gpu_memory`, evaluated miners for
`validator_scores`, benchmark tasks for `evaluator_benchmark`, sinks for
`telemetry_client`. A restart starts a new runtime_id, hence a new set of series.
The store adds a spread's series beside the downsampled copy: one per process of
its source (validator_scores_spread: one per validator; gpu_spread: one per node).
What the stack writes about itself (stack_backup) is a series per stateful host,
whatever the fleet: listed, not counted.

    python -m telemetry_client.cardinality --miners 256 --validators 16 --gpus 4
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from telemetry_client.catalog import CATALOG, MEASUREMENTS, QUERYABLE, ROLES, SPREADS, STACK_CATALOG, Measurement

__all__ = ["Fleet", "field_series", "fleet_series", "main", "report", "series_per_node", "spread_series"]


@dataclass(frozen=True)
class Fleet:
    """Nodes per role and the values of the per-measurement tags."""

    miners: int
    validators: int
    aggregators: int = 1
    evaluators: int = 1
    gpus_per_node: int = 1
    tasks: int = 4  # evaluator benchmark tasks
    sinks: int = 2  # influxdb, and loki when the node logs to Loki
    runs_per_node: int = 1  # 1 + restarts within the retention period

    def nodes(self, role: str) -> int:
        return {
            "miner": self.miners,
            "validator": self.validators,
            "aggregator": self.aggregators,
            "evaluator": self.evaluators,
        }[role]


def _tag_values(measurement: Measurement, fleet: Fleet) -> int:
    """Combinations of the measurement's own tags one process writes."""
    count = 1
    for tag in measurement.tags:
        count *= {
            "gpu_uuid": fleet.gpus_per_node,  # gpu_index and gpu_name go with the device
            "eval_uid": fleet.miners,
            "task": fleet.tasks,
            "sink": fleet.sinks,
        }.get(tag, 1)
    return count


def series_per_node(role: str, fleet: Fleet) -> dict[str, int]:
    """Series one node of `role` writes, per measurement (one process, no restart)."""
    if role not in ROLES:
        raise ValueError(f"unknown role {role!r}; roles: {', '.join(ROLES)}")
    return {m.name: _tag_values(m, fleet) for m in MEASUREMENTS if role in m.roles}


def fleet_series(fleet: Fleet) -> dict[str, int]:
    """Series the whole fleet writes, per measurement, restarts included."""
    totals: dict[str, int] = {}
    for role in ROLES:
        for name, count in series_per_node(role, fleet).items():
            totals[name] = totals.get(name, 0) + count * fleet.nodes(role) * fleet.runs_per_node
    return totals


def spread_series(fleet: Fleet) -> dict[str, int]:
    """Series of the spreads the store derives beside the downsampled copy: one per process of the source."""
    return {
        spread.name: sum(fleet.nodes(role) for role in CATALOG[spread.source].roles) * fleet.runs_per_node
        for spread in SPREADS
    }


def field_series(series: Mapping[str, int]) -> int:
    """Series times fields: what InfluxDB's storage indexes and what a query scans per point time."""
    fields = {name: len(m.fields) for name, m in QUERYABLE.items()}
    return sum(count * fields[name] for name, count in series.items())


def report(fleet: Fleet) -> str:
    """A table: series per node of each role, and the fleet's totals per measurement."""
    lines = [f"{'measurement':<22}" + "".join(f"{role:>11}" for role in ROLES) + f"{'fleet':>10}"]
    per_role = {role: series_per_node(role, fleet) for role in ROLES}
    totals = fleet_series(fleet)
    for m in MEASUREMENTS:
        if m.stack:
            continue
        cells = "".join(f"{per_role[role].get(m.name, 0):>11}" for role in ROLES)
        lines.append(f"{m.name:<22}{cells}{totals.get(m.name, 0):>10,}")
    node_totals = "".join(f"{sum(per_role[role].values()):>11}" for role in ROLES)
    lines.append(f"{'series per node':<22}{node_totals}{sum(totals.values()):>10,}")
    lines.append(f"field series (series x fields) in the fleet: {field_series(totals):,}")
    for name, count in spread_series(fleet).items():
        lines.append(f"derived beside the downsampled copy: {name}, {count:,} series")
    for name in STACK_CATALOG:
        lines.append(f"written by the stack, not the nodes: {name}, one series per stateful host")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--miners", type=int, default=256)
    parser.add_argument("--validators", type=int, default=16)
    parser.add_argument("--aggregators", type=int, default=1)
    parser.add_argument("--evaluators", type=int, default=1)
    parser.add_argument("--gpus", type=int, default=4, help="GPUs per node")
    parser.add_argument("--tasks", type=int, default=4, help="evaluator benchmark tasks")
    parser.add_argument("--sinks", type=int, default=2, choices=(1, 2), help="2 when nodes also log to Loki")
    parser.add_argument("--runs", type=int, default=1, help="runs per node within the retention (1 + restarts)")
    args = parser.parse_args(argv)
    fleet = Fleet(
        args.miners, args.validators, args.aggregators, args.evaluators, args.gpus, args.tasks, args.sinks, args.runs
    )
    print(report(fleet))
    return 0


if __name__ == "__main__":
    sys.exit(main())
