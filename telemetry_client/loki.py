"""Structured logging to Loki on the shared shipping engine.

`LokiHandler` is a `logging.Handler` whose `emit()` only captures the record on
the calling thread (message, context, exception text) and appends it to the
channel's buffer: it never touches the network and never raises. The JSON line,
batching, gzip, retries and partial-rejection handling happen on the engine's
sender thread.

`setup_loki_logger` configures a named logger for a node (labels, console,
filters) and returns a `LokiLogger` with `log_with_context`. Importing this
module configures nothing and reads no environment variable.
"""

from __future__ import annotations

import base64
import logging
import os
import socket
import urllib.parse
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from telemetry_client.console import console_handler, default_filters
from telemetry_client.errors import ConfigurationError
from telemetry_client.log_context import current_context
from telemetry_client.loki_limits import DEFAULT_MAX_LINE_BYTES, check_max_line_bytes, validate_labels
from telemetry_client.loki_sink import LokiSink
from telemetry_client.metrics import LOOPBACK_HOSTS
from telemetry_client.self_log import warn
from telemetry_client.shipping import BufferSettings, Channel
from telemetry_client.transport import HttpTransport

PUSH_PATH = "/loki/api/v1/push"
CONTEXT_ATTR = "_loki_context"  # where log_with_context puts its fields on the LogRecord
ENV_URL = "LOKI_URL"
ENV_USERNAME = "LOKI_USERNAME"
ENV_PASSWORD = "LOKI_PASSWORD"
ENV_BEARER_TOKEN = "LOKI_BEARER_TOKEN"
ENV_TENANT_ID = "LOKI_TENANT_ID"
OWN_LOGGER = "telemetry_client"
_SETUP_MARK = "_telemetry_client_setup"

# Attributes every LogRecord has; anything else on a record came from `extra=`.
_RECORD_ATTRS = frozenset(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {
    "message",
    "asctime",
    "taskName",
    CONTEXT_ATTR,
    "markup",  # rich's per-record options
    "highlighter",
}
_BASE_ATTR_COUNT = len(logging.LogRecord("", 0, "", 0, "", (), None).__dict__)
_exception_formatter = logging.Formatter()
_LEVEL_ALIASES = {"WARN": logging.WARNING, "FATAL": logging.CRITICAL}


def push_url(url: str) -> str:
    """The push endpoint for `url`: a full push URL is kept, a base URL gets /loki/api/v1/push appended."""
    parsed = urllib.parse.urlsplit(url.strip())
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise ConfigurationError(f"Loki URL must look like https://loki.example.org:3100, got {url!r}")
    path = parsed.path.rstrip("/")
    if path.endswith("/api/prom/push"):
        raise ConfigurationError(
            "the /api/prom/push endpoint was removed from Loki; use the base URL or .../loki/api/v1/push"
        )
    if not path.endswith(PUSH_PATH):
        path += PUSH_PATH
    return urllib.parse.urlunsplit((parsed.scheme, parsed.netloc, path, parsed.query, ""))


def _split_credentials(url: str) -> tuple[str, tuple[str, str] | None]:
    """Move user:password out of a URL so it is never shown with it."""
    parsed = urllib.parse.urlsplit(url)
    if parsed.username is None:
        return url, None
    netloc = parsed.hostname or ""
    if ":" in netloc:
        netloc = f"[{netloc}]"
    if parsed.port is not None:
        netloc += f":{parsed.port}"
    clean = urllib.parse.urlunsplit((parsed.scheme, netloc, parsed.path, parsed.query, parsed.fragment))
    user = urllib.parse.unquote(parsed.username)
    return clean, (user, urllib.parse.unquote(parsed.password or ""))


def level_number(level: int | str) -> int:
    """A numeric level from an int or a name ("info", "WARNING", "warn"); unknown names log at INFO."""
    if isinstance(level, int):
        return level
    name = str(level).upper()
    number = logging.getLevelNamesMapping().get(name, _LEVEL_ALIASES.get(name))
    if number is None:
        warn.once(f"loki:level:{name}", "unknown log level %r: logging at INFO", level)
        return logging.INFO
    return number


class LokiHandler(logging.Handler):
    """Ships records to Loki in batches without ever blocking or raising in the logging call.

    Constructor-compatible with python-logging-loki's `LokiHandler(url, tags, auth, version)`:
    `tags` are static stream labels (validated; a bad name raises ConfigurationError),
    `auth` is a (user, password) tuple for basic auth, and version "1" (the only
    push API current Loki has) is the default. Every stream also gets a `level`
    label (debug/info/warning/error/critical). Per-record values never become
    labels: `extra=` fields (python-logging-loki's `extra={"tags": ...}` included)
    go into the JSON line.

    If a formatter is set, its output becomes the line's `message` (formatted on
    the logging thread); otherwise the message is `record.getMessage()`.
    """

    def __init__(
        self,
        url: str,
        tags: Mapping[str, Any] | None = None,
        auth: tuple[str, str] | None = None,
        version: str | None = "1",
        *,
        bearer_token: str | None = None,
        tenant_id: str | None = None,
        headers: Mapping[str, str] | None = None,
        verify_tls: bool = True,
        ca_certs: str | None = None,
        level: int = logging.NOTSET,
        buffer: BufferSettings | None = None,
        max_line_bytes: int = DEFAULT_MAX_LINE_BYTES,
        structured_metadata: bool = False,
        compress: bool = True,
        connect_timeout: float = 3.0,
        read_timeout: float = 10.0,
        close_timeout: float = 5.0,
    ) -> None:
        if version is not None and str(version) != "1":
            raise ConfigurationError(
                f"Loki push API version {version!r} is not supported: "
                "only '1' (/loki/api/v1/push) exists in current Loki"
            )
        labels = validate_labels(tags or {})
        url, url_auth = _split_credentials(push_url(url))
        auth = auth or url_auth
        request_headers = {"Content-Type": "application/json"}
        if auth is not None:
            if not (isinstance(auth, tuple | list) and len(auth) == 2):
                raise ConfigurationError("auth must be a (username, password) tuple")
            if bearer_token:
                raise ConfigurationError("give either basic auth (username/password) or a bearer token, not both")
            credentials = base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode()
            request_headers["Authorization"] = f"Basic {credentials}"
        elif bearer_token:
            request_headers["Authorization"] = f"Bearer {bearer_token}"
        if tenant_id:
            request_headers["X-Scope-OrgID"] = str(tenant_id)
        request_headers.update(headers or {})
        parsed = urllib.parse.urlsplit(url)
        if "Authorization" in request_headers and parsed.scheme == "http" and parsed.hostname not in LOOPBACK_HOSTS:
            warn.once(
                f"loki:plaintext:{parsed.hostname}",
                "Loki credentials will be sent unencrypted to %s (http://); use https://",
                parsed.hostname,
            )
        super().__init__(level)
        self.url = url
        self.labels = labels
        self.close_timeout = close_timeout
        transport = HttpTransport(
            url,
            request_headers,
            verify_tls=verify_tls,
            ca_certs=ca_certs,
            connect_timeout=connect_timeout,
            read_timeout=read_timeout,
            compress=compress,
        )
        self._sink = LokiSink(transport, labels, check_max_line_bytes(max_line_bytes), structured_metadata)
        self._channel = Channel(self._sink, buffer)
        self._submit = self._channel.submit
        self._engine = self._channel._engine
        self._closed = False

    def __repr__(self) -> str:
        return f"<LokiHandler {self.url} labels={self.labels} ({logging.getLevelName(self.level)})>"

    def handle(self, record: logging.LogRecord) -> logging.LogRecord | bool:
        """Filter and emit without the handler lock: emit() only appends to a thread-safe buffer."""
        result = self.filter(record)
        if isinstance(result, logging.LogRecord):
            record = result
        if result:
            self.emit(record)
        return result

    def emit(self, record: logging.LogRecord) -> None:
        """Capture the record on this thread and queue it. Never blocks on I/O, never raises."""
        try:
            name = record.name
            if self._closed or name.startswith(OWN_LOGGER) or self._engine.is_sender_thread():
                return  # the client's own warnings and the sender thread's records would recurse
            if self.formatter is not None:
                message = self.format(record)
            elif not record.args and type(record.msg) is str:
                message = record.msg
            else:
                message = record.getMessage()
            exception = record.exc_text
            if record.exc_info and not exception:
                exception = record.exc_text = _exception_formatter.formatException(record.exc_info)
            attrs = record.__dict__
            extra = None
            if len(attrs) > _BASE_ATTR_COUNT:
                names = attrs.keys() - _RECORD_ATTRS
                if names:
                    extra = {k: attrs[k] for k in names}
            bound = current_context()
            self._submit(
                (
                    int(record.created * 1e9),
                    record.levelno,
                    record.levelname,
                    name,
                    message,
                    exception,
                    record.stack_info,
                    record.process,
                    record.threadName,
                    bound or None,
                    extra,
                    attrs.get(CONTEXT_ATTR),
                )
            )
        except Exception:
            self.handleError(record)

    @property
    def channel(self) -> Channel:
        """The engine channel (for `MetricsLogger.watch` and `stats()`)."""
        return self._channel

    @property
    def truncated(self) -> int:
        """Lines shortened to fit max_line_bytes (delivered with a marker, not dropped)."""
        return self._sink.truncated

    def stats(self) -> dict[str, Any]:
        """The channel's counters, `truncated` included."""
        return self._channel.stats()

    def flush(self, timeout: float | None = None) -> int:
        """Deliver what is buffered, waiting at most `timeout` s (default close_timeout); return what is left."""
        return self._channel.flush(self.close_timeout if timeout is None else timeout)

    def close(self, timeout: float | None = None) -> int:
        """Deliver what is buffered within `timeout` s, then stop; return how many records were left undelivered."""
        left = 0
        if not self._closed:
            self._closed = True
            left = self._channel.close(self.close_timeout if timeout is None else timeout)
            self._sink.transport.close()
        super().close()
        return left


class LokiLogger(logging.LoggerAdapter):
    """The logger `setup_loki_logger` returns: a standard logger plus `log_with_context`."""

    def __init__(
        self,
        logger: logging.Logger,
        loki_handler: LokiHandler | None = None,
        console: logging.Handler | None = None,
    ) -> None:
        super().__init__(logger, {})
        self.loki_handler = loki_handler
        self.console = console

    def process(self, msg: Any, kwargs: Any) -> tuple[Any, Any]:
        return msg, kwargs  # keep the caller's extra= (the base class would replace it)

    def log_with_context(self, level: int | str, message: str, /, **context: Any) -> None:
        """Log `message` at `level` ("info", logging.INFO, ...) with `context` fields in the JSON line."""
        _log_with_context(self.logger, level, message, context, stacklevel=3)

    def stats(self) -> dict[str, Any]:
        return self.loki_handler.stats() if self.loki_handler else {}

    def flush(self, timeout: float | None = None) -> int:
        return self.loki_handler.flush(timeout) if self.loki_handler else 0

    def close(self, timeout: float | None = None) -> int:
        return self.loki_handler.close(timeout) if self.loki_handler else 0


def _log_with_context(
    logger: logging.Logger, level: int | str, message: str, context: dict[str, Any], stacklevel: int
) -> None:
    levelno = level_number(level)
    if logger.isEnabledFor(levelno):
        logger.log(levelno, message, extra={CONTEXT_ATTR: context}, stacklevel=stacklevel)


_current: LokiLogger | None = None


def log_with_context(level: int | str, message: str, /, **context: Any) -> None:
    """Log through the logger most recently returned by `setup_loki_logger` (the root logger before that)."""
    logger = _current.logger if _current is not None else logging.getLogger()
    _log_with_context(logger, level, message, context, stacklevel=3)


def _env(name: str, value: str | None) -> str | None:
    return value if value is not None else os.environ.get(name) or None


def _remove_previous(logger: logging.Logger, timeout: float) -> None:
    """Detach and close the handlers an earlier setup installed on `logger`."""
    for handler in list(logger.handlers):
        if getattr(handler, _SETUP_MARK, False):
            logger.removeHandler(handler)
            if isinstance(handler, LokiHandler):
                handler.close(timeout)
            else:
                handler.close()


def setup_loki_logger(
    service: str,
    uid: str | int | None,
    version: str | None,
    environment: str | None,
    url: str | None = None,
    *,
    username: str | None = None,
    password: str | None = None,
    bearer_token: str | None = None,
    tenant_id: str | None = None,
    verify_tls: bool = True,
    ca_certs: str | None = None,
    labels: Mapping[str, Any] | None = None,
    level: int | str = logging.INFO,
    console: bool = True,
    filters: Iterable[logging.Filter | Callable[[logging.LogRecord], bool]] | None = None,
    buffer: BufferSettings | None = None,
    max_line_bytes: int = DEFAULT_MAX_LINE_BYTES,
    structured_metadata: bool = False,
    metrics_logger: Any = None,
    role: str | None = None,
    host: str | None = None,
    logger_name: str | None = None,
    enabled: bool = True,
    close_timeout: float = 5.0,
) -> LokiLogger:
    """Configure logger `logger_name` (default: `service`) to ship to Loki and print to the console.

    Stream labels: service, environment, host, level, uid, role (default: service),
    version and the validated extra `labels`; everything else goes in the JSON line.
    The URL comes from `url` or LOKI_URL (a base URL or the full push URL);
    credentials from the arguments or LOKI_USERNAME/LOKI_PASSWORD, LOKI_BEARER_TOKEN,
    and LOKI_TENANT_ID; all read now. With no URL this raises ConfigurationError
    unless `enabled=False` (console only). Calling it again for the same logger
    replaces (and closes) the handlers the previous call installed.
    `filters` default to dropping the subtensor "Verify your local subtensor" warning;
    pass [] for none.
    """
    if not service:
        raise ConfigurationError("service is required (e.g. 'miner')")
    fixed = {
        "service": service,
        "environment": environment,
        "host": host or socket.gethostname(),
        "uid": uid,
        "role": role or service,
        "version": version,
    }
    extra_labels = dict(labels or {})
    clash = sorted(set(extra_labels) & (set(fixed) | {"level"}))
    if clash:
        raise ConfigurationError(f"labels= cannot redefine the standard labels {clash}; pass them as arguments")
    stream_labels = validate_labels({**fixed, **extra_labels})
    levelno = level_number(level)
    filter_list = default_filters() if filters is None else list(filters)

    loki_handler = None
    if enabled:
        url = _env(ENV_URL, url)
        if not url:
            raise ConfigurationError(
                f"no Loki URL: pass url= or set {ENV_URL} (e.g. https://loki.example.org:3100), "
                "or pass enabled=False for console-only logging"
            )
        username = _env(ENV_USERNAME, username)
        password = _env(ENV_PASSWORD, password)
        if bool(username) != bool(password):
            raise ConfigurationError("Loki basic auth needs both username and password (or LOKI_USERNAME/PASSWORD)")
        loki_handler = LokiHandler(
            url,
            stream_labels,
            (username, password) if username and password else None,
            bearer_token=_env(ENV_BEARER_TOKEN, bearer_token),
            tenant_id=_env(ENV_TENANT_ID, tenant_id),
            verify_tls=verify_tls,
            ca_certs=ca_certs,
            buffer=buffer,
            max_line_bytes=max_line_bytes,
            structured_metadata=structured_metadata,
            close_timeout=close_timeout,
        )
    console_out = console_handler(levelno) if console else None

    logger = logging.getLogger(service if logger_name is None else logger_name)
    _remove_previous(logger, close_timeout)
    for handler in (loki_handler, console_out):
        if handler is None:
            continue
        for log_filter in filter_list:
            handler.addFilter(log_filter)
        setattr(handler, _SETUP_MARK, True)
        logger.addHandler(handler)
    logger.setLevel(levelno)
    if console:
        logger.propagate = False  # the console handler prints it; a root handler would print it twice
    if metrics_logger is not None and loki_handler is not None:
        metrics_logger.watch(loki_handler.channel)

    global _current
    _current = LokiLogger(logger, loki_handler, console_out)
    return _current
