"""`python -m telemetry_client doctor`: is this node's telemetry working, and if not, what exactly to change.

It reads the configuration the loggers read, through `telemetry_client.config`
(the same environment variables, nothing else), then checks each destination
without storing anything (see `_doctor.server`), and this machine (`_doctor.local`).
`--send-test` sends one point and one line through the real client and reads
them back; `--stack` also checks the local stack (`_doctor.stack`, `make doctor`).

Exit code: 0 every check OK, 1 the worst is a warning, 2 something failed.
"""

from __future__ import annotations

import argparse
import base64
import os
import re
import sys
import urllib.parse
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from telemetry_client import config as client_config
from telemetry_client._doctor.local import gpu_metrics, host_metrics, wandb_check, wandb_endpoint
from telemetry_client._doctor.net import probe
from telemetry_client._doctor.report import (
    Check,
    Status,
    describe_secret,
    exit_code,
    fail,
    ok,
    render_json,
    render_text,
    warn,
)
from telemetry_client._doctor.server import (
    Endpoint,
    authorisation_probe,
    clock_check,
    influx_authorisation,
    loki_authorisation,
    loki_limits,
    reachability,
    tls_check,
)
from telemetry_client._doctor.stack import StackSettings, basic_headers, stack_checks, token_headers
from telemetry_client._engine.shipping import BufferSettings
from telemetry_client._loki.limits import DEFAULT_MAX_LINE_BYTES
from telemetry_client.errors import ConfigurationError
from telemetry_client.loki import push_url

LOOPBACK = frozenset({"localhost", "127.0.0.1", "::1"})
_ENV_NAME = re.compile(r"\b(?:INFLUXDB|LOKI|TELEMETRY)_[A-Z_]+\b")


@dataclass
class NodeConfig:
    """What the loggers would use, and the configuration verdicts."""

    checks: list[Check]
    influxdb: client_config.InfluxDBConfig | None
    loki: client_config.LokiConfig | None


# ---- configuration ------------------------------------------------------------------


def _shown(setting: client_config.Setting) -> str:
    if setting.secret:
        return describe_secret(None if setting.value is None else str(setting.value))
    return setting.shown


def _settings_text(resolved: client_config.InfluxDBConfig | client_config.LokiConfig) -> str:
    parts = [f"{s.name}={_shown(s)} ({s.source})" for s in resolved.settings if s.source != client_config.UNSET]
    return "; ".join(parts) or "nothing set"


def _env_of(source: str) -> str:
    return source.removeprefix("env ") if source.startswith("env ") else source


def _configuration_check(name: str, resolve: Callable[[], Any], hint: str) -> tuple[list[Check], Any]:
    """One destination's settings: refused, off, or on (with where each came from and what was ignored)."""
    try:
        resolved = resolve()
    except ConfigurationError as exc:
        names = sorted(set(_ENV_NAME.findall(str(exc)))) or [hint]
        return [
            fail(
                name,
                f"the logger would refuse to start: {exc}",
                f"Correct {', '.join(names)} (the logger raises this same error at construction).",
            )
        ], None
    details = {s.name: {"value": _shown(s), "source": s.source} for s in resolved.settings}
    if not resolved.enabled:
        return [warn(name, f"off: {resolved.disabled_reason}.", f"To send, {hint}.", settings=details)], resolved
    checks = [ok(name, f"on: {_settings_text(resolved)}.", settings=details)]
    if resolved.ignored:
        envs = sorted({_env_of(i.source) for i in resolved.ignored})
        said = "; ".join(f"{_env_of(i.source)} ({i.reason})" for i in resolved.ignored)
        checks.append(
            warn(
                f"{name}: ignored settings",
                f"set but not used: {said}.",
                f"Unset {', '.join(envs)}, or change what makes it unused.",
                ignored=[{"name": i.name, "source": i.source, "reason": i.reason} for i in resolved.ignored],
            )
        )
    return checks, resolved


def process_check(environ: dict[str, str] | None = None) -> Check:
    """The settings of the process's end: the exit deadline and the draining SIGTERM handler."""
    name = "Process configuration"
    try:
        sigterm = client_config.handle_sigterm_setting(environ)
    except ConfigurationError as exc:
        fix = f"Set {client_config.ENV_HANDLE_SIGTERM} to 1 or 0 (or unset it: on by default)."
        return fail(name, f"the logger would refuse to start: {exc}", fix)
    timeout = client_config.exit_timeout_setting(environ)
    settings = (timeout, sigterm)
    details = {s.name: {"value": s.value, "source": s.source} for s in settings}
    text = "; ".join(f"{s.name}={s.value} ({s.source})" for s in settings)
    if timeout.problem:
        default = client_config.DEFAULT_EXIT_TIMEOUT
        fix = f"Set {client_config.ENV_EXIT_TIMEOUT} to a number of seconds (default {default:g})."
        return warn(name, f"{text}.", fix, settings=details)
    return ok(name, f"{text}.", settings=details)


def configuration(environ: dict[str, str] | None = None) -> NodeConfig:
    """Resolve InfluxDB and Loki exactly as `MetricsLogger` and `setup_loki_logger` do."""
    influx_checks, influx = _configuration_check(
        "InfluxDB configuration",
        lambda: client_config.influxdb_config(environ=environ),
        "set INFLUXDB_URL and INFLUXDB_TOKEN",
    )
    loki_checks, loki = _configuration_check(
        "Loki configuration", lambda: client_config.loki_config(environ=environ), "set LOKI_URL"
    )
    checks = [*influx_checks, *loki_checks, process_check(environ)]
    for label, url, has_auth, setting in (
        ("InfluxDB", getattr(influx, "base_url", None), getattr(influx, "auth", "none") != "none", "INFLUXDB_URL"),
        ("Loki", getattr(loki, "url", None), getattr(loki, "auth", "none") != "none", "LOKI_URL"),
    ):
        parsed = urllib.parse.urlsplit(url or "")
        if url and has_auth and parsed.scheme == "http" and parsed.hostname not in LOOPBACK:
            checks.append(
                warn(
                    f"{label} encryption",
                    f"credentials travel unencrypted to {parsed.hostname} (http://).",
                    f"Use https:// in {setting}.",
                )
            )
    if influx is not None and "@" in urllib.parse.urlsplit(getattr(influx, "base_url", None) or "").netloc:
        checks.append(
            warn(
                "InfluxDB credentials in the URL",
                "INFLUXDB_URL carries user:password@, which the client does not send.",
                "Move them to INFLUXDB_USERNAME/INFLUXDB_PASSWORD (API v1), or use INFLUXDB_TOKEN (API v2).",
            )
        )
    if influx is not None and getattr(influx, "enabled", False) and not influx.verify_tls:
        checks.append(
            warn(
                "InfluxDB encryption",
                "INFLUXDB_VERIFY_TLS turns certificate verification off: anyone on the path can read the token.",
                "Remove INFLUXDB_VERIFY_TLS and trust the server's CA with SSL_CERT_FILE.",
            )
        )
    return NodeConfig(
        checks,
        influx if influx is not None and influx.enabled else None,
        loki if loki is not None and loki.enabled else None,
    )


def influx_endpoint(resolved: client_config.InfluxDBConfig) -> Endpoint:
    url_from_env = resolved.setting("url").source != client_config.UNSET
    return Endpoint(
        "InfluxDB",
        str(resolved.write_url),
        {k: v for k, v in resolved.headers.items() if k == "Authorization"},
        verify=resolved.verify_tls,
        api_version=resolved.api_version,
        database=resolved.database,
        org=resolved.org,
        url_setting="INFLUXDB_URL" if url_from_env else "INFLUXDB_HOST/INFLUXDB_PORT",
        credential_setting="INFLUXDB_TOKEN" if resolved.api_version == 2 else "INFLUXDB_USERNAME/INFLUXDB_PASSWORD",
        verify_setting="INFLUXDB_VERIFY_TLS",
    )


def loki_headers(resolved: client_config.LokiConfig) -> dict[str, str]:
    """The headers `LokiHandler` sends for these credentials."""
    headers = {}
    if resolved.basic_auth:
        user, password = resolved.basic_auth
        headers["Authorization"] = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
    elif resolved.bearer_token:
        headers["Authorization"] = f"Bearer {resolved.bearer_token}"
    if resolved.tenant_id:
        headers["X-Scope-OrgID"] = str(resolved.tenant_id)
    return headers


def loki_endpoint(resolved: client_config.LokiConfig) -> Endpoint:
    return Endpoint(
        "Loki",
        push_url(str(resolved.url)),
        loki_headers(resolved),
        url_setting="LOKI_URL",
        credential_setting="LOKI_USERNAME/LOKI_PASSWORD or LOKI_BEARER_TOKEN",
        verify_setting="verify_tls (setup_loki_logger)",
    )


# ---- the checks ------------------------------------------------------------------------


def server_checks(endpoint: Endpoint, timeout: float) -> list[Check]:
    """Reachability, TLS, authorisation, limits and clock of one destination, from one request that stores nothing."""
    result = authorisation_probe(endpoint, timeout)
    loki = endpoint.service == "Loki"
    auth = loki_authorisation(endpoint, result) if loki else influx_authorisation(endpoint, result)
    checks = [check for check in (reachability(endpoint, result), tls_check(endpoint, result), auth) if check]
    limits = None
    if loki and result.answered:
        limit_check, limits = loki_limits(endpoint, DEFAULT_MAX_LINE_BYTES, BufferSettings().batch_bytes, timeout)
        checks.append(limit_check)
    clock = clock_check(endpoint, result, limits)
    if clock is not None:
        checks.append(clock)
    return checks


def send_test(args: argparse.Namespace, node: NodeConfig) -> list[Check]:
    """One point and one line through the real client, then read back if read credentials are given."""
    from telemetry_client._doctor import roundtrip as trip
    from telemetry_client.loki import LokiHandler
    from telemetry_client.metrics import MetricsLogger

    run_id = trip.new_run_id()
    checks = []
    if node.influxdb is not None:
        sent = trip.send_point(
            lambda: MetricsLogger(uid="doctor", role="doctor", self_metrics_interval=None), run_id, args.timeout
        )
        checks.append(sent)
        read_headers = {}
        if args.read_token:
            read_headers = {"Authorization": f"Token {args.read_token}"}
        elif args.read_username and args.read_password:
            credentials = base64.b64encode(f"{args.read_username}:{args.read_password}".encode()).decode()
            read_headers = {"Authorization": f"Basic {credentials}"}
        if sent.status.name == "OK" and read_headers:
            access = trip.ReadAccess(read_headers)
            checks.append(trip.read_point(influx_endpoint(node.influxdb), access, run_id, args.timeout))
    if node.loki is not None:
        loki = node.loki
        sent = trip.send_line(
            lambda: LokiHandler(
                str(loki.url),
                {"service": trip.TEST_SERVICE, "environment": loki.environment},
                loki.basic_auth,
                bearer_token=loki.bearer_token,
                tenant_id=loki.tenant_id,
            ),
            run_id,
            args.timeout,
        )
        checks.append(sent)
        if sent.status.name == "OK" and args.loki_read_url:
            access = trip.ReadAccess({}, args.loki_read_url, loki_headers(loki))
            checks.append(trip.read_line(access, run_id, args.timeout, True, None))
    if not checks:
        checks.append(
            fail(
                "Test round trip",
                "nothing to send: neither InfluxDB nor Loki is configured.",
                "Set INFLUXDB_URL or LOKI_URL.",
            )
        )
    return checks


def stack_settings(node: NodeConfig, args: argparse.Namespace) -> StackSettings:
    """The local stack's addresses and credentials: the node's own settings plus Grafana's (`make doctor`)."""
    settings = StackSettings(timeout=args.timeout)
    if os.environ.get("METRICS_BACKEND") == "victoriametrics":  # make doctor passes the stack's backend
        settings.metrics_backend = "victoriametrics"
    if node.influxdb is not None:
        settings.influxdb_url = str(node.influxdb.base_url)
        settings.database = node.influxdb.database
        settings.org = node.influxdb.org or settings.org
        settings.api_version = node.influxdb.api_version
        settings.node_headers = {k: v for k, v in node.influxdb.headers.items() if k == "Authorization"}
    if node.loki is not None:
        settings.loki_url = str(node.loki.url).rstrip("/")
    settings.grafana_url = args.grafana_url.rstrip("/")
    settings.read_headers = token_headers(os.environ.get("INFLUXDB_READ_TOKEN"))
    settings.grafana_headers = basic_headers(os.environ.get("GRAFANA_USER"), os.environ.get("GRAFANA_PASSWORD"))
    return settings


def run(args: argparse.Namespace) -> list[Check]:
    node = configuration()
    checks = list(node.checks)
    if node.influxdb is not None:
        checks += server_checks(influx_endpoint(node.influxdb), args.timeout)
    if node.loki is not None:
        checks += server_checks(loki_endpoint(node.loki), args.timeout)
    checks += [host_metrics(), gpu_metrics(), wandb_check()]
    wandb_server = wandb_endpoint()
    if wandb_server is not None:  # any HTTP answer from W&B's API server means runs can go online
        result = probe(wandb_server.url, timeout=args.timeout)
        for check in (reachability(wandb_server, result), tls_check(wandb_server, result)):
            if check is not None and check.status is Status.FAIL:  # initialize_wandb goes offline: late, not lost
                check.status = Status.WARN
                check.evidence += " Runs will fall back to offline (upload them later with `wandb sync`)."
            if check is not None:
                checks.append(check)
    if args.send_test:
        checks += send_test(args, node)
    if args.stack:
        checks += stack_checks(stack_settings(node, args))
    return checks


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m telemetry_client doctor",
        description="Check this node's telemetry configuration, servers and machine; print what to change.",
        epilog="Exit code: 0 all OK, 1 a warning, 2 a failure. Nothing is stored unless --send-test.",
    )
    parser.add_argument("--json", action="store_true", help="print the verdicts as JSON")
    parser.add_argument("--timeout", type=float, default=5.0, help="seconds per network step (default 5)")
    parser.add_argument(
        "--send-test", action="store_true", help="send one test point and one test line (stored!), then read back"
    )
    parser.add_argument("--read-token", help="an InfluxDB token that may read, for the read-back")
    parser.add_argument("--read-username", help="an InfluxDB 1.x user that may read, for the read-back")
    parser.add_argument("--read-password", help="that user's password")
    parser.add_argument(
        "--loki-read-url", help="Loki's query API base URL, for the read-back (node's Loki credentials)"
    )
    parser.add_argument("--stack", action="store_true", help="also check the local stack (make doctor)")
    parser.add_argument(
        "--grafana-url", default=os.environ.get("GRAFANA_URL", "http://127.0.0.1:3000"), help="Grafana (--stack)"
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    checks = run(args)
    (render_json if args.json else render_text)(checks, sys.stdout)
    return exit_code(checks)
