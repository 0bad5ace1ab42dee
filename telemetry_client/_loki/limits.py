"""Loki's ingestion limits, enforced by the client before anything is sent.

Everything Loki would reject for a reason the client can know in advance (a bad
label name, too many labels, an over-long label value, an over-long line) is
caught here: label problems at setup as a `ConfigurationError`, long lines by
truncation with a visible marker. Defaults are Loki 3.x's `limits_config`
defaults: max_label_name_length 1024, max_label_value_length 2048,
max_label_names_per_series 15, max_line_size 256KB.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from telemetry_client.errors import ConfigurationError

LABEL_NAME_RE = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
MAX_LABEL_NAME_BYTES = 1024
MAX_LABEL_VALUE_BYTES = 2048
MAX_LABELS = 15
# Loki's default is "256KB"; 256_000 bytes stays under it whether KB means 1000 or 1024.
DEFAULT_MAX_LINE_BYTES = 256_000
MIN_MAX_LINE_BYTES = 1024
TRUNCATION_MARKER = "…[truncated]"

# The per-record label: five values at most, so a stream per level and no more.
LEVEL_LABEL = "level"
LEVEL_VALUES: tuple[str, ...] = ("debug", "info", "warning", "error", "critical")


def level_label(levelno: int) -> str:
    """Bucket any numeric level (custom ones too) into one of five label values."""
    if levelno <= 10:
        return "debug"
    if levelno <= 20:
        return "info"
    if levelno <= 30:
        return "warning"
    if levelno <= 40:
        return "error"
    return "critical"


def check_label_name(name: Any) -> str:
    """Return `name` if Loki accepts it as a label name, else raise ConfigurationError."""
    if not isinstance(name, str) or not LABEL_NAME_RE.fullmatch(name):
        suggestion = re.sub(r"[^a-zA-Z0-9_]", "_", str(name))
        if suggestion[:1].isdigit():
            suggestion = "_" + suggestion
        raise ConfigurationError(
            f"Loki label name {name!r} is invalid: it must match [a-zA-Z_][a-zA-Z0-9_]* (try {suggestion!r})"
        )
    if name.startswith("__"):
        raise ConfigurationError(f"Loki label name {name!r} is invalid: names starting with '__' are reserved")
    if len(name.encode()) > MAX_LABEL_NAME_BYTES:
        raise ConfigurationError(f"Loki label name {name[:40]!r}... is longer than {MAX_LABEL_NAME_BYTES} bytes")
    return name


def check_label_value(name: str, value: Any) -> str:
    """Return `value` as a string Loki accepts for label `name`, else raise ConfigurationError."""
    text = str(value)
    try:
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError:
        raise ConfigurationError(f"Loki label {name}={text!r} is not valid UTF-8") from None
    if size > MAX_LABEL_VALUE_BYTES:
        raise ConfigurationError(f"Loki label {name} has a value of {size} bytes; the limit is {MAX_LABEL_VALUE_BYTES}")
    return text


def validate_labels(
    labels: Mapping[Any, Any], *, reserved: frozenset[str] = frozenset({LEVEL_LABEL})
) -> dict[str, str]:
    """Static labels checked against Loki's rules; None and empty values mean "not set" and are left out.

    `reserved` names are set by the client per record and may not be passed in.
    The count includes the per-record `level` label.
    """
    clean: dict[str, str] = {}
    for name, value in labels.items():
        check_label_name(name)
        if name in reserved:
            raise ConfigurationError(f"Loki label {name!r} is set by the handler for each record and cannot be given")
        if value is None or value == "":
            continue
        clean[name] = check_label_value(name, value)
    total = len(clean) + len(reserved)
    if total > MAX_LABELS:
        raise ConfigurationError(
            f"{total} Loki labels (including {', '.join(sorted(reserved))}) exceed Loki's limit of {MAX_LABELS} "
            "label names per stream; put high-cardinality values in the log line's context instead"
        )
    return clean


def check_max_line_bytes(max_line_bytes: int) -> int:
    """The configured line size limit, checked for sanity."""
    if not isinstance(max_line_bytes, int) or max_line_bytes < MIN_MAX_LINE_BYTES:
        raise ConfigurationError(f"max_line_bytes must be an integer of at least {MIN_MAX_LINE_BYTES}")
    return max_line_bytes


def cut_utf8(text: str, max_bytes: int) -> str:
    """The longest prefix of `text` whose UTF-8 encoding fits in `max_bytes` (never splits a character)."""
    if max_bytes <= 0:
        return ""
    encoded = text.encode("utf-8", "replace")
    if len(encoded) <= max_bytes:
        return text
    return encoded[:max_bytes].decode("utf-8", "ignore")


def label_string(labels: Mapping[str, str]) -> str:
    """The stream selector text Loki shows for a label set: {a="x", b="y"}, sorted by name."""
    parts = []
    for name in sorted(labels):
        value = labels[name].replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
        parts.append(f'{name}="{value}"')
    return "{" + ", ".join(parts) + "}"
