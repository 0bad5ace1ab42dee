"""Grafana really running with the repository's provisioning."""

import json
import os
from pathlib import Path

API = "http://127.0.0.1:13000"
REPO = Path(os.environ["MOLECULE_PROJECT_DIRECTORY"]).resolve().parents[2]
SECRETS = Path(os.environ["MOLECULE_EPHEMERAL_DIRECTORY"]) / "secrets"


def _get(host, path):
    password = (SECRETS / "grafana_admin_password").read_text().strip()
    return json.loads(host.check_output(f"curl -fsS -u 'admin:{password}' {API}{path}"))


def test_health(host):
    assert json.loads(host.check_output(f"curl -fsS {API}/api/health"))["database"] == "ok"


def test_anonymous_access_is_refused(host):
    status = host.check_output(f"curl -sS -o /dev/null -w '%{{http_code}}' {API}/api/search")
    assert status == "401"


def test_datasources_are_provisioned_and_reachable(host):
    uids = {source["uid"] for source in _get(host, "/api/datasources")}
    assert {"influxdb", "loki"} <= uids
    for uid in ("influxdb", "loki"):
        assert _get(host, f"/api/datasources/uid/{uid}/health")["status"] == "OK"


def test_every_repository_dashboard_is_loaded(host):
    loaded = {item["uid"] for item in _get(host, "/api/search?type=dash-db")}
    for path in (REPO / "grafana" / "dashboards").glob("*.json"):
        assert json.loads(path.read_text())["uid"] in loaded, path.name
