"""Context fields for log records, carried by a context variable.

Values bound here follow the code that runs (thread, asyncio task) and never leak
into another thread's records. The variable holds an immutable snapshot: binding
makes a new dict and never changes the old one, so a log handler captures the
current context on the emitting thread with a single `get()` and no copy.
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from types import MappingProxyType
from typing import Any

_EMPTY: Mapping[str, Any] = MappingProxyType({})
_context: contextvars.ContextVar[Mapping[str, Any]] = contextvars.ContextVar("telemetry_log_context", default=_EMPTY)


def current_context() -> Mapping[str, Any]:
    """The fields bound in the current thread or task (a read-only snapshot; cheap)."""
    return _context.get()


@contextmanager
def log_context(**fields: Any) -> Iterator[Mapping[str, Any]]:
    """Add `fields` to every record logged inside the `with` block, then restore the previous context.

    >>> with log_context(step=5, trace_id="abc"):
    ...     logger.info("step done")  # the line carries step and trace_id
    """
    token = _context.set(MappingProxyType({**_context.get(), **fields}))
    try:
        yield _context.get()
    finally:
        _context.reset(token)


def bind(**fields: Any) -> None:
    """Add `fields` to every later record of this thread or task, until `unbind` or `clear_context`."""
    _context.set(MappingProxyType({**_context.get(), **fields}))


def unbind(*names: str) -> None:
    """Remove bound fields by name (names that are not bound are ignored)."""
    current = _context.get()
    if any(name in current for name in names):
        _context.set(MappingProxyType({k: v for k, v in current.items() if k not in names}))


def clear_context() -> None:
    """Remove every bound field of this thread or task."""
    _context.set(_EMPTY)
