"""MetricsLogger: points to InfluxDB through the shared shipping engine.

`log()` only stamps the time, copies the caller's dicts and appends to a deque;
tags, the field typing rule (see `fields`), validation and line-protocol
encoding all happen on the sender thread (`sink.InfluxSink`).
"""

from __future__ import annotations

import datetime as dt
import random
import time
from collections.abc import Mapping
from typing import Annotated, Any, TypedDict, Unpack

from telemetry_client._engine.disabled import Counter, disabled_stats
from telemetry_client._engine.self_log import warn
from telemetry_client._engine.settings import TLS, Alias, Timeouts, aliases_of, combine
from telemetry_client._engine.shipping import BufferSettings, Channel
from telemetry_client._engine.transport import Destination, HttpTransport, Transport
from telemetry_client._influx import line_protocol as lp
from telemetry_client._influx.connection import Connection
from telemetry_client._influx.fields import DEFAULT_MAX_STRING_BYTES, list_stats
from telemetry_client._influx.records import GPU, MEASUREMENT, SAMPLED, SYSTEM, TAGS, TIME
from telemetry_client._influx.sink import InfluxSink, check_standard_tags
from telemetry_client.config import InfluxDBConfig, influxdb_config
from telemetry_client.errors import ConfigurationError

# Config attributes that may become tags: tag name -> dotted attribute path in `config`.
DEFAULT_CONFIG_TAGS: Mapping[str, str] = {"netuid": "netuid", "network": "subtensor.network"}
# The seed's positional connection parameters, each a field of `Connection` of the same name.
POSITIONAL_CONNECTION = ("host", "port", "database", "token", "org")


class FlatSettings(TypedDict, total=False):
    """The flat keywords MetricsLogger has always taken for what `connection`, `tls` and `timeouts` now group."""

    url: Annotated[str | None, Alias(Connection, "url")]
    scheme: Annotated[str | None, Alias(Connection, "scheme")]
    api_version: Annotated[int | str | None, Alias(Connection, "api_version")]
    username: Annotated[str | None, Alias(Connection, "username")]
    password: Annotated[str | None, Alias(Connection, "password")]
    retention_policy: Annotated[str | None, Alias(Connection, "retention_policy")]
    verify_tls: Annotated[bool | None, Alias(TLS, "verify")]
    ca_certs: Annotated[str | None, Alias(TLS, "ca_certs")]
    connect_timeout: Annotated[float | None, Alias(Timeouts, "connect")]
    read_timeout: Annotated[float | None, Alias(Timeouts, "read")]


FLAT_KEYWORDS: dict[str, Alias] = aliases_of(FlatSettings)
FLAT_ALIASES: dict[str, Alias] = {**{name: Alias(Connection, name) for name in POSITIONAL_CONNECTION}, **FLAT_KEYWORDS}


def seed_buffer_arguments(
    buffer: BufferSettings | None, max_queue_size: int | None, max_workers: int | None
) -> BufferSettings | None:
    """Map the seed's `max_queue_size` onto the buffer bound; `max_workers` has no meaning here.

    Both are accepted so that existing constructor calls keep working; each is
    explained once per process.
    """
    if max_workers is not None:
        warn.once(
            "influxdb:max_workers",
            "max_workers=%r is ignored: one background sender thread per process serves every logger",
            max_workers,
        )
    if max_queue_size is None:
        return buffer
    if buffer is not None:
        warn.once("influxdb:max_queue_size", "max_queue_size is ignored: buffer= sets the bounds")
        return buffer
    if not isinstance(max_queue_size, int) or max_queue_size < 1:
        raise ConfigurationError(f"max_queue_size must be a positive integer, got {max_queue_size!r}")
    default = BufferSettings()
    warn.once(
        "influxdb:max_queue_size",
        "max_queue_size=%d bounds the buffer (BufferSettings.max_items); pass buffer= for the other bounds",
        max_queue_size,
    )
    return BufferSettings(max_items=max_queue_size, batch_items=min(default.batch_items, max_queue_size))


def _keywords_of(group: type) -> dict[str, str]:
    """The flat keywords of `group`'s fields: keyword -> field name."""
    return {keyword: alias.field for keyword, alias in FLAT_ALIASES.items() if alias.group is group}


def _destination_settings(destination: Destination, connection: Connection, tls: TLS, enabled: bool) -> InfluxDBConfig:
    """The settings of a logger that sends to `destination`: nothing resolved, nothing read from the environment."""
    given = [f"{name}=" for name, value in connection.arguments().items() if value is not None]
    given += [f"tls.{name}" for name, value in vars(tls).items() if value is not None]
    if given:
        raise ConfigurationError(
            f"MetricsLogger: destination= replaces the server, so {', '.join(given)} cannot be given with it"
        )
    if not enabled:
        return influxdb_config(enabled=False)
    headers = {"Content-Type": "text/plain; charset=utf-8"}
    return InfluxDBConfig(
        enabled=True,
        strict=False,
        disabled_reason=None,
        settings=(),
        ignored=(),
        write_url=destination.url,
        headers=headers,
    )


def _config_value(config: Any, path: str) -> Any:
    value = config
    for part in path.split("."):
        if value is None:
            return None
        value = value.get(part) if isinstance(value, Mapping) else getattr(value, part, None)
    return value


class MetricsLogger:
    """Logs points to InfluxDB without ever blocking or raising into the training loop.

    Settings come from the arguments and the environment (INFLUXDB_URL, INFLUXDB_HOST,
    INFLUXDB_PORT, INFLUXDB_DATABASE, INFLUXDB_TOKEN, INFLUXDB_ORG,
    INFLUXDB_API_VERSION, INFLUXDB_USERNAME, INFLUXDB_PASSWORD,
    INFLUXDB_RETENTION_POLICY, INFLUXDB_VERIFY_TLS, TELEMETRY_STRICT), read now,
    never at import; `settings` says where each came from (see `config`). There is
    no fallback token. With no server named anywhere the logger is off: it warns
    once, naming the variables to set, and counts every point `disabled`; with
    `strict` that is a `ConfigurationError`. A setting present but wrong always
    raises `ConfigurationError`, here, at construction.

    The connection, TLS and timeout settings come either grouped (`connection=Connection(...)`,
    `tls=TLS(...)`, `timeouts=Timeouts(...)`) or as the flat keywords the logger
    has always taken (`host`, `token`, `url`, `verify_tls`, `connect_timeout`...,
    see `FlatSettings`); both forms may be mixed, but one setting given both ways
    is a `ConfigurationError`.

    `destination` replaces the server for a node's own tests: an
    `telemetry_client.testing.InMemoryDestination` records what would have been
    sent. The connection is then not resolved (no INFLUXDB_* variable is read) and
    giving one too is a `ConfigurationError`.

    `prefix` is written in front of every measurement as is: `prefix="V"` and
    `validator_window_v2` give `Vvalidator_window_v2`. `max_queue_size` bounds the
    buffer (`BufferSettings.max_items`); `max_workers` is accepted and ignored.

    Tag rule: every point gets the standard tags (uid, role, version, network,
    runtime_id, group, job_type) that are set, plus allow-listed config values.
    A tag passed to `log()` with the same key wins for that point, and a warning
    says so once per key; nothing is overwritten silently.
    """

    def __init__(
        self,
        host: str | None = None,
        port: int | None = None,
        database: str | None = None,
        token: str | None = None,
        org: str | None = None,
        prefix: str = "",
        uid: str | int | None = None,
        role: str = "",
        version: str | None = None,
        runtime_id: str | None = None,
        config: Any = None,
        group: str | None = None,
        job_type: str | None = None,
        *,
        connection: Connection | None = None,
        tls: TLS | None = None,
        timeouts: Timeouts | None = None,
        buffer: BufferSettings | None = None,
        network: str | None = None,
        config_tags: Mapping[str, str] = DEFAULT_CONFIG_TAGS,
        compress: bool = True,
        system_metrics_interval: float = 10.0,
        self_metrics_interval: float | None = 10.0,
        max_string_bytes: int = DEFAULT_MAX_STRING_BYTES,
        enabled: bool = True,
        strict: bool | None = None,
        max_queue_size: int | None = None,
        max_workers: int | None = None,
        destination: Destination | None = None,
        **flat: Unpack[FlatSettings],
    ) -> None:
        unknown = sorted(flat.keys() - FLAT_KEYWORDS.keys())
        if unknown:
            raise TypeError(f"MetricsLogger() got an unexpected keyword argument {unknown[0]!r}")
        given = {"host": host, "port": port, "database": database, "token": token, "org": org, **flat}
        self.connection, self.tls, self.timeouts = (
            combine(cls, value, parameter, given, _keywords_of(cls), "MetricsLogger")
            for cls, value, parameter in (
                (Connection, connection, "connection"),
                (TLS, tls, "tls"),
                (Timeouts, timeouts, "timeouts"),
            )
        )
        self.prefix = prefix
        self.uid = None if uid is None else str(uid)
        self.role = role
        self.version = version
        self.runtime_id = runtime_id
        self.group = group
        self.job_type = job_type
        tags = {
            "uid": self.uid,
            "role": role,
            "version": version,
            "runtime_id": runtime_id,
            "group": group,
            "job_type": job_type,
        }
        if config is not None:
            for tag, path in config_tags.items():
                value = _config_value(config, path)
                if value is not None and tags.get(tag) is None:
                    tags[tag] = str(value)
        if network is not None:
            tags["network"] = network
        self.standard_tags = {k: str(v) for k, v in tags.items() if v not in (None, "")}
        check_standard_tags(self.standard_tags)
        if prefix and not lp.valid_measurement(prefix):
            raise ConfigurationError(f"prefix {prefix!r} is not a valid measurement name prefix")
        buffer = seed_buffer_arguments(buffer, max_queue_size, max_workers)
        if destination is None:
            self.settings = influxdb_config(
                **self.connection.arguments(), verify_tls=self.tls.verify, strict=strict, enabled=enabled
            )
        else:
            self.settings = _destination_settings(destination, self.connection, self.tls, enabled)
        self.enabled = self.settings.enabled
        self.database = self.settings.database
        self.api_version = self.settings.api_version
        self._names: dict[str, str] = {}
        self._channel: Channel | None = None
        self._disabled = Counter()
        if not self.settings.enabled:
            if enabled:
                warn.once("influxdb:disabled", "MetricsLogger is off: %s", self.settings.disabled_reason)
            return
        transport: Transport
        if destination is not None:
            transport = destination.open("influxdb", self.settings.headers, compress)
        else:
            transport = HttpTransport(
                self.settings.write_url or "",
                dict(self.settings.headers),
                verify_tls=self.settings.verify_tls,
                ca_certs=self.tls.ca_certs,
                connect_timeout=self.timeouts.connect,
                read_timeout=self.timeouts.read,
                compress=compress,
            )
        self._sink = InfluxSink(
            transport, self.standard_tags, max_string_bytes, system_metrics_interval, self_metrics_interval
        )
        self._channel = Channel(self._sink, buffer)
        self._tag_sets = self._sink.tag_sets
        self._tag_numbers = self._tag_sets.numbers
        self._sink.submit = self._channel.submit
        self._sink.watched.append(self._channel)

    def __repr__(self) -> str:
        target = self._sink.transport.url.split("?")[0] if self._channel else "disabled"
        return f"MetricsLogger(uid={self.uid!r}, role={self.role!r}, target={target!r})"

    def _name(self, measurement: str) -> str:
        name = self._names.get(measurement)
        if name is None:
            name = self.prefix + measurement  # as written before: "V" + "validator_window_v2"
            self._names[measurement] = name
        return name

    def log(
        self,
        measurement: str,
        tags: Mapping[str, Any] | None = None,
        fields: Mapping[str, Any] | None = None,
        timestamp: int | float | dt.datetime | None = None,
        with_system_metrics: bool = False,
        with_gpu_metrics: bool = False,
        sample_rate: float = 1.0,
    ) -> None:
        """Queue one point. Never blocks on the network, never raises; bad input is counted."""
        channel = self._channel
        if channel is None:
            self._disabled.add()
            return
        try:
            ts = time.time_ns() if timestamp is None else timestamp
            if sample_rate < 1.0 and random.random() >= sample_rate:
                channel.count_sampled_out()
                return
            name = self._names.get(measurement) or self._name(measurement)
            record = dict(fields) if fields else {}  # one dict the collector does not track (see `records`)
            record[MEASUREMENT] = name
            record[TIME] = ts
            if tags:
                try:
                    number = self._tag_numbers.get((name, tuple(tags.items())))
                except (TypeError, AttributeError):  # unhashable values, pairs: `ref` keeps a copy
                    number = None
                record[TAGS] = self._tag_sets.ref(name, tags) if number is None else number
            if with_system_metrics or with_gpu_metrics:
                record[SAMPLED] = (SYSTEM if with_system_metrics else 0) | (GPU if with_gpu_metrics else 0)
                self._sink.sampling_asked = True
            channel.submit(record)
        except Exception:
            warn.warning("log", "MetricsLogger.log() could not queue a point", exc_info=True)

    @staticmethod
    def process_value(value: Any) -> Any:
        """The seed's list treatment: a list of numbers becomes its mean/min/max/median."""
        if isinstance(value, list | tuple) and value:
            return list_stats([float(v) for v in value])
        return value

    def watch(self, channel: Channel) -> None:
        """Also write another channel's counters (e.g. a Loki handler's) as self-metrics."""
        if self._channel is not None and channel not in self._sink.watched:
            self._sink.watched.append(channel)

    @property
    def channel(self) -> Channel | None:
        return self._channel

    def stats(self) -> dict[str, Any]:
        """Counters: queued, sent, batches, retries, dropped (and by reason), pending, last error."""
        if self._channel is not None:
            return self._channel.stats()
        return disabled_stats("influxdb", self._disabled.value, self.settings.disabled_reason)

    def flush(self, timeout: float = 5.0) -> int:
        """Deliver everything queued so far, waiting at most `timeout` s; return how many are left."""
        return self._channel.flush(timeout) if self._channel else 0

    def close(self, timeout: float = 5.0) -> int:
        """Flush within `timeout` s and stop; what is left is `shutdown` (an unanswered request: `unconfirmed`)."""
        return self._channel.close(timeout) if self._channel else 0

    def __enter__(self) -> MetricsLogger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
