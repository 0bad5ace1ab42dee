"""Reads the DOCKER-USER rules the firewall role renders: who each published port admits."""

from __future__ import annotations

import re

JUMP = re.compile(
    r"(?m)^-A DOCKER-USER -p (?P<proto>\S+) -m conntrack --ctorigdst (?P<address>\S+) "
    r"--ctorigdstport (?P<port>\d+) --ctdir ORIGINAL -j (?P<chain>\S+)$"
)
ADMIT = re.compile(r"(?m)^-A (?P<chain>\S+) -s (?P<source>[0-9.]+)/32 -j RETURN$")


def admitted(rules: str) -> dict[tuple[str, str, int], list[str]]:
    """(address, proto, port) -> the source addresses its chain lets through, in order.

    Checks on the way that each port's chain exists once and ends in a DROP, so
    that a source not listed is refused.
    """
    ports = {}
    for jump in JUMP.finditer(rules):
        chain = jump["chain"]
        key = (jump["address"], jump["proto"], int(jump["port"]))
        assert key not in ports, f"{key} has two rules"
        assert re.search(rf"(?m)^:{re.escape(chain)} - \[0:0\]$", rules), f"{chain} is not declared"
        chain_rules = re.findall(rf"(?m)^-A {re.escape(chain)} .*$", rules)
        assert chain_rules and chain_rules[-1] == f"-A {chain} -j DROP", chain_rules
        ports[key] = [admit["source"] for admit in ADMIT.finditer(rules) if admit["chain"] == chain]
    assert rules.rstrip().endswith("COMMIT") and "-A DOCKER-USER -j RETURN" in rules
    return ports


def by_port(rules: str) -> dict[int, list[str]]:
    """port -> admitted sources, for a host whose restricted ports are all TCP on one address."""
    ports = admitted(rules)
    assert len({address for address, _, _ in ports}) <= 1, ports
    assert {proto for _, proto, _ in ports} <= {"tcp"}, ports
    return {port: sources for (_, _, port), sources in ports.items()}


CAP = re.compile(
    r"(?m)^-A DOCKER-USER -p tcp --syn -m conntrack --ctstate DNAT --ctorigdstport (?P<port>\d+) --ctdir ORIGINAL "
    r"-m connlimit --connlimit-above (?P<cap>\d+) --connlimit-mask 32 -j DROP$"
)


def capped(rules: str) -> dict[int, int]:
    """port -> the connections one source address may hold open on it (the public ports' cap)."""
    return {int(cap["port"]): int(cap["cap"]) for cap in CAP.finditer(rules)}
