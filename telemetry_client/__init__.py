"""Telemetry for training nodes: InfluxDB metrics, Loki logs, W&B experiment tracking.

Importing this package has no side effects: no logging configuration, no thread,
no environment read. Everything happens when you build a logger.
"""
