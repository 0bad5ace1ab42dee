"""InfluxDB really running: tokens work as intended, and only as intended."""

import json
import time

API = "http://127.0.0.1:18086"
SECRETS = "/tmp/telemetry-molecule/influxdb/influxdb/secrets"


def _token(host, name):
    token_file = host.file(f"{SECRETS}/{name}")
    assert token_file.mode == 0o600
    assert token_file.user == "root"
    return token_file.content_string.strip()


def _curl(host, *args):
    return host.run("curl -sS -o /dev/stderr -w '%{http_code}' " + " ".join(args))


def test_container_runs(host):
    state = json.loads(host.check_output("docker inspect molecule-influxdb"))[0]["State"]
    assert state["Running"] is True


def test_health(host):
    assert json.loads(host.check_output(f"curl -fsS {API}/health"))["status"] == "pass"


def test_write_token_writes_and_read_token_reads(host):
    write = _token(host, "nodes/molecule-node-1.token")
    read = _token(host, "grafana-read.token")
    point = f"molecule_check,role=test value=1 {time.time_ns()}"
    result = _curl(
        host,
        "-X POST",
        f"-H 'Authorization: Token {write}'",
        f"--data-binary '{point}'",
        f"'{API}/api/v2/write?org=telemetry&bucket=telemetry&precision=ns'",
    )
    assert result.stdout == "204", result.stderr
    query = "SELECT last(value) FROM molecule_check"
    found = host.check_output(
        f"curl -fsS -G -H 'Authorization: Token {read}' --data-urlencode 'db=telemetry' "
        f"--data-urlencode 'q={query}' {API}/query"
    )
    assert json.loads(found)["results"][0]["series"][0]["values"][0][1] == 1


def test_read_token_cannot_write(host):
    read = _token(host, "grafana-read.token")
    result = _curl(
        host,
        "-X POST",
        f"-H 'Authorization: Token {read}'",
        "--data-binary 'x v=1'",
        f"'{API}/api/v2/write?org=telemetry&bucket=telemetry'",
    )
    assert result.stdout in {"401", "403", "404"}, result.stderr
