"""Where every setting of the client comes from: arguments, environment variables, defaults.

This is the one place that resolves the settings of a destination, so that the
loggers and an operator's diagnosis read the same answer. For each setting it
records where the value came from (`argument`, `env NAME`, `default`, `unset`) and
lists what was ignored and why (an environment variable overridden by an argument,
a host when a full URL is given, a token on API v1...).

Rules, the same for every destination:

- an argument wins over its environment variable, which wins over the default;
  an empty environment variable counts as unset;
- nothing configured (no server named anywhere) is not an error: the destination
  is disabled, `disabled_reason` names the variables to set. With `strict`
  (argument, or TELEMETRY_STRICT=1) it is a `ConfigurationError` instead;
- a setting that is present but wrong (a malformed URL, two kinds of
  authentication, a port that is not a number) always raises `ConfigurationError`;
- secrets (tokens, passwords) never appear in a `repr()` or in a message.

Nothing is read at import: each function reads `os.environ` when called.
"""

from __future__ import annotations

import base64
import os
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from telemetry_client.errors import ConfigurationError

__all__ = [
    "DEFAULT_ENVIRONMENT",
    "DEFAULT_EXIT_TIMEOUT",
    "ENV_ENVIRONMENT",
    "ENV_EXIT_TIMEOUT",
    "ENV_HANDLE_SIGTERM",
    "ENV_STRICT",
    "INFLUXDB_ENV",
    "LOKI_ENV",
    "Ignored",
    "InfluxDBConfig",
    "LokiConfig",
    "Setting",
    "exit_timeout_setting",
    "handle_sigterm_setting",
    "influxdb_config",
    "loki_config",
]

ARGUMENT = "argument"
DEFAULT = "default"
UNSET = "unset"

ENV_STRICT = "TELEMETRY_STRICT"
ENV_ENVIRONMENT = "TELEMETRY_ENVIRONMENT"
ENV_EXIT_TIMEOUT = "TELEMETRY_EXIT_TIMEOUT"
ENV_HANDLE_SIGTERM = "TELEMETRY_HANDLE_SIGTERM"
DEFAULT_EXIT_TIMEOUT = 3.0  # seconds the end of a process waits for delivery
DEFAULT_ENVIRONMENT = "unknown"  # the Loki `environment` label when neither argument nor variable gives one
LOOPBACK_HOSTS = frozenset({"localhost", "127.0.0.1", "::1", "[::1]"})

INFLUXDB_ENV = {
    "url": "INFLUXDB_URL",
    "host": "INFLUXDB_HOST",
    "port": "INFLUXDB_PORT",
    "database": "INFLUXDB_DATABASE",
    "token": "INFLUXDB_TOKEN",
    "org": "INFLUXDB_ORG",
    "api_version": "INFLUXDB_API_VERSION",
    "username": "INFLUXDB_USERNAME",
    "password": "INFLUXDB_PASSWORD",
    "retention_policy": "INFLUXDB_RETENTION_POLICY",
    "verify_tls": "INFLUXDB_VERIFY_TLS",
    "strict": ENV_STRICT,
}
LOKI_ENV = {
    "url": "LOKI_URL",
    "username": "LOKI_USERNAME",
    "password": "LOKI_PASSWORD",
    "bearer_token": "LOKI_BEARER_TOKEN",
    "tenant_id": "LOKI_TENANT_ID",
    "environment": ENV_ENVIRONMENT,
    "strict": ENV_STRICT,
}
SECRET_SETTINGS = frozenset({"token", "password", "bearer_token"})
_FALSE = frozenset({"0", "false", "no", "off"})
_TRUE = frozenset({"1", "true", "yes", "on"})


@dataclass(frozen=True)
class Setting:
    """One resolved setting: its value and where it came from (`argument`, `env NAME`, `default`, `unset`)."""

    name: str
    value: Any
    source: str
    secret: bool = False
    problem: str = ""  # why a value that was given is not the one used (empty: none)

    @property
    def shown(self) -> str:
        """The value as it may be printed: a secret shows only that it is set."""
        if self.value is None:
            return "-"
        if self.secret:
            return "(set, hidden)"
        if self.name == "url":
            return split_url_credentials(str(self.value))[0]
        return str(self.value)

    def __repr__(self) -> str:
        return f"Setting({self.name}={self.shown!r}, source={self.source!r})"


@dataclass(frozen=True)
class Ignored:
    """A value that was given but not used, and why."""

    name: str
    source: str
    reason: str


class _Resolver:
    """Collects settings and ignored values while one destination is resolved."""

    def __init__(self, env_names: Mapping[str, str], environ: Mapping[str, str] | None) -> None:
        self.env_names = env_names
        self.environ = os.environ if environ is None else environ
        self.settings: dict[str, Setting] = {}
        self.ignored: list[Ignored] = []

    def get(self, name: str, argument: Any, default: Any = None) -> Any:
        env_name = self.env_names.get(name)
        env_value = self.environ.get(env_name) or None if env_name else None
        secret = name in SECRET_SETTINGS
        if argument is not None:
            if env_value is not None:
                self.ignored.append(Ignored(name, f"env {env_name}", "overridden by the argument"))
            setting = Setting(name, argument, ARGUMENT, secret)
        elif env_value is not None:
            setting = Setting(name, env_value, f"env {env_name}", secret)
        elif default is not None:
            setting = Setting(name, default, DEFAULT, secret)
        else:
            setting = Setting(name, None, UNSET, secret)
        self.settings[name] = setting
        return setting.value

    def replace(self, name: str, value: Any) -> None:
        """Record the parsed form of a setting, keeping its source."""
        old = self.settings[name]
        self.settings[name] = Setting(name, value, old.source, old.secret)

    def ignore(self, name: str, reason: str) -> None:
        """Mark a resolved setting as given but unused."""
        setting = self.settings.get(name)
        if setting is not None and setting.source not in (UNSET, DEFAULT):
            self.ignored.append(Ignored(name, setting.source, reason))

    def given(self, name: str) -> bool:
        setting = self.settings.get(name)
        return setting is not None and setting.source not in (UNSET, DEFAULT)


def _parse_bool(resolver: _Resolver, name: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    source = resolver.settings[name].source
    allowed = "1/0, true/false, yes/no, on/off"
    raise ConfigurationError(f"{name} ({source}) must be true or false ({allowed}), got {value!r}")


def _strict(resolver: _Resolver, strict: bool | None) -> bool:
    value = resolver.get("strict", strict, False)
    parsed = _parse_bool(resolver, "strict", value)
    resolver.replace("strict", parsed)
    return parsed


@dataclass(frozen=True)
class _Resolved:
    """What every destination's configuration has in common."""

    enabled: bool
    strict: bool
    disabled_reason: str | None
    settings: tuple[Setting, ...]
    ignored: tuple[Ignored, ...]

    def setting(self, name: str) -> Setting:
        """The resolved setting `name` (KeyError for a name this destination does not have)."""
        for setting in self.settings:
            if setting.name == name:
                return setting
        raise KeyError(name)

    def describe(self) -> list[str]:
        """One line per setting and per ignored value, secrets hidden: for diagnosis."""
        lines = [f"{s.name} = {s.shown}  ({s.source})" for s in self.settings]
        lines += [f"ignored: {i.name} from {i.source}: {i.reason}" for i in self.ignored]
        if self.disabled_reason:
            lines.append(f"disabled: {self.disabled_reason}")
        return lines


@dataclass(frozen=True)
class InfluxDBConfig(_Resolved):
    """The resolved InfluxDB destination of a `MetricsLogger` (secrets only in `headers`, never in repr)."""

    api_version: int = 2
    base_url: str | None = None
    write_url: str | None = None
    database: str = "telemetry"
    org: str | None = None
    retention_policy: str | None = None
    verify_tls: bool = True
    auth: str = "none"  # "token", "basic" or "none"
    headers: Mapping[str, str] = field(default_factory=dict, repr=False)


@dataclass(frozen=True)
class LokiConfig(_Resolved):
    """The resolved Loki destination of `setup_loki_logger` (credentials never in repr)."""

    url: str | None = None
    environment: str = DEFAULT_ENVIRONMENT
    basic_auth: tuple[str, str] | None = field(default=None, repr=False)
    bearer_token: str | None = field(default=None, repr=False)
    tenant_id: str | None = None

    @property
    def auth(self) -> str:
        return "basic" if self.basic_auth else "bearer" if self.bearer_token else "none"


INFLUXDB_HINT = (
    "set INFLUXDB_URL (or INFLUXDB_HOST) and INFLUXDB_TOKEN "
    "(InfluxDB 1.x: INFLUXDB_API_VERSION=1, INFLUXDB_USERNAME/INFLUXDB_PASSWORD if auth is on)"
)
LOKI_HINT = "set LOKI_URL (and LOKI_USERNAME/LOKI_PASSWORD or LOKI_BEARER_TOKEN if Loki needs auth)"


def _disabled_or_raise(strict: bool, what: str, hint: str, stray: list[str]) -> str:
    reason = f"no {what} configured: {hint}"
    if stray:
        reason += f" ({', '.join(stray)} set, but no server named)"
    if strict:
        raise ConfigurationError(f"{reason}; strict mode requires it (unset {ENV_STRICT} or pass strict=False)")
    return reason


def influxdb_config(
    *,
    url: str | None = None,
    host: str | None = None,
    port: int | str | None = None,
    scheme: str | None = None,
    database: str | None = None,
    token: str | None = None,
    org: str | None = None,
    api_version: int | str | None = None,
    username: str | None = None,
    password: str | None = None,
    retention_policy: str | None = None,
    verify_tls: bool | None = None,
    strict: bool | None = None,
    enabled: bool = True,
    environ: Mapping[str, str] | None = None,
) -> InfluxDBConfig:
    """Resolve the InfluxDB settings of a `MetricsLogger` from arguments and INFLUXDB_* variables.

    Raises `ConfigurationError` for a setting that is present but wrong, and for
    nothing configured when strict. `environ` defaults to `os.environ` (read now).
    """
    if not enabled:  # an explicit no-op logger: nothing is read, nothing can be wrong
        return InfluxDBConfig(
            enabled=False, strict=False, disabled_reason="disabled by enabled=False", settings=(), ignored=()
        )
    r = _Resolver(INFLUXDB_ENV, environ)
    is_strict = _strict(r, strict)
    raw_version = r.get("api_version", api_version, 2)
    try:
        version = int(raw_version)
    except (TypeError, ValueError):
        version = 0
    if version not in (1, 2):
        raise ConfigurationError(f"api_version must be 1 (InfluxDB 1.x) or 2, got {raw_version!r}")
    r.replace("api_version", version)
    base = r.get("url", url)
    given_host = r.get("host", host)
    given_port = r.get("port", port)
    database_name = r.get("database", database, "telemetry")
    given_token = r.get("token", token)
    given_org = r.get("org", org, "telemetry")
    given_user = r.get("username", username)
    given_password = r.get("password", password)
    given_rp = r.get("retention_policy", retention_policy)
    tls = _parse_bool(r, "verify_tls", r.get("verify_tls", verify_tls, True))
    r.replace("verify_tls", tls)

    def result(**kwargs: Any) -> InfluxDBConfig:
        return InfluxDBConfig(
            strict=is_strict,
            settings=tuple(r.settings.values()),
            ignored=tuple(r.ignored),
            api_version=version,
            database=database_name,
            retention_policy=given_rp,
            verify_tls=tls,
            **kwargs,
        )

    if base is None and not given_host:
        stray = [name for name in ("token", "username", "password", "port") if r.given(name)]
        reason = _disabled_or_raise(is_strict, "InfluxDB server", INFLUXDB_HINT, stray)
        return result(enabled=False, disabled_reason=reason, org=given_org)

    if base is None:
        try:
            port_number = int(given_port or 8086)
        except ValueError:
            raise ConfigurationError(
                f"port ({r.settings['port'].source}) must be a number, got {given_port!r}"
            ) from None
        chosen_scheme = scheme or ("http" if given_host in LOOPBACK_HOSTS else "https")
        base = f"{chosen_scheme}://{given_host}:{port_number}"
    else:
        r.ignore("host", "a full URL is given (url / INFLUXDB_URL wins)")
        r.ignore("port", "a full URL is given (url / INFLUXDB_URL wins)")
    if given_token and (given_user or given_password):
        raise ConfigurationError(
            "give either a token (API v2: token / INFLUXDB_TOKEN) or a username and password "
            "(API v1: INFLUXDB_USERNAME / INFLUXDB_PASSWORD), not both"
        )
    parsed = urllib.parse.urlsplit(str(base))
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        raise ConfigurationError(f"InfluxDB URL must look like https://host:8086, got {base!r}")
    base = str(base).rstrip("/")
    headers = {"Content-Type": "text/plain; charset=utf-8"}
    if version == 2:
        r.ignore("username", "API v2 authenticates with a token")
        r.ignore("password", "API v2 authenticates with a token")
        r.ignore("retention_policy", "API v2 writes to a bucket")
        if not given_token:
            raise ConfigurationError(
                "no InfluxDB token: pass token= or set INFLUXDB_TOKEN (there is no default token); "
                "for InfluxDB 1.x use api_version=1 with username/password, or pass enabled=False"
            )
        headers["Authorization"] = f"Token {given_token}"
        query = urllib.parse.urlencode({"org": given_org, "bucket": database_name, "precision": "ns"})
        return result(
            enabled=True,
            disabled_reason=None,
            base_url=base,
            write_url=f"{base}/api/v2/write?{query}",
            org=given_org,
            auth="token",
            headers=headers,
        )
    r.ignore("token", "API v1 authenticates with username/password")
    r.ignore("org", "API v1 has no organisations")
    if bool(given_user) != bool(given_password):
        raise ConfigurationError("InfluxDB 1.x needs both username and password, or neither")
    if given_user:
        credentials = base64.b64encode(f"{given_user}:{given_password}".encode()).decode()
        headers["Authorization"] = f"Basic {credentials}"
    params = {"db": database_name, "precision": "n"}
    if given_rp:
        params["rp"] = given_rp
    return result(
        enabled=True,
        disabled_reason=None,
        base_url=base,
        write_url=f"{base}/write?{urllib.parse.urlencode(params)}",
        auth="basic" if given_user else "none",
        headers=headers,
    )


def loki_config(
    *,
    url: str | None = None,
    username: str | None = None,
    password: str | None = None,
    bearer_token: str | None = None,
    tenant_id: str | None = None,
    environment: str | None = None,
    strict: bool | None = None,
    enabled: bool = True,
    environ: Mapping[str, str] | None = None,
) -> LokiConfig:
    """Resolve the Loki settings of `setup_loki_logger` from arguments and LOKI_* variables.

    The `environment` label comes from the argument, else TELEMETRY_ENVIRONMENT,
    else "unknown". Credentials may also be written in the URL (user:password@);
    they are moved out of it so that the URL can be shown.
    """
    r = _Resolver(LOKI_ENV, environ)
    chosen_environment = r.get("environment", environment, DEFAULT_ENVIRONMENT)
    if not enabled:  # console-only logging: only the environment label is read
        return LokiConfig(
            enabled=False,
            strict=False,
            disabled_reason="disabled by enabled=False",
            settings=tuple(r.settings.values()),
            ignored=(),
            environment=str(chosen_environment),
        )
    is_strict = _strict(r, strict)
    given_url = r.get("url", url)
    user = r.get("username", username)
    secret = r.get("password", password)
    token = r.get("bearer_token", bearer_token)
    tenant = r.get("tenant_id", tenant_id)

    def result(**kwargs: Any) -> LokiConfig:
        return LokiConfig(
            strict=is_strict,
            settings=tuple(r.settings.values()),
            ignored=tuple(r.ignored),
            environment=str(chosen_environment),
            tenant_id=tenant,
            **kwargs,
        )

    if not given_url:
        stray = [name for name in ("username", "password", "bearer_token", "tenant_id") if r.given(name)]
        return result(enabled=False, disabled_reason=_disabled_or_raise(is_strict, "Loki URL", LOKI_HINT, stray))
    clean_url, url_auth = split_url_credentials(str(given_url))
    if bool(user) != bool(secret):
        raise ConfigurationError("Loki basic auth needs both username and password (or LOKI_USERNAME/PASSWORD)")
    basic = (user, secret) if user and secret else url_auth
    if basic and token:
        raise ConfigurationError("give either basic auth (username/password) or a bearer token, not both")
    if user and url_auth:
        r.ignored.append(Ignored("url credentials", r.settings["url"].source, "username/password given separately"))
    r.replace("url", clean_url)
    return result(enabled=True, disabled_reason=None, url=clean_url, basic_auth=basic, bearer_token=token)


def split_url_credentials(url: str) -> tuple[str, tuple[str, str] | None]:
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


def exit_timeout_setting(environ: Mapping[str, str] | None = None) -> Setting:
    """How long the exit hook waits for delivery (TELEMETRY_EXIT_TIMEOUT), and where that came from."""
    raw = (os.environ if environ is None else environ).get(ENV_EXIT_TIMEOUT) or None
    if raw is None:
        return Setting("exit_timeout", DEFAULT_EXIT_TIMEOUT, DEFAULT)
    try:
        return Setting("exit_timeout", max(0.0, float(raw)), f"env {ENV_EXIT_TIMEOUT}")
    except ValueError:
        problem = f"env {ENV_EXIT_TIMEOUT}={raw!r} is not a number"
        return Setting("exit_timeout", DEFAULT_EXIT_TIMEOUT, f"default ({problem})", problem=problem)


def handle_sigterm_setting(environ: Mapping[str, str] | None = None) -> Setting:
    """Whether the first logger installs the draining SIGTERM handler (TELEMETRY_HANDLE_SIGTERM, default on).

    A value that is not a boolean raises `ConfigurationError`, as every other
    switch does; `telemetry_client.handle_sigterm()` overrides it at run time.
    """
    r = _Resolver({"handle_sigterm": ENV_HANDLE_SIGTERM}, environ)
    parsed = _parse_bool(r, "handle_sigterm", r.get("handle_sigterm", None, True))
    r.replace("handle_sigterm", parsed)
    return r.settings["handle_sigterm"]
