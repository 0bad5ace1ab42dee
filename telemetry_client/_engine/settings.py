"""Settings objects every destination shares: TLS verification and request timeouts.

Each group of settings is a small frozen dataclass so that a node can build it
once (from its own configuration) and hand it to every logger, instead of
repeating loose keyword arguments. The loggers still take the flat keywords they
always took; `combine` merges the two forms and refuses a setting given both ways.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from telemetry_client.errors import ConfigurationError

Group = TypeVar("Group")


@dataclass(frozen=True)
class TLS:
    """How the server's certificate is checked.

    `verify` None means "not given": a MetricsLogger then reads INFLUXDB_VERIFY_TLS
    (default on), the Loki handlers verify.
    """

    verify: bool | None = None
    ca_certs: str | None = None


@dataclass(frozen=True)
class Timeouts:
    """Hard limits on each HTTP request, so that a stuck server never holds the sender thread for long."""

    connect: float = 3.0
    read: float = 10.0

    def __post_init__(self) -> None:
        for name in ("connect", "read"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
                raise ConfigurationError(f"Timeouts.{name} must be a number of seconds > 0, got {value!r}")


def combine(
    cls: type[Group],
    group: Group | None,
    parameter: str,
    flat: Mapping[str, Any],
    aliases: Mapping[str, str],
    owner: str,
) -> Group:
    """The settings object `parameter=` gave, with the flat keywords `aliases` names merged in.

    `flat` holds the flat keywords' values (None: not given); `aliases` maps each
    flat keyword to its field. A field the object sets (not None, or a field with
    a concrete default such as `Timeouts.read`) and its flat keyword given too is a
    `ConfigurationError` naming both: the caller meant one of them, and picking
    silently would hide which.
    """
    if group is not None and not isinstance(group, cls):
        raise ConfigurationError(f"{owner}: {parameter}= must be a {cls.__name__}, got {type(group).__name__}")
    changes: dict[str, Any] = {}
    for keyword, name in aliases.items():
        value = flat.get(keyword)
        if value is None:
            continue
        if group is not None and getattr(group, name) is not None:
            raise ConfigurationError(
                f"{owner}: {keyword}= and {parameter}={cls.__name__}({name}=...) both set {name}; give it once"
            )
        changes[name] = value
    base = group if group is not None else cls()
    return dataclasses.replace(base, **changes) if changes else base


@dataclass(frozen=True)
class Alias:
    """Marks a flat keyword (in a TypedDict of `**keywords`) as another name for `group.field`.

    The logger merges by it, and docs/build_settings.py reads it to show the
    keyword with the field's environment variable.
    """

    group: type
    field: str


def aliases_of(keywords: type) -> dict[str, Alias]:
    """Each key of a TypedDict of flat keywords to the `Alias` in its annotation."""
    hints = typing.get_type_hints(keywords, include_extras=True)
    found = {}
    for name, hint in hints.items():
        found[name] = next(meta for meta in getattr(hint, "__metadata__", ()) if isinstance(meta, Alias))
    return found
