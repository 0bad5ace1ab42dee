"""The simulator against InfluxDB 1.x (the real 1.6.7) whose database does not exist yet."""

from __future__ import annotations

import urllib.parse
import urllib.request
from collections.abc import Iterator

import pytest
from servers import InfluxV1, influxdb_v1

from simulator import report as rp
from simulator.cli import main

pytestmark = pytest.mark.slow

QUICK = ["--duration", "1", "--ramp", "0", "--window-seconds", "1", "--processes", "0", "--miners", "1"]
QUICK += ["--points-per-sec", "50", "--no-validate", "--quiet", "--self-metrics-interval", "0.5"]


@pytest.fixture(scope="module")
def secured() -> Iterator[InfluxV1]:
    with influxdb_v1(auth_enabled=True) as server:
        server.query("CREATE USER admin WITH PASSWORD 'admin-pw' WITH ALL PRIVILEGES")
        yield server


def as_user(server: InfluxV1, user: str, password: str, statement: str) -> dict:
    import json

    data = urllib.parse.urlencode({"q": statement}).encode()
    credentials = urllib.parse.urlencode({"u": user, "p": password})
    with urllib.request.urlopen(f"{server.url}/query?{credentials}", data=data, timeout=30) as response:
        return json.loads(response.read())


def databases(server: InfluxV1, user: str = "admin", password: str = "admin-pw") -> set[str]:
    result = as_user(server, user, password, "SHOW DATABASES")["results"][0]
    return {row[0] for series in result.get("series", []) for row in series.get("values", [])}


def args(server: InfluxV1, database: str, user: str, password: str, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    for name in ("INFLUXDB_URL", "INFLUXDB_TOKEN", "INFLUXDB_DATABASE", "LOKI_URL", "GRAFANA_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("INFLUXDB_USERNAME", user)
    monkeypatch.setenv("INFLUXDB_PASSWORD", password)
    return ["--influxdb-url", server.url, "--influxdb-api-version", "1", "--influxdb-database", database, *QUICK]


def test_an_admin_gets_the_missing_database_created_and_filled(secured, monkeypatch):
    assert "fresh" not in databases(secured)
    code = main(args(secured, "fresh", "admin", "admin-pw", monkeypatch))
    assert code == 0
    assert "fresh" in databases(secured)
    measurements = as_user(secured, "admin", "admin-pw", 'SHOW MEASUREMENTS ON "fresh"')["results"][0]
    assert measurements.get("series"), measurements


def test_a_user_who_cannot_create_it_stops_before_writing_with_one_sentence(secured, monkeypatch, capsys):
    as_user(secured, "admin", "admin-pw", "CREATE USER writer WITH PASSWORD 'writer-pw'")
    code = main(args(secured, "absent", "writer", "writer-pw", monkeypatch))
    assert code == rp.EXIT_USAGE
    message = capsys.readouterr().err
    assert "has no database 'absent' and these credentials cannot create it" in message
    assert "writer-pw" not in message and message.count("\n") == 1
    assert "absent" not in databases(secured)
