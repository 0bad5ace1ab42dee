"""The shipping engine shared by metrics and logs.

One background sender thread per process drains every channel. A channel is one
destination (an InfluxDB write URL, a Loki push URL) with its own bounded buffer,
batches and counters. Callers only append to a deque: they never touch the
network, never wait on a lock held across I/O and never see an exception.

Buffer policy: **drop oldest**, across everything buffered. `max_items` and
`max_bytes` bound the records not yet encoded, the batches being filled and the
sealed batches together; beyond them the oldest data goes first, whether encoded
or not, and is counted under `buffer_full`. The sender keeps encoding while a
request is in flight, so records do not pile up raw behind a slow server. The one
batch never dropped is the one whose request is unanswered (in flight, or timed
out and waiting to be sent again): the server may have stored it. The size of
records not yet encoded is estimated from a sample of them (see `estimate_size`).

Counters add up at every moment: `queued` = `sent` + `pending` + `unconfirmed` +
the drops of whole items (`dropped` less `dropped_values`, the parts of items such
as field values that were left out of an item sent on). See `Channel.stats`.
"""

from __future__ import annotations

import contextlib
import itertools
import operator
import os
import random
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from telemetry_client._engine import lifecycle
from telemetry_client._engine.lifecycle import exit_timeout
from telemetry_client._engine.retry import backoff_delay, parse_retry_after
from telemetry_client._engine.self_log import warn
from telemetry_client._engine.transport import Answer, Response, Transport, TransportError

# An encoded unit ready to send: (payload, size in bytes, accounting key such as a
# measurement name or a stream).
Item = tuple[Any, int, str]

RETRYABLE_STATUS = frozenset({408, 425, 429})  # and every 5xx
TOO_MANY_REQUESTS = 429
BAD_GATEWAY = 502  # a proxy (the edge) could not reach the server: as a refused connection behind it
UNREACHABLE_RETRY_CAP = 1.0  # seconds: the longest wait before trying a server that refused the connection again
ANSWER_POLL = 0.02  # seconds the sender waits on an unanswered request before looking for new records
CLOSE_MARGIN = 0.2  # seconds of the exit deadline kept for closing after delivery stops (at most a tenth of it)
SPLIT_AFTER_429S = 2  # consecutive 429s on a batch before it is halved
GIVE_UP_AFTER_429S = 6  # consecutive 429s on a single item larger than the stated rate before it is dropped
LOOK_INTERVAL = 0.001  # seconds of encoding between two looks at whether the server has answered
# Seconds: a longer wait for an answer counts as this much in its moving average, so that
# the first look (at half of it) never comes more than 50 ms after an exit deadline.
MAX_ANSWER_TIME = 0.1
# Records encoded in one step: `encode_chunk`'s while a request is in flight, and `pump`'s
# between two checks for a sealed batch that may be sent.
OVERLAP_CHUNK = 100
# A request unanswered this long (seconds) means the server is not keeping up: the
# buffer's bounds then drop the oldest data, encoded or not (see `_spared`).
STALLED_AFTER = 1.0
RECORD_SAMPLE_MASK = 63  # the size of one drained record in 64 is measured
DEFAULT_RECORD_BYTES = 1024.0  # the size assumed for a raw record until one has been measured
_SIZE_OF = operator.itemgetter(1)  # an item's size in bytes


@dataclass(frozen=True)
class BufferSettings:
    """Bounds, batching and retry settings of one channel."""

    max_items: int = 200_000
    max_bytes: int = 64 * 1024 * 1024
    batch_items: int = 5_000
    batch_bytes: int = 1024 * 1024
    flush_interval: float = 1.0  # a partial batch is sent once it is this old (seconds)
    max_age: float | None = None  # buffered data older than this is expired (None: never)
    retry_base: float = 0.5
    retry_cap: float = 30.0
    max_retry_after: float = 300.0  # a longer Retry-After is capped to this

    def __post_init__(self) -> None:
        for name in ("max_items", "max_bytes", "batch_items", "batch_bytes"):
            if getattr(self, name) < 1:
                raise ValueError(f"BufferSettings.{name} must be at least 1, got {getattr(self, name)}")
        if self.batch_items > self.max_items or self.batch_bytes > self.max_bytes:
            raise ValueError("BufferSettings: a batch must fit in the buffer (batch_* <= max_*)")
        if self.flush_interval <= 0:
            raise ValueError(f"BufferSettings.flush_interval must be > 0, got {self.flush_interval}")
        if self.max_age is not None and self.max_age <= 0:
            raise ValueError(f"BufferSettings.max_age must be > 0 or None, got {self.max_age}")
        if self.retry_base <= 0 or self.retry_cap < self.retry_base:
            raise ValueError("BufferSettings: need 0 < retry_base <= retry_cap")


@dataclass(frozen=True)
class Verdict:
    """A sink's reading of a non-retryable 4xx answer: what the server stored, refused, or should get again.

    Real servers accept part of a batch. InfluxDB stores the valid lines and answers
    400 naming (1.x: counting) the bad ones; Loki stores every entry it does not name.
    So a refusal is not "the batch failed": `stored` items are counted sent, `refused`
    counts go to their drop reasons, `resend` items are sealed again (never items the
    server already stored: Loki keeps duplicates). Items the verdict does not account
    for are counted `rejected`, never sent.

    `split`: the server refused the whole batch for what some of its lines hold,
    without naming them (InfluxDB 1.x's `field type conflict` in a new shard, see
    `_influx/rejections.py`). The batch is sent again in halves, as after repeated
    429s, until the refusals name their lines or a lone item is refused: only those
    are counted `rejected`.
    """

    stored: Sequence[Item] = ()
    refused: Mapping[str, int] = field(default_factory=dict)  # drop reason -> number of items
    resend: Sequence[Item] = ()
    split: bool = False


class Sink(Protocol):
    """What a destination provides to the engine: encoding and the request body."""

    name: str
    transport: Transport

    def encode(self, record: Any, emit: Callable[[Item], None], drop: Callable[[str, int], None]) -> None:
        """Turn one caller record into items (call `emit`), counting what it drops (`drop(reason, count)`).

        `drop(reason, count)` counts items dropped whole (a record's point that is
        invalid); `drop.part(reason, count)`, when the engine's `drop` has it, counts
        parts left out of an item that is still emitted (field values). Each record
        should emit an item or count one dropped whole.
        """

    def build_body(self, items: Sequence[Item]) -> bytes:
        """The uncompressed request body for a batch."""

    def on_rejected(self, items: Sequence[Item], response: Response) -> Verdict | None:
        """After a non-retryable 4xx: how the batch's items fared (None: all refused, reason `rejected`)."""

    def on_idle(self, now: float) -> None:
        """Called on the sender thread at every wake-up; for periodic work such as self-metrics."""

    # Optional: `extra_stats() -> dict[str, int]`, counters of the sink merged into `Channel.stats()`.
    # Optional: `unpack_many(records) -> records`, the records as submitted made the form `encode`
    # takes, one for one, in order (called once per chunk taken, before `encode_many` and `encode`).
    # Optional: `encode_many(records, start) -> (items, index)`, the items of `records[start:]`
    # up to the first record that needs `encode` (and its index): one item per record, the
    # same items `encode` would emit, without counting anything. A fast path for the
    # common record.
    # Optional, together: `items_in_body(body: bytes, count: int) -> bool`, True when
    # `items_from_body(body) -> list[Item]` gives back exactly the `count` items of this
    # uncompressed body. Then a sealed batch keeps only its compressed body, and the
    # items are rebuilt when a refusal or a 429 needs them. Without them a sealed
    # batch keeps its items too (counted in the byte bound).


class Counter:
    """A counter callers bump without taking a lock: itertools.count's `next` is atomic in CPython.

    The value is read from the counter's repr (`count(N)`), which every Python
    version keeps; its pickling hook, which once exposed it, is gone in 3.14.
    """

    def __init__(self) -> None:
        self._count = itertools.count()

    def add(self) -> None:
        next(self._count)

    @property
    def value(self) -> int:
        return int(repr(self._count)[6:-1])


@dataclass
class _Batch:
    """Items being collected (`items`), or a sealed batch ready to send (`body` set).

    Sealing builds and compresses the request body once, so a buffer that fills
    through an outage holds compressed bytes, and retries re-send the same body.
    Items are kept after sealing only when the sink cannot rebuild them from the
    body (see `Sink`): `on_rejected` and a split after 429s need them.
    """

    items: list[Item] = field(default_factory=list)
    nbytes: int = 0  # uncompressed payload bytes, for batch sizing
    created: float = 0.0  # monotonic time of its first item
    count: int = 0
    body: bytes = b""
    key_counts: dict[str, int] = field(default_factory=dict)
    throttled: int = 0  # consecutive 429 answers
    unanswered: bool = False  # a request for it was sent and got no answer: the server may have stored it

    @property
    def memory(self) -> int:
        """Bytes this sealed batch holds in the buffer."""
        return len(self.body) + (self.nbytes if self.items else 0)


class _EncodeDrops:
    """The `drop` a sink's `encode` gets: `drop(reason, count)` for whole items, `drop.part(...)` for parts of one.

    Both count under `reason`. The channel keeps the two apart so that its
    counters add up: an item dropped whole is one of the items `queued` counts,
    a field value left out of a point that is sent is not.
    """

    __slots__ = ("_channel",)

    def __init__(self, channel: Channel) -> None:
        self._channel = channel

    def __call__(self, reason: str, count: int = 1) -> None:
        channel = self._channel
        channel._drop(reason, count)
        channel._produced += count

    def part(self, reason: str, count: int = 1) -> None:
        channel = self._channel
        channel._drop(reason, count)
        channel.dropped_values += count


class Channel:
    """One destination's buffer, batches, retry state and counters."""

    def __init__(self, sink: Sink, settings: BufferSettings | None = None) -> None:
        lifecycle.sigterm_wanted()  # a bad TELEMETRY_HANDLE_SIGTERM raises here, before anything starts
        self.sink = sink
        self.settings = settings or BufferSettings()
        self._engine = get_engine()
        self._items_in_body = getattr(sink, "items_in_body", None)
        self._encode_many = getattr(sink, "encode_many", None)
        self._unpack_many = getattr(sink, "unpack_many", None)
        self._batch_per_key = bool(getattr(sink, "batch_per_key", False))
        self._reset_state()
        self._engine.register(self)
        lifecycle.maybe_install_sigterm_handler()

    def _reset_state(self) -> None:
        """Fresh buffers, locks and counters (at construction and in a forked child)."""
        self._intake: deque[Any] = deque()
        self._record_bytes = DEFAULT_RECORD_BYTES  # estimated memory of one raw record
        self._record_sampled = False
        self._set_intake_limit(self.settings.max_items)
        self._in_flight: _Batch | None = None  # the batch whose request the sender is making
        self._in_flight_since = 0.0  # when that request started (monotonic)
        # Seconds from a request's start until the sender saw its answer (a moving average; the
        # delay of its looks included).
        self._answer_time = 0.0
        self._answering = False  # a delivery, and no failure since (see `_spared`)
        self._unconfirmed_batch: _Batch | None = None  # the one close() counted unconfirmed, until answered
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._partials: dict[str, _Batch] = {}  # one per key when the sink sends one key per request
        self._backlog: deque[_Batch] = deque()
        self._backlog_items = 0
        self._backlog_bytes = 0
        self._attempt = 0
        self._next_attempt = 0.0
        self._closed = False
        self._flush_requested = False
        self._rng = jitter_rng()
        self._intake_drops = Counter()
        self._sampled_out = Counter()
        self._after_close_drops = Counter()
        self._encode_drops = _EncodeDrops(self)
        self._produced = 0  # items emitted by encoding, plus items it dropped whole
        self._cleared = 0  # records close() discarded before they were encoded
        self.drained = 0
        self.dropped_values = 0  # parts of items (field values) left out of items sent on, counted in `dropped`
        self.unconfirmed = 0  # items of requests unanswered when the channel closed: maybe stored
        self.sent = 0
        self.batches = 0
        self.bytes_sent = 0
        self.retries = 0
        self.dropped: dict[str, int] = {}
        self.sent_by_key: dict[str, int] = {}
        self.last_error: str | None = None
        self.last_error_time: float | None = None
        self.sink.transport.reset()

    # ---- caller side: cheap, never blocks on I/O, never raises ------------------

    def submit(self, record: Any) -> None:
        """Queue one record for the sender thread."""
        if self._closed:
            self._after_close_drops.add()
            return
        intake = self._intake
        if len(intake) >= self._intake_limit:
            try:
                intake.popleft()
            except IndexError:  # the sender took them all meanwhile: nothing dropped
                pass
            else:
                self._intake_drops.add()
        intake.append(record)
        engine = self._engine
        if not engine.running:
            engine.start()
        if len(intake) >= self._wake_at and not engine.woken:
            engine.woken = True
            engine.wake.set()

    def count_sampled_out(self) -> None:
        """Count a record that `sample_rate` chose not to keep."""
        self._sampled_out.add()

    # ---- sender side -----------------------------------------------------------

    def _drop(self, reason: str, count: int = 1) -> None:
        """Count `count` records dropped for `reason` (sender thread, or with the lock held)."""
        if count:
            self.dropped[reason] = self.dropped.get(reason, 0) + count

    def _emit(self, item: Item) -> None:
        self._produced += 1
        self._add(item)

    def _add(self, item: Item) -> None:
        """Put an item in the batch being filled for its key; seal the batch once full."""
        key = item[2] if self._batch_per_key else ""
        batch = self._partials.get(key)
        if batch is None:
            batch = self._partials[key] = _Batch(created=time.monotonic())
        batch.items.append(item)
        batch.nbytes += item[1]
        if len(batch.items) >= self.settings.batch_items or batch.nbytes >= self.settings.batch_bytes:
            self._seal_partial(key)

    def _add_many(self, items: list[Item]) -> None:
        """`_add` for each item, whole slices at a time while a batch's byte bound is not near."""
        if self._batch_per_key:
            for item in items:
                self._add(item)
            return
        s = self.settings
        position = 0
        while position < len(items):
            batch = self._partials.get("")
            if batch is None:
                batch = self._partials[""] = _Batch(created=time.monotonic())
            part = items[position : position + s.batch_items - len(batch.items)]
            position += len(part)
            nbytes = sum(map(_SIZE_OF, part))
            if batch.nbytes + nbytes >= s.batch_bytes:
                for item in part:  # the byte bound falls inside this slice: item by item
                    self._add(item)
                continue
            batch.items.extend(part)
            batch.nbytes += nbytes
            if len(batch.items) >= s.batch_items:
                self._seal_partial("")

    def _seal_partial(self, key: str) -> None:
        batch = self._partials.pop(key, None)
        if batch is not None and batch.items:
            self._seal(batch, append=True)

    def _partial_items(self) -> int:
        return sum(len(batch.items) for batch in self._partials.values())

    def _partial_bytes(self) -> int:
        return sum(batch.nbytes for batch in self._partials.values())

    def _seal(self, batch: _Batch, append: bool) -> None:
        """Build the batch's compressed body and put it in the backlog (at the end, or first)."""
        items = batch.items
        batch.count = len(items)
        try:
            raw = self.sink.build_body(items)
            batch.body = self.sink.transport.encode_body(raw)
        except Exception:
            self._drop("encode_error", batch.count)
            warn.warning(f"{self.sink.name}:body", "%s: could not build a request", self.sink.name, exc_info=True)
            return
        counts = batch.key_counts
        for item in items:
            counts[item[2]] = counts.get(item[2], 0) + 1
        if self._items_in_body is not None and self._items_in_body(raw, batch.count):
            batch.items = []  # rebuilt from the body if a refusal needs them (`_items_of`)
        if append:
            self._backlog.append(batch)
        else:
            self._backlog.appendleft(batch)
        self._backlog_items += batch.count
        self._backlog_bytes += batch.memory

    def _items_of(self, batch: _Batch) -> list[Item]:
        """A sealed batch's items: those it kept, or rebuilt from its body; [] when neither works."""
        if batch.items or not batch.count or self._items_in_body is None:
            return batch.items
        name = self.sink.name
        try:
            items = self.sink.items_from_body(self.sink.transport.decode_body(batch.body))  # type: ignore[attr-defined]
        except Exception:
            warn.warning(f"{name}:rebuild", "%s: could not rebuild a batch's items", name, exc_info=True)
            return []
        return items if len(items) == batch.count else []

    def _pop_oldest(self) -> _Batch:
        batch = self._backlog.popleft()
        self._backlog_items -= batch.count
        self._backlog_bytes -= batch.memory
        return batch

    def _pinned(self) -> _Batch | None:
        """The oldest batch when its request is unanswered (in flight, or timed out): it is never dropped.

        The server may have stored it, so dropping it would count as lost what may be
        stored. It is sent again until answered, or counted `unconfirmed` at close.
        Only the oldest batch is ever sent, so only it can be unanswered.
        """
        if self._backlog:
            first = self._backlog[0]
            if first is self._in_flight or first.unanswered:
                return first
        return None

    def _keeping_up(self, now: float) -> bool:
        """The server answers: its last request was delivered, and the one in flight is not stalled."""
        if not self._answering:
            return False
        return self._in_flight is None or now - self._in_flight_since < STALLED_AFTER

    def _spared(self, now: float) -> tuple[int, bool]:
        """What the bounds may not drop: how many batches at the backlog's front, and whether the partial ones.

        Always the batch in flight (`_pinned`). While the server keeps up, also the
        next batch and the ones being filled: they are the sender's work of the coming
        milliseconds, so callers that log faster than the sender can encode (busy
        threads share one interpreter) lose their oldest records before any work is
        spent on them, and the sender's share is delivered. Otherwise (an outage, a
        hang) the oldest data goes, encoded or not.
        """
        pinned = 0 if self._pinned() is None else 1
        if self._keeping_up(now):
            return min(len(self._backlog), pinned + 1), True
        return pinned, False

    def _pop_droppable(self, spared: int) -> _Batch | None:
        """Take out the oldest batch that may be dropped (after the first `spared`), if any."""
        backlog = self._backlog
        if len(backlog) <= spared:
            return None
        if not spared:
            return self._pop_oldest()
        front = [backlog.popleft() for _ in range(spared)]
        try:
            return self._pop_oldest()
        finally:
            backlog.extendleft(reversed(front))

    def _encode_intake(self, records: int) -> None:
        """Encode up to `records` records from the intake, in order.

        The sink's `encode_many`, when it has one, takes the common records in one
        loop; each record it stops at goes through `encode`, one at a time.
        """
        chunk = self._take(records)
        if not chunk:
            return
        before = self.drained
        self.drained += len(chunk)
        for position in range(-(before + 1) % (RECORD_SAMPLE_MASK + 1), len(chunk), RECORD_SAMPLE_MASK + 1):
            self._sample_record(chunk[position])
        if self._unpack_many is not None:
            try:
                chunk = self._unpack_many(chunk)
            except Exception:  # the sink's bug: its records cannot be encoded
                self._encode_drops("encode_error", len(chunk))
                warn.warning(f"{self.sink.name}:unpack", "%s: unpack_many failed", self.sink.name, exc_info=True)
                return
        encode_many = self._encode_many
        position = 0
        while position < len(chunk):
            if encode_many is not None:
                try:
                    items, position = encode_many(chunk, position)
                except Exception:  # the sink's bug: the rest of the chunk takes the general path
                    warn.warning(
                        f"{self.sink.name}:encode_many", "%s: encode_many failed", self.sink.name, exc_info=True
                    )
                    encode_many = None
                else:
                    self._produced += len(items)
                    self._add_many(items)
                    if position >= len(chunk):
                        break
            self._encode_one(chunk[position])
            position += 1

    def _take(self, records: int) -> list[Any]:
        """Up to `records` records from the front of the intake (callers may pop its oldest meanwhile)."""
        intake = self._intake
        chunk: list[Any] = []
        take = intake.popleft
        try:
            for _ in range(min(records, len(intake))):
                chunk.append(take())
        except IndexError:  # `submit` dropped the oldest meanwhile: there were fewer
            pass
        return chunk

    def _encode_one(self, record: Any) -> None:
        """A record through the sink's `encode`; a record that raises or yields nothing is counted `encode_error`."""
        drop = self._encode_drops
        produced = self._produced
        try:
            self.sink.encode(record, self._emit, drop)
        except Exception:
            drop("encode_error")
            warn.warning(f"{self.sink.name}:encode", "%s: could not encode a record", self.sink.name, exc_info=True)
        else:
            if self._produced == produced:  # neither emitted nor counted: the sink's bug, kept in the books
                drop("encode_error")
                warn.warning(f"{self.sink.name}:lost", "%s: a record was encoded into nothing", self.sink.name)

    def _sample_record(self, record: Any) -> None:
        """Update the raw-record size estimate: the first sample, then a moving average."""
        size = estimate_size(record)
        if self._record_sampled:
            self._record_bytes += (size - self._record_bytes) * 0.25
        else:
            self._record_bytes = float(size)
            self._record_sampled = True

    def _intake_bytes(self) -> int:
        """Estimated memory of the records waiting to be encoded."""
        return int(len(self._intake) * self._record_bytes)

    def _buffered_items(self) -> int:
        return len(self._intake) + self._partial_items() + self._backlog_items

    def _buffered_bytes(self) -> int:
        return self._intake_bytes() + self._partial_bytes() + self._backlog_bytes

    def _update_intake_limit(self, spared: int, partials_spared: bool) -> None:
        """How many records `submit` lets wait: the whole bound, less what the bounds spare.

        Records waiting to be encoded are the newest data, so they may push out every
        older batch that is not spared: the sender, which keeps encoding, drops those
        (`_enforce_bounds`). `submit` drops its own oldest record once the records
        fill what is left.
        """
        s = self.settings
        kept = [self._backlog[i] for i in range(spared)]
        if partials_spared:
            kept.extend(self._partials.values())
        items = s.max_items - sum(batch.count or len(batch.items) for batch in kept)
        room = s.max_bytes - sum(batch.memory for batch in kept)
        self._set_intake_limit(max(1, min(items, int(room / self._record_bytes))))

    def _set_intake_limit(self, limit: int) -> None:
        """How many records the intake may hold, and how many waiting wake the sender (`submit`).

        A full batch wakes it, or half the limit when that is less than a batch (a
        small `max_bytes`): otherwise the intake would fill and drop its oldest while
        the sender sleeps (up to 1 s), however fast the server.
        """
        self._intake_limit = limit  # records the intake may hold (see _update_intake_limit)
        self._wake_at = min(self.settings.batch_items, max(1, limit // 2))

    def _enforce_bounds(self, now: float) -> None:
        """Drop the oldest data not spared, encoded or not, until everything buffered fits the bounds."""
        s = self.settings
        spared, partials_spared = self._spared(now)
        while self._buffered_items() > s.max_items or self._buffered_bytes() > s.max_bytes:
            lost = self._pop_droppable(spared)
            if lost is None:
                if partials_spared or not self._partials:
                    break  # what is left over the bound is the newest records: `submit` drops their oldest
                key = min(self._partials, key=lambda k: self._partials[k].created)  # older than any record waiting
                lost = self._partials.pop(key)
                lost.count = len(lost.items)
            self._drop("buffer_full", lost.count)
            self._attempt = 0
            warn.warning(
                f"{self.sink.name}:full",
                "%s: buffer full (%d items, %d bytes): dropped the oldest %d items",
                self.sink.name,
                s.max_items,
                s.max_bytes,
                lost.count,
            )
        if s.max_age is not None:
            while True:
                index = 0 if self._pinned() is None else 1
                if len(self._backlog) <= index or now - self._backlog[index].created <= s.max_age:
                    break
                self._drop("expired", self._pop_droppable(index).count)  # type: ignore[union-attr]
                self._attempt = 0
        self._update_intake_limit(*self._spared(now))

    def pump(self, deadline: float | None) -> float:
        """Send, encode and batch what is due; return seconds until this channel next needs a wake-up.

        A batch ready to send goes before any more encoding, and encoding stops once a
        batch is sealed that may be sent now: the server works on it while the sender
        encodes (`_wait_for_answer`). While the next attempt waits (an outage), the
        whole round is encoded before the bounds are enforced: records still waiting
        count at their raw size (about 70 times an encoded point's), and would push
        out batches they will shrink to fit beside. Two rounds of `_send_due`, so a
        channel keeps the sender up to about 0.5 s before the next one's turn.
        """
        sent_first = self._send_due(deadline)
        now = time.monotonic()  # after the sends, which may have taken a while
        with self._lock:
            sealed = len(self._backlog)
            for _ in range(max(1, 2 * self.settings.batch_items // OVERLAP_CHUNK)):
                self._encode_intake(OVERLAP_CHUNK)
                if not self._intake or (len(self._backlog) > sealed and time.monotonic() >= self._next_attempt):
                    break  # a batch is ready and may be sent: it goes before more is encoded
            for key, partial in list(self._partials.items()):
                if self._flush_requested or now - partial.created >= self.settings.flush_interval:
                    self._seal_partial(key)
            self._changed.notify_all()
        # The bounds are enforced after the attempt that is due: before it, callers that
        # fill the intake would make every batch just sealed the oldest data, and leave
        # nothing to send. If the attempt fails, the oldest is dropped all the same.
        sent_any = self._send_due(deadline) or sent_first
        with self._lock:
            self._enforce_bounds(time.monotonic())
            self._changed.notify_all()
            if self._intake:
                return 0.0
            waits = []
            for partial in self._partials.values():
                waits.append(partial.created + self.settings.flush_interval - time.monotonic())
            if self._backlog:
                waits.append(0.0 if sent_any else self._next_attempt - time.monotonic())
            return max(0.0, min(waits)) if waits else self.settings.flush_interval

    def _send_due(self, deadline: float | None) -> bool:
        """Send backlog batches while the server takes them; at most ~0.25 s per call for fairness."""
        started = time.monotonic()
        sent_any = False
        while True:
            now = time.monotonic()
            with self._lock:
                if self._closed or not self._backlog or now < self._next_attempt or now - started > 0.25:
                    return sent_any
                batch = self._in_flight = self._backlog[0]
                self._in_flight_since = now
            if not self._send(batch, deadline):
                return sent_any
            sent_any = True

    def _send(self, batch: _Batch, deadline: float | None) -> bool:
        """One attempt at the oldest batch (`_in_flight`). True when it left the backlog (sent or dropped)."""
        transport = self.sink.transport
        body = batch.body
        cap = None if deadline is None else deadline - time.monotonic()
        response: Response | None = None
        error = None
        sent = refused = connection_lost = False
        try:
            pending = transport.start(body, timeout_cap=cap)
            sent = True
            self._wait_for_answer(pending)
            response = pending.finish()
        except TransportError as exc:
            error = str(exc)
            refused = getattr(exc, "refused", False)
            connection_lost = getattr(exc, "lost", False)
        except BaseException:  # a transport's bug: the engine logs it; the batch is no longer in flight
            with self._lock:
                self._in_flight = None
            raise
        with self._lock:
            self._in_flight = None
            if self._closed:
                self._settle_after_close(batch, response, sent)
                return True
            if response is None:
                batch.unanswered = batch.unanswered or sent  # sent, then no answer: the server may have it
            if response is not None and 200 <= response.status < 300:
                self._pop_oldest()
                self._delivered(batch)
                return True
            if response is not None and response.status < 500 and response.status not in RETRYABLE_STATUS:
                return self._rejected(batch, response)
            self._answering = False  # a retryable failure (429, 5xx, no answer): the server is not keeping up
            refill = None
            if response is not None and response.status == TOO_MANY_REQUESTS and batch.count:
                batch.throttled += 1
                if self._stored_despite_throttle(batch, response):
                    return False
                handled, refill = self._throttled(batch, response)
                if handled:
                    return False
            # A connection lost after a success (self._attempt 0) is likely a server killed
            # mid-request: the next try is soon, and is refused (soon again) if it is gone.
            unreachable = (
                refused
                or (connection_lost and self._attempt == 0)
                or (response is not None and response.status == BAD_GATEWAY)
            )
            self._schedule_retry(response, error, refill, unreachable)
            return False

    def _wait_for_answer(self, pending: Answer) -> None:
        """Encode the records callers queue, in every channel, until the server answers or the request times out.

        So records never pile up raw behind a slow or hanging request: they become
        batches, and the bounds drop the oldest data whether encoded or not. The
        socket is looked at by time, not by chunk (below), so the answer is read
        soon after it comes.
        """
        engine = self._engine
        wait = getattr(pending, "wait", None)
        if wait is None:  # a transport that cannot wait with a timeout: `finish()` may block after this
            while not pending.answered() and engine.encode_queued():
                pass
            return
        # A look at the socket releases the interpreter lock, and a caller that logs
        # without pause then holds it for up to the switch interval (5 ms): looking
        # after every chunk would leave the sender a fraction of its share. So while
        # there is encoding to do, the first look waits for half the time the server
        # has been taking to answer, and the next ones come `LOOK_INTERVAL` apart.
        started = time.monotonic()
        next_look = started + self._answer_time / 2
        busy = True
        while True:
            if not busy or time.monotonic() >= next_look:
                if wait(0.0 if busy else ANSWER_POLL):
                    break
                next_look = time.monotonic() + LOOK_INTERVAL
            busy = engine.encode_queued()
        taken = time.monotonic() - started
        self._answer_time += (min(taken, MAX_ANSWER_TIME) - self._answer_time) * 0.25

    def encode_chunk(self) -> bool:
        """Encode one chunk of the records waiting (while a request is in flight); True when there were any."""
        if not self._intake:
            return False
        with self._lock:
            if (
                len(self._backlog) > 1
                and len(self._intake) >= self._intake_limit
                and self._keeping_up(time.monotonic())
            ):
                return False  # the next batch is ready and the buffer full: more would be dropped before it is sent
            self._encode_intake(OVERLAP_CHUNK)
            self._enforce_bounds(time.monotonic())
        return True

    def _settle_after_close(self, batch: _Batch, response: Response | None, sent: bool) -> None:
        """The end of a request that `close()` counted `unconfirmed`: an answer settles what it can.

        Delivered: counted sent. Never sent (the connection failed) and never sent
        before: counted `shutdown`. Anything else stays unconfirmed.
        """
        if batch is not self._unconfirmed_batch:
            return
        self._unconfirmed_batch = None
        if response is not None and 200 <= response.status < 300:
            self.unconfirmed -= batch.count
            self._delivered(batch)
        elif not sent and not batch.unanswered:
            self.unconfirmed -= batch.count
            self._drop("shutdown", batch.count)

    def _delivered(self, batch: _Batch) -> None:
        self.sent += batch.count
        self.batches += 1
        self.bytes_sent += len(batch.body)
        by_key = self.sent_by_key
        for key, count in batch.key_counts.items():
            by_key[key] = by_key.get(key, 0) + count
        self._attempt = 0
        self._next_attempt = 0.0
        self._answering = True

    def _count_sent(self, items: Sequence[Item]) -> None:
        """Items a server stored out of a batch it answered with a refusal."""
        self.sent += len(items)
        by_key = self.sent_by_key
        for item in items:
            by_key[item[2]] = by_key.get(item[2], 0) + 1

    def _rejected(self, batch: _Batch, response: Response) -> bool:
        message = response.body[:500].decode("utf-8", "replace").strip()
        self.last_error = f"HTTP {response.status}: {message}"
        self.last_error_time = time.time()
        verdict = None
        items = self._items_of(batch)
        if items:
            try:
                verdict = self.sink.on_rejected(items, response)
            except Exception:
                warn.warning(f"{self.sink.name}:on_rejected", "%s: on_rejected failed", self.sink.name, exc_info=True)
        if verdict is not None and verdict.split and len(items) > 1:
            warn.warning(
                f"{self.sink.name}:refused-whole:{response.status}",
                "%s: the server refused a batch of %d items as a whole (HTTP %d) without naming a line: "
                "sending it in halves to find the refused lines: %s",
                self.sink.name,
                batch.count,
                response.status,
                message,
            )
            self._split(batch, items, throttled=0)
            return True
        self._pop_oldest()
        if (
            verdict is None
            or verdict.split
            or verdict.refused
            or len(verdict.stored) + len(verdict.resend) < batch.count
        ):
            warn.warning(
                f"{self.sink.name}:rejected:{response.status}",
                "%s: server rejected a batch of %d items (HTTP %d, not retried): %s",
                self.sink.name,
                batch.count,
                response.status,
                message,
            )
        if verdict is None or verdict.split:
            self._drop("rejected", batch.count)
            return True
        if verdict.stored:
            self._count_sent(verdict.stored)
            self.batches += 1  # the server took part of it: a request it accepted, as stats() describe
        for reason, count in verdict.refused.items():
            if count > 0:
                self._drop(reason, count)
        unaccounted = batch.count - len(verdict.stored) - sum(verdict.refused.values()) - len(verdict.resend)
        if unaccounted > 0:
            self._drop("rejected", unaccounted)
        if verdict.resend:
            resend = list(verdict.resend)
            self._seal(_Batch(resend, sum(i[1] for i in resend), batch.created), append=False)
        return True

    def _split(self, batch: _Batch, items: Sequence[Item], throttled: int) -> None:
        """Replace the oldest batch by its two halves, the first half first in line."""
        self._pop_oldest()
        half = len(items) // 2
        for part in (items[half:], items[:half]):
            piece = _Batch(list(part), sum(i[1] for i in part), batch.created, throttled=throttled)
            self._seal(piece, append=False)

    def _stored_despite_throttle(self, batch: _Batch, response: Response) -> bool:
        """A 429 after which the server kept part of the batch (the sink's `on_throttled` says which).

        The stored items are counted sent; the others are sealed again, first in line,
        and retried after a short backoff. True when that happened.
        """
        describe = getattr(self.sink, "on_throttled", None)
        items = self._items_of(batch) if describe is not None else []  # rebuilt only for a sink that asks
        if not items:
            return False
        try:
            verdict = describe(items, response)
        except Exception:
            warn.warning(f"{self.sink.name}:on_throttled", "%s: on_throttled failed", self.sink.name, exc_info=True)
            return False
        if verdict is None or not verdict.stored:
            return False
        self._pop_oldest()
        self._count_sent(verdict.stored)
        self.batches += 1  # the server took part of it
        resend = list(verdict.resend)
        unaccounted = batch.count - len(verdict.stored) - len(resend)
        if unaccounted > 0:
            self._drop("rejected", unaccounted)
        if resend:
            again = _Batch(resend, sum(i[1] for i in resend), batch.created, throttled=batch.throttled)
            self._seal(again, append=False)
        self._schedule_retry(response, None)
        return True

    def _throttled(self, batch: _Batch, response: Response) -> tuple[bool, float | None]:
        """A batch answered 429 again: halve it (it may exceed the server's burst), or drop a lone item that never fits.

        A rate limiter refuses a request larger than its burst forever, and Loki's
        429 has no Retry-After; so a batch refused twice in a row is split in two,
        down to one item. A lone item larger than the limit the server states
        (bytes per second) that is still refused after several tries is dropped
        and counted under the server's reason. True when the backlog changed and
        the next attempt was scheduled; else the seconds the server's stated rate
        needs to let this batch through (its bytes / the limit), or None.
        """
        reason, limit = "rate_limited", None
        describe = getattr(self.sink, "rate_limit", None)
        if describe is not None:
            with contextlib.suppress(Exception):
                reason, limit = describe(response)
        message = response.body[:300].decode("utf-8", "replace").strip()
        # The items are needed (rebuilt from the body for a sink that keeps only that) only to split.
        items = self._items_of(batch) if batch.count > 1 and batch.throttled >= SPLIT_AFTER_429S else []
        if items:
            self._split(batch, items, throttled=batch.throttled - 1)
            self.retries += 1
            self._next_attempt = time.monotonic() + backoff_delay(
                1, self.settings.retry_base, self.settings.retry_cap, self._rng
            )
            warn.warning(
                f"{self.sink.name}:split",
                "%s: the server kept refusing a batch of %d items with 429 (%s): sending it in smaller parts",
                self.sink.name,
                batch.count,
                message,
            )
            return True, None
        size = batch.nbytes  # the lone item's size when the batch holds one
        if batch.count == 1 and batch.throttled >= GIVE_UP_AFTER_429S and limit is not None and size > limit:
            self._pop_oldest()
            self._drop(reason)
            self._attempt = 0
            warn.warning(
                f"{self.sink.name}:too_large_for_limit",
                "%s: dropped an item of %d bytes: the server refused it %d times with 429 and it is larger than "
                "the %d bytes/s it allows, so it never fits the server's burst (Loki: ingestion_burst_size_mb or "
                "per_stream_rate_limit_burst) (%s)",
                self.sink.name,
                size,
                batch.throttled,
                limit,
                message,
            )
            return True, None
        if not limit or (batch.count == 1 and size > limit):
            return False, None  # no rate to go by, or an item that may never fit: plain backoff
        return False, batch.nbytes / limit

    def _schedule_retry(
        self, response: Response | None, error: str | None, refill: float | None = None, unreachable: bool = False
    ) -> None:
        """Schedule the next attempt: Retry-After when given, else the time a stated rate limit needs, else backoff.

        A server that is `unreachable` (the connection was refused, or the edge
        answered 502 for it, or a connection broke after a success) is tried again
        within `UNREACHABLE_RETRY_CAP`: a refused
        connection costs it nothing, and delivery resumes within about a second of
        its return, before an outage's backlog outgrows the buffer. Such attempts do
        not lengthen the full-jitter backoff that errors of a running server (5xx,
        429, timeouts) get.
        """
        s = self.settings
        self.retries += 1
        if unreachable:
            delay = self._rng.uniform(0.0, min(s.retry_cap, UNREACHABLE_RETRY_CAP))
        elif refill is not None:  # no Retry-After on Loki's 429, but a rate: wait about what it takes, jittered
            self._attempt += 1
            delay = min(s.retry_cap, max(0.01, refill)) * (1.0 + 0.25 * self._rng.random())
        else:
            self._attempt += 1
            delay = backoff_delay(self._attempt, s.retry_base, s.retry_cap, self._rng)
        if response is not None:
            error = f"HTTP {response.status}: {response.body[:200].decode('utf-8', 'replace').strip()}"
            retry_after = parse_retry_after(response.retry_after)
            if retry_after is not None:
                delay = max(delay, min(retry_after, s.max_retry_after))
        self.last_error = error
        self.last_error_time = time.time()
        self._next_attempt = time.monotonic() + delay
        warn.warning(
            f"{self.sink.name}:retry",
            "%s: delivery failed (%s); %d items buffered, retrying in %.1fs",
            self.sink.name,
            error,
            self._backlog_items,
            delay,
        )

    # ---- flush, close, stats -----------------------------------------------------

    def pending(self) -> int:
        """Records and items not yet delivered or dropped (exact only with the lock held)."""
        return len(self._intake) + self._partial_items() + self._backlog_items

    @lifecycle.engine_call
    def flush(self, timeout: float = 5.0) -> int:
        """Send everything buffered, waiting at most `timeout` seconds; return what is left."""
        deadline = time.monotonic() + max(0.0, timeout)
        with self._lock:  # the sender holds it while a record or batch is between two places
            if not self.pending():
                return 0
        self._engine.start()
        with self._lock:
            self._flush_requested = True
        self._engine.flush_until(deadline)
        try:
            with self._lock:
                while self.pending():
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        break
                    self._engine.wake.set()
                    self._changed.wait(min(remaining, 0.1))
                return self.pending()
        finally:
            with self._lock:
                self._flush_requested = False

    @lifecycle.engine_call
    def close(self, timeout: float = 5.0) -> int:
        """Flush within `timeout`, then stop; return how many items were not confirmed delivered.

        What is left is counted `shutdown`, except the batch whose request is
        unanswered at the deadline (in flight, or timed out): the server may have
        stored it, so it is counted `unconfirmed`, never lost nor sent. If its answer
        still comes, a delivery is counted `sent`.
        """
        if self._closed:
            return 0
        self.flush(timeout)
        with self._lock:
            self._closed = True
            pinned = self._pinned()
            unconfirmed = 0
            if pinned is not None:
                self._pop_oldest()
                unconfirmed = pinned.count
                self.unconfirmed += unconfirmed
                self._unconfirmed_batch = pinned if pinned is self._in_flight else None
            lost = self.pending()
            self._drop("shutdown", lost)
            self._cleared += len(self._intake)
            self._intake.clear()
            self._partials = {}
            self._backlog.clear()
            self._backlog_items = self._backlog_bytes = 0
        self._engine.unregister(self)
        if lost or unconfirmed:
            warn.warning(
                f"{self.sink.name}:close",
                "%s: closed with %d items undelivered (counted shutdown) and %d unconfirmed "
                "(sent without an answer by the deadline: the server may have stored them) (%s)",
                self.sink.name,
                lost,
                unconfirmed,
                self.last_error or "deadline reached",
            )
        return lost + unconfirmed

    @property
    def closed(self) -> bool:
        return self._closed

    @lifecycle.engine_call
    def stats(self) -> dict[str, Any]:
        """A snapshot of the counters (see the `telemetry_client` measurement in the catalog).

        They add up at every moment, and after `close()`:
        `queued == sent + pending + unconfirmed + dropped - dropped_values`.
        `queued` counts every record given (sampled out, or after close, included) and
        the items the encoder adds (system and GPU points); `dropped_values` the parts
        of items (field values) that `dropped_by_reason` counts though their item was
        sent on; `in_flight` the items of `pending` whose request is unanswered.
        """
        with self._lock:
            dropped = dict(self.dropped)
            intake_drops = self._intake_drops.value
            if intake_drops:
                dropped["buffer_full"] = dropped.get("buffer_full", 0) + intake_drops
            sampled = self._sampled_out.value
            if sampled:
                dropped["sampled_out"] = sampled
            after_close = self._after_close_drops.value
            if after_close:
                dropped["shutdown"] = dropped.get("shutdown", 0) + after_close
            intake = len(self._intake)
            pinned = self._pinned()
            stats = {
                "sink": self.sink.name,
                "queued": self._produced + self._cleared + intake + intake_drops + sampled + after_close,
                "sent": self.sent,
                "batches": self.batches,
                "retries": self.retries,
                "bytes_sent": self.bytes_sent,
                "pending": intake + self._partial_items() + self._backlog_items,
                "pending_bytes": self._backlog_bytes + self._partial_bytes() + self._intake_bytes(),
                "in_flight": pinned.count if pinned is not None else 0,
                "unconfirmed": self.unconfirmed,
                "dropped": sum(dropped.values()),
                "dropped_by_reason": dropped,
                "dropped_values": self.dropped_values,
                "sent_by_key": dict(self.sent_by_key),
                "last_error": self.last_error,
                "last_error_time": self.last_error_time,
            }
            extra = getattr(self.sink, "extra_stats", None)
            if extra is not None:
                stats.update(extra())
        return stats


class Engine:
    """The process's one sender thread and the channels it drains."""

    def __init__(self) -> None:
        self.channels: list[Channel] = []
        self.wake = threading.Event()
        # Set with `wake` by callers that fill the intake to `_wake_at`, cleared with it by the sender: an attribute
        # read is cheaper than `wake.is_set()` in every `submit` of a flood. The sender clears it
        # before it looks at the intake, so no wake-up is lost; a True left without `wake` (a caller
        # interrupted between the two) costs at most the sender's longest sleep, 1 s.
        self.woken = False
        self.running = False
        self._start_lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._flush_deadline: float | None = None
        self._pid = os.getpid()

    def register(self, channel: Channel) -> None:
        self.channels = [*self.channels, channel]
        self.wake.set()  # the sender's current sleep was sized without this channel

    def unregister(self, channel: Channel) -> None:
        self.channels = [c for c in self.channels if c is not channel]

    @lifecycle.engine_call
    def start(self) -> None:
        """Start the sender thread if it is not running (lazily, on first use)."""
        if self.running:
            return
        with self._start_lock:
            if self.running:
                return
            self._thread = threading.Thread(target=self._run, name="telemetry-sender", daemon=True)
            self.running = True
            self._thread.start()

    def flush_until(self, deadline: float) -> None:
        """Bound the timeouts of requests made while someone waits on a flush."""
        self._flush_deadline = deadline
        self.wake.set()

    def is_sender_thread(self) -> bool:
        return threading.current_thread() is self._thread

    def encode_queued(self) -> bool:
        """One chunk of every channel's waiting records, encoded and bounded; True when any channel had some."""
        busy = False
        for channel in self.channels:
            try:
                busy = channel.encode_chunk() or busy
            except Exception:
                warn.warning("engine", "telemetry sender: unexpected error", exc_info=True)
        return busy

    def _run(self) -> None:
        while True:
            self.wake.clear()
            self.woken = False
            deadline = self._flush_deadline
            if deadline is not None and time.monotonic() > deadline:
                self._flush_deadline = deadline = None
            timeout = 1.0
            for channel in self.channels:
                try:
                    timeout = min(timeout, channel.pump(deadline))
                    channel.sink.on_idle(time.monotonic())
                except Exception:
                    warn.warning("engine", "telemetry sender: unexpected error", exc_info=True)
            if timeout > 0:
                self.wake.wait(timeout)

    @lifecycle.engine_call
    def close_all(self, timeout: float) -> int:
        """Close every channel within one overall deadline; return how many records were not confirmed delivered.

        Delivery stops a little before the deadline (`CLOSE_MARGIN`) so that closing
        (counting what is left, the warning) is done by it too: a SIGTERM's drain is
        cut at the deadline.
        """
        deadline = time.monotonic() + max(0.0, timeout - min(CLOSE_MARGIN, timeout / 10))
        channels = list(self.channels)
        for channel in channels:
            with channel._lock:
                channel._flush_requested = True
        if channels:
            self.flush_until(deadline)
        return sum(channel.close(max(0.0, deadline - time.monotonic())) for channel in channels)

    def after_fork_in_child(self) -> None:
        """A child gets a fresh engine: empty buffers, no thread, new sockets. Nothing is sent twice."""
        self.wake = threading.Event()
        self.woken = False
        self.running = False
        self._start_lock = threading.Lock()
        self._thread = None
        self._flush_deadline = None
        self._pid = os.getpid()
        for channel in self.channels:
            channel._reset_state()


_engine: Engine | None = None
_engine_lock = threading.Lock()


def get_engine() -> Engine:
    """The process's engine, created on first use (with its exit and fork hooks)."""
    global _engine
    if _engine is None:
        with _engine_lock:
            if _engine is None:
                engine = Engine()
                os.register_at_fork(after_in_child=_after_fork_in_child)
                _engine = engine
                lifecycle.install_exit_hooks(shutdown)
    return _engine


def shutdown(timeout: float | None = None) -> int:
    """Deliver what every logger and handler of this process holds, within `timeout` seconds, and close them.

    For applications that end the process themselves (their own SIGTERM handler,
    `os._exit`): call it first. `timeout` defaults to TELEMETRY_EXIT_TIMEOUT (3 s).
    Returns how many records were not confirmed delivered: left undelivered
    (counted `shutdown`), or in a request unanswered at the deadline (`unconfirmed`). Later
    `log()` calls are counted `shutdown` too. Never raises.
    """
    engine = _engine
    if engine is None or engine._pid != os.getpid():
        return 0
    try:
        return engine.close_all(exit_timeout() if timeout is None else timeout)
    except Exception:
        warn.warning("shutdown", "telemetry shutdown failed", exc_info=True)
        return 0


def _after_fork_in_child() -> None:
    if _engine is not None:
        _engine.after_fork_in_child()


def estimate_size(record: Any) -> int:
    """Bytes a raw record holds: its containers and what they contain, two levels down.

    Dict keys are not counted (field and tag names are mostly shared between
    records); shared singletons are skipped. Cheap enough for one record in 64.
    """
    size = sys.getsizeof(record)
    if type(record) not in _CONTAINERS:
        return size
    for part in record.values() if type(record) is dict else record:
        if part is None or part is True or part is False:
            continue
        size += sys.getsizeof(part)
        if type(part) in _CONTAINERS:
            for leaf in part.values() if type(part) is dict else part:
                if not (leaf is None or leaf is True or leaf is False):
                    size += sys.getsizeof(leaf)
    return size


_CONTAINERS = (tuple, list, dict)


def jitter_rng() -> random.Random:
    """A separate RNG so that seeding the global one (simulations do) cannot align retries."""
    return random.Random(os.urandom(8))
