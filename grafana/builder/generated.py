"""Generated files written, or checked, the one way every builder (dashboards, alerting, docs/settings.md) does it."""

from __future__ import annotations

import sys
from pathlib import Path


def write_generated(files: dict[Path, str], check: bool, command: str) -> int:
    """Write the files whose text changed (or, with `check`, list them and return 1); 0 when all are current."""
    stale = []
    for path, text in files.items():
        if path.exists() and path.read_text(encoding="utf-8") == text:
            continue
        stale.append(path)
        if not check:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
    if check and stale:
        names = ", ".join(str(path) for path in stale)
        print(f"out of date: {names}; run {command}", file=sys.stderr)
        return 1
    for path in stale:
        print(f"wrote {path}")
    return 0
