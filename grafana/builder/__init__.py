"""The shared builder of the Grafana dashboards and alert rules.

- backend: which metrics store (InfluxDB or VictoriaMetrics) a build writes for
- dialects: each store's query language as one object (InfluxQL, MetricsQL), chosen once per build
- targets: the data sources and the shapes of query targets (INFLUX, VICTORIAMETRICS, LOKI...)
- queries: backend-neutral panel queries (fleet_and_nodes, worst_nodes, counter_rates...) and LogQL
- influxql / metricsql: the dashboards' text of those queries in each metrics language
- variables: template variables (node_variables and friends)
- panels: Layout (panel placement) and dashboard (the envelope)

Import it as `grafana.builder` with the repository root on sys.path (as
grafana/build_dashboards.py does); it needs telemetry_client.catalog from there.
"""
