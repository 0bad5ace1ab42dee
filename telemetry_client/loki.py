"""Logs to Loki and the console: the public home of `LokiHandler` and `setup_loki_logger`.

The implementation is in `telemetry_client._loki`; this module only names what
callers may rely on: the handler, the node logger set-up, `log_with_context`, the
push-URL rule, the `TLS` and `Timeouts` settings objects the handler takes (the
same classes as a MetricsLogger's), and the console handler and message filters `setup_loki_logger`
installs (for use with other handlers).
"""

from __future__ import annotations

from telemetry_client._engine.settings import TLS, Timeouts
from telemetry_client._loki.console import DropMessagesMatching, NoSubtensorWarning, OneLineFormatter, console_handler
from telemetry_client._loki.handler import LokiHandler, LokiLogger, log_with_context, push_url, setup_loki_logger

__all__ = [
    "TLS",
    "DropMessagesMatching",
    "LokiHandler",
    "LokiLogger",
    "NoSubtensorWarning",
    "OneLineFormatter",
    "Timeouts",
    "console_handler",
    "log_with_context",
    "push_url",
    "setup_loki_logger",
]
