"""The Logs panels' line count fits the query path's gRPC message limits, in compose and in Ansible.

A log query's answer travels as one gRPC message from the ingesters to the querier
and from the querier to the query frontend; a message over the limit fails the
panel with "trying to send message larger than max". The largest answer is the
panel's line count times the largest line Loki accepts (`max_line_size`), plus
framing (timestamps, stream labels, protobuf tags), taken here as 25%.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
FRAMING = 1.25
UNITS = {"": 1, "B": 1, "KB": 1 << 10, "MB": 1 << 20, "GB": 1 << 30}


def size(text: str | int) -> int:
    """A Loki flagext.ByteSize value ("256KB" is 256 KiB) or a plain number of bytes."""
    m = re.fullmatch(r"(\d+)\s*([KMG]?B)?", str(text).strip(), re.IGNORECASE)
    assert m, text
    return int(m.group(1)) * UNITS[(m.group(2) or "").upper()]


def panel_lines() -> list[int]:
    dashboard = json.loads((REPO / "grafana/dashboards/logs.json").read_text())
    panels = [p for p in dashboard["panels"] if p.get("type") == "logs"]
    assert panels
    return [target["maxLines"] for panel in panels for target in panel["targets"]]


def query_path_limits(config: dict) -> dict[str, int]:
    return {
        "server.grpc_server_max_send_msg_size": config["server"]["grpc_server_max_send_msg_size"],
        "server.grpc_server_max_recv_msg_size": config["server"]["grpc_server_max_recv_msg_size"],
        "frontend_worker.grpc_client_config.max_recv_msg_size": config["frontend_worker"]["grpc_client_config"][
            "max_recv_msg_size"
        ],
        "frontend_worker.grpc_client_config.max_send_msg_size": config["frontend_worker"]["grpc_client_config"][
            "max_send_msg_size"
        ],
        "ingester_client.grpc_client_config.max_recv_msg_size": config["ingester_client"]["grpc_client_config"][
            "max_recv_msg_size"
        ],
    }


def test_the_largest_logs_panel_answer_fits_every_grpc_limit_of_the_compose_loki():
    config = yaml.safe_load((REPO / "compose/loki/loki.yml").read_text())
    largest = max(panel_lines()) * size(config["limits_config"]["max_line_size"]) * FRAMING
    for name, limit in query_path_limits(config).items():
        assert largest <= limit, f"{name}={limit} is below the largest Logs panel answer ({largest:.0f} bytes)"


def test_every_logs_panel_sets_its_line_count():
    assert all(isinstance(lines, int) and 0 < lines <= 1000 for lines in panel_lines())


def test_ansible_keeps_the_compose_limits_and_refuses_overrides_below_the_panels_need():
    config = yaml.safe_load((REPO / "compose/loki/loki.yml").read_text())
    role = REPO / "ansible/roles/loki"
    assert "compose/loki/loki.yml" in (role / "defaults/main.yml").read_text()  # the same base file
    overrides = yaml.safe_load((role / "vars/main.yml").read_text())["_loki_production_overrides"]
    assert not {"server", "frontend_worker", "ingester_client"} & set(overrides)
    need = max(panel_lines()) * size(config["limits_config"]["max_line_size"]) * FRAMING
    checks = re.findall(r"_loki_config\.([\w.]+) \| int >= (\d+)", (role / "tasks/main.yml").read_text())
    checked = {name for name, _ in checks}
    assert {"server.grpc_server_max_send_msg_size", "frontend_worker.grpc_client_config.max_recv_msg_size"} <= checked
    for name, minimum in checks:
        assert int(minimum) >= need, f"the role accepts {name} down to {minimum}, below {need:.0f}"
        assert int(minimum) <= query_path_limits(config)[name]


def test_the_answer_the_compose_loki_could_not_send_now_fits():
    """Loki answered 500 `trying to send message larger than max (76878820 vs. 67108864)` for 1,000 lines."""
    observed = 76_878_820
    config = yaml.safe_load((REPO / "compose/loki/loki.yml").read_text())
    assert all(observed <= limit for limit in query_path_limits(config).values())
    assert max(panel_lines()) < 1000  # and the panels ask for fewer lines than then
