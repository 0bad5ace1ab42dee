"""Exceptions shared by every part of the client."""

from __future__ import annotations

__all__ = ["ConfigurationError"]


class ConfigurationError(ValueError):
    """A logger was configured in a way that cannot work; the message says how to fix it.

    Raised at construction only, never from `log()`/`emit()`.
    """
