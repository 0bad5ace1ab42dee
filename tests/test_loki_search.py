"""The Logs dashboard's Search box: any text gives a valid LogQL query that finds that text.

The panels' queries are expanded as Grafana does (simulator.dashboards: the
`${search:regex}` format of @grafana/scenes, Grafana's escapeRegex) and run by the
tests' LogQL evaluator (tests/grafana_receiver.py) over stored entries.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest
from grafana_receiver import LogQLError, logql_query
from loki_receiver import Entry

from simulator import dashboards as dash

T0 = 1_700_000_000_000_000_000
WINDOW = dash.TimeRange(datetime.fromtimestamp(T0 / 1e9 - 60, UTC), datetime.fromtimestamp(T0 / 1e9 + 60, UTC))
LABELS = {"environment": "simnet", "service": "miner", "role": "miner", "uid": "1", "version": "1.0"}
CORPUS = [
    r"\d+",
    r"C:\path\to\file",
    'say "hi"',
    "[",
    "(unclosed",
    "a.b*c+d?",
    "it's",
    "$HOME ^ | {x}",
    "/slashes/",
    "tab\there",
    "é ü 日本 🚀",
    "(?i)",
    "",
]


def logs_dashboard() -> dash.Dashboard:
    return next(d for d in dash.load_dashboards() if d["uid"] == "telemetry-logs")


def panel_queries() -> list[str]:
    return [q.text for q in dash.panel_queries(logs_dashboard()) if "search" in q.text]


def entry(ts: int, line: str, level: str = "error") -> Entry:
    """A stored line as is (the search matches the line as Loki stores it)."""
    return Entry({**LABELS, "level": level}, "", ts, line, None, None)


def run(query: str, text: str, entries: list[Entry]) -> list[str]:
    values = {**dash.all_selected(logs_dashboard()), "search": text}
    expanded = dash.expand_logql(query, WINDOW, values, dashboard=logs_dashboard())
    data = logql_query(expanded, entries, T0 - 10**9, T0 + 10**9, None)
    return [line for stream in data["result"] for _, line in stream["values"]]


def test_the_panels_search_with_the_regex_format_in_a_raw_string():
    queries = panel_queries()
    assert len(queries) == 2
    assert all("|~ `(?i)${search:regex}`" in q for q in queries)
    panels = [p for p in logs_dashboard()["panels"] if p.get("type") == "logs"]
    assert all("literally" in p["description"] and "backtick" in p["description"] for p in panels)


@pytest.mark.parametrize("text", CORPUS)
@pytest.mark.parametrize("query", panel_queries())
def test_any_text_gives_a_valid_query_that_finds_it_literally_ignoring_case(query, text):
    found = f"before {text.upper()} after"
    entries = [entry(T0, found), entry(T0 + 1, "unrelated line"), entry(T0 + 2, f"x{text}y")]
    messages = run(query, text, entries)
    assert found in messages and f"x{text}y" in messages
    if text:
        assert "unrelated line" not in messages


@pytest.mark.parametrize("query", panel_queries())
def test_a_json_line_is_searched_as_stored(query):
    line = json.dumps({"message": 'say "hi"', "level": "error"})
    assert run(query, "SAY", [entry(T0, line)]) == [line]
    assert run(query, 'say \\"hi\\"', [entry(T0, line)]) == [line]  # the body's quotes are escaped in the line


@pytest.mark.parametrize("query", panel_queries())
def test_regex_characters_are_plain_text(query):
    entries = [entry(T0, "took 123 ms"), entry(T0 + 1, r"took \d+ ms")]
    assert run(query, r"\d+", entries) == [r"took \d+ ms"]


@pytest.mark.parametrize("query", panel_queries())
def test_a_backtick_is_the_one_character_the_raw_string_cannot_hold(query):
    with pytest.raises(LogQLError):
        run(query, "run `make`", [entry(T0, "run `make`")])
