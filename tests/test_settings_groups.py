"""The grouped settings objects (`Connection`, `TLS`, `Timeouts`) and the flat keywords they stand for."""

from __future__ import annotations

import dataclasses

import pytest
from fault_server import fault_server

from telemetry_client import TLS, BufferSettings, ConfigurationError, Connection, LokiHandler, MetricsLogger, Timeouts

FAST = BufferSettings(flush_interval=0.05, retry_base=0.02, retry_cap=0.1)


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    import os

    for name in list(os.environ):
        if name.startswith(("INFLUXDB_", "LOKI_", "TELEMETRY_")):
            monkeypatch.delenv(name)
    return monkeypatch


def _transport(logger: MetricsLogger):  # the HTTP request a logger would make: URL, headers, TLS, timeouts
    return logger.channel.sink.transport


def test_the_grouped_form_builds_the_same_request_as_the_flat_form(clean_env: pytest.MonkeyPatch) -> None:
    flat = MetricsLogger(
        url="https://influx.example.org:8086",
        api_version=1,
        database="d",
        username="u",
        password="p",
        retention_policy="rp",
        verify_tls=False,
        ca_certs="/etc/ca.pem",
        connect_timeout=1.5,
        read_timeout=4,
        self_metrics_interval=None,
    )
    grouped = MetricsLogger(
        connection=Connection(
            url="https://influx.example.org:8086",
            api_version=1,
            database="d",
            username="u",
            password="p",
            retention_policy="rp",
        ),
        tls=TLS(verify=False, ca_certs="/etc/ca.pem"),
        timeouts=Timeouts(connect=1.5, read=4),
        self_metrics_interval=None,
    )
    seen = []
    for logger in (flat, grouped):
        transport = _transport(logger)
        seen.append(
            (
                transport.url,
                transport.headers,
                transport.verify_tls,
                transport.ca_certs,
                transport.connect_timeout,
                transport.read_timeout,
            )
        )
        logger.close(0)
    assert seen[0] == seen[1]
    assert seen[0][0] == "https://influx.example.org:8086/write?db=d&precision=n&rp=rp"
    assert seen[0][2:] == (False, "/etc/ca.pem", 1.5, 4)


def test_grouped_points_reach_the_server(clean_env: pytest.MonkeyPatch) -> None:
    with fault_server() as server:
        logger = MetricsLogger(
            uid=3,
            connection=Connection(url=server.url, api_version=1, database="d"),
            timeouts=Timeouts(read=2),
            buffer=FAST,
            self_metrics_interval=None,
        )
        logger.log("m", fields={"x": 1}, timestamp=5)
        assert logger.flush(5) == 0
        logger.close(1)
        assert server.lines == [b"m,uid=3 x=1 5"]


def test_the_forms_mix_and_the_environment_fills_what_neither_gives(clean_env: pytest.MonkeyPatch) -> None:
    """argument > env > default holds for a field of a group as for its flat keyword."""
    clean_env.setenv("INFLUXDB_HOST", "influx.example.org")
    clean_env.setenv("INFLUXDB_TOKEN", "env-token")
    clean_env.setenv("INFLUXDB_DATABASE", "env-bucket")
    clean_env.setenv("INFLUXDB_VERIFY_TLS", "false")
    logger = MetricsLogger(
        org="flat-org", connection=Connection(database="arg-bucket"), timeouts=Timeouts(connect=1), read_timeout=None
    )
    assert logger.settings.setting("database").source == "argument"
    assert logger.settings.setting("host").source == "env INFLUXDB_HOST"
    assert logger.settings.setting("org").value == "flat-org"
    assert logger.settings.setting("verify_tls").source == "env INFLUXDB_VERIFY_TLS"
    assert "database" in [i.name for i in logger.settings.ignored]  # env INFLUXDB_DATABASE, overridden
    transport = _transport(logger)
    assert "bucket=arg-bucket" in transport.url and "org=flat-org" in transport.url
    assert (transport.verify_tls, transport.connect_timeout, transport.read_timeout) == (False, 1, 10.0)
    logger.close(0)
    logger = MetricsLogger(tls=TLS(verify=True), self_metrics_interval=None)
    assert logger.settings.setting("verify_tls").source == "argument" and _transport(logger).verify_tls is True
    logger.close(0)


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"url": "http://a:8086", "connection": Connection(url="http://b:8086")}, ("url=", "Connection(url=")),
        ({"host": "a", "connection": Connection(host="a")}, ("host=", "Connection(host=")),
        ({"token": "t", "connection": Connection(token="t")}, ("token=", "Connection(token=")),
        ({"verify_tls": False, "tls": TLS(verify=True)}, ("verify_tls=", "TLS(verify=")),
        ({"ca_certs": "x.pem", "tls": TLS(ca_certs="y.pem")}, ("ca_certs=", "TLS(ca_certs=")),
        # a Timeouts always holds both timeouts: its defaults are values, not "not given"
        ({"read_timeout": 2, "timeouts": Timeouts(connect=1)}, ("read_timeout=", "Timeouts(read=")),
    ],
)
def test_a_setting_given_both_ways_is_refused_naming_both(clean_env: pytest.MonkeyPatch, kwargs, named) -> None:
    with pytest.raises(ConfigurationError) as raised:
        MetricsLogger(**kwargs)
    for name in named:
        assert name in str(raised.value)


def test_a_setting_given_both_ways_is_refused_by_the_loki_handler() -> None:
    with pytest.raises(ConfigurationError, match=r"read_timeout= and timeouts=Timeouts\(read=\.\.\.\)"):
        LokiHandler("http://127.0.0.1:3100", read_timeout=1, timeouts=Timeouts())
    with pytest.raises(ConfigurationError, match=r"verify_tls= and tls=TLS\(verify=\.\.\.\)"):
        LokiHandler("http://127.0.0.1:3100", verify_tls=False, tls=TLS(verify=True))


def test_the_loki_handler_takes_the_same_tls_and_timeouts() -> None:
    handler = LokiHandler("https://loki.example.org", tls=TLS(verify=False, ca_certs="ca.pem"), timeouts=Timeouts(2, 3))
    transport = handler.channel.sink.transport
    assert (transport.verify_tls, transport.ca_certs, transport.connect_timeout, transport.read_timeout) == (
        False,
        "ca.pem",
        2,
        3,
    )
    handler.close(0)
    handler = LokiHandler("https://loki.example.org")  # nothing given: verified, the default timeouts
    transport = handler.channel.sink.transport
    assert (transport.verify_tls, transport.connect_timeout, transport.read_timeout) == (True, 3.0, 10.0)
    handler.close(0)


def test_secrets_never_appear_in_a_repr() -> None:
    connection = Connection(
        url="https://admin:url-secret@influx.example.org:8086", token="tok-secret", password="pw-secret", username="u"
    )
    shown = repr(connection)
    for secret in ("url-secret", "tok-secret", "pw-secret"):
        assert secret not in shown and secret not in str(connection)
    assert "token=<hidden>" in shown and "password=<hidden>" in shown
    assert "influx.example.org:8086" in shown and "username='u'" in shown
    logger = MetricsLogger(connection=Connection(url="http://127.0.0.1:1", token="tok-secret"))
    assert "tok-secret" not in repr(logger) and "tok-secret" not in repr(logger.connection)
    logger.close(0)


def test_the_groups_are_frozen_and_check_their_values() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        Connection().url = "x"  # type: ignore[misc]
    with pytest.raises(ConfigurationError, match=r"Timeouts\.read"):
        Timeouts(read=0)
    with pytest.raises(ConfigurationError, match="connection= must be a Connection"):
        MetricsLogger(connection={"url": "http://127.0.0.1"})  # type: ignore[arg-type]


def test_an_unknown_keyword_is_still_a_type_error() -> None:
    with pytest.raises(TypeError, match="unexpected keyword argument 'verify'"):
        MetricsLogger(verify=False)  # type: ignore[call-arg]
