"""The simulator's default fleet flooding a store, measured the same way by every store benchmark.

bench_flood.py and bench_stores.py both run the fleet at a target rate against a
server that tests/servers.py started, then check what the store holds; this is
the part they share: the run, the sustained rates, the CPU the server spent, the
time window to count in, and the problems every step can have whatever the store.
Kept apart from _common.py so that the caller-cost benchmarks do not import the
simulator.
"""

from __future__ import annotations

import resource
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import _common  # noqa: F401  (puts the repository and tests/ on sys.path)
import psutil

from simulator import dashboards as dash
from simulator import fleet as fl
from simulator import load
from simulator import report as rp

FLEET = {"miner": 32, "validator": 4, "aggregator": 1, "evaluator": 1}
"""The simulator's default fleet: 38 nodes."""

RAMP_SECONDS = 1.0


def child_process(name: str) -> psutil.Process | None:
    """The server this process started (tests/servers.py) whose name starts with `name`."""
    for child in psutil.Process().children(recursive=True):
        if child.name().startswith(name):
            return child
    return None


def cpu_seconds(process: psutil.Process | None) -> float:
    """User + system CPU time of `process` so far (0 when there is none)."""
    if process is None:
        return 0.0
    times = process.cpu_times()
    return times.user + times.system


def own_cpu_seconds() -> float:
    """User + system CPU time of this process so far (the Loki receiver runs here)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def sustained_rate(logged: int, target: float, load_seconds: float) -> float:
    """Records per second logged after the ramp, over the time after the ramp."""
    ramp_share = load.target_count(target, RAMP_SECONDS, RAMP_SECONDS)
    return max(0.0, logged - ramp_share) / max(0.001, load_seconds - RAMP_SECONDS)


@dataclass
class Flood:
    """One run of the default fleet and what it cost."""

    run: fl.RunIdentity
    fleet: load.FleetResult
    target_points: float
    target_lines: float
    points_per_sec: float
    lines_per_sec: float
    server_cpu: float
    own_cpu: float
    close_seconds: float

    @property
    def window(self) -> dash.TimeRange:
        """The run's time span with a minute either side: where to count what the store holds."""
        return dash.TimeRange(
            datetime.fromtimestamp(self.fleet.started_ns / 1e9, UTC) - timedelta(minutes=1),
            datetime.fromtimestamp(self.fleet.ended_ns / 1e9, UTC) + timedelta(minutes=1),
        )

    @property
    def client_drops(self) -> int:
        """Records the clients dropped (sampling excluded)."""
        return sum(sum(reasons.values()) for reasons in rp.client_drops(self.fleet).values())

    def problems(self) -> list[str]:
        """What went wrong whatever the store: a fleet error, a client drop, a target rate missed."""
        problems = []
        if self.fleet.errors:
            problems.append("fleet error: " + self.fleet.errors[0].splitlines()[-1])
        if self.client_drops:
            problems.append(f"clients dropped {self.client_drops}: {rp.client_drops(self.fleet)}")
        if self.points_per_sec < 0.95 * self.target_points or self.lines_per_sec < 0.95 * self.target_lines:
            problems.append("target rate not sustained")
        return problems


def flood(
    run: fl.RunIdentity,
    targets: fl.Targets,
    points_per_sec: float,
    lines_per_sec: float,
    seconds: float,
    processes: int,
    server: psutil.Process | None,
) -> Flood:
    """Run the default fleet at the target rates for `seconds`, timing the server's CPU around it."""
    specs = fl.build_specs(FLEET, run.seed)
    plan = fl.plan_for(specs, points_per_sec, window_seconds=2.0, duration=seconds)
    settings = load.LoadSettings(points_per_sec, lines_per_sec, seconds, ramp=RAMP_SECONDS, processes=processes)
    cpu_before = (cpu_seconds(server), own_cpu_seconds())
    started = time.monotonic()
    fleet = load.run_fleet(specs, run, plan, targets, settings)
    return Flood(
        run=run,
        fleet=fleet,
        target_points=points_per_sec,
        target_lines=lines_per_sec,
        points_per_sec=sustained_rate(fleet.points_logged, points_per_sec, fleet.load_seconds),
        lines_per_sec=sustained_rate(fleet.lines_logged, lines_per_sec, fleet.load_seconds),
        server_cpu=cpu_seconds(server) - cpu_before[0],
        own_cpu=own_cpu_seconds() - cpu_before[1],
        close_seconds=time.monotonic() - started - fleet.load_seconds,
    )
