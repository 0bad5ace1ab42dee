"""Defaults have one source: docs/settings.md is generated from the code, and prose that states a default agrees.

The convention for prose (README.md, docs/*.md, docstrings, comments and help text
in telemetry_client/ and bench/): link to docs/settings.md, or state the figure as
"`name` (default X)" right after the setting's name, where the name is a parameter,
a `BufferSettings` field or an environment variable of docs/settings.md. The test
also reads "default X" and "X by default" later in the same clause (up to a `;`,
a `|` or the end of a sentence, on one line), and the "default" column of a
Markdown table, as stated about the nearest name before them (in a table, the
row's first cell). Every figure read that way must be the code's default.
"""

from __future__ import annotations

import importlib.util
import math
import re
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from telemetry_client import config

ROOT = Path(__file__).resolve().parents[1]


def _builder() -> ModuleType:
    spec = importlib.util.spec_from_file_location("build_settings", ROOT / "docs" / "build_settings.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


BUILDER = _builder()

# Units a figure may carry, as a factor to the code's unit (seconds, bytes, a count).
UNITS = {
    "ms": 0.001,
    "s": 1,
    "sec": 1,
    "second": 1,
    "seconds": 1,
    "min": 60,
    "minutes": 60,
    "B": 1,
    "byte": 1,
    "bytes": 1,
    "KB": 1000,
    "MB": 1000**2,
    "GB": 1000**3,
    "KiB": 2**10,
    "MiB": 2**20,
    "GiB": 2**30,
}
# Words a figure may be followed by that say what is counted, not how much.
COUNT_WORDS = ("records", "points", "lines", "items", "labels")
SWITCHES = {"on": True, "off": False, "True": True, "False": False, "true": True, "false": False}

_NUMBER = r"\d{1,3}(?:[,_]\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?"
_UNIT = "|".join(sorted((re.escape(u) for u in UNITS), key=len, reverse=True))
FIGURE = re.compile(
    rf"(?P<number>{_NUMBER})(?:\s?(?P<unit>{_UNIT})\b)?"
    rf"|`?(?P<switch>{'|'.join(SWITCHES)})\b`?"
    r"""|`?(?P<quote>["'])(?P<text>[^"'`]*)(?P=quote)`?"""
)
# In a table's "default" column a backticked word is the value itself: `telemetry`.
TABLE_WORD = re.compile(r"`(?P<text>[\w.-]+)`(?!\S)")
# Where a clause ends: the next statement of a figure belongs to another name.
CLAUSE_END = re.compile(r";|\||\.(?:\s|$)|\s—\s")
SUFFIX = re.compile(r"\s+by default\b")
PREFIX = re.compile(r"\bdefaults?(?:\s+(?:is|of|to))?:?\s+")
AFTER_NAME = re.compile(rf"\s*(?:(?:{'|'.join(COUNT_WORDS)}|seconds)\s*)?\((?:default\s+)?")


@dataclass(frozen=True)
class Statement:
    """A default stated in prose: where, about which name, and the figure as written."""

    path: str
    line: int
    name: str
    figure: str
    match: re.Match[str]


def known_defaults() -> dict[str, list[tuple[str, Any]]]:
    """Each name prose may state a default of, to (where, the code's default) for every setting of that name."""
    known: dict[str, list[tuple[str, Any]]] = {}
    for entry in BUILDER.all_entries():
        if entry.default is BUILDER.REQUIRED or entry.default is None:
            continue
        for name in {entry.name, entry.qualified, entry.env} - {None}:
            known.setdefault(name, []).append((entry.qualified, entry.default))
    return known


def _name_pattern(names: Mapping[str, Any]) -> re.Pattern[str]:
    """A backticked name (`max_items`, `BufferSettings.max_items`), or a bare environment variable."""
    alternatives = "|".join(sorted((re.escape(n) for n in names), key=len, reverse=True))
    return re.compile(rf"`(?P<ticked>{alternatives})(?:=[^`]*)?`|\b(?P<bare>[A-Z][A-Z0-9_]+)\b")


def figure_value(match: re.Match[str]) -> tuple[Any, str]:
    """The value a figure states, and the kind of value it is ("number", "switch", "text")."""
    if "number" in match.re.groupindex and match.group("number"):
        number = float(match.group("number").replace(",", "").replace("_", ""))
        return number * UNITS.get(match.group("unit") or "", 1), "number"
    if "switch" in match.re.groupindex and match.group("switch"):
        return SWITCHES[match.group("switch")], "switch"
    return match.group("text"), "text"


def agrees(stated: Any, kind: str, default: Any) -> bool | None:
    """Whether a stated figure is the code's default; None when the figure is not about such a value."""
    if isinstance(default, bool):
        return stated is default if kind == "switch" else None
    if isinstance(default, int | float):
        return math.isclose(stated, default, rel_tol=1e-9) if kind == "number" else None
    if isinstance(default, str):
        return stated == default if kind == "text" else None
    return None


def _table_columns(line: str) -> list[str]:
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def statements(path: str, text: str, names: Mapping[str, Any]) -> Iterator[Statement]:
    """Every default stated in `text`, in the forms the module docstring lists."""
    name_re = _name_pattern(names)
    default_column: int | None = None
    lines = text.splitlines()
    for number, line in enumerate(lines, 1):
        continued = line + "\n" + (lines[number].lstrip() if number < len(lines) else "")  # a name ends a line
        if not line.lstrip().startswith("|"):
            default_column = None
        cells = _table_columns(line) if line.lstrip().startswith("|") else []
        if cells and "default" in [c.lower() for c in cells]:
            default_column = [c.lower() for c in cells].index("default")
            continue
        mentions = [
            (m.start(), m.end(), m.group("ticked") or m.group("bare"))
            for m in name_re.finditer(line)
            if (m.group("ticked") or m.group("bare")) in names
        ]
        row_name = None
        if cells:
            first = [name for name in re.findall(r"`([^`=]+)", cells[0]) if name in names]
            row_name = first[0] if first else None
        if row_name and default_column is not None and default_column < len(cells):
            figure = FIGURE.match(cells[default_column]) or TABLE_WORD.match(cells[default_column])
            if figure:
                yield Statement(path, number, row_name, figure.group(0), figure)
        found: list[tuple[int, re.Match[str], str | None]] = []  # (where the statement starts, figure, name)
        for _, end, name in mentions:  # "`name` (default X)", "`name` records (X)"
            opening = AFTER_NAME.match(continued, end)
            figure = FIGURE.match(continued, opening.end()) if opening else None
            if figure:
                found.append((end, figure, name))
        for prefix in PREFIX.finditer(line):  # "default X", attributed to the name before it
            figure = FIGURE.match(line, prefix.end())
            if figure:
                found.append((prefix.start(), figure, None))
        for figure in FIGURE.finditer(line):  # "X by default"
            if SUFFIX.match(line, figure.end()):
                found.append((figure.start(), figure, None))
        seen: set[int] = set()
        for anchor, figure, name in sorted(found, key=lambda item: item[0]):
            if figure.start() in seen:
                continue
            seen.add(figure.start())
            subject = name or _subject(line, anchor, mentions) or row_name
            if subject:
                yield Statement(path, number, subject, figure.group(0), figure)


def _subject(line: str, anchor: int, mentions: list[tuple[int, int, str]]) -> str | None:
    """The nearest name before `anchor` in the same clause."""
    before = [(end, name) for _, end, name in mentions if end <= anchor]
    if not before:
        return None
    end, name = before[-1]
    return None if CLAUSE_END.search(line, end, anchor) else name


def prose_files() -> list[Path]:
    """The files whose prose may state a default: every page but the generated one, the client and the benches."""
    docs = [p for p in sorted((ROOT / "docs").glob("*.md")) if p != BUILDER.OUT]
    code = sorted((ROOT / "telemetry_client").rglob("*.py")) + sorted((ROOT / "bench").glob("*.py"))
    return [ROOT / "README.md", *docs, *code]


def stale_statements() -> list[str]:
    """A message for every stated default that differs from the code's: file:line, the name, both values."""
    known = known_defaults()
    problems = []
    for path in prose_files():
        relative = str(path.relative_to(ROOT))
        for statement in statements(relative, path.read_text(encoding="utf-8"), known):
            stated, kind = figure_value(statement.match)
            verdicts = [(where, default, agrees(stated, kind, default)) for where, default in known[statement.name]]
            if any(verdict is None for _, _, verdict in verdicts) or any(verdict for _, _, verdict in verdicts):
                continue
            code = ", ".join(f"{where} = {default!r}" for where, default, _ in verdicts)
            problems.append(
                f"{statement.path}:{statement.line}: `{statement.name}` stated as {statement.figure!r}; "
                f"the code's default: {code} (see docs/settings.md)"
            )
    return problems


def test_committed_settings_reference_is_what_the_builder_generates() -> None:
    stale = f"docs/settings.md is stale: run {BUILDER.COMMAND}"
    assert BUILDER.OUT.read_text(encoding="utf-8") == BUILDER.render(), stale


def test_check_mode_reports_a_stale_file(tmp_path: Path) -> None:
    out = tmp_path / "settings.md"
    assert BUILDER.main(["--out", str(out)]) == 0
    assert BUILDER.main(["--check", "--out", str(out)]) == 0
    out.write_text(out.read_text(encoding="utf-8").replace("`3.0`", "`5.0`"), encoding="utf-8")
    assert BUILDER.main(["--check", "--out", str(out)]) == 1


def test_every_setting_has_exactly_one_meaning() -> None:
    entries = BUILDER.all_entries()
    assert [e.qualified for e in entries if not e.meaning] == [], f"add a meaning to MEANINGS in {BUILDER.__file__}"
    used = {key for e in entries if e.meaning_source == "table" for key in (e.name, e.qualified)}
    assert sorted(set(BUILDER.MEANINGS) - used) == [], "MEANINGS has entries no setting uses (or the code now has one)"


def test_reference_reads_defaults_from_the_code(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(config, "DEFAULT_EXIT_TIMEOUT", 5.0)
    rows = [line for line in BUILDER.render().splitlines() if line.startswith("| `exit_timeout` |")]
    assert rows == [
        "| `exit_timeout` | `5.0` | `TELEMETRY_EXIT_TIMEOUT` | seconds the end of a process waits for delivery |"
    ]


def test_prose_states_the_code_defaults() -> None:
    problems = stale_statements()
    assert problems == [], "\n".join(["defaults stated in prose differ from the code:", *problems])


def test_a_changed_default_is_caught_in_the_prose(monkeypatch: pytest.MonkeyPatch) -> None:
    """The prose check reads the code's value: with another exit deadline every statement of it is stale."""
    monkeypatch.setattr(config, "DEFAULT_EXIT_TIMEOUT", 5.0)
    stale = {problem.split(": ")[0] for problem in stale_statements() if "TELEMETRY_EXIT_TIMEOUT" in problem}
    assert {path.split(":")[0] for path in stale} >= {"README.md", "docs/delivery.md", "docs/metrics.md"}


@pytest.mark.parametrize(
    ("line", "name", "figure"),
    [
        ("every channel gets `TELEMETRY_EXIT_TIMEOUT` (default 3 s) in total.", "TELEMETRY_EXIT_TIMEOUT", "3 s"),
        ("drains within TELEMETRY_EXIT_TIMEOUT (3 s)", "TELEMETRY_EXIT_TIMEOUT", "3 s"),
        ("`exit_timeout` (`TELEMETRY_EXIT_TIMEOUT`, default 3 s) and", "TELEMETRY_EXIT_TIMEOUT", "3 s"),
        ("up to `max_items` records (200,000 by default) are buffered", "max_items", "200,000"),
        ("| `max_bytes` | | 64 MiB |", "max_bytes", "64 MiB"),
        ("(within `close_timeout`, default 5 s)", "close_timeout", "5 s"),
        ('`TELEMETRY_ENVIRONMENT` (default `"unknown"`)', "TELEMETRY_ENVIRONMENT", '`"unknown"`'),
    ],
)
def test_statement_forms_are_read(line: str, name: str, figure: str) -> None:
    text = "| name | env | default |\n|---|---|---|\n" + line if line.startswith("|") else line
    found = [(s.name, s.figure) for s in statements("x.md", text, known_defaults())]
    assert found == [(name, figure)]


@pytest.mark.parametrize(
    "line",
    [
        "14–21 ms with `max_bytes` 16 MiB (about 24,000 waiting)",  # a value chosen, not the default
        "`max_bytes` bounds everything buffered; Loki's default is 10 s",  # another clause, another subject
        "the `batch_items` you pass (`BufferSettings`)",
    ],
)
def test_other_figures_are_not_read_as_defaults(line: str) -> None:
    assert list(statements("x.md", line, known_defaults())) == []


def test_a_wrong_figure_is_reported_with_its_place() -> None:
    wrong = list(statements("x.md", "first line\n`max_items` (default 100,000)", known_defaults()))
    assert [(s.line, s.name) for s in wrong] == [(2, "max_items")]
    stated, kind = figure_value(wrong[0].match)
    assert agrees(stated, kind, 200_000) is False
    assert agrees(*figure_value(FIGURE.match("64 MiB")), 64 * 2**20) is True
    assert agrees(*figure_value(FIGURE.match("1 MB")), 2**20) is False  # MB is 10**6: say MiB


@dataclass(frozen=True)
class _Timeouts:
    """A settings object as a grouped parameter would take."""

    connect: float = 3.0  # seconds to connect


def _grouped(url: str, *, timeouts: _Timeouts | None = None) -> None:
    """A callable whose settings come as an object."""


def test_a_settings_object_parameter_gets_its_fields_read() -> None:
    entries, nested = BUILDER.callable_entries(_grouped)
    assert [(e.name, e.default is BUILDER.REQUIRED) for e in entries] == [("url", True), ("timeouts", False)]
    assert nested == [_Timeouts]
    [connect] = BUILDER.dataclass_entries(_Timeouts)
    assert (connect.qualified, connect.default, connect.meaning) == ("_Timeouts.connect", 3.0, "seconds to connect")
