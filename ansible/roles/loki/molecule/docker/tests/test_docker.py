"""Loki really running with the rendered configuration."""

import json
import time

API = "http://127.0.0.1:13100"


def test_container_runs_as_loki(host):
    inspect = json.loads(host.check_output("docker inspect molecule-loki"))[0]
    assert inspect["State"]["Running"] is True
    assert inspect["Config"]["User"] == "10001:10001"


def test_ready(host):
    assert "ready" in host.check_output(f"curl -fsS {API}/ready")


def test_push_then_query(host):
    now = time.time_ns()
    body = json.dumps({"streams": [{"stream": {"service": "molecule"}, "values": [[str(now), "molecule check line"]]}]})
    status = host.check_output(
        f"curl -sS -o /dev/null -w '%{{http_code}}' -H 'Content-Type: application/json' "
        f"--data-raw '{body}' {API}/loki/api/v1/push"
    )
    assert status == "204"
    for _ in range(30):
        found = json.loads(
            host.check_output(
                f"curl -fsS -G --data-urlencode 'query={{service=\"molecule\"}}' "
                f"--data-urlencode 'start={now - 60_000_000_000}' {API}/loki/api/v1/query_range"
            )
        )
        if found["data"]["result"]:
            break
        time.sleep(1)
    assert found["data"]["result"][0]["values"][0][1] == "molecule check line"
