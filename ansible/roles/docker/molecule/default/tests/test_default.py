"""Checks the files the docker role renders in render-only mode."""

import json
import os

import pytest

ROOT = os.environ["TELEMETRY_ROOT"]


def _path(path):
    return ROOT + path


def test_apt_source_is_signed_by_the_keyring(host):
    source = host.file(_path("/etc/apt/sources.list.d/docker.sources"))
    assert source.is_file
    assert source.mode == 0o644
    fields = dict(line.split(": ", 1) for line in source.content_string.splitlines() if ": " in line)
    distribution = host.system_info.distribution.lower()
    assert fields["Types"] == "deb"
    assert fields["URIs"] == f"https://download.docker.com/linux/{distribution}"
    assert fields["Suites"] == host.system_info.codename
    assert fields["Components"] == "stable"
    assert fields["Signed-By"] == "/etc/apt/keyrings/docker.asc"
    assert fields["Architectures"] in {"amd64", "arm64", "armhf"}


def test_daemon_json_rotates_logs(host):
    daemon = host.file(_path("/etc/docker/daemon.json"))
    assert daemon.is_file
    assert daemon.mode == 0o644
    config = json.loads(daemon.content_string)
    assert config["log-driver"] == "local"
    assert config["log-opts"]["max-size"] == "50m"
    assert config["log-opts"]["max-file"] == "5"
    assert config["live-restore"] is True


@pytest.mark.parametrize("path", ["/etc/apt/keyrings", "/etc/apt/sources.list.d", "/etc/docker"])
def test_directories(host, path):
    directory = host.file(_path(path))
    assert directory.is_directory
    assert directory.mode == 0o755


def test_nothing_outside_the_scratch_root(host):
    # Render-only mode never downloads the key nor installs anything.
    assert not host.file(_path("/etc/apt/keyrings/docker.asc")).exists
