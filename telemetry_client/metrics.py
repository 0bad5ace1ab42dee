"""Metrics to InfluxDB (or VictoriaMetrics): the public home of `MetricsLogger`.

The implementation is in `telemetry_client._influx`; this module only names what
callers may rely on.
"""

from __future__ import annotations

from telemetry_client._influx.logger import MetricsLogger
from telemetry_client._influx.sink import encode_lines

# Importable from here for code written when it lived beside MetricsLogger; its home is `telemetry_client.errors`.
from telemetry_client.errors import ConfigurationError as ConfigurationError

__all__ = ["MetricsLogger", "encode_lines"]
