"""The outcome of the last runs, kept on the host and reported as the `stack_backup` metric.

The metric's shape is fixed by the alert rule and dashboard that read it:

  stack_backup,host=<host> last_success=<s>,age_seconds=<s>,last_run_ok=<0i|1i>,
      last_duration_seconds=<s>,added_bytes=<n>i <ns>

age_seconds counts from the last successful backup's end; when none ever
succeeded, from the moment the backup was installed (the first run of either
timer), so a host that never succeeds still ages into the alert.
"""

from __future__ import annotations

import json
import os
import ssl
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .config import Report


class ReportError(Exception):
    """The metric could not be written; the message has the URL and the answer."""


class StateError(Exception):
    """The state file cannot be read as a state; the message names it and what to do."""


@dataclass
class State:
    installed: float = 0.0
    last_success: float = 0.0
    last_run: float = 0.0
    last_run_ok: bool = False
    last_duration_seconds: float = 0.0
    added_bytes: int = 0
    last_error: str = ""
    stores: dict[str, dict] = field(default_factory=dict)


def load(path: Path, now: float | None = None) -> State:
    """The saved state, or a new one installed now (saved at once, so its age starts now)."""
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        state = State(installed=time.time() if now is None else now)
        save(path, state)
        return state
    except (OSError, ValueError) as error:
        raise _unusable(path, error) from error
    if not isinstance(data, dict):
        raise _unusable(path, f"a JSON {type(data).__name__}, not an object")
    defaults = State()
    known = {}
    for name, value in data.items():
        if name not in State.__dataclass_fields__:
            continue  # a field of another release: left out, as before
        if not _fits(value, type(getattr(defaults, name))):
            raise _unusable(path, f"{name} is {value!r}")
        known[name] = value
    return State(**known)


def _fits(value: object, kind: type) -> bool:
    """True when a saved value has its field's type (an int is a float too; a bool is only a bool)."""
    if kind is bool or isinstance(value, bool):
        return kind is bool and isinstance(value, bool)
    return isinstance(value, (int, float) if kind is float else kind)


def _unusable(path: Path, why: object) -> StateError:
    return StateError(
        f"the state file {path} is unusable ({why}); move it aside and the next run starts a new one "
        "(the backup's age then counts from that run)"
    )


def save(path: Path, state: State) -> None:
    """Write the state atomically, mode 0600."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "w") as out:
            json.dump(asdict(state), out, indent=2, sort_keys=True)
            out.write("\n")
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def _tag(value: str) -> str:
    """Escape a tag value for line protocol (comma, equals sign, space)."""
    return value.replace("\\", "\\\\").replace(",", "\\,").replace("=", "\\=").replace(" ", "\\ ")


def metric_line(host: str, state: State, now: float) -> str:
    """The stack_backup point of this host at `now` (see the module docstring)."""
    since = state.last_success if state.last_success > 0 else state.installed
    age = max(0.0, now - since)
    fields = (
        f"last_success={float(state.last_success)!r},age_seconds={age!r},"
        f"last_run_ok={1 if state.last_run_ok else 0}i,"
        f"last_duration_seconds={float(state.last_duration_seconds)!r},added_bytes={int(state.added_bytes)}i"
    )
    return f"stack_backup,host={_tag(host)} {fields} {int(now * 1e9)}\n"


def _shown(url: str) -> str:
    """The URL without its query: an InfluxDB 1.x URL may carry u= and p=."""
    return url.split("?", 1)[0]


def write_metric(report: Report, line: str) -> None:
    """POST the line to the metrics store; TLS is verified (report.ca_file adds a private CA)."""
    headers = {"Content-Type": "text/plain; charset=utf-8"}
    if report.token_file is not None:
        try:
            token = report.token_file.read_text().strip()
        except OSError as error:
            raise ReportError(f"cannot read the report token {report.token_file}: {error.strerror}") from error
        headers["Authorization"] = f"Token {token}"
    context = ssl.create_default_context(cafile=str(report.ca_file) if report.ca_file else None)
    request = urllib.request.Request(report.url, data=line.encode(), headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=report.timeout_seconds, context=context) as response:
            status = response.status
    except urllib.error.HTTPError as error:
        detail = error.read().decode(errors="replace").strip()[:300]
        refused = f"{_shown(report.url)} refused the stack_backup metric (HTTP {error.code})"
        raise ReportError(f"{refused}: {detail}") from error
    except OSError as error:
        raise ReportError(f"{_shown(report.url)} did not take the stack_backup metric: {error}") from error
    if status not in (200, 204):
        raise ReportError(f"{_shown(report.url)} answered the stack_backup metric with HTTP {status}")
