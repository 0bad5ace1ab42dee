"""MetricsLogger behaviour: configuration errors, tag rule, field typing rule, counters, samplers."""

from __future__ import annotations

import argparse
import itertools
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fault_server import fault_server

from telemetry_client import BufferSettings, ConfigurationError
from telemetry_client._influx.system_metrics import SystemSampler, cgroup_memory
from telemetry_client.metrics import MetricsLogger

FAST = BufferSettings(flush_interval=0.05, retry_base=0.02, retry_cap=0.1)


@pytest.fixture
def server():
    with fault_server() as srv:
        yield srv


def _logger(url: str, **kwargs: object) -> MetricsLogger:
    kwargs.setdefault("self_metrics_interval", None)
    return MetricsLogger(url=url, api_version=1, database="d", buffer=FAST, **kwargs)


def test_missing_token_is_a_clear_error_at_construction(monkeypatch):
    monkeypatch.delenv("INFLUXDB_TOKEN", raising=False)
    with pytest.raises(ConfigurationError, match="INFLUXDB_TOKEN"):
        MetricsLogger(host="influx.example.org")


def test_no_server_named_turns_the_logger_off_unless_strict(monkeypatch):
    for name in ("INFLUXDB_HOST", "INFLUXDB_URL", "TELEMETRY_STRICT"):
        monkeypatch.delenv(name, raising=False)
    logger = MetricsLogger(token="t")
    assert logger.enabled is False and logger.channel is None
    assert "INFLUXDB_URL" in logger.settings.disabled_reason and "token" in logger.settings.disabled_reason
    logger.log("m", fields={"x": 1})
    assert logger.stats()["dropped_by_reason"] == {"disabled": 1}
    with pytest.raises(ConfigurationError, match="INFLUXDB_HOST"):
        MetricsLogger(token="t", strict=True)
    monkeypatch.setenv("TELEMETRY_STRICT", "1")
    with pytest.raises(ConfigurationError, match="strict"):
        MetricsLogger(token="t")
    monkeypatch.setenv("TELEMETRY_STRICT", "maybe")
    with pytest.raises(ConfigurationError, match="TELEMETRY_STRICT"):
        MetricsLogger(token="t")


def test_bad_settings_are_refused():
    with pytest.raises(ConfigurationError, match="api_version"):
        MetricsLogger(url="http://localhost:8086", token="t", api_version=3)
    with pytest.raises(ValueError, match="flush_interval"):
        BufferSettings(flush_interval=0)
    with pytest.raises(ConfigurationError, match="tab, newline"):
        MetricsLogger(url="http://localhost:8086", token="t", uid="a\nb")


def test_environment_is_read_at_construction_not_import(monkeypatch, server):
    monkeypatch.delenv("INFLUXDB_URL", raising=False)
    import telemetry_client.metrics  # noqa: F401  (already imported: the env below is set later)

    monkeypatch.setenv("INFLUXDB_HOST", "127.0.0.1")
    monkeypatch.setenv("INFLUXDB_PORT", str(server.port))
    monkeypatch.setenv("INFLUXDB_TOKEN", "env-token")
    monkeypatch.setenv("INFLUXDB_ORG", "env-org")
    monkeypatch.setenv("INFLUXDB_DATABASE", "env-bucket")
    logger = MetricsLogger(buffer=FAST, self_metrics_interval=None)
    url = logger._sink.transport.url
    assert url.startswith(f"http://127.0.0.1:{server.port}/api/v2/write?")
    assert "org=env-org" in url and "bucket=env-bucket" in url
    assert logger._sink.transport.headers["Authorization"] == "Token env-token"
    assert "env-token" not in repr(logger)
    logger.close(1)


def test_remote_hosts_default_to_https_with_verification():
    logger = MetricsLogger(host="influx.example.org", token="t", self_metrics_interval=None)
    assert logger._sink.transport.url.startswith("https://influx.example.org:8086/")
    assert logger._sink.transport.verify_tls is True
    logger.close(0)


def test_disabled_mode_needs_no_credentials_and_only_counts():
    logger = MetricsLogger(enabled=False)
    logger.log("m", fields={"x": 1})
    stats = logger.stats()
    assert stats["dropped_by_reason"] == {"disabled": 1} and stats["sent"] == 0
    assert logger.flush(0) == 0 and logger.close(0) == 0


@pytest.mark.slow
def test_import_has_no_side_effects():
    code = (
        "import logging, threading, telemetry_client, telemetry_client.metrics;"
        "assert threading.active_count() == 1, threading.enumerate();"
        "assert not logging.getLogger().handlers;"
        "assert not logging.getLogger('telemetry_client').handlers"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).parent.parent)


def test_caller_dicts_are_not_mutated_and_copied_at_call_time(server):
    logger = _logger(server.url, uid=1, role="miner")
    tags, fields = {"kind": "a"}, {"loss": 1.0, "grads": [1.0, 2.0]}
    logger.log("m", tags, fields)
    fields["loss"] = 99.0  # changed after the call: must not affect the queued point
    assert tags == {"kind": "a"} and fields == {"loss": 99.0, "grads": [1.0, 2.0]}
    assert logger.flush(5) == 0
    line = server.lines[0].decode()
    assert line.startswith("m,kind=a,role=miner,uid=1 ")
    assert "loss=1 " in line and "grads_mean=1.5" in line


def test_callers_tag_wins_and_is_warned_about_once(server, caplog):
    logger = _logger(server.url, uid=1, role="validator")
    with caplog.at_level("WARNING", logger="telemetry_client"):
        logger.log("m", {"uid": 42}, {"x": 1})
        logger.log("m", {"uid": 43}, {"x": 1})
        assert logger.flush(5) == 0
    assert [line.split(b" ")[0] for line in server.lines] == [b"m,role=validator,uid=42", b"m,role=validator,uid=43"]
    assert sum("overrides the logger's 'uid'" in r.getMessage() for r in caplog.records) == 1


def test_config_values_become_tags_only_from_the_allowlist(server):
    config = argparse.Namespace(netuid=3, subtensor=argparse.Namespace(network="finney"), wallet_key="do-not-tag")
    logger = _logger(server.url, config=config)
    logger.log("m", fields={"x": 1})
    assert logger.flush(5) == 0
    assert server.lines[0].split(b" ")[0] == b"m,netuid=3,network=finney"


def test_field_typing_rule_and_drop_counting(server):
    logger = _logger(server.url)
    logger.log(
        "m",
        fields={
            "int": 3,
            "bool": True,
            "nan": float("nan"),
            "inf": float("-inf"),
            "none": None,
            "text": 'a "quoted" text',
            "obj": object(),
            "empty": [],
            "mixed": [1, float("nan"), 3],
        },
    )
    logger.log("m", fields={"only_none": None})
    assert logger.flush(5) == 0
    assert server.lines == [
        b'm bool=1,int=3,mixed_max=3,mixed_mean=2,mixed_median=2,mixed_min=1,text="a \\"quoted\\" text" '
        + server.lines[0].rsplit(b" ", 1)[1]
    ]
    assert logger.stats()["dropped_by_reason"] == {
        "non_finite": 3,
        "none_value": 2,
        "unsupported_type": 1,
        "invalid": 1,
        "no_fields": 1,
    }


def test_numpy_like_scalars_and_arrays_are_numbers(server):
    class Scalar:
        ndim = 0

        def item(self) -> float:
            return 2.5

    class Array:
        ndim = 1

        def tolist(self) -> list[float]:
            return [1.0, 3.0]

    logger = _logger(server.url)
    logger.log("m", fields={"s": Scalar(), "a": Array()})
    assert logger.flush(5) == 0
    assert server.lines[0].startswith(b"m a_max=3,a_mean=2,a_median=2,a_min=1,s=2.5 ")


def test_prefix_timestamp_and_sampling(server):
    logger = _logger(server.url, prefix="miner")
    logger.log("step", fields={"x": 1}, timestamp=1.5)  # float: seconds
    for _ in range(200):
        logger.log("sampled", fields={"x": 1}, sample_rate=0.0)
    assert logger.flush(5) == 0
    assert server.lines == [b"minerstep x=1 1500000000"]  # prefix + measurement, as written before
    assert logger.stats()["dropped_by_reason"] == {"sampled_out": 200}


def test_invalid_names_are_dropped_counted_and_the_rest_delivered(server):
    logger = _logger(server.url)
    logger.log("#comment", fields={"x": 1})
    logger.log("m", tags={"bad": "new\nline"}, fields={"x": 1})
    logger.log("m", fields={"time": 1, "ok": 2})
    assert logger.flush(5) == 0
    assert [line.split(b" ")[:2] for line in server.lines] == [[b"m", b"ok=2"]]
    assert logger.stats()["dropped_by_reason"] == {"invalid": 3}


def test_system_metrics_are_their_own_measurement(server):
    logger = _logger(server.url, uid=5, system_metrics_interval=0.0)
    for _ in range(3):
        logger.log("m", fields={"x": 1}, with_system_metrics=True, with_gpu_metrics=True)
    assert logger.flush(5) == 0
    system = [line for line in server.lines if line.startswith(b"system,uid=5 ")]
    assert len(system) == 2, "the first sample only primes the CPU counter"
    assert b"cpu_percent=" in system[0] and b"memory_total_bytes=" in system[0]
    assert not any(line.startswith(b"gpu") for line in server.lines), "no GPU here: no GPU points"


def _own_points(server, uid: int, count: int) -> list[dict[str, float]]:
    """Fields of this logger's first `count` influxdb self-metrics points, waiting for them."""
    prefix = f"telemetry_client,sink=influxdb,uid={uid} ".encode()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        own = [line for line in server.wait_for_lines(1, timeout=1) if line.startswith(prefix)]
        if len(own) >= count:
            break
        time.sleep(0.05)
    points = []
    for line in own[:count]:
        field_set = line.decode().split(" ")[1]
        points.append({k: float(v.rstrip("i")) for k, v in (pair.split("=") for pair in field_set.split(","))})
    return points


def test_self_metrics_carry_the_growth_since_the_previous_point(server):
    """`<counter>_delta` is what the counter grew by since the process's previous point."""
    logger = _logger(server.url, uid=8, self_metrics_interval=0.2)
    for _ in range(3):
        logger.log("m", fields={"y": 1})
    first = _own_points(server, 8, 1)[0]
    for _ in range(2):
        logger.log("m", fields={"y": 1})
    logger.log("m", fields={"y": float("nan")})
    points = _own_points(server, 8, 4)
    logger.close(1)
    assert first["queued_delta"] == first["queued"] >= 3
    for before, after in itertools.pairwise(points):
        for name in ("queued", "sent", "batches", "bytes_sent", "dropped"):
            assert after[f"{name}_delta"] == after[name] - before[name], (name, before, after)
        # A drop reason's delta is written only for an interval that dropped something.
        grew = after["dropped_non_finite"] - before["dropped_non_finite"]
        assert after.get("dropped_non_finite_delta", 0) == grew, (before, after)
        assert ("dropped_non_finite_delta" in after) == (grew != 0)
    # The deltas add up to the cumulative count (which includes earlier self-metrics points).
    assert sum(p["queued_delta"] for p in points) == points[-1]["queued"] >= 6
    assert sum(p.get("dropped_non_finite_delta", 0) for p in points) == 1
    assert all("dropped_expired_delta" not in p for p in points)


def test_self_metrics_are_written(server):
    logger = _logger(server.url, uid=9, self_metrics_interval=0.1)
    logger.log("m", fields={"x": float("nan"), "y": 1})
    deadline_lines = server.wait_for_lines(2, timeout=5)
    own = [line for line in deadline_lines if line.startswith(b"telemetry_client,")]
    assert own, deadline_lines
    assert own[0].startswith(b"telemetry_client,sink=influxdb,uid=9 ")
    assert b"dropped_non_finite=1" in own[0]
    logger.close(1)


def test_cgroup_v2_memory_limit(tmp_path: Path):
    (tmp_path / "memory.max").write_text("1073741824\n")
    (tmp_path / "memory.current").write_text("600000000\n")
    (tmp_path / "memory.stat").write_text("anon 1\ninactive_file 100000000\nactive_file 5\n")
    assert cgroup_memory(tmp_path) == (500_000_000, 1_073_741_824)
    (tmp_path / "memory.max").write_text("max\n")
    assert cgroup_memory(tmp_path) is None


def test_cgroup_v1_memory_limit(tmp_path: Path):
    v1 = tmp_path / "memory"
    v1.mkdir()
    (v1 / "memory.limit_in_bytes").write_text("2147483648\n")
    (v1 / "memory.usage_in_bytes").write_text("1000\n")
    (v1 / "memory.stat").write_text("total_inactive_file 400\n")
    assert cgroup_memory(tmp_path) == (600, 2_147_483_648)
    (v1 / "memory.limit_in_bytes").write_text(str(2**63 - 4096))
    assert cgroup_memory(tmp_path) is None


def test_system_sampler_uses_the_cgroup_limit_when_lower(tmp_path: Path):
    (tmp_path / "memory.max").write_text("1048576\n")
    (tmp_path / "memory.current").write_text("524288\n")
    sample = SystemSampler(cgroup_root=tmp_path).sample()
    assert sample["memory_total_bytes"] == 1_048_576
    assert sample["memory_percent"] == 50.0


def test_process_value_is_the_seeds_list_treatment():
    assert MetricsLogger.process_value([1, 2, 3, 10]) == {"mean": 4.0, "min": 1.0, "max": 10.0, "median": 2.5}
    assert MetricsLogger.process_value(0.5) == 0.5
    assert MetricsLogger.process_value([]) == []
