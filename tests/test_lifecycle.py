"""Every way a training process ends delivers what it logged, checked against the real InfluxDB 1.6.7.

Each case runs a real Python process (a script written to a temporary file) that
logs through `MetricsLogger` and ends the way a user's process ends: return,
sys.exit, an uncaught exception, multiprocessing children (fork, Pool, spawn,
forkserver), SIGTERM. A long flush interval keeps the points buffered until
that end, so it is the end that must deliver them. The stored counts are checked
exactly: nothing lost, nothing sent twice.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from counters import assert_counters_add_up
from fault_server import Reply, fault_server
from servers import free_port

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
DEADLINE = 120  # seconds a child may take on a loaded machine; no test asserts timings

HEADER = """
import os, signal, sys, time
import multiprocessing as mp
import telemetry_client
from telemetry_client import BufferSettings, MetricsLogger

URL, DB = sys.argv[1], sys.argv[2]


def make_logger():
    # flush_interval 30 s: nothing leaves before the process ends (fewer points than a batch).
    return MetricsLogger(
        url=URL, database=DB, api_version=1, self_metrics_interval=None,
        buffer=BufferSettings(flush_interval=30.0),
    )


def log_points(logger, who, count):
    for i in range(count):
        logger.log("life", tags={"who": who}, fields={"i": i})
"""


_started: list[subprocess.Popen] = []


@pytest.fixture(autouse=True)
def _no_child_left_behind():
    """Whatever an assertion interrupted, every process a test started (and its children) ends with it."""
    yield
    while _started:
        process = _started.pop()
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def run_child(tmp_path: Path, body: str, url: str, database: str, env: dict | None = None) -> subprocess.Popen:
    script = tmp_path / "child.py"
    script.write_text(HEADER + textwrap.dedent(body))
    child_env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    child_env.pop("TELEMETRY_HANDLE_SIGTERM", None)
    child_env.update(env or {})
    process = subprocess.Popen(
        [sys.executable, str(script), url, database],
        env=child_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group, so that a failed test can end its children too
    )
    _started.append(process)
    return process


def finish(process: subprocess.Popen) -> tuple[int, str, str]:
    try:
        out, err = process.communicate(timeout=DEADLINE)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        out, err = process.communicate()
        pytest.fail(f"the process did not end within {DEADLINE} s: {err[-2000:]}")
    return process.returncode, out, err


def stored(server, database: str) -> dict[str, int]:
    rows = server.rows('SELECT count("i") FROM "life" GROUP BY "who"', database)
    return {row["who"]: row["count"] for row in rows}


def wait_ready(process: subprocess.Popen) -> str:
    """The child's first stdout line, written once its points are queued."""
    line = process.stdout.readline()
    if not line:
        _, _, err = finish(process)
        pytest.fail(f"the child ended before it was ready: {err[-2000:]}")
    return line.strip()


# ---- ordinary ends: atexit ------------------------------------------------------------


@pytest.mark.parametrize(
    ("ending", "expected_status"),
    [("pass", 0), ("sys.exit(5)", 5), ("raise RuntimeError('training failed')", 1)],
)
def test_return_sys_exit_and_uncaught_exception_deliver(influx_db, tmp_path, ending, expected_status):
    server, database = influx_db
    body = f"""
    logger = make_logger()
    log_points(logger, "main", 3000)
    assert logger.stats()["pending"] == 3000
    {ending}
    """
    status, _, err = finish(run_child(tmp_path, body, server.url, database))
    assert status == expected_status, err
    assert stored(server, database) == {"main": 3000}


# ---- multiprocessing children -----------------------------------------------------------


def test_fork_process_children_deliver_and_nothing_is_sent_twice(influx_db, tmp_path):
    server, database = influx_db
    body = """
    logger = make_logger()

    def work(k):
        assert logger.stats()["pending"] == 0  # the parent's points stay the parent's
        # Not in a multiprocessing child: Pool.terminate() relies on SIGTERM's default action.
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
        log_points(logger, f"child{k}", 2000)

    if __name__ == "__main__":
        ctx = mp.get_context("fork")
        log_points(logger, "parent", 100)  # buffered at the time of the forks
        children = [ctx.Process(target=work, args=(k,)) for k in range(2)]
        for child in children:
            child.start()
        for child in children:
            child.join()
        assert [child.exitcode for child in children] == [0, 0], [child.exitcode for child in children]
    """
    status, _, err = finish(run_child(tmp_path, body, server.url, database))
    assert status == 0, err
    assert stored(server, database) == {"parent": 100, "child0": 2000, "child1": 2000}


def test_fork_pool_workers_deliver(influx_db, tmp_path):
    """`close(); join()` ends the workers by a sentinel: each drains before it exits."""
    server, database = influx_db
    body = """
    logger = make_logger()

    def work(k):
        log_points(logger, f"task{k}", 500)

    if __name__ == "__main__":
        pool = mp.get_context("fork").Pool(2)
        pool.map(work, range(8))
        pool.close()
        pool.join()
    """
    status, _, err = finish(run_child(tmp_path, body, server.url, database))
    assert status == 0, err
    assert stored(server, database) == {f"task{k}": 500 for k in range(8)}


def test_tasks_that_flush_deliver_even_when_a_with_pool_block_terminates_the_workers(influx_db, tmp_path):
    """`Pool.__exit__` calls terminate(): SIGTERM's default action may end the workers with their buffers.

    A task that calls `logger.flush()` before returning has delivered its points
    before its result reaches the parent, so terminate() finds nothing to lose.
    (Without the flush, how much is lost depends on scheduling: terminate() first
    asks the idle workers to stop, and a worker that gets the request in time runs
    its exit drain; so that case is not asserted here.)
    """
    server, database = influx_db
    body = """
    logger = make_logger()

    def work(k):
        log_points(logger, f"task{k}", 500)
        logger.flush(30)

    if __name__ == "__main__":
        with mp.get_context("fork").Pool(2) as pool:
            pool.map(work, range(8))
    """
    status, _, err = finish(run_child(tmp_path, body, server.url, database))
    assert status == 0, err
    assert stored(server, database) == {f"task{k}": 500 for k in range(8)}


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_spawn_and_forkserver_children_with_their_own_logger_deliver(influx_db, tmp_path, method):
    server, database = influx_db
    body = f"""
    def work(k):
        logger = make_logger()
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # multiprocessing's terminate() needs it
        log_points(logger, f"child{{k}}", 1500)

    if __name__ == "__main__":
        ctx = mp.get_context("{method}")
        children = [ctx.Process(target=work, args=(k,)) for k in range(2)]
        for child in children:
            child.start()
        for child in children:
            child.join()
        assert [child.exitcode for child in children] == [0, 0], [child.exitcode for child in children]
    """
    status, _, err = finish(run_child(tmp_path, body, server.url, database))
    assert status == 0, err
    assert stored(server, database) == {"child0": 1500, "child1": 1500}


# ---- SIGTERM ----------------------------------------------------------------------------

SIGTERM_BODY = """
logger = make_logger()
log_points(logger, "main", 3000)
print(logger.stats()["pending"], signal.getsignal(signal.SIGTERM) is signal.SIG_DFL, flush=True)
while True:
    time.sleep(0.05)
"""


def test_sigterm_drains_and_dies_of_the_signal(influx_db, tmp_path):
    server, database = influx_db
    process = run_child(tmp_path, SIGTERM_BODY, server.url, database)
    assert wait_ready(process) == "3000 False"  # points pending, our handler in place
    process.send_signal(signal.SIGTERM)
    status, _, err = finish(process)
    assert status == -signal.SIGTERM, err
    assert stored(server, database) == {"main": 3000}


@pytest.mark.parametrize("switch", ["env", "function"])
def test_sigterm_switched_off_keeps_the_default_action(influx_db, tmp_path, switch):
    server, database = influx_db
    body = SIGTERM_BODY
    env = None
    if switch == "env":
        env = {"TELEMETRY_HANDLE_SIGTERM": "0"}
    else:
        body = "telemetry_client.handle_sigterm(False)\n" + SIGTERM_BODY
    process = run_child(tmp_path, body, server.url, database, env)
    assert wait_ready(process) == "3000 True"
    process.send_signal(signal.SIGTERM)
    status, _, err = finish(process)
    assert status == -signal.SIGTERM, err
    assert stored(server, database) == {}  # the default action: the pending points are lost


def test_application_handler_installed_later_calls_shutdown(influx_db, tmp_path):
    server, database = influx_db
    body = """
    logger = make_logger()

    def on_term(signum, frame):
        left = telemetry_client.shutdown(30)
        print("left", left, logger.stats()["sent"], flush=True)
        sys.exit(3)

    signal.signal(signal.SIGTERM, on_term)  # replaces the library's handler
    log_points(logger, "main", 3000)
    print("ready", flush=True)
    while True:
        time.sleep(0.05)
    """
    process = run_child(tmp_path, body, server.url, database)
    assert wait_ready(process) == "ready"
    process.send_signal(signal.SIGTERM)
    status, out, err = finish(process)
    assert status == 3, err
    assert out.split() == ["left", "0", "3000"]
    assert stored(server, database) == {"main": 3000}


def test_application_handler_installed_earlier_is_left_alone(influx_db, tmp_path):
    server, database = influx_db
    body = """
    def on_term(signum, frame):
        sys.exit(4)  # runs atexit: the library drains there

    signal.signal(signal.SIGTERM, on_term)
    logger = make_logger()
    log_points(logger, "main", 3000)
    print(signal.getsignal(signal.SIGTERM) is on_term, flush=True)
    while True:
        time.sleep(0.05)
    """
    process = run_child(tmp_path, body, server.url, database)
    assert wait_ready(process) == "True"
    process.send_signal(signal.SIGTERM)
    status, _, err = finish(process)
    assert status == 4, err
    assert stored(server, database) == {"main": 3000}


# ---- server down at exit ------------------------------------------------------------------


@pytest.mark.parametrize("ending", ["return", "sigterm"])
def test_server_down_at_exit_ends_the_process_and_counts_the_loss(tmp_path, ending):
    """Nothing listens on the port: the process still ends (within the exit deadline) and says what it lost."""
    url = f"http://127.0.0.1:{free_port()}"
    body = """
    import atexit

    # Registered before the logger exists, so it runs after the library's exit drain.
    atexit.register(lambda: print("dropped", logger.stats()["dropped_by_reason"], flush=True))
    logger = make_logger()
    log_points(logger, "main", 3000)
    if sys.argv[3] == "sigterm":
        print("ready", flush=True)
        while True:
            time.sleep(0.05)
    """
    env = {"TELEMETRY_EXIT_TIMEOUT": "1"}
    process = run_child(tmp_path, body.replace("sys.argv[3]", repr(ending)), url, "db", env)
    if ending == "sigterm":
        assert wait_ready(process) == "ready"
        process.send_signal(signal.SIGTERM)
        status, _, err = finish(process)
        assert status == -signal.SIGTERM, err
    else:
        status, out, err = finish(process)
        assert status == 0, err
        assert out.strip() == "dropped {'shutdown': 3000}"


def test_counters_add_up_after_the_exit_drain_against_a_server_that_never_answers(tmp_path):
    """A port that accepts and never answers: the batch in flight at the deadline is `unconfirmed`, the rest `shutdown`.

    `queued` still counts every point logged after the drain discarded the records
    not yet encoded.
    """
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(1024)  # the kernel accepts connections; nobody reads or answers
    body = """
    import atexit, json

    # Registered before the logger exists, so it runs after the library's exit drain.
    atexit.register(lambda: print(json.dumps(logger.stats()), flush=True))
    logger = MetricsLogger(url=URL, database=DB, api_version=1, self_metrics_interval=None)
    for i in range(50_000):
        logger.log("life", fields={"i": i})
    """
    try:
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        status, out, err = finish(run_child(tmp_path, body, url, "db", {"TELEMETRY_EXIT_TIMEOUT": "1"}))
    finally:
        silent.close()
    assert status == 0, err
    stats = json.loads(out.strip().splitlines()[-1])
    assert stats["queued"] == 50_000
    assert stats["unconfirmed"] > 0, "a request was in flight at the deadline"
    assert stats["dropped_by_reason"] == {"shutdown": 50_000 - stats["unconfirmed"]}
    assert (stats["sent"], stats["pending"]) == (0, 0)
    assert_counters_add_up(stats)


CLOSED = re.compile(r"closed with (\d+) items undelivered \(counted shutdown\) and (\d+) unconfirmed")


def test_sigterm_behind_a_slow_edge_reports_the_request_in_flight_unconfirmed_not_lost(influx_db, tmp_path):
    """Each request is held 1 s by a proxy in front of InfluxDB; the 2.5 s drain ends with one in flight.

    The warning must count that batch `unconfirmed` (the proxy still delivers it),
    and only the batches never sent as undelivered: the server then holds exactly
    what was logged less what was reported undelivered.
    """
    server, database = influx_db
    with fault_server(upstream=server.url) as proxy:
        proxy.then(*[Reply(204, delay=1.0)] * 20)
        body = """
        logger = MetricsLogger(url=URL, database=DB, api_version=1, self_metrics_interval=None)
        log_points(logger, "main", 20_000)  # four batches: 4 s through the proxy, more than the drain has
        print("ready", flush=True)
        while True:
            time.sleep(0.05)
        """
        process = run_child(tmp_path, body, proxy.url, database, {"TELEMETRY_EXIT_TIMEOUT": "2.5"})
        assert wait_ready(process) == "ready"
        process.send_signal(signal.SIGTERM)
        status, _, err = finish(process)
        assert status == -signal.SIGTERM, err
        assert proxy.wait_until(lambda p: len(p.requests) == p.received), "the proxy delivered what it held"
    found = CLOSED.findall(err)
    assert len(found) == 1, err[-3000:]
    undelivered, unconfirmed = map(int, found[0])
    assert unconfirmed > 0
    assert stored(server, database) == {"main": 20_000 - undelivered}


# ---- the memory bound counts records not yet encoded ----------------------------------------


def test_records_waiting_to_be_encoded_count_against_max_bytes(influx_db):
    """With the sender held up, the intake stops at what max_bytes allows and drops its oldest records."""
    from telemetry_client import BufferSettings, MetricsLogger

    server, database = influx_db
    max_bytes = 1024 * 1024
    logger = MetricsLogger(
        url=server.url,
        database=database,
        api_version=1,
        self_metrics_interval=None,
        buffer=BufferSettings(max_bytes=max_bytes, batch_bytes=256 * 1024, flush_interval=30.0),
    )
    text = "x" * 4096  # each record holds ~4 KiB the engine must account for before encoding it
    for i in range(128):  # half the bound: all of them are delivered
        logger.log("warm", fields={"text": text, "i": i})
    assert logger.flush(30) == 0  # the sender has measured a sample of these records
    channel = logger.channel
    assert 4096 <= channel._record_bytes <= 3 * 4096, channel._record_bytes

    with channel._lock:  # the sender cannot encode: every record stays raw in the intake
        for i in range(2000):
            logger.log("held", fields={"text": text + str(i), "i": i})
        kept = len(channel._intake)
        assert 0 < kept < 2000
        assert channel._intake_bytes() <= max_bytes
        assert channel._intake_drops.value == 2000 - kept

    assert logger.flush(30) == 0
    rows = server.rows('SELECT min("i"), max("i"), count("i") FROM "held"', database)
    stored_count = rows[0]["count"]
    assert 0 < stored_count <= kept
    assert (rows[0]["min"], rows[0]["max"]) == (2000 - stored_count, 1999)  # drop oldest: the newest survive
    stats = logger.stats()
    assert stats["dropped_by_reason"] == {"buffer_full": 2000 - stored_count}
    assert stats["sent"] == 128 + stored_count
    logger.close(1)
