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
import dataclasses
import logging
import socket
import urllib.parse
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from telemetry_client._engine.disabled import Counter, disabled_stats
from telemetry_client._engine.self_log import warn
from telemetry_client._engine.settings import TLS, Timeouts, combine
from telemetry_client._engine.shipping import BufferSettings, Channel
from telemetry_client._engine.transport import Destination, HttpTransport, Transport
from telemetry_client._loki.console import console_handler, default_filters
from telemetry_client._loki.context import current_context
from telemetry_client._loki.limits import DEFAULT_MAX_LINE_BYTES, check_max_line_bytes, validate_labels
from telemetry_client._loki.sink import LokiSink
from telemetry_client.config import LOOPBACK_HOSTS, LokiConfig, loki_config, split_url_credentials
from telemetry_client.errors import ConfigurationError

PUSH_PATH = "/loki/api/v1/push"
CONTEXT_ATTR = "_loki_context"  # where log_with_context puts its fields on the LogRecord
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
TLS_KEYWORDS = {"verify_tls": "verify", "ca_certs": "ca_certs"}
TIMEOUT_KEYWORDS = {"connect_timeout": "connect", "read_timeout": "read"}


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

    TLS and timeouts come as `tls=TLS(...)`, `timeouts=Timeouts(...)` (the objects
    a MetricsLogger takes) or as the flat `verify_tls`, `ca_certs`,
    `connect_timeout`, `read_timeout`; one setting given both ways is a
    `ConfigurationError`.

    `destination` replaces the server for a node's own tests (see
    `telemetry_client.testing`); `url` is then left out.
    """

    def __init__(
        self,
        url: str | None = None,
        tags: Mapping[str, Any] | None = None,
        auth: tuple[str, str] | None = None,
        version: str | None = "1",
        *,
        bearer_token: str | None = None,
        tenant_id: str | None = None,
        headers: Mapping[str, str] | None = None,
        verify_tls: bool | None = None,
        ca_certs: str | None = None,
        level: int = logging.NOTSET,
        buffer: BufferSettings | None = None,
        max_line_bytes: int = DEFAULT_MAX_LINE_BYTES,
        structured_metadata: bool = False,
        compress: bool = True,
        connect_timeout: float | None = None,
        read_timeout: float | None = None,
        close_timeout: float = 5.0,
        tls: TLS | None = None,
        timeouts: Timeouts | None = None,
        destination: Destination | None = None,
    ) -> None:
        if url is None and destination is None:
            raise ConfigurationError("LokiHandler needs the Loki url")
        if url is not None and destination is not None:
            raise ConfigurationError("LokiHandler: give url= or destination=, not both")
        if version is not None and str(version) != "1":
            raise ConfigurationError(
                f"Loki push API version {version!r} is not supported: "
                "only '1' (/loki/api/v1/push) exists in current Loki"
            )
        flat = {
            "verify_tls": verify_tls,
            "ca_certs": ca_certs,
            "connect_timeout": connect_timeout,
            "read_timeout": read_timeout,
        }
        self.tls = combine(TLS, tls, "tls", flat, TLS_KEYWORDS, "LokiHandler")
        self.timeouts = combine(Timeouts, timeouts, "timeouts", flat, TIMEOUT_KEYWORDS, "LokiHandler")
        labels = validate_labels(tags or {})
        url, url_auth = split_url_credentials(push_url(url)) if destination is None else (destination.url, None)
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
        transport: Transport
        if destination is not None:
            transport = destination.open("loki", request_headers, compress)
        else:
            transport = HttpTransport(
                url,
                request_headers,
                verify_tls=self.tls.verify is not False,
                ca_certs=self.tls.ca_certs,
                connect_timeout=self.timeouts.connect,
                read_timeout=self.timeouts.read,
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
        """Deliver what is buffered within `timeout` s, then stop; return how many were not confirmed delivered."""
        left = 0
        if not self._closed:
            self._closed = True
            left = self._channel.close(self.close_timeout if timeout is None else timeout)
            self._sink.transport.close()
        super().close()
        return left


class DisabledHandler(logging.Handler):
    """Stands in for the Loki handler when Loki is not configured: counts what it would have shipped."""

    def __init__(self, reason: str | None, level: int = logging.NOTSET) -> None:
        super().__init__(level)
        self.reason = reason
        self._count = Counter()

    def handle(self, record: logging.LogRecord) -> logging.LogRecord | bool:
        result = self.filter(record)
        if result:
            self.emit(record)
        return result

    def emit(self, record: logging.LogRecord) -> None:
        if not record.name.startswith(OWN_LOGGER):
            self._count.add()

    def stats(self) -> dict[str, Any]:
        return disabled_stats("loki", self._count.value, self.reason)


class LokiLogger(logging.LoggerAdapter):
    """The logger `setup_loki_logger` returns: a standard logger plus `log_with_context`.

    `settings` is the resolved `LokiConfig` (where each setting came from).
    """

    def __init__(
        self,
        logger: logging.Logger,
        loki_handler: LokiHandler | None = None,
        console: logging.Handler | None = None,
        settings: LokiConfig | None = None,
        disabled: DisabledHandler | None = None,
    ) -> None:
        super().__init__(logger, {})
        self.loki_handler = loki_handler
        self.console = console
        self.settings = settings
        self._disabled = disabled

    def process(self, msg: Any, kwargs: Any) -> tuple[Any, Any]:
        return msg, kwargs  # keep the caller's extra= (the base class would replace it)

    def log_with_context(self, *args: Any, **context: Any) -> None:
        """Log `message` at `level` ("info", logging.INFO, ...) with `context` fields in the JSON line.

        Called as `(level, message, **context)`, by keyword or bound with
        functools.partial; see `split_call` for how the shapes are read.
        """
        level, message, context = split_call(args, context)
        _log_with_context(self.logger, level, message, context, stacklevel=3)

    def stats(self) -> dict[str, Any]:
        """The Loki channel's counters; when Loki is off, what was given to it, counted `disabled`."""
        if self.loki_handler is not None:
            return self.loki_handler.stats()
        return self._disabled.stats() if self._disabled is not None else {}

    def flush(self, timeout: float | None = None) -> int:
        return self.loki_handler.flush(timeout) if self.loki_handler else 0

    def close(self, timeout: float | None = None) -> int:
        return self.loki_handler.close(timeout) if self.loki_handler else 0


def split_call(args: tuple[Any, ...], context: dict[str, Any]) -> tuple[int | str, Any, dict[str, Any]]:
    """Read `level` and `message` from any of the call shapes nodes use.

    `("info", "msg", k=v)`; `(level="info", message="msg", k=v)`; `("info", message="msg")`;
    and, from `functools.partial(log_with_context, level="info")`, `("msg")`.
    Given positionally, both are taken from the arguments and keyword `level` or
    `message` are ordinary context fields (written as `ctx_level`, `ctx_message`).
    """
    if len(args) >= 2:
        if len(args) > 2:
            raise TypeError(f"log_with_context takes level and message positionally, got {len(args)} arguments")
        return args[0], args[1], context
    if len(args) == 1:
        if "message" in context:
            return args[0], context.pop("message"), context
        if "level" in context:
            return context.pop("level"), args[0], context
        raise TypeError("log_with_context() missing its message")
    if "level" not in context or "message" not in context:
        raise TypeError("log_with_context() needs a level and a message, e.g. ('info', 'Processing batch')")
    return context.pop("level"), context.pop("message"), context


def _log_with_context(
    logger: logging.Logger, level: int | str, message: str, context: dict[str, Any], stacklevel: int
) -> None:
    levelno = level_number(level)
    if logger.isEnabledFor(levelno):
        logger.log(levelno, message, extra={CONTEXT_ATTR: context}, stacklevel=stacklevel)


_current: LokiLogger | None = None


def log_with_context(*args: Any, **context: Any) -> None:
    """Log through the logger most recently returned by `setup_loki_logger` (the root logger before that).

    Positional or keyword: `log_with_context("info", "msg", step=1)`,
    `log_with_context(level="info", message="msg", step=1)`, or bound with
    `functools.partial(log_with_context, level="info", window=w)(message="msg")`.
    """
    level, message, context = split_call(args, context)
    logger = _current.logger if _current is not None else logging.getLogger()
    _log_with_context(logger, level, message, context, stacklevel=3)


def _remove_previous(logger: logging.Logger, timeout: float) -> None:
    """Detach and close the handlers an earlier setup installed on `logger`."""
    for handler in list(logger.handlers):
        if getattr(handler, _SETUP_MARK, False):
            logger.removeHandler(handler)
            if isinstance(handler, LokiHandler):
                handler.close(timeout)
            else:
                handler.close()


def _destination_settings(
    destination: Destination, environment: str | None, enabled: bool, **connection: str | None
) -> LokiConfig:
    """The settings of a node logger that sends to `destination`: only the `environment` label is resolved."""
    given = [f"{name}=" for name, value in connection.items() if value is not None]
    if given:
        raise ConfigurationError(
            f"setup_loki_logger: destination= replaces Loki, so {', '.join(given)} cannot be given with it"
        )
    labels_only = loki_config(environment=environment, enabled=False)
    if not enabled:
        return labels_only
    return dataclasses.replace(labels_only, enabled=True, disabled_reason=None, url=destination.url)


def setup_loki_logger(
    service: str,
    uid: str | int | None = None,
    version: str | None = None,
    environment: str | None = None,
    url: str | None = None,
    *,
    username: str | None = None,
    password: str | None = None,
    bearer_token: str | None = None,
    tenant_id: str | None = None,
    verify_tls: bool | None = None,
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
    strict: bool | None = None,
    close_timeout: float = 5.0,
    tls: TLS | None = None,
    timeouts: Timeouts | None = None,
    destination: Destination | None = None,
) -> LokiLogger:
    """Configure logger `logger_name` (default: `service`) to ship to Loki and print to the console.

    Stream labels: service, environment, host, level, uid, role (default: service),
    version and the validated extra `labels`; everything else goes in the JSON line.
    `environment` defaults to TELEMETRY_ENVIRONMENT, else "unknown". The URL comes
    from `url` or LOKI_URL (a base URL or the full push URL); credentials from the
    arguments or LOKI_USERNAME/LOKI_PASSWORD, LOKI_BEARER_TOKEN, and LOKI_TENANT_ID;
    all read now (see `telemetry_client.config.loki_config`).

    With no URL anywhere, Loki is off: the console still works, one warning names
    the variables to set, and records are counted `disabled` in `stats()`. With
    `strict=True` (or TELEMETRY_STRICT=1) that is a ConfigurationError instead. A
    setting that is present but wrong always raises ConfigurationError. Calling
    it again for the same logger replaces (and closes) the handlers the previous
    call installed. `filters` default to dropping the subtensor "Verify your local
    subtensor" warning; pass [] for none. `tls` and `timeouts` are the handler's
    (`LokiHandler`), flat or grouped. `destination` replaces Loki in a node's own
    tests (see `telemetry_client.testing`): no LOKI_* variable is read, and a URL
    or credentials given with it are a `ConfigurationError`.
    """
    if not service:
        raise ConfigurationError("service is required (e.g. 'miner')")
    if destination is None:
        settings = loki_config(
            url=url,
            username=username,
            password=password,
            bearer_token=bearer_token,
            tenant_id=tenant_id,
            environment=environment,
            strict=strict,
            enabled=enabled,
        )
    else:
        settings = _destination_settings(
            destination,
            environment,
            enabled,
            url=url,
            username=username,
            password=password,
            bearer_token=bearer_token,
            tenant_id=tenant_id,
        )
    fixed = {
        "service": service,
        "environment": settings.environment,
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

    loki_handler: LokiHandler | None = None
    disabled: DisabledHandler | None = None
    if settings.enabled:
        loki_handler = LokiHandler(
            None if destination is not None else settings.url or "",
            stream_labels,
            settings.basic_auth,
            bearer_token=settings.bearer_token,
            tenant_id=settings.tenant_id,
            verify_tls=verify_tls,
            ca_certs=ca_certs,
            tls=tls,
            timeouts=timeouts,
            destination=destination,
            buffer=buffer,
            max_line_bytes=max_line_bytes,
            structured_metadata=structured_metadata,
            close_timeout=close_timeout,
        )
    else:
        disabled = DisabledHandler(settings.disabled_reason)
        if enabled:
            warn.once("loki:disabled", "Loki logging is off: %s", settings.disabled_reason)
    console_out = console_handler(levelno) if console else None

    logger = logging.getLogger(service if logger_name is None else logger_name)
    _remove_previous(logger, close_timeout)
    for handler in (loki_handler or disabled, console_out):
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
    _current = LokiLogger(logger, loki_handler, console_out, settings, disabled)
    return _current
