"""Throwaway real servers on loopback for the tests: InfluxDB 1.6.7 and VictoriaMetrics.

Each server runs from a temporary directory on free ports and is stopped at the end.
When a binary is missing the caller skips, except under CI=true where it fails:
a skipped test must never stand in for one that could have run.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest


def free_port() -> int:
    """Ask the kernel for a free loopback port."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def require_binary(name: str) -> str:
    """Path of `name`; skip without it, or fail when CI=true."""
    path = shutil.which(name)
    if path:
        return path
    message = f"{name} is not installed (Debian package: see .ci/run)"
    if os.environ.get("CI") == "true":
        pytest.fail(f"{message}; CI must run this test")
    pytest.skip(message)
    raise AssertionError("unreachable")


# Per-user max_concurrent_requests, the nodes' write budget at the edge, came with
# vmauth v1.88.0 (VictoriaMetrics docs/CHANGELOG.md); the stack pins v1.136.0
# (versions.env, VMAUTH_IMAGE).
VMAUTH_MIN_VERSION = (1, 88, 0)


def vmauth_binary() -> str:
    """vmauth from $VMAUTH_BINARY or PATH, v1.88.0 or later; skip otherwise (also under CI).

    Debian's victoria-metrics package ships vmauth 1.79.5, which has no per-user
    concurrency limit and refuses a config that sets one; no Debian package has a
    newer one, so a machine without its own vmauth skips rather than fails.
    """
    import re

    wanted = "v" + ".".join(map(str, VMAUTH_MIN_VERSION))
    path = os.environ.get("VMAUTH_BINARY") or shutil.which("vmauth")
    if not path or not os.access(path, os.X_OK):
        pytest.skip(f"needs vmauth {wanted} or later (VMAUTH_BINARY or PATH), for per-user max_concurrent_requests")
    result = subprocess.run([path, "-version"], capture_output=True, text=True, timeout=30, check=False)
    found = re.search(r"v(\d+)\.(\d+)\.(\d+)", result.stdout + result.stderr)
    version = tuple(int(part) for part in found.groups()) if found else None
    if version is None or version < VMAUTH_MIN_VERSION:
        pytest.skip(
            f"{path} is vmauth {'.'.join(map(str, version)) if version else 'of unknown version (Debian 1.79.5?)'}: "
            f"needs {wanted} or later for per-user max_concurrent_requests; set VMAUTH_BINARY"
        )
    return path


def bind_caddy_to_loopback(caddyfile: Path) -> None:
    """Add `default_bind 127.0.0.1` to a Caddyfile's global options.

    Caddy listens on every interface for a site without a bind address; a test's
    Caddy listens on loopback only (the file must start its global options with
    `admin`, as the reverse_proxy role renders them).
    """
    text = caddyfile.read_text()
    assert text.count("\n{\n\tadmin ") == 1, text[:400]
    caddyfile.write_text(text.replace("\n{\n\tadmin ", "\n{\n\tdefault_bind 127.0.0.1\n\tadmin ", 1))


def listening_addresses(pid: int) -> set[str]:
    """The IP addresses process `pid` listens on (TCP)."""
    import psutil

    process = psutil.Process(pid)
    connections = getattr(process, "net_connections", process.connections)(kind="tcp")  # psutil < 6: connections
    return {c.laddr.ip for c in connections if c.status == psutil.CONN_LISTEN}


def _wait_until_up(url: str, process: subprocess.Popen, log: Path, deadline_s: float = 30) -> None:
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"server exited with {process.returncode}: {log.read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(url, timeout=1) as response:
                if response.status < 300:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            time.sleep(0.1)
    raise RuntimeError(f"server not up at {url} after {deadline_s}s: {log.read_text()[-2000:]}")


@contextmanager
def _running(argv: list[str], ready_url: str, workdir: Path) -> Iterator[None]:
    log = workdir / "server.log"
    with log.open("wb") as out:
        process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, cwd=workdir)
    try:
        _wait_until_up(ready_url, process, log)
        yield
    finally:
        stop(process)


def stop(process: subprocess.Popen) -> None:
    """SIGTERM, and SIGKILL if the process is still there 10 s later."""
    process.terminate()
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


@dataclass
class InfluxV1:
    """A running InfluxDB 1.x server."""

    url: str

    def query(self, q: str, database: str | None = None, epoch: str = "ns") -> dict:
        """Run InfluxQL through /query and return the decoded JSON."""
        import json

        params = {"q": q, "epoch": epoch}
        if database:
            params["db"] = database
        data = urllib.parse.urlencode(params).encode()
        with urllib.request.urlopen(f"{self.url}/query", data=data, timeout=30) as response:
            return json.loads(response.read())

    def create_database(self, name: str) -> None:
        result = self.query(f'CREATE DATABASE "{name}"')
        assert "error" not in result["results"][0], result

    def rows(self, q: str, database: str) -> list[dict]:
        """Rows of the first statement as dicts (column name to value), all series together."""
        result = self.query(q, database)["results"][0]
        if "error" in result:
            raise RuntimeError(result["error"])
        rows = []
        for series in result.get("series", []):
            for values in series["values"]:
                row = dict(zip(series["columns"], values, strict=True))
                row.update(series.get("tags", {}))
                rows.append(row)
        return rows


def _influx_config(root: Path, http_port: int, rpc_port: int, auth_enabled: bool = False) -> Path:
    """An influxd configuration keeping everything under `root`, serving on loopback."""
    config = root / "influxdb.conf"
    config.write_text(
        f"""reporting-disabled = true
bind-address = "127.0.0.1:{rpc_port}"
[meta]
  dir = "{root}/meta"
[data]
  dir = "{root}/data"
  wal-dir = "{root}/wal"
  query-log-enabled = false
[monitor]
  store-enabled = false
[http]
  bind-address = "127.0.0.1:{http_port}"
  log-enabled = false
  max-body-size = 0
  auth-enabled = {str(auth_enabled).lower()}
[continuous_queries]
  enabled = false
"""
    )
    return config


@contextmanager
def influxdb_v1(auth_enabled: bool = False) -> Iterator[InfluxV1]:
    """Start influxd (Debian's InfluxDB 1.6.7) on free loopback ports.

    With `auth_enabled`, the server checks credentials; the first user must be
    created as an admin (`CREATE USER ... WITH ALL PRIVILEGES`) without credentials.
    """
    binary = require_binary("influxd")
    with tempfile.TemporaryDirectory(prefix="influxd-") as tmp:
        root = Path(tmp)
        http_port, rpc_port = free_port(), free_port()
        config = _influx_config(root, http_port, rpc_port, auth_enabled)
        url = f"http://127.0.0.1:{http_port}"
        with _running([binary, "-config", str(config)], f"{url}/ping", root):
            yield InfluxV1(url)


class OutageInfluxV1(InfluxV1):
    """An InfluxDB 1.6.7 of a test's own whose outages the test causes: killed and restarted, or paused.

    `kill()` is SIGKILL (the port then refuses connections); `start()` brings it back
    on the same port and data, and returns once it answers. `pause()` is SIGSTOP:
    the kernel still accepts connections, nobody answers them; `resume()` is SIGCONT.
    """

    def __init__(self, binary: str, root: Path) -> None:
        self._binary = binary
        self._root = root
        http_port = free_port()
        self._config = _influx_config(root, http_port, free_port())
        self._process: subprocess.Popen | None = None
        super().__init__(f"http://127.0.0.1:{http_port}")

    def start(self) -> None:
        log = self._root / "server.log"
        with log.open("ab") as out:
            self._process = subprocess.Popen(
                [self._binary, "-config", str(self._config)], stdout=out, stderr=subprocess.STDOUT, cwd=self._root
            )
        _wait_until_up(f"{self.url}/ping", self._process, log, deadline_s=60)

    def kill(self) -> None:
        assert self._process is not None
        self._process.kill()
        self._process.wait()

    def pause(self) -> None:
        assert self._process is not None
        self._process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self._process is not None
        self._process.send_signal(signal.SIGCONT)

    def stop(self) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.send_signal(signal.SIGCONT)
            self._process.terminate()
            try:
                self._process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()


@contextmanager
def influxdb_v1_for_outages() -> Iterator[OutageInfluxV1]:
    """A fresh influxd a test may kill, restart, pause and resume (see `OutageInfluxV1`)."""
    binary = require_binary("influxd")
    with tempfile.TemporaryDirectory(prefix="influxd-outage-") as tmp:
        server = OutageInfluxV1(binary, Path(tmp))
        server.start()
        try:
            yield server
        finally:
            server.stop()


@dataclass
class VictoriaMetrics:
    """A running VictoriaMetrics server (accepts InfluxDB's /api/v2/write)."""

    url: str
    # The server's -forceFlushAuthKey, when it was started with one: flush() sends it.
    force_flush_key: str = ""

    def export(self, match: str) -> list[dict]:
        """Series matching `match`, as exported by /api/v1/export (JSON lines)."""
        import json

        query = urllib.parse.urlencode({"match[]": match})
        with urllib.request.urlopen(f"{self.url}/api/v1/export?{query}", timeout=30) as response:
            return [json.loads(line) for line in response.read().splitlines() if line.strip()]

    def wait_for_series(self, match: str, count: int, timeout: float = 60.0) -> list[dict]:
        """Poll the export until `count` series match (new series take a moment to become searchable)."""
        deadline = time.monotonic() + timeout
        while True:
            self.flush()
            series = self.export(match)
            if len(series) >= count or time.monotonic() > deadline:
                return series
            time.sleep(0.2)

    def flush(self) -> None:
        """Make just-written samples searchable (VictoriaMetrics buffers them for ~1 s)."""
        data = urllib.parse.urlencode({"authKey": self.force_flush_key}).encode() if self.force_flush_key else None
        with urllib.request.urlopen(f"{self.url}/internal/force_flush", data=data, timeout=30):
            pass


@contextmanager
def victoria_metrics(*flags: str) -> Iterator[VictoriaMetrics]:
    """Start Debian's victoria-metrics on a free loopback port, with further command-line `flags`."""
    binary = require_binary("victoria-metrics")
    with tempfile.TemporaryDirectory(prefix="victoria-") as tmp:
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        argv = [
            binary,
            f"-storageDataPath={tmp}/data",
            f"-httpListenAddr=127.0.0.1:{port}",
            "-search.latencyOffset=0s",
            *flags,
        ]
        keys = [flag.split("=", 1)[1] for flag in flags if flag.startswith("-forceFlushAuthKey=")]
        with _running(argv, f"{url}/health", Path(tmp)):
            yield VictoriaMetrics(url, force_flush_key=(keys or [""])[-1])
