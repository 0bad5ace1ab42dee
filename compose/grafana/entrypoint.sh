#!/bin/sh
# Grafana's provisioning reads the InfluxDB read token from the environment
# (INFLUXDB_READ_TOKEN). The token is never put in the container's configuration,
# where `docker inspect` would show it: this wrapper reads it from the file that
# INFLUXDB_READ_TOKEN_FILE names, then starts Grafana as the image would. In the
# local stack InfluxDB writes that file into a shared volume at first start; the
# Ansible grafana role mounts it from its secrets directory.
set -eu
token_file="${INFLUXDB_READ_TOKEN_FILE:-/run/telemetry-tokens/grafana-read.token}"
if [ -z "${INFLUXDB_READ_TOKEN:-}" ]; then
  if [ ! -r "${token_file}" ]; then
    echo "grafana: ${token_file} is missing; the InfluxDB volume was set up without it." >&2
    echo "grafana: local stack: reset it with 'make clean VOLUMES=1' and 'make up';" >&2
    echo "grafana: production: run the playbook again (ansible-playbook site.yml)." >&2
    exit 1
  fi
  INFLUXDB_READ_TOKEN="$(cat "${token_file}")"
  export INFLUXDB_READ_TOKEN
fi
exec "${GRAFANA_RUN:-/run.sh}" "$@"
