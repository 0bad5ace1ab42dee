"""Console output for node logs, and message filters shared by the console and Loki handlers.

On a terminal the console gets rich's `RichHandler`; anywhere else (a file, a pipe,
a process supervisor) a plain handler writes exactly one line per record, so log
files never hold wrapped or multi-line entries.
"""

from __future__ import annotations

import logging
import re
import sys
from collections.abc import Iterable
from typing import TextIO

SUBTENSOR_WARNING = "Verify your local subtensor is running on port"
ONE_LINE_FORMAT = "%(asctime)s %(levelname)-8s %(name)s: %(message)s"


class DropMessagesMatching(logging.Filter):
    """Drop records whose message contains any of `patterns`.

    A `str` pattern matches as a literal substring; a compiled `re.Pattern` is
    searched as a regular expression.
    """

    def __init__(self, patterns: Iterable[str | re.Pattern[str]]) -> None:
        super().__init__()
        self.patterns: tuple[str | re.Pattern[str], ...] = tuple(patterns)
        parts = []
        for pattern in self.patterns:
            if isinstance(pattern, re.Pattern):
                parts.append(f"(?:{pattern.pattern})")
            elif isinstance(pattern, str) and pattern:
                parts.append(re.escape(pattern))
            else:
                raise TypeError(f"a message pattern must be a non-empty str or re.Pattern, got {pattern!r}")
        self._search = re.compile("|".join(parts)).search if parts else None

    def filter(self, record: logging.LogRecord) -> bool:
        if self._search is None:
            return True
        try:
            message = record.getMessage()
        except Exception:
            return True  # a broken format string is the handler's problem to report, not a reason to drop
        return self._search(message) is None


class NoSubtensorWarning(DropMessagesMatching):
    """Drops the non-actionable "Verify your local subtensor is running on port" warning."""

    def __init__(self) -> None:
        super().__init__([SUBTENSOR_WARNING])


def default_filters() -> list[logging.Filter]:
    """The filters `setup_loki_logger` installs unless told otherwise."""
    return [NoSubtensorWarning()]


class OneLineFormatter(logging.Formatter):
    """A record, its traceback included, on exactly one line: newlines are written as a literal \\n."""

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        if "\n" in text or "\r" in text:
            text = text.replace("\r", "\\r").replace("\n", "\\n")
        return text


def console_handler(level: int = logging.NOTSET, stream: TextIO | None = None) -> logging.Handler:
    """RichHandler when `stream` (default stderr) is a terminal, else a one-line StreamHandler."""
    stream = stream if stream is not None else sys.stderr
    try:
        is_terminal = stream.isatty()
    except (AttributeError, ValueError):
        is_terminal = False
    handler: logging.Handler
    if is_terminal:
        from rich.console import Console  # imported here: rich is only needed on a terminal
        from rich.logging import RichHandler

        handler = RichHandler(level=level, console=Console(file=stream), show_path=False, markup=False)
    else:
        handler = logging.StreamHandler(stream)
        handler.setLevel(level)
        handler.setFormatter(OneLineFormatter(ONE_LINE_FORMAT))
    return handler
