"""Panel placement and the dashboard envelope shared by every dashboard."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from grafana.builder.dialects import current_dialect
from grafana.builder.targets import LOKI, Json
from grafana.builder.variables import raw_range_variable

SCHEMA_VERSION = 41


class Layout:
    """Places panels left to right, two per row, and numbers them."""

    def __init__(self) -> None:
        self.next_id = 1
        self.y = 0
        self.x = 0
        self.panels: list[Json] = []

    def _place(self, panel: Json, width: int, height: int) -> None:
        if self.x + width > 24:
            self.x = 0
            self.y += height
        panel["id"] = self.next_id
        panel["gridPos"] = {"h": height, "w": width, "x": self.x, "y": self.y}
        self.next_id += 1
        self.x += width
        if self.x >= 24:
            self.x = 0
            self.y += height
        self.panels.append(panel)

    def row(self, title: str) -> None:
        if self.x:
            self.x = 0
            self.y += 8
        self._place({"type": "row", "title": title, "collapsed": False, "panels": []}, 24, 1)

    def add(
        self,
        kind: str,
        title: str,
        description: str,
        datasource: dict[str, str],
        targets: Iterable[Json],
        *,
        unit: str = "short",
        width: int = 12,
        height: int = 8,
        options: Json | None = None,
        decimals: int | None = None,
    ) -> None:
        defaults: Json = {"unit": unit}
        if decimals is not None:
            defaults["decimals"] = decimals
        targets = list(targets)
        # Several queries' columns make one table, joined on their labels (the raw/long twins
        # of an InfluxQL target are one query: only one of them answers).
        merge = kind == "table" and len(targets) > 1
        dialect = current_dialect()
        targets = [
            twin
            for target in targets
            for twin in (dialect.panel_targets(target) if target["datasource"] == dialect.datasource else [target])
        ]
        panel: Json = {
            "type": kind,
            "title": title,
            "description": description,
            "datasource": datasource,
            "targets": targets,
            "fieldConfig": {"defaults": defaults, "overrides": []},
            "options": options or {},
        }
        if merge:
            panel["transformations"] = [{"id": "merge", "options": {}}]
        if kind == "timeseries":
            panel["fieldConfig"]["defaults"]["custom"] = {"spanNulls": True, "lineWidth": 1}
            panel["options"] = options or {
                "legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
                "tooltip": {"mode": "multi", "sort": "desc"},
            }
        self._place(panel, width, height)

    def timeseries(self, title: str, description: str, *targets: Json, unit: str = "short", width: int = 12) -> None:
        datasource = targets[0]["datasource"]
        self.add("timeseries", title, description, datasource, targets, unit=unit, width=width)

    def table(self, title: str, description: str, *targets: Json, width: int = 12) -> None:
        self.add("table", title, description, targets[0]["datasource"], targets, width=width)

    def logs(self, title: str, description: str, target: Json, height: int = 14) -> None:
        options = {
            "showTime": True,
            "wrapLogMessage": True,
            "sortOrder": "Descending",
            "enableLogDetails": True,
            "prettifyLogMessage": False,
            "dedupStrategy": "none",
        }
        self.add("logs", title, description, LOKI, [target], width=24, height=height, options=options)


def _range_variables(layout: Layout) -> list[Json]:
    """The $raw_up_to_ms variable, on a dashboard whose panels read it (every InfluxQL one)."""
    uses = any("$raw_up_to_ms" in t.get("query", "") for p in layout.panels for t in p.get("targets", []))
    return [raw_range_variable()] if uses else []


def dashboard(
    uid: str, title: str, description: str, tags: Sequence[str], variables: list[Json], layout: Layout
) -> Json:
    return {
        "uid": uid,
        "title": title,
        "description": description,
        "tags": ["telemetry", *tags],
        "editable": False,
        "graphTooltip": 1,
        "timezone": "browser",
        "time": {"from": "now-6h", "to": "now"},
        "refresh": "30s",
        "schemaVersion": SCHEMA_VERSION,
        "version": 1,
        "annotations": {"list": []},
        "links": [
            {
                "type": "dashboards",
                "tags": ["telemetry"],
                "asDropdown": True,
                "title": "Dashboards",
                "includeVars": True,
                "keepTime": True,
            }
        ],
        "templating": {"list": variables + _range_variables(layout)},
        "panels": layout.panels,
    }
