"""The client's public API, pinned: what `telemetry_client` and its public modules export.

Public means `telemetry_client.__all__` and the `__all__` of the public modules
listed in PUBLIC below; modules and packages whose name starts with `_` are the
implementation and may change. A change to this file is a change to the API:
adding a name is a new feature, removing or renaming one breaks callers.

The simulator and the benchmarks are written as a user of the client would be:
they import public names only, which the last tests check by reading their source.
"""

from __future__ import annotations

import ast
import importlib
import pkgutil
from pathlib import Path

import pytest

import telemetry_client

ROOT = Path(__file__).resolve().parent.parent

PUBLIC: dict[str, list[str]] = {
    "telemetry_client": [
        "TLS",
        "BufferSettings",
        "ConfigurationError",
        "Connection",
        "LokiHandler",
        "MetricsLogger",
        "Timeouts",
        "__version__",
        "bind",
        "handle_sigterm",
        "initialize_wandb",
        "log_context",
        "log_with_context",
        "setup_loki_logger",
        "shutdown",
        "unbind",
    ],
    "telemetry_client.__main__": ["main"],
    "telemetry_client.errors": ["ConfigurationError"],
    "telemetry_client.config": [
        "DEFAULT_ENVIRONMENT",
        "DEFAULT_EXIT_TIMEOUT",
        "ENV_ENVIRONMENT",
        "ENV_EXIT_TIMEOUT",
        "ENV_HANDLE_SIGTERM",
        "ENV_STRICT",
        "INFLUXDB_ENV",
        "LOKI_ENV",
        "Ignored",
        "InfluxDBConfig",
        "LokiConfig",
        "Setting",
        "exit_timeout_setting",
        "handle_sigterm_setting",
        "influxdb_config",
        "loki_config",
    ],
    "telemetry_client.catalog": [
        "ALL_ROLES",
        "CATALOG",
        "DELTA_SUFFIX",
        "DROP_REASONS",
        "LOKI_ONLY_COUNTERS",
        "MEASUREMENTS",
        "NODE_CATALOG",
        "QUERYABLE",
        "ROLES",
        "SELF_COUNTERS",
        "SPARSE_DELTAS",
        "SPREADS",
        "SPREAD_OF",
        "STACK_CATALOG",
        "STANDARD_TAGS",
        "Field",
        "Measurement",
        "Spread",
        "measurement",
        "measurements_for_role",
    ],
    "telemetry_client.cardinality": [
        "Fleet",
        "field_series",
        "fleet_series",
        "main",
        "report",
        "series_per_node",
        "spread_series",
    ],
    "telemetry_client.metrics": ["TLS", "Connection", "MetricsLogger", "Timeouts", "encode_lines"],
    "telemetry_client.loki": [
        "TLS",
        "DropMessagesMatching",
        "LokiHandler",
        "LokiLogger",
        "NoSubtensorWarning",
        "OneLineFormatter",
        "Timeouts",
        "console_handler",
        "log_with_context",
        "push_url",
        "setup_loki_logger",
    ],
    "telemetry_client.experiment_tracking": ["VersionedRun", "WandbNotInstalledError", "initialize_wandb"],
    "telemetry_client.doctor": ["main"],
    "telemetry_client.testing": ["InMemoryDestination", "LogEntry", "Point", "Request"],
}

# The private packages each layer may import, besides the shared public errors, config and catalog;
# `_doctor` sits on top of everything and may import anything.
LAYERS: dict[str, set[str]] = {"_engine": set(), "_influx": {"_engine"}, "_loki": {"_engine"}}
SHARED_PUBLIC = {"errors", "config", "catalog"}

# A benchmark that compares the client with a design it replaced has to switch that design
# back on inside the client; these are the only internals such a benchmark touches.
MEASURES_REPLACED_DESIGN: dict[str, list[str]] = {
    # several streams per push (Loki answers for the last stream only), against one stream per push
    "bench/bench_loki_delivery.py": ["from telemetry_client._loki.sink import LokiSink"],
}


@pytest.mark.parametrize("module_name", sorted(PUBLIC))
def test_each_public_module_exports_exactly_the_pinned_names(module_name: str) -> None:
    module = importlib.import_module(module_name)
    assert sorted(module.__all__) == sorted(PUBLIC[module_name])
    assert len(set(module.__all__)) == len(module.__all__)


@pytest.mark.parametrize("module_name", sorted(PUBLIC))
def test_every_exported_name_resolves(module_name: str) -> None:
    module = importlib.import_module(module_name)
    missing = [name for name in module.__all__ if not hasattr(module, name)]
    assert not missing


def test_every_public_module_is_pinned() -> None:
    """A new module without a leading underscore is public: it must be listed here, with its `__all__`."""
    found = {
        info.name
        for info in pkgutil.iter_modules(telemetry_client.__path__, "telemetry_client.")
        if not info.name.rsplit(".", 1)[1].startswith("_") or info.name.endswith(".__main__")
    }
    assert found | {"telemetry_client"} == set(PUBLIC)


def test_the_seed_import_paths_keep_working() -> None:
    from telemetry_client import (
        LokiHandler,
        MetricsLogger,
        initialize_wandb,
        log_with_context,
        setup_loki_logger,
    )
    from telemetry_client.experiment_tracking import initialize_wandb as tracking_initialize_wandb
    from telemetry_client.loki import LokiHandler as loki_handler
    from telemetry_client.loki import log_with_context as loki_log_with_context
    from telemetry_client.loki import setup_loki_logger as loki_setup
    from telemetry_client.metrics import MetricsLogger as metrics_logger

    assert metrics_logger is MetricsLogger
    assert loki_handler is LokiHandler
    assert loki_setup is setup_loki_logger
    assert loki_log_with_context is log_with_context
    assert tracking_initialize_wandb is initialize_wandb


def test_configuration_error_has_one_class_wherever_it_is_imported_from() -> None:
    """Its home is `errors`; `metrics` still resolves it for code written against the older layout."""
    from telemetry_client import ConfigurationError
    from telemetry_client.errors import ConfigurationError as home
    from telemetry_client.metrics import ConfigurationError as older_path

    assert ConfigurationError is home is older_path
    assert "ConfigurationError" not in importlib.import_module("telemetry_client.metrics").__all__


def test_the_cli_entry_point_is_the_public_doctor_main() -> None:
    text = (ROOT / "pyproject.toml").read_text()
    assert 'telemetry-doctor = "telemetry_client.doctor:main"' in text


# ---- who may import what ------------------------------------------------------------------


def non_public_uses(source: str) -> list[str]:
    """Every use in `source` of a part of the client that PUBLIC does not list.

    Allowed: `import` of a public module; `from <public module> import <name in
    its __all__, or a public submodule>`; `<public module alias>.<name in its
    __all__>`; dunder names (`__version__`). Anything else, a `telemetry_client._*`
    module or a `_` name above all, is reported with its line.
    """
    tree = ast.parse(source)
    found: list[str] = []
    modules: dict[str, str] = {}  # local name -> public module it is bound to
    objects: set[str] = set()  # local names bound to the client's classes and functions
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] != "telemetry_client":
                    continue
                if alias.name not in PUBLIC:
                    found.append(f"line {node.lineno}: import {alias.name}")
                elif alias.asname:
                    modules[alias.asname] = alias.name
                else:
                    modules["telemetry_client"] = "telemetry_client"
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "telemetry_client":
            for alias in node.names:
                local = alias.asname or alias.name
                submodule = f"{node.module}.{alias.name}"
                if submodule in PUBLIC:
                    modules[local] = submodule
                elif node.module in PUBLIC and alias.name in PUBLIC[node.module]:
                    objects.add(local)
                else:
                    found.append(f"line {node.lineno}: from {node.module} import {alias.name}")
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)):
            continue
        name, attr = node.value.id, node.attr
        if attr.startswith("__"):
            continue
        if name in modules:
            module = modules[name]
            if attr not in PUBLIC[module] and f"{module}.{attr}" not in PUBLIC:
                found.append(f"line {node.lineno}: {name}.{attr}")
        elif name in objects and attr.startswith("_"):
            found.append(f"line {node.lineno}: {name}.{attr}")
    return found


def test_the_public_use_check_sees_what_it_must() -> None:
    assert non_public_uses("from telemetry_client.metrics import MetricsLogger\nimport telemetry_client\n") == []
    assert non_public_uses("from telemetry_client import __version__, catalog\ncatalog.CATALOG\n") == []
    assert non_public_uses("import telemetry_client.catalog as c\nc.ROLES\n") == []
    assert non_public_uses("from telemetry_client.shipping import Item\n")  # the older, flat layout
    assert non_public_uses("from telemetry_client.metrics import InfluxSink\n")
    assert non_public_uses("from telemetry_client._engine.shipping import Item\n")
    assert non_public_uses("import telemetry_client._influx.sink as sink\n")
    assert non_public_uses("from telemetry_client.metrics import _timestamp_ns\n")
    assert non_public_uses("from telemetry_client import cardinality as card\ncard._tag_values(1, 2)\n")
    assert non_public_uses("import telemetry_client\ntelemetry_client._engine\n")
    assert non_public_uses("from telemetry_client import MetricsLogger\nMetricsLogger._name\n")
    assert non_public_uses("def f():\n    from telemetry_client._loki.sink import LokiSink\n")


@pytest.mark.parametrize(
    "path",
    sorted(p.relative_to(ROOT).as_posix() for folder in ("simulator", "bench") for p in (ROOT / folder).rglob("*.py")),
)
def test_simulator_and_benchmarks_use_public_names_only(path: str) -> None:
    uses = [use.split(": ", 1)[1] for use in non_public_uses((ROOT / path).read_text())]
    assert uses == MEASURES_REPLACED_DESIGN.get(path, [])


def _imported_modules(source: str) -> set[str]:
    """The client's modules a source file imports, as dotted names (the client uses no relative imports)."""
    modules: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            modules.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            modules.add(node.module)
            modules.update(f"{node.module}.{alias.name}" for alias in node.names)
    return {module for module in modules if module.split(".")[0] == "telemetry_client"}


@pytest.mark.parametrize("package", sorted(LAYERS))
def test_private_packages_import_only_what_their_layer_allows(package: str) -> None:
    """`_engine` knows no sink; `_influx` and `_loki` build on `_engine`, never on each other or the public modules."""
    allowed = LAYERS[package] | {package}
    wrong = []
    for path in sorted((ROOT / "telemetry_client" / package).glob("*.py")):
        for module in _imported_modules(path.read_text()):
            parts = module.split(".")
            if len(parts) >= 2 and parts[1] not in allowed and parts[1] not in SHARED_PUBLIC:
                wrong.append(f"{path.name} imports {module}")
    assert wrong == []
