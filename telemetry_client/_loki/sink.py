"""The Loki destination of the shipping engine: JSON lines, push bodies, partial rejections.

Runs on the sender thread. A record captured by the handler's `emit()` becomes one
JSON log line; a batch becomes one push body, entries of each stream sorted by
timestamp. The line's JSON keys are `message`, `level`, `logger`, the context
fields (flattened at the top level; a field whose name collides with one of the
reserved keys is written as `ctx_<name>`), `pid`, `thread`, and when present
`exception` and `stack`. Lines longer than `max_line_bytes` are truncated while
staying valid JSON (see `fit_line`).
"""

from __future__ import annotations

import datetime as dt
import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from telemetry_client._engine.self_log import warn
from telemetry_client._engine.shipping import Item, Verdict
from telemetry_client._engine.transport import Response, Transport
from telemetry_client._loki.limits import (
    LEVEL_LABEL,
    LEVEL_VALUES,
    TRUNCATION_MARKER,
    cut_utf8,
    label_string,
    level_label,
)
from telemetry_client._loki.rejections import parse_answer, parse_rate_limit, rate_limit_reason, same_stream

# What emit() captures on the logging thread:
# (ts_ns, levelno, levelname, logger, message, exception text, stack text, pid, thread name,
#  bound context, extra= fields, log_with_context fields)
LokiRecord = tuple[
    int, int, str, str, str, str | None, str | None, int | None, str | None, Mapping | None, dict | None, dict | None
]

RESERVED_KEYS = frozenset({"message", "level", "logger", "pid", "thread", "exception", "stack", "truncated"})
CONTEXT_PREFIX = "ctx_"
# Loki 3.x defaults for structured metadata (limits_config).
MAX_METADATA_ENTRIES = 128
MAX_METADATA_BYTES = 64_000
ITEM_OVERHEAD_BYTES = 32  # timestamp string and JSON punctuation per entry
_METADATA_NAME = re.compile(r"[^a-zA-Z0-9_]")
_SURROGATE = re.compile("[\ud800-\udfff]")
_MARKER_BYTES = len(TRUNCATION_MARKER.encode())


def _safe_str(value: Any) -> str:
    try:
        return str(value)
    except Exception:
        return f"<unprintable {type(value).__name__}>"


def _non_finite(value: float) -> str:
    return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")


def _json_default(value: Any) -> Any:
    """JSON for values json does not know: numpy/torch scalars as numbers, the rest as text."""
    if isinstance(value, set | frozenset | tuple):
        return list(value)
    if isinstance(value, bytes | bytearray):
        return bytes(value).decode("utf-8", "replace")
    if isinstance(value, dt.date | dt.time):
        return value.isoformat()
    item = getattr(value, "item", None)
    if callable(item):
        try:
            scalar = item()
        except Exception:
            scalar = None
        if isinstance(scalar, float) and not math.isfinite(scalar):
            return _non_finite(scalar)
        if isinstance(scalar, int | float | str | bool):
            return scalar
    return _safe_str(value)


def _sanitize(value: Any, depth: int = 0) -> Any:
    """A copy json can always encode: non-finite floats as text, keys as text, depth bounded."""
    if isinstance(value, float):
        return value if math.isfinite(value) else _non_finite(value)
    if isinstance(value, str | int | bool) or value is None:
        return value
    if depth > 16:
        return _safe_str(value)
    if isinstance(value, Mapping):
        return {_safe_str(k): _sanitize(v, depth + 1) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [_sanitize(v, depth + 1) for v in value]
    return _sanitize(_json_default(value), depth + 1)


# Built once: json.dumps() with options would build a new encoder for every line.
_encode = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False, default=_json_default).encode
_encode_sanitized = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), default=_safe_str).encode


def to_json(value: Any) -> str:
    """Compact JSON text for `value`, whatever it holds; never raises."""
    try:
        return _encode(value)
    except (ValueError, TypeError, RecursionError):
        return _encode_sanitized(_sanitize(value))


def utf8(text: str) -> tuple[str, bytes]:
    """`text` and its UTF-8 bytes; lone surrogates (undecodable file names and the like) become U+FFFD."""
    try:
        return text, text.encode("utf-8")
    except UnicodeEncodeError:
        text = _SURROGATE.sub("\ufffd", text)
        return text, text.encode("utf-8")


def fit_line(fields: dict[str, Any], max_bytes: int) -> tuple[str, int, bool]:
    """The JSON line for `fields` in at most `max_bytes` bytes: (line, size, truncated).

    Truncation rule: while the line is too long, the largest field is cut (a
    non-text field is first rendered as JSON text) and ends with the marker
    "…[truncated]"; the line gets `"truncated": true`. The line stays valid JSON.
    Only if that cannot succeed (thousands of fields) is the raw line cut, with the
    same marker at its end.
    """
    line, data = utf8(to_json(fields))
    if len(data) <= max_bytes:
        return line, len(data), False
    fields = dict(fields)
    fields["truncated"] = True
    for _ in range(8):
        overflow = len(data) - max_bytes
        sizes = {k: (len(v) if isinstance(v, str) else len(to_json(v))) for k, v in fields.items() if k != "truncated"}
        if not sizes:
            break
        key = max(sizes, key=sizes.__getitem__)
        value = fields[key]
        text = value if isinstance(value, str) else to_json(value)
        size = len(utf8(text)[1])
        if size <= _MARKER_BYTES:
            break
        fields[key] = cut_utf8(text, size - overflow - _MARKER_BYTES - 16) + TRUNCATION_MARKER
        line, data = utf8(to_json(fields))
        if len(data) <= max_bytes:
            return line, len(data), True
    line = cut_utf8(line, max_bytes - _MARKER_BYTES) + TRUNCATION_MARKER
    return line, len(line.encode("utf-8")), True


def metadata_name(name: str) -> str:
    """A structured metadata name in label syntax (Loki would rewrite other characters the same way)."""
    clean = _METADATA_NAME.sub("_", name) or "_"
    return "_" + clean if clean[0].isdigit() else clean


DISALLOWED_METADATA = "disallowed_structured_metadata"


def _metadata_bytes(metadata: Mapping[str, str] | None) -> int:
    """What an entry's structured metadata adds to its size in a batch."""
    return sum(len(k) + len(v.encode("utf-8")) for k, v in (metadata or {}).items())


def _without_metadata(item: Item) -> Item:
    """The same entry without its structured metadata, its size as `encode` would give it."""
    (key, ts, line, metadata, line_bytes), size, item_key = item
    return (key, ts, line, None, line_bytes), size - _metadata_bytes(metadata), item_key


class LokiSink:
    """Encodes log records for one set of static labels and one push URL.

    Each push carries one stream (`batch_per_key`): Loki answers a push with the
    result of its last stream only (pkg/ingester/instance.go), so a push of several
    streams can be answered 204 while an earlier stream was refused. With one
    stream per push the answer always covers every entry in it.
    """

    name = "loki"
    batch_per_key = True  # the item key is the stream

    def __init__(
        self,
        transport: Transport,
        labels: Mapping[str, str],
        max_line_bytes: int,
        structured_metadata: bool = False,
    ) -> None:
        self.transport = transport
        self.labels = dict(labels)
        self.max_line_bytes = max_line_bytes
        self.structured_metadata = structured_metadata
        self.truncated = 0  # lines shortened to fit max_line_bytes (delivered, not dropped)
        # Entries sent again without their structured metadata, which Loki refused (delivered, not dropped).
        self.metadata_removed = 0
        # One stream per level value: its key (Loki's selector text) and its labels.
        self.streams: dict[str, tuple[str, dict[str, str]]] = {}
        self.labels_by_key: dict[str, dict[str, str]] = {}
        for value in LEVEL_VALUES:
            stream_labels = {**self.labels, LEVEL_LABEL: value}
            key = label_string(stream_labels)
            self.streams[value] = (key, stream_labels)
            self.labels_by_key[key] = stream_labels

    # -- encoding (sender thread) --

    def extra_stats(self) -> dict[str, int]:
        """Merged into the channel's stats: lines shortened to fit (delivered with a marker)."""
        return {"truncated": self.truncated, "metadata_removed": self.metadata_removed}

    def encode(self, record: LokiRecord, emit: Callable[[Item], None], drop: Callable[[str, int], None]) -> None:
        ts, levelno, levelname, logger, message, exception, stack, pid, thread, bound, extra, call = record
        fields: dict[str, Any] = {"message": message, "level": levelname.lower(), "logger": logger}
        context: dict[str, Any] = {}
        for source in (bound, extra, call):
            if source:
                for key, value in source.items():
                    key = key if isinstance(key, str) else _safe_str(key)
                    context[CONTEXT_PREFIX + key if key in RESERVED_KEYS else key] = value
        fields.update(context)
        fields["pid"] = pid
        fields["thread"] = thread
        if exception:
            fields["exception"] = exception
        if stack:
            fields["stack"] = stack
        line, line_bytes, truncated = fit_line(fields, self.max_line_bytes)
        if truncated:
            self.truncated += 1
        metadata = self._metadata(context) if self.structured_metadata and context else None
        size = line_bytes + ITEM_OVERHEAD_BYTES
        if metadata:
            size += _metadata_bytes(metadata)
        key = self.streams[level_label(levelno)][0]
        emit(((key, ts, line, metadata, line_bytes), size, key))

    def _metadata(self, context: Mapping[str, Any]) -> dict[str, str] | None:
        """Context fields as Loki structured metadata (string values), within Loki's default limits."""
        metadata: dict[str, str] = {}
        total = 0
        for key, value in context.items():
            if len(metadata) >= MAX_METADATA_ENTRIES:
                break
            name = metadata_name(key)
            text = utf8(value if isinstance(value, str) else to_json(value))[0]
            size = len(name) + len(text.encode("utf-8"))
            if total + size > MAX_METADATA_BYTES:
                continue  # the field stays in the line; only the metadata copy is left out
            metadata[name] = text
            total += size
        return metadata or None

    def build_body(self, items: Sequence[Item]) -> bytes:
        streams: dict[str, list[tuple[int, str, dict[str, str] | None]]] = {}
        for (key, ts, line, metadata, _), _size, _key in items:
            entries = streams.get(key)
            if entries is None:
                entries = streams[key] = []
            entries.append((ts, line, metadata))
        body = []
        for key, entries in streams.items():
            entries.sort(key=lambda entry: entry[0])  # stable: equal timestamps keep their order
            values = [
                [str(ts), line] if metadata is None else [str(ts), line, metadata] for ts, line, metadata in entries
            ]
            body.append({"stream": self.labels_by_key[key], "values": values})
        return _encode_sanitized({"streams": body}).encode("utf-8")

    def _named(self, items: Sequence[Item], text: str) -> tuple[list[Item], list[tuple[Item, str]]] | None:
        """Split `items` by a Loki answer: (stored, [(refused item, Loki's reason)]); None if it names none of ours.

        The ingester lists at most ten refused entries of a stream but gives their
        total; the difference is taken from the stream's last entries, so the counts
        are exact (which entries they are is exact only when all are listed).
        """
        rejections, totals = parse_answer(text)
        if not rejections and not totals:
            return None
        stored: list[Item] = []
        refused: list[tuple[Item, str]] = []
        refused_by_key: dict[str, int] = {}
        counted: dict[int, list[Item]] = {}  # a rejection with a count: the entries it matches
        for item in items:
            key, ts, _line, metadata, line_bytes = item[0]
            labels = self.labels_by_key.get(key, {})
            index = next((i for i, r in enumerate(rejections) if r.matches(labels, ts, line_bytes, metadata)), None)
            if index is None:
                stored.append(item)
            elif rejections[index].count is not None:
                counted.setdefault(index, []).append(item)
            else:
                refused.append((item, rejections[index].reason))
                refused_by_key[key] = refused_by_key.get(key, 0) + 1
        for index, matching in counted.items():  # Loki refused the oldest of them, as many as it says
            matching.sort(key=lambda item: item[0][1])
            limit = rejections[index].count or 0
            for item in matching[:limit]:
                refused.append((item, rejections[index].reason))
                refused_by_key[item[2]] = refused_by_key.get(item[2], 0) + 1
            stored.extend(matching[limit:])
        for total in totals:  # entries refused beyond the ten the ingester lists
            key = next((k for k, labels in self.labels_by_key.items() if same_stream(total.labels, labels)), None)
            missing = total.count - refused_by_key.get(key, 0) if key is not None else 0
            while missing > 0:
                index = next((i for i in range(len(stored) - 1, -1, -1) if stored[i][2] == key), None)
                if index is None:
                    break
                refused.append((stored.pop(index), total.reason))
                missing -= 1
        if not refused:
            return None
        for rejection in rejections:
            if rejection.line_longer_than is not None and rejection.line_longer_than < self.max_line_bytes:
                warn.once(
                    "loki:max_line_size",
                    "Loki's max_line_size is %d bytes, below max_line_bytes=%d: lower max_line_bytes to match "
                    "(longer lines are refused, not truncated)",
                    rejection.line_longer_than,
                    self.max_line_bytes,
                )
        return stored, refused

    def on_rejected(self, items: Sequence[Item], response: Response) -> Verdict | None:
        """After a 4xx: Loki stored every entry it did not name; the named ones are refused, with Loki's reason.

        Nothing Loki stored is resent: it keeps a second copy of an entry it already
        stored once the stream's head block has moved on. An entry refused only for
        its structured metadata (`allow_structured_metadata: false`; grafana/loki
        pkg/distributor/validator.go, validateEntry) is sent again without it, and so
        is every later entry: the line still holds every field.
        """
        if response.status != 400:
            return None
        named = self._named(items, response.body.decode("utf-8", "replace"))
        if named is None:
            return None  # a text this client cannot read, or naming nothing we sent: counted `rejected`
        stored, refused = named
        counts: dict[str, int] = {}
        resend: list[Item] = []
        for item, reason in refused:
            if reason == DISALLOWED_METADATA and item[0][3]:
                resend.append(_without_metadata(item))
                continue
            counts[reason] = counts.get(reason, 0) + 1
        if resend:
            self.metadata_removed += len(resend)
            if self.structured_metadata:
                self.structured_metadata = False
                warn.once(
                    "loki:structured-metadata-disallowed",
                    "Loki refuses structured metadata (limits_config.allow_structured_metadata is false): entries "
                    "are sent without it from now on, their fields still in the line; set structured_metadata=False "
                    "or allow it in Loki",
                )
        return Verdict(stored=stored, refused=counts, resend=resend)

    def on_throttled(self, items: Sequence[Item], response: Response) -> Verdict | None:
        """After a 429: the entries Loki stored anyway, and the ones to send again.

        With per-stream limits applied entry by entry (`shard_streams` disabled), the
        ingester stores what fits and answers 429 listing the rest; resending the
        whole push would store the others twice. A 429 naming no entry (the tenant's
        limit, or a stream refused whole) stored nothing: None, send it all again.
        """
        named = self._named(items, response.body.decode("utf-8", "replace"))
        if named is None or not named[0]:
            return None
        stored, refused = named
        return Verdict(stored=stored, resend=[item for item, _reason in refused])

    def rate_limit(self, response: Response) -> tuple[str, int | None]:
        """Loki's reason and limit (bytes per second) for a 429 answer, for the engine's split-and-retry."""
        text = response.body.decode("utf-8", "replace")
        return rate_limit_reason(text), parse_rate_limit(text)

    def on_idle(self, now: float) -> None:
        """Nothing periodic: the handler's counters are written by a watching MetricsLogger."""
