"""The stack's own backup reports (`stack_backup`), as the backup role's report timer writes them, for a run.

In production the backup role's report timer on each stateful host writes one
`stack_backup` point per report, after every backup run and every 15 minutes:
`stack_backup,host=<inventory hostname> last_success=...,age_seconds=...,last_run_ok=<0i|1i>,
last_duration_seconds=...,added_bytes=<n>i <ns>` (telemetry_client/catalog.py), in
InfluxDB line protocol to the metrics store's write endpoint. The simulator's stack
has no backups, so with `--backup-status` it writes such reports for HOSTS over the
load, every REPORT_EVERY_SECONDS (1 s, where the real timer reports every 15
minutes; the rule's report window is the run's span), to the same write URL the
nodes use:

- a clean host's last backup succeeded a few hours before the load (LAST_SUCCESS_HOURS,
  all well under the alert threshold), and every run is ok: its age grows with time;
- under the backup-overdue fault the first host's last success ended the threshold
  before the fault's start, and its run at the fault's start fails: from then on its
  reports say the last run failed and its age is over the threshold.

The ages are real ones (a day, not a few seconds): the simulator judges the rule with
the production threshold, ALERT_BACKUP_MAX_AGE_SECONDS.
"""

from __future__ import annotations

import re
import ssl
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass

from simulator.faults import ActiveFault
from telemetry_client.config import influxdb_config

MEASUREMENT = "stack_backup"
# Stateful hosts, named as an inventory names them (the `host` tag).
HOSTS: tuple[str, ...] = ("metrics_prod", "grafana_prod", "loki_prod")
# How long before the load each host's last backup succeeded, on a clean run.
LAST_SUCCESS_HOURS: tuple[float, ...] = (2.0, 9.5, 20.0)
REPORT_EVERY_SECONDS = 1.0
FAULT = "backup-overdue"
_READS = re.compile(rf"\b{MEASUREMENT}")  # "stack_backup" (InfluxQL) or stack_backup_<field> (MetricsQL)


@dataclass(frozen=True)
class Report:
    """One report of one host, the fields of the catalog's stack_backup."""

    host: str
    ts_ns: int
    last_success: float
    age_seconds: float
    last_run_ok: int
    last_duration_seconds: float
    added_bytes: int

    def line(self) -> str:
        """The report in InfluxDB line protocol, integers marked `i` as the report timer writes them."""
        fields = (
            f"last_success={self.last_success!r},age_seconds={self.age_seconds!r},last_run_ok={self.last_run_ok}i,"
            f"last_duration_seconds={self.last_duration_seconds!r},added_bytes={self.added_bytes}i"
        )
        return f"{MEASUREMENT},host={self.host} {fields} {self.ts_ns}"


def reports(
    faults: Sequence[ActiveFault],
    started_ns: int,
    load_seconds: float,
    max_age_seconds: float,
    every: float = REPORT_EVERY_SECONDS,
) -> list[Report]:
    """Every report of the run, in time order: each host every `every` seconds from the load's start to its end."""
    overdue = [fault.at for fault in faults if fault.kind == FAULT]
    fault_at = min(overdue) if overdue else None
    start_s = started_ns / 1e9
    out: list[Report] = []
    count = int(load_seconds // every) + 1
    for number in range(count):
        offset = number * every
        ts_ns = started_ns + int(offset * 1e9)
        for index, host in enumerate(HOSTS):
            failing = fault_at is not None and index == 0
            if failing:
                assert fault_at is not None
                last_success = start_s + fault_at - max_age_seconds  # the age reaches the threshold at the start
                ok = 0 if offset >= fault_at else 1
            else:
                last_success = start_s - LAST_SUCCESS_HOURS[index % len(LAST_SUCCESS_HOURS)] * 3600
                ok = 1
            out.append(
                Report(
                    host=host,
                    ts_ns=ts_ns,
                    last_success=round(last_success, 3),
                    age_seconds=round(ts_ns / 1e9 - last_success, 3),
                    last_run_ok=ok,
                    last_duration_seconds=float(40 + 25 * index),
                    added_bytes=(index + 1) * 5_000_000,
                )
            )
    return out


def write(
    influx_url: str,
    database: str,
    written: Sequence[Report],
    *,
    api_version: int = 2,
    token: str | None = None,
    org: str | None = None,
    username: str | None = None,
    password: str | None = None,
    timeout: float = 30.0,
) -> int:
    """POST the reports to the write URL a node's client resolves for these settings; how many were written.

    RuntimeError with the store's answer when it refuses them.
    """
    settings = influxdb_config(
        url=influx_url,
        database=database,
        api_version=api_version,
        token=token,
        org=org,
        username=username,
        password=password,
    )
    body = "".join(report.line() + "\n" for report in written).encode()
    request = urllib.request.Request(settings.write_url or "", data=body, headers=dict(settings.headers), method="POST")
    tls = ssl.create_default_context()
    if not settings.verify_tls:
        tls.check_hostname = False
        tls.verify_mode = ssl.CERT_NONE
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=tls))
    try:
        with opener.open(request, timeout=timeout) as answer:
            answer.read()
    except urllib.error.HTTPError as exc:
        text = exc.read().decode("utf-8", "replace")[:300]
        raise RuntimeError(f"the metrics store refused the backup reports: HTTP {exc.code} {text}") from None
    except OSError as exc:
        raise RuntimeError(f"cannot write the backup reports: {exc}") from None
    return len(written)


WITHOUT_BACKUPS = "no backup reports in this run (--backup-status)"


def reads_backups(text: str) -> bool:
    """Whether a metrics query reads the stack's backup reports (InfluxQL or MetricsQL)."""
    return bool(_READS.search(text))
