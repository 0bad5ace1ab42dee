"""Checks the three hosts the victoriametrics role renders in cluster mode.

The rules checked come from VictoriaMetrics' cluster documentation
(VictoriaMetrics/VictoriaMetrics docs/victoriametrics/Cluster-VictoriaMetrics.md,
v1.13x):

- "Cluster setup": vminsert and vmselect list every vmstorage node in
  -storageNode; vmstorage takes -retentionPeriod and -storageDataPath and listens
  for vminsert on -vminsertAddr (8400) and for vmselect on -vmselectAddr (8401);
  vminsert serves HTTP on 8480, vmselect on 8481, vmstorage on 8482;
- "Replication and data safety": -replicationFactor=N on vminsert (N copies on
  distinct vmstorage nodes) and on vmselect (full answers while fewer than N are
  down); -dedup.minScrapeInterval=1ms on vmselect, or every copy is counted;
- "Deduplication": the same -dedup.minScrapeInterval on vmstorage and vmselect.
"""

import os
import subprocess
from pathlib import Path

import yaml

ROOT = Path(os.environ["TELEMETRY_ROOT"])
REPO = Path(os.environ["MOLECULE_PROJECT_DIRECTORY"]).resolve().parents[2]
HOSTS = {"vm-1": "192.0.2.41", "vm-2": "192.0.2.42", "vm-3": "192.0.2.43"}
SELECT_HOSTS = ["vm-1", "vm-2"]


def _dir(name):
    return ROOT / name / "opt/telemetry/victoriametrics"


def _service(name, component):
    return yaml.safe_load((_dir(name) / f"{component}.compose.yml").read_text())["services"][component]


def _flags(service):
    return dict(flag.lstrip("-").split("=", 1) for flag in service["command"])


def _pinned(key):
    for line in (REPO / "versions.env").read_text().splitlines():
        if line.startswith(key + "="):
            return line.split("=", 1)[1].strip()
    raise AssertionError(f"{key} is not pinned in versions.env")


def test_each_host_runs_the_services_of_its_groups(host):
    for name in HOSTS:
        rendered = sorted(p.name for p in _dir(name).glob("*.compose.yml"))
        expected = ["vminsert", "vmstorage"] + (["vmselect"] if name in SELECT_HOSTS else [])
        assert rendered == sorted(f"{c}.compose.yml" for c in expected), name
        assert not (_dir(name) / "victoriametrics.compose.yml").exists()


def test_vminsert_and_vmselect_list_all_three_storage_nodes(host):
    for name in HOSTS:
        components = {"vminsert": "8400", "vmselect": "8401"}
        for component, port in components.items():
            if component == "vmselect" and name not in SELECT_HOSTS:
                continue
            nodes = _flags(_service(name, component))["storageNode"].split(",")
            assert len(nodes) == 3, nodes
            assert all(node.endswith(":" + port) for node in nodes), nodes
            hosts = sorted(node.rsplit(":", 1)[0] for node in nodes)
            expected = sorted("vmstorage" if other == name else address for other, address in HOSTS.items())
            assert hosts == expected, (name, component, nodes)


def test_replication_and_deduplication(host):
    for name in HOSTS:
        assert _flags(_service(name, "vminsert"))["replicationFactor"] == "2"
        storage = _flags(_service(name, "vmstorage"))
        assert storage["dedup.minScrapeInterval"] == "1ms"
        assert storage["retentionPeriod"] == "30d"
        assert storage["storageDataPath"] == "/storage"
        # Series caps: no node listed here, so the floor; 2 copies over 3 vmstorage hosts is each one's whole share.
        assert (storage["storage.maxHourlySeries"], storage["storage.maxDailySeries"]) == ("100000", "400000")
        if name in SELECT_HOSTS:
            select = _flags(_service(name, "vmselect"))
            assert select["replicationFactor"] == "2"
            # Same window on vmstorage and vmselect.
            assert select["dedup.minScrapeInterval"] == storage["dedup.minScrapeInterval"]


def test_ports_private_for_the_cluster_loopback_for_vmstorage_http(host):
    for name, address in HOSTS.items():
        assert _service(name, "vmstorage")["ports"] == [
            "127.0.0.1:8482:8482",
            f"{address}:8400:8400",
            f"{address}:8401:8401",
        ]
        assert _service(name, "vminsert")["ports"] == [f"{address}:8480:8480"]
        if name in SELECT_HOSTS:
            assert _service(name, "vmselect")["ports"] == [f"{address}:8481:8481"]


def test_images_hardening_and_data_directories(host):
    images = {c: _pinned(c.upper() + "_IMAGE") for c in ("vmstorage", "vminsert", "vmselect")}
    for name in HOSTS:
        for component in ["vmstorage", "vminsert"] + (["vmselect"] if name in SELECT_HOSTS else []):
            service = _service(name, component)
            assert service["image"] == images[component]
            assert service["user"] == "10005:10005"
            assert service["cap_drop"] == ["ALL"]
            assert service["security_opt"] == ["no-new-privileges:true"]
            assert service["healthcheck"]["test"][-1].endswith("/health")
            for mount in service["volumes"]:
                directory = host.file(mount["source"])
                # Data directories 0750; the service's own endpoint keys 0700, mounted read-only.
                keys = mount["target"] == "/run/secrets"
                assert directory.is_directory and directory.uid == 10005
                assert directory.mode == (0o700 if keys else 0o750) and (mount["read_only"] or not keys)
        result = subprocess.run(
            ["docker-compose", "-f", str(_dir(name) / "vmstorage.compose.yml"), "config", "--quiet"],
            capture_output=True,
            text=True,
            check=False,
        )
        assert result.returncode == 0, result.stderr
