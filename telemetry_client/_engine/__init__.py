"""The shipping engine shared by metrics and logs: buffers, the sender thread, HTTP, retries, process life.

Private: nothing here is public API. It imports only `telemetry_client.config`
and `telemetry_client.errors`, never the sinks built on it (`_influx`, `_loki`).
"""
