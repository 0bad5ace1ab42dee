"""Telemetry for training nodes: InfluxDB metrics, Loki logs, W&B experiment tracking.

Importing this package has no side effects: no logging configuration, no thread,
no environment read. Everything happens when you build a logger.
"""

from telemetry_client.errors import ConfigurationError
from telemetry_client.experiment_tracking import initialize_wandb
from telemetry_client.lifecycle import handle_sigterm
from telemetry_client.log_context import bind, log_context, unbind
from telemetry_client.loki import LokiHandler, log_with_context, setup_loki_logger
from telemetry_client.metrics import MetricsLogger
from telemetry_client.shipping import BufferSettings, shutdown

__version__ = "0.1.0"

__all__ = [
    "BufferSettings",
    "ConfigurationError",
    "LokiHandler",
    "MetricsLogger",
    "__version__",
    "bind",
    "handle_sigterm",
    "initialize_wandb",
    "log_context",
    "log_with_context",
    "setup_loki_logger",
    "shutdown",
    "unbind",
]
