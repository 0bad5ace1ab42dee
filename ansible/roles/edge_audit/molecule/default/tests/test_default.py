"""Checks what the edge_audit role renders in render-only mode."""

import os
import re
import subprocess
from pathlib import Path

import yaml

ROOT = os.environ["TELEMETRY_ROOT"]
REPO = Path(os.environ["MOLECULE_PROJECT_DIRECTORY"]).resolve().parents[2]
DIR = ROOT + "/opt/telemetry/edge_audit"
LOGS = ROOT + "/opt/telemetry/reverse_proxy/logs"


def _pinned(key):
    for line in (REPO / "versions.env").read_text().splitlines():
        if line.startswith(key + "="):
            return line.split("=", 1)[1].strip()
    raise AssertionError(f"{key} is not pinned in versions.env")


def _config(host):
    return host.file(DIR + "/conf/config.alloy").content_string


def _block(text, header):
    """The body of the top-level block that starts with `header` (up to its closing brace at column 0)."""
    match = re.search(rf"(?ms)^{re.escape(header)} \{{\n(.*?)^\}}$", text)
    assert match, f"no block {header}"
    return match.group(1)


def test_private_files(host):
    config = host.file(DIR + "/conf/config.alloy")
    assert config.is_file and config.mode == 0o600 and config.user == "root"
    for path in ("", "/conf", "/data"):
        directory = host.file(DIR + path)
        assert directory.is_directory and directory.mode == 0o700, path


def test_reads_each_site_s_access_log_with_its_labels(host):
    source = _block(_config(host), 'loki.source.file "edge_access"')
    targets = re.findall(r'\{"__path__" = "([^"]+)", "job" = "([^"]+)", "site" = "([^"]+)"\}', source)
    assert targets == [
        ("/var/log/caddy/logs-access.log", "edge-access", "logs"),
        ("/var/log/caddy/metrics-access.log", "edge-access", "metrics"),
    ]
    assert re.search(r"file_match \{\s+enabled\s+= true", source)
    assert "forward_to = [loki.process.edge_access.receiver]" in source


def test_parses_time_and_status_class_and_drops_the_file_name(host):
    process = _block(_config(host), 'loki.process "edge_access"')
    assert re.search(r'ts\s+= "ts"', process) and re.search(r'status\s+= "status"', process)
    assert re.search(r'stage\.timestamp \{\s+source = "ts"\s+format = "Unix"', process)
    assert 'template = "{{ with .status }}{{ trunc 1 . }}xx{{ end }}"' in process
    assert re.search(r'values = \{\s+status_class = "",', process)
    assert 'values = ["filename"]' in process
    assert "forward_to = [loki.write.edge_audit.receiver]" in process


def test_pushes_into_the_edge_tenant_of_the_first_loki_host_directly(host):
    write = _block(_config(host), 'loki.write "edge_audit"')
    assert re.search(r'url\s+= "http://10\.0\.0\.21:3100/loki/api/v1/push"', write)
    assert re.search(r'tenant_id = "_edge"', write)
    # No credential: Loki has none, and the edge is not on the way.
    assert not re.search(r"basic_auth|bearer_token|authorization|password", write)


def test_container_reads_the_logs_read_only_and_keeps_its_positions(host):
    compose = yaml.safe_load(host.file(DIR + "/container.compose.yml").content_string)
    service = compose["services"]["alloy"]
    assert service["image"] == _pinned("ALLOY_IMAGE")
    assert service["command"] == [
        "run",
        "--storage.path=/var/lib/alloy/data",
        "--server.http.listen-addr=0.0.0.0:12345",
        "--disable-reporting",
        "/etc/alloy/config.alloy",
    ]
    mounts = {m["target"]: m for m in service["volumes"]}
    assert mounts["/var/log/caddy"]["source"] == LOGS and mounts["/var/log/caddy"]["read_only"] is True
    assert mounts["/etc/alloy"]["source"] == DIR + "/conf" and mounts["/etc/alloy"]["read_only"] is True
    assert mounts["/var/lib/alloy/data"]["source"] == DIR + "/data"
    assert mounts["/var/lib/alloy/data"]["read_only"] is False
    assert service["ports"] == ["127.0.0.1:12345:12345"]
    assert service["cap_drop"] == ["ALL"] and service["security_opt"] == ["no-new-privileges:true"]
    assert service["cap_add"] == ["DAC_READ_SEARCH"]  # reads Caddy's user's log files
    result = subprocess.run(
        ["docker-compose", "-f", DIR + "/container.compose.yml", "config", "--quiet"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
