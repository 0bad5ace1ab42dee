"""Grafana's provisioning for the stack: the dashboard and alert-rule builder and what it generates.

Python: the shared builder (grafana.builder), the dashboard sources
(grafana.dashboards_src), the alert rules and settings (grafana.alerting_src) and
the build commands (`python -m grafana.build_dashboards`, `python -m
grafana.build_alerting`). Beside them, the generated files Grafana provisions and
the simulator and doctor read: dashboards/ and dashboards-victoriametrics/,
alerting/ and alerting-victoriametrics/, provisioning/ and
provisioning-victoriametrics/, and downsampling/ (InfluxDB's downsampled copy).
They are package data, so an installed copy carries them.
"""
