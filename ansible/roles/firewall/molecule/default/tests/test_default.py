"""Checks the DOCKER-USER rules the firewall role renders, applied for real.

The rules are loaded by the real iptables-restore into a fresh network
namespace (`unshare -rn`: a user namespace gives the capability there only),
exactly as the telemetry-firewall service loads them on a host.
"""

import os
import shutil
import subprocess

import pytest

ROOT = os.environ["TELEMETRY_ROOT"]
# Rendering, each host writes below <its root>/<its name>.
BASE = ROOT + "/instance/instance"
RULES = BASE + "/opt/telemetry/firewall/docker-user.rules"
UNIT = BASE + "/etc/systemd/system/telemetry-firewall.service"
RESTORE = "/usr/sbin/iptables-restore --noflush /opt/telemetry/firewall/docker-user.rules"


def _apply_twice_and_list(rules, before=""):
    """iptables -S after restoring the rules twice into an empty namespace (after `before`, if given)."""
    if shutil.which("unshare") is None or shutil.which("iptables-restore") is None:
        pytest.fail("needs unshare (util-linux) and iptables-restore (iptables)")
    script = f"iptables-restore --noflush {rules} && iptables-restore --noflush {rules} && iptables -S"
    if before:
        script = f"iptables-restore --noflush {before} && {script}"
    result = subprocess.run(["unshare", "-rn", "sh", "-c", script], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()


def _jump(port, chain):
    match = f"-m conntrack --ctorigdst 10.0.0.20 --ctorigdstport {port} --ctdir ORIGINAL"
    return f"-A DOCKER-USER -p tcp {match} -j {chain}"


APPLIED = [
    "-P INPUT ACCEPT",
    "-P FORWARD ACCEPT",
    "-P OUTPUT ACCEPT",
    "-N DOCKER-USER",
    "-N TELEMETRY-INFLUXDB",
    "-N TELEMETRY-LOKI",
    "-N TELEMETRY-LOKI-GRPC",
    "-N TELEMETRY-LOKI-MEMBERLIST",
    _jump(8086, "TELEMETRY-INFLUXDB"),
    _jump(3100, "TELEMETRY-LOKI"),
    _jump(9096, "TELEMETRY-LOKI-GRPC"),
    _jump(7946, "TELEMETRY-LOKI-MEMBERLIST"),
    "-A DOCKER-USER -j RETURN",
    # Grafana and the proxy (edge) write and read; the Loki peers gossip and
    # talk gRPC; bystander (10.0.0.11) reaches none of them.
    "-A TELEMETRY-INFLUXDB -s 10.0.0.10/32 -j RETURN",
    "-A TELEMETRY-INFLUXDB -j DROP",
    "-A TELEMETRY-LOKI -s 10.0.0.10/32 -j RETURN",
    "-A TELEMETRY-LOKI -j DROP",
    "-A TELEMETRY-LOKI-GRPC -s 10.0.0.20/32 -j RETURN",
    "-A TELEMETRY-LOKI-GRPC -s 10.0.0.21/32 -j RETURN",
    "-A TELEMETRY-LOKI-GRPC -j DROP",
    "-A TELEMETRY-LOKI-MEMBERLIST -s 10.0.0.20/32 -j RETURN",
    "-A TELEMETRY-LOKI-MEMBERLIST -s 10.0.0.21/32 -j RETURN",
    "-A TELEMETRY-LOKI-MEMBERLIST -j DROP",
]


def test_files(host):
    rules = host.file(RULES)
    assert rules.is_file and rules.mode == 0o644 and rules.user == "root"
    unit = host.file(UNIT).content_string
    assert f"ExecStart={RESTORE}" in unit
    # A changed file is applied by a reload: a restart would restart Docker.
    assert f"ExecReload={RESTORE}" in unit
    # Before Docker, and Docker does not start without it: never published unfiltered.
    assert "Before=docker.service" in unit
    assert "RequiredBy=docker.service" in unit


def test_each_port_admits_its_own_clients_only():
    # Applied twice, every rule is there once: a run replaces the chains.
    assert _apply_twice_and_list(RULES) == APPLIED
    with open(RULES) as rules:
        assert "udp" not in rules.read()


def test_chains_no_rule_uses_are_removed(tmp_path):
    """The one shared chain of earlier rules, and the chain of a port no longer published, are deleted."""
    old = tmp_path / "old.rules"
    old.write_text(
        "*filter\n:DOCKER-USER - [0:0]\n:TELEMETRY-PRIVATE - [0:0]\n:TELEMETRY-VICTORIAMETRICS - [0:0]\n"
        "-A DOCKER-USER -p tcp -m conntrack --ctorigdst 10.0.0.20 --ctorigdstport 8086 --ctdir ORIGINAL"
        " -j TELEMETRY-PRIVATE\n-A DOCKER-USER -j RETURN\n-A TELEMETRY-PRIVATE -s 10.0.0.11/32 -j RETURN\n"
        "-A TELEMETRY-PRIVATE -j DROP\n-A TELEMETRY-VICTORIAMETRICS -j DROP\nCOMMIT\n"
    )
    assert _apply_twice_and_list(RULES, before=str(old)) == APPLIED


def test_iptables_accepts_the_file_as_the_role_checks_it():
    command = ["unshare", "-rn", "iptables-restore", "--test", "--noflush", RULES]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
