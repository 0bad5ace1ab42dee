"""The provisioned alerting: generated, up to date, and in the shape Grafana's file provisioning reads.

The shape checked here is written from Grafana's documentation and provisioning code
for apiVersion 1 (grafana/grafana, the version pinned in versions.env):
- docs/sources/alerting/set-up/provision-alerting-resources/file-provisioning/index.md:
  groups (orgId, name, folder, interval, rules), rules (uid, title, condition, data,
  dashboardUid, panelId, noDataState, execErrState, for, annotations, labels),
  contactPoints (name, receivers: uid, type, settings), policies (receiver,
  group_by, matchers / object_matchers, group_wait, group_interval, repeat_interval);
- pkg/services/provisioning/alerting/rules_types.go (AlertRuleV1, QueryV1): the model
  is passed on raw, relativeTimeRange is integer seconds, `for` is a Prometheus
  duration, noDataState in NoData/Alerting/OK/KeepLast and execErrState in
  Error/Alerting/OK/KeepLast (pkg/services/ngalert/models);
- pkg/services/provisioning/values/values.go: `$NAME` and `${NAME}` in labels,
  titles and contact point settings are environment variables, `$$` a literal `$`;
- pkg/promlib/models/query.go (PrometheusQueryProperties, QueryModel): a Prometheus
  query model has `expr`, `instant` and/or `range` (neither means range),
  `editorMode`, and the common refId, datasource, intervalMs, maxDataPoints.

Both sets are checked: grafana/alerting/ (InfluxQL) and grafana/alerting-victoriametrics/
(MetricsQL), with the same rule uids and the same LogQL rules.
"""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from grafana import build_alerting as ba
from grafana.alerting_src import render as rd
from grafana.alerting_src import settings as st
from grafana.alerting_src.rules import RETIRED_RULE_UIDS, RULES, WORK_MEASUREMENTS
from grafana.dashboards_src import BUILDERS
from simulator import alerting as al
from telemetry_client.catalog import CATALOG

ROOT = Path(__file__).resolve().parents[1]
ALERTING = ROOT / "grafana" / "alerting"
VICTORIA_ALERTING = ROOT / "grafana" / "alerting-victoriametrics"
SETS = pytest.mark.parametrize("backend", ["influxdb", "victoriametrics"])
DIRS = {"influxdb": ALERTING, "victoriametrics": VICTORIA_ALERTING}
METRICS_UID = {"influxdb": "influxdb", "victoriametrics": "victoriametrics"}
DURATION = re.compile(r"^([0-9]+(ms|s|m|h|d|w|y))+$")  # github.com/prometheus/common/model ParseDuration
REF = re.compile(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?")
EXPRESSION_TYPES = {"reduce", "math", "threshold", "classic_conditions", "resample"}


def rendered(
    tmp_path: Path,
    overrides: dict[str, str] | None = None,
    env: dict[str, str] | None = None,
    source: Path = ALERTING,
) -> dict:
    files = rd.render_dir(source, tmp_path, overrides, env or {})
    return {path.name: yaml.safe_load(path.read_text()) for path in files}


@SETS
def test_committed_files_are_what_the_builder_generates(backend: str) -> None:
    assert ba.main(["--check"]) == 0, "run python -m grafana.build_alerting"
    for name, text in ba.render(backend).items():
        assert (DIRS[backend] / name).read_text() == text, name


@pytest.mark.parametrize("stale", ["influxdb", "victoriametrics"])
def test_check_mode_reports_a_stale_file_of_either_set(tmp_path: Path, stale: str) -> None:
    out = ["--out", str(tmp_path / "influxdb"), "--victoriametrics-out", str(tmp_path / "victoriametrics")]
    assert ba.main(out) == 0
    assert ba.main([*out, "--check"]) == 0
    (tmp_path / stale / "rules.yaml").write_text("apiVersion: 1\n")
    assert ba.main([*out, "--check"]) == 1


def test_both_sets_share_uids_logql_rules_contact_points_and_settings(tmp_path: Path) -> None:
    influx = rendered(tmp_path / "i", env={"ALERTING_WEBHOOK_URL": "x"})
    victoria = rendered(tmp_path / "v", env={"ALERTING_WEBHOOK_URL": "x"}, source=VICTORIA_ALERTING)
    assert {k: v for k, v in influx.items() if k != "rules.yaml"} == {
        k: v for k, v in victoria.items() if k != "rules.yaml"
    }
    assert (ALERTING / "settings.env").read_text() == (VICTORIA_ALERTING / "settings.env").read_text()

    def rules(document: dict) -> dict[str, dict]:
        return {r["uid"]: r for g in document["groups"] for r in g["rules"]}

    by_uid, vm_by_uid = rules(influx["rules.yaml"]), rules(victoria["rules.yaml"])
    assert list(by_uid) == list(vm_by_uid) == [rule.uid for rule in RULES]
    for uid, rule in by_uid.items():
        twin = vm_by_uid[uid]
        sources = [q["datasourceUid"] for q in rule["data"]]
        assert [{"influxdb": "victoriametrics"}.get(s, s) for s in sources] == [
            q["datasourceUid"] for q in twin["data"]
        ]
        if "loki" in sources:
            assert rule["data"] == twin["data"], uid
        # Same windows, same expressions: only the metrics queries' language differs.
        assert [q["relativeTimeRange"] for q in rule["data"]] == [q["relativeTimeRange"] for q in twin["data"]]
        expressions = [q["model"] for q in rule["data"] if q["datasourceUid"] == "__expr__"]
        assert expressions == [q["model"] for q in twin["data"] if q["datasourceUid"] == "__expr__"], uid
        for key in ("condition", "noDataState", "execErrState", "for", "labels", "dashboardUid", "panelId"):
            assert rule[key] == twin[key], (uid, key)


def _check_query(rule: dict[str, Any], query: dict[str, Any]) -> None:
    assert set(query) <= {"refId", "queryType", "relativeTimeRange", "datasourceUid", "model"}, query
    window = query["relativeTimeRange"]
    assert isinstance(window["from"], int) and isinstance(window["to"], int), rule["uid"]
    assert window["from"] >= window["to"] >= 0, rule["uid"]
    model = query["model"]
    assert model["refId"] == query["refId"]
    if query["datasourceUid"] == "__expr__":
        assert model["type"] in EXPRESSION_TYPES, rule["uid"]
        if model["type"] == "reduce":
            assert model["reducer"] in ("last", "mean", "min", "max", "sum", "count")
            assert model["settings"]["mode"] in ("", "dropNN", "replaceNN")
        if model["type"] == "threshold":
            evaluator = model["conditions"][0]["evaluator"]
            assert evaluator["type"] in ("gt", "lt", "within_range", "outside_range")
            assert all(isinstance(p, int | float) for p in evaluator["params"]), rule["uid"]
    else:
        assert query["datasourceUid"] in ("influxdb", "victoriametrics", "loki"), rule["uid"]
        assert model["datasource"]["uid"] == query["datasourceUid"]
        assert model.get("query") if query["datasourceUid"] == "influxdb" else model.get("expr"), rule["uid"]
        if query["datasourceUid"] == "victoriametrics":
            assert model["datasource"]["type"] == "prometheus"
            # Instant at the end of the window; the simulator evaluates it the same way.
            assert model["instant"] is True and model["range"] is False, rule["uid"]


@SETS
def test_rules_have_the_provisioning_shape_once_rendered(tmp_path: Path, backend: str) -> None:
    document = rendered(tmp_path, source=DIRS[backend])["rules.yaml"]
    assert document["apiVersion"] == 1 and set(document) == {"apiVersion", "groups"}
    panels = {uid: {p["id"] for p in d["panels"]} for uid, d in ((b()["uid"], b()) for b in BUILDERS.values())}
    uids = []
    for group in document["groups"]:
        assert group["orgId"] == 1 and group["name"].strip() and group["folder"] == "Training network"
        assert DURATION.match(group["interval"]), group["interval"]
        for rule in group["rules"]:
            uids.append(rule["uid"])
            assert 0 < len(rule["uid"]) <= 40 and rule["title"].strip()
            refs = [q["refId"] for q in rule["data"]]
            assert rule["condition"] in refs and len(set(refs)) == len(refs)
            for query in rule["data"]:
                _check_query(rule, query)
                assert query["datasourceUid"] in ("__expr__", "loki", METRICS_UID[backend]), rule["uid"]
            assert rule["noDataState"] in ("NoData", "Alerting", "OK", "KeepLast")
            assert rule["execErrState"] in ("Error", "Alerting", "OK", "KeepLast")
            assert DURATION.match(rule["for"]), rule["for"]
            assert rule["panelId"] in panels[rule["dashboardUid"]], rule["uid"]
            annotations = rule["annotations"]
            assert annotations["__dashboardUid__"] == rule["dashboardUid"]
            assert annotations["__panelId__"] == str(rule["panelId"])
            assert annotations["summary"] and annotations["description"]
            assert rule["labels"]["severity"] in ("critical", "warning")
            # Grafana expands $NAME in labels (and in annotations, depending on the version):
            for text in [*annotations.values(), *rule["labels"].values()]:
                assert "$" not in text, rule["uid"]
    assert len(uids) == len(set(uids)) == len(RULES)


def test_rules_and_dashboards_land_in_one_folder_found_by_title() -> None:
    """The alerting provisioner finds its folder by title only and runs beside the dashboards' one.

    grafana/grafana pkg/services/provisioning/alerting/rules_provisioner.go creates a
    missing folder with a random uid; a dashboard provider with a folderUid looks up
    that uid only (pkg/services/provisioning/dashboards/file_reader.go), so it would
    make a second folder of the same title whenever the rules came first.
    """
    for directory in ("provisioning", "provisioning-victoriametrics"):
        path = ROOT / "grafana" / directory / "dashboards" / "dashboards.yml"
        [provider] = yaml.safe_load(path.read_text())["providers"]
        assert provider["folder"] == ba.FOLDER and "folderUid" not in provider, path
    for directory in DIRS.values():
        groups = yaml.safe_load((directory / "rules.yaml").read_text())["groups"]
        assert {group["folder"] for group in groups} == {ba.FOLDER}, directory


def test_each_work_measurement_has_a_role_of_its_own() -> None:
    """What keeps the store and node-silent rules' series uniquely labelled (grafana/alerting_src/rules.py).

    Their InfluxQL spans WORK_MEASUREMENTS and groups by role or by node; two measurements
    written by one role would give two series with the same labels, which Grafana makes an Error.
    """
    roles = [CATALOG[name].roles for name in WORK_MEASUREMENTS]
    assert all(len(r) == 1 for r in roles) and len({r[0] for r in roles}) == len(roles), roles


def test_every_rule_names_the_node_labels_in_its_description() -> None:
    for rule in RULES:
        assert rule.no_data_reason and rule.exec_err_reason and rule.fired_by, rule.uid
        if rule.uid.endswith("unavailable"):
            continue  # about a store, not a node
        if rule.uid.startswith("telemetry-edge-"):
            # About what reached the edge: a refused credential names no node, its address is what is known.
            assert "{{ .Labels.request_remote_ip }}" in rule.description, rule.uid
            continue
        if rule.uid == "telemetry-backup-overdue":
            # About the stack's own hosts: a host, no node (stack_backup has no node tag).
            assert "{{ .Labels.host }}" in rule.description and "{{ .Labels.host }}" in rule.summary, rule.uid
            continue
        assert "{{ .Labels.uid }}" in rule.description and "{{ .Labels.role }}" in rule.description, rule.uid


@SETS
def test_no_placeholder_is_left_and_numbers_stay_numbers(tmp_path: Path, backend: str) -> None:
    overrides = {"ALERT_GPU_MEMORY_PERCENT": "90.5", "ALERT_NODE_SILENT_STEPS": "4"}
    rd.render_dir(DIRS[backend], tmp_path, overrides)
    text = (tmp_path / "rules.yaml").read_text()
    assert "${ALERT_" not in text
    document = yaml.safe_load(text)
    rules = {r["uid"]: r for g in document["groups"] for r in g["rules"]}
    gpu = next(q for q in rules["telemetry-gpu-memory-high"]["data"] if q["model"].get("type") == "threshold")
    assert gpu["model"]["conditions"][0]["evaluator"]["params"] == [90.5]
    silent = rules["telemetry-node-silent"]["data"][0]
    if backend == "influxdb":
        assert 'moving_average(count("window"), 4)' in silent["model"]["query"]
    else:
        assert "< bool (4 * 60)" in silent["model"]["expr"]
    assert silent["relativeTimeRange"] == {"from": 3600, "to": 0}


@SETS
def test_every_placeholder_is_a_setting_and_every_setting_is_used(backend: str) -> None:
    text = "".join((DIRS[backend] / name).read_text() for name in ("rules.yaml", *rd.CONTACT_FILES))
    used = set(rd.PLACEHOLDER.findall(text))
    assert used == set(st.BY_NAME), used ^ set(st.BY_NAME)


@pytest.mark.parametrize(
    ("name", "value"),
    [("ALERT_GPU_MEMORY_PERCENT", "95%"), ("ALERT_LOSS_WINDOW_SECONDS", "5m"), ("ALERT_NODE_SILENT_STEPS", "0"),
     ("ALERT_WEBHOOK_TYPE", "teams"), ("ALERT_NO_SUCH_SETTING", "1"), ("ALERT_LOSS_WINDOW_SECONDS", "0600"),
     ("ALERT_NODE_SILENT_STEP_SECONDS", "0"), ("ALERT_BACKUP_NO_REPORT_STATE", "Firing")],
)  # fmt: skip
def test_a_malformed_setting_is_refused_with_its_name(name: str, value: str) -> None:
    with pytest.raises(ValueError, match=name):
        st.resolve({name: value})


# Settings Grafana refuses at start (grafana/alerting_src/settings.py cites where), with what the error must name.
REFUSED_BY_GRAFANA = [
    ({"ALERT_EVALUATION_SECONDS": "0"}, ["ALERT_EVALUATION_SECONDS", "multiple of 10"]),
    ({"ALERT_EVALUATION_SECONDS": "45"}, ["ALERT_EVALUATION_SECONDS", "multiple of 10"]),
    ({"ALERT_STORE_WINDOW_SECONDS": "0"}, ["ALERT_STORE_WINDOW_SECONDS", "telemetry-influxdb-unavailable"]),
    ({"ALERT_RESOURCE_WINDOW_SECONDS": "0"}, ["ALERT_RESOURCE_WINDOW_SECONDS", "telemetry-host-disk-high"]),
    (
        {"ALERT_LOSS_WINDOW_SECONDS": "3600", "ALERT_LOSS_BASELINE_SECONDS": "3600"},
        ["ALERT_LOSS_BASELINE_SECONDS", "ALERT_LOSS_WINDOW_SECONDS", "telemetry-loss-diverging"],
    ),
    (
        {"ALERT_LOG_ERRORS_BASELINE_SECONDS": "120"},
        ["ALERT_LOG_ERRORS_BASELINE_SECONDS", "ALERT_LOG_ERRORS_WINDOW_SECONDS", "telemetry-log-errors"],
    ),
]


@pytest.mark.parametrize(("overrides", "named"), REFUSED_BY_GRAFANA)
def test_settings_grafana_would_refuse_are_refused_with_the_setting_and_the_rule(
    overrides: dict[str, str], named: list[str]
) -> None:
    with pytest.raises(ValueError) as refused:
        st.resolve(overrides)
    message = str(refused.value)
    assert "\n" not in message and all(word in message for word in named), message


def test_every_data_query_window_is_bounded_by_settings_the_checks_know() -> None:
    """Grafana refuses a data query whose relativeTimeRange.from is not above its to: each is checked."""
    windows = {(w.start, w.end) for w in st.time_ranges()}
    for backend in ("influxdb", "victoriametrics"):
        for group in ba.rules_document(backend)["groups"]:
            assert group["interval"] == "${ALERT_EVALUATION_SECONDS}s"
            for rule in group["rules"]:
                for query in rule["data"]:
                    if query["datasourceUid"] == "__expr__":
                        continue
                    bounds = tuple(str(query["relativeTimeRange"][k]).strip("${}") for k in ("from", "to"))
                    assert bounds in windows, (rule["uid"], bounds)
    # With the defaults and the simulator's values every window starts before it ends.
    for values in (st.defaults(), al.run_settings(10.0, 1.0), al.run_settings(1.0, 1.0)):
        assert all(int(values[w.start]) > int(values.get(w.end, w.end)) for w in st.time_ranges())


def backup_no_data_state(rules_file: Path) -> str:
    """The noDataState of the backup rule in a rendered rules file."""
    document = yaml.safe_load(rules_file.read_text())
    [rule] = [r for g in document["groups"] for r in g["rules"] if r["uid"] == "telemetry-backup-overdue"]
    return rule["noDataState"]


@SETS
def test_the_backup_rule_alerts_when_no_host_reports_unless_set_to_ok(tmp_path: Path, backend: str) -> None:
    """Production (settings.env's default, which the Ansible role keeps) fires; OK is for a stack without backups."""
    assert st.defaults()["ALERT_BACKUP_NO_REPORT_STATE"] == "Alerting"
    rd.render_dir(DIRS[backend], tmp_path / "default")
    assert backup_no_data_state(tmp_path / "default" / "rules.yaml") == "Alerting"
    rd.render_dir(DIRS[backend], tmp_path / "ok", {"ALERT_BACKUP_NO_REPORT_STATE": "OK"})
    assert backup_no_data_state(tmp_path / "ok" / "rules.yaml") == "OK"
    with pytest.raises(ValueError, match="ALERT_BACKUP_NO_REPORT_STATE must be one of Alerting, OK, got 'Firing'"):
        rd.render_dir(DIRS[backend], tmp_path / "bad", {"ALERT_BACKUP_NO_REPORT_STATE": "Firing"})


def test_a_no_data_state_placeholder_must_name_a_choice_of_grafana_states() -> None:
    """Grafana refuses a noDataState it does not know (NoDataStateFromString): only such choices may stand there."""
    [rule] = [r for r in RULES if r.uid == "telemetry-backup-overdue"]
    assert rule.no_data_state == "${ALERT_BACKUP_NO_REPORT_STATE}"
    for value in ("${ALERT_WEBHOOK_TYPE}", "${ALERT_PENDING_SECONDS}", "${ALERT_NO_SUCH_SETTING}", "Firing"):
        with pytest.raises(ValueError, match="noDataState"):
            dataclasses.replace(rule, no_data_state=value)


def test_an_unknown_placeholder_is_refused() -> None:
    with pytest.raises(ValueError, match="ALERT_TYPO"):
        rd.fill("x: ${ALERT_TYPO}", st.defaults())


def test_contact_points_only_when_configured_and_no_secret_in_a_file(tmp_path: Path) -> None:
    assert set(rendered(tmp_path / "none")) == {"rules.yaml"}
    files = rendered(tmp_path / "hook", {"ALERT_WEBHOOK_TYPE": "discord"}, {"ALERTING_WEBHOOK_URL": "https://x"})
    assert set(files) == {
        "rules.yaml",
        "contact-point-webhook.yaml",
        "policies.yaml",
        "retire-contact-point-email.yaml",
    }
    receiver = files["contact-point-webhook.yaml"]["contactPoints"][0]["receivers"][0]
    assert receiver["type"] == "discord"
    assert receiver["settings"]["url"] == "${ALERTING_WEBHOOK_URL}"  # Grafana expands it; never written down
    both = rendered(tmp_path / "both", env={"ALERTING_WEBHOOK_URL": "https://x", "ALERTING_EMAIL_ADDRESSES": "a@b"})
    assert set(both) == {"rules.yaml", *rd.CONTACT_FILES, "policies.yaml"}
    names = {cp["name"] for f in rd.CONTACT_FILES for cp in both[f]["contactPoints"]}
    policy = both["policies.yaml"]["policies"][0]
    assert names == {policy["receiver"]} and all(r["receiver"] in names for r in policy["routes"])
    for name in rd.CONTACT_FILES:
        for contact in both[name]["contactPoints"]:
            for receiver in contact["receivers"]:
                assert receiver["uid"] and receiver["type"] and receiver["settings"]
                secrets = [v for v in receiver["settings"].values() if isinstance(v, str) and v.strip()]
                assert all(REF.fullmatch(v) or v in ("true", "false") for v in secrets), receiver


def test_an_address_left_unset_retires_its_integration_only_while_another_remains(tmp_path: Path) -> None:
    """Grafana keeps a contact point whose file is left out; only deleteContactPoints removes it.

    Deleting the last integration of the contact point the provisioned policy routes to
    would fail Grafana's start, so with no address left nothing is deleted unless asked,
    and then the policy tree is reset first (provisioner.go unprovisions policies first).
    """
    email_only = rendered(tmp_path / "email", env={"ALERTING_EMAIL_ADDRESSES": "a@b"})
    assert set(email_only) == {"rules.yaml", "contact-point-email.yaml", "policies.yaml", rd.RETIRE_FILES[
        "contact-point-webhook.yaml"]}  # fmt: skip
    retired = email_only["retire-contact-point-webhook.yaml"]["deleteContactPoints"]
    webhook = yaml.safe_load((ALERTING / "contact-point-webhook.yaml").read_text())["contactPoints"][0]["receivers"]
    assert retired == [{"orgId": 1, "uid": webhook[0]["uid"]}]
    assert set(rendered(tmp_path / "none", env={rd.RETIRE_SWITCH: "false"})) == {"rules.yaml"}
    everything = rendered(tmp_path / "retire", env={rd.RETIRE_SWITCH: "true"})
    assert set(everything) == {"rules.yaml", rd.RESET_FILE, *rd.RETIRE_FILES.values()}
    assert everything[rd.RESET_FILE] == {"apiVersion": 1, "resetPolicies": [1]}
    uids = {d["uid"] for f in rd.RETIRE_FILES.values() for d in everything[f]["deleteContactPoints"]}
    assert uids == {"telemetry-webhook", "telemetry-email"}


def test_retired_rules_are_deleted_by_uid_and_never_defined() -> None:
    """A rule left out of rules.yaml keeps evaluating in Grafana; deleteRules is what removes it."""
    document = ba.rules_document("influxdb", retired=("telemetry-old-rule",))
    assert document["deleteRules"] == [{"orgId": 1, "uid": "telemetry-old-rule"}]
    assert "deleteRules" not in ba.rules_document("influxdb", retired=())
    with pytest.raises(ValueError, match="telemetry-node-silent"):
        ba.rules_document("influxdb", retired=("telemetry-node-silent",))
    committed = yaml.safe_load((ALERTING / "rules.yaml").read_text())
    assert [d["uid"] for d in committed.get("deleteRules", [])] == list(RETIRED_RULE_UIDS)


def test_settings_env_lists_every_setting_with_its_default() -> None:
    lines = (ALERTING / "settings.env").read_text().splitlines()
    pairs = dict(line.split("=", 1) for line in lines if "=" in line and not line.startswith("#"))
    assert pairs == st.defaults()
    assert st.resolve(pairs) == pairs


# ---------------------------------------------------------------- deployment

ENTRYPOINT = ROOT / "compose" / "grafana" / "entrypoint.sh"


def run_entrypoint(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """The Grafana container's entrypoint, with Grafana itself replaced by a script that reports."""
    run = tmp_path / "run.sh"
    run.write_text('#!/bin/sh\necho "provisioning=$GF_PATHS_PROVISIONING webhook=$ALERTING_WEBHOOK_URL"\n')
    run.chmod(0o755)
    base = {
        "PATH": os.environ["PATH"],
        "INFLUXDB_READ_TOKEN": "read-token",
        "TELEMETRY_ALERTING_DIR": str(ALERTING),
        "GF_PATHS_PROVISIONING": str(ROOT / "grafana" / "provisioning"),
        "TELEMETRY_PROVISIONING_DIR": str(tmp_path / "provisioning"),
        "GRAFANA_RUN": str(run),
    }
    return subprocess.run(["sh", str(ENTRYPOINT)], env={**base, **env}, capture_output=True, text=True, check=False)


@pytest.mark.slow
@SETS
def test_the_entrypoint_renders_exactly_what_the_python_renderer_does(tmp_path: Path, backend: str) -> None:
    hook = tmp_path / "alerting_webhook_url"
    hook.write_text("https://discord.example/api/webhooks/1/abc\n")
    overrides = {"ALERT_GPU_MEMORY_PERCENT": "90.5", "ALERT_NODE_SILENT_STEPS": "5", "ALERT_WEBHOOK_TYPE": "discord"}
    done = run_entrypoint(
        tmp_path,
        ALERTING_WEBHOOK_URL_FILE=str(hook),
        ALERTING_EMAIL_ADDRESSES="ops@example.org",
        TELEMETRY_ALERTING_DIR=str(DIRS[backend]),
        **overrides,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == (
        f"provisioning={tmp_path / 'provisioning'} webhook=https://discord.example/api/webhooks/1/abc"
    )
    expected = rd.render_dir(
        DIRS[backend], tmp_path / "python", overrides, {"ALERTING_WEBHOOK_URL": "x", "ALERTING_EMAIL_ADDRESSES": "y"}
    )
    rendered_dir = tmp_path / "provisioning" / "alerting"
    assert sorted(p.name for p in rendered_dir.iterdir()) == sorted(p.name for p in expected)
    for path in expected:
        assert (rendered_dir / path.name).read_text() == path.read_text(), path.name
    # The rest of the provisioning is handed over as it is.
    assert (tmp_path / "provisioning" / "datasources" / "datasources.yml").is_file()


@pytest.mark.slow
@pytest.mark.parametrize(
    "env",
    [{"ALERTING_EMAIL_ADDRESSES": "ops@example.org"}, {"ALERTING_RETIRE_CONTACT_POINTS": "true"}, {}],
)
def test_the_entrypoint_retires_contact_points_as_the_python_renderer_does(tmp_path: Path, env: dict[str, str]) -> None:
    empty = tmp_path / "alerting_webhook_url"
    empty.write_text("")
    done = run_entrypoint(tmp_path, ALERTING_WEBHOOK_URL_FILE=str(empty), **env)
    assert done.returncode == 0, done.stderr
    expected = rd.render_dir(ALERTING, tmp_path / "python", {}, env)
    rendered_dir = tmp_path / "provisioning" / "alerting"
    assert sorted(p.name for p in rendered_dir.iterdir()) == sorted(p.name for p in expected)
    for path in expected:
        assert (rendered_dir / path.name).read_text() == path.read_text(), path.name


@pytest.mark.slow
def test_the_entrypoint_without_contact_points_provisions_the_rules_only(tmp_path: Path) -> None:
    empty = tmp_path / "alerting_webhook_url"
    empty.write_text("")
    done = run_entrypoint(tmp_path, ALERTING_WEBHOOK_URL_FILE=str(empty))
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in (tmp_path / "provisioning" / "alerting").iterdir()) == ["rules.yaml"]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "value"),
    [("ALERT_LOSS_WINDOW_SECONDS", "5m"), ("ALERT_GPU_MEMORY_PERCENT", "9x"), ("ALERT_NODE_SILENT_STEPS", "0"),
     ("ALERT_WEBHOOK_TYPE", "teams"), ("ALERT_LOSS_JUMP_RATIO", "1.2.3"), ("ALERT_BACKUP_NO_REPORT_STATE", "Firing"),
     ("ALERT_BACKUP_NO_REPORT_STATE", "OK Alerting")],
)  # fmt: skip
def test_the_entrypoint_refuses_a_malformed_setting_by_name(tmp_path: Path, name: str, value: str) -> None:
    done = run_entrypoint(tmp_path, **{name: value})
    assert done.returncode == 1 and name in done.stderr and "provisioning=" not in done.stdout


@pytest.mark.slow
@pytest.mark.parametrize(("overrides", "named"), REFUSED_BY_GRAFANA)
def test_the_entrypoint_refuses_what_grafana_would_refuse_in_one_line(
    tmp_path: Path, overrides: dict[str, str], named: list[str]
) -> None:
    done = run_entrypoint(tmp_path, **overrides)
    assert done.returncode == 1 and "provisioning=" not in done.stdout, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and all(word in done.stderr for word in named), done.stderr


@pytest.mark.slow
def test_the_entrypoint_alerts_when_no_host_reports_backups_unless_set_to_ok(tmp_path: Path) -> None:
    """Without the variable (production: the Ansible role passes only what is set) the default is Alerting."""
    for name, env, state in (("default", {}, "Alerting"), ("ok", {"ALERT_BACKUP_NO_REPORT_STATE": "OK"}, "OK")):
        (tmp_path / name).mkdir()
        done = run_entrypoint(tmp_path / name, **env)
        assert done.returncode == 0, done.stderr
        assert backup_no_data_state(tmp_path / name / "provisioning" / "alerting" / "rules.yaml") == state


@pytest.mark.slow
def test_the_entrypoint_accepts_windows_that_start_before_they_end(tmp_path: Path) -> None:
    overrides = {
        "ALERT_EVALUATION_SECONDS": "30",
        "ALERT_LOSS_WINDOW_SECONDS": "60",
        "ALERT_LOSS_BASELINE_SECONDS": "61",
    }
    done = run_entrypoint(tmp_path, **overrides)
    assert done.returncode == 0, done.stderr
    rules = yaml.safe_load((tmp_path / "provisioning" / "alerting" / "rules.yaml").read_text())
    assert {g["interval"] for g in rules["groups"]} == {"30s"}


def test_compose_passes_every_setting_and_mounts_the_alerting_files() -> None:
    compose = yaml.safe_load((ROOT / "compose" / "docker-compose.yml").read_text())
    grafana = compose["services"]["grafana"]
    # No backup timer runs on the local stack: no host ever reports, so the backup rule's no data is OK there.
    local = {"ALERT_BACKUP_NO_REPORT_STATE": "OK"}
    for setting in st.SETTINGS:
        assert grafana["environment"][setting.name] == "${" + setting.name + ":-" + local.get(setting.name, "") + "}"
    assert grafana["environment"]["ALERTING_WEBHOOK_URL_FILE"] == "/run/secrets/alerting_webhook_url"
    # Each metrics backend's file mounts its own generated rules where the entrypoint reads them.
    for backend, directory in (("influxdb", "alerting"), ("victoriametrics", "alerting-victoriametrics")):
        backend_file = yaml.safe_load((ROOT / "compose" / f"docker-compose.{backend}.yml").read_text())
        assert f"../grafana/{directory}:/etc/telemetry/alerting:ro" in backend_file["services"]["grafana"]["volumes"]


def test_the_docs_name_every_rule_and_setting() -> None:
    docs = (ROOT / "docs" / "alerting.md").read_text()
    missing = [r.uid for r in RULES if f"`{r.uid}`" not in docs] + [s.name for s in st.SETTINGS if s.name not in docs]
    assert missing == []
    assert "docs/alerting.md" in (ROOT / "README.md").read_text()
