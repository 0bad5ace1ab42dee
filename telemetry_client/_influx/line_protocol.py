"""InfluxDB line protocol encoding, byte for byte what influxdb_client's `Point` writes.

It is several times faster than building a `Point` per call (see bench/), and a
property test proves it equal to `Point.to_line_protocol()` on every input it
accepts. It accepts only what InfluxDB stores exactly:

- names (measurement, tag keys, tag values, field keys) are non-empty strings
  without tab, newline, carriage return, NUL or backslash. Line protocol has no
  escape for the first three (`Point` writes a literal backslash-n), InfluxDB
  mangles a leading NUL, and a backslash is read differently by InfluxDB 1.x
  (literal) and 2.x (`\\\\` is one);
- a measurement does not start with `#` (InfluxDB reads that line as a comment);
- `time`, `_field` and `_measurement` are not used as tag or field keys.

Everything else is refused by the `valid_*` checks so the caller can count it.
"""

from __future__ import annotations

import math
import re

_ESCAPE_MEASUREMENT = str.maketrans({",": r"\,", " ": r"\ "})
_ESCAPE_KEY = str.maketrans({",": r"\,", "=": r"\=", " ": r"\ "})
_ESCAPE_STRING = str.maketrans({'"': r"\"", "\\": r"\\"})
_UNREPRESENTABLE = ("\n", "\r", "\t", "\\", "\x00")
RESERVED_KEYS = frozenset({"time", "_field", "_measurement"})
# A measurement as `escape_measurement` writes it: up to the first comma or space not escaped.
_MEASUREMENT_PREFIX = re.compile(rb"(?:[^\\, ]|\\.)*")
_UNESCAPE = re.compile(rb"\\(.)")


def valid_name(name: object) -> bool:
    """True when `name` can be a tag value (and, see below, a key or measurement) without loss."""
    if not isinstance(name, str) or not name:
        return False
    return not any(ch in name for ch in _UNREPRESENTABLE)


def valid_key(key: object) -> bool:
    """True when `key` can be a tag or field key."""
    return valid_name(key) and key not in RESERVED_KEYS


def valid_measurement(name: object) -> bool:
    return valid_name(name) and not name.startswith("#")  # type: ignore[union-attr]


def escape_measurement(name: str) -> str:
    return name.translate(_ESCAPE_MEASUREMENT)


def measurement_of(line: bytes) -> str:
    """The measurement name a line starts with (a valid name holds no backslash: each one escapes)."""
    match = _MEASUREMENT_PREFIX.match(line)
    return _UNESCAPE.sub(rb"\1", match.group() if match else b"").decode()


def escape_key(key: str) -> str:
    """Escape a tag key, tag value or field key."""
    return key.translate(_ESCAPE_KEY)


def format_float(value: float) -> str:
    """A finite float as `Point` writes it: shortest round-trip form, without a trailing `.0`."""
    text = repr(value)
    return text[:-2] if text.endswith(".0") else text


def format_field(value: float | str) -> str:
    """A field value: floats unquoted, strings quoted and escaped."""
    if isinstance(value, str):
        return '"' + value.translate(_ESCAPE_STRING) + '"'
    if not math.isfinite(value):
        raise ValueError("non-finite values have no line-protocol form")
    return format_float(value)


def series_key(measurement: str, tags: dict[str, str]) -> str:
    """`measurement,tag=value,...` with tags sorted by key, as `Point` orders them."""
    parts = [escape_measurement(measurement)]
    for key in sorted(tags):
        value = tags[key]
        if value:
            parts.append(f"{escape_key(key)}={escape_key(value)}")
    return ",".join(parts)
