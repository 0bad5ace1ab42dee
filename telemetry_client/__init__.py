"""Telemetry for training nodes: InfluxDB metrics, Loki logs, W&B experiment tracking.

Importing this package has no side effects: no logging configuration, no thread,
no environment read. Everything happens when you build a logger.

What is public: the names in `__all__` and the modules `metrics`, `loki`,
`experiment_tracking`, `config`, `errors`, `catalog`, `cardinality`, `doctor` and
`testing` (an in-memory destination for a node's own tests).
Modules and packages whose name starts with `_` are the implementation.
"""

from telemetry_client._engine.lifecycle import handle_sigterm
from telemetry_client._engine.settings import TLS, Timeouts
from telemetry_client._engine.shipping import BufferSettings, shutdown
from telemetry_client._loki.context import bind, log_context, unbind
from telemetry_client.errors import ConfigurationError
from telemetry_client.experiment_tracking import initialize_wandb
from telemetry_client.loki import LokiHandler, log_with_context, setup_loki_logger
from telemetry_client.metrics import Connection, MetricsLogger

__version__ = "0.1.0"

__all__ = [
    "TLS",
    "BufferSettings",
    "ConfigurationError",
    "Connection",
    "LokiHandler",
    "MetricsLogger",
    "Timeouts",
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
