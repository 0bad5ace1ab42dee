"""One module per provisioned dashboard; each has a build() returning the dashboard JSON."""

from __future__ import annotations

from collections.abc import Callable

from grafana.builder.targets import Json
from grafana.dashboards_src import logs, network, system, telemetry_health, training, validators

# File name in grafana/dashboards/ to the function that builds it.
BUILDERS: dict[str, Callable[[], Json]] = {
    "training.json": training.build,
    "validators.json": validators.build,
    "network.json": network.build,
    "system.json": system.build,
    "logs.json": logs.build,
    "telemetry-health.json": telemetry_health.build,
}
