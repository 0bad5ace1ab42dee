"""The Loki side: the logging handler and node logger set-up, the sink, label and line limits, context, console.

Private: the public names are in `telemetry_client.loki` (and `bind`, `unbind`,
`log_context` in `telemetry_client`).
"""
