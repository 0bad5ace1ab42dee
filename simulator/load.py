"""Load control: pace the fleet to a target rate, across worker processes, with live progress.

Each worker process owns a slice of the nodes and its own telemetry sender thread
(one per process, as in a real deployment), paces its share of the target rate
with a linear ramp, and reports progress and its final counters to the parent over
a multiprocessing queue. Workers are started with "spawn", so a parent that runs
other threads (a test's HTTP receiver, for instance) is never forked mid-lock.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import queue as queue_module
import resource
import sys
import time
import traceback
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from simulator.fleet import NodeSpec, Plan, RunIdentity, SimNode, Targets, make_node

PROGRESS_INTERVAL = 0.5
READY_TIMEOUT = 120.0
COUNTERS = ("queued", "sent", "batches", "retries", "dropped", "pending", "bytes_sent")
# Drops that are not lost records: sampling is the caller's choice, and a non-finite value
# drops one field of a point that is still delivered (simulated miners overflow now and then).
NOT_LOSS = frozenset({"sampled_out", "non_finite"})


@dataclass(frozen=True)
class LoadSettings:
    """The target load: rates are totals for the whole fleet."""

    points_per_sec: float
    lines_per_sec: float
    duration: float
    ramp: float = 0.0
    processes: int = 1
    close_timeout: float = 30.0


def target_count(rate: float, ramp: float, elapsed: float) -> float:
    """Records due after `elapsed` seconds: the rate rises linearly over `ramp`, then holds."""
    if rate <= 0 or elapsed <= 0:
        return 0.0
    if ramp <= 0:
        return rate * elapsed
    if elapsed < ramp:
        return rate * elapsed * elapsed / (2 * ramp)
    return rate * (elapsed - ramp / 2)


def merge_stats(stats: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """Sum channel counters (and their per-key and per-reason breakdowns); keep distinct errors."""
    total: dict[str, Any] = {key: 0 for key in COUNTERS}
    total["sent_by_key"] = {}
    total["dropped_by_reason"] = {}
    total["errors"] = []
    for item in stats:
        if not item:
            continue
        for key in COUNTERS:
            total[key] += int(item.get(key, 0) or 0)
        for name in ("sent_by_key", "dropped_by_reason"):
            for key, value in (item.get(name) or {}).items():
                total[name][key] = total[name].get(key, 0) + int(value)
        for error in [item.get("last_error"), *(item.get("errors") or [])]:
            if error and error not in total["errors"] and len(total["errors"]) < 20:
                total["errors"].append(error)
    return total


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


@dataclass
class Snapshot:
    """Progress of one worker (or of the whole fleet, once summed)."""

    elapsed: float = 0.0
    points: int = 0
    lines: int = 0
    metrics: dict[str, Any] = field(default_factory=dict)
    logs: dict[str, Any] = field(default_factory=dict)


def _snapshot(nodes: Sequence[SimNode], elapsed: float, points: int, lines: int, detail: bool) -> Snapshot:
    metric_stats, log_stats = zip(*(node.stats() for node in nodes), strict=True) if nodes else ((), ())
    metrics, logs = merge_stats(metric_stats), merge_stats(log_stats)
    if not detail:
        for part in (metrics, logs):
            part.pop("sent_by_key")
    return Snapshot(elapsed, points, lines, metrics, logs)


def run_nodes(
    nodes: Sequence[SimNode],
    points_per_sec: float,
    lines_per_sec: float,
    duration: float,
    ramp: float,
    close_timeout: float,
    on_progress: Callable[[Snapshot], None] | None = None,
) -> dict[str, Any]:
    """Pace `nodes` to the rates for `duration` seconds, then finish, close and count.

    Nodes tick round-robin, so every node advances at the same pace and windows stay
    aligned across the fleet. Ctrl-C stops the load early; what was logged is still
    delivered and counted.
    """
    cpu_before = _cpu_seconds()
    loggers = [node for node in nodes if node.logger is not None]
    if not loggers:
        lines_per_sec = 0.0
    points = lines = 0
    i = j = 0
    start = time.monotonic()
    for node in nodes:
        node.load_started = start  # injected faults count their start from here
    next_report = start + PROGRESS_INTERVAL
    interrupted = False
    try:
        while nodes:
            now = time.monotonic()
            elapsed = now - start
            if elapsed >= duration:
                break
            want_points = target_count(points_per_sec, ramp, elapsed)
            want_lines = target_count(lines_per_sec, ramp, elapsed)
            budget = 1000  # re-read the clock and report progress at least every 1000 records
            # Lines get their share of the budget first, so a fleet that falls behind on
            # points still writes logs in proportion.
            share = budget * lines_per_sec // (points_per_sec + lines_per_sec) + 1 if lines_per_sec else 0
            while lines < want_lines and share > 0:
                lines += loggers[j].log_line()
                j = j + 1 if j + 1 < len(loggers) else 0
                share -= 1
                budget -= 1
            while points < want_points and budget > 0:
                points += nodes[i].tick()
                i = i + 1 if i + 1 < len(nodes) else 0
                budget -= 1
            while lines < want_lines and budget > 0:
                lines += loggers[j].log_line()
                j = j + 1 if j + 1 < len(loggers) else 0
                budget -= 1
            if on_progress is not None and now >= next_report:
                on_progress(_snapshot(nodes, elapsed, points, lines, detail=False))
                next_report = now + PROGRESS_INTERVAL
            if budget > 0:
                # Caught up: sleep until about the next record is due (bounded for a smooth pace).
                rate = max(points_per_sec + lines_per_sec, 1.0)
                time.sleep(min(0.01, max(0.0005, 1.0 / rate)))
    except KeyboardInterrupt:
        interrupted = True
    load_seconds = time.monotonic() - start
    at_end = _snapshot(nodes, load_seconds, points, lines, detail=False)
    for node in nodes:
        node.finish()
    deadline = time.monotonic() + close_timeout
    for node in nodes:
        node.close(max(0.1, deadline - time.monotonic()))
    final = _snapshot(nodes, load_seconds, points, lines, detail=True)
    return {
        "points_logged": sum(node.points for node in nodes),
        "lines_logged": lines,
        "load_seconds": load_seconds,
        "close_seconds": time.monotonic() - start - load_seconds,
        # Records still buffered when the load stopped: a backlog that grows means delivery falls behind.
        "pending_at_end": at_end.metrics["pending"] + at_end.logs["pending"],
        "metrics": final.metrics,
        "logs": final.logs,
        "cpu_seconds": _cpu_seconds() - cpu_before,
        "interrupted": interrupted,
    }


@dataclass(frozen=True)
class WorkerTask:
    """What one worker process needs to build and run its nodes."""

    index: int
    specs: tuple[NodeSpec, ...]
    run: RunIdentity
    plan: Plan
    targets: Targets
    points_per_sec: float
    lines_per_sec: float
    duration: float
    ramp: float
    close_timeout: float


def _worker_main(task: WorkerTask, results: Any, go: Any) -> None:
    """Worker process entry point: build nodes, wait for the common start, run, report."""
    try:
        nodes = [make_node(spec, task.run, task.plan, task.targets) for spec in task.specs]
        results.put(("ready", task.index, None))
        go.wait()

        def report(snapshot: Snapshot) -> None:
            results.put(("progress", task.index, asdict(snapshot)))

        outcome = run_nodes(
            nodes,
            task.points_per_sec,
            task.lines_per_sec,
            task.duration,
            task.ramp,
            task.close_timeout,
            report,
        )
        results.put(("final", task.index, outcome))
    except BaseException:
        results.put(("error", task.index, traceback.format_exc()))


@dataclass
class FleetResult:
    """What the fleet did, from the client's own counters, summed over all processes."""

    run: RunIdentity
    started_ns: int
    ended_ns: int
    load_seconds: float
    points_logged: int
    lines_logged: int
    metrics: dict[str, Any]
    logs: dict[str, Any]
    cpu_seconds: float
    processes: int
    nodes: int
    interrupted: bool = False
    errors: list[str] = field(default_factory=list)
    pending_at_end: int = 0

    @property
    def points_per_sec(self) -> float:
        return self.points_logged / self.load_seconds if self.load_seconds else 0.0

    @property
    def lines_per_sec(self) -> float:
        return self.lines_logged / self.load_seconds if self.load_seconds else 0.0


def split(specs: Sequence[NodeSpec], parts: int) -> list[tuple[NodeSpec, ...]]:
    """Deal the nodes round-robin over `parts` workers (each role spreads evenly)."""
    parts = max(1, min(parts, len(specs)))
    return [tuple(specs[k::parts]) for k in range(parts)]


def _combine(outcomes: Sequence[dict[str, Any]]) -> dict[str, Any]:
    return {
        "pending_at_end": sum(o["pending_at_end"] for o in outcomes),
        "points_logged": sum(o["points_logged"] for o in outcomes),
        "lines_logged": sum(o["lines_logged"] for o in outcomes),
        "load_seconds": max((o["load_seconds"] for o in outcomes), default=0.0),
        "metrics": merge_stats(o["metrics"] for o in outcomes),
        "logs": merge_stats(o["logs"] for o in outcomes),
        "cpu_seconds": sum(o["cpu_seconds"] for o in outcomes),
        "interrupted": any(o["interrupted"] for o in outcomes),
    }


def run_fleet(
    specs: Sequence[NodeSpec],
    run: RunIdentity,
    plan: Plan,
    targets: Targets,
    settings: LoadSettings,
    progress: ProgressView | None = None,
) -> FleetResult:
    """Run the whole fleet: in this process (processes=0) or in worker processes."""
    if settings.processes <= 0:
        return _run_in_process(specs, run, plan, targets, settings, progress)
    slices = split(specs, settings.processes)
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    go = ctx.Event()
    workers = []
    for index, part in enumerate(slices):
        share = len(part) / len(specs)
        task = WorkerTask(
            index,
            part,
            run,
            plan,
            targets,
            settings.points_per_sec * share,
            settings.lines_per_sec * share,
            settings.duration,
            settings.ramp,
            settings.close_timeout,
        )
        process = ctx.Process(target=_worker_main, args=(task, results, go), name=f"simulator-worker-{index}")
        process.start()
        workers.append(process)
    errors: list[str] = []
    finals: dict[int, dict[str, Any]] = {}
    started_ns = time.time_ns()
    dead: set[int] = set()
    try:
        ready = 0
        deadline = time.monotonic() + READY_TIMEOUT
        while ready + len(errors) < len(workers):
            kind, index, payload = _get(results, workers, deadline, dead)
            if kind == "ready":
                ready += 1
            elif kind == "error":
                errors.append(f"worker {index}: {payload}")
        started_ns = time.time_ns()
        go.set()
        while len(finals) + len(errors) < len(workers):
            kind, index, payload = _get(results, workers, None, dead)
            if kind == "progress":
                if progress is not None:
                    progress.update(Snapshot(**payload), index)
            elif kind == "final":
                finals[index] = payload
            elif kind == "error":
                errors.append(f"worker {index}: {payload}")
    except KeyboardInterrupt:
        # The workers got the same SIGINT; wait for their final counters.
        while len(finals) + len(errors) < len(workers):
            try:
                kind, index, payload = _get(results, workers, time.monotonic() + settings.close_timeout + 10, dead)
            except TimeoutError:
                break
            if kind == "final":
                finals[index] = payload
            elif kind == "error":
                errors.append(f"worker {index}: {payload}")
    ended_ns = time.time_ns()
    for process in workers:
        process.join(timeout=10)
        if process.is_alive():
            process.terminate()
            process.join()
    combined = _combine(list(finals.values()))
    return FleetResult(
        run=run,
        started_ns=started_ns,
        ended_ns=ended_ns,
        processes=len(workers),
        nodes=len(specs),
        errors=errors,
        **combined,
    )


def _get(
    results: Any, workers: Sequence[Any], deadline: float | None, dead: set[int] | None = None
) -> tuple[str, int, Any]:
    """Next message from a worker; a worker that died without a word becomes an error (once)."""
    dead = set() if dead is None else dead
    while True:
        try:
            return results.get(timeout=0.25)
        except queue_module.Empty:
            pass
        crashed = [i for i, w in enumerate(workers) if w.exitcode not in (None, 0) and i not in dead]
        if crashed:
            try:
                return results.get(timeout=0.5)
            except queue_module.Empty:
                dead.add(crashed[0])
                code = workers[crashed[0]].exitcode
                return ("error", crashed[0], f"exited with code {code} without reporting (see its stderr)")
        if deadline is not None and time.monotonic() > deadline:
            raise TimeoutError("worker processes did not report in time")


def _sum_snapshots(snapshots: Iterable[Snapshot]) -> Snapshot:
    items = list(snapshots)
    return Snapshot(
        elapsed=max((s.elapsed for s in items), default=0.0),
        points=sum(s.points for s in items),
        lines=sum(s.lines for s in items),
        metrics=merge_stats(s.metrics for s in items),
        logs=merge_stats(s.logs for s in items),
    )


def _run_in_process(
    specs: Sequence[NodeSpec],
    run: RunIdentity,
    plan: Plan,
    targets: Targets,
    settings: LoadSettings,
    progress: ProgressView | None,
) -> FleetResult:
    nodes = [make_node(spec, run, plan, targets) for spec in specs]
    started_ns = time.time_ns()
    outcome = run_nodes(
        nodes,
        settings.points_per_sec,
        settings.lines_per_sec,
        settings.duration,
        settings.ramp,
        settings.close_timeout,
        progress.update if progress is not None else None,
    )
    outcome.pop("close_seconds")
    return FleetResult(
        run=run, started_ns=started_ns, ended_ns=time.time_ns(), processes=0, nodes=len(specs), **outcome
    )


class ProgressView:
    """Live progress on stderr with rich: achieved rates, queue depth, retries, drops."""

    def __init__(self, settings: LoadSettings, enabled: bool | None = None) -> None:
        from rich.console import Console

        self.settings = settings
        self.console = Console(stderr=True)
        self.enabled = self.console.is_terminal if enabled is None else enabled
        self._live: Any = None
        self._workers: dict[int, Snapshot] = {}
        self._rates: dict[int, tuple[float, float]] = {}

    def __enter__(self) -> ProgressView:
        if self.enabled:
            from rich.live import Live

            self._live = Live(self._render(None), console=self.console, auto_refresh=False, transient=False)
            self._live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._live is not None:
            with contextlib.suppress(Exception):
                self._live.__exit__(None, None, None)
            self._live = None

    def update(self, snapshot: Snapshot, worker: int = 0) -> None:
        """A worker's latest snapshot; rates are taken per worker, then added up."""
        previous = self._workers.get(worker)
        self._workers[worker] = snapshot
        if previous is not None and snapshot.elapsed > previous.elapsed:
            dt = snapshot.elapsed - previous.elapsed
            self._rates[worker] = ((snapshot.points - previous.points) / dt, (snapshot.lines - previous.lines) / dt)
        if self._live is not None:
            self._live.update(self._render(_sum_snapshots(self._workers.values())), refresh=True)

    def _render(self, snapshot: Snapshot | None) -> Any:
        from rich.table import Table

        s = self.settings
        table = Table(title="simulated fleet", expand=False)
        for column in ("elapsed", "points/s (target)", "lines/s (target)", "sent", "queue", "retries", "dropped"):
            table.add_column(column, justify="right")
        if snapshot is None:
            table.add_row(f"0/{s.duration:.0f}s", "-", "-", "-", "-", "-", "-")
            return table
        m, lg = snapshot.metrics, snapshot.logs
        points_rate = sum(rate[0] for rate in self._rates.values())
        lines_rate = sum(rate[1] for rate in self._rates.values())
        lost = sum(
            count
            for part in (m, lg)
            for reason, count in (part.get("dropped_by_reason") or {}).items()
            if reason not in NOT_LOSS
        )
        table.add_row(
            f"{snapshot.elapsed:.1f}/{s.duration:.0f}s",
            f"{points_rate:,.0f} / {s.points_per_sec:,.0f}",
            f"{lines_rate:,.0f} / {s.lines_per_sec:,.0f}",
            f"{m.get('sent', 0):,} + {lg.get('sent', 0):,}",
            f"{m.get('pending', 0):,} + {lg.get('pending', 0):,}",
            f"{m.get('retries', 0) + lg.get('retries', 0):,}",
            f"{lost:,}",
        )
        return table


def default_processes() -> int:
    """One worker per core, at most 4: the sender thread of each needs its own GIL."""
    return max(1, min(4, os.cpu_count() or 1))


def progress_enabled(quiet: bool) -> bool:
    return not quiet and sys.stderr.isatty()
