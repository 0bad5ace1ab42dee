"""InfluxSink: a MetricsLogger's records as line protocol, and InfluxDB's answers read back.

Runs on the engine's sender thread: tags, the field typing rule (see `fields`),
validation and encoding; partial refusals are read by `rejections`.
"""

from __future__ import annotations

import datetime as dt
import numbers
import operator
import time
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping, Sequence
from typing import Any

from telemetry_client._engine.self_log import warn
from telemetry_client._engine.shipping import Channel, Item, Verdict
from telemetry_client._engine.transport import Response, Transport
from telemetry_client._influx import line_protocol as lp
from telemetry_client._influx.fields import DEFAULT_MAX_STRING_BYTES, FieldEncoder
from telemetry_client._influx.gpu_metrics import GpuSampler
from telemetry_client._influx.records import Record, TagSets, unpack_many
from telemetry_client._influx.rejections import Refusal, read_refusal
from telemetry_client._influx.system_metrics import SystemSampler
from telemetry_client.catalog import DELTA_SUFFIX, DROP_REASONS, LOKI_ONLY_COUNTERS, SELF_COUNTERS, SPARSE_DELTAS
from telemetry_client.errors import ConfigurationError

SELF_METRICS_MEASUREMENT = "telemetry_client"
# The times InfluxDB stores (models/time.go: MinNanoTime = MinInt64 + 2, MaxNanoTime = MaxInt64 - 1);
# a line outside them is refused as "time outside range" or does not parse.
MIN_TIME_NS = -(2**63) + 2
MAX_TIME_NS = 2**63 - 2
_INT = {int}
_NONE = {type(None)}
_LINE = b"%s %s %d\n"  # a point's line: series, fields, timestamp
_LINE_OF = operator.itemgetter(0)  # an item's line


def check_standard_tags(tags: Mapping[str, str]) -> None:
    """Raise ConfigurationError for a standard tag that cannot be written exactly (its text goes in every line)."""
    for key, value in tags.items():
        if not (lp.valid_key(key) and lp.valid_name(value)):
            raise ConfigurationError(
                f"tag {key}={value!r} cannot be written to InfluxDB exactly "
                "(no tab, newline, carriage return or backslash)"
            )


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


def _series_key(measurement: str, tags: Mapping | int | None) -> Any:
    """The key of a series' escaped prefix in the sink's cache (`encode_many` builds it inline).

    Tags that are a `TagSets` number are keyed by it; a copy of tags by their items.
    """
    if type(tags) is int:
        return (measurement, tags)
    return (measurement, tuple(tags.items())) if tags else measurement  # type: ignore[union-attr]


class InfluxSink:
    """Encodes records into line protocol for one logger's identity and endpoint."""

    name = "influxdb"

    def __init__(
        self,
        transport: Transport,
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
        self.tag_sets = TagSets()  # the numbers `MetricsLogger.log` gives its records' tags (see `records`)
        # Set by `MetricsLogger.log` before it queues the first record that asks for system or GPU
        # metrics; until then no record holds SAMPLED, and `unpack_many` looks for none.
        self.sampling_asked = False
        # Set once a line holds a newline of its own (a text field's): until then each line of a
        # body is one item, and `items_in_body` need not count them.
        self._multiline = False
        self._series: dict[Any, bytes] = {}
        self._system: SystemSampler | None = None
        self._gpu: GpuSampler | None = None
        self._last_self_metrics = time.monotonic()
        self._previous_counters: dict[Channel, dict[str, float]] = {}  # counters of the last self-metrics point

    # -- encoding (sender thread) --

    def _series_for(self, measurement: str, tags: dict | int | None) -> bytes:
        """Build and cache the escaped `measurement,tags` prefix; empty when the point is invalid."""
        text = self._build_series(measurement, self.tag_sets.tags(tags) or {}) or ""
        try:
            series = text.encode()
        except UnicodeEncodeError:
            series = b""
            warn.warning("unicode", "dropped a point holding text that is not valid Unicode")
        if len(self._series) < 10_000:
            self._series[_series_key(measurement, tags)] = series
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

    def unpack_many(self, records: list[Any]) -> list[Record]:
        """The records `MetricsLogger.log` queued as the tuples `encode` takes (see `records`)."""
        return unpack_many(records, self.sampling_asked)

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

    def encode_many(self, records: Sequence[Record], start: int) -> tuple[list[Item], int]:
        """The items of `records[start:]` up to the first record that needs `encode`, and that record's index.

        The common point (an int timestamp in range, a valid series, every field a
        finite float or an int up to 2**53, no sampled metrics) is encoded here: the
        same bytes as `encode`, for a fraction of its calls. A chunk of nothing else
        is encoded whole (`_encode_chunk`); otherwise one loop takes points of series
        seen before, and anything else stops it and goes to `encode`, which validates
        and counts it.
        """
        items: list[Item] = []
        append = items.append
        series_of = self._series.get
        if start == 0:
            index = self._encode_chunk(records, items)
            if index is not None:
                return items, index
        plain = self.fields.plain
        for index in range(start, len(records)):
            measurement, tags, fields, ts, with_system, with_gpu = records[index]
            if with_system or with_gpu or type(ts) is not int or not MIN_TIME_NS <= ts <= MAX_TIME_NS:
                return items, index
            try:
                if type(tags) is int:  # `_series_key`, inline
                    series = series_of((measurement, tags))
                else:
                    series = series_of((measurement, tuple(tags.items())) if tags else measurement)
                text = plain(fields) if series else None
                if not text:
                    return items, index
                line = _LINE % (series, text, ts)
            except Exception:  # unhashable tags, text that is not valid Unicode: `encode` says what
                return items, index
            append((line, len(line), measurement))
        return items, len(records)

    def _encode_chunk(self, records: Sequence[Record], items: list[Item]) -> int | None:
        """`encode_many` over a whole chunk of common points: their fields in one `plain_many` call.

        Appends their items to `items` and returns the index it stopped at (a point
        of an invalid series, which `encode` counts), or None, having appended
        nothing, when some record is not a common point: then `encode_many` goes
        record by record. A series not seen before is built here, as `encode` would.
        """
        measurements, tags, field_sets, stamps, with_system, with_gpu = zip(*records, strict=True)
        if any(with_system) or any(with_gpu) or set(map(type, stamps)) != _INT:
            return None
        if not MIN_TIME_NS <= min(stamps) <= max(stamps) <= MAX_TIME_NS:
            return None
        series = self._chunk_series(measurements, tags)
        if series is None:
            return None
        texts = self.fields.plain_many(field_sets)
        if texts is None:
            return None
        end = len(series) if all(series) else series.index(b"")
        lines = list(map(_LINE.__mod__, zip(series[:end], texts, stamps, strict=False)))  # up to `end`
        items.extend(zip(lines, map(len, lines), measurements, strict=False))
        return end

    def _chunk_series(self, measurements: tuple[str, ...], tags: tuple[Any, ...]) -> list[bytes] | None:
        """The points' series up to the first invalid one (empty) included: one `map` when all are known.

        None when some point's tags hold a value that cannot be a key (`log` keeps a
        copy of such tags): `encode_many` then takes the chunk point by point.
        """
        kinds = set(map(type, tags))
        if kinds == _INT:  # `log` with tags: `_series_key`, inline
            keys: tuple[Any, ...] = tuple(zip(measurements, tags, strict=True))
        elif kinds == _NONE:
            keys = measurements
        else:
            keys = tuple(map(_series_key, measurements, tags))
        cache = self._series
        try:
            return list(map(cache.__getitem__, keys))
        except KeyError:  # a series not seen before (the first chunk of each new tag set): built once below
            pass
        except TypeError:  # a tag value that cannot be a key (a list)
            return None
        series = []
        for measurement, point_tags, key in zip(measurements, tags, keys, strict=True):
            try:
                known = cache.get(key)
            except TypeError:  # as above, after a new series
                return None
            if known is None:
                known = self._series_for(measurement, point_tags)
            series.append(known)
            if not known:
                break  # the chunk stops at this point: `encode` counts it
        return series

    def _emit_point(
        self,
        measurement: str,
        tags: dict | int | None,
        fields: Mapping,
        ts: int,
        emit: Callable[[Item], None],
        drop: Callable[[str, int], None],
    ) -> None:
        try:
            series = self._series.get(_series_key(measurement, tags))
        except TypeError:  # a tag value (or, from `encode_lines`, a measurement) that cannot be a dict key
            drop("invalid", 1)
            pairs = tags.items() if isinstance(tags, Mapping) else ()
            unhashable = [(k, v) for k, v in pairs if not isinstance(v, Hashable)]
            if not unhashable:
                warn.warning("measurement-type", "dropped points whose measurement is a %s", type(measurement).__name__)
                return
            key, value = unhashable[0]
            warn.warning(
                f"tag-type:{key!r}",
                "dropped points whose tag %r is a %s: a tag value is a string or a number",
                key,
                type(value).__name__,
            )
            return
        if series is None:
            series = self._series_for(measurement, tags)
        if not series:
            drop("invalid", 1)
            return
        try:
            encoded_fields = self.fields.encode(fields, drop)
        except UnicodeEncodeError:
            drop("invalid", 1)
            warn.warning("unicode", "dropped a point holding text that is not valid Unicode")
            return
        if not encoded_fields:
            drop("no_fields", 1)
            return
        if b"\n" in encoded_fields:
            self._multiline = True
        line = _LINE % (series, encoded_fields, ts)
        emit((line, len(line), measurement))

    def build_body(self, items: Sequence[Item]) -> bytes:
        return b"".join(map(_LINE_OF, items))

    def items_in_body(self, body: bytes, count: int) -> bool:
        """True when every line of `body` is one item (no string field holds a newline).

        Then a sealed batch keeps only its compressed body, and `items_from_body`
        gives the lines back if the server refuses some of them. No name holds a
        newline (a point's are checked by `lp.valid_name`, the standard tags by
        `MetricsLogger`), nor does a number: only a text field can, and `_emit_point`
        notes it; until one does, the lines need no counting.
        """
        return not self._multiline or body.count(b"\n") == count

    def items_from_body(self, body: bytes) -> list[Item]:
        """The items of a body `items_in_body` accepted: its lines, with their measurement as key."""
        lines = body.split(b"\n")
        lines.pop()  # the body ends with a newline
        return [(line + b"\n", len(line) + 1, lp.measurement_of(line)) for line in lines]

    def on_rejected(self, items: Sequence[Item], response: Response) -> Verdict | None:
        """Which lines of a refused batch InfluxDB stored (counted sent), refused, or must get again.

        See `rejections` for the answers of each InfluxDB version. None (all
        counted `rejected`) when the answer names no line: a refusal of the whole
        request such as a missing database or a bad token. A refusal of the whole
        batch for what some lines hold (a field type conflict in a new shard) asks
        for the batch to be split until the lines are named.
        """
        refusal = read_refusal(response.body)
        if refusal is None:
            return None
        if refusal.whole:
            return Verdict(split=True)
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
            for name in LOKI_ONLY_COUNTERS:  # only the Loki handler has these
                if name in stats:
                    fields[name] = float(stats[name])
            previous = self._previous_counters.setdefault(channel, {})
            for name in SELF_COUNTERS:
                if name in fields:
                    delta = fields[name] - previous.get(name, 0.0)
                    if delta or name not in SPARSE_DELTAS:
                        fields[name + DELTA_SUFFIX] = delta
                    previous[name] = fields[name]
            self.submit((SELF_METRICS_MEASUREMENT, {"sink": stats["sink"]}, fields, ts, False, False))


# (measurement, tags or None, fields, timestamp): the arguments of `MetricsLogger.log`.
Point = tuple[str, Mapping[str, Any] | None, Mapping[str, Any], Any]


def _raise_drop(reason: str, count: int) -> None:
    raise ValueError(f"{count} point(s) would be dropped by a MetricsLogger: {reason}")


def encode_lines(
    points: Iterable[Point],
    standard_tags: Mapping[str, str] | None = None,
    *,
    max_string_bytes: int = DEFAULT_MAX_STRING_BYTES,
    on_drop: Callable[[str, int], None] = _raise_drop,
) -> Iterator[bytes]:
    """The line protocol a MetricsLogger with `standard_tags` writes for `points`, one line each.

    For writing history outside a logger's buffer (a backfill): the same encoder,
    tag rule, field typing and timestamp rule (an int is nanoseconds, a float
    seconds, a datetime converted) as `MetricsLogger.log`, no prefix, no system
    metrics. A point the logger would drop calls `on_drop(reason, count)` with the
    drop reason its counters use; by default that raises `ValueError`.
    """
    check_standard_tags(standard_tags or {})
    sink = InfluxSink(None, dict(standard_tags or {}), max_string_bytes, 0.0, None)  # type: ignore[arg-type]
    lines: list[bytes] = []

    def emit(item: Item) -> None:
        lines.append(item[0])

    for measurement, tags, fields, timestamp in points:
        sink.encode((measurement, dict(tags) if tags else None, dict(fields), timestamp, False, False), emit, on_drop)
        yield from lines
        lines.clear()
