"""The shared builder of the Grafana dashboards and alert rules.

- backend: which metrics store (InfluxDB or VictoriaMetrics) a build writes for
- dialects: each store's query language as one object (InfluxQL, MetricsQL), chosen once per build
- targets: the data sources and the shapes of query targets (INFLUX, VICTORIAMETRICS, LOKI...)
- queries: backend-neutral panel queries (fleet_and_nodes, worst_nodes, counter_rates...) and LogQL
- audit: the edge's audit stream in Loki (tenant, labels, fields) and the queries of refused requests
- influxql / metricsql: the dashboards' text of those queries in each metrics language
- variables: template variables (node_variables and friends)
- panels: Layout (panel placement) and dashboard (the envelope)

Part of the `grafana` package, installed beside telemetry_client (whose catalog it
reads); `python -m grafana.build_dashboards` and `python -m grafana.build_alerting`
run it.
"""
