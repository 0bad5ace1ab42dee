"""A small client for Grafana's `POST /api/ds/query`, the endpoint panels query through.

Running the dashboards' queries through Grafana (rather than straight at the
stores) also checks the data sources Grafana was provisioned with: their URLs,
database names and credentials. Credentials come from the environment
(GRAFANA_TOKEN, or GRAFANA_USER and GRAFANA_PASSWORD) or a token file, never from
a command-line flag, which other users of the machine could read.
"""

from __future__ import annotations

import base64
import json
import os
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any


class GrafanaError(Exception):
    """Grafana could not be asked: unreachable, refused the credentials, or answered nonsense."""


@dataclass(frozen=True)
class GrafanaClient:
    """Queries data sources through a Grafana server."""

    url: str
    authorization: str | None = None
    timeout: float = 60.0

    @classmethod
    def from_env(cls, url: str, token_file: str | None = None, timeout: float = 60.0) -> GrafanaClient:
        """Credentials from --grafana-token-file, GRAFANA_TOKEN, or GRAFANA_USER/GRAFANA_PASSWORD."""
        token = None
        if token_file:
            token = Path(token_file).read_text(encoding="utf-8").strip()
            if not token:
                raise GrafanaError(f"{token_file} is empty")
        token = token or os.environ.get("GRAFANA_TOKEN") or None
        if token:
            return cls(url.rstrip("/"), f"Bearer {token}", timeout)
        user, password = os.environ.get("GRAFANA_USER"), os.environ.get("GRAFANA_PASSWORD")
        if user and password:
            basic = base64.b64encode(f"{user}:{password}".encode()).decode()
            return cls(url.rstrip("/"), f"Basic {basic}", timeout)
        raise GrafanaError(
            "no Grafana credentials: set GRAFANA_TOKEN (a service account token), or GRAFANA_USER and "
            "GRAFANA_PASSWORD, or pass --grafana-token-file"
        )

    def _request(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(f"{self.url}{path}", data=data, method=method)
        request.add_header("Accept", "application/json")
        if data is not None:
            request.add_header("Content-Type", "application/json")
        if self.authorization:
            request.add_header("Authorization", self.authorization)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                status, raw = response.status, response.read()
        except urllib.error.HTTPError as exc:
            status, raw = exc.code, exc.read()
        except (urllib.error.URLError, OSError) as exc:
            raise GrafanaError(f"Grafana at {self.url} is unreachable: {exc}") from exc
        if status in (401, 403):
            raise GrafanaError(f"Grafana refused the credentials (HTTP {status}): {raw[:200].decode(errors='replace')}")
        try:
            return status, json.loads(raw) if raw else None
        except ValueError:
            raise GrafanaError(f"Grafana answered HTTP {status} with a body that is not JSON: {raw[:200]!r}") from None

    def query(self, queries: list[dict[str, Any]], start_ms: int, end_ms: int) -> dict[str, dict[str, Any]]:
        """Run queries (panel targets, with a `datasource` each); results by refId.

        Grafana answers 200 when every query succeeded, and 400 (207 with the
        datasourceQueryMultiStatus feature) when some failed: the per-query `error`
        and `status` are in the body either way.
        """
        body = {"queries": queries, "from": str(start_ms), "to": str(end_ms)}
        status, payload = self._request("POST", "/api/ds/query", body)
        if isinstance(payload, dict) and isinstance(payload.get("results"), dict):
            return payload["results"]
        message = payload.get("message") if isinstance(payload, dict) else payload
        raise GrafanaError(f"/api/ds/query answered HTTP {status}: {message}")

    def health(self) -> dict[str, Any]:
        status, payload = self._request("GET", "/api/health")
        if status != 200 or not isinstance(payload, dict):
            raise GrafanaError(f"/api/health answered HTTP {status}")
        return payload


def frame_values(result: dict[str, Any]) -> tuple[int, int]:
    """(frames, non-null values outside time fields) of one query's result."""
    frames = result.get("frames") or []
    values = 0
    for frame in frames:
        fields = (frame.get("schema") or {}).get("fields") or []
        columns = (frame.get("data") or {}).get("values") or []
        for spec, column in zip(fields, columns, strict=False):
            if spec.get("type") == "time":
                continue
            values += sum(1 for value in column if value is not None)
    return len(frames), values
