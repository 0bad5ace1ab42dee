"""`make doctor`: the local stack's own health, as its users depend on it.

Every service answers its health endpoint; Grafana's data sources pass Grafana's
own health check (`GET /api/datasources/uid/<uid>/health`, which runs the plugin's
CheckHealth: for InfluxDB a query with the read token, for Loki a connection);
the dashboards in grafana/dashboards/ and the alert rules in
grafana/alerting/ are loaded (`GET /api/search`,
`GET /api/v1/provisioning/alert-rules`); the node token may write and not read,
and Grafana's read token may read and not write. No check stores anything: a
write permission is proved by an empty write (see `server`).

With METRICS_BACKEND=victoriametrics the metrics store is VictoriaMetrics behind
vmauth (compose/docker-compose.victoriametrics.yml): the checks read the
`-victoriametrics` twins of grafana/provisioning, dashboards and alerting, the node
token may write but not query, and there is no read token to check
(Grafana queries VictoriaMetrics on the stack's own network).
"""

from __future__ import annotations

import base64
import json
import re
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from telemetry_client._doctor.net import Probe, probe
from telemetry_client._doctor.report import Check, Status, describe_secret, fail, ok, warn
from telemetry_client._doctor.server import credential_refused

REPOSITORY = Path(__file__).resolve().parents[2]


@dataclass
class StackSettings:
    """Where the local stack is and the credentials `make doctor` reads from compose/.env and compose/node.env."""

    influxdb_url: str = "http://127.0.0.1:8086"
    loki_url: str = "http://127.0.0.1:3100"
    grafana_url: str = "http://127.0.0.1:3000"
    database: str = "telemetry"  # the bucket (and its DBRP database name)
    org: str = "telemetry"
    api_version: int = 2
    node_headers: dict[str, str] = field(default_factory=dict)  # the node's write credential
    read_headers: dict[str, str] = field(default_factory=dict)  # Grafana's InfluxDB read credential
    grafana_headers: dict[str, str] = field(default_factory=dict)  # Grafana admin (basic auth) or a token
    grafana_dir: Path = REPOSITORY / "grafana"
    timeout: float = 5.0
    metrics_backend: str = "influxdb"  # or "victoriametrics" (METRICS_BACKEND of compose/.env)

    @property
    def victoriametrics(self) -> bool:
        return self.metrics_backend == "victoriametrics"

    @property
    def store(self) -> str:
        return "VictoriaMetrics" if self.victoriametrics else "InfluxDB"

    def grafana_files(self, name: str) -> Path:
        """grafana/<name>, or its `-victoriametrics` twin for that backend (docs/local-stack.md)."""
        return self.grafana_dir / (f"{name}-victoriametrics" if self.victoriametrics else name)


def token_headers(token: str | None) -> dict[str, str]:
    return {"Authorization": f"Token {token}"} if token else {}


def basic_headers(user: str | None, password: str | None) -> dict[str, str]:
    if not (user and password):
        return {}
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


def _json(result: Probe) -> Any:
    try:
        return json.loads(result.body or b"null")
    except ValueError:
        return None


def _unreachable(name: str, result: Probe, setting: str) -> Check:
    return fail(
        name,
        f"{result.url} did not answer ({result.failed_step}: {result.error}).",
        f"Start the stack with `make up` (see `make ps`), or correct {setting}.",
    )


# ---- services ------------------------------------------------------------------------


def services(settings: StackSettings) -> list[Check]:
    """The metrics store's `/health` (InfluxDB 2.x, or vmauth in front of VictoriaMetrics; `/ping` on
    InfluxDB 1.x), Loki `/ready`, Grafana `/api/health`: each says it is up."""
    checks = []
    store, port, service = (
        ("VictoriaMetrics", "VICTORIAMETRICS_PORT", "vmauth")
        if settings.victoriametrics
        else ("InfluxDB", "INFLUXDB_PORT", "influxdb")
    )
    influx = probe(settings.influxdb_url + "/health", timeout=settings.timeout)
    if influx.status == 404:
        influx = probe(settings.influxdb_url + "/ping", timeout=settings.timeout)
    if not influx.answered:
        checks.append(_unreachable(f"{store} service", influx, f"{port} in compose/.env"))
    elif influx.status in (200, 204):
        body = _json(influx)
        version = influx.headers.get("x-influxdb-version") or (body.get("version") if isinstance(body, dict) else "")
        checks.append(
            ok(f"{store} service", f"{influx.url} answered {influx.status} (version {version or 'unknown'}).")
        )
    else:
        checks.append(
            fail(
                f"{store} service",
                f"{influx.url} answered {influx.status}: {influx.text()}.",
                f"Read `make logs SERVICE={service}`.",
            )
        )
    loki = probe(settings.loki_url + "/ready", timeout=settings.timeout)
    if not loki.answered:
        checks.append(_unreachable("Loki service", loki, "LOKI_PORT in compose/.env"))
    elif loki.status == 200:
        checks.append(ok("Loki service", f"{loki.url} answered 200 {loki.text()!r}."))
    else:
        checks.append(
            fail(
                "Loki service",
                f"{loki.url} answered {loki.status} {loki.text()!r} (Loki answers 503 until its ring is ready).",
                "Wait a minute after `make up`, then read `make logs SERVICE=loki`.",
            )
        )
    grafana = probe(settings.grafana_url + "/api/health", timeout=settings.timeout)
    body = _json(grafana)
    if not grafana.answered:
        checks.append(_unreachable("Grafana service", grafana, "GRAFANA_PORT in compose/.env"))
    elif grafana.status == 200 and isinstance(body, dict) and body.get("database") == "ok":
        checks.append(ok("Grafana service", f"{grafana.url}: database ok, version {body.get('version', 'unknown')}."))
    else:
        checks.append(
            fail(
                "Grafana service",
                f"{grafana.url} answered {grafana.status}: {grafana.text()}.",
                "Read `make logs SERVICE=grafana`.",
            )
        )
    return checks


# ---- Grafana ---------------------------------------------------------------------------


def provisioned_datasource_uids(grafana_dir: Path, provisioning: str = "provisioning") -> list[str]:
    """The `uid:` of every data source in grafana/<provisioning>/datasources/*.yml."""
    uids = []
    for path in sorted((grafana_dir / provisioning / "datasources").glob("*.y*ml")):
        uids += re.findall(r"^\s+uid:\s*['\"]?([\w-]+)", path.read_text(), flags=re.MULTILINE)
    return uids


def provisioned_dashboards(grafana_dir: Path, folder: str = "dashboards") -> dict[str, str]:
    """uid -> title of every dashboard in grafana/<folder>/."""
    found = {}
    for path in sorted((grafana_dir / folder).glob("*.json")):
        data = json.loads(path.read_text())
        found[str(data.get("uid"))] = str(data.get("title"))
    return found


def provisioned_alert_rules(
    grafana_dir: Path, alerting: str = "alerting", provisioning: str = "provisioning"
) -> dict[str, str] | None:
    """uid -> title of every rule in grafana/<alerting>/ (None when pyyaml is missing to read them)."""
    files = [
        p for folder in (alerting, f"{provisioning}/alerting") for p in sorted((grafana_dir / folder).glob("*.y*ml"))
    ]
    if not files:
        return {}
    try:
        import yaml
    except ImportError:
        return None
    rules = {}
    for path in files:
        document = yaml.safe_load(path.read_text()) or {}
        for group in document.get("groups") or []:
            for rule in group.get("rules") or []:
                rules[str(rule.get("uid"))] = str(rule.get("title"))
    return rules


def _grafana_get(settings: StackSettings, path: str) -> Probe:
    return probe(settings.grafana_url + path, headers=settings.grafana_headers, timeout=max(settings.timeout, 30))


def _grafana_refused(name: str, result: Probe) -> Check:
    return fail(
        name,
        f"Grafana refused the credentials ({result.status}: {result.text()}).",
        "Set GRAFANA_USER/GRAFANA_PASSWORD (make doctor reads GRAFANA_ADMIN_* from compose/.env).",
    )


def datasources(settings: StackSettings) -> list[Check]:
    """Grafana's own health check of every provisioned data source."""
    checks = []
    provisioning = settings.grafana_files("provisioning").name
    for uid in provisioned_datasource_uids(settings.grafana_dir, provisioning):
        name = f"Grafana data source {uid!r}"
        result = _grafana_get(settings, f"/api/datasources/uid/{urllib.parse.quote(uid)}/health")
        body = _json(result)
        message = body.get("message", "") if isinstance(body, dict) else result.text()
        if not result.answered:
            checks.append(_unreachable(name, result, "GRAFANA_PORT in compose/.env"))
        elif result.status == 401:
            checks.append(_grafana_refused(name, result))
        elif result.status == 200 and isinstance(body, dict) and body.get("status") == "OK":
            checks.append(ok(name, f"Grafana's health check passed: {message}"))
        elif result.status == 500 and "metadata" in message:
            checks.append(
                fail(
                    name,
                    f"Grafana does not know this data source ({message}).",
                    f"Check grafana/{provisioning}/datasources and restart Grafana (`make up`).",
                )
            )
        else:
            checks.append(
                fail(
                    name,
                    f"Grafana's health check failed ({result.status}): {message}",
                    (
                        "Check the data source URL Grafana is given (VICTORIAMETRICS_URL, "
                        "compose/docker-compose.victoriametrics.yml)."
                        if settings.victoriametrics
                        else "Check INFLUXDB_READ_TOKEN / the data source URL Grafana is given "
                        "(compose/docker-compose.influxdb.yml)."
                    ),
                )
            )
    return checks


def dashboards(settings: StackSettings) -> Check:
    """Every dashboard of grafana/dashboards/ is loaded (found by uid through `/api/search`)."""
    name = "Grafana dashboards"
    expected = provisioned_dashboards(settings.grafana_dir, settings.grafana_files("dashboards").name)
    result = _grafana_get(settings, "/api/search?type=dash-db&limit=5000")
    if not result.answered:
        return _unreachable(name, result, "GRAFANA_PORT in compose/.env")
    if result.status == 401:
        return _grafana_refused(name, result)
    listed = _json(result)
    found = {str(d.get("uid")) for d in listed if isinstance(d, dict)} if isinstance(listed, list) else set()
    missing = sorted(set(expected) - found)
    if missing:
        return fail(
            name,
            f"{len(missing)} of {len(expected)} provisioned dashboards are not loaded: "
            + ", ".join(f"{expected[uid]} ({uid})" for uid in missing)
            + ".",
            "Run `python -m grafana.build_dashboards`, then read `make logs SERVICE=grafana` for provisioning errors.",
        )
    return ok(name, f"all {len(expected)} provisioned dashboards are loaded.", uids=sorted(expected))


def alert_rules(settings: StackSettings) -> Check:
    """Every alert rule of grafana/alerting/ is loaded (`/api/v1/provisioning/alert-rules`)."""
    name = "Grafana alert rules"
    expected = provisioned_alert_rules(
        settings.grafana_dir, settings.grafana_files("alerting").name, settings.grafana_files("provisioning").name
    )
    if expected is None:
        return warn(name, "pyyaml is not installed, so the provisioned rules cannot be read.", "pip install pyyaml.")
    result = _grafana_get(settings, "/api/v1/provisioning/alert-rules")
    if not result.answered:
        return _unreachable(name, result, "GRAFANA_PORT in compose/.env")
    if result.status == 401:
        return _grafana_refused(name, result)
    listed = _json(result)
    found = {str(r.get("uid")) for r in listed if isinstance(r, dict)} if isinstance(listed, list) else set()
    if not expected:
        return ok(name, f"no alert rules are provisioned in the repository; Grafana holds {len(found)}.")
    missing = sorted(set(expected) - found)
    if missing:
        return fail(
            name,
            f"{len(missing)} of {len(expected)} provisioned alert rules are not loaded: "
            + ", ".join(f"{expected[uid]} ({uid})" for uid in missing)
            + ".",
            "Read `make logs SERVICE=grafana` for alerting provisioning errors.",
        )
    return ok(name, f"all {len(expected)} provisioned alert rules are loaded.", uids=sorted(expected))


# ---- credentials -----------------------------------------------------------------------


def _write_url(settings: StackSettings) -> str:
    base = settings.influxdb_url.rstrip("/")
    if settings.api_version == 1:
        return f"{base}/write?{urllib.parse.urlencode({'db': settings.database})}"
    return f"{base}/api/v2/write?{urllib.parse.urlencode({'org': settings.org, 'bucket': settings.database})}"


def may_write(settings: StackSettings, headers: dict[str, str]) -> tuple[bool | None, str]:
    """An empty write: allowed (204, or 2.x's 400 'writing requires points'), refused (401/403), or unknown.

    vmauth 1.79 answers an unknown token with 400 "cannot find the provided auth token"
    (VictoriaMetrics app/vmauth/main.go, tag v1.79.5; 401 "Unauthorized" at tag
    v1.136.0): refused too (credential_refused).
    """
    result = probe(_write_url(settings), method="POST", body=b"", headers={**headers, "Content-Type": "text/plain"})
    if not result.answered:
        return None, f"no answer ({result.error})"
    said = f"{result.status} {result.text(120)!r}"
    if result.status == 204 or (result.status == 400 and b"writing requires points" in result.body):
        return True, said
    if credential_refused(result.status, result.body):
        return False, said
    return None, said


def may_query_victoriametrics(settings: StackSettings, headers: dict[str, str]) -> tuple[bool | None, str]:
    """A MetricsQL query (`/api/v1/query`) through vmauth: an answer means it may read.

    vmauth answers a credential without a route for the path with 400 "missing route"
    (VictoriaMetrics app/vmauth/main.go at tag v1.136.0, target_url.go at v1.79.5), an
    unknown one with 400 or 401 (see may_write).
    """
    result = probe(f"{settings.influxdb_url.rstrip('/')}/api/v1/query?query=1", headers=headers)
    if not result.answered:
        return None, f"no answer ({result.error})"
    said = f"{result.status} {result.text(120)!r}"
    if credential_refused(result.status, result.body) or (result.status == 400 and b"missing route" in result.body):
        return False, said
    body = _json(result)
    if result.status == 200 and isinstance(body, dict):
        return body.get("status") == "success", said
    return None, said


def may_read(settings: StackSettings, headers: dict[str, str]) -> tuple[bool | None, str]:
    """InfluxQL `SHOW MEASUREMENTS` through `/query`: rows or an empty result mean it may read."""
    if settings.victoriametrics:
        return may_query_victoriametrics(settings, headers)
    query = urllib.parse.urlencode({"db": settings.database, "q": "SHOW MEASUREMENTS"})
    result = probe(f"{settings.influxdb_url.rstrip('/')}/query?{query}", headers=headers)
    if not result.answered:
        return None, f"no answer ({result.error})"
    said = f"{result.status} {result.text(120)!r}"
    if result.status in (401, 403):
        return False, said
    body = _json(result)
    if result.status == 200 and isinstance(body, dict):
        errors = [r.get("error") for r in body.get("results", []) if isinstance(r, dict) and r.get("error")]
        return (not errors), said
    return None, said


def credential(
    settings: StackSettings, name: str, headers: dict[str, str], *, write: bool, read: bool, setting: str
) -> Check:
    """A credential may do exactly what its holder needs: the node writes, Grafana reads."""
    secret = describe_secret(headers.get("Authorization", "").partition(" ")[2])
    if not headers:
        return warn(
            name, f"not checked: {setting} is not set.", f"Set {setting} (make doctor reads it from the stack)."
        )
    can_write, write_said = may_write(settings, headers)
    can_read, read_said = may_read(settings, headers)
    query = "a MetricsQL query" if settings.victoriametrics else "SHOW MEASUREMENTS"
    evidence = f"{setting} {secret}: empty write → {write_said}; {query} → {read_said}."
    if can_write is None or can_read is None:
        return warn(
            name, evidence, f"Check that {settings.store} is up (`make ps`) and answers as {settings.store} does."
        )
    if can_write != write or can_read != read:
        wrong = []
        if can_write != write:
            wrong.append("may write" if can_write else "may not write")
        if can_read != read:
            wrong.append("may read" if can_read else "may not read")
        if settings.victoriametrics:
            fix = (
                f"{setting} must be the node token of compose/secrets/victoriametrics_node_token, which vmauth "
                "routes to /write and /api/v2/write only (compose/secrets/vmauth_config; `make up` rewrites it)."
            )
        else:
            fix = (
                f"Recreate {setting} with only {'write' if write else 'read'} access to the bucket "
                "(compose/influxdb/init/10-tokens.sh; `make clean VOLUMES=1 && make up` regenerates them)."
            )
        return fail(name, f"it {' and '.join(wrong)}: {evidence}", fix)
    return ok(name, f"{'writes' if write else 'reads'} and may not {'read' if write else 'write'}: {evidence}")


def stack_checks(settings: StackSettings) -> list[Check]:
    checks = services(settings)
    grafana_up = next(c for c in checks if c.name == "Grafana service").status is not Status.FAIL
    if grafana_up:  # otherwise each Grafana check would only repeat that it is down
        checks += datasources(settings)
        checks.append(dashboards(settings))
        checks.append(alert_rules(settings))
    checks.append(
        credential(settings, "Node token", settings.node_headers, write=True, read=False, setting="INFLUXDB_TOKEN")
    )
    if settings.victoriametrics:  # Grafana reads VictoriaMetrics on the stack's network, without a token
        return checks
    checks.append(
        credential(
            settings, "Grafana read token", settings.read_headers, write=False, read=True, setting="INFLUXDB_READ_TOKEN"
        )
    )
    return checks
