#!/bin/sh
# Grafana's provisioning reads the InfluxDB read token from the environment
# (INFLUXDB_READ_TOKEN), the same way the Ansible deployment provides it. In the
# local stack InfluxDB generates that token at first start, so this wrapper reads
# it from the shared tokens volume and then starts Grafana as the image would.
set -eu
token_file="${INFLUXDB_READ_TOKEN_FILE:-/run/telemetry-tokens/grafana-read.token}"
if [ -z "${INFLUXDB_READ_TOKEN:-}" ]; then
  if [ ! -r "${token_file}" ]; then
    echo "grafana: ${token_file} is missing; the InfluxDB volume was set up without it." >&2
    echo "grafana: reset the local stack with 'make clean VOLUMES=1' and 'make up'." >&2
    exit 1
  fi
  INFLUXDB_READ_TOKEN="$(cat "${token_file}")"
  export INFLUXDB_READ_TOKEN
fi
exec "${GRAFANA_RUN:-/run.sh}" "$@"
