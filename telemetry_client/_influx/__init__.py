"""The InfluxDB side: `MetricsLogger`, its sink, the line protocol and field encoding, host and GPU samplers.

Private: the public names are in `telemetry_client.metrics`.
"""
