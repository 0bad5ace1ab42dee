"""The VictoriaMetrics dashboard set: MetricsQL twins of the InfluxQL panels, built by the same builder.

Generated into grafana/dashboards-victoriametrics/ by grafana/build_dashboards.py
from the same sources as grafana/dashboards/; every panel exists in both sets
(same dashboard uids, titles and panel ids), the Loki panels are the same LogQL.
"""

from __future__ import annotations

import importlib.util
import threading
from pathlib import Path
from types import ModuleType

import pytest

from grafana.builder.backend import BACKENDS, building_for, current_backend
from simulator import dashboards as dash

ROOT = Path(__file__).resolve().parents[1]
GRAFANA = ROOT / "grafana"
VM_DIR = GRAFANA / "dashboards-victoriametrics"
INFLUX_SET = dash.load_dashboards()
VM_SET = dash.load_dashboards(VM_DIR)


def _builder() -> ModuleType:
    spec = importlib.util.spec_from_file_location("build_dashboards", GRAFANA / "build_dashboards.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ---------------------------------------------------------------- the backend switch


def test_building_for_switches_the_backend_and_restores_it() -> None:
    assert BACKENDS == ("influxdb", "victoriametrics")
    assert current_backend() == "influxdb"
    with building_for("victoriametrics"):
        assert current_backend() == "victoriametrics"
        with building_for("influxdb"):
            assert current_backend() == "influxdb"
        assert current_backend() == "victoriametrics"
    assert current_backend() == "influxdb"
    with pytest.raises(ValueError, match="unknown metrics backend 'prometheus'"), building_for("prometheus"):  # type: ignore[arg-type]
        pass


def test_a_build_in_another_thread_keeps_its_own_backend() -> None:
    seen: list[str] = []
    with building_for("victoriametrics"):
        thread = threading.Thread(target=lambda: seen.append(current_backend()))
        thread.start()
        thread.join()
    assert seen == ["influxdb"]


# ---------------------------------------------------------------- the generated set


def test_committed_victoriametrics_json_is_what_the_builder_generates() -> None:
    rendered = _builder().render("victoriametrics")
    on_disk = {p.name: p.read_text(encoding="utf-8") for p in VM_DIR.glob("*.json")}
    assert set(on_disk) == set(rendered), "run python grafana/build_dashboards.py"
    for name, text in rendered.items():
        assert on_disk[name] == text, f"{name} is stale: run python grafana/build_dashboards.py"


def _panels(dashboard: dict) -> dict[int, tuple[str, str]]:
    return {p["id"]: (p["title"], p["type"]) for p in dash.iter_panels(dashboard)}


def test_every_panel_has_its_twin_in_the_other_set() -> None:
    """Same files, dashboard uids and titles; the same panels (id, title, type), both ways."""
    influx = {d["_file"]: d for d in INFLUX_SET}
    victoria = {d["_file"]: d for d in VM_SET}
    assert set(influx) == set(victoria)
    for name, dashboard in influx.items():
        twin = victoria[name]
        assert (twin["uid"], twin["title"]) == (dashboard["uid"], dashboard["title"]), name
        assert _panels(twin) == _panels(dashboard), name


def test_metrics_panels_query_victoriametrics_and_loki_panels_are_unchanged() -> None:
    influx = {d["uid"]: d for d in INFLUX_SET}
    for dashboard in VM_SET:
        twin_panels = {p["id"]: p for p in dash.iter_panels(influx[dashboard["uid"]])}
        for panel in dash.iter_panels(dashboard):
            if panel["type"] == "row":
                continue
            twin = twin_panels[panel["id"]]
            sources = {t["datasource"]["uid"] for t in panel["targets"]}
            if twin["datasource"]["uid"] == "loki":
                assert panel["targets"] == twin["targets"], panel["title"]
            else:
                assert twin["datasource"]["uid"] == "influxdb"
                assert sources == {"victoriametrics"}, panel["title"]
                assert panel["datasource"] == {"type": "prometheus", "uid": "victoriametrics"}


def test_victoriametrics_set_has_no_downsampled_copy_switch() -> None:
    """VictoriaMetrics (open source) keeps no downsampled copy: no raw/long twins, no $raw_up_to_ms."""
    for dashboard in VM_SET:
        names = {v["name"] for v in dashboard["templating"]["list"]}
        assert "raw_up_to_ms" not in names, dashboard["uid"]
        for query in dash.panel_queries(dashboard):
            assert not query.ref_id.endswith("-long"), query.where
            assert "raw_up_to_ms" not in query.text and "downsampled" not in query.text, query.where


def test_variables_are_label_values_chained_like_the_influxdb_ones() -> None:
    influx = {d["uid"]: d for d in INFLUX_SET}
    for dashboard in VM_SET:
        twin = {v["name"]: v for v in influx[dashboard["uid"]]["templating"]["list"]}
        for variable in dashboard["templating"]["list"]:
            if variable["name"] == "raw_up_to_ms":
                continue
            other = twin[variable["name"]]
            assert variable["type"] == other["type"], variable["name"]
            if other.get("datasource", {}).get("uid") != "influxdb":
                assert variable == other, variable["name"]
                continue
            assert variable["datasource"] == {"type": "prometheus", "uid": "victoriametrics"}
            assert variable["query"].startswith("label_values(") and variable["allValue"] == ".*"
            assert (variable["multi"], variable["includeAll"]) == (other["multi"], other["includeAll"])
            # Chained the same way: the InfluxQL WHERE names the same variables as the selector.
            for name in twin:
                assert (f"${name}" in variable["query"]) == (f"${name}$" in other["query"]), (variable["name"], name)
