"""Which metrics store, and so which query language, the builder writes panels and rules for.

The same dashboard and alert sources build twice: once for InfluxDB (InfluxQL, into
grafana/dashboards/) and once for VictoriaMetrics (MetricsQL, into
grafana/dashboards-victoriametrics/). The sources call backend-neutral helpers
(grafana.builder.queries, variables, alerts; grafana.alerting_src.queries); each
helper asks the dialect of `current_backend()` (grafana.builder.dialects) for the
text. Build under one backend with `building_for`:

    with building_for("victoriametrics"):
        dashboard = training.build()

A context variable rather than a module global: a build in one thread (or task)
never changes what another one writes.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Literal, get_args

Backend = Literal["influxdb", "victoriametrics"]
BACKENDS: tuple[Backend, ...] = get_args(Backend)
DEFAULT_BACKEND: Backend = "influxdb"

_current: ContextVar[Backend] = ContextVar("metrics_backend", default=DEFAULT_BACKEND)


def current_backend() -> Backend:
    """The backend the builder is writing for (InfluxDB unless inside `building_for`)."""
    return _current.get()


@contextmanager
def building_for(backend: Backend) -> Iterator[Backend]:
    """Build everything inside the block for `backend`; the previous backend is restored on exit."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown metrics backend {backend!r}: expected one of {', '.join(BACKENDS)}")
    token = _current.set(backend)
    try:
        yield backend
    finally:
        _current.reset(token)
