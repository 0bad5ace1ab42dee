"""Reading InfluxDB's refusals of a write: which lines it stored, which it refused, which to send again.

A write InfluxDB answers with an error is often partly stored, so the counters can
only match the server if the answer is read. The shapes, by server:

* **InfluxDB 1.x**, `{"error": "..."}` with HTTP 400 (services/httpd/handler.go,
  `serveWrite`, v1.6.7):

  - `partial write: <reason> dropped=N`: the text of `tsdb.PartialWriteError`
    (tsdb/shard.go: `"partial write: %s dropped=%d"`; 1.8 appends
    `" for database: %s for retention policy: %s"`). Every other point was stored;
    N were not (a field type conflict, a point beyond the retention policy, a
    series or tag-value limit). Which N is not said; a field type conflict names
    its measurement (`input field "v" on measurement "m" is type float, already
    exists as type integer`, tsdb/shard.go).
  - `partial write: unable to parse '<line>': <why>\\nunable to parse ... dropped=0`:
    some lines did not parse (models/points.go, `ParsePointsWithPrecision`, one
    `"unable to parse '%s': %v"` per line joined by newlines); the handler wrote
    the others and wraps the parse error in a PartialWriteError with Dropped 0.
  - `unable to parse '<line>': <why>` (no prefix): no line parsed, nothing stored.
  - `field type conflict` (no prefix, nothing else): a field that is new in the
    shard gets two types in the batch (a float and a string). `Shard.WritePoints`
    (tsdb/shard.go, v1.6.7) checks each point against the fields the shard already
    has, then creates the new ones in batch order (`createFieldsAndMeasurements`);
    `MeasurementFields.CreateFieldIfNotExists` returns `ErrFieldTypeConflict` at the
    second type, and the shard writes **none** of the batch's points. The points
    writer (coordinator/points_writer.go, `writeToShard`) then writes the batch to
    that shard once more, where the field now exists with its first type, so the
    usual `partial write: ... dropped=N` comes back, except when the first write
    created the shard (`ErrShardNotFound`: created, written once): then the bare
    error reaches the handler, which answers 400 because `IsClientError` (errors.go)
    matches its prefix. So the first batch of every new shard group can be refused
    whole for one bad value. No line is named: the batch is sent again in halves
    (`Verdict.split`) until the answers name the refused lines. Points of the batch
    in other shards were stored (each shard is written on its own); sending them
    again overwrites them with the same values.
  - When a batch has both a line that does not parse and a point the shard drops,
    1.x reports only the shard's `dropped=N` (the handler checks the write error
    first): the unparsed lines are counted sent. The encoder never writes a line
    InfluxDB cannot parse, so this needs a second bug to happen.

* **InfluxDB 2.x**, `{"code": ..., "message": ...}`:

  - HTTP 422, `failure writing points to database: partial write: ... dropped=N`
    (http/write_handler.go, `handleWrite`, wraps `tsdb.PartialWriteError` with
    `EUnprocessableEntity`): as 1.x, the other points were stored.
  - HTTP 400, `unable to parse '<line>': <why>` (one per line): the parser
    refuses the whole batch on any parse error (http/points/points_parser.go
    returns no points with the error): **nothing** was stored, the other lines
    must be sent again.

* **InfluxDB 3 and Cloud** (the `/api/v2/write` compatibility endpoint), lines
  named by number:

  - `{"error": "partial write of line protocol occurred", "data": [{"original_line",
    "line_number", "error_message"}, ...]}` (influxdb3_server, `accept_partial`
    true by default): the other lines were stored.
  - `{"error": "parsing failed for write_lp endpoint" | "line protocol parsing error",
    "data": {...}}` (`accept_partial=false`): nothing stored.
  - `failed to parse line protocol: errors encountered on line(s):\\nerror parsing
    line N (1-based): <why>` (Cloud's router): nothing stored.

Sending a stored line again is harmless on InfluxDB (a point with the same series
and time overwrites, with the same values), so whenever the shape says "nothing
stored" the lines not named are sent again. Line numbers count from 1 over the
body exactly as sent; every item is one line.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

_DROPPED = re.compile(r"\bdropped=(\d+)")
_MEASUREMENT = re.compile(r'on measurement "(.*?)" is type')
_UNABLE = "unable to parse '"
_LINE_NUMBER = re.compile(r"error parsing line (\d+) \(1-based\)")
_V3_PARTIAL = "partial write of line protocol occurred"
_V3_ATOMIC = ("parsing failed for write_lp endpoint", "line protocol parsing error")
_WHOLE_FIELD_CONFLICT = "field type conflict"  # influxdb.ErrFieldTypeConflict, errors.go


@dataclass(frozen=True)
class Refusal:
    """What an InfluxDB error answer says about a batch.

    `others_stored`: the lines not refused were stored (else nothing was, and they
    should be sent again). Refused lines are given by text (`lines`), by 1-based
    number (`line_numbers`) or only counted (`dropped`, with the `measurement` a
    field type conflict names). `whole`: the batch was refused as a whole because of
    some of its lines, none named (they must be found by sending it in parts).
    """

    others_stored: bool
    lines: tuple[str, ...] = ()
    line_numbers: tuple[int, ...] = ()
    dropped: int = 0
    measurement: str | None = None
    whole: bool = False


def _message(body: bytes) -> tuple[str, object]:
    """The error text and the `data` member of a JSON answer (or the raw text)."""
    text = body.decode("utf-8", "replace").strip()
    try:
        decoded = json.loads(text)
    except ValueError:
        return text, None
    if not isinstance(decoded, dict):
        return text, None
    message = decoded.get("error") or decoded.get("message") or ""
    return str(message), decoded.get("data")


def unparsed_lines(message: str) -> tuple[str, ...]:
    """The lines named by `unable to parse '<line>': <why>` texts, in order."""
    lines = []
    start = message.find(_UNABLE)
    while start >= 0:
        begin = start + len(_UNABLE)
        end = message.find("\n" + _UNABLE, begin)
        segment = message[begin:] if end < 0 else message[begin:end]
        line, separator, _why = segment.rpartition("': ")
        if separator:
            lines.append(line)
        start = end + 1 if end >= 0 else -1
    return tuple(lines)


def read_refusal(body: bytes) -> Refusal | None:
    """What the answer says was stored and refused; None when it is not a refusal of lines."""
    message, data = _message(body)
    if message.startswith(_V3_PARTIAL) or message.startswith(_V3_ATOMIC):
        entries = data if isinstance(data, list) else [data] if isinstance(data, dict) else []
        numbers = tuple(
            entry["line_number"]
            for entry in entries
            if isinstance(entry, dict) and isinstance(entry.get("line_number"), int)
        )
        if not numbers:
            return None
        return Refusal(others_stored=message.startswith(_V3_PARTIAL), line_numbers=numbers)
    numbers = tuple(int(n) for n in _LINE_NUMBER.findall(message))
    if numbers:
        return Refusal(others_stored=False, line_numbers=numbers)
    partial = message.find("partial write:")
    lines = unparsed_lines(message)
    if partial >= 0:
        if lines:
            return Refusal(others_stored=True, lines=lines)
        counts = _DROPPED.findall(message)
        if not counts:
            return None
        measurement = _MEASUREMENT.search(message)
        return Refusal(
            others_stored=True,
            dropped=int(counts[-1]),
            measurement=measurement.group(1) if measurement else None,
        )
    if lines:
        return Refusal(others_stored=False, lines=lines)
    if message.startswith(_WHOLE_FIELD_CONFLICT):
        return Refusal(others_stored=False, whole=True)
    return None
