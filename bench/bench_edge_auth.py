"""CPU and wall time of the edge's node check: today's credential map against the former bcrypt basic auth.

Both schemes run on the real Caddy here (Debian's 2.6), on loopback HTTP (no TLS, so that
only the check is measured), in front of a Caddy site that answers 204. Each is rendered
the way the reverse_proxy role renders it for VictoriaMetrics writes:

- map: the node's exact `Authorization: Token <token>` looked up in a `map`, a stranger
  refused with 401 (templates/node_credentials.Caddyfile.j2);
- bcrypt: `Token` rewritten to `Basic`, then `basicauth` with one bcrypt hash (cost 12)
  per node (the scheme before; every node has the same password and hash here, which
  changes nothing in what a request costs). Needs the `bcrypt` package.

For 10, 1,000 and 2,000 credentials it measures a valid write (the first after a start,
then cached), a known node with a wrong password, and an unknown node: Caddy's CPU per
request (utime+stime of its process from /proc) and the client's wall time. Bounded
loops, one request at a time.

    python bench/bench_edge_auth.py [--sizes 10,1000,2000]
"""

from __future__ import annotations

import argparse
import base64
import http.client
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import _common  # noqa: F401  (puts tests/ on sys.path)
import bcrypt
from servers import free_port  # bench/_common puts tests/ on the path

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def _token(name: str, password: str) -> str:
    return base64.b64encode(f"{name}:{password}".encode()).decode()


def _caddyfile(scheme: str, nodes: dict[str, str], port: int, upstream: int, admin: int, bcrypt_hash: str) -> str:
    if scheme == "map":
        entries = "".join(f'\t\t"Token {_token(n, p)}" {n} {n} miner yes\n' for n, p in nodes.items())
        check = (
            "\tmap {http.request.header.Authorization} {http.auth.user.id} {telemetry.node.uid} "
            "{telemetry.node.role} {telemetry.node.known} {\n" + entries + "\t\tdefault - - - no\n\t}\n"
            "\t@stranger vars {telemetry.node.known} no\n"
            "\troute {\n\t\trespond @stranger 401\n"
        )
    else:
        users = "".join(f"\t\t\t{n} {bcrypt_hash}\n" for n in nodes)
        check = (
            '\troute {\n\t\trequest_header Authorization "^Token (.+)$" "Basic $1"\n'
            "\t\tbasicauth {\n" + users + "\t\t}\n"
        )
    return (
        f"{{\n\tadmin 127.0.0.1:{admin}\n\tauto_https off\n}}\n"
        f"http://127.0.0.1:{port} {{\n{check}\t\treverse_proxy 127.0.0.1:{upstream}\n\t}}\n}}\n"
        f"http://127.0.0.1:{upstream} {{\n\trespond 204\n}}\n"
    )


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


class Edge:
    """One Caddy serving one scheme; requests over one kept-alive connection."""

    def __init__(self, caddy: str, tmp: Path, scheme: str, nodes: dict[str, str], bcrypt_hash: str) -> None:
        self.port = free_port()
        config = tmp / f"{scheme}-{len(nodes)}.Caddyfile"
        config.write_text(_caddyfile(scheme, nodes, self.port, free_port(), free_port(), bcrypt_hash))
        env = dict(os.environ, HOME=str(tmp), XDG_DATA_HOME=str(tmp / "d"), XDG_CONFIG_HOME=str(tmp / "c"))
        self.log = (tmp / f"{scheme}-{len(nodes)}.log").open("w")
        self.process = subprocess.Popen(
            [caddy, "run", "--adapter", "caddyfile", "--config", str(config)],
            env=env,
            stdout=self.log,
            stderr=self.log,
        )
        deadline = time.monotonic() + 60
        while True:
            try:
                self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
                self.post(None)
                break
            except OSError:
                if time.monotonic() > deadline or self.process.poll() is not None:
                    raise
                time.sleep(0.2)

    def post(self, authorization: str | None) -> int:
        headers = {"Authorization": authorization} if authorization else {}
        self.conn.request("POST", "/api/v2/write", body=b"m value=1", headers=headers)
        response = self.conn.getresponse()
        response.read()
        return response.status

    def measure(self, authorization: str | None, count: int, expected: int) -> tuple[float, float]:
        """Caddy's CPU and the client's wall time per request, in ms, over `count` requests."""
        cpu, wall = _cpu_seconds(self.process.pid), time.perf_counter()
        for _ in range(count):
            status = self.post(authorization)
            assert status == expected, (status, expected)
        return (
            (_cpu_seconds(self.process.pid) - cpu) * 1000 / count,
            (time.perf_counter() - wall) * 1000 / count,
        )

    def stop(self) -> None:
        self.conn.close()
        self.process.terminate()
        self.process.wait(timeout=60)
        self.log.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--sizes", default="10,1000,2000", help="numbers of credentials, comma-separated")
    parser.add_argument("--cheap", type=int, default=400, help="requests per cheap case (map; bcrypt cached)")
    parser.add_argument("--costly", type=int, default=4, help="requests per bcrypt comparison case")
    args = parser.parse_args()
    caddy = shutil.which("caddy")
    if caddy is None:
        sys.exit("caddy is not installed (Debian package caddy)")
    # Every node has the same password here, so that one bcrypt hash (cost 12, as the role made them) serves
    # all users; each node's token still differs by its name.
    password = secrets.token_urlsafe(30)
    bcrypt_hash = bcrypt.hashpw(password.encode(), bcrypt.gensalt(12)).decode()
    version = subprocess.run([caddy, "version"], capture_output=True, text=True).stdout.split()[0]
    print(f"Caddy {version}, loopback HTTP")
    print(f"{'scheme':<7}{'nodes':>6}  {'case':<26}{'CPU ms/req':>11}{'wall ms/req':>12}")
    with tempfile.TemporaryDirectory(prefix="bench-edge-") as tmp:
        for size in (int(s) for s in args.sizes.split(",")):
            nodes = {f"node-{n:04d}": password for n in range(size)}
            last = list(nodes)[-1]  # the map compares entries in turn: the last one is its worst case
            valid = "Token " + _token(last, nodes[last])
            cases = {
                "wrong password": "Token " + _token(last, "x" * 40),
                "unknown node": "Token " + _token("stranger", "x" * 40),
                "no credential": None,
            }
            for scheme in ("map", "bcrypt"):
                edge = Edge(caddy, Path(tmp), scheme, nodes, bcrypt_hash)
                try:
                    rows = [("valid, first after start", edge.measure(valid, 1, 204))]
                    rows.append(("valid, next ones", edge.measure(valid, args.cheap, 204)))
                    for case, authorization in cases.items():
                        count = args.costly if scheme == "bcrypt" and authorization else args.cheap
                        rows.append((case, edge.measure(authorization, count, 401)))
                finally:
                    edge.stop()
                for case, (cpu, wall) in rows:
                    print(f"{scheme:<7}{size:>6}  {case:<26}{cpu:>11.3f}{wall:>12.3f}")


if __name__ == "__main__":
    main()
