"""Read the provisioned Grafana dashboards and turn their queries into what Grafana sends.

The simulator and the tests run every panel's own query against real servers, so
they need the same text Grafana would send: dashboards loaded from grafana/, each
panel target and template-variable query with its data source type, and Grafana's
macros and template variables filled in, for InfluxQL, LogQL and MetricsQL (the
Prometheus data source, for VictoriaMetrics).

The interpolation follows Grafana's rules for each data source: a variable that is
multi-valued or has "All" is regex-escaped and joined (``(a|b)`` for InfluxDB and
Prometheus, ``a|b`` for Loki), "All" becomes the variable's ``allValue``; a
single-valued variable is inserted as the data source says (as is for Loki and
InfluxDB, with backslashes and single quotes escaped for Prometheus).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
GRAFANA_DIR = REPO_ROOT / "grafana"
DASHBOARDS_DIR = GRAFANA_DIR / "dashboards"
# The same dashboards with MetricsQL panels, for a stack whose metrics live in VictoriaMetrics.
VICTORIAMETRICS_DASHBOARDS_DIR = GRAFANA_DIR / "dashboards-victoriametrics"
DATASOURCES_DIR = GRAFANA_DIR / "provisioning" / "datasources"
VICTORIAMETRICS_DATASOURCES_DIR = GRAFANA_DIR / "provisioning-victoriametrics" / "datasources"

ALL = "$__all"

# Stream labels the Loki logging handler sets, and the keys of its JSON line body
# (reached with `| json`). Everything else about a line is in the body.
LOKI_STREAM_LABELS: frozenset[str] = frozenset({"service", "environment", "host", "level", "uid", "role", "version"})
LOKI_BODY_KEYS: frozenset[str] = frozenset(
    {"message", "logger", "level", "pid", "thread", "window", "step", "peer", "trace_id", "exception"}
)

# A variable's chosen value: one value, several values, or None for "All".
VariableValue = str | Sequence[str] | None
Dashboard = dict[str, Any]


# ---------------------------------------------------------------- loading


def load_dashboards(directory: Path = DASHBOARDS_DIR) -> list[Dashboard]:
    """Every dashboard JSON of `directory`, sorted by file name."""
    dashboards = []
    for path in sorted(directory.glob("*.json")):
        dashboard = json.loads(path.read_text(encoding="utf-8"))
        dashboard.setdefault("_file", path.name)
        dashboards.append(dashboard)
    return dashboards


def load_datasources(directory: Path = DATASOURCES_DIR) -> dict[str, str]:
    """Provisioned data sources: uid to type (influxdb, loki, ...)."""
    import yaml

    found: dict[str, str] = {}
    for path in sorted([*directory.glob("*.yml"), *directory.glob("*.yaml")]):
        document = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        for source in document.get("datasources") or []:
            found[source["uid"]] = source["type"]
    return found


def iter_panels(dashboard: Dashboard) -> Iterator[dict[str, Any]]:
    """Every panel, including those nested in collapsed rows; rows themselves too."""
    for panel in dashboard.get("panels", []):
        yield panel
        yield from panel.get("panels", [])


@dataclass(frozen=True)
class Query:
    """One query of a dashboard: a panel target or a template variable's query."""

    dashboard_uid: str
    dashboard_title: str
    source: str  # "panel" or "variable"
    name: str  # the panel title, or the variable name
    panel_id: int | None
    ref_id: str
    datasource_type: str
    datasource_uid: str
    text: str  # InfluxQL or LogQL as written in the dashboard, before interpolation
    instant: bool = False
    table: bool = False
    # A Loki target's maxLines: Grafana sends it as the query's `limit`, and the
    # data source's default (1,000) where the target sets none (grafana/grafana
    # pkg/tsdb/loki/api.go makeDataRequest; public/app/plugins/datasource/loki/
    # datasource.ts DEFAULT_MAX_LINES).
    max_lines: int | None = None

    @property
    def where(self) -> str:
        """Where a reader finds this query, for messages."""
        what = f"panel {self.panel_id} {self.name!r}" if self.panel_id else f"${self.name}"
        return f"{self.dashboard_uid}: {what} {self.ref_id}".strip()


def _datasource(ref: Any, fallback: Any, datasources: Mapping[str, str]) -> tuple[str, str]:
    ref = ref if ref not in (None, "") else fallback
    if isinstance(ref, dict):
        uid = str(ref.get("uid", ""))
        return str(ref.get("type") or datasources.get(uid, "")), uid
    uid = str(ref or "")
    return datasources.get(uid, ""), uid


def _target_text(target: Mapping[str, Any]) -> str:
    return str(target.get("query") or target.get("expr") or "")


def panel_queries(dashboard: Dashboard, datasources: Mapping[str, str] | None = None) -> Iterator[Query]:
    """Each target of each panel, with the data source it resolves to."""
    datasources = datasources or {}
    for panel in iter_panels(dashboard):
        for target in panel.get("targets", []):
            ds_type, ds_uid = _datasource(target.get("datasource"), panel.get("datasource"), datasources)
            yield Query(
                dashboard_uid=dashboard["uid"],
                dashboard_title=dashboard.get("title", ""),
                source="panel",
                name=panel.get("title", ""),
                panel_id=panel.get("id"),
                ref_id=target.get("refId", ""),
                datasource_type=ds_type,
                datasource_uid=ds_uid,
                text=_target_text(target),
                instant=target.get("queryType") == "instant" or bool(target.get("instant")),
                table=target.get("resultFormat") == "table" or target.get("format") == "table",
                max_lines=int(target["maxLines"]) if target.get("maxLines") else None,
            )


def variable_query_text(variable: Mapping[str, Any]) -> str:
    """A query variable's query as text (Loki's label_values form for Loki objects)."""
    query = variable.get("query")
    if isinstance(query, dict):
        if "label" in query:
            stream = query.get("stream") or ""
            label = query["label"]
            return f"label_values({stream}, {label})" if stream else f"label_values({label})"
        return str(query.get("query") or query.get("expr") or "")
    return str(query or "")


def variable_queries(dashboard: Dashboard, datasources: Mapping[str, str] | None = None) -> Iterator[Query]:
    """The query of each template variable of type "query"."""
    datasources = datasources or {}
    for variable in dashboard.get("templating", {}).get("list", []):
        if variable.get("type") != "query":
            continue
        ds_type, ds_uid = _datasource(variable.get("datasource"), None, datasources)
        yield Query(
            dashboard_uid=dashboard["uid"],
            dashboard_title=dashboard.get("title", ""),
            source="variable",
            name=variable["name"],
            panel_id=None,
            ref_id="",
            datasource_type=ds_type,
            datasource_uid=ds_uid,
            text=variable_query_text(variable),
        )


def iter_queries(dashboards: Iterable[Dashboard], datasources: Mapping[str, str] | None = None) -> Iterator[Query]:
    """Variable queries, then panel queries, of every dashboard."""
    for dashboard in dashboards:
        yield from variable_queries(dashboard, datasources)
        yield from panel_queries(dashboard, datasources)


def variables_of(dashboard: Dashboard) -> dict[str, dict[str, Any]]:
    """The dashboard's template variables by name."""
    return {v["name"]: v for v in dashboard.get("templating", {}).get("list", [])}


def all_selected(dashboard: Dashboard) -> dict[str, VariableValue]:
    """Every variable at its default: "All" for query variables, a custom one's current value, empty text boxes."""
    values: dict[str, VariableValue] = {}
    for name, variable in variables_of(dashboard).items():
        values[name] = None if variable.get("includeAll") else (variable.get("current") or {}).get("value", "")
    return values


# ---------------------------------------------------------------- time


@dataclass(frozen=True)
class TimeRange:
    """The dashboard's time range."""

    start: datetime
    end: datetime

    @classmethod
    def last(cls, duration: timedelta, now: datetime | None = None) -> TimeRange:
        end = now or datetime.now(UTC)
        return cls(end - duration, end)

    @property
    def start_ms(self) -> int:
        return int(self.start.timestamp() * 1000)

    @property
    def end_ms(self) -> int:
        return int(self.end.timestamp() * 1000)

    @property
    def duration(self) -> timedelta:
        return self.end - self.start


# Grafana's roundInterval (grafana/grafana packages/grafana-data/src/datetime/rangeutil.ts):
# (below this many ms, the interval is this many ms), so range / points goes to the NEAREST of
# its steps (21.6 s to 20 s, 86.4 s to 1 m), not up to the next one. Above the last: 1 year.
_ROUND_INTERVAL_MS: tuple[tuple[int, int], ...] = (
    (10, 1),
    (15, 10),
    (35, 20),
    (75, 50),
    (150, 100),
    (350, 200),
    (750, 500),
    (1500, 1000),
    (3500, 2000),
    (7500, 5000),
    (12500, 10000),
    (17500, 15000),
    (25000, 20000),
    (45000, 30000),
    (90000, 60000),
    (210000, 120000),
    (450000, 300000),
    (750000, 600000),
    (1050000, 900000),
    (1500000, 1200000),
    (2700000, 1800000),
    (5400000, 3600000),
    (9000000, 7200000),
    (16200000, 10800000),
    (32400000, 21600000),
    (86400000, 43200000),
    (604800000, 86400000),
    (1814400000, 604800000),
    (3628800000, 2592000000),
)
_LONGEST_INTERVAL_MS = 31536000000
# calculateInterval's low limit when the data source and the panel set none: 1 ms.
NO_MIN_INTERVAL = timedelta(milliseconds=1)
# The provisioned InfluxDB data source's timeInterval (grafana/provisioning/datasources/):
# the floor Grafana applies to $__interval for its queries. The Loki data source has none.
INFLUXDB_TIME_INTERVAL = timedelta(seconds=10)


def round_interval(interval_ms: float) -> int:
    """rangeutil.ts roundInterval: a raw interval in ms to the nearest of Grafana's steps, in ms."""
    for below, step in _ROUND_INTERVAL_MS:
        if interval_ms < below:
            return step
    return _LONGEST_INTERVAL_MS


def auto_interval(
    time_range: TimeRange, max_data_points: int = 1000, min_interval: timedelta = NO_MIN_INTERVAL
) -> timedelta:
    """Grafana's $__interval: range / max data points rounded to the nearest step, then at least `min_interval`.

    rangeutil.ts calculateInterval: the minimum (the data source's timeInterval, or the
    panel's min interval) is applied after rounding and is not rounded itself.
    """
    raw_ms = time_range.duration.total_seconds() * 1000 / max(1, max_data_points)
    interval_ms = max(round_interval(raw_ms), round(min_interval.total_seconds() * 1000))
    return timedelta(milliseconds=interval_ms)


def format_duration(value: timedelta) -> str:
    """A duration literal both InfluxQL and LogQL accept, e.g. 30s, 5m, 6h, 1d."""
    ms = round(value.total_seconds() * 1000)
    if ms <= 0:
        raise ValueError(f"duration must be positive, not {value}")
    for unit, size in (("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1000)):
        if ms % size == 0:
            return f"{ms // size}{unit}"
    return f"{ms}ms"


# ---------------------------------------------------------------- interpolation

_VARIABLE = re.compile(r"\$\{(\w+)(?::([\w-]+))?\}|\[\[(\w+)(?::([\w-]+))?\]\]|\$(\w+)")
_INFLUX_REGEX = re.compile(r"(=~|!~)(\s*)/((?:\\.|[^/\\])*)/")
_LOKI_STRING = re.compile(r'(=~|!~|\|~|!=|\|=|=)?(\s*)(?:"((?:\\.|[^"\\])*)"|`([^`]*)`)')
# @grafana/data escapeRegex, used by the `${var:regex}` format (packages/grafana-data/src/text/string.ts).
_GRAFANA_REGEX_SPECIAL = re.compile(r"([\\^$*+?.()|\[\]{}/])")
_INFLUX_SPECIAL = re.compile(r"([\\/^$.*+?()\[\]{}|])")
_LOKI_SPECIAL = re.compile(r"([$^*{}\[\]+?.()|])")


def _builtins_influxql(time_range: TimeRange, interval: timedelta) -> dict[str, str]:
    time_filter = f"time >= {time_range.start_ms}ms and time <= {time_range.end_ms}ms"
    return _common_builtins(time_range, interval) | {
        "timeFilter": time_filter,
        "__timeFilter": time_filter,
    }


def _common_builtins(time_range: TimeRange, interval: timedelta) -> dict[str, str]:
    range_s = int(time_range.duration.total_seconds())
    return {
        "__interval_ms": str(int(interval.total_seconds() * 1000)),
        "__interval": format_duration(interval),
        "interval": format_duration(interval),
        "__range_ms": str(range_s * 1000),
        "__range_s": str(range_s),
        "__range": format_duration(timedelta(seconds=max(1, range_s))),
        "__from": str(time_range.start_ms),
        "__to": str(time_range.end_ms),
    }


def _values(value: VariableValue) -> list[str] | None:
    if value is None or value == ALL or (not isinstance(value, str) and ALL in value):
        return None
    if isinstance(value, str):
        return [value]
    return list(value)


def _parenthesised(escaped: list[str]) -> str:
    return escaped[0] if len(escaped) == 1 else "(" + "|".join(escaped) + ")"


def _format(
    name: str,
    value: VariableValue,
    definition: Mapping[str, Any] | None,
    regex: bool,
    escape: Any,
    raw: Any = None,
    join: Any = _parenthesised,
) -> str:
    """Grafana's interpolation of one variable occurrence.

    `escape` formats each value of a multi-value (or "All"-able) variable, `join`
    joins the escaped values, and `raw` formats the value of a single-value
    variable (the data source's own rule: as is for InfluxDB and Loki).
    """
    raw = raw or (lambda text: text)
    definition = definition or {"multi": True, "includeAll": True, "allValue": ".*"}
    values = _values(value)
    if values is None:
        if not definition.get("includeAll"):
            raise ValueError(f"${name} has no 'All' option")
        all_value = definition.get("allValue")
        if all_value:
            return str(all_value)
        options = [o["value"] for o in definition.get("options", []) if o.get("value") != ALL]
        if not options:
            raise ValueError(f"${name} is 'All' but has no allValue and no known options")
        values = options
    if not (definition.get("multi") or definition.get("includeAll")):
        if len(values) != 1:
            raise ValueError(f"${name} takes one value, not {values!r}")
        return raw(values[0])
    if not regex:
        if len(values) != 1:
            raise ValueError(f"${name} has several values outside a regex: {values!r}")
        return raw(values[0])
    return join([escape(v) for v in values])


def _substitute(
    text: str,
    builtins: Mapping[str, str],
    values: Mapping[str, VariableValue],
    definitions: Mapping[str, Mapping[str, Any]],
    regex: bool,
    escape: Any,
    raw: Any = None,
    join: Any = _parenthesised,
    interpolate: Callable[[str, VariableValue, Mapping[str, Any] | None, bool], str] | None = None,
) -> str:
    """Fill in `text`; `interpolate`, when given, is the data source's own rule in place of `_format`."""
    formatter = interpolate or (lambda name, value, definition, in_regex: _format(
        name, value, definition, in_regex, escape, raw, join))  # fmt: skip

    def replace(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(3) or match.group(5)
        explicit = match.group(2) or match.group(4)
        if name in builtins:
            return builtins[name]
        if name in values and explicit in _EXPLICIT_FORMATS:
            chosen = _values(values[name])
            if chosen is None:  # All: Grafana formats the allValue (or every option) the same way
                return _format(name, values[name], definitions.get(name), False, str)
            return _EXPLICIT_FORMATS[explicit](chosen)
        if name in values:
            return formatter(name, values[name], definitions.get(name), regex)
        if name.isdigit():
            # A regex group of label_replace's replacement ("$1"): no variable has that name, and
            # Grafana leaves a reference to no variable as it is (public/app/features/templating/
            # template_srv.ts, replace: `if (!variable) return match`). Any other unknown name is
            # refused here, stricter than Grafana, to catch a misspelt variable.
            return match.group(0)
        raise KeyError(f"no value for ${name}")

    return _VARIABLE.sub(replace, text)


def _definitions(dashboard: Dashboard | None) -> dict[str, dict[str, Any]]:
    return variables_of(dashboard) if dashboard else {}


def grafana_escape_regex(value: str) -> str:
    """Grafana's `${var:regex}` format: regex metacharacters escaped with a backslash."""
    return _GRAFANA_REGEX_SPECIAL.sub(r"\\\1", value)


def _regex_format(values: list[str]) -> str:
    escaped = [grafana_escape_regex(v) for v in values]
    return escaped[0] if len(escaped) == 1 else "(" + "|".join(escaped) + ")"


def _raw_format(values: list[str]) -> str:
    return ",".join(values)


# Formats a query names explicitly (`${var:regex}`), as @grafana/scenes' formatRegistry applies them:
# they replace the data source's own interpolation.
_EXPLICIT_FORMATS = {"regex": _regex_format, "raw": _raw_format}


def influx_regex_escape(value: str) -> str:
    """Escape a value for an InfluxQL /regex/ literal."""
    return _INFLUX_SPECIAL.sub(r"\\\1", value)


def loki_regex_escape(value: str) -> str:
    """Escape a value for a regex inside a LogQL double-quoted string."""
    value = value.replace("\\", "\\\\\\\\")
    return _LOKI_SPECIAL.sub(lambda m: "\\\\" + m.group(1), value)


# JavaScript's parseFloat succeeds (is not NaN) when the text starts with a decimal number.
_JS_FLOAT_PREFIX = re.compile(r"^\s*[+-]?(?:Infinity|[0-9]+\.?[0-9]*|\.[0-9]+)")


def parses_as_number(text: str) -> bool:
    """`!isNaN(parseFloat(text))`: "12", "1.4.2+cu121" and "3 (gpu)" do, "v1.4" does not."""
    return bool(_JS_FLOAT_PREFIX.match(text))


def _influx_interpolate(name: str, value: VariableValue, definition: Mapping[str, Any] | None, regex: bool) -> str:
    """The InfluxDB data source's interpolateQueryExpr, for a variable without an explicit format.

    grafana/grafana-influxdb-datasource src/datasource.ts (the data source Grafana 13
    bundles as `influxdb`; read at commits d4dcc5c and 1e78d52, which differ only in how
    they tell a regex literal):
    - a single value (a string, as a URL or a text box gives it) that parseFloat reads
      as a number is inserted as it is, never escaped: "1.4.2+cu121" (parseFloat 1.4)
      stays unescaped in /^...$/, where `+` is a quantifier, and matches no such tag;
    - a multi-value variable: a single value escaped (escapeRegex), several (a list,
      even of one) escaped and joined as `(a|b)`;
    - any other variable: escaped the same way only inside a regex literal, else as is.
    "All" is the variable's allValue as it is (or every option), before the data source
    sees it (`_format`). `${var:regex}` is not this: Grafana's regex format escapes
    every value whatever it looks like, which is why the dashboards use it.
    """
    definition = definition or {"multi": True, "includeAll": True, "allValue": ".*"}
    if _values(value) is None:
        return _format(name, value, definition, regex, influx_regex_escape)
    if isinstance(value, str):
        if parses_as_number(value) or not (definition.get("multi") or regex):
            return value
        return influx_regex_escape(value)
    values = list(value)
    if not regex and (len(values) != 1 or not definition.get("multi")):
        # `(a|b)` (or, not multi-value, the list joined by commas) outside a regex matches
        # nothing: refused here, stricter than Grafana.
        return _format(name, values, definition, regex, influx_regex_escape)
    return "(" + "|".join(influx_regex_escape(v) for v in values) + ")"


def expand_influxql(
    query: str,
    time_range: TimeRange,
    values: Mapping[str, VariableValue] | None = None,
    *,
    dashboard: Dashboard | None = None,
    interval: timedelta | None = None,
) -> str:
    """InfluxQL with $timeFilter, $__interval, $__range... and template variables filled in.

    `values` maps variable names to their chosen value (None or "$__all" for All);
    `dashboard` supplies the variables' definitions (multi, includeAll, allValue).
    """
    interval = interval or auto_interval(time_range, min_interval=INFLUXDB_TIME_INTERVAL)
    builtins = _builtins_influxql(time_range, interval)
    values = values or {}
    definitions = _definitions(dashboard)

    def fill(text: str, regex: bool) -> str:
        return _substitute(
            text, builtins, values, definitions, regex, influx_regex_escape, interpolate=_influx_interpolate
        )

    pieces: list[str] = []
    last = 0
    for match in _INFLUX_REGEX.finditer(query):
        pieces.append(fill(query[last : match.start()], False))
        pieces.append(f"{match.group(1)}{match.group(2)}/{fill(match.group(3), True)}/")
        last = match.end()
    pieces.append(fill(query[last:], False))
    return "".join(pieces)


def _as_is(value: str) -> str:
    return value


def _loki_join(escaped: list[str]) -> str:
    return "|".join(escaped)


def expand_logql(
    query: str,
    time_range: TimeRange,
    values: Mapping[str, VariableValue] | None = None,
    *,
    dashboard: Dashboard | None = None,
    interval: timedelta | None = None,
) -> str:
    """LogQL with $__auto, $__interval, $__range... and template variables filled in.

    Grafana's Loki data source (grafana/grafana public/app/plugins/datasource/loki/
    datasource.ts, LokiDatasource.interpolateQueryExpr, Grafana 11 and later):
    - a variable that is neither multi-value nor has "All" (a text box, a
      single-value custom variable) is inserted exactly as it is, in a "string"
      or a `raw string` alike: a `"` or `\\` in a text box is NOT escaped, so it
      can end the string early and make the query invalid (Loki answers a parse error);
    - the values of a multi-value variable are escaped by lokiSpecialRegexEscape
      (backslash doubled twice, `$^*{}[]+?.()|` behind two backslashes: one level
      for the LogQL string, one for the regex) and joined with `|`, no parentheses.
    Inside a regex string (=~, !~, |~) several values are accepted; elsewhere this
    refuses them (a query that would silently match nothing).

    Without an `interval`, Grafana's own: the Loki data source is provisioned without a
    timeInterval, so nothing bounds it from below (not 10 s as for the metrics stores).
    """
    interval = interval or auto_interval(time_range)
    builtins = _common_builtins(time_range, interval) | {"__auto": format_duration(interval)}
    values = values or {}
    definitions = _definitions(dashboard)

    def fill(text: str, regex: bool) -> str:
        return _substitute(text, builtins, values, definitions, regex, loki_regex_escape, _as_is, _loki_join)

    pieces: list[str] = []
    last = 0
    for match in _LOKI_STRING.finditer(query):
        pieces.append(fill(query[last : match.start()], False))
        operator = match.group(1) or ""
        regex = operator in ("=~", "!~", "|~")
        if match.group(4) is not None:
            pieces.append(f"{operator}{match.group(2)}`{fill(match.group(4), regex)}`")
        else:
            pieces.append(f'{operator}{match.group(2)}"{fill(match.group(3), regex)}"')
        last = match.end()
    pieces.append(fill(query[last:], False))
    return "".join(pieces)


# ---------------------------------------------------------------- Prometheus (MetricsQL)

# The Prometheus data source's scrape interval ("timeInterval" of the VictoriaMetrics data
# source in grafana/provisioning-victoriametrics/): the floor of Grafana's interval and the
# base of $__rate_interval.
PROMETHEUS_SCRAPE_INTERVAL = timedelta(seconds=10)
_LABEL_VALUES = re.compile(r"^\s*label_values\((?:(.+),\s*)?([a-zA-Z_$][a-zA-Z0-9_]*)\)\s*$", re.DOTALL)


# prometheusSpecialRegexEscape, the classic behaviour (grafana/grafana
# packages/grafana-prometheus/src/escaping.ts; the feature toggle
# prometheusSpecialCharsInLabelValues is off by default): a backslash becomes four,
# each of `$^*{}[]+?.()|` gets two backslashes in front (a `"` is left alone). That
# is the Loki data source's rule too.
prometheus_regex_escape = loki_regex_escape


def prometheus_plain_escape(value: str) -> str:
    """prometheusRegularEscape, classic behaviour (escaping.ts): a single-value variable
    gets its backslashes doubled and each `'` turned into `\\\\'`."""
    return value.replace("\\", "\\\\").replace("'", "\\\\'")


def grafana_format_interval(value: timedelta) -> str:
    """gtime.FormatInterval (grafana-plugin-sdk-go backend/gtime/gtime.go): the largest
    whole unit only, truncating (90 s is "1m")."""
    ms = int(value.total_seconds() * 1000)
    for unit, size in (("y", 365 * 86_400_000), ("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1000)):
        if ms >= size:
            return f"{ms // size}{unit}"
    return f"{ms}ms" if ms >= 1 else "1ms"


def go_duration(value: timedelta) -> str:
    """Go's time.Duration.String() for whole milliseconds: 40s, 1m0s, 1h30m0s, 500ms."""
    ms = round(value.total_seconds() * 1000)
    if ms == 0:
        return "0s"
    if ms < 1000:
        return f"{ms}ms"
    hours, rest = divmod(ms, 3_600_000)
    minutes, rest = divmod(rest, 60_000)
    seconds = f"{rest // 1000}" + (f".{rest % 1000:03d}".rstrip("0") if rest % 1000 else "")
    if hours:
        return f"{hours}h{minutes}m{seconds}s"
    if minutes:
        return f"{minutes}m{seconds}s"
    return f"{seconds}s"


def prometheus_rate_interval(interval: timedelta, scrape: timedelta = PROMETHEUS_SCRAPE_INTERVAL) -> timedelta:
    """$__rate_interval: max(interval + scrape interval, 4 x scrape interval)
    (grafana/grafana pkg/promlib/models/query.go, calculateRateInterval)."""
    return max(interval + scrape, 4 * scrape)


def _builtins_prometheus(time_range: TimeRange, interval: timedelta) -> dict[str, str]:
    """The macros Grafana's backend fills in (grafana/grafana pkg/promlib/models/query.go,
    interpolateVariables, as of commit 00aaabd).

    $__interval is the query's step as gtime.FormatInterval writes it, $__range the
    range in whole seconds (rounded) with an "s", $__rate_interval a Go duration.
    """
    range_ms = time_range.end_ms - time_range.start_ms
    range_s = round(range_ms / 1000)
    rate = prometheus_rate_interval(interval)
    return {
        "__interval_ms": str(int(interval.total_seconds() * 1000)),
        "__interval": grafana_format_interval(interval),
        "__range_ms": str(range_ms),
        "__range_s": str(range_s),
        "__range": f"{range_s}s",
        "__rate_interval_ms": str(int(rate.total_seconds() * 1000)),
        "__rate_interval": go_duration(rate),
        "__from": str(time_range.start_ms),
        "__to": str(time_range.end_ms),
    }


def expand_metricsql(
    query: str,
    time_range: TimeRange,
    values: Mapping[str, VariableValue] | None = None,
    *,
    dashboard: Dashboard | None = None,
    interval: timedelta | None = None,
) -> str:
    """MetricsQL (PromQL) with $__interval, $__range, $__rate_interval... and variables filled in.

    Grafana's Prometheus data source interpolates without looking at the context
    (grafana/grafana packages/grafana-prometheus/src/escaping.ts, interpolateQueryExpr,
    as of commit 057ec12, the rules datasource.ts had before it): a multi-value or
    "All"-able variable has each value escaped by prometheusSpecialRegexEscape and
    several joined as `(a|b)`; "All" is the allValue as is; a single-value variable
    goes through prometheusRegularEscape; `${var:raw}` inserts the values joined by
    commas, unescaped.
    """
    interval = interval or auto_interval(time_range, min_interval=PROMETHEUS_SCRAPE_INTERVAL)
    builtins = _builtins_prometheus(time_range, interval)
    return _substitute(
        query, builtins, values or {}, _definitions(dashboard), True, prometheus_regex_escape, prometheus_plain_escape
    )


def prometheus_range(time_range: TimeRange, interval: timedelta) -> dict[str, str]:
    """start, end and step of the /api/v1/query_range request Grafana sends: the step is the
    interval, start and end rounded down to a multiple of it (pkg/promlib/models/query.go,
    AlignTimeRange, for a browser in UTC)."""
    step_ms = int(interval.total_seconds() * 1000)
    start = time_range.start_ms // step_ms * step_ms
    end = time_range.end_ms // step_ms * step_ms
    return {"start": prometheus_time(start), "end": prometheus_time(end), "step": prometheus_time(step_ms)}


def prometheus_time(ms: int) -> str:
    """Epoch milliseconds as the seconds the Prometheus API takes (e.g. 1796038200 or 1796038200.5)."""
    return f"{ms / 1000:.3f}".rstrip("0").rstrip(".")


def prometheus_label_values(text: str) -> tuple[str, str | None]:
    """The label and the selector (or None) of a `label_values([selector, ]label)` variable query.

    Grafana asks /api/v1/label/<label>/values, with match[]=<selector> when there is
    one (packages/grafana-prometheus/src/metric_find_query.ts, labelValuesQuery).
    """
    match = _LABEL_VALUES.match(text)
    if not match:
        raise ValueError(f"not a label_values() query: {text!r}")
    return match.group(2), match.group(1)


def expand(
    query: Query,
    time_range: TimeRange,
    values: Mapping[str, VariableValue] | None = None,
    *,
    dashboard: Dashboard | None = None,
    interval: timedelta | None = None,
) -> str:
    """Interpolate `query` in its own data source's language."""
    if query.datasource_type == "influxdb":
        return expand_influxql(query.text, time_range, values, dashboard=dashboard, interval=interval)
    if query.datasource_type == "loki":
        return expand_logql(query.text, time_range, values, dashboard=dashboard, interval=interval)
    if query.datasource_type == "prometheus":
        return expand_metricsql(query.text, time_range, values, dashboard=dashboard, interval=interval)
    raise ValueError(f"{query.where}: no interpolation for data source {query.datasource_type!r}")


_VIEW_SERIES = re.compile(
    r'label_(match|mismatch)\(label_set\(vector\(1\), "sel", "((?:[^"\\]|\\.)*)"\), "sel", "\\\\\.\\\\\*"\)'
)
_FOLDED = re.compile(
    r"'((?:[^'\\]|\\.)*)'\s*(=|!=)\s*'((?:[^'\\]|\\.)*)'"
    r"|\b(\d+)\s*-\s*(\d+)\s*(<=|>)\s*(\d+)(?:\s*/\s*(\d+))?\b"
)


def answers(
    query: Query,
    time_range: TimeRange,
    values: Mapping[str, VariableValue] | None = None,
    *,
    dashboard: Dashboard | None = None,
) -> bool:
    """Whether `query` is its panel's live target for this time range and these variables.

    The dashboards' InfluxQL pairs targets with comparisons of literals once
    filled in: ${__to} - ${__from} against $raw_up_to_ms (raw data or the
    downsampled copy) and '${uid:raw}' against '.*' (the fleet or chosen nodes).
    InfluxDB folds such a comparison, and a false one makes the target answer
    nothing; this evaluates them the same way. The MetricsQL twins make the fleet
    or nodes condition a series that exists or not (label_match / label_mismatch
    of "${uid:raw}" against ".*"), evaluated here too.
    """
    if query.datasource_type == "prometheus":
        text = expand(query, time_range, values, dashboard=dashboard)
        return all((m.group(2) == ".*") == (m.group(1) == "match") for m in _VIEW_SERIES.finditer(text))
    if query.datasource_type != "influxdb":
        return True
    text = expand(query, time_range, values, dashboard=dashboard)
    for match in _FOLDED.finditer(text):
        if match.group(2):
            holds = (match.group(1) == match.group(3)) == (match.group(2) == "=")
        else:
            difference, limit = int(match.group(4)) - int(match.group(5)), int(match.group(7))
            if match.group(8):  # "$raw_up_to_ms / 6": InfluxQL divides the literals as floats
                limit = limit / int(match.group(8))
            holds = difference <= limit if match.group(6) == "<=" else difference > limit
        if not holds:
            return False
    return True


# ---------------------------------------------------------------- references

_QUOTED = re.compile(r'"((?:[^"\\]|\\.)*)"')
_SELECT_LIST = re.compile(r"\bSELECT\s+(.*?)\s+FROM\b", re.IGNORECASE | re.DOTALL)
_FROM = re.compile(r'\bFROM\s+(\(|(?:"(?:[^"\\]|\\.)*"\.)?"((?:[^"\\]|\\.)*)"|\S+)', re.IGNORECASE)
_TEMPLATE = re.compile(r"\$\{[^}]*\}|\$\w+|\[\[[^\]]*\]\]")
_SELECTOR_TAGS = re.compile(r'\b(?:top|bottom)\(\s*"(?:[^"\\]|\\.)*"\s*,((?:\s*"(?:[^"\\]|\\.)*"\s*,)+)', re.IGNORECASE)
_ALIAS = re.compile(r'\bAS\s+"((?:[^"\\]|\\.)*)"', re.IGNORECASE)
_COMPARED = re.compile(r'"((?:[^"\\]|\\.)*)"\s*(?:=~|!~|!=|<>|=)')
_GROUP_BY = re.compile(r'\bGROUP\s+BY\s+((?:time\([^)]*\)|"(?:[^"\\]|\\.)*"|[\s,])+)', re.IGNORECASE)
_SHOW_KEY = re.compile(r'\bWITH\s+KEY\s*=\s*"((?:[^"\\]|\\.)*)"', re.IGNORECASE)
_FUNCTIONS = frozenset(
    {
        "mean",
        "median",
        "mode",
        "sum",
        "count",
        "min",
        "max",
        "first",
        "last",
        "spread",
        "stddev",
        "percentile",
        "difference",
        "derivative",
        "non_negative_derivative",
        "non_negative_difference",
        "moving_average",
        "cumulative_sum",
        "integral",
        "distinct",
        "abs",
        "round",
        "floor",
        "ceil",
        "top",
        "bottom",
        "as",
    }
)


@dataclass(frozen=True)
class InfluxReferences:
    """What an InfluxQL query names: measurements, fields, tags and its own aliases."""

    measurements: frozenset[str]
    fields: frozenset[str]
    tags: frozenset[str]
    aliases: frozenset[str]
    show_tag_keys: frozenset[str]
    problems: tuple[str, ...]


def influxql_references(query: str) -> InfluxReferences:
    """The identifiers an InfluxQL query (with or without Grafana macros) refers to.

    Measurements are the quoted names after FROM, fields the quoted names inside
    SELECT lists (aliases excluded), tags the quoted names compared in WHERE and
    listed in GROUP BY, and SHOW TAG VALUES keys. Anything this cannot classify,
    such as an unquoted identifier, is reported in `problems` rather than guessed.
    """
    problems: list[str] = []
    measurements: set[str] = set()
    for match in _FROM.finditer(query):
        if match.group(1) == "(":
            continue
        if match.group(2) is None:
            problems.append(f"unquoted measurement after FROM: {match.group(1)!r}")
            continue
        measurements.add(match.group(2))
    aliases = {m.group(1) for m in _ALIAS.finditer(query)}
    fields: set[str] = set()
    tags: set[str] = set()
    for match in _SELECT_LIST.finditer(query):
        select_list = match.group(1)
        # top("field", "tag"[, "tag"...], N): the names after the field are tags.
        for selector in _SELECTOR_TAGS.finditer(select_list):
            tags.update(m.group(1) for m in _QUOTED.finditer(selector.group(1)))
        select_list = _SELECTOR_TAGS.sub(lambda m: m.group(0)[: m.start(1) - m.start(0)], select_list)
        without_aliases = _ALIAS.sub("", select_list)
        fields.update(m.group(1) for m in _QUOTED.finditer(without_aliases))
        bare = _TEMPLATE.sub("", _QUOTED.sub("", without_aliases))
        bare = re.sub(r"\b\d+(?:\.\d+)?[a-z]*\b", "", bare)
        for word in re.findall(r"[A-Za-z_]\w*", bare):
            if word.lower() not in _FUNCTIONS:
                problems.append(f"unquoted identifier in SELECT: {word!r}")
    tags.update(m.group(1) for m in _COMPARED.finditer(query))
    for match in _GROUP_BY.finditer(query):
        tags.update(m.group(1) for m in _QUOTED.finditer(match.group(1)))
    show_keys = {m.group(1) for m in _SHOW_KEY.finditer(query)}
    return InfluxReferences(
        measurements=frozenset(measurements),
        fields=frozenset(fields),
        tags=frozenset(tags),
        aliases=frozenset(aliases),
        show_tag_keys=frozenset(show_keys),
        problems=tuple(problems),
    )


_LOKI_SELECTOR = re.compile(r"(?<!\$)\{([^{}]*)\}")  # not a ${variable:format}
_LOKI_MATCHER = re.compile(r'([A-Za-z_]\w*)\s*(=~|!~|!=|=)\s*(?:"(?:[^"\\]|\\.)*"|`[^`]*`)')
_LOKI_GROUPING = re.compile(r"\b(?:by|without)\s*\(([^)]*)\)")
_LOKI_LABEL_VALUES = re.compile(r"label_values\((?:\{[^{}]*\}\s*,\s*)?([A-Za-z_]\w*)\s*\)")
# label_replace(v, "dst", "replacement", "src", "regex"): the destination label it writes.
_LOKI_LABEL_REPLACE_TARGET = re.compile(r',\s*"([A-Za-z_]\w*)"\s*,\s*"[^"]*"\s*,\s*"[A-Za-z_]\w*"\s*,\s*"[^"]*"\s*\)')


@dataclass(frozen=True)
class LokiReferences:
    """What a LogQL query names: stream labels in selectors, labels it groups by."""

    stream_labels: frozenset[str]
    grouping_labels: frozenset[str]
    parses_json: bool
    problems: tuple[str, ...]


def logql_references(expr: str) -> LokiReferences:
    """Stream labels of every selector, grouping labels, and whether `| json` is used."""
    problems: list[str] = []
    stream: set[str] = set()
    selectors = _LOKI_SELECTOR.findall(expr)
    if not selectors and not _LOKI_LABEL_VALUES.search(expr):
        problems.append("no stream selector")
    for selector in selectors:
        matched = _LOKI_MATCHER.findall(selector)
        if not matched and selector.strip():
            problems.append(f"cannot read the selector {{{selector}}}")
        stream.update(name for name, _ in matched)
        leftover = _LOKI_MATCHER.sub("", selector).replace(",", "").strip()
        if leftover:
            problems.append(f"unexpected text in selector: {leftover!r}")
    stream.update(_LOKI_LABEL_VALUES.findall(expr))
    grouping: set[str] = set()
    for match in _LOKI_GROUPING.finditer(expr):
        grouping.update(label.strip() for label in match.group(1).split(",") if label.strip())
    # A label label_replace writes exists in the result whatever the stream holds.
    grouping -= set(_LOKI_LABEL_REPLACE_TARGET.findall(expr))
    return LokiReferences(
        stream_labels=frozenset(stream),
        grouping_labels=frozenset(grouping),
        parses_json=bool(re.search(r"\|\s*json\b", expr)),
        problems=tuple(problems),
    )


_PROM_METRIC = re.compile(
    r"\b([A-Za-z_:][\w:]*)\s*[{[]"
)  # a selector: a name with matchers, or a bare one with a range
_PROM_NAME_PREFIX = re.compile(r'__name__\s*=~\s*"([A-Za-z_]\w*?)_\.[+*]"')
_PROM_MATCHER = re.compile(r'\b([A-Za-z_]\w*)\s*(?:=~|!~|!=|=)\s*"')
_PROM_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)")
_PROM_OWN_LABEL = re.compile(r'\blabel_(?:set|replace|match|mismatch)\(.*?,\s*"([A-Za-z_]\w*)"')
_PROM_LABEL_VALUES_LABEL = re.compile(r",?\s*([A-Za-z_]\w*)\s*\)\s*$")
_PROM_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')


@dataclass(frozen=True)
class MetricsQLReferences:
    """What a MetricsQL query names: metrics (measurement_field), measurements by a
    __name__ prefix, labels it filters or groups on, and labels it makes itself."""

    metrics: frozenset[str]
    name_prefixes: frozenset[str]
    labels: frozenset[str]
    own_labels: frozenset[str]


def metricsql_references(expr: str) -> MetricsQLReferences:
    """The identifiers a MetricsQL query (or a label_values() variable query) refers to."""
    own = set(_PROM_OWN_LABEL.findall(expr))
    labels = {name for name in _PROM_MATCHER.findall(expr) if name != "__name__"}
    for group in _PROM_GROUPING.findall(expr):
        labels.update(label.strip() for label in group.split(",") if label.strip())
    label_values = _LABEL_VALUES.match(expr)
    if label_values:
        labels.add(label_values.group(2))
    unquoted = _PROM_STRING.sub('""', expr)
    return MetricsQLReferences(
        metrics=frozenset(_PROM_METRIC.findall(unquoted)),
        name_prefixes=frozenset(_PROM_NAME_PREFIX.findall(expr)),
        labels=frozenset(labels - own),
        own_labels=frozenset(own),
    )
