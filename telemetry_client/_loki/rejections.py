"""Reading Loki's refusals: which entries of a push it refused, why, and its rate limits.

After a 400 Loki has stored every entry of the push it does not name, so the
client must know exactly which ones it named. Messages are matched by their
structure and case-insensitively: Loki 3.6 lowercased the first word of its
validation messages ("max entry size ..." where 3.5 wrote "Max entry size ...").
Shapes known (tests/data/loki_push_errors.json holds real examples of each):

* distributor validation (pkg/validation/validate.go), grouped by message text,
  ``N errors like: <message>; M errors like: <message>``:
  ``entry for stream '{...}' has timestamp too old: <RFC 3339>, oldest acceptable timestamp is: <RFC 3339>``,
  ``... has timestamp too new: ...``, ``max entry size 'N' bytes exceeded for stream '{...}' ...``,
  structured metadata disallowed / too large / too many, label problems (whole stream);
* ingester (pkg/ingester/stream.go), one line per refused entry then the stream:
  ``entry with timestamp <Go time> ignored, reason: '...',`` ...
  ``user 'fake', total ignored: N out of M for stream: {...}`` (at most 10 entries are listed);
* rate limits, answered 429 without Retry-After: ``Ingestion rate limit exceeded for user
  fake (limit: 104857 bytes/sec) ...`` and ``Per stream rate limit exceeded (limit: 3MB/sec) ...``.

Each `Rejection` carries Loki's discard reason (the `reason` label of
`loki_discarded_samples_total`), which the client uses as its drop reason.
"""

from __future__ import annotations

import calendar
import re
from collections.abc import Mapping
from dataclasses import dataclass

_QUOTED = r'"(?:[^"\\\n]|\\.)*"'
_LABELS = rf"\{{(?:\s*(?:[a-zA-Z_][a-zA-Z0-9_.]*|{_QUOTED})\s*=\s*{_QUOTED}\s*,?)*\s*\}}"
_PAIR = re.compile(rf"\s*([a-zA-Z_][a-zA-Z0-9_.]*|{_QUOTED})\s*=\s*({_QUOTED})\s*,?")
# A timestamp as Loki prints one: RFC 3339 (distributor) or Go's time.Time.String() (ingester, 2.x).
_TIME = r"\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:\.\d{1,9})?(?:Z|[+-]\d\d:\d\d|\s[+-]\d{4}(?:\s[A-Z][A-Za-z]*)?)"

_MESSAGES = re.compile(
    "|".join(
        (
            rf"(?P<entry>entry with timestamp (?P<e_ts>{_TIME})(?: m=[+-][\d.]+)? ignored, reason: "
            rf"'(?P<e_reason>[^\n]*?)'(?=,?[ \t]*(?:\n|$)| for stream: )(?: for stream: (?P<e_labels>{_LABELS}))?)",
            rf"(?P<trailer>(?:total ignored: (?P<t_count>\d+) out of (?P<t_total>\d+) )?"
            rf"for stream: (?P<t_labels>{_LABELS}))",
            rf"(?P<old>entry for stream '(?P<o_labels>{_LABELS})' has timestamp too old: (?P<o_ts>{_TIME})"
            rf"(?:, oldest acceptable timestamp is: (?P<o_min>{_TIME}))?)",
            rf"(?P<new>entry for stream '(?P<n_labels>{_LABELS})' has timestamp too new: (?P<n_ts>{_TIME}))",
            rf"(?P<long>max entry size '(?P<l_max>\d+)' bytes exceeded for stream '(?P<l_labels>{_LABELS})')",
            rf"(?P<smsize>stream '(?P<ss_labels>{_LABELS})' has structured metadata too large: "
            r"'\d+' bytes, limit: '(?P<ss_max>\d+)')",
            rf"(?P<smcount>stream '(?P<sc_labels>{_LABELS})' has too many structured metadata labels: "
            r"'\d+', limit: '(?P<sc_max>\d+)')",
            rf"(?P<smoff>stream '(?P<so_labels>{_LABELS})' includes structured metadata, "
            r"but this feature is disallowed)",
            rf"(?P<names>entry for stream '(?P<m_labels>{_LABELS})' has \d+ label names; limit \d+)",
            rf"(?P<labeltoo>stream '(?P<lt_labels>{_LABELS})' has label (?P<lt_what>name|value) too long)",
            rf"(?P<dup>stream '(?P<d_labels>{_LABELS})' has duplicate label name)",
            rf"(?P<parse>error parsing labels '(?P<p_labels>{_LABELS})')",
            rf"(?P<enforced>missing required labels [^\n]*? for stream (?P<f_labels>{_LABELS}))",
            rf"(?P<streamlimit>maximum active stream limit exceeded"
            rf"(?: when trying to create stream (?P<sl_labels>{_LABELS}))?)",
            rf"(?P<stream>(?:stream '?|labels ')(?P<s_labels>{_LABELS}))",
        )
    ),
    re.IGNORECASE,
)
_GO_TIME = re.compile(r"(\d{4})-(\d{2})-(\d{2}) (\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,9}))? ([+-])(\d{2})(\d{2})")
_RFC3339 = re.compile(r"(\d{4})-(\d{2})-(\d{2})T(\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,9}))?(Z|[+-]\d{2}:\d{2})", re.I)
_OLDEST = re.compile(rf"oldest acceptable timestamp is: ({_TIME})", re.IGNORECASE)
_TENANT_LIMIT = re.compile(r"ingestion rate limit exceeded(?: for user \S+)? \(limit: (\d+) bytes/sec\)", re.I)
_STREAM_LIMIT = re.compile(r"per stream rate limit exceeded \(limit: (\d+(?:\.\d+)?)\s*([KMGTPE]?)i?B/sec\)", re.I)
_UNESCAPE = re.compile(r"\\(x[0-9a-fA-F]{2}|u[0-9a-fA-F]{4}|U[0-9a-fA-F]{8}|.)")
_SIMPLE_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "a": "\a", "b": "\b", "f": "\f", "v": "\v"}
# Labels Loki adds to a stream by itself; they are ignored when matching a named stream to ours.
LOKI_ADDED_LABELS = frozenset({"service_name"})
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40, "P": 1 << 50, "E": 1 << 60}

# Loki's discard reasons (pkg/validation/validate.go), used as the client's drop reasons.
REJECTED = "rejected"  # a refusal this parser cannot attribute
TOO_OLD = "greater_than_max_sample_age"
TOO_NEW = "too_far_in_future"
LINE_TOO_LONG = "line_too_long"
RATE_LIMITED = "rate_limited"
STREAM_RATE_LIMITED = "per_stream_rate_limit"
_INGESTER_REASONS = (
    ("too far behind", "too_far_behind"),
    ("out of order", "out_of_order"),
    ("per stream rate limit", STREAM_RATE_LIMITED),
)


@dataclass(frozen=True)
class Rejection:
    """Selects refused entries: every constraint that is set must hold."""

    reason: str = REJECTED
    labels: Mapping[str, str] | None = None  # the stream (None: any stream)
    ts_from: int | None = None  # inclusive, ns
    ts_to: int | None = None  # exclusive, ns
    line_longer_than: int | None = None  # bytes
    metadata_larger_than: int | None = None  # bytes of names and values
    metadata_more_than: int | None = None  # number of pairs
    with_metadata: bool = False
    # At most this many of the entries it matches are refused, the oldest first (None: all of them).
    count: int | None = None

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


@dataclass(frozen=True)
class IgnoredTotal:
    """The ingester's trailer: `count` of the stream's `total` entries were refused (only 10 are listed)."""

    labels: Mapping[str, str]
    count: int
    total: int
    reason: str


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


def _frac_ns(frac: str | None) -> int:
    return int(frac.ljust(9, "0")) if frac else 0


def parse_go_time(text: str) -> int | None:
    """Nanoseconds since the epoch from Go's time.Time.String() text; None if it is not one."""
    m = _GO_TIME.search(text)
    if not m:
        return None
    y, mo, d, h, mi, s, frac, sign, oh, om = m.groups()
    seconds = calendar.timegm((int(y), int(mo), int(d), int(h), int(mi), int(s), 0, 0, 0))
    offset = (int(oh) * 3600 + int(om) * 60) * (1 if sign == "+" else -1)
    return (seconds - offset) * 1_000_000_000 + _frac_ns(frac)


def parse_rfc3339(text: str) -> tuple[int, int] | None:
    """(nanoseconds since the epoch, precision in ns) from RFC 3339 text; None if it is not one."""
    m = _RFC3339.search(text)
    if not m:
        return None
    y, mo, d, h, mi, s, frac, zone = m.groups()
    seconds = calendar.timegm((int(y), int(mo), int(d), int(h), int(mi), int(s), 0, 0, 0))
    if zone.upper() != "Z":
        sign = 1 if zone[0] == "+" else -1
        seconds -= sign * (int(zone[1:3]) * 3600 + int(zone[4:6]) * 60)
    precision = 10 ** (9 - len(frac)) if frac else 1_000_000_000
    return seconds * 1_000_000_000 + _frac_ns(frac), precision


def parse_time(text: str) -> tuple[int, int] | None:
    """(ns, precision in ns) of a timestamp Loki printed: RFC 3339 (to its digits) or Go's (exact)."""
    parsed = parse_rfc3339(text)
    if parsed is not None:
        return parsed
    ns = parse_go_time(text)
    return None if ns is None else (ns, 1)


def _ingester_reason(text: str) -> str:
    lowered = text.lower()
    return next((reason for phrase, reason in _INGESTER_REASONS if phrase in lowered), REJECTED)


_GROUP_COUNT = re.compile(r"(\d+) errors like: $")


def _count(text: str, message: re.Match[str]) -> int:
    """How many entries the message at `message` stands for: "N errors like: <message>" (pkg/util/errors.go), else 1."""
    prefix = _GROUP_COUNT.search(text, max(0, message.start() - 32), message.start())
    return int(prefix.group(1)) if prefix else 1


def parse_rejections(text: str) -> list[Rejection]:
    """The refused entries a Loki 4xx text names; empty when it names none this parser knows."""
    return parse_answer(text)[0]


def parse_answer(text: str) -> tuple[list[Rejection], list[IgnoredTotal]]:
    """The refused entries a Loki 4xx text names, and the ingester's per-stream totals."""
    found: list[Rejection] = []
    totals: list[IgnoredTotal] = []
    pending: list[tuple[int, str]] = []  # ingester entries still waiting for their stream (3.x format)

    def entry_rejections(labels: Mapping[str, str] | None, ts: int, reason_text: str) -> None:
        reason = _ingester_reason(reason_text)
        found.append(Rejection(reason, labels, ts_from=ts, ts_to=ts + 1))
        oldest = _OLDEST.search(reason_text)
        parsed = parse_time(oldest.group(1)) if oldest else None
        if parsed is not None:
            found.append(Rejection(reason, labels, ts_to=parsed[0]))

    for m in _MESSAGES.finditer(text):
        kind = m.lastgroup  # the outer group of the alternative that matched (it closes last)
        if kind == "entry":
            ts = parse_go_time(m.group("e_ts"))
            if ts is None:
                continue
            if m.group("e_labels"):
                entry_rejections(parse_labels(m.group("e_labels")), ts, m.group("e_reason"))
            else:
                pending.append((ts, m.group("e_reason")))
        elif kind == "trailer":
            labels = parse_labels(m.group("t_labels"))
            reasons = [_ingester_reason(reason) for _, reason in pending]
            for ts, reason in pending:
                entry_rejections(labels, ts, reason)
            if m.group("t_count"):
                reason = reasons[-1] if reasons else REJECTED
                totals.append(IgnoredTotal(labels, int(m.group("t_count")), int(m.group("t_total")), reason))
            pending.clear()
        elif kind == "old":
            labels = parse_labels(m.group("o_labels"))
            named = parse_time(m.group("o_ts"))
            oldest = parse_time(m.group("o_min") or "")
            if named is not None:
                second_end = named[0] + named[1]
                if oldest is not None and oldest[0] >= second_end:
                    # Every entry of the named second is older than the cut-off, which Loki prints
                    # rounded down: the named second and all before it are refused.
                    found.append(Rejection(TOO_OLD, labels, ts_to=oldest[0]))
                elif oldest is not None:
                    # The cut-off falls inside the named second: the entries before it are refused,
                    # those after it stored. The message is grouped by its text, so its count says
                    # how many of the second's entries were refused: the oldest ones.
                    found.append(Rejection(TOO_OLD, labels, ts_from=named[0], ts_to=second_end, count=_count(text, m)))
                else:  # Loki 2.x names each entry exactly and no cut-off
                    found.append(Rejection(TOO_OLD, labels, ts_to=second_end))
        elif kind == "new":
            named = parse_time(m.group("n_ts"))
            if named is not None:
                found.append(Rejection(TOO_NEW, parse_labels(m.group("n_labels")), ts_from=named[0]))
        elif kind == "long":
            labels = parse_labels(m.group("l_labels"))
            found.append(Rejection(LINE_TOO_LONG, labels, line_longer_than=int(m.group("l_max"))))
        elif kind == "smsize":
            labels = parse_labels(m.group("ss_labels"))
            found.append(
                Rejection("structured_metadata_too_large", labels, metadata_larger_than=int(m.group("ss_max")))
            )
        elif kind == "smcount":
            labels = parse_labels(m.group("sc_labels"))
            found.append(Rejection("structured_metadata_too_many", labels, metadata_more_than=int(m.group("sc_max"))))
        elif kind == "smoff":
            found.append(
                Rejection("disallowed_structured_metadata", parse_labels(m.group("so_labels")), with_metadata=True)
            )
        elif kind == "names":
            found.append(Rejection("max_label_names_per_series", parse_labels(m.group("m_labels"))))
        elif kind == "labeltoo":
            what = m.group("lt_what").lower()
            found.append(Rejection(f"label_{what}_too_long", parse_labels(m.group("lt_labels"))))
        elif kind == "dup":
            found.append(Rejection("duplicate_label_names", parse_labels(m.group("d_labels"))))
        elif kind == "parse":
            found.append(Rejection("invalid_labels", parse_labels(m.group("p_labels"))))
        elif kind == "enforced":
            found.append(Rejection("missing_enforced_labels", parse_labels(m.group("f_labels"))))
        elif kind == "streamlimit":
            labels = parse_labels(m.group("sl_labels")) if m.group("sl_labels") else None
            found.append(Rejection("stream_limit", labels))
        elif kind == "stream":
            found.append(Rejection(REJECTED, parse_labels(m.group("s_labels"))))
    for ts, reason in pending:  # entries whose stream was never named: match the timestamp in any stream
        entry_rejections(None, ts, reason)
    return found, totals


def parse_rate_limit(text: str) -> int | None:
    """The limit in bytes per second a Loki 429 text states (tenant or per stream); None if none."""
    m = _TENANT_LIMIT.search(text)
    if m:
        return int(m.group(1))
    m = _STREAM_LIMIT.search(text)
    if m:
        return int(float(m.group(1)) * _UNITS[m.group(2).upper()])
    return None


def rate_limit_reason(text: str) -> str:
    """Loki's discard reason for a 429 text: the tenant's or the stream's rate limit."""
    return STREAM_RATE_LIMITED if _STREAM_LIMIT.search(text) else RATE_LIMITED
