"""Settings resolution: where each value comes from, what is ignored and why, what raises."""

from __future__ import annotations

import pytest

from telemetry_client.config import exit_timeout_setting, handle_sigterm_setting, influxdb_config, loki_config
from telemetry_client.errors import ConfigurationError
from telemetry_client.loki import LokiHandler
from telemetry_client.metrics import MetricsLogger


def test_argument_beats_environment_and_the_loser_is_reported():
    env = {"INFLUXDB_URL": "https://env.example.org:8086", "INFLUXDB_TOKEN": "env-secret"}
    cfg = influxdb_config(url="https://arg.example.org:8086", environ=env)
    assert cfg.enabled and cfg.base_url == "https://arg.example.org:8086"
    assert cfg.setting("url").source == "argument"
    assert cfg.setting("token").source == "env INFLUXDB_TOKEN"
    assert cfg.setting("database").source == "default" and cfg.database == "telemetry"
    assert [(i.name, i.source) for i in cfg.ignored] == [("url", "env INFLUXDB_URL")]
    assert cfg.headers["Authorization"] == "Token env-secret"


def test_secrets_never_appear_in_repr_or_describe():
    env = {"INFLUXDB_HOST": "influx.example.org", "INFLUXDB_TOKEN": "s3cret-token"}
    cfg = influxdb_config(environ=env)
    assert "s3cret-token" not in repr(cfg) and "s3cret-token" not in "\n".join(cfg.describe())
    assert "token = (set, hidden)  (env INFLUXDB_TOKEN)" in cfg.describe()
    loki = loki_config(url="https://u:pw-secret@loki.example.org", environ={})
    assert loki.url == "https://loki.example.org" and loki.basic_auth == ("u", "pw-secret")
    assert "pw-secret" not in repr(loki) and "pw-secret" not in "\n".join(loki.describe())


def test_what_does_not_apply_is_listed_as_ignored_with_its_reason():
    env = {
        "INFLUXDB_URL": "http://127.0.0.1:8086",
        "INFLUXDB_HOST": "other",
        "INFLUXDB_API_VERSION": "1",
        "INFLUXDB_TOKEN": "t",
        "INFLUXDB_ORG": "o",
    }
    cfg = influxdb_config(environ=env)
    reasons = {i.name: i.reason for i in cfg.ignored}
    assert set(reasons) == {"host", "token", "org"}
    assert "URL" in reasons["host"] and "v1" in reasons["token"]
    assert cfg.write_url == "http://127.0.0.1:8086/write?db=telemetry&precision=n" and cfg.auth == "none"


def test_nothing_configured_is_off_with_the_variables_named():
    cfg = influxdb_config(environ={"INFLUXDB_TOKEN": "t"})
    assert not cfg.enabled and cfg.write_url is None
    assert "INFLUXDB_URL" in cfg.disabled_reason and "token set, but no server named" in cfg.disabled_reason
    loki = loki_config(environ={})
    assert not loki.enabled and "LOKI_URL" in loki.disabled_reason
    assert loki.environment == "unknown" and loki.setting("environment").source == "default"
    assert loki_config(environ={"TELEMETRY_ENVIRONMENT": "finney"}).environment == "finney"


@pytest.mark.parametrize(
    ("kwargs", "env", "match"),
    [
        ({}, {"INFLUXDB_URL": "influx:8086", "INFLUXDB_TOKEN": "t"}, "https://host:8086"),
        ({"host": "h"}, {"INFLUXDB_PORT": "eighty", "INFLUXDB_TOKEN": "t"}, "env INFLUXDB_PORT"),
        ({"host": "h"}, {}, "INFLUXDB_TOKEN"),
        ({"host": "h", "api_version": 1, "username": "u"}, {}, "both username and password"),
        ({}, {"INFLUXDB_API_VERSION": "3"}, "api_version"),
        ({"host": "h", "token": "t"}, {"INFLUXDB_USERNAME": "u", "INFLUXDB_PASSWORD": "p"}, "not both"),
        ({}, {"TELEMETRY_STRICT": "1"}, "strict"),
        ({}, {"INFLUXDB_VERIFY_TLS": "perhaps", "INFLUXDB_HOST": "h"}, "verify_tls"),
    ],
)
def test_present_but_wrong_settings_raise(kwargs, env, match):
    with pytest.raises(ConfigurationError, match=match):
        influxdb_config(environ=env, **kwargs)


def test_loki_present_but_wrong_raises():
    with pytest.raises(ConfigurationError, match="not both"):
        loki_config(url="https://loki.example.org", username="u", password="p", bearer_token="b", environ={})
    with pytest.raises(ConfigurationError, match="both username and password"):
        loki_config(environ={"LOKI_URL": "https://loki.example.org", "LOKI_USERNAME": "u"})
    with pytest.raises(ConfigurationError, match="LOKI_URL"):
        loki_config(strict=True, environ={})


def test_exit_timeout_source():
    assert exit_timeout_setting({}).source == "default"
    assert exit_timeout_setting({"TELEMETRY_EXIT_TIMEOUT": "1.5"}).value == 1.5
    ignored = exit_timeout_setting({"TELEMETRY_EXIT_TIMEOUT": "x"})
    assert "not a number" in ignored.source and ignored.value == 3.0
    assert ignored.problem == "env TELEMETRY_EXIT_TIMEOUT='x' is not a number"
    assert exit_timeout_setting({"TELEMETRY_EXIT_TIMEOUT": "5"}).problem == ""


def test_handle_sigterm_is_resolved_like_every_switch():
    assert (handle_sigterm_setting({}).value, handle_sigterm_setting({}).source) == (True, "default")
    assert handle_sigterm_setting({"TELEMETRY_HANDLE_SIGTERM": ""}).source == "default"
    off = handle_sigterm_setting({"TELEMETRY_HANDLE_SIGTERM": " Off "})
    assert (off.value, off.source) == (False, "env TELEMETRY_HANDLE_SIGTERM")
    assert handle_sigterm_setting({"TELEMETRY_HANDLE_SIGTERM": "yes"}).value is True
    with pytest.raises(ConfigurationError, match=r"TELEMETRY_HANDLE_SIGTERM.*1/0, true/false, yes/no, on/off.*'of'"):
        handle_sigterm_setting({"TELEMETRY_HANDLE_SIGTERM": "of"})


@pytest.mark.parametrize("build", ["metrics", "loki"])
def test_a_bad_handle_sigterm_stops_a_logger_at_construction(monkeypatch, build):
    """A typo must not silently leave SIGTERM handling on (as "of" once did)."""
    monkeypatch.setenv("TELEMETRY_HANDLE_SIGTERM", "of")
    with pytest.raises(ConfigurationError, match="TELEMETRY_HANDLE_SIGTERM"):
        if build == "metrics":
            MetricsLogger(url="http://127.0.0.1:9", api_version=1, self_metrics_interval=None)
        else:
            LokiHandler("http://127.0.0.1:9", {"service": "s"})


def test_explicitly_disabled_reads_and_checks_nothing():
    wrong = {"INFLUXDB_API_VERSION": "3", "TELEMETRY_STRICT": "maybe", "LOKI_URL": "not a url"}
    assert influxdb_config(enabled=False, environ=wrong).disabled_reason == "disabled by enabled=False"
    assert loki_config(enabled=False, environ={**wrong, "TELEMETRY_ENVIRONMENT": "finney"}).environment == "finney"
