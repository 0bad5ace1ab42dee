#!/bin/bash
# Runs once, inside the InfluxDB container, right after the image's automatic
# setup (DOCKER_INFLUXDB_INIT_MODE=setup) and before the server opens its port.
#
# Why: nodes must not write with the admin token, and Grafana must only read.
# `influx auth create` cannot take a chosen token value, so InfluxDB generates
# both tokens here and this script leaves them in a small volume shared with
# Grafana (read token only, by file mode). stack.sh copies the write token into
# compose/node.env for the nodes and the simulator.
set -euo pipefail

tokens_dir="${TELEMETRY_TOKENS_DIR:-/run/telemetry-tokens}"
grafana_uid="${GRAFANA_UID:-472}"
org_id="${DOCKER_INFLUXDB_INIT_ORG_ID:?set by the image after setup}"
bucket_id="${DOCKER_INFLUXDB_INIT_BUCKET_ID:?set by the image after setup}"
bucket="${DOCKER_INFLUXDB_INIT_BUCKET:?}"

umask 077
mkdir -p "${tokens_dir}"
# Grafana (another uid) must reach its own file, and list nothing else.
chmod 0711 "${tokens_dir}"

# InfluxQL (Grafana's dashboards, decision 3) finds the bucket through a DBRP
# mapping: database = bucket name, retention policy "autogen". Recent servers
# derive a virtual mapping by themselves; an explicit one works on every 2.x.
if ! influx v1 dbrp list --org-id "${org_id}" --db "${bucket}" --hide-headers 2>/dev/null \
    | grep -q "${bucket_id}"; then
  influx v1 dbrp create --org-id "${org_id}" --bucket-id "${bucket_id}" \
    --db "${bucket}" --rp autogen --default >/dev/null
fi

# Prints the "token" value of the JSON that `influx auth create --json` returns.
create_token() {
  local description="$1"
  shift
  influx auth create --org-id "${org_id}" --description "${description}" "$@" --json \
    | sed -n 's/^[[:space:]]*"token":[[:space:]]*"\([^"]*\)".*$/\1/p'
}

write_token="$(create_token "telemetry nodes: write ${bucket}" --write-bucket "${bucket_id}")"
# Grafana also reads the downsampled copy (05-downsampling.sh) for long time ranges.
read_buckets=(--read-bucket "${bucket_id}")
downsampled_id="$(influx bucket list --org-id "${org_id}" --name "${INFLUXDB_DOWNSAMPLED_BUCKET:-${bucket}_downsampled}" \
  --hide-headers 2>/dev/null | awk 'NR == 1 { print $1 }' || true)"
if [ -n "${downsampled_id}" ]; then
  read_buckets+=(--read-bucket "${downsampled_id}")
fi
read_token="$(create_token "grafana: read ${bucket}" "${read_buckets[@]}")"
if [ -z "${write_token}" ] || [ -z "${read_token}" ]; then
  echo "10-tokens.sh: influx auth create returned no token" >&2
  exit 1
fi

printf '%s' "${write_token}" >"${tokens_dir}/node-write.token"
printf '%s' "${read_token}" >"${tokens_dir}/grafana-read.token"
chmod 0400 "${tokens_dir}/node-write.token"
chown "${grafana_uid}:0" "${tokens_dir}/grafana-read.token"
chmod 0440 "${tokens_dir}/grafana-read.token"
echo "10-tokens.sh: created the node write token and the Grafana read token"
