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
# Rendering, each host writes below <root>/<its name>.
RULES = ROOT + "/instance/opt/telemetry/firewall/docker-user.rules"
UNIT = ROOT + "/instance/etc/systemd/system/telemetry-firewall.service"


def _apply_twice_and_list(rules):
    """iptables -S after restoring the rules twice into an empty namespace."""
    if shutil.which("unshare") is None or shutil.which("iptables-restore") is None:
        pytest.fail("needs unshare (util-linux) and iptables-restore (iptables)")
    script = f"iptables-restore --noflush {rules} && iptables-restore --noflush {rules} && iptables -S"
    result = subprocess.run(["unshare", "-rn", "sh", "-c", script], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()


def test_files(host):
    rules = host.file(RULES)
    assert rules.is_file and rules.mode == 0o644 and rules.user == "root"
    unit = host.file(UNIT).content_string
    assert "ExecStart=/usr/sbin/iptables-restore --noflush /opt/telemetry/firewall/docker-user.rules" in unit
    # Before Docker, and Docker does not start without it: never published unfiltered.
    assert "Before=docker.service" in unit
    assert "RequiredBy=docker.service" in unit


def test_only_inventory_hosts_reach_influxdb_and_loki():
    rules = _apply_twice_and_list(RULES)
    # Applied twice, every rule is there once: a run replaces the chains.
    assert rules == [
        "-P INPUT ACCEPT",
        "-P FORWARD ACCEPT",
        "-P OUTPUT ACCEPT",
        "-N DOCKER-USER",
        "-N TELEMETRY-PRIVATE",
        "-A DOCKER-USER -p tcp -m conntrack --ctorigdst 10.0.0.20 --ctorigdstport 8086 --ctdir ORIGINAL "
        "-j TELEMETRY-PRIVATE",
        "-A DOCKER-USER -p tcp -m conntrack --ctorigdst 10.0.0.20 --ctorigdstport 3100 --ctdir ORIGINAL "
        "-j TELEMETRY-PRIVATE",
        "-A DOCKER-USER -j RETURN",
        "-A TELEMETRY-PRIVATE -s 10.0.0.10/32 -j RETURN",
        "-A TELEMETRY-PRIVATE -s 10.0.0.11/32 -j RETURN",
        "-A TELEMETRY-PRIVATE -s 10.0.0.20/32 -j RETURN",
        "-A TELEMETRY-PRIVATE -j DROP",
    ]


def test_iptables_accepts_the_file_as_the_role_checks_it():
    command = ["unshare", "-rn", "iptables-restore", "--test", "--noflush", RULES]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
