"""Docker Engine really installed from Docker's repository."""

import json


def test_engine_runs_and_starts_at_boot(host):
    service = host.service("docker")
    assert service.is_running
    assert service.is_enabled


def test_packages_come_from_dockers_repository(host):
    for package in ("docker-ce", "docker-ce-cli", "containerd.io", "docker-compose-plugin"):
        assert host.package(package).is_installed, package
    policy = host.check_output("apt-cache policy docker-ce")
    assert "download.docker.com" in policy


def test_compose_plugin(host):
    assert host.run("docker compose version --short").rc == 0


def test_daemon_uses_the_rendered_configuration(host):
    info = json.loads(host.check_output("docker info --format '{{json .}}'"))
    assert info["LoggingDriver"] == "local"
    assert info["LiveRestoreEnabled"] is True


def test_key_is_pinned(host):
    sources = host.file("/etc/apt/sources.list.d/docker.sources").content_string
    assert "Signed-By: /etc/apt/keyrings/docker.asc" in sources
    assert host.file("/etc/apt/keyrings/docker.asc").mode == 0o644
