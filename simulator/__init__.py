"""A fleet of simulated training nodes that exercises telemetry_client and the dashboards."""
