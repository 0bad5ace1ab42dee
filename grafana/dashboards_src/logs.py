"""Logs: volume by level and service, error rates, and the searchable log panels (LogQL)."""

from __future__ import annotations

from grafana.builder.panels import Layout, dashboard
from grafana.builder.queries import (
    ERRORS,
    loki_selector,
    uid_from_tenant,
)
from grafana.builder.targets import Json, loki_target
from grafana.builder.variables import loki_variable, textbox_variable

# Lines a log panel asks for. Loki's answer (up to this many lines of up to
# max_line_size, 256KB) must fit the query path's gRPC message limits in
# compose/loki/loki.yml (100 MiB); Grafana's own default would be 1000 lines.
LOG_PANEL_LINES = 250


# The Search box: a LogQL raw string (backticks: no escape sequences to break) holding
# the text regex-escaped by Grafana's `regex` format, so any text is searched for
# literally, anywhere in the line, ignoring case. A raw string cannot hold a
# backtick: text with one makes Loki answer a parse error, said on the panels.
SEARCH = "|~ `(?i)${search:regex}`"
SEARCH_HELP = (
    "The Search box finds its text literally (characters such as . * [ \\ are plain text, not a regex), "
    'anywhere in the line as stored, ignoring case (a JSON line stores a quote as \\"); '
    "text containing a backtick (`) cannot be searched for."
)


def _lines(target: Json) -> Json:
    """A log panel's target with its line count."""
    return {**target, "maxLines": LOG_PANEL_LINES}


def build() -> Json:
    ly = Layout()
    everything = loki_selector()
    any_level = loki_selector(level=False)
    errors = loki_selector(ERRORS, level=False)
    ly.row("Volume and errors")
    ly.timeseries(
        "Log lines by level",
        "Lines per interval, by level.",
        loki_target("A", f"sum by (level) (count_over_time({everything}[$__auto]))", "{{level}}"),
    )
    ly.timeseries(
        "Log lines by service",
        "Lines per interval, by service.",
        loki_target("A", f"sum by (service) (count_over_time({everything}[$__auto]))", "{{service}}"),
    )
    ly.timeseries(
        "Errors per second by service",
        "Rate of error and critical lines.",
        loki_target("A", f"sum by (service) (rate({errors}[$__auto]))", "{{service}}"),
    )
    ly.timeseries(
        "Error ratio",
        "Error and critical lines as a share of all lines.",
        loki_target("A", f"sum(rate({errors}[$__auto])) / sum(rate({any_level}[$__auto]))", "errors"),
        unit="percentunit",
    )
    ly.table(
        "Most frequent error sources",
        "Loggers with the most error and critical lines in the time range.",
        loki_target(
            "A",
            f'topk(10, sum by (service, logger) (count_over_time({errors} | json | __error__="" [$__range])))',
            instant=True,
        ),
    )
    ly.table(
        "Errors per node",
        "Error and critical lines per node in the time range. The uid is the node's credential's (its Loki "
        "tenant) where Loki has one tenant per node, as in production; role and host are what the node wrote.",
        loki_target(
            "A",
            f"sum by (uid, role, host) ({uid_from_tenant(f'count_over_time({errors} [$__range])')})",
            instant=True,
        ),
    )
    ly.row("Lines")
    ly.logs(
        "Logs",
        f"The newest {LOG_PANEL_LINES} lines of the selected streams. {SEARCH_HELP} "
        "| json turns the body's fields (message, logger, window, step, peer, trace_id...) "
        "into fields of each line.",
        _lines(loki_target("A", f"{everything} {SEARCH} | json")),
    )
    ly.logs(
        "Errors and exceptions",
        f"Error and critical lines only, with their exception and traceback in the body. {SEARCH_HELP}",
        _lines(loki_target("A", f"{errors} {SEARCH} | json")),
        height=10,
    )
    variables = [
        loki_variable("network", "Network", "environment", "", all_value=".+"),
        loki_variable("service", "Service", "service", '{environment=~"$network"}'),
        loki_variable("role", "Role", "role", '{environment=~"$network"}'),
        loki_variable("uid", "UID", "uid", '{environment=~"$network", role=~"$role"}'),
        loki_variable("version", "Version", "version", '{environment=~"$network"}'),
        loki_variable("level", "Level", "level", '{environment=~"$network"}'),
        textbox_variable("search", "Search"),
    ]
    return dashboard(
        "telemetry-logs",
        "Logs",
        "Log volume by level and service, error rate, and a searchable log panel.",
        ["logs"],
        variables,
        ly,
    )
