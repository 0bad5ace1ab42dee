"""Reading Loki's 400 answers: which entries of a push it refused.

Loki accepts the valid entries of a push and answers 400 with a text naming the
refused ones. Two shapes exist in Loki 3.x:

* ingester (order, age within a stream), one line per refused entry, then the stream:
  ``entry with timestamp 2024-05-06 15:58:50.1 +0000 UTC ignored, reason: '...',``
  ``user 'fake', total ignored: 1 out of 2 for stream: {app="web", service_name="web"}``
  (older releases put ``for stream: {...}`` on each entry line instead);
* distributor validation, one message per problem, e.g.
  ``entry for stream '{...}' has timestamp too old: 2024-05-07T10:25:30Z, oldest acceptable timestamp is: ...``,
  ``Max entry size '256000' bytes exceeded for stream '{...}' while adding an entry with length '300000' bytes``,
  ``stream '{...}' has label value too long: '...'``.

`parse_rejections` turns such a text into `Rejection` selectors; the Loki sink
drops the entries they select and resends the rest (Loki ignores an entry it has
already stored with the same stream, timestamp and line, so the resend is safe).
"""

from __future__ import annotations

import calendar
import re
from collections.abc import Mapping
from dataclasses import dataclass

_QUOTED = r'"(?:[^"\\\n]|\\.)*"'
_LABELS = rf"\{{(?:\s*(?:[a-zA-Z_][a-zA-Z0-9_.]*|{_QUOTED})\s*=\s*{_QUOTED}\s*,?)*\s*\}}"
_PAIR = re.compile(rf"\s*([a-zA-Z_][a-zA-Z0-9_.]*|{_QUOTED})\s*=\s*({_QUOTED})\s*,?")

_MESSAGES = re.compile(
    "|".join(
        (
            rf"(?P<entry>entry with timestamp (?P<e_ts>[^\n]+?) ignored, reason: '(?P<e_reason>[^\n]*?)'"
            rf"(?=,| for stream: |\n|$)(?: for stream: (?P<e_labels>{_LABELS}))?)",
            rf"(?P<trailer>for stream: (?P<t_labels>{_LABELS}))",
            rf"(?P<old>entry for stream '(?P<o_labels>{_LABELS})' has timestamp too old: (?P<o_ts>[^\s,]+)"
            rf"(?:, oldest acceptable timestamp is: (?P<o_min>[^\s,]+))?)",
            rf"(?P<new>entry for stream '(?P<n_labels>{_LABELS})' has timestamp too new: (?P<n_ts>[^\s,]+))",
            rf"(?P<long>Max entry size '(?P<l_max>\d+)' bytes exceeded for stream '(?P<l_labels>{_LABELS})')",
            rf"(?P<smsize>stream '(?P<ss_labels>{_LABELS})' has structured metadata too large: "
            r"'\d+' bytes, limit: '(?P<ss_max>\d+)')",
            rf"(?P<smcount>stream '(?P<sc_labels>{_LABELS})' has too many structured metadata labels: "
            r"'\d+', limit: '(?P<sc_max>\d+)')",
            rf"(?P<smoff>stream '(?P<so_labels>{_LABELS})' includes structured metadata, "
            r"but this feature is disallowed)",
            rf"(?P<stream>(?:stream '?|labels ')(?P<s_labels>{_LABELS}))",
        )
    )
)
_GO_TIME = re.compile(
    r"(\d{4})-(\d{2})-(\d{2}) (\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,9}))? ([+-])(\d{2})(\d{2})"
)  # Go's time.Time.String(): 2006-01-02 15:04:05.999999999 -0700 MST
_RFC3339 = re.compile(r"(\d{4})-(\d{2})-(\d{2})T(\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,9}))?(Z|[+-]\d{2}:\d{2})")
_OLDEST = re.compile(r"oldest acceptable timestamp is: ([^\s,']+)")
_UNESCAPE = re.compile(r"\\(x[0-9a-fA-F]{2}|u[0-9a-fA-F]{4}|U[0-9a-fA-F]{8}|.)")
_SIMPLE_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "a": "\a", "b": "\b", "f": "\f", "v": "\v"}
# Labels Loki adds to a stream by itself; they are ignored when matching a named stream to ours.
LOKI_ADDED_LABELS = frozenset({"service_name"})


@dataclass(frozen=True)
class Rejection:
    """Selects refused entries: every constraint that is set must hold."""

    labels: Mapping[str, str] | None = None  # the stream (None: any stream)
    ts_from: int | None = None  # inclusive, ns
    ts_to: int | None = None  # exclusive, ns
    line_longer_than: int | None = None  # bytes
    metadata_larger_than: int | None = None  # bytes of names and values
    metadata_more_than: int | None = None  # number of pairs
    with_metadata: bool = False

    def matches(self, labels: Mapping[str, str], ts: int, line_bytes: int, metadata: Mapping[str, str] | None) -> bool:
        if self.labels is not None and not same_stream(self.labels, labels):
            return False
        if self.ts_from is not None and ts < self.ts_from:
            return False
        if self.ts_to is not None and ts >= self.ts_to:
            return False
        if self.line_longer_than is not None and line_bytes <= self.line_longer_than:
            return False
        if self.with_metadata and not metadata:
            return False
        if self.metadata_more_than is not None and len(metadata or ()) <= self.metadata_more_than:
            return False
        if self.metadata_larger_than is not None:
            size = sum(len(k.encode()) + len(v.encode()) for k, v in (metadata or {}).items())
            if size <= self.metadata_larger_than:
                return False
        return True


def same_stream(named: Mapping[str, str], ours: Mapping[str, str]) -> bool:
    """True when Loki's stream `named` is our label set (ignoring labels Loki adds itself)."""
    core = {k: v for k, v in named.items() if k in ours or not (k in LOKI_ADDED_LABELS or k.startswith("__"))}
    return core == dict(ours)


def _unquote(text: str) -> str:
    def one(match: re.Match[str]) -> str:
        code = match.group(1)
        if len(code) > 1:
            return chr(int(code[1:], 16))
        return _SIMPLE_ESCAPES.get(code, code)

    return _UNESCAPE.sub(one, text[1:-1])


def parse_labels(text: str) -> dict[str, str]:
    """Parse a stream selector as Loki prints it: {a="x", b="y"} (Go-quoted values)."""
    labels = {}
    for name, value in _PAIR.findall(text):
        labels[_unquote(name) if name.startswith('"') else name] = _unquote(value)
    return labels


def _frac_ns(frac: str | None) -> tuple[int, int]:
    """Nanoseconds of a fractional-second string and the precision it carries."""
    if not frac:
        return 0, 1_000_000_000
    return int(frac.ljust(9, "0")), 10 ** (9 - len(frac))


def parse_go_time(text: str) -> int | None:
    """Nanoseconds since the epoch from Go's time.Time.String() text; None if it is not one."""
    m = _GO_TIME.search(text)
    if not m:
        return None
    y, mo, d, h, mi, s, frac, sign, oh, om = m.groups()
    seconds = calendar.timegm((int(y), int(mo), int(d), int(h), int(mi), int(s), 0, 0, 0))
    offset = (int(oh) * 3600 + int(om) * 60) * (1 if sign == "+" else -1)
    return (seconds - offset) * 1_000_000_000 + _frac_ns(frac)[0]


def parse_rfc3339(text: str) -> tuple[int, int] | None:
    """(nanoseconds since the epoch, precision in ns) from RFC 3339 text; None if it is not one."""
    m = _RFC3339.search(text)
    if not m:
        return None
    y, mo, d, h, mi, s, frac, zone = m.groups()
    seconds = calendar.timegm((int(y), int(mo), int(d), int(h), int(mi), int(s), 0, 0, 0))
    if zone != "Z":
        sign = 1 if zone[0] == "+" else -1
        seconds -= sign * (int(zone[1:3]) * 3600 + int(zone[4:6]) * 60)
    ns, precision = _frac_ns(frac)
    return seconds * 1_000_000_000 + ns, precision


def parse_rejections(text: str) -> list[Rejection]:
    """The refused entries a Loki 400 text names; empty when it names none this parser knows."""
    found: list[Rejection] = []
    pending: list[tuple[int, str]] = []  # ingester entries still waiting for their stream (new format)

    def entry_rejections(labels: Mapping[str, str] | None, ts: int, reason: str) -> None:
        found.append(Rejection(labels, ts_from=ts, ts_to=ts + 1))
        oldest = _OLDEST.search(reason)
        parsed = parse_rfc3339(oldest.group(1)) if oldest else None
        if parsed is not None:
            found.append(Rejection(labels, ts_to=parsed[0]))

    for m in _MESSAGES.finditer(text):
        if m.group("entry"):
            ts = parse_go_time(m.group("e_ts"))
            if ts is None:
                continue
            if m.group("e_labels"):
                entry_rejections(parse_labels(m.group("e_labels")), ts, m.group("e_reason"))
            else:
                pending.append((ts, m.group("e_reason")))
        elif m.group("trailer"):
            labels = parse_labels(m.group("t_labels"))
            for ts, reason in pending:
                entry_rejections(labels, ts, reason)
            pending.clear()
        elif m.group("old"):
            labels = parse_labels(m.group("o_labels"))
            named = parse_rfc3339(m.group("o_ts"))
            oldest = parse_rfc3339(m.group("o_min") or "")
            if named is not None:
                limit = named[0] + named[1]
                if oldest is not None:
                    limit = max(limit, oldest[0])
                found.append(Rejection(labels, ts_to=limit))
        elif m.group("new"):
            named = parse_rfc3339(m.group("n_ts"))
            if named is not None:
                found.append(Rejection(parse_labels(m.group("n_labels")), ts_from=named[0]))
        elif m.group("long"):
            found.append(Rejection(parse_labels(m.group("l_labels")), line_longer_than=int(m.group("l_max"))))
        elif m.group("smsize"):
            labels = parse_labels(m.group("ss_labels"))
            found.append(Rejection(labels, metadata_larger_than=int(m.group("ss_max"))))
        elif m.group("smcount"):
            labels = parse_labels(m.group("sc_labels"))
            found.append(Rejection(labels, metadata_more_than=int(m.group("sc_max"))))
        elif m.group("smoff"):
            found.append(Rejection(parse_labels(m.group("so_labels")), with_metadata=True))
        elif m.group("stream"):
            found.append(Rejection(parse_labels(m.group("s_labels"))))
    for ts, reason in pending:  # entries whose stream was never named: match the timestamp in any stream
        entry_rejections(None, ts, reason)
    return found
