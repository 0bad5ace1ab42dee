"""The edge binds what a node writes to the identity of its credential, on a fixed path, and logs who sent what.

Debian's Caddy (2.6) serves the Caddyfile the reverse_proxy role renders for
metrics_backend victoriametrics, on loopback, in front of Debian's
victoria-metrics (1.79.5) and of the test Loki receiver (tests/loki_receiver.py).
The nodes' identities come from the inventory (telemetry_node_identities):

- a node that writes another node's uid/role tags, or adds extra_label query
  arguments, is stored under its own uid and role (read back from VictoriaMetrics);
- a wrong or unknown credential gets 401 and reaches no upstream;
- a path that Caddy cleans into a write path (/api/v2/delete/../write) reaches
  the upstream as the fixed write path only; other paths are not found;
- a node's pushes land in its own Loki tenant (its uid), whatever X-Scope-OrgID,
  labels, path or query it sends; a node that floods is limited alone;
- the access log names the node of every request, and never holds a secret.
"""

from __future__ import annotations

import base64
import http.client
import json
import socket
import ssl
import time
from pathlib import Path

import pytest
import yaml
from loki_receiver import Limits, LokiReceiver
from servers import victoria_metrics
from test_victoriametrics_deploy import LOGS_DOMAIN, MetricsProxy, _logger, _samples

pytestmark = pytest.mark.slow  # runs Caddy, VictoriaMetrics and ansible-playbook

IDENTITIES = {"miner-01": {"uid": "m1", "role": "miner"}, "validator-01": {"uid": "v1", "role": "validator"}}
NODES = ["miner-01", "validator-01", "miner-02"]  # miner-02: no identity given, stored as uid miner-02, role miner
REPO = Path(__file__).resolve().parents[1]
# Each node's Loki budget, as the loki role deploys it (limits_config applies to each tenant).
NODE_BUDGET = Limits.from_limits_config(
    yaml.safe_load((REPO / "ansible/roles/loki/defaults/main.yml").read_text())["loki_ingestion_limits"]
)


def _request(
    proxy: MetricsProxy, host: str, method: str, path: str, headers: dict | None = None, body: bytes = b""
) -> int:
    """One HTTPS request to `host` (SNI and Host) on the proxy's port; `path` is sent exactly as given."""
    context = ssl.create_default_context(cafile=str(proxy.cert))
    raw = socket.create_connection(("127.0.0.1", proxy.https_port), timeout=30)
    conn = http.client.HTTPSConnection(host, proxy.https_port, context=context, timeout=30)
    conn.sock = context.wrap_socket(raw, server_hostname=host)
    try:
        conn.request(method, path, body=body or None, headers=headers or {})
        response = conn.getresponse()
        response.read()
        return response.status
    finally:
        conn.close()


def _access_log(proxy: MetricsProxy, name: str) -> list[dict]:
    path = proxy.logs / name
    deadline = time.monotonic() + 60  # a loaded machine may be slow to create it
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _labels(server, match: str) -> list[dict[str, str]]:
    server.flush()
    return [series["metric"] for series in server.export(match)]


@pytest.fixture
def edge(tmp_path):
    """VictoriaMetrics and the Loki receiver behind the rendered proxy, with the identities above."""
    with victoria_metrics() as server, LokiReceiver(auth_enabled=True, limits=NODE_BUDGET) as loki:
        proxy = MetricsProxy(tmp_path, [server.url.removeprefix("http://")])
        proxy.converge(
            NODES,
            telemetry_node_identities=IDENTITIES,
            reverse_proxy_loki_domain=LOGS_DOMAIN,
            reverse_proxy_loki_upstream=f"127.0.0.1:{loki.port}",
        )
        proxy.start()
        try:
            yield proxy, server, loki
        finally:
            proxy.stop()


def _push_body() -> bytes:
    """One line under labels of the node's choosing (another node's uid)."""
    return json.dumps({"streams": [{"stream": {"uid": "v1"}, "values": [[str(time.time_ns()), "hello"]]}]}).encode()


def _loki_login(proxy: MetricsProxy, node: str) -> str:
    password = (proxy.dir / "secrets" / "nodes" / f"{node}.loki-password").read_text().strip()
    return "Basic " + base64.b64encode(f"{node}:{password}".encode()).decode()


@pytest.mark.timeout(900)
def test_a_node_is_stored_under_its_own_identity_whatever_it_writes(edge):
    proxy, server, _ = edge
    miner = proxy.token("miner-01")
    now = time.time_ns()
    # Another node's tags, and extra_label query arguments of its own choosing.
    forged = f"forged,uid=v1,role=validator,extra=kept value=1 {now}".encode()
    query = "?org=tplr&bucket=tplr&precision=ns&extra_label=uid=999&extra_label=role=validator&extra_label=db=x"
    assert (
        _request(proxy, "localhost", "POST", "/api/v2/write" + query, {"Authorization": "Token " + miner}, forged)
        == 204
    )
    # The precision argument cannot smuggle an extra_label in either (its value is escaped).
    smuggled = "?precision=ns%26extra_label%3Duid%3D999"
    line = f"smuggled,uid=999 value=2 {now}".encode()
    assert _request(proxy, "localhost", "POST", "/api/v2/write" + smuggled, {"Authorization": "Bearer " + miner}, line)
    # InfluxDB 1.x's /write, with the same forgeries.
    line = f"forged_v1,uid=v1,role=validator value=3 {now}".encode()
    v1 = "/write?db=tplr&precision=ns&extra_label=uid=999&extra_label=role=validator"
    assert _request(proxy, "localhost", "POST", v1, {"Authorization": "Token " + miner}, line) == 204
    # MetricsLogger, told it is the validator, with the miner's token.
    with _logger(proxy, miner, "v1") as logger:
        logger.log("training_step", fields={"loss": 0.5}, timestamp=now)
        assert logger.flush(30) == 0
    # A node without an identity in the inventory: its name, and the role miner.
    unnamed = f"forged_unnamed,uid=v1,role=validator value=4 {now}".encode()
    headers = {"Authorization": "Token " + proxy.token("miner-02")}
    assert _request(proxy, "localhost", "POST", "/api/v2/write?precision=ns", headers, unnamed) == 204

    assert _samples(server, "training_step_loss", "m1", 1) == [0.5]
    assert [labels["role"] for labels in _labels(server, 'training_step_loss{uid="m1"}')] == ["miner"]
    for name in ("forged_value", "smuggled_value", "forged_v1_value"):
        series = server.wait_for_series(name, 1)
        assert [s["metric"]["uid"] for s in series] == ["m1"], (name, series)
        assert [s["metric"]["role"] for s in series] == ["miner"], (name, series)
    assert _labels(server, "forged_value")[0]["extra"] == "kept"  # the node's other tags are its own
    assert "db" not in _labels(server, "forged_v1_value")[0]  # /write's db argument is not forwarded either
    assert [(s["metric"]["uid"], s["metric"]["role"]) for s in server.wait_for_series("forged_unnamed_value", 1)] == [
        ("miner-02", "miner")
    ]
    assert _labels(server, '{uid=~"v1|999"}') == []
    assert _labels(server, '{role="validator"}') == []


@pytest.mark.timeout(900)
def test_wrong_credentials_and_other_paths_never_reach_victoriametrics(edge):
    proxy, server, _ = edge
    miner = proxy.token("miner-01")
    line = b"refused,uid=m1 value=1"
    write = "/api/v2/write?precision=ns"
    stranger = base64.b64encode(b"miner-09:" + b"x" * 40).decode()
    for authorization in (None, "Token " + miner + "x", "Token " + stranger, "Basic " + miner):
        headers = {"Authorization": authorization} if authorization else {}
        assert _request(proxy, "localhost", "POST", write, headers, line) == 401, authorization
    # One node's Loki login is not a metrics credential.
    assert _request(proxy, "localhost", "POST", write, {"Authorization": _loki_login(proxy, "miner-01")}, line) == 401
    assert _labels(server, "refused_value") == []

    auth = {"Authorization": "Token " + miner}
    # Cleaned into the write path by Caddy's matcher: forwarded as the write only, stored as the node.
    dotted = b"dotted value=1"
    assert _request(proxy, "localhost", "POST", "/api/v2/delete/../write?precision=ns", auth, dotted) == 204
    assert [s["metric"]["uid"] for s in server.wait_for_series("dotted_value", 1)] == ["m1"]
    for path in (
        "/api/v1/admin/tsdb/delete_series?match[]=dotted_value",
        "/write/../api/v1/import",
        "/api/v2/write/../../api/v1/import",
        "/api/v1/import/prometheus/metrics/job/x",
        "/insert/0/influx/api/v2/write",
    ):
        assert _request(proxy, "localhost", "POST", path, auth, b"dotted_value 5") == 404, path
    assert _request(proxy, "localhost", "GET", "/api/v2/write", auth) == 404
    assert [s["values"] for s in server.wait_for_series("dotted_value", 1)] == [[1]]


@pytest.mark.timeout(900)
def test_loki_pushes_land_in_the_nodes_own_tenant_whatever_it_sends(edge):
    proxy, _, loki = edge
    body = _push_body()
    headers = {"Content-Type": "application/json", "X-Scope-OrgID": "validator-01"}
    assert _request(proxy, LOGS_DOMAIN, "POST", "/loki/api/v1/push", headers, body) == 401
    headers["Authorization"] = _loki_login(proxy, "miner-01")
    assert _request(proxy, LOGS_DOMAIN, "POST", "/loki/api/v1/push?tenant=x", headers, body) == 204
    assert _request(proxy, LOGS_DOMAIN, "POST", "/loki/api/v1/../v1/push", headers, body) == 204
    wrong = dict(headers, Authorization=_loki_login(proxy, "miner-01") + "x")
    assert _request(proxy, LOGS_DOMAIN, "POST", "/loki/api/v1/push", wrong, body) == 401
    assert _request(proxy, LOGS_DOMAIN, "GET", "/loki/api/v1/labels", headers) == 404
    requests = loki.requests
    assert len(requests) == 2
    for request in requests:
        assert request.path == "/loki/api/v1/push"
        headers = {name.lower(): value for name, value in request.headers.items()}
        assert "authorization" not in headers and headers["x-scope-orgid"] == "m1"
    # miner-01 is uid m1: its lines are in its tenant, though it wrote uid=v1 and asked for validator-01's.
    assert {(entry.tenant, entry.labels["uid"]) for entry in loki.entries} == {("m1", "v1")}


@pytest.mark.timeout(900)
def test_a_node_that_floods_loki_is_refused_alone_and_the_others_lose_no_line(edge):
    """One node pushes many times its budget; another, interleaved, gets every push stored."""
    proxy, _, loki = edge
    budget = NODE_BUDGET.ingestion_burst_bytes
    assert budget is not None and NODE_BUDGET.ingestion_rate_bytes is not None
    line = "x" * 1000
    count = int(budget * 0.45) // len(line)  # two such pushes fit the burst, a third does not
    entries = [[str(time.time_ns() + i), line] for i in range(count)]
    flood = json.dumps({"streams": [{"stream": {"service": "f"}, "values": entries}]}).encode()
    flooder = {"Content-Type": "application/json", "Authorization": _loki_login(proxy, "miner-01")}
    quiet = {"Content-Type": "application/json", "Authorization": _loki_login(proxy, "miner-02")}
    flood_answers, quiet_answers = [], []
    started = time.monotonic()
    for i in range(10):
        flood_answers.append(_request(proxy, LOGS_DOMAIN, "POST", "/loki/api/v1/push", flooder, flood))
        values = [[str(time.time_ns() + j), f"quiet {i} {j}"] for j in range(10)]
        body = json.dumps({"streams": [{"stream": {"service": "q"}, "values": values}]}).encode()
        quiet_answers.append(_request(proxy, LOGS_DOMAIN, "POST", "/loki/api/v1/push", quiet, body))
    elapsed = time.monotonic() - started
    sent = 10 * count * len(line)
    allowed = budget + NODE_BUDGET.ingestion_rate_bytes * elapsed
    assert sent > 3 * allowed  # the flooder asked for several times what its budget allows in the time
    assert quiet_answers == [204] * 10
    assert 429 in flood_answers and flood_answers[:2] == [204, 204]
    stored = [e for e in loki.entries if e.tenant == "miner-02"]
    assert len(stored) == 100 and {e.labels["service"] for e in stored} == {"q"}
    refused = [r for r in loki.requests if r.status == 429]
    tenants = [{k.lower(): v for k, v in r.headers.items()}["x-scope-orgid"] for r in refused]
    assert tenants and set(tenants) == {"m1"}
    assert all("for user m1 " in r.message for r in refused)


@pytest.mark.timeout(900)
def test_the_access_log_names_the_node_and_holds_no_secret(edge):
    proxy, _, _ = edge
    miner, loki_login = proxy.token("miner-01"), _loki_login(proxy, "miner-01")
    line = b"audited value=1"
    assert _request(proxy, "localhost", "POST", "/api/v2/write?precision=ns", {"Authorization": "Token " + miner}, line)
    assert _request(proxy, "localhost", "POST", "/api/v2/write", {"Authorization": "Token nobody"}, line) == 401
    push_headers = {"Authorization": loki_login, "Content-Type": "application/json"}
    assert _request(proxy, LOGS_DOMAIN, "POST", "/loki/api/v1/push", push_headers, _push_body()) == 204
    proxy.stop()  # flushes and closes the log files

    metrics = _access_log(proxy, "metrics-access.log")
    # Every request is logged: the health checks of MetricsProxy.start() first, without a node.
    assert {(e["user_id"], e["request"]["uri"]) for e in metrics[:-2]} == {("-", "/health")}
    metrics = metrics[-2:]
    assert [(e["user_id"], e["status"], e["request"]["uri"]) for e in metrics] == [
        ("miner-01", 204, "/api/v2/write?precision=ns"),
        ("-", 401, "/api/v2/write"),
    ]
    for entry in metrics:
        assert {"size", "duration", "ts"} <= set(entry)
        assert entry["request"]["headers"]["Authorization"] == []  # redacted by Caddy
    [push] = _access_log(proxy, "logs-access.log")
    assert push["user_id"] == "miner-01" and push["request"]["uri"] == "/loki/api/v1/push"
    text = "".join(path.read_text() for path in Path(proxy.logs).iterdir())
    secrets_dir = proxy.dir / "secrets" / "nodes"
    for secret in [miner, loki_login.split()[1], *(p.read_text().strip() for p in secrets_dir.glob("*-password"))]:
        assert secret not in text
    # The log directory is root's alone on the host (Caddy 2.6 creates the files 0644 under umask 022).
    assert proxy.logs.stat().st_mode & 0o777 == 0o700


@pytest.mark.timeout(600)
@pytest.mark.parametrize(
    ("identities", "users"),
    [
        ({"miner-01": {"uid": "7"}, "miner-02": {"uid": "7"}}, []),  # one tenant for two nodes
        ({"miner-01": {"uid": "miner-02"}}, []),  # miner-02 has no identity: its uid is its name
        ({"miner-01": {"uid": "7"}}, [{"username": "7", "password_hash": "$2b$12$" + "x" * 53}]),
    ],
)
def test_a_uid_shared_by_two_nodes_or_by_an_operator_login_is_refused(tmp_path, identities, users):
    proxy = MetricsProxy(tmp_path, ["127.0.0.1:1"])
    with pytest.raises(AssertionError, match="needs its own uid"):
        proxy.converge(
            ["miner-01", "miner-02"],
            telemetry_node_identities=identities,
            reverse_proxy_loki_users=users,
            reverse_proxy_loki_domain=LOGS_DOMAIN,
        )


@pytest.mark.timeout(900)
@pytest.mark.parametrize(
    "identity",
    [
        {"uid": "_edge"},
        {"uid": "m1", "role": "_edge"},
        {"uid": ".."},
        {"uid": "a b"},
        {"role": "Miner"},
        {"uid": None},
        "m1",
        ["m1"],
    ],
)
def test_an_identity_of_the_stacks_own_or_out_of_the_rules_is_refused_before_anything_is_written(tmp_path, identity):
    """A leading "_" marks the stack's own names (the _edge Loki tenant of the access logs); a uid names a tenant;
    an identity is {uid, role}, never a bare value or an empty uid (which would be stored as "None")."""
    proxy = MetricsProxy(tmp_path, ["127.0.0.1:9"])
    with pytest.raises(AssertionError, match=r"miner-01(('s identity)| would be stored as uid ).*neither may start"):
        proxy.converge(NODES, telemetry_node_identities={"miner-01": identity})
    assert not proxy.caddyfile.exists()
