"""The shared builder of the Grafana dashboards and alert rules.

- targets: the data sources and query targets (INFLUX, LOKI, influx_target, loki_target)
- queries: InfluxQL and LogQL text with the standard node filters
- variables: template variables (node_variables and friends)
- panels: Layout (panel placement) and dashboard (the envelope)

Import it as `grafana.builder` with the repository root on sys.path (as
grafana/build_dashboards.py does); it needs telemetry_client.catalog from there.
"""
