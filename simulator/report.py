"""The run's report: a table on the terminal, a JSON document, and the exit code.

Exit code bits (they add up, so one number says everything that went wrong):
  0  every query OK (or skipped on request) and every record delivered and stored
  1  a dashboard query was EMPTY or ERROR
  2  usage error (bad flags or configuration), from argparse or before the run
  4  records lost: dropped by a client, or stored fewer (or more) than delivered
  8  the fleet failed: a worker process crashed, a store could not be counted, or the audit lines refused
  16 an alert rule fired without its fault, or stayed quiet under it
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from simulator.alerting import AlertCheck
from simulator.faults import ActiveFault, expected_drops
from simulator.load import NOT_LOSS, FleetResult
from simulator.validate import EMPTY, ERROR, OK, SKIPPED, DeliveryRow, QueryCheck

EXIT_OK = 0
EXIT_PANELS = 1
EXIT_USAGE = 2
EXIT_LOSS = 4
EXIT_FLEET = 8
EXIT_ALERTS = 16
REPORT_VERSION = 1


def client_drops(fleet: FleetResult, faults: Sequence[ActiveFault] = ()) -> dict[str, dict[str, int]]:
    """Records the clients dropped, per sink and reason (sampling, and drops a fault causes on purpose, excluded)."""
    out: dict[str, dict[str, int]] = {}
    ignored = NOT_LOSS | expected_drops(faults)
    for sink, stats in (("influxdb", fleet.metrics), ("loki", fleet.logs)):
        reasons = {k: v for k, v in (stats.get("dropped_by_reason") or {}).items() if v and k not in ignored}
        if reasons:
            out[sink] = reasons
    return out


def exit_code(
    fleet: FleetResult,
    checks: Sequence[QueryCheck],
    delivery: Sequence[DeliveryRow],
    alerts: Sequence[AlertCheck] = (),
    faults: Sequence[ActiveFault] = (),
) -> int:
    code = EXIT_OK
    if any(c.status in (EMPTY, ERROR) for c in checks):
        code |= EXIT_PANELS
    if any(not a.ok for a in alerts):
        code |= EXIT_ALERTS
    if client_drops(fleet, faults) or any(row.stored is not None and not row.ok for row in delivery):
        code |= EXIT_LOSS
    if fleet.errors or any(row.stored is None for row in delivery):
        code |= EXIT_FLEET
    return code


def build_report(
    settings: dict[str, Any],
    fleet: FleetResult,
    checks: Sequence[QueryCheck],
    delivery: Sequence[DeliveryRow],
    alerts: Sequence[AlertCheck] = (),
    faults: Sequence[ActiveFault] = (),
) -> dict[str, Any]:
    """The JSON report: what was asked, what the fleet did, what every query returned, what was lost."""
    statuses = {status: sum(1 for c in checks if c.status == status) for status in (OK, EMPTY, ERROR, SKIPPED)}
    lost = sum(row.lost or 0 for row in delivery if row.stored is not None)
    drops = client_drops(fleet, faults)
    code = exit_code(fleet, checks, delivery, alerts, faults)
    alert_statuses: dict[str, int] = {}
    for alert in alerts:
        alert_statuses[alert.status] = alert_statuses.get(alert.status, 0) + 1
    return {
        "version": REPORT_VERSION,
        "run": {
            "run_id": fleet.run.run_id,
            "network": fleet.run.network,
            "seed": fleet.run.seed,
            "started_ns": fleet.started_ns,
            "ended_ns": fleet.ended_ns,
        },
        "settings": settings,
        "fleet": {
            "nodes": fleet.nodes,
            "processes": fleet.processes,
            "load_seconds": round(fleet.load_seconds, 3),
            "points_logged": fleet.points_logged,
            "lines_logged": fleet.lines_logged,
            "points_per_sec": round(fleet.points_per_sec, 1),
            "lines_per_sec": round(fleet.lines_per_sec, 1),
            "cpu_seconds": round(fleet.cpu_seconds, 3),
            "pending_at_end": fleet.pending_at_end,
            "interrupted": fleet.interrupted,
            "errors": fleet.errors,
            "metrics": fleet.metrics,
            "logs": fleet.logs,
        },
        "queries": [c.to_dict() for c in checks],
        "delivery": [row.to_dict() for row in delivery],
        "faults": [f.to_dict() for f in faults],
        "alerts": [a.to_dict() for a in alerts],
        "summary": {
            "queries": statuses,
            "alerts": alert_statuses,
            "alerts_wrong": [a.uid for a in alerts if not a.ok],
            "points_sent": int(fleet.metrics.get("sent", 0)),
            "lines_sent": int(fleet.logs.get("sent", 0)),
            "lost": lost,
            "client_drops": drops,
            "exit_code": code,
            "ok": code == EXIT_OK,
        },
    }


def write_json(report: dict[str, Any], path: str | Path) -> None:
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(report, indent=2, sort_keys=False) + "\n", encoding="utf-8")


_STYLE = {OK: "green", EMPTY: "yellow", ERROR: "red", SKIPPED: "dim"}


def print_report(report: dict[str, Any], console: Any = None, verbose: bool = False) -> None:
    """Tables on the terminal: queries that are not OK (all with `verbose`), delivery, summary."""
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    queries = report["queries"]
    shown = queries if verbose else [q for q in queries if q["status"] in (EMPTY, ERROR)]
    table = Table(title=f"Dashboard queries ({len(queries)})", show_lines=False)
    for column in ("status", "query", "values", "message"):
        table.add_column(column, overflow="fold", justify="right" if column == "values" else "left")
    for q in shown:
        title = q["title"] if q["kind"] == "panel" else f"${q['title']}"
        status = q["status"]
        table.add_row(
            f"[{_STYLE[status]}]{status}[/]",
            f"{q['dashboard']}: {title} {q['ref_id']} ({q['datasource']})".replace("  ", " "),
            f"{q['values']:,}",
            q["message"][:300],
        )
    counts = report["summary"]["queries"]
    if shown:
        console.print(table)
    console.print(
        "queries: "
        + ", ".join(f"[{_STYLE[s]}]{n} {s}[/]" for s, n in counts.items() if n)
        + ("" if verbose else " (--verbose lists them all)")
    )

    delivery = Table(title="Delivery: sent by the clients vs stored")
    for column in ("store", "key", "sent", "stored", "lost"):
        delivery.add_column(column, justify="left" if column in ("store", "key") else "right")
    for row in report["delivery"]:
        stored = "?" if row["stored"] is None else f"{row['stored']:,}"
        lost = "?" if row["lost"] is None else f"{row['lost']:,}"
        style = "green" if row["ok"] else "red"
        delivery.add_row(row["store"], row["key"], f"{row['sent']:,}", stored, f"[{style}]{lost}[/]")
    console.print(delivery)
    for row in report["delivery"]:
        if row["message"]:
            console.print(f"[red]{row['store']} {row['key']}: {row['message']}[/]")

    alerts = report.get("alerts") or []
    if alerts:
        table = Table(title="Alert rules, evaluated as Grafana would at the end of the load")
        for column in ("rule", "status", "fires", "expected", "instances / message"):
            table.add_column(column, overflow="fold")
        for alert in alerts:
            style = "green" if alert["ok"] else "red"
            shown = ", ".join(
                "{" + ",".join(f"{k}={v}" for k, v in sorted(i["labels"].items())) + "}" for i in alert["instances"][:3]
            )
            table.add_row(
                f"{alert['group']}/{alert['uid']}",
                f"[{style}]{alert['status']}[/]",
                "yes" if alert["fires"] else "no",
                "yes" if alert["expected"] else "no",
                (shown + " " + alert["message"]).strip()[:300],
            )
        console.print(table)

    fleet = report["fleet"]
    summary = report["summary"]
    retries = fleet["metrics"].get("retries", 0) + fleet["logs"].get("retries", 0)
    console.print(
        f"fleet: {fleet['nodes']} nodes in {max(1, fleet['processes'])} process(es), "
        f"{fleet['points_logged']:,} points ({fleet['points_per_sec']:,.0f}/s) and "
        f"{fleet['lines_logged']:,} log lines ({fleet['lines_per_sec']:,.0f}/s) in {fleet['load_seconds']:.1f}s, "
        f"{fleet['cpu_seconds']:.1f}s CPU; retries {retries}"
    )
    for error in fleet["errors"]:
        lines = [line for line in error.strip().splitlines() if line.strip()]
        console.print(f"[red]fleet error: {lines[0]} ... {lines[-1]}[/]" if len(lines) > 1 else f"[red]{error}[/]")
    for sink, reasons in summary["client_drops"].items():
        console.print(f"[red]{sink} client dropped: {reasons}[/]")
    verdict = "[green]OK[/]" if summary["ok"] else f"[red]FAILED (exit code {summary['exit_code']})[/]"
    console.print(f"run {report['run']['run_id']}: {verdict}")
