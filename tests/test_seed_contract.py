"""The seed nodes' call shapes, replayed unchanged against real servers, and what they stored.

Every call below is written exactly as the nodes (miners, validators, the evaluator)
make it, configured the way they are: through INFLUXDB_* and LOKI_* variables.
Metrics go to the real InfluxDB 1.6.7, logs to the Loki receiver. The last test runs
a node with no telemetry configured at all, in a clean process.
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import os
import subprocess
import sys
import uuid
from pathlib import Path

import numpy as np
import pytest
from loki_receiver import LokiReceiver

from telemetry_client import MetricsLogger, initialize_wandb, log_with_context, setup_loki_logger

pytestmark = pytest.mark.slow

ROOT = Path(__file__).parent.parent


@pytest.fixture
def receiver():
    with LokiReceiver() as server:
        yield server


@pytest.fixture
def node_env(monkeypatch, influx_db, receiver):
    """The environment of a node pointed at the test servers (InfluxDB 1.x: API v1)."""
    server, database = influx_db
    host, port = server.url.removeprefix("http://").split(":")
    for name in list(os.environ):
        if name.startswith(("INFLUXDB_", "LOKI_", "TELEMETRY_")):
            monkeypatch.delenv(name)
    monkeypatch.setenv("INFLUXDB_HOST", host)
    monkeypatch.setenv("INFLUXDB_PORT", port)
    monkeypatch.setenv("INFLUXDB_DATABASE", database)
    monkeypatch.setenv("INFLUXDB_API_VERSION", "1")
    monkeypatch.setenv("LOKI_URL", receiver.base_url)
    return server, database, receiver


@pytest.fixture
def closing():
    things: list = []
    yield things.append
    for thing in things:
        if hasattr(thing, "logger"):  # a LokiLogger: detach what setup installed
            for handler in list(thing.logger.handlers):
                thing.logger.removeHandler(handler)
                handler.close()
        thing.close(5)


def _rows(server, database: str, measurement: str) -> list[dict]:
    return server.rows(f'SELECT * FROM "{measurement}" GROUP BY *', database)


def test_metrics_logger_as_the_nodes_call_it(node_env, closing):
    server, database, _ = node_env
    config = argparse.Namespace(netuid=3, subtensor=argparse.Namespace(network="finney"), device="cuda")
    uid = 42
    validator = MetricsLogger(
        prefix="V", uid=uid, config=config, role="validator", group="validator", job_type="validation"
    )
    miner = MetricsLogger(
        prefix="miner",
        uid="123",
        role="miner",
        group="finney",
        job_type="training",
        max_queue_size=10_000,
        max_workers=4,
    )
    closing(validator)
    closing(miner)

    validator.log(
        measurement="validator_window_v2",
        tags={"window": 7},
        fields={"loss": np.float64(0.25), "scores": [1.0, 2.0, 4.0], "peers": np.int64(12), "ok": True},
    )
    miner.log(
        measurement="training_step",
        tags={"batch_id": "b1"},
        fields={"loss": 0.75, "learning_rate": 0.001, "gradient_norm": np.float32(1.5)},
        with_system_metrics=True,
        with_gpu_metrics=True,
    )
    miner.log("training_step", {"batch_id": "b2"}, {"loss": 0.5})  # positional, as older nodes do
    assert MetricsLogger.process_value([1, 2, 3]) == {"mean": 2.0, "min": 1.0, "max": 3.0, "median": 2.0}
    assert validator.flush(15) == 0 and miner.flush(15) == 0

    [row] = _rows(server, database, "Vvalidator_window_v2")  # prefix + measurement, as the seed writes it
    assert {k: row[k] for k in ("uid", "role", "group", "job_type", "netuid", "network", "window")} == {
        "uid": "42",
        "role": "validator",
        "group": "validator",
        "job_type": "validation",
        "netuid": "3",
        "network": "finney",
        "window": "7",
    }
    assert (row["loss"], row["peers"], row["ok"]) == (0.25, 12, 1)
    assert (row["scores_mean"], row["scores_min"], row["scores_max"]) == (7 / 3, 1.0, 4.0)
    steps = sorted(_rows(server, database, "minertraining_step"), key=lambda r: r["batch_id"])
    assert [(r["batch_id"], r["loss"], r["uid"], r["job_type"]) for r in steps] == [
        ("b1", 0.75, "123", "training"),
        ("b2", 0.5, "123", "training"),
    ]
    assert steps[0]["gradient_norm"] == 1.5 and steps[0]["learning_rate"] == 0.001
    assert validator.stats()["sent"] == 1 and miner.stats()["dropped"] == 0


def test_loki_logging_as_the_nodes_call_it(node_env, closing, monkeypatch):
    _, _, receiver = node_env
    name = f"contract.{uuid.uuid4().hex[:8]}"
    monkeypatch.setenv("TELEMETRY_ENVIRONMENT", "finney")
    logger = setup_loki_logger(service="validator", uid=str(42), version="1.4.0", logger_name=name, console=False)
    closing(logger)

    logger.log_with_context("info", "Completed training step", step=3, loss=np.float64(0.5))
    logger.log_with_context(level="warning", message="Slow peer", peer=9)
    log_with_context(level="info", message="Processing batch", batch_size=32)
    log_with_context("info", "Processing batch", batch_size=32, batch_id="abc123")
    window = 11
    ctx = functools.partial(log_with_context, level="info", window=window)
    ctx(message="Gathered gradients", peers=5)
    method_ctx = functools.partial(logger.log_with_context, level="error", window=window)
    method_ctx(message="Upload failed")
    logger.warning("Verify your local subtensor is running on port 9944")  # the seed's filter drops it
    logger.info("plain %s", "logging")
    assert logger.flush(10) == 0
    assert receiver.wait_for(7)

    entries = {entry.json()["message"]: entry for entry in receiver.entries}
    assert set(entries) == {
        "Completed training step",
        "Slow peer",
        "Processing batch",
        "Gathered gradients",
        "Upload failed",
        "plain logging",
    }
    assert len(receiver.entries) == 7  # "Processing batch" twice
    labels = entries["Slow peer"].labels
    assert {k: labels[k] for k in ("service", "environment", "uid", "version", "role", "level")} == {
        "service": "validator",
        "environment": "finney",
        "uid": "42",
        "version": "1.4.0",
        "role": "validator",
        "level": "warning",
    }
    assert entries["Completed training step"].json()["loss"] == 0.5
    assert entries["Gathered gradients"].json()["window"] == 11 and entries["Gathered gradients"].json()["peers"] == 5
    assert entries["Upload failed"].labels["level"] == "error" and entries["Upload failed"].json()["window"] == 11
    batches = [e.json() for e in receiver.entries if e.json()["message"] == "Processing batch"]
    assert sorted(b.get("batch_id", "-") for b in batches) == ["-", "abc123"]


def test_environment_label_defaults_when_not_given(node_env, closing):
    _, _, receiver = node_env
    logger = setup_loki_logger(service="miner", uid="123", version="0.1.0", console=False, logger_name="contract.env")
    closing(logger)
    logger.info("hello")
    assert logger.flush(10) == 0 and receiver.wait_for(1)
    assert receiver.entries[0].labels["environment"] == "unknown"
    assert logger.settings.setting("environment").source == "default"


def test_the_documented_example_with_environment(node_env, closing):
    _, _, receiver = node_env
    logger = setup_loki_logger(
        service="miner", uid="123", version="0.1.0", environment="finney", console=False, logger_name="contract.doc"
    )
    closing(logger)
    logger.log_with_context("info", "Completed training step", step=1, loss=0.75, duration=1.5)
    assert logger.flush(10) == 0 and receiver.wait_for(1)
    [entry] = receiver.entries
    assert entry.labels["environment"] == "finney"
    assert {k: entry.json()[k] for k in ("step", "loss", "duration")} == {"step": 1, "loss": 0.75, "duration": 1.5}


def test_initialize_wandb_as_the_nodes_call_it(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "disabled")
    config = argparse.Namespace(netuid=3, project="contract")
    run = initialize_wandb(
        run_prefix="miner_", uid="123", config=config, group="finney", job_type="training", wandb_dir=tmp_path
    )
    run.log({"loss": 0.75, "learning_rate": 0.001, "gradient_norm": 1.5})
    assert run.config["version_history"]
    run.finish()


NO_CONFIG_NODE = """
import json, logging
from telemetry_client import MetricsLogger, log_with_context, setup_loki_logger

config = {"netuid": 3}
metrics = MetricsLogger(prefix="V", uid=1, config=config, role="validator", group="validator", job_type="validation")
again = MetricsLogger(prefix="V", uid=1, role="validator")
for step in range(5):
    metrics.log(measurement="validator_window_v2", tags={"window": step}, fields={"loss": 0.5})
logger = setup_loki_logger(service="validator", uid=str(1), version="1.0")
logger.log_with_context(level="info", message="started", window=0)
log_with_context("info", "still running", step=1)
logger.info("plain")
print(json.dumps({
    "metrics": metrics.stats()["dropped_by_reason"],
    "enabled": metrics.enabled,
    "loki": logger.stats()["dropped_by_reason"],
}))
"""


def test_a_node_with_nothing_configured_starts_says_so_once_and_counts(tmp_path):
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(ROOT), "HOME": str(tmp_path)}
    result = subprocess.run(
        [sys.executable, "-c", NO_CONFIG_NODE], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report == {"metrics": {"disabled": 5}, "enabled": False, "loki": {"disabled": 3}}
    influx_notes = [line for line in result.stderr.splitlines() if "MetricsLogger is off" in line]
    loki_notes = [line for line in result.stderr.splitlines() if "Loki logging is off" in line]
    assert len(influx_notes) == 1 and "INFLUXDB_URL" in influx_notes[0] and "INFLUXDB_TOKEN" in influx_notes[0]
    assert len(loki_notes) == 1 and "LOKI_URL" in loki_notes[0]
    assert "Traceback" not in result.stderr


def test_strict_mode_refuses_to_start_without_configuration(tmp_path):
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(ROOT), "TELEMETRY_STRICT": "1"}
    code = "from telemetry_client import MetricsLogger; MetricsLogger(prefix='V', uid=1, role='validator')"
    result = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 1 and "ConfigurationError" in result.stderr and "INFLUXDB_URL" in result.stderr


def test_present_but_wrong_settings_still_raise(monkeypatch):
    from telemetry_client import ConfigurationError

    monkeypatch.setenv("INFLUXDB_URL", "influx.example.org:8086")  # no scheme
    with pytest.raises(ConfigurationError, match="https://host:8086"):
        MetricsLogger(prefix="V", uid=1, role="validator")
    monkeypatch.setenv("LOKI_URL", "https://loki.example.org")
    monkeypatch.setenv("LOKI_USERNAME", "node")
    monkeypatch.setenv("LOKI_PASSWORD", "pw")
    monkeypatch.setenv("LOKI_BEARER_TOKEN", "tok")
    with pytest.raises(ConfigurationError, match="not both"):
        setup_loki_logger(service="validator", uid="1", version="1", console=False, logger_name="contract.wrong")
    assert logging.getLogger("contract.wrong").handlers == []
