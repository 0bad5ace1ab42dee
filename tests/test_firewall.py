"""The firewall role with the production inventory and more hosts: who each port admits.

Only the firewall role runs (tests/test_ansible.py, test_loki_scaled.py and
test_victoriametrics_deploy.py render it inside the whole site): render-only
for the per-port source lists, and once for real as root, with the real
iptables-restore checking the rules (`--test`, nothing loaded) and a
`systemctl` on PATH that records what the role asks of systemd and answers
like a host where the unit is installed: a changed rule set must reload the
unit, never restart it (docker.service requires it, so a restart would
restart Docker and every container).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from firewall_rules import admitted, by_port, capped
from servers import require_binary

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
OUTPUT_TAIL = 8000
PROXY, METRICS = "10.0.0.10", "10.0.0.20"
# In the inventory, in group telemetry, in none of the groups that talk to a store.
BYSTANDER = {"bystander": "10.0.0.30"}
PLAYBOOK = "- name: Firewall only\n  hosts: telemetry\n  gather_facts: false\n  roles:\n    - role: firewall\n"


def _play(
    tmp: Path, children: dict, hosts: dict, variables: dict, check: bool = True, limit: str = "all", path: str = ""
) -> subprocess.CompletedProcess:
    """ansible-playbook of the firewall role: the production inventory plus `children` groups and `hosts`."""
    if shutil.which("ansible-playbook") is None:
        pytest.fail("ansible-playbook is not installed (pip install -e '.[dev]')")
    (tmp / "firewall.yml").write_text(PLAYBOOK)
    extra = tmp / "extra.yml"
    extra.write_text(
        yaml.safe_dump(
            {"all": {"children": {"telemetry": {"children": children, "hosts": dict.fromkeys(hosts)}}, "hosts": hosts}},
            sort_keys=False,
        )
    )
    extra_vars = tmp / "vars.yml"
    variables = {"ansible_connection": "local", "ansible_python_interpreter": "{{ ansible_playbook_python }}"} | (
        variables
    )
    extra_vars.write_text(yaml.safe_dump(variables))
    env = dict(
        os.environ,
        ANSIBLE_CONFIG=str(REPO / "ansible.cfg"),
        ANSIBLE_ROLES_PATH=str(REPO / "ansible/roles"),
        ANSIBLE_NOCOLOR="1",
        PATH=f"{path}:{os.environ['PATH']}" if path else os.environ["PATH"],
    )
    cmd = ["ansible-playbook", str(tmp / "firewall.yml"), "-i", "inventory/prod/hosts.yml", "-i", str(extra)]
    result = subprocess.run(
        [*cmd, "-l", limit, "-e", f"@{extra_vars}"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    if check:
        output = (result.stdout + result.stderr)[-OUTPUT_TAIL:]
        assert result.returncode == 0, output
    return result


def _render(tmp: Path, children: dict, hosts: dict, **variables) -> dict[str, str]:
    """Each host's rendered docker-user.rules."""
    root = tmp / "root"
    _play(tmp, children, hosts, {"telemetry_render_only": True, "telemetry_root": str(root), **variables})
    return {path.parts[len(root.parts)]: path.read_text() for path in root.glob("*/opt/telemetry/firewall/*.rules")}


def _hosts(addresses: dict[str, str]) -> dict:
    return {name: {"telemetry_private_address": address} for name, address in addresses.items()}


PEERS = {"loki_b": "10.0.0.21", "loki_c": "10.0.0.22"}
DASH = {"dash": "10.0.0.12"}  # a second Grafana, on a host of its own


@pytest.fixture(scope="module")
def scaled_loki(tmp_path_factory) -> dict[str, str]:
    """Each host's rules: the production inventory, two more Loki hosts in scaled mode, a Grafana, a bystander."""
    return _render(
        tmp_path_factory.mktemp("scaled"),
        {"loki": {"hosts": dict.fromkeys(PEERS)}, "grafana": {"hosts": dict.fromkeys(DASH)}},
        _hosts(PEERS | DASH | BYSTANDER),
        loki_mode="scaled",
    )


def test_scaled_loki_peers_gossip_and_grafana_and_the_proxy_read_and_write(scaled_loki):
    rules, peers, dash = scaled_loki, PEERS, DASH
    loki_peers = [METRICS, *peers.values()]
    assert by_port(rules["metrics_prod"]) == {
        8086: [PROXY, dash["dash"]],
        3100: [PROXY, dash["dash"]],
        9096: loki_peers,
        7946: loki_peers,
    }
    for host, address in peers.items():
        assert admitted(rules[host]) == {
            (address, "tcp", 3100): [PROXY, dash["dash"]],
            (address, "tcp", 9096): loki_peers,
            (address, "tcp", 7946): loki_peers,
        }
    # The hosts that publish nothing on a private address filter nothing.
    for host in ("grafana_prod", "dash", "bystander"):
        assert admitted(rules[host]) == {}
    for host, text in rules.items():
        assert BYSTANDER["bystander"] not in text, host
        # Memberlist gossips over TCP only: no UDP rule.
        assert "-p udp" not in text and "/udp" not in text, host


def test_victoriametrics_cluster_ports_admit_their_own_clients(tmp_path):
    cluster = {"vm_b": "10.0.0.21", "vm_c": "10.0.0.22"}
    rules = _render(
        tmp_path,
        {
            "vmstorage": {"hosts": dict.fromkeys(["metrics_prod", *cluster])},
            "vminsert": {"hosts": dict.fromkeys(cluster)},
            "vmselect": {"hosts": dict.fromkeys(["metrics_prod", "vm_b"])},
        },
        _hosts(cluster | BYSTANDER),
        metrics_backend="victoriametrics",
        victoriametrics_mode="cluster",
    )
    inserters, selectors = list(cluster.values()), [METRICS, cluster["vm_b"]]
    # metrics_prod stores and selects, vm_b does all three, vm_c stores and inserts.
    assert by_port(rules["metrics_prod"]) == {8400: inserters, 8401: selectors, 3100: [PROXY], 8481: [PROXY]}
    assert by_port(rules["vm_b"]) == {8400: inserters, 8401: selectors, 8480: [PROXY], 8481: [PROXY]}
    assert by_port(rules["vm_c"]) == {8400: inserters, 8401: selectors, 8480: [PROXY]}
    for host, text in rules.items():
        assert BYSTANDER["bystander"] not in text, host


def test_victoriametrics_single_node_admits_the_proxy_and_grafana(tmp_path):
    rules = _render(tmp_path, {}, _hosts(BYSTANDER), metrics_backend="victoriametrics")
    assert by_port(rules["metrics_prod"]) == {8428: [PROXY], 3100: [PROXY]}


def test_a_client_without_a_private_address_is_refused_before_any_change(tmp_path):
    result = _play(
        tmp_path,
        {"grafana": {"hosts": {"dash": None}}},
        {"dash": {}},
        {"telemetry_render_only": True, "telemetry_root": str(tmp_path / "root")},
        check=False,
    )
    assert result.returncode != 0
    assert "every source must be an inventory host with a telemetry_private_address" in result.stdout
    # metrics_prod, whose ports dash would read, writes no rules; the others have nothing to refuse.
    assert not (tmp_path / "root/metrics_prod/opt/telemetry/firewall").exists()
    assert (tmp_path / "root/dash/opt/telemetry/firewall/docker-user.rules").is_file()


def _in_namespaces(rules: Path, clients: list[str], **settings: str) -> str:
    """What tests/firewall_netns.sh prints with `rules` loaded and these client addresses (see its settings)."""
    for tool in ("unshare", "nsenter", "ip", "iptables-restore", "bash"):
        require_binary(tool)
    env = dict(os.environ, PYTHON=sys.executable, READY_PORT="9999", **settings)
    result = subprocess.run(
        ["unshare", "-rn", "bash", str(REPO / "tests/firewall_netns.sh"), str(rules), *clients],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def test_the_rules_drop_real_connections_from_hosts_a_port_does_not_admit(scaled_loki, tmp_path):
    """metrics_prod's rules loaded into namespaces that forward to a container as Docker does (DNAT, then
    DOCKER-USER): the proxy reaches InfluxDB and Loki but not gRPC or gossip, a Loki peer the reverse, a
    bystander none of them; a port the rules do not name (8428 here) stays open to all."""
    rules = tmp_path / "docker-user.rules"
    rules.write_text(scaled_loki["metrics_prod"])
    clients = {"proxy": PROXY, "peer": PEERS["loki_b"], "bystander": BYSTANDER["bystander"]}
    ports = [8086, 3100, 9096, 7946, 8428]
    output = _in_namespaces(rules, list(clients.values()), PORTS=" ".join(map(str, ports)))
    lines = (line.split(" ", 2) for line in output.splitlines())
    seen = {(address, int(port)): what for address, port, what in lines}
    reachable = {
        "proxy": {8086, 3100, 8428},
        "peer": {9096, 7946, 8428},
        "bystander": {8428},
    }
    expected = {
        (address, port): "open" if port in reachable[name] else "dropped"
        for name, address in clients.items()
        for port in ports
    }
    assert seen == expected


def test_the_proxys_public_ports_cap_the_connections_of_one_address(scaled_loki, tmp_path):
    """The reverse proxy's HTTP and HTTPS take at most firewall_connections_per_address connections from one
    source; no other host caps anything, and 0 turns the cap off."""
    assert capped(scaled_loki["grafana_prod"]) == {80: 256, 443: 256}
    for host, text in scaled_loki.items():
        if host != "grafana_prod":
            assert capped(text) == {}, host
    for run in ("moved", "off"):
        (tmp_path / run).mkdir()
    moved = _render(
        tmp_path / "moved",
        {},
        {},
        reverse_proxy_https_port=8443,
        firewall_connections_per_address=3,
        reverse_proxy_bind_address="203.0.113.7",  # an IPv4 address of its own: capped as 0.0.0.0 is
    )
    assert capped(moved["grafana_prod"]) == {80: 3, 8443: 3}
    off = _render(tmp_path / "off", {}, {}, firewall_connections_per_address=0)
    assert capped(off["grafana_prod"]) == {}
    # A typo must not turn the cap off ("25O" | int is 0).
    (tmp_path / "typo").mkdir()
    root = str(tmp_path / "typo" / "root")
    variables = {"telemetry_render_only": True, "telemetry_root": root, "firewall_connections_per_address": "25O"}
    result = _play(tmp_path / "typo", {}, {}, variables, check=False)
    assert result.returncode != 0 and "must be a whole number of connections" in result.stdout


@pytest.mark.parametrize("address", ["::", "", "2001:db8::10"])
def test_a_proxy_published_on_ipv6_is_refused_while_the_cap_is_on(tmp_path, address):
    """The cap is an IPv4 rule: Docker publishes an IPv6 or empty bind address on IPv6 (an empty one on both),
    where one address could hold any number of connections. The role refuses it unless the cap is off."""
    root = str(tmp_path / "root")
    variables = {"telemetry_render_only": True, "telemetry_root": root, "reverse_proxy_bind_address": address}
    result = _play(tmp_path, {}, {}, variables, check=False)
    assert result.returncode != 0
    assert f"reverse_proxy_bind_address is '{address}': the connection cap is an IPv4 rule" in result.stdout
    if address == "::":  # one address is enough to show the cap's 0 lifts the check
        (tmp_path / "off").mkdir()
        off = _render(tmp_path / "off", {}, {}, reverse_proxy_bind_address=address, firewall_connections_per_address=0)
        assert capped(off["grafana_prod"]) == {}


def test_one_address_holding_its_cap_is_refused_and_no_other_address_is(tmp_path):
    """The proxy's rules loaded into namespaces that forward to a container as Docker does: one client holds the
    cap's connections to 443 open; its next one is dropped while another client still connects, and once it closes
    them it connects again."""
    cap = 5
    (tmp_path / "render").mkdir()
    rendered = _render(tmp_path / "render", {}, {}, firewall_connections_per_address=cap)
    rules = tmp_path / "docker-user.rules"
    rules.write_text(rendered["grafana_prod"])
    holder, other = "10.0.0.40", BYSTANDER["bystander"]
    output = _in_namespaces(rules, [holder, other], PORTS="", HOLD_PORT="443", HOLD_COUNT=str(cap))
    assert output.splitlines() == [
        f"{holder} holds {cap}",
        f"{holder} 443 dropped",
        f"{other} 443 open",
        f"{holder} 443 open",
    ], output


SYSTEMCTL = """\
#!/bin/sh
# Records each call; answers like systemd for one installed unit whose state is kept in a file.
echo "$*" >> "{log}"
state="{state}"
[ -f "$state" ] || echo inactive > "$state"
case "$1" in
  show) printf 'Id=%s\\nLoadState=loaded\\nActiveState=%s\\nSubState=exited\\n' "$2" "$(cat "$state")" ;;
  is-enabled) [ -f "$state.enabled" ] && echo enabled || {{ echo disabled; exit 1; }} ;;
  enable) touch "$state.enabled" ;;
  start|restart|reload) echo active > "$state" ;;
esac
exit 0
"""


def test_a_changed_rule_set_reloads_the_unit_and_never_restarts_docker(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("the role writes root-owned files and iptables-restore --test needs root")
    require_binary("iptables-restore")
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    log = tmp_path / "systemctl.log"
    systemctl = fake_bin / "systemctl"
    systemctl.write_text(SYSTEMCTL.format(log=log, state=tmp_path / "unit.state"))
    systemctl.chmod(0o755)
    root = tmp_path / "host"

    def converge(children: dict, hosts: dict, run: str) -> list[str]:
        """The calls to systemctl of one run on metrics_prod (the others would write into the same root)."""
        before = log.read_text().splitlines() if log.exists() else []
        (tmp_path / run).mkdir()
        _play(tmp_path / run, children, hosts, {"firewall_root": str(root)}, limit="metrics_prod", path=str(fake_bin))
        return log.read_text().splitlines()[len(before) :]

    # metrics_prod alone: the unit is installed, started, and the rules applied.
    first = converge({}, {}, "first")
    assert "start telemetry-firewall.service" in first, first
    # A second Grafana: the rules change and are applied by a reload of the unit.
    dash = ({"grafana": {"hosts": {"dash": None}}}, {"dash": {"telemetry_private_address": "10.0.0.12"}})
    second = converge(*dash, "second")
    # Nothing changed: nothing is reloaded.
    third = converge(*dash, "third")
    for call in first + second + third:
        assert not call.startswith(("restart", "stop", "try-restart", "reload-or-restart")), call
        assert "docker" not in call, call
    assert "reload telemetry-firewall.service" in second, second
    assert not [call for call in third if call.startswith(("reload", "start"))], third
    # What the reload loads: the boot's own command, and the rules of the second run.
    unit = (root / "etc/systemd/system/telemetry-firewall.service").read_text()
    restore = "/usr/sbin/iptables-restore --noflush /opt/telemetry/firewall/docker-user.rules"
    assert f"ExecStart={restore}\nExecReload={restore}\n" in unit
    assert "RequiredBy=docker.service" in unit
    rules = (root / "opt/telemetry/firewall/docker-user.rules").read_text()
    assert by_port(rules) == {8086: [PROXY, "10.0.0.12"], 3100: [PROXY, "10.0.0.12"]}
