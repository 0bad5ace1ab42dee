"""Build docs/settings.md, the reference of every setting of the client and its default, from the code.

Why generated: a default stated by hand in several places goes stale when the code
changes. Here every default is read from the client's own objects: the signatures
of the public callables (`inspect.signature`, the flat keywords of a `**keywords`
typed with `Unpack` included), the fields of the settings dataclasses their
parameters take (`Connection`, `TLS`, `Timeouts`, `BufferSettings`), what `telemetry_client.config`
resolves with no argument and no environment variable, its `ENV_*`/`DEFAULT_*`
constants and `INFLUXDB_ENV`/`LOKI_ENV` maps, and the Loki limits the client
enforces. Each line's meaning comes from the code's comment on that field or
constant where there is one, else from `MEANINGS` below: one source for each.
tests/test_settings_reference.py fails when the committed file differs from what
this produces, and when prose in README.md, docs/, telemetry_client/ or bench/
states a default that differs from the code's.

    python docs/build_settings.py          # rewrite docs/settings.md
    python docs/build_settings.py --check  # exit 1 when it is out of date

Why a script here and not a module of telemetry_client: it writes documentation.
A training node never needs it, and `help()` already shows a user the signatures;
the package's public surface stays what nodes import.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import io
import logging
import sys
import tokenize
import typing
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import telemetry_client
from grafana.builder.generated import write_generated
from telemetry_client import config

# The one private module read here (Loki's limits have no public path): a move changes this line only.
from telemetry_client._loki import limits as LOKI_LIMITS_MODULE

ROOT = Path(__file__).resolve().parents[1]

OUT = ROOT / "docs" / "settings.md"
PROCESS_TITLE = "The end of a process"
LOKI_LIMITS_TITLE = "Loki limits checked before sending"
COMMAND = "python docs/build_settings.py"
REQUIRED = object()  # the default of a parameter that has none

# The public callables whose parameters are settings, in the order the page shows them.
CALLABLES: tuple[Callable[..., Any], ...] = (
    telemetry_client.MetricsLogger,
    telemetry_client.setup_loki_logger,
    telemetry_client.LokiHandler,
)


def _influxdb_defaults() -> config.InfluxDBConfig:
    return config.influxdb_config(url="http://127.0.0.1", token="-", environ={})


def _loki_defaults() -> config.LokiConfig:
    return config.loki_config(url="http://127.0.0.1", environ={})


def _settings(resolved: Any, names: Mapping[str, str] | None = None) -> dict[str, config.Setting]:
    """A resolved destination's settings by name; `names` renames a group's fields (field -> setting)."""
    if names is None:
        return {s.name: s for s in resolved.settings}
    return {field: resolved.setting(setting) for field, setting in names.items()}


# TLS fields whose setting the InfluxDB resolver knows under another name (field -> setting).
TLS_SETTINGS = {"verify": "verify_tls"}

# Which callable or settings dataclass reads which environment variables (name -> variable),
# and the resolved settings that give its defaults when its own default is None ("not given").
ENVIRONMENT: dict[str, tuple[Mapping[str, str], Callable[[], Mapping[str, config.Setting]]]] = {
    "MetricsLogger": (config.INFLUXDB_ENV, lambda: _settings(_influxdb_defaults())),
    "Connection": (config.INFLUXDB_ENV, lambda: _settings(_influxdb_defaults())),
    "TLS": (
        {field: config.INFLUXDB_ENV[setting] for field, setting in TLS_SETTINGS.items()},
        lambda: _settings(_influxdb_defaults(), TLS_SETTINGS),
    ),
    "setup_loki_logger": (config.LOKI_ENV, lambda: _settings(_loki_defaults())),
}

# What each setting means, where the code carries no comment saying it. A key is a
# name (the same meaning wherever it appears) or "Owner.name" (one owner only).
MEANINGS: dict[str, str] = {
    # InfluxDB destination
    "Connection.url": "the InfluxDB base URL; wins over host and port",
    "host": "the InfluxDB host, when no URL is given (none anywhere: the logger is off)",
    "port": "the InfluxDB port, with host",
    "scheme": "`https`, or `http` for a loopback host, with host",
    "database": "the database (API v1) or bucket (API v2)",
    "token": "API v2 token; there is no fallback token",
    "org": "API v2 organisation",
    "api_version": "2 (`/api/v2/write`) or 1 (`/write`, InfluxDB 1.x)",
    "username": "basic auth user (InfluxDB: API v1 only); with password",
    "password": "basic auth password; with username",
    "retention_policy": "API v1 retention policy (none: the database's default)",
    "verify_tls": "verify the server's TLS certificate (`TLS.verify`; none: verified)",
    "TLS.verify": "verify the server's TLS certificate (the Loki handlers read no variable: verified)",
    "ca_certs": "a CA bundle to verify the server with (none: the system's)",
    "compress": "gzip request bodies",
    "connect_timeout": "`Timeouts.connect` (none: its default)",
    "read_timeout": "`Timeouts.read` (none: its default)",
    "Timeouts.connect": "seconds to connect, per request",
    "Timeouts.read": "seconds to wait for an answer, per request",
    "connection": "where to write and how to authenticate (`Connection` below; none: the flat keywords and env)",
    "tls": "certificate checks (`TLS` below; none: the flat keywords, then the defaults)",
    "destination": "in a node's own tests: where to send instead of a server (`telemetry_client.testing`)",
    "timeouts": "per-request timeouts (`Timeouts` below; none: the flat keywords, then the defaults)",
    "buffer": "bounds, batching and retries of the channel (`BufferSettings` below; none: its defaults)",
    "enabled": "`False`: an explicit no-op that reads and needs nothing",
    "strict": "nothing configured is a `ConfigurationError` rather than the destination off",
    # MetricsLogger tags and sampling
    "prefix": "written in front of every measurement name as is",
    "uid": "the node's `uid` tag or label",
    "MetricsLogger.role": "the `role` tag",
    "MetricsLogger.version": "the `version` tag",
    "runtime_id": "the `runtime_id` tag (none: one is made per process)",
    "config": "the node's configuration; allow-listed values become tags (`config_tags`)",
    "group": "the `group` tag",
    "job_type": "the `job_type` tag",
    "network": "the `network` tag (none: read from `config` through `config_tags`)",
    "config_tags": "tag name to the `config` attribute path it is read from",
    "system_metrics_interval": "seconds between host and GPU samples",
    "self_metrics_interval": "seconds between `telemetry_client` points (None: none)",
    "max_string_bytes": "the longest string field; longer ones are dropped (`too_large`)",
    "max_queue_size": "when given (and no `buffer`), `BufferSettings.max_items`",
    "max_workers": "accepted and ignored: one sender thread per process serves every logger",
    # Loki
    "service": "the `service` label (required)",
    "setup_loki_logger.version": "the `version` label",
    "setup_loki_logger.url": "the Loki base URL or full push URL (none anywhere: Loki is off)",
    "setup_loki_logger.role": "the `role` label (none: the service's name)",
    "environment": "the `environment` label",
    "bearer_token": "`Authorization: Bearer ...` (not together with basic auth)",
    "tenant_id": "`X-Scope-OrgID` for a multi-tenant Loki",
    "labels": "extra static stream labels, validated against Loki's rules",
    "setup_loki_logger.level": "the logger's level",
    "console": "also print to the console",
    "filters": "logging filters (none: drop the subtensor 'Verify your local subtensor' warning; [] for none)",
    "max_line_bytes": "longer lines are truncated with a marker, not dropped",
    "structured_metadata": "send context as Loki structured metadata too",
    "metrics_logger": "a `MetricsLogger` that also writes this handler's counters",
    "setup_loki_logger.host": "the `host` label (none: the machine's name)",
    "logger_name": "the logger configured (none: the service's name)",
    "close_timeout": "seconds `close()` waits for delivery, and a replaced handler is given",
    "LokiHandler.url": "the Loki base URL or full push URL",
    "tags": "static stream labels, validated",
    "auth": "(user, password) for basic auth",
    "LokiHandler.version": 'the push API: "1" is the only one current Loki has',
    "headers": "extra HTTP headers of every push",
    "LokiHandler.level": "the handler's level",
    # BufferSettings fields without a comment in the code
    "max_items": "records and items the channel buffers, encoded or not, together; beyond it the oldest go",
    "max_bytes": "bounds everything the channel buffers, records not yet encoded included (estimated)",
    "batch_items": "a batch is sent once it holds this many items",
    "batch_bytes": "a batch is sent once it holds this many bytes (uncompressed)",
    "retry_base": "the first retry's backoff ceiling (seconds), doubled per attempt, full jitter",
    "retry_cap": "the longest backoff (seconds); a refused connection or a 502 is retried within min(this, 1 s)",
    # Loki limits
    "MAX_LABEL_NAME_BYTES": "the longest label name (Loki's `max_label_name_length`)",
    "MAX_LABEL_VALUE_BYTES": "the longest label value (Loki's `max_label_value_length`)",
    "MAX_LABELS": "label names per stream, `level` included (Loki's `max_label_names_per_series`)",
    "MIN_MAX_LINE_BYTES": "the smallest `max_line_bytes` accepted",
}


@dataclass(frozen=True)
class Entry:
    """One setting: where it lives, its default as the code has it, its variable and meaning."""

    owner: str  # the section: a callable's or dataclass's name, "process" or "loki_limits"
    name: str
    default: Any  # REQUIRED for a parameter without one
    env: str | None
    meaning: str
    meaning_source: str  # "code" (a comment or docstring) or "table" (MEANINGS)

    @property
    def qualified(self) -> str:
        return f"{self.owner}.{self.name}"


def _comments(source: str) -> dict[int, str]:
    """Line number (1-based) to the text of the comment on that line, or of the comment block just above it."""
    trailing: dict[int, str] = {}
    whole_line: dict[int, str] = {}
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            text = token.string.lstrip("#").strip()
            if token.line.strip().startswith("#"):
                whole_line[token.start[0]] = text
            else:
                trailing[token.start[0]] = text
    found = dict(trailing)
    for line in range(1, source.count("\n") + 2):
        if line in found:
            continue
        block = []
        above = line - 1
        while above in whole_line:
            block.insert(0, whole_line[above])
            above -= 1
        if block:
            found[line] = " ".join(block)
    return found


def _assignment_comments(source: str) -> dict[str, str]:
    """Each top-level name assigned in `source` (a module or a class body) to its comment."""
    comments = _comments(source)
    tree = ast.parse(source)
    body = tree.body[0].body if len(tree.body) == 1 and isinstance(tree.body[0], ast.ClassDef) else tree.body
    found = {}
    for node in body:
        target = node.target if isinstance(node, ast.AnnAssign) else None
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
        if isinstance(target, ast.Name) and node.lineno in comments:
            found[target.id] = comments[node.lineno]
    return found


def _meaning(owner: str, name: str, code: Mapping[str, str]) -> tuple[str, str]:
    if name in code:
        return code[name], "code"
    for key in (f"{owner}.{name}", name):
        if key in MEANINGS:
            return MEANINGS[key], "table"
    return "", "none"


def _dataclasses_in(annotation: Any) -> Iterator[type]:
    """The dataclass types an annotation names (`BufferSettings | None` gives BufferSettings)."""
    if isinstance(annotation, type) and dataclasses.is_dataclass(annotation):
        yield annotation
    for argument in typing.get_args(annotation):
        yield from _dataclasses_in(argument)


def callable_entries(obj: Callable[..., Any]) -> tuple[list[Entry], list[type]]:
    """The entries of a public callable's parameters, and the settings dataclasses they take."""
    owner = obj.__name__
    env_names, resolve = ENVIRONMENT.get(owner, ({}, None))
    resolved = resolve() if resolve else {}
    target = obj.__init__ if inspect.isclass(obj) else obj
    hints = typing.get_type_hints(target)
    entries, nested = [], []
    for parameter in inspect.signature(obj).parameters.values():
        if parameter.kind == parameter.VAR_KEYWORD:
            entries += flat_keyword_entries(owner, hints.get(parameter.name))
            continue
        if parameter.kind == parameter.VAR_POSITIONAL:
            continue
        name = parameter.name
        default = REQUIRED if parameter.default is parameter.empty else parameter.default
        setting = resolved.get(name)
        if default is None and setting is not None and setting.source == config.DEFAULT:
            default = setting.value  # "not given" means the resolver's default
        meaning, source = _meaning(owner, name, {})
        entries.append(Entry(owner, name, default, env_names.get(name), meaning, source))
        nested += [cls for cls in _dataclasses_in(hints.get(name)) if cls not in nested]
    return entries, nested


def flat_keyword_entries(owner: str, annotation: Any) -> list[Entry]:
    """The flat keywords of a `**keywords: Unpack[SomeTypedDict]`: each says which group's field it sets.

    A key's annotation carries that field as metadata (`Annotated[..., Alias(group, field)]`,
    read by its `group` and `field`); the row shows the field's variable, and the
    field's own row gives the default.
    """
    if typing.get_origin(annotation) is not typing.Unpack:
        return []
    [keywords] = typing.get_args(annotation)
    entries = []
    for name, hint in typing.get_type_hints(keywords, include_extras=True).items():
        [alias] = [meta for meta in getattr(hint, "__metadata__", ()) if hasattr(meta, "group")]
        group = alias.group.__name__
        env = ENVIRONMENT.get(group, ({}, None))[0].get(alias.field)
        meaning = f"the same as `{group}.{alias.field}` (giving both is a `ConfigurationError`)"
        entries.append(Entry(owner, name, None, env, meaning, "code"))
    return entries


def dataclass_entries(cls: type) -> list[Entry]:
    """The entries of a settings dataclass's fields, meanings from the comments on them.

    A field whose default is None ("not given") shows the resolver's default and
    its environment variable when ENVIRONMENT names the class.
    """
    code = _assignment_comments(inspect.getsource(cls))
    env_names, resolve = ENVIRONMENT.get(cls.__name__, ({}, None))
    resolved = resolve() if resolve else {}
    entries = []
    for f in dataclasses.fields(cls):
        default = f.default if f.default is not dataclasses.MISSING else REQUIRED
        if f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        setting = resolved.get(f.name)
        if default is None and setting is not None and setting.source == config.DEFAULT:
            default = setting.value
        meaning, source = _meaning(cls.__name__, f.name, code)
        entries.append(Entry(cls.__name__, f.name, default, env_names.get(f.name), meaning, source))
    return entries


def process_entries() -> list[Entry]:
    """The process-wide settings: every `config.ENV_*` no destination reads, with its default."""
    code = _assignment_comments(inspect.getsource(config))
    destination_env = {name for env_names, _ in ENVIRONMENT.values() for name in env_names.values()}
    entries = []
    for constant, env in vars(config).items():
        if not constant.startswith("ENV_") or env in destination_env:
            continue
        name = constant.removeprefix("ENV_").lower()
        resolver = getattr(config, f"{name}_setting")
        default = resolver({}).value
        default_constant = f"DEFAULT_{constant.removeprefix('ENV_')}"
        if default_constant in code:
            meaning, source = code[default_constant], "code"
        else:
            summary = (inspect.getdoc(resolver) or "").split("\n")[0].rstrip(".")
            meaning, source = summary[:1].lower() + summary[1:], "code"
        entries.append(Entry("process", name, default, env, meaning, source))
    return entries


def loki_limit_entries() -> list[Entry]:
    """The Loki limits the client enforces before sending: the integer constants of its limits module."""
    code = _assignment_comments(inspect.getsource(LOKI_LIMITS_MODULE))
    entries = []
    for name, value in vars(LOKI_LIMITS_MODULE).items():
        if name.isupper() and not name.startswith("DEFAULT_") and isinstance(value, int):
            meaning, source = _meaning("loki_limits", name, code)
            entries.append(Entry("loki_limits", name, value, None, meaning, source))
    return entries


def sections() -> list[tuple[str, list[Entry]]]:
    """(title, entries) for every section of the page, in order."""
    found: list[tuple[str, list[Entry]]] = []
    dataclass_types: list[type] = []
    for obj in CALLABLES:
        entries, nested = callable_entries(obj)
        found.append((obj.__name__, entries))
        dataclass_types += [cls for cls in nested if cls not in dataclass_types]
    for cls in dataclass_types:  # grows while it is read: a settings dataclass may hold others
        found.append((cls.__name__, dataclass_entries(cls)))
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            dataclass_types += [c for c in _dataclasses_in(hints.get(f.name)) if c not in dataclass_types]
    found.append((PROCESS_TITLE, process_entries()))
    found.append((LOKI_LIMITS_TITLE, loki_limit_entries()))
    return found


def all_entries() -> list[Entry]:
    return [entry for _, entries in sections() for entry in entries]


def _binary_size(value: int) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if value >= size and value % size == 0:
            return f"{value // size} {unit}"
    return ""


def show_default(entry: Entry) -> str:
    """The default as the page shows it: the Python value, and a byte size in binary units."""
    value = entry.default
    if value is REQUIRED:
        return "required"
    if isinstance(value, bool) or value is None:
        return f"`{value}`"
    if isinstance(value, int) and entry.name.lower().endswith("bytes"):
        size = _binary_size(value)
        return f"`{value}`" + (f" ({size})" if size else "")
    if isinstance(value, int) and entry.name == "level":
        return f"`{value}` ({logging.getLevelName(value)})"
    if dataclasses.is_dataclass(value):
        return f"`{type(value).__name__}()`"
    return f"`{value!r}`"


SECTION_NOTES = {
    "MetricsLogger": "`telemetry_client.MetricsLogger`; read when the logger is built; an argument wins over its "
    "variable, which wins over the default ([metrics.md](metrics.md#configuration)).",
    "setup_loki_logger": "`telemetry_client.setup_loki_logger`; read when it is called; an argument wins over its "
    "variable ([logging.md](logging.md#environment)).",
    "LokiHandler": "`telemetry_client.LokiHandler`; the handler alone reads no environment variable.",
    "Connection": "`telemetry_client.Connection`, the `connection=` of `MetricsLogger`: what "
    "`telemetry_client.config.influxdb_config` resolves; a field not given falls back to its variable, "
    "then the default ([metrics.md](metrics.md#configuration)).",
    "TLS": "`telemetry_client.TLS`, the `tls=` of `MetricsLogger`, `setup_loki_logger` and `LokiHandler`; "
    "only `MetricsLogger` reads the variable.",
    "Timeouts": "`telemetry_client.Timeouts`, the `timeouts=` of `MetricsLogger`, `setup_loki_logger` and "
    "`LokiHandler`.",
    "BufferSettings": "`telemetry_client.BufferSettings`, the `buffer=` of every logger and handler "
    "([delivery.md](delivery.md#the-memory-bound)).",
    PROCESS_TITLE: "Read at the process's end and by `python -m telemetry_client doctor` ([delivery.md](delivery.md)).",
    LOKI_LIMITS_TITLE: "Loki 3.x's `limits_config` defaults; not settings of the client "
    "([logging.md](logging.md#lokis-limits-enforced-by-the-client)).",
}


def render() -> str:
    """The exact text docs/settings.md must have."""
    lines = [
        "# Settings and their defaults",
        "",
        f"<!-- Generated by {COMMAND} from the code; do not edit. -->",
        "",
        "Every setting of the client, its default as the code has it, the environment",
        "variable that sets it and what it means. Other pages link here rather than",
        "repeat a figure; where one states a default, it is written `name` (default X)",
        "and tests/test_settings_reference.py checks it against this table.",
    ]
    for title, entries in sections():
        lines += ["", f"## {title}", ""]
        if title in SECTION_NOTES:
            lines += [SECTION_NOTES[title], ""]
        with_env = any(entry.env for entry in entries)
        header = ["name", "default", "environment variable", "meaning"] if with_env else ["name", "default", "meaning"]
        lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        for entry in entries:
            cells = [f"`{entry.name}`", show_default(entry)]
            if with_env:
                cells.append(f"`{entry.env}`" if entry.env else "")
            cells.append(entry.meaning.replace("|", "\\|"))
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when the file is out of date")
    parser.add_argument("--out", type=Path, default=OUT, help=f"the file to write (default {OUT.relative_to(ROOT)})")
    args = parser.parse_args(argv)
    return write_generated({args.out: render()}, args.check, COMMAND)


if __name__ == "__main__":
    sys.exit(main())
