"""Checks the three configurations the loki role renders in scaled mode.

The rules checked come from Loki 3.x itself:

- monolithic mode on shared object storage, state shared through memberlist,
  replication factor 3 (grafana/loki docs/sources/get-started/deployment-modes.md);
- `common.ring` applies to every ring, the compactor's included, unless a
  component sets its own (grafana/loki docs/sources/configure/_index.md, `common`);
- the compactor ring holds one token per instance and only the owner of key 0
  compacts and applies retention (grafana/loki pkg/compactor/compactor.go,
  ringKeyOfLeader, ringNumTokens = 1, loop()): one compactor per ring, so the
  hosts must form exactly one compactor ring.
"""

import os
import subprocess
from pathlib import Path

import yaml

ROOT = Path(os.environ["TELEMETRY_ROOT"])
EPHEMERAL = Path(os.environ["MOLECULE_EPHEMERAL_DIRECTORY"])
REPO = Path(os.environ["MOLECULE_PROJECT_DIRECTORY"]).resolve().parents[2]
HOSTS = {"loki-1": "192.0.2.31", "loki-2": "192.0.2.32", "loki-3": "192.0.2.33"}


def _dir(name):
    return ROOT / name / "opt/telemetry/loki"


def _config(name):
    return yaml.safe_load((_dir(name) / "loki.yml").read_text())


def _compactor_ring(config):
    """The kvstore the compactor's ring uses: its own block, else common.ring's."""
    own = (config.get("compactor") or {}).get("compactor_ring", {}).get("kvstore")
    kvstore = own or config["common"]["ring"]["kvstore"]
    if kvstore["store"] == "memberlist":
        # One memberlist cluster per set of join members; the default prefix is "collectors/".
        return ("memberlist", frozenset(config["memberlist"]["join_members"]), kvstore.get("prefix", "collectors/"))
    # inmemory is private to the process: each host would elect itself.
    return (kvstore["store"], id(config), kvstore.get("prefix", "collectors/"))


def test_configuration_files_hold_the_bucket_credentials_for_loki_only(host):
    for name in HOSTS:
        config = host.file(str(_dir(name) / "loki.yml"))
        assert config.is_file
        assert config.mode == 0o600
        assert config.uid == 10001


def test_every_host_runs_the_monolithic_target_in_one_memberlist_cluster(host):
    join = sorted(f"{address}:7946" for address in HOSTS.values())
    for name, address in HOSTS.items():
        config = _config(name)
        assert config["target"] == "all"
        assert config["common"]["ring"]["kvstore"]["store"] == "memberlist"
        assert config["common"]["instance_addr"] == address
        assert sorted(config["memberlist"]["join_members"]) == join
        assert config["memberlist"]["advertise_addr"] == address
        assert config["memberlist"]["bind_port"] == 7946
        assert config["server"]["grpc_listen_port"] == 9096


def test_streams_are_replicated_to_three_ingesters(host):
    for name in HOSTS:
        assert _config(name)["common"]["replication_factor"] == 3


def test_chunks_index_and_deletes_live_in_the_bucket_only(host):
    key_id = (EPHEMERAL / "secrets" / "s3_access_key_id").read_text().strip()
    secret = (EPHEMERAL / "secrets" / "s3_secret_access_key").read_text().strip()
    for name in HOSTS:
        config = _config(name)
        assert config["common"]["storage"] == {
            "s3": {
                "endpoint": "s3.example.test",
                "region": "us-east-1",
                "bucketnames": "telemetry-logs",
                "access_key_id": key_id,
                "secret_access_key": secret,
                "s3forcepathstyle": True,
                "insecure": False,
            }
        }
        periods = config["schema_config"]["configs"]
        assert periods and all(p["object_store"] == "s3" and p["store"] == "tsdb" for p in periods)
        assert all(p["index"]["period"] == "24h" for p in periods)  # retention needs 24h index periods
        assert config["storage_config"]["tsdb_shipper"]["active_index_directory"].startswith("/loki/")
        assert config["compactor"]["delete_request_store"] == "s3"


def test_exactly_one_compactor_applies_retention(host):
    configs = {name: _config(name) for name in HOSTS}
    rings = {_compactor_ring(config) for config in configs.values()}
    # One ring for the three hosts: Loki's election leaves one compactor running.
    assert len(rings) == 1, rings
    # Whichever host is elected applies the same retention.
    retention = {
        (
            c["compactor"]["retention_enabled"],
            c["limits_config"]["retention_period"],
            c["compactor"]["retention_delete_delay"],
        )
        for c in configs.values()
    }
    assert retention == {(True, "744h", "2h")}


def test_limits_and_message_sizes_are_the_single_host_ones(host):
    base = yaml.safe_load((REPO / "compose/loki/loki.yml").read_text())
    # A single production host: the compose limits under the role's production ingest limits.
    production = yaml.safe_load((REPO / "ansible/roles/loki/defaults/main.yml").read_text())["loki_ingestion_limits"]
    expected = {k: v for k, v in {**base["limits_config"], **production}.items() if k != "retention_period"}
    for name in HOSTS:
        config = _config(name)
        for section in ("ingester_client", "frontend_worker", "query_range"):
            assert config[section] == base[section], section
        limits = {k: v for k, v in config["limits_config"].items() if k != "retention_period"}
        assert limits == expected
        assert config["server"]["grpc_server_max_recv_msg_size"] == base["server"]["grpc_server_max_recv_msg_size"]


def test_cluster_ports_are_published_on_the_private_address(host):
    for name, address in HOSTS.items():
        compose_file = _dir(name) / "container.compose.yml"
        service = yaml.safe_load(compose_file.read_text())["services"]["loki"]
        assert service["ports"] == [
            f"{address}:3100:3100",
            f"{address}:9096:9096",
            # Memberlist gossips over TCP only (dskit's TCPTransport): no UDP port.
            f"{address}:7946:7946",
        ]
        result = subprocess.run(
            ["docker-compose", "-f", str(compose_file), "config", "--quiet"],
            capture_output=True,
            text=True,
            check=False,
        )
        assert result.returncode == 0, result.stderr
