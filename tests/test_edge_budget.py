"""Each node has its own write budget at the edge: one node at ten times it slows only itself.

Debian's Caddy (2.6) serves the Caddyfile the reverse_proxy role renders for
metrics_backend victoriametrics, on loopback; behind it the edge vmauth runs
with the auth config and flags the role renders (vmauth from VMAUTH_BINARY or
PATH, v1.88.0 or later: Debian's 1.79.5 has no per-user limit, so the tests
skip without one), in front of Debian's victoria-metrics (1.79.5).

The harm the budget prevents is real on that VictoriaMetrics: its InfluxDB
handler holds one of -maxConcurrentInserts places while it reads a request's
body (app/vminsert/influx/request_handler.go, writeconcurrencylimiter.Do around
the stream parser, lib/writeconcurrencylimiter/concurrencylimiter.go, tag
v1.79.5), and a write that finds none free for -insert.maxQueueDuration gets
503. The flooding node sends slow bodies: the first 40 KiB at once (more than
vmauth's 32 KiB -requestBufferSize, so vmauth forwards it: app/vmauth/main.go,
bufferRequestBody, tag v1.136.0) and then a line every half second, until the
quiet node's writes are done. Without the
budget its writes take every place and the quiet node's write gets 503 (the
control); with it, the flooding node holds its budget's worth, gets 429 for the
rest, and the quiet node's writes all get 204 and are all stored.
"""

from __future__ import annotations

import base64
import re
import select
import socket
import ssl
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml
from servers import victoria_metrics, vmauth_binary
from test_victoriametrics_deploy import METRICS_DOMAIN, MetricsProxy

pytestmark = pytest.mark.slow  # runs Caddy, vmauth, VictoriaMetrics and ansible-playbook

REPO = Path(__file__).resolve().parents[1]
DEFAULTS = yaml.safe_load((REPO / "ansible/roles/reverse_proxy/defaults/main.yml").read_text())
BUDGET = DEFAULTS["reverse_proxy_node_write_concurrency"]
NODES = ["flood-01", "quiet-01"]
IDENTITIES = {"flood-01": {"uid": "f1", "role": "miner"}, "quiet-01": {"uid": "q1", "role": "validator"}}
# VictoriaMetrics' insert places, fixed here (its default is 4 per core, 1.79.5) so that
# the flood (ten times the budget) holds more than all of them, and a short queue so that
# the control's 503 comes in seconds rather than the default minute.
INSERT_PLACES = 2 * BUDGET
VM_FLAGS = (f"-maxConcurrentInserts={INSERT_PLACES}", "-insert.maxQueueDuration=3s")
QUIET_BATCHES, QUIET_LINES = 5, 50
PREFIX = 40 * 1024  # above vmauth's -requestBufferSize (32 KiB)


def _tls(proxy: MetricsProxy) -> ssl.SSLSocket:
    context = ssl.create_default_context(cafile=str(proxy.cert))
    raw = socket.create_connection(("127.0.0.1", proxy.https_port), timeout=120)
    return context.wrap_socket(raw, server_hostname=METRICS_DOMAIN)


def _early_answer(sock: ssl.SSLSocket) -> bytes | None:
    """What has come of an answer so far, None for nothing yet.

    The socket can be readable with no answer in it: TLS 1.3 sends its session
    tickets after the handshake, which the TLS layer takes in and returns nothing for.
    """
    if not (sock.pending() or select.select([sock], [], [], 0.5)[0]):
        return None
    sock.setblocking(False)
    try:
        return sock.recv(4096)
    except ssl.SSLWantReadError:
        return None
    finally:
        sock.settimeout(120)


def _status(sock: ssl.SSLSocket, data: bytes = b"") -> int:
    """The status of the answer on `sock` that begins with `data` (the rest of it is not needed)."""
    while b"\r\n" not in data:
        chunk = sock.recv(4096)
        if not chunk:
            return 0
        data += chunk
    return int(data.split(b" ", 2)[1])


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def _slow_write(proxy: MetricsProxy, token: str, stop: threading.Event) -> int:
    """One write whose body trickles (chunked) until `stop` is set: its status (0: closed without one)."""
    prefix = b"".join(b"flood,n=%d value=1\n" % (i % 100) for i in range(PREFIX // 18 + 1))[:PREFIX]
    prefix = prefix[: prefix.rindex(b"\n") + 1]
    head = (
        f"POST /api/v2/write?precision=ns HTTP/1.1\r\nHost: {METRICS_DOMAIN}\r\nAuthorization: Token {token}\r\n"
        "Content-Type: text/plain\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
    ).encode()
    try:
        sock = _tls(proxy)
    except OSError:
        return 0
    with sock:
        try:
            sock.sendall(head + _chunk(prefix))
            while not stop.is_set():
                # An answer before the body is complete (429): take it.
                early = _early_answer(sock)
                if early is not None:
                    return _status(sock, early) if early else 0
                sock.sendall(_chunk(b"flood_slow value=1\n"))
            sock.sendall(b"0\r\n\r\n")
            return _status(sock)
        except OSError:
            return 0


def _flood(proxy: MetricsProxy, token: str) -> tuple[list[int], threading.Event, list[threading.Thread]]:
    """Ten times the budget of slow writes, each sent again as soon as it is answered, until the event is set."""
    statuses: list[int] = []
    stop = threading.Event()

    def writer() -> None:
        while not stop.is_set():
            statuses.append(_slow_write(proxy, token, stop))

    threads = [threading.Thread(target=writer, daemon=True) for _ in range(10 * BUDGET)]
    for thread in threads:
        thread.start()
    return statuses, stop, threads


def _end(stop: threading.Event, threads: list[threading.Thread]) -> None:
    stop.set()
    for thread in threads:
        thread.join(timeout=300)
    assert not any(thread.is_alive() for thread in threads), "a flooding write never ended"


def _quiet_write(proxy: MetricsProxy, token: str, batch: int) -> int:
    """One batch of QUIET_LINES points, a millisecond apart (VictoriaMetrics keeps one sample per millisecond)."""
    start = time.time_ns() // 10**6 * 10**6
    lines = "\n".join(f"quiet,batch={batch} value={i} {start + i * 10**6}" for i in range(QUIET_LINES))
    status, _ = proxy.request("POST", "/api/v2/write?precision=ns", {"Authorization": "Token " + token}, lines.encode())
    return status


def _metric(url: str, name: str, labels: str = "") -> float:
    with urllib.request.urlopen(url, timeout=30) as response:
        text = response.read().decode()
    found = re.search(rf"(?m)^{re.escape(name + labels)} ([0-9.e+]+)$", text)
    return float(found.group(1)) if found else 0.0


def _wait(condition, what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.2)


def _stored(server, match: str, expected: int, timeout: float = 60) -> list[dict]:
    """The series of `match` once they hold `expected` samples (or the deadline passed): a sample
    VictoriaMetrics has acknowledged can take a moment to become searchable."""
    deadline = time.monotonic() + timeout
    while True:
        server.flush()
        series = server.export(match)
        if sum(len(s["values"]) for s in series) >= expected or time.monotonic() > deadline:
            return series
        time.sleep(0.5)


@pytest.fixture
def vmauth():
    return vmauth_binary()


@pytest.mark.timeout(900)
def test_a_node_at_ten_times_its_budget_slows_only_itself(tmp_path, vmauth):
    with victoria_metrics(*VM_FLAGS) as server:
        proxy = MetricsProxy(tmp_path, [server.url.removeprefix("http://")], vmauth=vmauth)
        proxy.converge(NODES, telemetry_node_identities=IDENTITIES, reverse_proxy_vmauth_max_queue_duration="3s")
        proxy.start()
        try:
            flood, quiet = proxy.token("flood-01"), proxy.token("quiet-01")
            statuses, stop, threads = _flood(proxy, flood)
            metrics = f"http://127.0.0.1:{proxy.vmauth_port}/metrics?authKey={proxy.vmauth_key('metricsAuthKey')}"
            # The flood holds its whole budget at vmauth, and those writes hold VictoriaMetrics' places.
            _wait(
                lambda: _metric(metrics, "vmauth_user_concurrent_requests_current", '{username="flood-01"}') >= BUDGET,
                "the flood never filled its budget",
            )
            _wait(lambda: _metric(f"{server.url}/metrics", "vm_concurrent_insert_current") >= BUDGET, "no slow insert")
            # The writes beyond the budget have waited their -maxQueueDuration and been refused.
            _wait(
                lambda: (
                    _metric(metrics, "vmauth_user_concurrent_requests_limit_reached_total", '{username="flood-01"}')
                    >= 10 * BUDGET - BUDGET
                ),
                "vmauth never refused the writes beyond the budget",
            )
            answers = [_quiet_write(proxy, quiet, batch) for batch in range(QUIET_BATCHES)]
            _end(stop, threads)
            assert answers == [204] * QUIET_BATCHES
            # The flooding node: its budget's worth goes through, the rest is told to come back.
            assert set(statuses) <= {204, 429}, statuses
            assert 429 in statuses and 204 in statuses, statuses
            assert _metric(metrics, "vmauth_user_concurrent_requests_capacity", '{username="flood-01"}') == BUDGET
            stored = _stored(server, 'quiet_value{uid="q1"}', QUIET_BATCHES * QUIET_LINES)
            assert sorted(len(s["values"]) for s in stored) == [QUIET_LINES] * QUIET_BATCHES
            assert {(s["metric"]["uid"], s["metric"]["role"]) for s in stored} == {("q1", "validator")}
        finally:
            proxy.stop()


@pytest.mark.timeout(900)
def test_without_the_budget_one_flooding_node_makes_another_lose_a_write(tmp_path):
    """The control: the same flood with reverse_proxy_node_write_concurrency 0 (Caddy writes to VictoriaMetrics)."""
    with victoria_metrics(*VM_FLAGS) as server:
        proxy = MetricsProxy(tmp_path, [server.url.removeprefix("http://")])
        proxy.converge(NODES, telemetry_node_identities=IDENTITIES)
        assert "vmauth" not in (proxy.dir / "container.compose.yml").read_text()
        proxy.start()
        try:
            _, stop, threads = _flood(proxy, proxy.token("flood-01"))
            _wait(
                lambda: _metric(f"{server.url}/metrics", "vm_concurrent_insert_current") >= INSERT_PLACES,
                "the flood never took every insert place",
            )
            answer = _quiet_write(proxy, proxy.token("quiet-01"), 0)
            _end(stop, threads)
            assert answer == 503  # VictoriaMetrics: no insert place within -insert.maxQueueDuration
        finally:
            proxy.stop()


@pytest.mark.timeout(900)
def test_the_edge_vmauth_knows_nodes_only_by_the_edge_credential_and_guards_its_endpoints(tmp_path, vmauth):
    with victoria_metrics() as server:
        proxy = MetricsProxy(tmp_path, [server.url.removeprefix("http://")], vmauth=vmauth)
        proxy.converge(NODES, telemetry_node_identities=IDENTITIES)
        proxy.start()
        try:
            token = proxy.token("flood-01")
            # Through Caddy: stored under the node's identity, whatever it wrote.
            forged = b"forged,uid=q1,role=validator value=1"
            query = "?precision=ns&extra_label=uid=q1&extra_label=role=validator"
            status, _ = proxy.request("POST", "/api/v2/write" + query, {"Authorization": "Token " + token}, forged)
            assert status == 204
            [series] = server.wait_for_series("forged_value", 1)
            assert (series["metric"]["uid"], series["metric"]["role"]) == ("f1", "miner")
            # The node's own token means nothing to vmauth (Caddy sends one of the edge's own).
            vmauth_url = f"http://127.0.0.1:{proxy.vmauth_port}"
            for authorization in ("Token " + token, "Bearer " + token, "Basic " + token):
                request = urllib.request.Request(
                    vmauth_url + "/api/v2/write", data=b"direct value=1", headers={"Authorization": authorization}
                )
                with pytest.raises(urllib.error.HTTPError) as refused:
                    urllib.request.urlopen(request, timeout=30)
                assert refused.value.code == 401, authorization
            assert server.export("direct_value") == []
            # vmauth's own endpoints answer only with their keys.
            for path, flag in (
                ("/metrics", "metricsAuthKey"),
                ("/flags", "flagsAuthKey"),
                ("/debug/pprof/cmdline", "pprofAuthKey"),
                ("/-/reload", "reloadAuthKey"),
            ):
                with pytest.raises(urllib.error.HTTPError) as refused:
                    urllib.request.urlopen(f"{vmauth_url}{path}?authKey=wrong", timeout=30)
                assert refused.value.code == 401, path
                with urllib.request.urlopen(f"{vmauth_url}{path}?authKey={proxy.vmauth_key(flag)}", timeout=30) as ok:
                    assert ok.status == 200, path
            # What holds the edge credentials is 0600, and none is a node's own token.
            config = proxy.dir / "vmauth" / "auth.yml"
            assert config.stat().st_mode & 0o777 == 0o600
            assert (proxy.dir / "secrets" / "vmauth-node-key").stat().st_mode & 0o777 == 0o600
            users = yaml.safe_load(config.read_text())["users"]
            assert [user["name"] for user in users] == sorted(NODES)
            assert {user["max_concurrent_requests"] for user in users} == {BUDGET}
            node_secrets = {base64.b64decode(proxy.token(node)).decode().split(":", 1)[1] for node in NODES}
            assert not {user["bearer_token"] for user in users} & (node_secrets | {proxy.token(n) for n in NODES})
        finally:
            proxy.stop()


@pytest.mark.timeout(900)
def test_the_edge_vmauth_spreads_a_clusters_writes_and_its_limit_covers_every_budget(tmp_path):
    """Rendered only: vmauth lists every vminsert, and its global limit is above every node's budget together."""
    upstreams = ["10.0.0.21:8480", "10.0.0.22:8480"]
    nodes = [f"miner-{i:03d}" for i in range(12)]
    proxy = MetricsProxy(tmp_path, upstreams, mode="cluster")
    proxy.converge(nodes, reverse_proxy_node_write_concurrency=BUDGET)
    [user, *_] = yaml.safe_load((proxy.dir / "vmauth" / "auth.yml").read_text())["users"]
    [route] = user["url_map"]
    assert route["src_paths"] == ["/insert/0/influx/api/v2/write", "/insert/0/influx/write"]
    assert [prefix.split("/?")[0] for prefix in route["url_prefix"]] == [f"http://{u}" for u in upstreams]
    compose = yaml.safe_load((proxy.dir / "container.compose.yml").read_text())["services"]
    vmauth = compose["vmauth-edge"]
    assert "ports" not in vmauth  # reached on the stack's network only
    assert vmauth["user"] == "10007:10007" and vmauth["cap_drop"] == ["ALL"] and vmauth["read_only"] is True
    flags = dict(arg.lstrip("-").split("=", 1) for arg in vmauth["command"])
    assert int(flags["maxConcurrentRequests"]) > len(nodes) * BUDGET
    assert {name for name in flags if name.endswith("AuthKey")} == {
        "metricsAuthKey",
        "flagsAuthKey",
        "pprofAuthKey",
        "reloadAuthKey",
    }
    site = proxy.caddyfile.read_text()
    assert "reverse_proxy vmauth-edge:8427 {" in site
    assert 'header_up Authorization "Bearer {telemetry.node.vmauth}"' in site
    with pytest.raises(AssertionError, match="reverse_proxy_vmauth_max_concurrent_requests"):
        proxy.converge(
            nodes, reverse_proxy_node_write_concurrency=BUDGET, reverse_proxy_vmauth_max_concurrent_requests=10
        )
