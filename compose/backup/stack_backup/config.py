"""The settings of a backup run: a JSON file the Ansible backup role renders (mode 0600).

Every mistake is reported at load time with the setting's name, before anything
is staged or sent.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# restic's --keep-within durations: a number with y, m, d or h, combined (e.g. 1y6m, 30d, 36h).
DURATION = re.compile(r"^(\d+[ymdh])+$")
STORE_NAME = re.compile(r"^[a-z][a-z0-9_-]{0,62}$")
STORE_KINDS = ("command", "sqlite", "victoriametrics", "paused-copy", "files")


class ConfigError(Exception):
    """A setting that is missing or wrong; the message names it."""


@dataclass(frozen=True)
class Store:
    """One store and how it is staged (see stores.py for each kind)."""

    name: str
    kind: str
    settings: dict[str, Any]

    def paths(self, key: str) -> list[Path]:
        return [Path(p) for p in self.settings.get(key, [])]


@dataclass(frozen=True)
class Report:
    """Where the stack_backup metric is written (InfluxDB 2 /api/v2/write, 1.x /write, VictoriaMetrics /write)."""

    url: str = ""
    token_file: Path | None = None
    ca_file: Path | None = None
    timeout_seconds: float = 30.0


@dataclass(frozen=True)
class Config:
    host: str
    repository: str
    password_file: Path
    staging_dir: Path
    state_file: Path
    lock_file: Path
    keep_within: str
    keep_last: int
    stores: list[Store]
    restic: str = "restic"
    restic_options: list[str] = field(default_factory=list)
    repository_env_file: Path | None = None
    # Staging needs the store's size times this, plus space_reserve_bytes, free.
    space_margin: float = 1.1
    space_reserve_bytes: int = 256 * 1024 * 1024
    report: Report = field(default_factory=Report)


_KINDS = {str: "string", int: "whole number", float: "number", list: "list"}


def _typed(value: Any, kind: type, name: str) -> Any:
    """`value` as a `kind` (an int is a float too), else a ConfigError naming the setting; a bool is no number."""
    accepted = (int, float) if kind is float else kind
    if isinstance(value, bool) or not isinstance(value, accepted) or (kind is float and not math.isfinite(value)):
        raise ConfigError(f"{name} must be a {_KINDS.get(kind, kind.__name__)}, not {value!r}")
    return float(value) if kind is float else value


def _require(data: dict[str, Any], key: str, kind: type, where: str = "") -> Any:
    if key not in data or data[key] in ("", None):
        raise ConfigError(f"{where}{key} is required")
    return _typed(data[key], kind, where + key)


def _optional(data: dict[str, Any], key: str, default: Any, kind: type, where: str = "") -> Any:
    return _typed(data.get(key, default), kind, where + key)


def _optional_text(data: dict[str, Any], key: str, default: str, where: str = "") -> str:
    """An optional string; absent, null or empty is the default."""
    value = data.get(key)
    return default if value in (None, "") else _typed(value, str, where + key)


def shown_repository(repository: str) -> str:
    """The repository as it may be printed: a password in a URL (rest:https://user:password@host/) is starred.

    restic does the same in what it prints (restic/restic, internal/backend/location/location.go,
    StripPassword, at b077a12; each backend's own StripPassword for its URLs).
    """
    return re.sub(r"(://[^/@:]*:)[^/]*@", r"\1***@", repository)  # up to the last @ before the path


def _optional_path(data: dict[str, Any], key: str, where: str = "") -> Path | None:
    value = _optional_text(data, key, "", where)
    return Path(value) if value else None


def _store(index: int, data: Any) -> Store:
    where = f"stores[{index}]."
    if not isinstance(data, dict):
        raise ConfigError(f"stores[{index}] must be a mapping")
    name = _require(data, "name", str, where)
    if not STORE_NAME.match(name):
        raise ConfigError(f"{where}name {name!r} must be lower-case letters, digits, - or _")
    kind = _require(data, "kind", str, where)
    if kind not in STORE_KINDS:
        raise ConfigError(f"{where}kind {kind!r} must be one of {', '.join(STORE_KINDS)}")
    where = f"stores[{index}] ({name}): "
    needs = {
        "command": ["argv"],
        "sqlite": ["path"],
        "victoriametrics": ["url", "data_dir"],
        "paused-copy": ["data_dir", "pause", "resume"],
        "files": ["paths"],
    }[kind]
    for key in needs:
        expected = list if key in ("argv", "pause", "resume", "paths") else str
        value = _require(data, key, expected, where)
        if expected is list and not all(isinstance(v, str) and v for v in value):
            raise ConfigError(f"{where}{key} must be a list of non-empty strings")
    tags = data.get("tags", [])
    if not isinstance(tags, list) or not all(isinstance(t, str) and t and "," not in t for t in tags):
        raise ConfigError(f"{where}tags must be a list of non-empty strings without commas")
    return Store(name=name, kind=kind, settings={k: v for k, v in data.items() if k not in ("name", "kind")})


def parse(data: Any) -> Config:
    """Check the settings and build the Config; raises ConfigError naming the first wrong setting."""
    if not isinstance(data, dict):
        raise ConfigError("the settings must be a JSON object")
    keep_within = _require(data, "keep_within", str)
    if not DURATION.match(keep_within):
        raise ConfigError(f"keep_within {keep_within!r} must be a restic duration such as 30d, 8w4d or 1y6m")
    keep_last = _require(data, "keep_last", int)
    if keep_last < 1:
        raise ConfigError("keep_last must be 1 or more: a run never forgets the backup it just made")
    stores_data = _require(data, "stores", list)
    stores = [_store(i, s) for i, s in enumerate(stores_data)]
    names = [s.name for s in stores]
    if len(set(names)) != len(names):
        raise ConfigError(f"stores: each name once, got {names}")
    report_data = data.get("report") or {}
    if not isinstance(report_data, dict):
        raise ConfigError("report must be a mapping")
    url = _optional_text(report_data, "url", "", "report.")
    if url and not url.startswith(("https://", "http://")):
        raise ConfigError(f"report.url {url!r} must be an http:// or https:// URL")
    timeout = _optional(report_data, "timeout_seconds", Report.timeout_seconds, float, "report.")
    if timeout <= 0:
        raise ConfigError(f"report.timeout_seconds must be more than 0, not {timeout!r}")
    report = Report(
        url=url,
        token_file=_optional_path(report_data, "token_file", "report."),
        ca_file=_optional_path(report_data, "ca_file", "report."),
        timeout_seconds=timeout,
    )
    options = data.get("restic_options", [])
    if not isinstance(options, list) or not all(isinstance(o, str) and "=" in o for o in options):
        raise ConfigError("restic_options must be a list of key=value strings (restic -o)")
    staging = Path(_require(data, "staging_dir", str))
    if not staging.is_absolute() or len(staging.parts) < 3:
        raise ConfigError(f"staging_dir {staging} must be an absolute path of its own (a run empties it)")
    margin = _optional(data, "space_margin", Config.space_margin, float)
    if margin < 1.0:
        raise ConfigError(f"space_margin must be 1.0 or more, not {margin}")
    reserve = _optional(data, "space_reserve_bytes", Config.space_reserve_bytes, int)
    if reserve < 0:
        raise ConfigError(f"space_reserve_bytes must be 0 or more, not {reserve!r}")
    return Config(
        host=_require(data, "host", str),
        repository=_require(data, "repository", str),
        password_file=Path(_require(data, "password_file", str)),
        staging_dir=staging,
        state_file=Path(_require(data, "state_file", str)),
        lock_file=Path(_require(data, "lock_file", str)),
        keep_within=keep_within,
        keep_last=keep_last,
        stores=stores,
        restic=_optional_text(data, "restic", "restic"),
        restic_options=options,
        repository_env_file=_optional_path(data, "repository_env_file"),
        space_margin=margin,
        space_reserve_bytes=reserve,
        report=report,
    )


def load(path: Path) -> Config:
    """Read and check the settings file."""
    try:
        data = json.loads(path.read_text())
    except OSError as error:
        raise ConfigError(f"cannot read the settings file {path}: {error.strerror}") from error
    except ValueError as error:
        raise ConfigError(f"the settings file {path} is not JSON: {error}") from error
    return parse(data)
