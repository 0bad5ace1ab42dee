"""Experiment tracking against the real wandb library, offline and disabled, no network.

Each run is checked through what wandb wrote to disk: the `.wandb` transaction log of
the offline run directory, decoded with wandb's own protobuf `Record` schema.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import struct
import subprocess
import sys
import time
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from telemetry_client import experiment_tracking as et

pytestmark = pytest.mark.slow

REPO_ROOT = Path(__file__).resolve().parents[1]
LOGGER_NAME = "telemetry_client.experiment_tracking"
# Any outbound HTTP from a test goes to a closed local port instead of the internet.
DEAD_URL = "http://127.0.0.1:9"


# ---------------------------------------------------------------------------
# Reading a `.wandb` transaction log. wandb (0.31) writes it from its Go core and no
# longer ships a Python reader, so the framing (leveldb log format: 7-byte file header
# ":W&B" + magic + version, then 32 KiB blocks of crc32/length/type records) is decoded
# here and every payload is parsed with wandb.proto's Record message.
# ---------------------------------------------------------------------------

_BLOCK = 32768
_HEADER = 7
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4


def read_records(path: Path) -> list[Any]:
    """Every protobuf Record in a `.wandb` file, checksums verified."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    ident, magic, version = struct.unpack("<4sHB", data[:_HEADER])
    assert (ident, magic, version) == (b":W&B", 0xBEE1, 0)
    records = []
    pos, pending = _HEADER, b""
    while pos + _HEADER <= len(data):
        left = _BLOCK - pos % _BLOCK
        if left < _HEADER:  # block trailer padding
            pos += left
            continue
        checksum, length, kind = struct.unpack("<IHB", data[pos : pos + _HEADER])
        if kind == 0 and length == 0:
            break  # preallocated zeros after the last record
        chunk = data[pos + _HEADER : pos + _HEADER + length]
        pos += _HEADER + length
        assert zlib.crc32(chunk, zlib.crc32(bytes([kind]))) & 0xFFFFFFFF == checksum
        pending += chunk
        if kind in (_FULL, _LAST):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
            pending = b""
    return records


def finished_records(path: Path, wait: float = 30.0) -> list[Any]:
    """The records of a finished run, once wandb's service has written its exit record.

    In-process, `run.finish()` can return before the service has flushed the log, so
    the file is re-read until the run's final `exit` record is there.
    """
    deadline = time.monotonic() + wait
    while True:
        try:
            records = read_records(path)
        except (AssertionError, struct.error, ValueError):
            records = []  # caught mid-write
        if any(r.WhichOneof("record_type") == "exit" for r in records):
            return records
        if time.monotonic() > deadline:
            raise AssertionError(f"{path} has no exit record: {[r.WhichOneof('record_type') for r in records]}")
        time.sleep(0.05)


def _key(item: Any) -> str:
    return item.key or "/".join(item.nested_key)


def history_rows(records: list[Any]) -> list[dict[str, Any]]:
    """The logged history rows, in order."""
    return [
        {_key(item): json.loads(item.value_json) for item in r.history.item}
        for r in records
        if r.WhichOneof("record_type") == "history"
    ]


def config_of(records: list[Any]) -> dict[str, Any]:
    """The run config as it stands after every update in the log."""
    config: dict[str, Any] = {}
    for r in records:
        kind = r.WhichOneof("record_type")
        updates = r.run.config.update if kind == "run" else r.config.update if kind == "config" else []
        for item in updates:
            config[_key(item)] = json.loads(item.value_json)
    return config


def run_record(records: list[Any]) -> Any:
    return next(r.run for r in records if r.WhichOneof("record_type") == "run")


def metric_records(records: list[Any]) -> list[Any]:
    return [r.metric for r in records if r.WhichOneof("record_type") == "metric"]


def offline_logs(wandb_dir: Path) -> list[Path]:
    """The `.wandb` files under `wandb_dir`, oldest run first."""
    return sorted(wandb_dir.glob("wandb/offline-run-*/run-*.wandb"), key=lambda p: p.parent.name)


# ---------------------------------------------------------------------------
# Environment: offline, silent, everything under tmp_path, nothing to the internet.
# ---------------------------------------------------------------------------


def isolated_env(root: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    env.update(
        WANDB_MODE="offline",
        WANDB_SILENT="true",
        WANDB_CONSOLE="off",
        WANDB_ERROR_REPORTING="false",
        WANDB_DISABLE_GIT="true",
        WANDB_DIR=str(root / "wb"),
        WANDB_CONFIG_DIR=str(root / "home" / "config"),
        WANDB_CACHE_DIR=str(root / "home" / "cache"),
        WANDB_DATA_DIR=str(root / "home" / "data"),
        WANDB_ARTIFACT_DIR=str(root / "home" / "artifacts"),
        HOME=str(root / "home"),
        HTTP_PROXY=DEAD_URL,
        HTTPS_PROXY=DEAD_URL,
        PYTHONPATH=os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")])),
    )
    env.update(extra)
    return env


def run_python(code: str, *args: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        [sys.executable, "-c", code, *args],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    return proc


def printed(proc: subprocess.CompletedProcess, key: str) -> str:
    """The value of a `KEY=value` line the child printed."""
    for line in proc.stdout.splitlines():
        if line.startswith(f"{key}="):
            return line.split("=", 1)[1]
    raise AssertionError(f"{key} not printed: {proc.stdout!r} {proc.stderr!r}")


@pytest.fixture
def offline(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """In-process offline W&B rooted in tmp_path; returns the W&B directory."""
    pytest.importorskip("wandb")
    for name in [k for k in os.environ if k.startswith("WANDB_")]:
        monkeypatch.delenv(name)
    for name, value in isolated_env(tmp_path).items():
        if name.startswith("WANDB_") or name.endswith("_PROXY"):
            monkeypatch.setenv(name, value)
    monkeypatch.chdir(tmp_path)
    return tmp_path / "wb"


# ---------------------------------------------------------------------------
# Two processes in a row resume one run and carry the version history across.
# ---------------------------------------------------------------------------

TRAINER = """
import sys
from telemetry_client.experiment_tracking import initialize_wandb

version, loss, step = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
run = initialize_wandb("miner", 3, {"lr": 0.01, "batch": 8}, "net-a", "miner", version=version)
run.log({"loss": loss}, step=step)
print(f"RUN_ID={run.id}")
run.finish()
"""


@dataclass
class TwoRuns:
    wandb_dir: Path
    ids: list[str]
    id_file_contents: list[str]
    logs: list[list[Any]]


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory: pytest.TempPathFactory) -> TwoRuns:
    pytest.importorskip("wandb")
    root = tmp_path_factory.mktemp("resume")
    env = isolated_env(root)
    wandb_dir = root / "wb"
    id_file = et.run_id_file(wandb_dir, "miner", 3)
    ids, contents = [], []
    for version, loss, step in (("1.0.0", "2.5", "100"), ("1.1.0", "1.5", "200")):
        proc = run_python(TRAINER, version, loss, step, env=env, cwd=root)
        ids.append(printed(proc, "RUN_ID"))
        contents.append(id_file.read_text())
    logs = [finished_records(p) for p in offline_logs(wandb_dir)]
    assert len(logs) == 2
    return TwoRuns(wandb_dir, ids, contents, logs)


def test_second_process_resumes_the_first_run(two_runs: TwoRuns) -> None:
    first, second = two_runs.ids
    assert first == second
    assert two_runs.id_file_contents[0] == two_runs.id_file_contents[1]
    assert two_runs.id_file_contents[0].strip() == first
    assert [run_record(log).run_id for log in two_runs.logs] == [first, first]
    assert run_record(two_runs.logs[0]).project == et.DEFAULT_PROJECT
    assert run_record(two_runs.logs[0]).display_name == "miner3"


def test_metrics_carry_version_and_latest_prefixes_at_the_callers_step(two_runs: TwoRuns) -> None:
    (row1,) = history_rows(two_runs.logs[0])
    (row2,) = history_rows(two_runs.logs[1])
    assert row1["v1.0.0/loss"] == 2.5
    assert row1["latest/loss"] == 2.5
    assert row1["global_step"] == 100
    assert row2["v1.1.0/loss"] == 1.5
    assert row2["latest/loss"] == 1.5
    assert row2["global_step"] == 200
    assert "v1.0.0/loss" not in row2
    assert "loss" not in row1 and "loss" not in row2


def test_every_key_is_plotted_against_global_step(two_runs: TwoRuns) -> None:
    metrics = metric_records(two_runs.logs[1])
    globs = {m.glob_name: m.step_metric for m in metrics if m.glob_name}
    assert globs == {"*": "global_step", "v1.1.0/*": "global_step", "latest/*": "global_step"}
    assert any(m.name == "global_step" for m in metrics)


def test_version_history_accumulates_across_processes(two_runs: TwoRuns) -> None:
    first, second = (config_of(log) for log in two_runs.logs)
    assert first["version_history"] == ["1.0.0"]
    assert first["current_version"] == "1.0.0"
    assert second["version_history"] == ["1.0.0", "1.1.0"]
    assert second["current_version"] == "1.1.0"
    assert second["lr"] == 0.01 and second["batch"] == 8
    assert run_record(two_runs.logs[1]).tags == ["v1.1.0"]
    state = json.loads((two_runs.wandb_dir / "wandb_run_state_miner3.json").read_text())
    assert state["version_history"] == ["1.0.0", "1.1.0"]
    assert state["last_step"] == 200


# ---------------------------------------------------------------------------
# In-process behaviour.
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("content", [b"", b"\x00\xff\xfegarbage/../\n", b"not a run id!"])
def test_damaged_run_id_file_warns_once_and_is_rewritten(
    offline: Path, caplog: pytest.LogCaptureFixture, content: bytes
) -> None:
    offline.mkdir(parents=True)
    id_file = et.run_id_file(offline, "val", 9)
    id_file.write_bytes(content)
    caplog.set_level(logging.INFO, logger=LOGGER_NAME)

    run = et.initialize_wandb("val", 9, None, "g", "validator", version="3.0")
    run.log({"score": 1.0}, step=1)
    run.finish()

    warnings = [r for r in caplog.records if r.name == LOGGER_NAME and r.levelno >= logging.WARNING]
    assert len(warnings) == 1
    assert str(id_file) in warnings[0].getMessage()
    assert id_file.read_text().strip() == run.id
    assert et._RUN_ID_RE.fullmatch(run.id)
    (log,) = offline_logs(offline)
    assert run_record(finished_records(log)).run_id == run.id
    assert not list(offline.glob("*.tmp"))


def test_log_writes_global_step_and_keeps_lower_steps(offline: Path) -> None:
    run = et.initialize_wandb("agg", 1, {"project": "from-config"}, None, None, version="v2.3")
    assert run.version == "2.3"
    run.log({"loss": 0.5}, step=10)
    run.log({"loss": 0.7}, step=3)  # a replayed, lower step
    run.log({"loss": 0.4})  # no step: after the highest seen
    run.log({"loss": 0.3, "acc": 0.9}, commit=False)
    run.log({"grad": 2.0})  # same step as the uncommitted call
    assert run.last_step == 12
    # Attributes of the wandb Run are reachable through the wrapper.
    assert run.config["current_version"] == "2.3"
    assert run.project == "from-config"
    run_id = run.id
    run.finish()

    (log,) = offline_logs(offline)
    rows = history_rows(finished_records(log))
    assert [row["global_step"] for row in rows] == [10, 3, 11, 12]
    assert [row["latest/loss"] for row in rows[:3]] == [0.5, 0.7, 0.4]
    assert rows[3]["v2.3/acc"] == 0.9 and rows[3]["v2.3/grad"] == 2.0
    assert [row["v2.3/step"] for row in rows] == [10, 3, 11, 12]
    # The caller's step never reaches W&B's own step counter.
    assert [row["_step"] for row in rows] == [0, 1, 2, 3]
    state = json.loads((offline / "wandb_run_state_agg1.json").read_text())
    assert state["run_id"] == run_id
    assert state["last_step"] == 12


def test_environment_chooses_project_and_beats_config(offline: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WANDB_PROJECT", "from-env")
    with et.initialize_wandb("ev", 2, {"project": "from-config"}, None, None, version="1") as run:
        assert run.project == "from-env"
    (log,) = offline_logs(offline)
    assert run_record(finished_records(log)).project == "from-env"


def test_config_may_be_a_namespace_or_plain_object() -> None:
    import argparse

    class Cfg:
        def __init__(self) -> None:
            self.lr = 0.1
            self._secret = "x"

    assert et._config_to_dict(argparse.Namespace(lr=0.1, project="p")) == {"lr": 0.1, "project": "p"}
    assert et._config_to_dict(Cfg()) == {"lr": 0.1}
    assert et._config_to_dict({"a": 1}) == {"a": 1}
    with pytest.raises(TypeError):
        et._config_to_dict(42)


@pytest.mark.parametrize("how", ["argument", "environment"])
def test_disabled_mode_writes_nothing(offline: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str) -> None:
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    kwargs: dict[str, Any] = {"wandb_dir": tmp_path / "never"}
    if how == "argument":
        kwargs["mode"] = "disabled"
    else:
        monkeypatch.setenv("WANDB_MODE", "disabled")
    run = et.initialize_wandb("miner", 5, {"lr": 1}, "g", "miner", version="1.0", **kwargs)
    run.log({"loss": 1.0}, step=1)
    assert run.config["version_history"] == ["1.0"]
    run.finish()
    after = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    assert after == before


def test_unknown_mode_is_rejected(offline: Path) -> None:
    with pytest.raises(ValueError, match="unknown W&B mode"):
        et.initialize_wandb("m", 1, None, None, None, mode="sometimes")


def test_missing_wandb_raises_an_install_hint(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setitem(sys.modules, "wandb", None)
    with pytest.raises(ImportError, match=r"pip install 'telemetry-stack\[wandb\]'") as info:
        et.initialize_wandb("m", 1, None, None, None, wandb_dir=tmp_path / "wb", mode="offline")
    assert isinstance(info.value, et.WandbNotInstalledError)
    assert not (tmp_path / "wb").exists()


def test_import_needs_no_wandb_and_has_no_side_effects(tmp_path: Path) -> None:
    code = (
        "import os, sys\n"
        "blocked = sys.argv[1] == 'blocked'\n"
        "if blocked:\n"
        "    sys.modules['wandb'] = None\n"
        "import telemetry_client.experiment_tracking\n"
        "assert sys.modules.get('wandb') is None\n"
        "assert not os.listdir('.'), os.listdir('.')\n"
    )
    for mode in ("blocked", "installed"):
        run_python(code, mode, env=isolated_env(tmp_path / "env"), cwd=_empty_dir(tmp_path / mode))


def _empty_dir(path: Path) -> Path:
    path.mkdir(parents=True)
    return path


class _FakeApi:
    """Stands in for wandb.Api so the existence check needs no server."""

    calls: list[tuple[int | None, str]] = []  # noqa: RUF012 - replaced per test
    error: BaseException | None = None

    def __init__(self, timeout: int | None = None, **_: Any) -> None:
        self.timeout = timeout

    def run(self, path: str) -> object:
        type(self).calls.append((self.timeout, path))
        if type(self).error is not None:
            raise type(self).error
        return object()


def _errors() -> dict[str, BaseException | None]:
    from wandb.apis.public.runs import RunNotFoundError
    from wandb.errors import AuthenticationError, CommError

    return {
        "run-not-found": RunNotFoundError("Could not find run ent/proj/abc123"),
        "comm-not-found": CommError("Could not find run abc123"),
        "network": CommError("dial tcp: connection refused"),
        "auth": AuthenticationError("Failed to verify credentials: not found"),
        "other": OSError("no route to host"),
        "none": None,
    }


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        ("run-not-found", "gone"),
        ("comm-not-found", "gone"),
        ("network", "unknown"),
        ("auth", "unknown"),
        ("other", "unknown"),
        ("none", "exists"),
    ],
)
def test_existence_check_tells_a_missing_run_from_a_network_failure(
    monkeypatch: pytest.MonkeyPatch, case: str, expected: str
) -> None:
    wandb = pytest.importorskip("wandb")
    monkeypatch.setattr(_FakeApi, "calls", [])
    monkeypatch.setattr(_FakeApi, "error", _errors()[case])
    monkeypatch.setattr(wandb, "Api", _FakeApi)
    assert et._remote_run_status(wandb, "ent", "proj", "abc123", 7) == expected
    assert _FakeApi.calls == [(7, "ent/proj/abc123")]


# ---------------------------------------------------------------------------
# Online mode with an unreachable service: training continues offline.
# ---------------------------------------------------------------------------

UNREACHABLE = """
import logging, sys
import wandb
from wandb.apis.public.runs import RunNotFoundError

class GoneApi:
    # The service answers that the stored run does not exist.
    def __init__(self, *args, **kwargs):
        pass
    def run(self, path):
        raise RunNotFoundError(f"Could not find run {path}")

wandb.Api = GoneApi
logging.basicConfig(stream=sys.stderr, format="%(name)s|%(levelname)s|%(message)s")
from telemetry_client.experiment_tracking import initialize_wandb

run = initialize_wandb("miner", 4, {}, None, None, version="1.0", init_timeout=2)
run.log({"loss": 0.25}, step=7)
print(f"RUN_ID={run.id}")
print(f"MODE={run.settings.mode}")
run.finish()
"""


def _closed_port_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def test_unreachable_service_falls_back_offline(tmp_path: Path) -> None:
    pytest.importorskip("wandb")
    env = isolated_env(
        tmp_path,
        WANDB_MODE="online",
        WANDB_BASE_URL=_closed_port_url(),
        WANDB_API_KEY="f" * 40,
    )
    wandb_dir = tmp_path / "wb"
    wandb_dir.mkdir()
    id_file = et.run_id_file(wandb_dir, "miner", 4)
    id_file.write_text("deleted1\n")

    first = run_python(UNREACHABLE, env=env, cwd=tmp_path)
    run_id = printed(first, "RUN_ID")
    assert printed(first, "MODE") == "offline"
    assert run_id != "deleted1"  # the service said the stored run is gone
    assert id_file.read_text().strip() == run_id
    fallback = [line for line in first.stderr.splitlines() if line.startswith(f"{LOGGER_NAME}|WARNING|")]
    assert len(fallback) == 1
    assert "wandb sync" in fallback[0]

    # The id was only ever used offline: not being on the service means "not synced
    # yet", so the next process keeps it instead of starting over.
    second = run_python(UNREACHABLE, env=env, cwd=tmp_path)
    assert printed(second, "RUN_ID") == run_id

    logs = offline_logs(wandb_dir)
    assert len(logs) == 2
    for log in logs:
        records = finished_records(log)
        assert run_record(records).run_id == run_id
        assert history_rows(records)[0]["latest/loss"] == 0.25
