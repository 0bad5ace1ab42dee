"""MetricsLogger: points to InfluxDB through the shared shipping engine.

`log()` only stamps the time, copies the caller's dicts and appends to a deque;
tags, the field typing rule (see `fields`), validation and line-protocol
encoding all happen on the sender thread.
"""

from __future__ import annotations

import datetime as dt
import numbers
import random
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from telemetry_client._engine.disabled import Counter, disabled_stats
from telemetry_client._engine.self_log import warn
from telemetry_client._engine.shipping import BufferSettings, Channel, Item, Verdict
from telemetry_client._engine.transport import HttpTransport, Response
from telemetry_client._influx import line_protocol as lp
from telemetry_client._influx.fields import DEFAULT_MAX_STRING_BYTES, FieldEncoder, list_stats
from telemetry_client._influx.gpu_metrics import GpuSampler
from telemetry_client._influx.rejections import Refusal, read_refusal
from telemetry_client._influx.system_metrics import SystemSampler
from telemetry_client.catalog import DELTA_SUFFIX, DROP_REASONS, SELF_COUNTERS, SPARSE_DELTAS
from telemetry_client.config import influxdb_config
from telemetry_client.errors import ConfigurationError

# Config attributes that may become tags: tag name -> dotted attribute path in `config`.
DEFAULT_CONFIG_TAGS: Mapping[str, str] = {"netuid": "netuid", "network": "subtensor.network"}
SELF_METRICS_MEASUREMENT = "telemetry_client"
# The times InfluxDB stores (models/time.go: MinNanoTime = MinInt64 + 2, MaxNanoTime = MaxInt64 - 1);
# a line outside them is refused as "time outside range" or does not parse.
MIN_TIME_NS = -(2**63) + 2
MAX_TIME_NS = 2**63 - 2

# (measurement, caller tags or None, fields, timestamp, with_system_metrics, with_gpu_metrics)
Record = tuple[str, dict | None, dict, Any, bool, bool]


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


def _config_value(config: Any, path: str) -> Any:
    value = config
    for part in path.split("."):
        if value is None:
            return None
        value = value.get(part) if isinstance(value, Mapping) else getattr(value, part, None)
    return value


def _timestamp_ns(timestamp: Any) -> int:
    """Integers: nanoseconds; other real numbers: seconds since the epoch; datetime: converted (naive means UTC)."""
    if isinstance(timestamp, bool):
        raise TypeError("a bool is not a timestamp")
    if isinstance(timestamp, int):
        return timestamp
    if isinstance(timestamp, float):
        return round(timestamp * 1e9)
    if isinstance(timestamp, numbers.Integral):  # a NumPy integer: nanoseconds
        return int(timestamp)
    if isinstance(timestamp, numbers.Real):  # a NumPy float: seconds
        return round(float(timestamp) * 1e9)
    if isinstance(timestamp, dt.datetime):
        if timestamp.tzinfo is None:
            timestamp = timestamp.replace(tzinfo=dt.UTC)
        delta = timestamp - dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
        return (delta.days * 86_400 + delta.seconds) * 1_000_000_000 + delta.microseconds * 1_000
    raise TypeError(f"unsupported timestamp type {type(timestamp).__name__}")


def _refused_indexes(items: Sequence[Item], refusal: Refusal) -> set[int] | None:
    """Positions in `items` of the lines the server refused; None when none of them can be found."""
    refused: set[int] = set()
    if refusal.line_numbers:
        refused = {number - 1 for number in refusal.line_numbers if 0 < number <= len(items)}
    elif refusal.lines:
        positions: dict[str, list[int]] = {}
        for index, item in enumerate(items):
            positions.setdefault(item[0][:-1].decode("utf-8", "replace"), []).append(index)
        for line in refusal.lines:
            found = positions.get(line)
            if found:
                refused.add(found.pop(0))
    elif refusal.dropped:
        # Only counted: take the points of the measurement the error names first.
        named = [i for i, item in enumerate(items) if item[2] == refusal.measurement]
        others = [i for i, item in enumerate(items) if item[2] != refusal.measurement]
        refused = set((named + others)[: refusal.dropped])
    return refused or None


class InfluxSink:
    """Encodes records into line protocol for one logger's identity and endpoint."""

    name = "influxdb"

    def __init__(
        self,
        transport: HttpTransport,
        standard_tags: dict[str, str],
        max_string_bytes: int,
        system_interval: float,
        self_metrics_interval: float | None,
    ) -> None:
        self.transport = transport
        self.standard_tags = standard_tags
        self.fields = FieldEncoder(max_string_bytes)
        self.system_interval = system_interval
        self.self_metrics_interval = self_metrics_interval
        self.watched: list[Channel] = []
        self.submit: Callable[[Record], None] = lambda record: None
        self._series: dict[Any, str] = {}
        self._system: SystemSampler | None = None
        self._gpu: GpuSampler | None = None
        self._last_self_metrics = time.monotonic()
        self._previous_counters: dict[Channel, dict[str, float]] = {}  # counters of the last self-metrics point

    # -- encoding (sender thread) --

    def _series_for(self, measurement: str, tags: dict | None) -> str:
        """Build and cache the escaped `measurement,tags` prefix; "" when the point is invalid."""
        series = self._build_series(measurement, tags or {}) or ""
        if len(self._series) < 10_000:
            self._series[(measurement, tuple(tags.items())) if tags else measurement] = series
        return series

    def _build_series(self, measurement: str, tags: Mapping[Any, Any]) -> str | None:
        if not lp.valid_measurement(measurement):
            warn.warning(f"measurement:{measurement!r}", "dropped points of invalid measurement name %r", measurement)
            return None
        merged = dict(self.standard_tags)
        for key, value in tags.items():
            if value is None or value == "":
                continue
            value = str(value)
            if not (lp.valid_key(key) and lp.valid_name(value)):
                warn.warning(f"tag:{key!r}", "dropped points with invalid tag %r=%r", key, value)
                return None
            if key in merged and merged[key] != value:
                warn.once(
                    f"override:{key}",
                    "log() tag %r=%r overrides the logger's %r=%r for that point (caller's tags win)",
                    key,
                    value,
                    key,
                    merged[key],
                )
            merged[key] = value
        return lp.series_key(measurement, merged)

    def encode(self, record: Record, emit: Callable[[Item], None], drop: Callable[[str, int], None]) -> None:
        measurement, tags, fields, timestamp, with_system, with_gpu = record
        if type(timestamp) is int:
            ts = timestamp
        else:
            try:
                ts = _timestamp_ns(timestamp)
            except (TypeError, ValueError, OverflowError):
                drop("invalid", 1)
                warn.warning("timestamp", "dropped a point with an invalid timestamp %r", timestamp)
                return
        if not MIN_TIME_NS <= ts <= MAX_TIME_NS:
            drop("invalid", 1)
            warn.warning(
                "timestamp-range",
                "dropped a point timestamped %r: outside what InfluxDB stores (1677-2262); "
                "an int is nanoseconds, a float seconds",
                timestamp,
            )
            return
        self._emit_point(measurement, tags, fields, ts, emit, drop)
        if not (with_system or with_gpu):
            return
        now = time.monotonic()
        if with_system:
            if self._system is None:
                self._system = SystemSampler(self.system_interval)
            elif self._system.due(now):
                self._emit_point("system", None, self._system.sample(), ts, emit, drop)
        if with_gpu:
            if self._gpu is None:
                self._gpu = GpuSampler(self.system_interval)
            if self._gpu.due(now):
                for name, gpu_tags, gpu_fields in self._gpu.sample(now):
                    self._emit_point(name, gpu_tags, gpu_fields, ts, emit, drop)

    def _emit_point(
        self,
        measurement: str,
        tags: dict | None,
        fields: Mapping,
        ts: int,
        emit: Callable[[Item], None],
        drop: Callable[[str, int], None],
    ) -> None:
        series = self._series.get((measurement, tuple(tags.items())) if tags else measurement)
        if series is None:
            series = self._series_for(measurement, tags)
        if not series:
            drop("invalid", 1)
            return
        encoded_fields = self.fields.encode(fields, drop)
        if not encoded_fields:
            drop("no_fields", 1)
            return
        try:
            line = f"{series} {encoded_fields} {ts}\n".encode()
        except UnicodeEncodeError:
            drop("invalid", 1)
            warn.warning("unicode", "dropped a point holding text that is not valid Unicode")
            return
        emit((line, len(line), measurement))

    def build_body(self, items: Sequence[Item]) -> bytes:
        return b"".join(item[0] for item in items)

    def items_in_body(self, body: bytes, count: int) -> bool:
        """True when every line of `body` is one item (no string field holds a newline).

        Then a sealed batch keeps only its compressed body, and `items_from_body`
        gives the lines back if the server refuses some of them.
        """
        return body.count(b"\n") == count

    def items_from_body(self, body: bytes) -> list[Item]:
        """The items of a body `items_in_body` accepted: its lines, with their measurement as key."""
        lines = body.split(b"\n")
        lines.pop()  # the body ends with a newline
        return [(line + b"\n", len(line) + 1, lp.measurement_of(line)) for line in lines]

    def on_rejected(self, items: Sequence[Item], response: Response) -> Verdict | None:
        """Which lines of a refused batch InfluxDB stored (counted sent), refused, or must get again.

        See `influx_rejections` for the answers of each InfluxDB version. None (all
        counted `rejected`) when the answer names no line: a refusal of the whole
        request such as a missing database or a bad token.
        """
        refusal = read_refusal(response.body)
        if refusal is None:
            return None
        refused = _refused_indexes(items, refusal)
        if refused is None:
            return None
        kept = [item for index, item in enumerate(items) if index not in refused]
        if refusal.others_stored:
            return Verdict(stored=kept, refused={"rejected": len(refused)})
        return Verdict(refused={"rejected": len(refused)}, resend=kept)

    def on_idle(self, now: float) -> None:
        """Write the watched channels' counters as `telemetry_client` points, once per interval.

        Each counter goes with its growth since this process's previous point
        (`<counter>_delta`), so dashboards add deltas up instead of deriving a rate
        per process under a second aggregation.
        """
        interval = self.self_metrics_interval
        if not interval or now - self._last_self_metrics < interval:
            return
        self._last_self_metrics = now
        ts = time.time_ns()
        for channel in self.watched:
            stats = channel.stats()
            fields = {
                k: float(stats[k])
                for k in ("queued", "sent", "batches", "retries", "pending", "pending_bytes", "bytes_sent", "dropped")
            }
            for reason in DROP_REASONS:  # zeros too: a healthy node shows 0, not "no data"
                fields[f"dropped_{reason}"] = float(stats["dropped_by_reason"].get(reason, 0))
            if "truncated" in stats:
                fields["truncated"] = float(stats["truncated"])
            previous = self._previous_counters.setdefault(channel, {})
            for name in SELF_COUNTERS:
                if name in fields:
                    delta = fields[name] - previous.get(name, 0.0)
                    if delta or name not in SPARSE_DELTAS:
                        fields[name + DELTA_SUFFIX] = delta
                    previous[name] = fields[name]
            self.submit((SELF_METRICS_MEASUREMENT, {"sink": stats["sink"]}, fields, ts, False, False))


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
        network: str | None = None,
        url: str | None = None,
        scheme: str | None = None,
        api_version: int | None = None,
        username: str | None = None,
        password: str | None = None,
        retention_policy: str | None = None,
        verify_tls: bool | None = None,
        ca_certs: str | None = None,
        config_tags: Mapping[str, str] = DEFAULT_CONFIG_TAGS,
        buffer: BufferSettings | None = None,
        compress: bool = True,
        connect_timeout: float = 3.0,
        read_timeout: float = 10.0,
        system_metrics_interval: float = 10.0,
        self_metrics_interval: float | None = 10.0,
        max_string_bytes: int = DEFAULT_MAX_STRING_BYTES,
        enabled: bool = True,
        strict: bool | None = None,
        max_queue_size: int | None = None,
        max_workers: int | None = None,
    ) -> None:
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
        for key, value in self.standard_tags.items():
            if not (lp.valid_key(key) and lp.valid_name(value)):
                raise ConfigurationError(
                    f"tag {key}={value!r} cannot be written to InfluxDB exactly "
                    "(no tab, newline, carriage return or backslash)"
                )
        if prefix and not lp.valid_measurement(prefix):
            raise ConfigurationError(f"prefix {prefix!r} is not a valid measurement name prefix")
        buffer = seed_buffer_arguments(buffer, max_queue_size, max_workers)
        self.settings = influxdb_config(
            url=url,
            host=host,
            port=port,
            scheme=scheme,
            database=database,
            token=token,
            org=org,
            api_version=api_version,
            username=username,
            password=password,
            retention_policy=retention_policy,
            verify_tls=verify_tls,
            strict=strict,
            enabled=enabled,
        )
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
        transport = HttpTransport(
            self.settings.write_url or "",
            dict(self.settings.headers),
            verify_tls=self.settings.verify_tls,
            ca_certs=ca_certs,
            connect_timeout=connect_timeout,
            read_timeout=read_timeout,
            compress=compress,
        )
        self._sink = InfluxSink(
            transport, self.standard_tags, max_string_bytes, system_metrics_interval, self_metrics_interval
        )
        self._channel = Channel(self._sink, buffer)
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
            channel.submit(
                (
                    self._name(measurement),
                    dict(tags) if tags else None,
                    dict(fields) if fields else {},
                    ts,
                    with_system_metrics,
                    with_gpu_metrics,
                )
            )
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
        """Flush within `timeout` s and stop; what is left is counted as dropped (`shutdown`)."""
        return self._channel.close(timeout) if self._channel else 0

    def __enter__(self) -> MetricsLogger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
