"""How long a process takes to end when the server cannot take what it holds.

A child logs points to a server that is down, then ends: by returning, or by a
SIGTERM. The figure is the wall time from the end's start (the child's last
statement, or the signal) to the process being gone, against
TELEMETRY_EXIT_TIMEOUT (3 s). Two kinds of "down": nothing listens (connection
refused at once), and a socket that accepts connections but never answers (every
request waits for its timeout, capped by what is left of the deadline).
"""

from __future__ import annotations

import signal
import socket
import statistics
import subprocess
import sys
import time

from _common import ROOT
from servers import free_port

from telemetry_client.config import DEFAULT_EXIT_TIMEOUT, ENV_EXIT_TIMEOUT

CHILD = r"""
import sys, time
from telemetry_client.metrics import MetricsLogger
logger = MetricsLogger(url=sys.argv[1], api_version=1, self_metrics_interval=None)
fields = {f"field_{k}": k * 0.5 for k in range(10)}
for _ in range(int(sys.argv[2])):
    logger.log("exit", fields=fields)
if sys.argv[3] == "sigterm":
    print("ready", flush=True)
    while True:
        time.sleep(0.05)
print(time.monotonic(), flush=True)
"""
ROUNDS = 3


def one_exit(url: str, points: int, ending: str) -> float:
    process = subprocess.Popen(
        [sys.executable, "-c", CHILD, url, str(points), ending],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        cwd=ROOT,
    )
    line = process.stdout.readline()
    if ending == "sigterm":
        started = time.monotonic()
        process.send_signal(signal.SIGTERM)
    else:
        started = float(line)  # CLOCK_MONOTONIC is one clock for every process on Linux
    process.wait(timeout=60)
    return time.monotonic() - started


def main() -> None:
    refused = f"http://127.0.0.1:{free_port()}"
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(1024)  # the kernel accepts connections; nobody ever reads or answers
    silent_url = f"http://127.0.0.1:{silent.getsockname()[1]}"
    deadline = f"{ENV_EXIT_TIMEOUT} {DEFAULT_EXIT_TIMEOUT:g} s"
    print(f"time from the end's start to the process being gone ({deadline}), {ROUNDS} rounds")
    print(f"{'server':10} {'ending':8} {'points':>8} {'median s':>9} {'max s':>7}")
    for name, url in (("refused", refused), ("silent", silent_url)):
        for ending in ("return", "sigterm"):
            for points in (1_000, 200_000):
                times = [one_exit(url, points, ending) for _ in range(ROUNDS)]
                print(f"{name:10} {ending:8} {points:8,} {statistics.median(times):9.2f} {max(times):7.2f}")
    silent.close()


if __name__ == "__main__":
    main()
