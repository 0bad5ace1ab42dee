"""Caller cost of MetricsLogger.log() against influxdb_client's batching WriteApi.write(Point).

Both write 10 numeric fields and two tags per call to the same local endpoint, in
the same run. Prints p50 and p99 in microseconds.
"""

from __future__ import annotations

import gc

from _common import caller_cost_us
from fault_server import fault_server
from influxdb_client import InfluxDBClient, Point
from influxdb_client.client.write_api import WriteOptions

from telemetry_client.metrics import MetricsLogger

SAMPLES = 50_000
FIELDS = {f"field_{i}": i * 1.5 for i in range(10)}
TAGS = {"kind": "bench", "phase": "train"}


def bench_metrics_logger(url: str) -> tuple[float, float]:
    logger = MetricsLogger(url=url, token="bench-token", uid=1, role="miner", self_metrics_interval=None)
    result = caller_cost_us(lambda: logger.log("bench", TAGS, FIELDS), SAMPLES)
    logger.close(30)
    return result


def bench_influxdb_client(url: str) -> tuple[float, float]:
    client = InfluxDBClient(url=url, token="bench-token", org="o")
    write_api = client.write_api(write_options=WriteOptions(batch_size=5_000, flush_interval=1_000))

    def write() -> None:
        point = Point("bench").tag("uid", "1").tag("role", "miner")
        for key, value in TAGS.items():
            point.tag(key, value)
        for key, value in FIELDS.items():
            point.field(key, value)
        write_api.write(bucket="b", record=point)

    result = caller_cost_us(write, SAMPLES)
    write_api.close()
    client.close()
    return result


def main() -> None:
    with fault_server() as server:
        gc.collect()
        ours = bench_metrics_logger(server.url)
        gc.collect()
        theirs = bench_influxdb_client(server.url)
    print(f"log() caller cost, 10 fields, {SAMPLES} calls each (µs)")
    print(f"{'':34} {'p50':>8} {'p99':>8}")
    print(f"{'MetricsLogger.log()':34} {ours[0]:8.2f} {ours[1]:8.2f}")
    print(f"{'influxdb_client WriteApi.write()':34} {theirs[0]:8.2f} {theirs[1]:8.2f}")
    print(f"MetricsLogger is {theirs[0] / ours[0]:.1f}x cheaper at p50, {theirs[1] / ours[1]:.1f}x at p99")


if __name__ == "__main__":
    main()
