"""Connection: where a MetricsLogger writes and how it authenticates, as one object.

Its fields are the arguments of `telemetry_client.config.influxdb_config`; None
means "not given", so the INFLUXDB_* variable and then the default apply, exactly
as for the flat keywords.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from telemetry_client.config import SECRET_SETTINGS, split_url_credentials


@dataclass(frozen=True, repr=False)
class Connection:
    """The InfluxDB destination of a MetricsLogger; secrets never appear in its repr."""

    url: str | None = None
    host: str | None = None
    port: int | str | None = None
    scheme: str | None = None
    database: str | None = None
    token: str | None = None
    org: str | None = None
    api_version: int | str | None = None
    username: str | None = None
    password: str | None = None
    retention_policy: str | None = None

    def __repr__(self) -> str:
        shown = []
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value is None:
                continue
            if f.name in SECRET_SETTINGS:
                shown.append(f"{f.name}=<hidden>")
            elif f.name == "url":
                shown.append(f"url={split_url_credentials(str(value))[0]!r}")
            else:
                shown.append(f"{f.name}={value!r}")
        return f"Connection({', '.join(shown)})"

    def arguments(self) -> dict[str, Any]:
        """The keyword arguments of `influxdb_config` this connection gives."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
