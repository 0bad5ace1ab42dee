"""Data sources and query targets: the pieces every panel and alert rule points at."""

from __future__ import annotations

from typing import Any

Json = dict[str, Any]

# Fixed uids of grafana/provisioning/datasources/datasources.yml.
INFLUX: dict[str, str] = {"type": "influxdb", "uid": "influxdb"}
LOKI: dict[str, str] = {"type": "loki", "uid": "loki"}


def influx_target(ref: str, query: str, alias: str = "", table: bool = False) -> Json:
    target: Json = {
        "refId": ref,
        "datasource": INFLUX,
        "rawQuery": True,
        "query": query,
        "resultFormat": "table" if table else "time_series",
    }
    if alias:
        target["alias"] = alias
    return target


def loki_target(ref: str, expr: str, legend: str = "", instant: bool = False) -> Json:
    target: Json = {
        "refId": ref,
        "datasource": LOKI,
        "expr": expr,
        "queryType": "instant" if instant else "range",
        "editorMode": "code",
    }
    if legend:
        target["legendFormat"] = legend
    return target
