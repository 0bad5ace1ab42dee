"""Data sources and query targets: the pieces every panel and alert rule points at."""

from __future__ import annotations

import re
from typing import Any

Json = dict[str, Any]

# Fixed uids of the provisioned data sources (grafana/provisioning/datasources/).
INFLUX: dict[str, str] = {"type": "influxdb", "uid": "influxdb"}
LOKI: dict[str, str] = {"type": "loki", "uid": "loki"}
# VictoriaMetrics answers Prometheus's query API: Grafana's Prometheus data source reads it.
VICTORIAMETRICS: dict[str, str] = {"type": "prometheus", "uid": "victoriametrics"}

# A neutral legend names labels (tags) in braces, e.g. "{uid} gpu{gpu_index}", and
# the value's own name (a fleet statistic, a counter's alias) as {stat}.
_LEGEND_NAME = re.compile(r"\{(\w+)\}")


def influx_alias(legend: str) -> str:
    """A neutral legend as an InfluxDB alias: $tag_<tag>, and $col for the value's name."""
    return _LEGEND_NAME.sub(lambda m: "$col" if m.group(1) == "stat" else f"$tag_{m.group(1)}", legend)


def prometheus_legend(legend: str) -> str:
    """A neutral legend as a Prometheus legendFormat: {{label}} (the value's name is the label `stat`)."""
    return _LEGEND_NAME.sub(lambda m: "{{" + m.group(1) + "}}", legend)


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


def prometheus_target(ref: str, expr: str, legend: str = "", table: bool = False) -> Json:
    """A MetricsQL target of the VictoriaMetrics data source; a table is one instant query."""
    target: Json = {
        "refId": ref,
        "datasource": VICTORIAMETRICS,
        "expr": expr,
        "editorMode": "code",
        "format": "table" if table else "time_series",
        "range": not table,
        "instant": table,
    }
    if legend:
        target["legendFormat"] = legend
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
