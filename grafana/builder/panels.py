"""Panel placement and the dashboard envelope shared by every dashboard."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence

from grafana.builder.dialects import current_dialect
from grafana.builder.targets import LOKI, Json
from grafana.builder.variables import raw_range_variable

SCHEMA_VERSION = 41
# Panel ids are integers from 1 up to this (Grafana's schema has them as 32-bit; JavaScript reads them exactly).
MAX_PANEL_ID = 2**31 - 1


def panel_id(key: str) -> int:
    """The id of the panel keyed `key`: the same in every build, whatever panels come before or after it.

    A numbering in placement order would renumber every panel after an inserted
    one and break the links that name a panel (`viewPanel=` bookmarks, the alert
    rules' panelId). A hash of the key keeps them.
    """
    digest = hashlib.sha256(key.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") % MAX_PANEL_ID + 1


class Layout:
    """Places panels left to right, two per row, each with the id of its key (its title unless given)."""

    def __init__(self) -> None:
        self.y = 0
        self.x = 0
        self.panels: list[Json] = []
        self._keys: dict[int, str] = {}  # id to the key it came from, to refuse a duplicate or a collision

    def _identify(self, panel: Json, key: str | None) -> None:
        key = panel["title"] if key is None else key
        number = panel_id(key)
        if number in self._keys:
            other = self._keys[number]
            problem = "a duplicate panel key" if other == key else f"the same id as the panel keyed {other!r}"
            raise ValueError(f"panel {panel['title']!r} (key {key!r}) has {problem}: give it another key=")
        self._keys[number] = key
        panel["id"] = number

    def _place(self, panel: Json, width: int, height: int, key: str | None) -> None:
        self._identify(panel, key)
        if self.x + width > 24:
            self.x = 0
            self.y += height
        panel["gridPos"] = {"h": height, "w": width, "x": self.x, "y": self.y}
        self.x += width
        if self.x >= 24:
            self.x = 0
            self.y += height
        self.panels.append(panel)

    def row(self, title: str, *, key: str | None = None) -> None:
        """A row header (a panel too: it has an id, keyed by its title unless given)."""
        if self.x:
            self.x = 0
            self.y += 8
        self._place({"type": "row", "title": title, "collapsed": False, "panels": []}, 24, 1, key)

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
        key: str | None = None,
    ) -> None:
        """Place a panel; its id comes from `key`, its title unless given (unique within the dashboard)."""
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
        self._place(panel, width, height, key)

    def timeseries(
        self,
        title: str,
        description: str,
        *targets: Json,
        unit: str = "short",
        width: int = 12,
        key: str | None = None,
    ) -> None:
        datasource = targets[0]["datasource"]
        self.add("timeseries", title, description, datasource, targets, unit=unit, width=width, key=key)

    def table(self, title: str, description: str, *targets: Json, width: int = 12, key: str | None = None) -> None:
        self.add("table", title, description, targets[0]["datasource"], targets, width=width, key=key)

    def logs(self, title: str, description: str, target: Json, height: int = 14, key: str | None = None) -> None:
        options = {
            "showTime": True,
            "wrapLogMessage": True,
            "sortOrder": "Descending",
            "enableLogDetails": True,
            "prettifyLogMessage": False,
            "dedupStrategy": "none",
        }
        self.add("logs", title, description, LOKI, [target], width=24, height=height, options=options, key=key)


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
