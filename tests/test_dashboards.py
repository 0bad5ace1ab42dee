"""Provisioning and dashboards: valid, consistent, generated, and true to the catalog.

Every InfluxQL query may name only measurements, fields and tags that
telemetry_client/catalog.py defines, and every LogQL query only the stream labels
the Loki handler sets (body fields through `| json`), or, reading the edge's audit
stream in its own tenant, only the labels its shipper sets and Caddy's fields.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tomllib
from datetime import timedelta
from fnmatch import fnmatch
from pathlib import Path

import pytest
import yaml

from grafana import build_dashboards
from grafana.builder import audit, panels
from grafana.builder.panels import MAX_PANEL_ID, Layout, panel_id
from grafana.builder.targets import loki_target
from simulator import dashboards as dash
from simulator.alerting import ALERTING_DIRS
from telemetry_client.catalog import CATALOG, DROP_REASONS, QUERYABLE, SPREADS, STANDARD_TAGS, Spread

ROOT = Path(__file__).resolve().parents[1]
GRAFANA = ROOT / "grafana"
DASHBOARDS = dash.load_dashboards()
DATASOURCES = dash.load_datasources()
QUERIES = list(dash.iter_queries(DASHBOARDS, DATASOURCES))
INFLUX_QUERIES = [q for q in QUERIES if q.datasource_type == "influxdb"]
LOKI_QUERIES = [q for q in QUERIES if q.datasource_type == "loki"]
ALL_TAGS = set(STANDARD_TAGS).union(*(m.tag_names for m in CATALOG.values()))


# ---------------------------------------------------------------- provisioning


def test_provisioning_files_are_valid_yaml() -> None:
    files = sorted((GRAFANA / "provisioning").rglob("*.yml"))
    assert len(files) >= 2
    for path in files:
        document = yaml.safe_load(path.read_text())
        assert document["apiVersion"] == 1, path


def test_datasources_have_fixed_unique_uids_and_query_influxdb_in_influxql() -> None:
    document = yaml.safe_load((GRAFANA / "provisioning/datasources/datasources.yml").read_text())
    sources = document["datasources"]
    uids = [s["uid"] for s in sources]
    assert len(uids) == len(set(uids))
    assert DATASOURCES == {"influxdb": "influxdb", "loki": "loki"}
    influx = next(s for s in sources if s["type"] == "influxdb")
    assert influx["jsonData"]["version"] == "InfluxQL"
    assert influx["jsonData"]["dbName"] == "${INFLUXDB_DATABASE}"
    assert influx["jsonData"]["httpHeaderName1"] == "Authorization"
    assert influx["secureJsonData"]["httpHeaderValue1"] == "Token ${INFLUXDB_READ_TOKEN}"
    assert all(s["url"].startswith("${") for s in sources)


def test_no_secret_in_provisioning() -> None:
    """Secure values come from the environment; no password or token is written down."""
    for path in (GRAFANA / "provisioning").rglob("*.yml"):
        document = yaml.safe_load(path.read_text())
        for source in document.get("datasources") or []:
            assert "password" not in source and "basicAuthPassword" not in source, path
            for key, value in (source.get("secureJsonData") or {}).items():
                assert re.search(r"\$\{?[A-Z_]+\}?", str(value)), f"{path}: {key} is literal"


def test_dashboard_provider_path_is_where_compose_mounts_the_dashboards() -> None:
    provider = yaml.safe_load((GRAFANA / "provisioning/dashboards/dashboards.yml").read_text())["providers"][0]
    assert provider["type"] == "file"
    assert provider["folder"]
    # The InfluxDB backend's compose file mounts these (the VictoriaMetrics twins:
    # tests/test_compose_backends.py).
    compose = yaml.safe_load((ROOT / "compose/docker-compose.influxdb.yml").read_text())
    mounts = compose["services"]["grafana"]["volumes"]
    assert f"../grafana/dashboards:{provider['options']['path']}:ro" in mounts
    assert "../grafana/provisioning:/etc/grafana/provisioning:ro" in mounts


# ---------------------------------------------------------------- the grafana package


@pytest.mark.slow  # runs both builds as processes
def test_grafana_is_a_package_whose_builds_run_as_modules() -> None:
    """`python -m grafana.build_dashboards` and `grafana.build_alerting` import their package, no sys.path edits."""
    for module in ("grafana.build_dashboards", "grafana.build_alerting"):
        done = subprocess.run(
            [sys.executable, "-m", module, "--check"], cwd=ROOT, capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, (module, done.stderr)
    sources = [*GRAFANA.rglob("*.py"), ROOT / "simulator" / "alerting.py"]
    assert [path for path in sources if "sys.path" in path.read_text(encoding="utf-8")] == []
    assert (GRAFANA / "__init__.py").read_text(encoding="utf-8").startswith('"""')


def test_an_installed_copy_carries_the_generated_files() -> None:
    """pyproject.toml packages grafana with its generated files, so `pip install .` needs no checkout."""
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]
    assert "grafana*" in setuptools["packages"]["find"]["include"]
    globs = setuptools["package-data"]["grafana"]
    read = [dash.DASHBOARDS_DIR, dash.VICTORIAMETRICS_DASHBOARDS_DIR, *ALERTING_DIRS.values()]
    read += [dash.DATASOURCES_DIR, dash.VICTORIAMETRICS_DATASOURCES_DIR, GRAFANA / "downsampling"]
    files = [path for folder in read for path in folder.rglob("*") if path.is_file()]
    assert len(files) > 20
    left_out = [path for path in files if not any(fnmatch(path.relative_to(GRAFANA).as_posix(), g) for g in globs)]
    assert left_out == []


# ---------------------------------------------------------------- dashboards


def test_dashboards_are_the_six_expected_ones() -> None:
    titles = {d["title"] for d in DASHBOARDS}
    assert titles == {
        "Training (miners)",
        "Validators",
        "Network and performance",
        "System and GPU",
        "Logs",
        "Telemetry health",
    }


def test_committed_downsampling_setup_is_what_the_builder_generates() -> None:
    for path, text in build_dashboards.render_all(GRAFANA / "dashboards", GRAFANA / "downsampling").items():
        assert path.read_text(encoding="utf-8") == text, f"{path} is stale: run python -m grafana.build_dashboards"


def test_committed_json_is_what_the_builder_generates() -> None:
    rendered = build_dashboards.render()
    on_disk = {p.name: p.read_text(encoding="utf-8") for p in (GRAFANA / "dashboards").glob("*.json")}
    assert set(on_disk) == set(rendered), "run python -m grafana.build_dashboards"
    for name, text in rendered.items():
        assert on_disk[name] == text, f"{name} is stale: run python -m grafana.build_dashboards"


def test_builder_check_mode_reports_a_stale_file(tmp_path: Path) -> None:
    out = [
        "--out",
        str(tmp_path / "dashboards"),
        "--downsampling-out",
        str(tmp_path / "downsampling"),
        "--victoriametrics-out",
        str(tmp_path / "dashboards-victoriametrics"),
    ]
    assert build_dashboards.main(out) == 0
    assert build_dashboards.main(["--check", *out]) == 0
    (tmp_path / "dashboards/logs.json").write_text("{}")
    assert build_dashboards.main(["--check", *out]) == 1
    assert build_dashboards.main(out) == 0
    (tmp_path / "dashboards-victoriametrics/system.json").write_text("{}")
    assert build_dashboards.main(["--check", *out]) == 1
    assert build_dashboards.main(out) == 0
    (tmp_path / "downsampling/tasks/system.flux").write_text("")
    assert build_dashboards.main(["--check", *out]) == 1


def test_builder_knows_every_drop_reason_of_the_catalog() -> None:
    assert tuple(build_dashboards.DROP_REASONS) == DROP_REASONS


def test_dashboard_json_is_valid_with_unique_uids_and_panel_ids() -> None:
    uids = [d["uid"] for d in DASHBOARDS]
    assert len(uids) == len(set(uids))
    for dashboard in DASHBOARDS:
        json.dumps(dashboard)
        ids = [p["id"] for p in dash.iter_panels(dashboard)]
        assert len(ids) == len(set(ids)), dashboard["uid"]
        assert all(isinstance(i, int) and 0 < i <= MAX_PANEL_ID < 2**31 for i in ids)
        for panel in dash.iter_panels(dashboard):
            grid = panel["gridPos"]
            assert grid["x"] >= 0 and grid["x"] + grid["w"] <= 24, panel["title"]


def test_a_panel_id_is_its_title_s_rows_included() -> None:
    """Rows and panels alike: the id names the panel, not its place, so `viewPanel=` links outlive a new panel."""
    for dashboard in DASHBOARDS:
        for panel in dash.iter_panels(dashboard):
            assert panel["id"] == panel_id(panel["title"]), (dashboard["uid"], panel["title"])
    assert any(panel["type"] == "row" for dashboard in DASHBOARDS for panel in dashboard["panels"])


def _layout(*, inserted: bool) -> Layout:
    layout = Layout()
    log = loki_target("A", '{service="x"}')
    layout.row("First")
    layout.timeseries("One", "", log)
    if inserted:
        layout.row("New row")
        layout.timeseries("Inserted", "", log, width=24)
    layout.timeseries("Two", "", log)
    layout.row("Second")
    layout.table("Three", "", log)
    return layout


def test_inserting_a_panel_changes_no_other_panel_id() -> None:
    before = {p["title"]: p["id"] for p in _layout(inserted=False).panels}
    after = {p["title"]: p["id"] for p in _layout(inserted=True).panels}
    assert {title: after[title] for title in before} == before
    assert len(set(after.values())) == len(after)
    assert after["Inserted"] not in before.values() and after["New row"] not in before.values()


def test_inserting_a_panel_into_a_dashboard_keeps_every_committed_id(monkeypatch: pytest.MonkeyPatch) -> None:
    """A row and a panel placed before everything else in each dashboard: the others keep their committed ids."""
    committed = {d["uid"]: {p["title"]: p["id"] for p in dash.iter_panels(d)} for d in DASHBOARDS}
    place = Layout._place

    def first_an_extra_panel(self: Layout, panel: dict, width: int, height: int, key: str | None) -> None:
        if not self.panels:
            place(self, {"type": "row", "title": "Inserted row", "panels": []}, 24, 1, None)
            place(self, {"type": "text", "title": "Inserted"}, 12, 8, None)
        place(self, panel, width, height, key)

    monkeypatch.setattr(Layout, "_place", first_an_extra_panel)
    for build in build_dashboards.BUILDERS.values():
        dashboard = build()
        ids = {p["title"]: p["id"] for p in dashboard["panels"]}
        assert {"Inserted", "Inserted row"} <= set(ids), dashboard["uid"]
        assert {title: ids[title] for title in committed[dashboard["uid"]]} == committed[dashboard["uid"]]


def test_a_duplicate_panel_key_or_an_id_collision_fails_the_build(monkeypatch: pytest.MonkeyPatch) -> None:
    layout = Layout()
    log = loki_target("A", '{service="x"}')
    layout.timeseries("Errors", "", log)
    with pytest.raises(ValueError, match="duplicate panel key"):
        layout.timeseries("Errors", "", log)
    layout.timeseries("Errors", "", log, key="Errors, again")  # another key, another id
    assert len({p["id"] for p in layout.panels}) == 2
    monkeypatch.setattr(panels, "panel_id", lambda key: 7)
    layout = Layout()
    layout.row("Logs")
    with pytest.raises(ValueError, match="same id as the panel keyed 'Logs'"):
        layout.timeseries("Lines", "", log)


def test_panels_do_not_overlap() -> None:
    for dashboard in DASHBOARDS:
        cells: dict[tuple[int, int], str] = {}
        for panel in dashboard["panels"]:
            g = panel["gridPos"]
            for x in range(g["x"], g["x"] + g["w"]):
                for y in range(g["y"], g["y"] + g["h"]):
                    assert (x, y) not in cells, f"{panel['title']} overlaps {cells[(x, y)]}"
                    cells[(x, y)] = panel["title"]


def test_every_panel_and_target_resolves_to_a_provisioned_datasource() -> None:
    for dashboard in DASHBOARDS:
        for panel in dash.iter_panels(dashboard):
            if panel["type"] == "row":
                continue
            assert panel["datasource"]["uid"] in DATASOURCES, panel["title"]
            assert panel["targets"], panel["title"]
    for query in QUERIES:
        assert query.datasource_uid in DATASOURCES, query.where
        assert query.datasource_type == DATASOURCES[query.datasource_uid], query.where
        assert query.text.strip(), query.where


def test_every_dashboard_filters_by_network_role_uid_and_version() -> None:
    for dashboard in DASHBOARDS:
        variables = dash.variables_of(dashboard)
        assert {"network", "role", "uid", "version"} <= set(variables), dashboard["uid"]
        for name in ("network", "role", "uid", "version"):
            variable = variables[name]
            assert variable["type"] == "query"
            assert variable["includeAll"] and variable["multi"]
            assert variable["datasource"]["uid"] in DATASOURCES


def test_influx_variables_are_show_tag_values_queries() -> None:
    for query in INFLUX_QUERIES:
        if query.source == "variable":
            assert query.text.startswith("SHOW TAG VALUES"), query.where


def test_loki_variables_are_label_values() -> None:
    for query in LOKI_QUERIES:
        if query.source == "variable":
            assert query.text.startswith("label_values("), query.where


def test_logs_dashboard_has_a_search_box_used_by_its_log_panels() -> None:
    logs = next(d for d in DASHBOARDS if d["uid"] == "telemetry-logs")
    assert dash.variables_of(logs)["search"]["type"] == "textbox"
    log_panels = [p for p in dash.iter_panels(logs) if p["type"] == "logs"]
    assert log_panels
    for panel in log_panels:
        assert "${search:regex}" in panel["targets"][0]["expr"]


# ---------------------------------------------------------------- catalog


def check_influxql(text: str) -> list[str]:
    """Every reason `text` names something the catalog does not define."""
    refs = dash.influxql_references(text)
    errors = list(refs.problems)
    unknown = refs.measurements - set(QUERYABLE)
    errors += [f"unknown measurement {m!r}" for m in sorted(unknown)]
    known = [QUERYABLE[m] for m in refs.measurements if m in QUERYABLE]
    if known:
        fields = set().union(*(m.field_names for m in known)) | refs.aliases
        tags = set().union(*(m.tag_names for m in known))
    else:  # SHOW TAG VALUES without FROM looks at every measurement
        fields, tags = refs.aliases, ALL_TAGS
    errors += [f"unknown field {f!r}" for f in sorted(refs.fields - fields)]
    errors += [f"unknown tag {t!r}" for t in sorted((refs.tags | refs.show_tag_keys) - tags)]
    return errors


@pytest.mark.parametrize("query", INFLUX_QUERIES, ids=lambda q: q.where)
def test_influxql_names_only_catalog_measurements_fields_and_tags(query: dash.Query) -> None:
    assert check_influxql(query.text) == [], query.text


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('SELECT mean("loss") FROM "training_steps" WHERE $timeFilter', "unknown measurement 'training_steps'"),
        ('SELECT mean("los") FROM "training_step" WHERE $timeFilter', "unknown field 'los'"),
        ('SELECT mean("loss") FROM "training_step" WHERE "host" =~ /^x$/', "unknown tag 'host'"),
        ('SELECT mean("loss") FROM "training_step" GROUP BY time(1m), "eval_uid"', "unknown tag 'eval_uid'"),
        ('SHOW TAG VALUES FROM "gpu" WITH KEY = "sink"', "unknown tag 'sink'"),
        ("SELECT mean(loss) FROM training_step", "unquoted"),
        ('SELECT "score" FROM (SELECT mean("nope") AS "score" FROM "validator_scores")', "unknown field 'nope'"),
    ],
)
def test_the_catalog_check_catches_mistakes(text: str, expected: str) -> None:
    assert any(expected in error for error in check_influxql(text)), check_influxql(text)


def test_the_catalog_check_accepts_aliases_of_a_subquery() -> None:
    text = (
        'SELECT sum("tps") AS "tps" FROM (SELECT mean("tokens_per_sec") AS "tps" '
        'FROM "training_step" GROUP BY time(1m), "uid") GROUP BY time(1m)'
    )
    assert check_influxql(text) == []


def test_dashboards_cover_what_operators_asked_for() -> None:
    """The fields each dashboard must chart, per the issue."""
    wanted = {
        "telemetry-training": {"loss", "learning_rate", "grad_norm_mean", "grad_norm_max", "tokens_per_sec"},
        "telemetry-validators": {"loss_before", "loss_after", "improvement", "score", "weight"},
        "telemetry-network": {
            "active_peers",
            "is_synced",
            "sync_lag_windows",
            "gather_success_rate",
            "compression_ratio",
            "tokens_per_sec",
        },
        "telemetry-system": {
            "cpu_percent",
            "memory_percent",
            "allocated_bytes",
            "reserved_bytes",
            "utilization_percent",
        },
        # Rates read the per-interval growth the client writes beside each counter.
        "telemetry-health": {
            "queued_delta",
            "sent_delta",
            "retries_delta",
            "pending",
            *(f"dropped_{reason}_delta" for reason in DROP_REASONS),
        },
    }
    for uid, fields in wanted.items():
        named: set[str] = set()
        for query in INFLUX_QUERIES:
            if query.dashboard_uid == uid:
                named |= dash.influxql_references(query.text).fields
        assert fields <= named, f"{uid} misses {sorted(fields - named)}"


# ---------------------------------------------------------------- loki


def _known_loki_labels(text: str) -> tuple[frozenset[str], frozenset[str]]:
    """(stream labels, body fields) a LogQL query may name: the node handler's, or the edge audit stream's."""
    if f'__tenant_id__="{audit.EDGE_TENANT}"' in text:
        return audit.STREAM_LABELS | {"__tenant_id__"}, audit.FIELDS
    return dash.LOKI_STREAM_LABELS, dash.LOKI_BODY_KEYS


def _assert_known_loki_labels(text: str) -> None:
    refs = dash.logql_references(text)
    stream, body = _known_loki_labels(text)
    assert refs.problems == ()
    assert refs.stream_labels <= stream, text
    allowed = (stream | body) if refs.parses_json else stream
    assert refs.grouping_labels <= allowed, text


@pytest.mark.parametrize("query", LOKI_QUERIES, ids=lambda q: q.where)
def test_logql_uses_only_the_handlers_stream_labels(query: dash.Query) -> None:
    _assert_known_loki_labels(query.text)


def test_audit_queries_select_the_edge_tenant_and_only_its_labels() -> None:
    """The audit stream is trusted for its tenant alone: a query of its labels that forgot the tenant fails."""
    audit_queries = [q for q in LOKI_QUERIES if f'job="{audit.JOB}"' in q.text]
    # Telemetry health has the per-node panel of refused requests.
    assert any(
        q.dashboard_uid == "telemetry-health" and "user_id" in dash.logql_references(q.text).grouping_labels
        for q in audit_queries
    )
    for query in audit_queries:
        assert f'__tenant_id__="{audit.EDGE_TENANT}"' in query.text, query.where
    forgot = audit.refused().replace(f', __tenant_id__="{audit.EDGE_TENANT}"', "")
    with pytest.raises(AssertionError):
        _assert_known_loki_labels(f"sum by (user_id) (count_over_time({forgot} [5m]))")
    with pytest.raises(AssertionError):  # a node handler's label does not exist in the audit stream
        _assert_known_loki_labels(f"sum by (uid) (count_over_time({audit.refused()} [5m]))")


def test_logql_check_catches_an_unknown_label_and_a_body_field_without_json() -> None:
    refs = dash.logql_references('sum by (logger) (count_over_time({job="x"}[1m]))')
    assert "job" in refs.stream_labels - dash.LOKI_STREAM_LABELS
    assert not refs.parses_json and "logger" not in dash.LOKI_STREAM_LABELS


@pytest.mark.parametrize("query", [q for q in LOKI_QUERIES if q.source == "panel"], ids=lambda q: q.where)
def test_logql_selectors_stay_valid_with_everything_selected(query: dash.Query) -> None:
    """Loki rejects a selector whose every matcher matches the empty string."""
    dashboard = next(d for d in DASHBOARDS if d["uid"] == query.dashboard_uid)
    time_range = dash.TimeRange.last(timedelta(hours=1))
    text = dash.expand(query, time_range, dash.all_selected(dashboard), dashboard=dashboard)
    for selector in re.findall(r"\{([^{}]*)\}", text):
        matchers = re.findall(r'(\w+)\s*(=~|=)\s*"((?:[^"\\]|\\.)*)"', selector)
        assert matchers, selector
        non_empty = [
            value for _, op, value in matchers if (op == "=" and value) or (op == "=~" and not re.fullmatch(value, ""))
        ]
        assert non_empty, f"{query.where}: every matcher accepts empty: {selector}"


# ---------------------------------------------------------------- alert rules


def _alert_queries() -> list[tuple[str, str, str]]:
    """(rule uid, datasource uid, query text) of every provisioned alert rule, settings at their defaults."""
    from grafana.alerting_src import render, settings

    text = render.fill((GRAFANA / "alerting" / "rules.yaml").read_text(), settings.defaults())
    out = []
    for group in yaml.safe_load(text)["groups"]:
        for rule in group["rules"]:
            for query in rule["data"]:
                model = query["model"]
                if query["datasourceUid"] == "influxdb":
                    out.append((rule["uid"], "influxdb", model["query"]))
                elif query["datasourceUid"] == "loki":
                    out.append((rule["uid"], "loki", model["expr"]))
    return out


ALERT_QUERIES = _alert_queries()


@pytest.mark.parametrize(("rule", "kind", "text"), ALERT_QUERIES, ids=[f"{r}:{k}" for r, k, _ in ALERT_QUERIES])
def test_alert_queries_name_only_catalog_measurements_and_stream_labels(rule: str, kind: str, text: str) -> None:
    if kind == "influxdb":
        assert check_influxql(text) == [], text
    else:
        refs = dash.logql_references(text)
        stream, body = _known_loki_labels(text)
        assert refs.problems == () and refs.stream_labels <= stream, text
        assert refs.grouping_labels <= (stream | body if refs.parses_json else stream), text


@pytest.mark.parametrize("spread", SPREADS, ids=lambda s: s.name)
def test_spread_tasks_write_the_fields_the_dashboards_read(spread: Spread) -> None:
    """The 2.x task groups by every tag but the folded ones, computes InfluxQL's median (exact_mean) and
    nearest-rank p90 (exact_selector) rather than Flux's t-digest default, and renames each result to
    the Spread's measurement and `<field>_<stat>` field that fleet_from_spread reads."""
    text = (GRAFANA / f"downsampling/tasks/{spread.name}.flux").read_text()
    grouped = re.search(r"group\(columns: \[([^\]]*)\]\)", text)
    assert grouped, text
    columns = {c.strip().strip('"') for c in grouped.group(1).split(",")}
    assert columns == {"_measurement", "_field", *STANDARD_TAGS, *CATALOG[spread.source].tags} - set(spread.across)
    assert f'r._measurement == "{spread.source}"' in text
    assert 'quantile(q: 0.5, method: "exact_mean"' in text and 'quantile(q: 0.9, method: "exact_selector"' in text
    suffixes = re.findall(rf'_measurement: "{spread.name}", _field: r\._field \+ "_(\w+)"', text)
    assert sorted(suffixes) == sorted(spread.STATS)
    written = {f"{field}_{stat}" for field in spread.fields for stat in suffixes}
    assert written == set(spread.measurement.field_names)
    assert text.count('to(bucket: "@DOWNSAMPLED_BUCKET@")') == len(spread.STATS)
