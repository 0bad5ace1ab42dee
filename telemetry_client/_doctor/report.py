"""The doctor's verdicts: one check is OK, WARN or FAIL, with one sentence of evidence and one of fix.

A node operator reads the text; a machine reads `--json`. The exit code sums it
up: 0 when every check is OK, 1 when the worst is a warning, 2 when one failed.
"""

from __future__ import annotations

import enum
import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, TextIO


class Status(enum.IntEnum):
    """Ordered by gravity, so the worst of a report is its `max`."""

    OK = 0
    WARN = 1
    FAIL = 2


@dataclass
class Check:
    """One verdict. `fix` names the setting to change; it is empty when there is nothing to do."""

    name: str
    status: Status
    evidence: str
    fix: str = ""
    details: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "status": self.status.name,
            "evidence": self.evidence,
            "fix": self.fix,
            "details": self.details,
        }


def ok(name: str, evidence: str, **details: Any) -> Check:
    return Check(name, Status.OK, evidence, "", details)


def warn(name: str, evidence: str, fix: str, **details: Any) -> Check:
    return Check(name, Status.WARN, evidence, fix, details)


def fail(name: str, evidence: str, fix: str, **details: Any) -> Check:
    return Check(name, Status.FAIL, evidence, fix, details)


def exit_code(checks: Iterable[Check]) -> int:
    """0 all good, 1 the worst is a warning, 2 something failed."""
    return int(max((c.status for c in checks), default=Status.OK))


def describe_secret(value: str | None) -> str:
    """A secret as it may be shown: present or not, its length and a short fingerprint, never its text.

    The fingerprint (first 8 hex digits of its SHA-256) lets an operator compare two
    copies of a token without either being printed.
    """
    if not value:
        return "not set"
    digest = hashlib.sha256(value.encode()).hexdigest()[:8]
    return f"set ({len(value)} characters, sha256 {digest}…)"


_MARK = {Status.OK: "OK  ", Status.WARN: "WARN", Status.FAIL: "FAIL"}


def render_text(checks: list[Check], out: TextIO) -> None:
    """One block per check: the verdict and its evidence, then the fix, indented."""
    for check in checks:
        out.write(f"[{_MARK[check.status]}] {check.name}: {check.evidence}\n")
        if check.fix:
            out.write(f"       fix: {check.fix}\n")
    code = exit_code(checks)
    counts = {s: sum(1 for c in checks if c.status is s) for s in Status}
    out.write(
        f"\n{counts[Status.OK]} OK, {counts[Status.WARN]} warning(s), {counts[Status.FAIL]} failure(s)"
        f" (exit code {code})\n"
    )


def render_json(checks: list[Check], out: TextIO) -> None:
    json.dump(
        {
            "status": Status(exit_code(checks)).name,
            "exit_code": exit_code(checks),
            "checks": [c.as_dict() for c in checks],
        },
        out,
        indent=2,
        default=str,
    )
    out.write("\n")
