"""Template variables: the chained node filters (network, role, uid, version) and friends."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from grafana.builder.dialects import current_dialect
from grafana.builder.influxql import ALWAYS_RAW_MS, LONG_RANGE_MS
from grafana.builder.targets import LOKI, Json


def _query_variable(
    name: str, label: str, datasource: dict[str, str], query: Any, definition: str, all_value: str
) -> Json:
    return {
        "name": name,
        "label": label,
        "type": "query",
        "datasource": datasource,
        "query": query,
        "definition": definition,
        "refresh": 2,
        "includeAll": True,
        "allValue": all_value,
        "multi": True,
        "sort": 1,
        "regex": "",
        "hide": 0,
        "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
        "options": [],
    }


def metric_variable(name: str, label: str, key: str, source: str | None, depends_on: Sequence[str] = ()) -> Json:
    """The values of tag `key` (of measurement `source`, or of any) in the backend being built for,
    narrowed by the variables chosen before it."""
    dialect = current_dialect()
    query = dialect.tag_values(key, source, depends_on)
    return _query_variable(name, label, dialect.datasource, query, query, ".*")


def node_variables(source: str | None) -> list[Json]:
    """network, role, uid and version, each chained to the ones before it."""
    return [
        metric_variable("network", "Network", "network", source),
        metric_variable("role", "Role", "role", source, ("network",)),
        metric_variable("uid", "UID", "uid", source, ("network", "role")),
        metric_variable("version", "Version", "version", source, ("network",)),
    ]


def loki_variable(name: str, label: str, stream_label: str, stream: str, all_value: str = ".*") -> Json:
    """A label_values() variable of the Loki data source."""
    query = {
        "qryType": 1,
        "label": stream_label,
        "stream": stream,
        "refId": "LokiVariableQueryEditor-VariableQuery",
    }
    definition = f"label_values({stream}, {stream_label})" if stream else f"label_values({stream_label})"
    return _query_variable(name, label, LOKI, query, definition, all_value)


def textbox_variable(name: str, label: str) -> Json:
    return {
        "name": name,
        "label": label,
        "type": "textbox",
        "query": "",
        "hide": 0,
        "current": {"selected": False, "text": "", "value": ""},
        "options": [],
    }


def raw_range_variable() -> Json:
    """Up to which time range panels read the raw data; longer ranges read the downsampled copy.

    "always" is for a server without the copy (InfluxDB 3.x) or for every point of
    a long range, at the cost of a slower dashboard.
    """
    options = [("6 hours", str(LONG_RANGE_MS)), ("1 day", str(4 * LONG_RANGE_MS)), ("always", str(ALWAYS_RAW_MS))]
    return {
        "name": "raw_up_to_ms",
        "label": "Raw data up to",
        "type": "custom",
        "query": ", ".join(f"{text} : {value}" for text, value in options),
        "includeAll": False,
        "multi": False,
        "hide": 0,
        "current": {"selected": True, "text": options[0][0], "value": options[0][1]},
        "options": [{"selected": i == 0, "text": text, "value": value} for i, (text, value) in enumerate(options)],
    }
