"""The doctor's checks of one server a node writes to: reachability, TLS, authorisation, clock, limits.

Nothing here stores data. Authorisation is proved with a write the server
authorises but stores nothing from, and what each server answers to it is
documented next to the code that reads the answer:

* InfluxDB 1.x `/write` with an empty body: 204 when the user may write to the
  database, 401 `unable to parse authentication credentials` without
  credentials, 401 `authorization failed` with a wrong password, 403 `"<user>"
  user is not authorized to write to database "<db>"` without the WRITE grant,
  404 `database not found: "<db>"` (measured on InfluxDB 1.6.7, tests/test_doctor.py).
* InfluxDB 2.x `/api/v2/write` with an empty body: the handler looks up the org
  and bucket (404 when missing), checks the token's write permission on the bucket
  (403 `insufficient permissions for write`), and only then reads the body and
  refuses it as empty (400 `writing requires points`); a missing or unknown token
  is refused by the authentication middleware first (401 `unauthorized access`).
  influxdata/influxdb v2 `http/write_handler.go` (handleWrite) and
  `http/authentication_middleware.go`.
* VictoriaMetrics `/api/v2/write` and `/write` with an empty body: 204, with the
  header `X-Influxdb-Version: 1.8.0` but no `X-Influxdb-Build` (which InfluxDB itself
  sends); it checks no token unless started with `-httpAuth.*` (measured on Debian's
  victoria-metrics). InfluxDB with auth off also answers 204 to anyone; so after a
  204 a second empty write with an unknown credential tells whether credentials
  are checked at all.
* Loki `POST /loki/api/v1/push` with `{"streams":[]}`: the distributor refuses a
  push without streams with 422 `error at least one valid stream is required for
  ingestion`, after the request has passed authentication (grafana/loki
  `pkg/distributor/distributor.go`, Push: `len(req.Streams) == 0` returns
  `http.StatusUnprocessableEntity, validation.MissingStreamsErrorMsg`); a gateway
  in front of it answers 401 before Loki sees anything, and Loki itself answers
  401 `no org id` when multi-tenancy is on and `X-Scope-OrgID` is missing.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import urllib.parse
from dataclasses import dataclass, field

from telemetry_client._doctor.net import Probe, probe, shown_url
from telemetry_client._doctor.report import Check, Status, fail, ok, warn

# Loki's limits_config defaults: grafana/loki pkg/validation/limits.go (RegisterFlags), Loki 3.x:
#   reject_old_samples true, reject_old_samples_max_age "7d", creation_grace_period "10m",
#   max_line_size "256KB", ingestion_rate_mb 4, ingestion_burst_size_mb 6,
#   per_stream_rate_limit 3MB (3 << 20), per_stream_rate_limit_burst 15MB,
#   allow_structured_metadata true.
LOKI_DEFAULT_LIMITS = {
    "reject_old_samples": "true",
    "reject_old_samples_max_age": "7d",
    "creation_grace_period": "10m",
    "max_line_size": "256KB",
    "ingestion_rate_mb": "4",
    "ingestion_burst_size_mb": "6",
    "per_stream_rate_limit": "3MB",
    "per_stream_rate_limit_burst": "15MB",
    "allow_structured_metadata": "true",
}
CERT_WARN_DAYS = 14
CLOCK_WARN_SECONDS = 30.0
CONFIG_MAX_BYTES = 4 * 1024 * 1024  # Loki's whole YAML configuration


@dataclass
class Endpoint:
    """Where a logger sends, as the logger itself resolved it, and which settings name each part."""

    service: str  # "InfluxDB" or "Loki"
    url: str  # the full write/push URL the logger posts to
    headers: dict[str, str] = field(default_factory=dict)  # credentials included: never printed
    verify: bool = True
    ca_certs: str | None = None
    api_version: int | None = None  # InfluxDB only
    database: str | None = None  # InfluxDB database / bucket
    org: str | None = None  # InfluxDB 2.x org
    url_setting: str = ""  # e.g. "INFLUXDB_URL (or INFLUXDB_HOST/INFLUXDB_PORT)"
    credential_setting: str = ""  # e.g. "INFLUXDB_TOKEN"
    verify_setting: str = ""  # e.g. "INFLUXDB_VERIFY_TLS"

    @property
    def base_url(self) -> str:
        parts = urllib.parse.urlsplit(self.url)
        path = parts.path
        for suffix in ("/loki/api/v1/push", "/api/v2/write", "/write"):
            if path.endswith(suffix):
                path = path[: -len(suffix)]
                break
        netloc = parts.netloc.rpartition("@")[2]  # never show user:password@
        return urllib.parse.urlunsplit((parts.scheme, netloc, path, "", ""))


# ---- one request, several verdicts ---------------------------------------------------


def authorisation_probe(endpoint: Endpoint, timeout: float = 5.0) -> Probe:
    """The write that stores nothing: an empty InfluxDB write, or a Loki push without streams."""
    headers = dict(endpoint.headers)
    if endpoint.service == "Loki":
        headers["Content-Type"] = "application/json"
        body = b'{"streams":[]}'
    else:
        headers["Content-Type"] = "text/plain; charset=utf-8"
        body = b""
    headers.pop("Content-Encoding", None)
    return probe(
        endpoint.url,
        method="POST",
        body=body,
        headers=headers,
        verify=endpoint.verify,
        ca_certs=endpoint.ca_certs,
        timeout=timeout,
    )


def _proxy_note() -> str:
    """The client connects directly; a proxy set in the environment (that other tools use) is not used."""
    names = [n for n in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy") if os.environ.get(n)]
    return f" {names[0]} is set, but the client does not use proxies: allow direct connections." if names else ""


def reachability(endpoint: Endpoint, result: Probe) -> Check:
    """DNS, TCP, TLS and HTTP: which step failed, and how long each took."""
    check = _reachability(endpoint, result)
    if check.status is Status.FAIL and result.failed_step in ("dns", "tcp"):
        check.fix += _proxy_note()
    return check


def _reachability(endpoint: Endpoint, result: Probe) -> Check:
    name = f"{endpoint.service} reachability"
    where = f"{result.host}:{result.port}"
    details = {"url": endpoint.base_url, "steps_ms": result.steps_ms, "addresses": result.addresses}
    if result.failed_step == "dns":
        return fail(
            name,
            f"the name {result.host!r} does not resolve ({result.error}).",
            f"Correct the host name in {endpoint.url_setting}, or fix this machine's DNS.",
            **details,
        )
    if result.failed_step == "tcp":
        refused = "refused" in (result.error or "")
        evidence = (
            f"nothing accepts connections on {where} ({result.error}; {result.describe_steps()})."
            if refused
            else f"no answer from {where} ({result.error}; {result.describe_steps()})."
        )
        fix = (
            f"Check the port in {endpoint.url_setting} and that the {endpoint.service} server is running."
            if refused
            else f"Check {endpoint.url_setting} and that no firewall drops traffic to {where}."
        )
        return fail(name, evidence, fix, **details)
    if result.failed_step == "tls":
        return fail(
            name, f"the TLS handshake with {where} failed: {result.error}.", _tls_fix(endpoint, result), **details
        )
    if result.failed_step == "http":
        return fail(
            name,
            f"{where} accepted the connection but gave no HTTP answer ({result.error}; {result.describe_steps()}).",
            f"Check that {endpoint.url_setting} points at the {endpoint.service} HTTP port, not another service.",
            **details,
        )
    return ok(name, f"{endpoint.base_url} answered HTTP {result.status} ({result.describe_steps()}).", **details)


def _tls_fix(endpoint: Endpoint, result: Probe) -> str:
    tls = result.tls
    error = (result.error or "").lower()
    if "wrong version number" in error or "record layer failure" in error or "packet length too long" in error:
        return f"The server speaks plain HTTP on that port: use http:// in {endpoint.url_setting}, or its TLS port."
    if tls is None:
        return f"Check the server's TLS setup and the scheme in {endpoint.url_setting}."
    reason = (tls.error or "").lower()
    if "expired" in reason:
        when = tls.not_after.strftime("%Y-%m-%d %H:%M UTC") if tls.not_after else "an unknown date"
        return (
            f"The server's certificate expired on {when}: its operator must renew it "
            f"(do not turn {endpoint.verify_setting} off)."
        )
    if "hostname mismatch" in reason or "ip address mismatch" in reason:
        names = ", ".join(tls.names) or "other names"
        return f"The certificate is for {names}: set {endpoint.url_setting} to one of those names."
    if "self-signed" in reason or "local issuer" in reason or "unknown ca" in reason:
        return (
            f"No CA in {tls.trust} vouches for this certificate: pass the server's CA file as ca_certs= "
            f"or in SSL_CERT_FILE (do not turn {endpoint.verify_setting} off)."
        )
    return f"Fix the server's certificate, or trust its CA with ca_certs= / SSL_CERT_FILE ({tls.error})."


def tls_check(endpoint: Endpoint, result: Probe, now: dt.datetime | None = None) -> Check | None:
    """The CA in use, the certificate's names and how long it stays valid (None for plain HTTP)."""
    tls = result.tls
    if tls is None:
        return None
    name = f"{endpoint.service} TLS"
    details = {
        "trust": tls.trust,
        "verified": tls.verified,
        "names": tls.names,
        "issuer": tls.issuer,
        "not_after": tls.not_after.isoformat() if tls.not_after else None,
        "version": tls.version,
    }
    names = ", ".join(tls.names) or "no names read"
    expiry = tls.not_after.strftime("%Y-%m-%d") if tls.not_after else "unknown expiry"
    if result.failed_step == "tls":
        return fail(
            name,
            f"certificate for {names} (issuer {tls.issuer}, valid until {expiry}) refused: "
            f"{tls.error}; trust: {tls.trust}.",
            _tls_fix(endpoint, result),
            **details,
        )
    if not tls.verified:
        return warn(
            name,
            f"certificate for {names} (valid until {expiry}) is not verified: TLS verification is off.",
            f"Remove {endpoint.verify_setting}=false and trust the server's CA with ca_certs= or SSL_CERT_FILE.",
            **details,
        )
    days = tls.days_left(now)
    if days is not None and days < CERT_WARN_DAYS:
        return warn(
            name,
            f"certificate for {names} expires in {days:.0f} days ({expiry}); trusted through {tls.trust}.",
            "Ask the server's operator to renew the certificate before it expires.",
            **details,
        )
    return ok(
        name, f"{tls.version}, certificate for {names} valid until {expiry}, trusted through {tls.trust}.", **details
    )


def _influx_error(result: Probe) -> str:
    """InfluxDB's error text: 1.x `{"error": ...}`, 2.x `{"code":..., "message": ...}`, or the raw body."""
    try:
        payload = json.loads(result.body or b"null")
    except ValueError:
        return result.text()
    if isinstance(payload, dict):
        return str(payload.get("error") or payload.get("message") or payload)
    return result.text()


def _server_name(result: Probe) -> str:
    """InfluxDB itself sends X-Influxdb-Build (OSS, ...); VictoriaMetrics sends only X-Influxdb-Version: 1.8.0."""
    version = result.headers.get("x-influxdb-version")
    if result.headers.get("x-influxdb-build"):
        return f"InfluxDB {version}"
    return f"the server (answering as InfluxDB {version})" if version else "the server"


def credential_refused(status: int | None, body: bytes | None) -> bool:
    """A server's answer that refuses the credential: 401 or 403, or vmauth's 400.

    vmauth in front of VictoriaMetrics refuses an unknown token with 401
    "Unauthorized" (VictoriaMetrics app/vmauth/main.go, requestHandler, tag v1.136.0),
    or up to 1.79 with 400 "cannot find the provided auth token" (the same file, tag
    v1.79.5).
    """
    return status in (401, 403) or (status == 400 and b"cannot find the provided auth token" in (body or b""))


def influx_authorisation(endpoint: Endpoint, result: Probe, timeout: float = 5.0) -> Check | None:
    """Read InfluxDB's answer to an empty write (see the module docstring for each server's answers).

    A 204 does not prove the credentials were checked (a server with auth off, or
    VictoriaMetrics, accepts anything), so a second empty write with a credential
    nobody holds tells whether this server checks at all.
    """
    if not result.answered:
        return None
    name = "InfluxDB authorisation"
    status = result.status
    message = _influx_error(result)
    version = result.headers.get("x-influxdb-version")
    server = _server_name(result)
    target = (
        f"database {endpoint.database!r} (API v1, /write)"
        if endpoint.api_version == 1
        else f"bucket {endpoint.database!r} (API v2, /api/v2/write)"
    )
    details = {"status": status, "server_version": version, "api_version": endpoint.api_version, "answer": message}
    if endpoint.api_version == 2 and status == 400 and "writing requires points" in message:
        return ok(
            name,
            f"{server} checked the token and allows writing to {target} (400 'writing requires "
            "points' to an empty write; nothing stored).",
            **details,
        )
    if status == 204:
        bogus = "Token not-a-real-token" if endpoint.api_version == 2 else "Basic bm90LWEtdXNlcjpub3QtYS1wYXNzd29yZA=="
        control = authorisation_probe(Endpoint(**{**endpoint.__dict__, "headers": {"Authorization": bogus}}), timeout)
        details["unknown_credential_status"] = control.status
        if credential_refused(control.status, control.body):
            return ok(
                name,
                f"{server} checked these credentials and allows them to write to {target} (204 to an empty "
                f"write, {control.status} to the same with an unknown credential; nothing stored).",
                **details,
            )
        return ok(
            name,
            f"{server} accepts writes to {target} (204 to an empty write; nothing stored) but checks no "
            f"credentials: an unknown one got {control.status or control.error} too.",
            **details,
        )
    if status == 401:
        missing = "unable to parse authentication credentials" in message or not endpoint.headers.get("Authorization")
        what = "no credentials were sent" if missing else "the credentials were refused"
        return fail(
            name,
            f"{server} answered 401 ({message!r}): {what}.",
            f"Set {endpoint.credential_setting} to a valid credential for {target}.",
            **details,
        )
    if status == 403:
        return fail(
            name,
            f"{server} answered 403 ({message!r}): the credentials are valid but may not write to {target}.",
            f"Give {endpoint.credential_setting} write access to {target}, or point INFLUXDB_DATABASE "
            "at one it may write to.",
            **details,
        )
    if status == 404:
        if "page not found" in message and endpoint.api_version == 2:
            return fail(
                name,
                f"{server} has no /api/v2/write (404): it is an InfluxDB 1.x older than 1.8.",
                "Set INFLUXDB_API_VERSION=1 with INFLUXDB_USERNAME/INFLUXDB_PASSWORD.",
                **details,
            )
        setting = "INFLUXDB_ORG" if "organization" in message.lower() else "INFLUXDB_DATABASE"
        return fail(
            name, f"{server} answered 404 ({message!r}).", f"Correct {setting} (or create it on the server).", **details
        )
    if status is not None and status >= 500:
        return fail(
            name,
            f"{server} answered {status} ({message!r}): the server is failing.",
            "Nothing to change on this node: tell the server's operator (the client retries meanwhile).",
            **details,
        )
    return fail(
        name,
        f"{server} answered {status} to an empty write ({message!r}).",
        f"Check that {endpoint.url_setting} points at InfluxDB and INFLUXDB_API_VERSION matches the server.",
        **details,
    )


def loki_authorisation(endpoint: Endpoint, result: Probe) -> Check | None:
    """Read Loki's answer to a push without streams (see the module docstring)."""
    if not result.answered:
        return None
    name = "Loki authorisation"
    status = result.status
    message = result.text()
    details = {"status": status, "answer": message}
    if status == 422 and "at least one valid stream" in message:
        return ok(
            name, "Loki accepted the credentials and refused the empty push as empty (422; nothing stored).", **details
        )
    if status == 204:
        return ok(name, "the push endpoint accepted an empty push (204; nothing stored).", **details)
    if status == 401 and "org id" in message:
        return fail(
            name,
            f"Loki answered 401 ({message!r}): it runs multi-tenant and needs a tenant.",
            "Set LOKI_TENANT_ID to your tenant (sent as X-Scope-OrgID).",
            **details,
        )
    if status == 401:
        missing = not endpoint.headers.get("Authorization")
        what = "no credentials were sent" if missing else "the credentials were refused"
        return fail(
            name,
            f"the Loki endpoint answered 401 ({message!r}): {what}.",
            f"Set {endpoint.credential_setting}.",
            **details,
        )
    if status == 403:
        return fail(
            name,
            f"the Loki endpoint answered 403 ({message!r}): these credentials may not push.",
            f"Use credentials allowed to push in {endpoint.credential_setting}.",
            **details,
        )
    if status == 404:
        return fail(
            name,
            f"{shown_url(endpoint.url)} answered 404: no Loki push endpoint there.",
            f"Set {endpoint.url_setting} to Loki's base URL (e.g. https://loki.example.org:3100).",
            **details,
        )
    if status is not None and status >= 500:
        return fail(
            name,
            f"Loki answered {status} ({message!r}): the server is failing.",
            "Nothing to change on this node: tell the server's operator (the client retries meanwhile).",
            **details,
        )
    return fail(
        name,
        f"the Loki endpoint answered {status} to an empty push ({message!r}).",
        f"Check that {endpoint.url_setting} points at Loki.",
        **details,
    )


# ---- clock ---------------------------------------------------------------------------


def parse_duration(text: str) -> float | None:
    """A Prometheus/Go duration ("7d", "168h", "10m", "1h30m", "30s") in seconds."""
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31_536_000}
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w|y)", text.strip())
    if not parts or "".join(n + u for n, u in parts) != text.strip():
        return None
    return sum(float(n) * units[u] for n, u in parts)


def _span(seconds: float) -> str:
    seconds = abs(seconds)
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    if seconds < 2 * 86400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} days"


def clock_check(endpoint: Endpoint, result: Probe, limits: dict[str, str] | None = None) -> Check | None:
    """This machine's clock against the server's `Date`, and what the difference costs.

    Points and lines are stamped with the node's clock. Loki refuses an entry more
    than `creation_grace_period` in the future of its own clock, and (with
    `reject_old_samples`) one older than `reject_old_samples_max_age`; InfluxDB
    stores any time, but a point stamped off is drawn off on every dashboard.
    """
    skew = result.clock_skew()
    if skew is None:
        return None
    name = f"{endpoint.service} clock"
    node_ahead = -skew  # positive: this machine's clock is ahead of the server's
    details = {"server_minus_node_seconds": round(skew, 1), "server_date": result.headers.get("date")}
    relation = "ahead of" if node_ahead > 0 else "behind"
    said = (
        f"this machine's clock is {_span(node_ahead)} {relation} the server's "
        f"(Date: {result.headers.get('date')}; ±1 s)"
    )
    fix = "Synchronise this machine's clock (e.g. enable NTP: timedatectl set-ntp true)."
    if endpoint.service == "Loki":
        limits = limits or LOKI_DEFAULT_LIMITS
        grace = parse_duration(limits.get("creation_grace_period", "10m")) or 600
        reject_old = str(limits.get("reject_old_samples", "true")).lower() == "true"
        max_age = parse_duration(limits.get("reject_old_samples_max_age", "7d")) or 7 * 86400
        details.update(creation_grace_period_s=grace, reject_old_samples_max_age_s=max_age if reject_old else None)
        if node_ahead > grace:
            return fail(
                name,
                f"{said}: Loki refuses every line as 'timestamp too new' (creation_grace_period {_span(grace)}).",
                fix,
                **details,
            )
        if reject_old and -node_ahead > max_age:
            return fail(
                name,
                f"{said}: Loki refuses every line as 'timestamp too old' (reject_old_samples_max_age "
                f"{_span(max_age)}).",
                fix,
                **details,
            )
        if abs(node_ahead) > CLOCK_WARN_SECONDS:
            margin = grace - node_ahead if node_ahead > 0 else (max_age + node_ahead if reject_old else None)
            left = f"{_span(margin)} short of being refused" if margin is not None else "within Loki's limits"
            return warn(name, f"{said}: lines are stored but shown at the wrong time ({left}).", fix, **details)
        return ok(name, f"{said}; Loki accepts lines up to {_span(grace)} ahead.", **details)
    if abs(node_ahead) > CLOCK_WARN_SECONDS:
        return warn(
            name,
            f"{said}: points are stored, but drawn {_span(node_ahead)} off on every dashboard.",
            fix,
            **details,
        )
    return ok(name, f"{said}.", **details)


# ---- limits --------------------------------------------------------------------------

# Loki parses byte sizes with github.com/c2h5oh/datasize after upper-casing them (grafana/loki
# pkg/util/flagext/bytesize.go, ByteSize.Set): units are powers of 1024, so "256KB" is 262,144 bytes,
# and /config shows them the same way (ByteSize.MarshalYAML prints datasize's String(), e.g. "256KB").
_BYTE_UNITS = {"": 1, "B": 1, "K": 1024, "KB": 1024, "M": 1024**2, "MB": 1024**2, "G": 1024**3, "GB": 1024**3}


def parse_bytes(text: str) -> int | None:
    """A Loki byte size ("256KB", "3MB", "262144") in bytes."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", str(text))
    unit = match.group(2).upper().replace("IB", "B") if match else ""
    if not match or unit not in _BYTE_UNITS:
        return None
    return int(float(match.group(1)) * _BYTE_UNITS[unit])


def limits_from_config(yaml_text: str) -> dict[str, str]:
    """The `limits_config` keys the doctor compares, from the YAML Loki shows at `GET /config`."""
    found: dict[str, str] = {}
    inside = False
    for line in yaml_text.splitlines():
        if re.match(r"^limits_config:\s*$", line):
            inside = True
            continue
        if inside and line and not line[0].isspace():
            break
        match = re.match(r"^\s{2}([a-z_]+):\s*(.*?)\s*$", line) if inside else None
        if match and match.group(1) in LOKI_DEFAULT_LIMITS:
            found[match.group(1)] = match.group(2).strip("'\"")
    return found


def loki_limits(
    endpoint: Endpoint, node_max_line_bytes: int, node_batch_bytes: int, timeout: float = 5.0
) -> tuple[Check, dict[str, str]]:
    """Loki's line size, age and rate limits (its `GET /config` when reachable, else the defaults) against this node.

    `/config` is documented in Loki's HTTP API reference ("displays the configuration
    currently applied"); a gateway often hides it, and then the documented defaults apply.
    """
    name = "Loki limits"
    result = probe(
        endpoint.base_url + "/config",
        headers={k: v for k, v in endpoint.headers.items() if k in ("Authorization", "X-Scope-OrgID")},
        verify=endpoint.verify,
        ca_certs=endpoint.ca_certs,
        timeout=timeout,
        max_body=CONFIG_MAX_BYTES,
    )
    served = limits_from_config(result.body.decode("utf-8", "replace")) if result.status == 200 else {}
    limits = {**LOKI_DEFAULT_LIMITS, **served}
    source = "the server's /config" if served else "Loki's documented defaults (the server does not show /config)"
    details = {"source": "server" if served else "defaults", "limits": limits}
    max_line = parse_bytes(limits["max_line_size"]) or 0
    burst = parse_bytes(f"{limits['ingestion_burst_size_mb']}MB") or 0
    # A push holds one stream (the handler's level), so a batch must also fit the stream's burst.
    stream_burst = parse_bytes(limits["per_stream_rate_limit_burst"]) or 0
    metadata = limits["allow_structured_metadata"].lower() != "false"
    summary = (
        f"from {source}: max_line_size {limits['max_line_size']}, ingestion_rate_mb {limits['ingestion_rate_mb']} "
        f"(burst {limits['ingestion_burst_size_mb']}) per tenant, per_stream_rate_limit "
        f"{limits['per_stream_rate_limit']} (burst {limits['per_stream_rate_limit_burst']}), structured metadata "
        + ("allowed" if metadata else "disallowed: a handler with structured_metadata=True sends its lines again "
           "without it (counted metadata_removed)")
    )  # fmt: skip
    if max_line and node_max_line_bytes > max_line:
        return (
            warn(
                name,
                f"{summary}; this node cuts lines at {node_max_line_bytes} bytes, so lines between "
                f"{max_line} and {node_max_line_bytes} bytes are refused whole.",
                f"Pass max_line_bytes={max_line} to setup_loki_logger/LokiHandler.",
                **details,
            ),
            limits,
        )
    tightest = min((b for b in (burst, stream_burst) if b), default=0)
    if tightest and node_batch_bytes > tightest:
        which = "the tenant's burst" if tightest == burst else "the stream's burst (per_stream_rate_limit_burst)"
        return (
            warn(
                name,
                f"{summary}; this node sends batches up to {node_batch_bytes} bytes, above {which}, "
                "so a full batch is refused and sent again in halves.",
                f"Lower BufferSettings(batch_bytes=...) below {tightest} bytes.",
                **details,
            ),
            limits,
        )
    return (
        ok(
            name,
            f"{summary}; this node cuts lines at {node_max_line_bytes} bytes and batches up to "
            f"{node_batch_bytes} bytes.",
            **details,
        ),
        limits,
    )
