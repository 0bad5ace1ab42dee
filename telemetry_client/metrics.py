"""Metrics to InfluxDB (or VictoriaMetrics): the public home of `MetricsLogger` and its `Connection`.

`TLS` and `Timeouts`, which the Loki handlers take too, are named here as well
so that everything a MetricsLogger is built from imports from one place.

The implementation is in `telemetry_client._influx`; this module only names what
callers may rely on.
"""

from __future__ import annotations

from telemetry_client._engine.settings import TLS, Timeouts
from telemetry_client._influx.connection import Connection
from telemetry_client._influx.logger import MetricsLogger
from telemetry_client._influx.sink import encode_lines

# Importable from here for code written when it lived beside MetricsLogger; its home is `telemetry_client.errors`.
from telemetry_client.errors import ConfigurationError as ConfigurationError

__all__ = ["TLS", "Connection", "MetricsLogger", "Timeouts", "encode_lines"]
