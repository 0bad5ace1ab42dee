"""`telemetry-doctor` (also `python -m telemetry_client doctor`): checks a node's telemetry settings and servers.

The checks are in `telemetry_client._doctor`; `main` is the command's entry point.
"""

from __future__ import annotations

from telemetry_client._doctor.cli import main

__all__ = ["main"]
