#!/usr/bin/env bash
# The local stack's one entry point, called by the Makefile (up, down, logs, ps,
# clean, backup, restore; `env` only writes compose/.env and the secrets). It keeps
# secrets out of the repository and out of the containers' environments: the
# first `up` writes random values into compose/secrets/ (a directory only its
# owner can enter, one file per secret) and the settings into compose/.env
# (mode 0600); later runs reuse both.
#
# METRICS_BACKEND=influxdb|victoriametrics chooses the metrics store (`make up
# METRICS_BACKEND=victoriametrics`); it is kept in compose/.env, so later commands
# use the same one. Compose merges docker-compose.<backend>.yml onto
# docker-compose.yml (docs/local-stack.md, "Metrics backend").
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(dirname "${here}")"
compose_file="${here}/docker-compose.yml"
backends=(influxdb victoriametrics)
versions_file="${VERSIONS_FILE:-${root}/versions.env}"
env_file="${STACK_ENV_FILE:-${here}/.env}"
node_env_file="${STACK_NODE_ENV_FILE:-${here}/node.env}"
secrets_dir="${STACK_SECRETS_DIR:-${here}/secrets}"
export STACK_SECRETS_DIR="${secrets_dir}"
backups_dir="${STACK_BACKUP_DIR:-${here}/backups}"
backup_keep="${BACKUP_KEEP:-7}"
backup_tool="${here}/backup/telemetry_backup.py"
project="${COMPOSE_PROJECT_NAME:-telemetry}"
timeout_s="${STACK_TIMEOUT:-240}"
backend=""
services=()

die() {
  echo "$*" >&2
  exit 1
}

# One sentence for each way Docker can be missing; never a stack trace.
require_engine() {
  if ! command -v docker >/dev/null 2>&1; then
    die "Docker is not installed: install Docker Engine with its compose plugin (https://docs.docker.com/engine/install/), then run 'make up' again."
  fi
  if ! timeout 30 docker info >/dev/null 2>&1; then
    die "No Docker engine is reachable (docker info failed): start it (for example 'sudo systemctl start docker') or install Docker Engine (https://docs.docker.com/engine/install/), then run 'make up' again."
  fi
  if docker compose version >/dev/null 2>&1; then
    compose_cmd=(docker compose)
  elif command -v docker-compose >/dev/null 2>&1; then
    compose_cmd=(docker-compose)
  else
    die "Docker Compose is missing: install the compose plugin (package docker-compose-plugin) or docker-compose, then run 'make up' again."
  fi
}

# The metrics backend: METRICS_BACKEND from the environment (make up
# METRICS_BACKEND=...) wins, then the one compose/.env keeps, then influxdb. Sets
# `backend` and the long-running `services` to wait for; refuses anything else
# before a file is written.
resolve_backend() {
  backend="${METRICS_BACKEND:-}"
  if [ -z "${backend}" ] && [ -f "${env_file}" ]; then backend="$(env_value METRICS_BACKEND "")"; fi
  backend="${backend:-influxdb}"
  case "${backend}" in
    influxdb) services=(influxdb loki grafana) ;;
    victoriametrics) services=(victoriametrics vmauth loki grafana) ;;
    *) die "METRICS_BACKEND must be influxdb or victoriametrics, not '${backend}'." ;;
  esac
}

# Keeps a backend chosen with METRICS_BACKEND in the env file, so that down, logs,
# backup and the next up use it without being told again. An env file without the
# line means influxdb and is left as it is.
persist_backend() {
  local stored
  stored="$(env_value METRICS_BACKEND "")"
  [ -n "${METRICS_BACKEND:-}" ] || return 0
  [ "${stored}" = "${backend}" ] && return 0
  if [ -n "${stored}" ]; then
    (umask 077 && sed "s/^METRICS_BACKEND=.*/METRICS_BACKEND=${backend}/" "${env_file}" >"${env_file}.tmp")
    mv "${env_file}.tmp" "${env_file}"
    echo "Switched METRICS_BACKEND from ${stored} to ${backend} in ${env_file}."
  else
    printf '\n# The metrics store (docs/local-stack.md, "Metrics backend").\nMETRICS_BACKEND=%s\n' "${backend}" >>"${env_file}"
  fi
  chmod 0600 "${env_file}"
}

# The image versions live in versions.env (shared with Ansible); export them so
# compose interpolates ${INFLUXDB_IMAGE} and friends.
load_versions() {
  [ -r "${versions_file}" ] || die "${versions_file} is missing: it pins the image versions."
  set -a
  # shellcheck disable=SC1090
  . "${versions_file}"
  set +a
  local name
  for name in INFLUXDB_IMAGE LOKI_IMAGE GRAFANA_IMAGE PYTHON_IMAGE VICTORIAMETRICS_IMAGE VMAUTH_IMAGE; do
    [ -n "${!name:-}" ] || die "${versions_file} does not set ${name}."
    case "${!name}" in
      *:latest) die "${versions_file}: ${name} must pin a version, not 'latest'." ;;
      *:*) ;;
      *) die "${versions_file}: ${name} must pin a version tag." ;;
    esac
  done
}

random_secret() {
  # $1 characters from [A-Za-z0-9], read from the kernel's CSPRNG.
  local out=""
  while [ "${#out}" -lt "$1" ]; do
    out+="$(head -c 96 /dev/urandom | base64 | tr -dc 'A-Za-z0-9')"
  done
  printf '%s' "${out:0:$1}"
}

# Secret name, length of a new random value, and file mode. The InfluxDB image
# reads its files as root (which may read a 0600 file of another owner); Grafana
# reads its files (admin password, secret_key) as uid 472, so those are 0644
# inside the 0700 directory: only the directory's owner can reach them on this
# machine. The secrets of both
# backends are written, so that switching needs no new setup.
# victoriametrics_node_token is the nodes' write token for VictoriaMetrics; only
# this script reads it (into vmauth_config and node.env). The vmauth_*_auth_key
# files are the keys of vmauth's own endpoints (?authKey=...), read by vmauth as
# root (docker-compose.victoriametrics.yml). The victoriametrics_*_auth_key files
# are the keys of VictoriaMetrics' delete, snapshot, force-merge and force-flush
# endpoints; VictoriaMetrics reads them as nobody (65534), so they are 0644 like
# Grafana's, and `make backup` sends the snapshot key.
SECRETS=(
  "influxdb_admin_password 32 0600"
  "influxdb_admin_token 64 0600"
  "grafana_admin_password 32 0644"
  "grafana_secret_key 40 0644"
  "victoriametrics_node_token 64 0600"
  "vmauth_metrics_auth_key 32 0600"
  "vmauth_flags_auth_key 32 0600"
  "vmauth_pprof_auth_key 32 0600"
  "vmauth_reload_auth_key 32 0600"
  "victoriametrics_delete_auth_key 32 0644"
  "victoriametrics_snapshot_auth_key 32 0644"
  "victoriametrics_force_merge_auth_key 32 0644"
  "victoriametrics_force_flush_auth_key 32 0644"
)

# Writes every missing secret file. A value an older stack.sh kept in the env
# file (INFLUXDB_ADMIN_PASSWORD=...) is moved into its file, never regenerated:
# the running services were set up with it.
ensure_secrets() {
  local entry name length mode legacy value
  (umask 077 && mkdir -p "${secrets_dir}")
  chmod 0700 "${secrets_dir}"
  for entry in "${SECRETS[@]}"; do
    read -r name length mode <<<"${entry}"
    if [ ! -s "${secrets_dir}/${name}" ]; then
      legacy="$(printf '%s' "${name}" | tr '[:lower:]' '[:upper:]')"
      value="$(env_value "${legacy}" "")"
      [ -n "${value}" ] || value="$(random_secret "${length}")"
      (umask 077 && printf '%s' "${value}" >"${secrets_dir}/${name}.tmp")
      mv "${secrets_dir}/${name}.tmp" "${secrets_dir}/${name}"
      echo "Wrote ${secrets_dir}/${name}."
    fi
    chmod "${mode}" "${secrets_dir}/${name}"
  done
  # Optional secrets: created empty, filled in by the operator (docs/alerting.md).
  if [ ! -e "${secrets_dir}/alerting_webhook_url" ]; then
    (umask 077 && : >"${secrets_dir}/alerting_webhook_url")
  fi
  chmod 0644 "${secrets_dir}/alerting_webhook_url"  # read by Grafana as uid 472, like its password
  write_vmauth_config
  # The env file no longer holds secrets: drop what an older version put there.
  if [ -f "${env_file}" ] && grep -qE '^(INFLUXDB_ADMIN_PASSWORD|INFLUXDB_ADMIN_TOKEN|GRAFANA_ADMIN_PASSWORD)=' "${env_file}"; then
    (umask 077 && grep -vE '^(INFLUXDB_ADMIN_PASSWORD|INFLUXDB_ADMIN_TOKEN|GRAFANA_ADMIN_PASSWORD)=' "${env_file}" >"${env_file}.tmp" || true)
    mv "${env_file}.tmp" "${env_file}"
    echo "Moved the secrets out of ${env_file} into ${secrets_dir}/."
  fi
}

secret_value() {
  cat "${secrets_dir}/$1" 2>/dev/null || true
}

# vmauth's configuration (compose/docker-compose.victoriametrics.yml): the node
# token may write InfluxDB line protocol and nothing else. The token is compared
# as a bearer token; vmauth reads MetricsLogger's "Authorization: Token <token>"
# as "Bearer <token>" (VictoriaMetrics app/vmauth/auth_config.go,
# getAuthTokensFromRequest; app/vmauth/main.go in older releases). src_paths are
# anchored regular expressions; a request to any other path gets no route.
# Rewritten only when the token changed, mode 0600 like every secret.
write_vmauth_config() {
  local token content
  token="$(secret_value victoriametrics_node_token)"
  content="# Generated by compose/stack.sh from victoriametrics_node_token: do not edit.
users:
  - name: node
    bearer_token: \"${token}\"
    url_map:
      - src_paths: [\"/write\", \"/api/v2/write\"]
        url_prefix: \"http://victoriametrics:8428\""
  if [ ! -f "${secrets_dir}/vmauth_config" ] || [ "$(cat "${secrets_dir}/vmauth_config")" != "${content}" ]; then
    (umask 077 && printf '%s\n' "${content}" >"${secrets_dir}/vmauth_config.tmp")
    mv "${secrets_dir}/vmauth_config.tmp" "${secrets_dir}/vmauth_config"
  fi
  chmod 0600 "${secrets_dir}/vmauth_config"
}

ensure_env_file() {
  resolve_backend
  if [ ! -f "${env_file}" ]; then
    (
      umask 077
      cat >"${env_file}.tmp" <<ENV
# Generated by compose/stack.sh on $(date -u +%Y-%m-%dT%H:%M:%SZ): settings of the
# local stack. The secrets are in compose/secrets/ (one file each); delete that
# directory together with the volumes ('make clean VOLUMES=1') to start over.
INFLUXDB_ADMIN_USER=admin
INFLUXDB_ORG=telemetry
INFLUXDB_BUCKET=telemetry
INFLUXDB_RETENTION=30d
GRAFANA_ADMIN_USER=admin
GRAFANA_ADMIN_PASSWORD=$(random_secret 32)
BIND_ADDRESS=127.0.0.1
INFLUXDB_PORT=8086
LOKI_PORT=3100
GRAFANA_PORT=3000

# The metrics store: influxdb or victoriametrics (docs/local-stack.md, "Metrics
# backend"); 'make up METRICS_BACKEND=...' changes it here. VictoriaMetrics takes
# node writes on VICTORIAMETRICS_PORT and keeps VICTORIAMETRICS_RETENTION.
METRICS_BACKEND=${backend}
VICTORIAMETRICS_PORT=8428
VICTORIAMETRICS_RETENTION=30d

# Alerting (docs/alerting.md). Uncomment a threshold to change it; the defaults
# are in grafana/alerting/settings.env, except ALERT_BACKUP_NO_REPORT_STATE, which
# is OK here (no backup timer runs on this stack). Contact points: a webhook URL
# (Discord, Slack or any JSON receiver; its kind in ALERT_WEBHOOK_TYPE) goes into
# compose/secrets/alerting_webhook_url; email addresses here (email also needs
# GF_SMTP_ENABLED=true, GF_SMTP_HOST and GF_SMTP_FROM_ADDRESS). With none set,
# alerts still show in Grafana and go nowhere.
$(sed -n 's/^\(ALERT_[A-Z0-9_]*=.*\)$/# \1/p' "${root}/grafana/alerting/settings.env")
ALERTING_EMAIL_ADDRESSES=
ENV
      mv "${env_file}.tmp" "${env_file}"
    )
    echo "Created ${env_file} (mode 0600)."
  fi
  chmod 0600 "${env_file}"
  persist_backend
  ensure_secrets
}

env_value() {
  # The value of $1 in the env file, or $2 when it is not set there.
  local line
  line="$(grep -E "^$1=" "${env_file}" 2>/dev/null | tail -n 1 || true)"
  if [ -n "${line}" ]; then printf '%s' "${line#*=}"; else printf '%s' "$2"; fi
}

# The stack of the chosen backend: the common file and the backend's file.
compose() {
  "${compose_cmd[@]}" -p "${project}" -f "${compose_file}" -f "${here}/docker-compose.${backend}.yml" \
    --env-file "${env_file}" "$@"
}

# Both backends at once, to remove the containers and volumes of either.
compose_every_backend() {
  local files=(-f "${compose_file}") name
  for name in "${backends[@]}"; do files+=(-f "${here}/docker-compose.${name}.yml"); done
  "${compose_cmd[@]}" -p "${project}" "${files[@]}" --env-file "${env_file}" "$@"
}

# VictoriaMetrics refuses a malformed -retentionPeriod only in its log, after the
# start: say it here instead. It takes a number with an h, d, w or y suffix (months
# without one), at least a day (lib/flagutil, retentionPeriod).
require_valid_retention() {
  local retention
  [ "${backend}" = victoriametrics ] || return 0
  retention="$(env_value VICTORIAMETRICS_RETENTION 30d)"
  [[ "${retention}" =~ ^[0-9]+[hdwy]?$ ]] \
    || die "VICTORIAMETRICS_RETENTION=${retention} in ${env_file} is not a retention period: write a number with h, d, w or y (for example 30d)."
}

# Grafana is provisioned from generated files (python -m grafana.build_dashboards
# and build_alerting write both backends' sets): refuse to start without them,
# rather than start a Grafana with no dashboards or no alert rules.
require_grafana_files() {
  local suffix="" dir
  [ "${backend}" = influxdb ] || suffix="-${backend}"
  for dir in "provisioning${suffix}/datasources" "dashboards${suffix}" "alerting${suffix}"; do
    if [ -z "$(find "${root}/grafana/${dir}" -maxdepth 1 -type f \( -name '*.json' -o -name '*.yml' -o -name '*.yaml' \) 2>/dev/null | head -n 1)" ]; then
      die "grafana/${dir}/ is missing or empty: generate it with 'python -m grafana.build_dashboards' and 'python -m grafana.build_alerting', then run 'make up' again."
    fi
  done
  [ -r "${root}/grafana/alerting${suffix}/settings.env" ] \
    || die "grafana/alerting${suffix}/settings.env is missing: generate it with 'python -m grafana.build_alerting', then run 'make up' again."
}

health_of() {
  local id
  id="$(compose ps -q "$1" 2>/dev/null || true)"
  if [ -z "${id}" ]; then
    echo "missing"
    return
  fi
  docker inspect --format '{{if .State.Health}}{{.State.Health.Status}}{{else}}{{.State.Status}}{{end}}' "${id}" 2>/dev/null || echo "missing"
}

wait_healthy() {
  local start now elapsed all_ok status report svc
  start="$(date +%s)"
  while true; do
    all_ok=1
    report=""
    for svc in "${services[@]}"; do
      status="$(health_of "${svc}")"
      report+=" ${svc}=${status}"
      case "${status}" in
        healthy) ;;
        unhealthy | exited | dead)
          echo "${svc} is ${status}; its last log lines:" >&2
          compose logs --tail=40 "${svc}" >&2 || true
          die "The stack did not come up: ${svc} is ${status}."
          ;;
        *) all_ok=0 ;;
      esac
    done
    now="$(date +%s)"
    elapsed=$((now - start))
    if [ "${all_ok}" = 1 ]; then
      echo "All services healthy after ${elapsed}s:${report}"
      return
    fi
    if [ "${elapsed}" -ge "${timeout_s}" ]; then
      die "Timed out after ${timeout_s}s waiting for the stack:${report} (see 'make logs')."
    fi
    echo "Waiting (${elapsed}s/${timeout_s}s):${report}"
    sleep 3
  done
}

# Nodes and the simulator write with their own token, never the admin one.
# InfluxDB generated it at first start (influxdb/init/10-tokens.sh); the
# VictoriaMetrics one is ours (victoriametrics_node_token, checked by vmauth).
# MetricsLogger writes to both the same way: InfluxDB's /api/v2/write with
# "Authorization: Token <token>". VictoriaMetrics reads only the db and precision
# query arguments of a write (app/vminsert/influx/request_handler.go): org and
# bucket are ignored there, so node.env leaves them out.
write_node_env() {
  local token host
  host="$(env_value BIND_ADDRESS 127.0.0.1)"
  [ "${host}" = "0.0.0.0" ] && host=127.0.0.1
  if [ "${backend}" = victoriametrics ]; then
    token="$(secret_value victoriametrics_node_token)"
  else
    token="$(compose exec -T influxdb cat /run/telemetry-tokens/node-write.token 2>/dev/null || true)"
  fi
  if [ -z "${token}" ]; then
    echo "Warning: no node write token found in the InfluxDB volume; ${node_env_file} not written." >&2
    return
  fi
  (
    umask 077
    {
      echo "# Generated by compose/stack.sh: how a node or the simulator on this machine"
      echo "# reaches the local stack. Load it with: set -a; . compose/node.env; set +a"
      echo "METRICS_BACKEND=${backend}"
      echo "INFLUXDB_HOST=${host}"
      if [ "${backend}" = victoriametrics ]; then
        echo "INFLUXDB_PORT=$(env_value VICTORIAMETRICS_PORT 8428)"
      else
        echo "INFLUXDB_PORT=$(env_value INFLUXDB_PORT 8086)"
        echo "INFLUXDB_ORG=$(env_value INFLUXDB_ORG telemetry)"
        echo "INFLUXDB_DATABASE=$(env_value INFLUXDB_BUCKET telemetry)"
      fi
      echo "INFLUXDB_TOKEN=${token}"
      echo "LOKI_URL=http://${host}:$(env_value LOKI_PORT 3100)"
    } >"${node_env_file}.tmp"
    mv "${node_env_file}.tmp" "${node_env_file}"
  )
  chmod 0600 "${node_env_file}"
}

print_summary() {
  local host
  host="$(env_value BIND_ADDRESS 127.0.0.1)"
  [ "${host}" = "0.0.0.0" ] && host=127.0.0.1
  local store
  if [ "${backend}" = victoriametrics ]; then
    store="  VictoriaMetrics  http://${host}:$(env_value VICTORIAMETRICS_PORT 8428)  (writes only, with the node token; Grafana queries it)"
  else
    store="  InfluxDB  http://${host}:$(env_value INFLUXDB_PORT 8086)  (org $(env_value INFLUXDB_ORG telemetry), bucket $(env_value INFLUXDB_BUCKET telemetry); admin password and token in ${secrets_dir}/)"
  fi
  cat <<TXT

The local stack is up (metrics: ${backend}).
  Grafana   http://${host}:$(env_value GRAFANA_PORT 3000)  (user $(env_value GRAFANA_ADMIN_USER admin), password in ${secrets_dir}/grafana_admin_password)
${store}
  Loki      http://${host}:$(env_value LOKI_PORT 3100)
  Node settings (write-only token): ${node_env_file}
Stop it with 'make down'; 'make clean VOLUMES=1' also deletes all stored data.
TXT
}

# Grafana's built-in secret_key (conf/defaults.ini of grafana/grafana), which a
# stack set up before it had its own key encrypted Grafana's stored secrets with.
grafana_default_secret_key=SW2YcwTIb9zpOOhoPsMm

# A Grafana volume from before the stack had its own secret_key holds secrets
# encrypted with the built-in one, which a new key could not read: that stack
# keeps the built-in key, with a warning. A new stack gets a random key.
keep_grafana_secret_key_of_an_older_stack() {
  [ -s "${secrets_dir}/grafana_secret_key" ] && return 0
  docker volume inspect "${project}_grafana-data" >/dev/null 2>&1 || return 0
  (umask 077 && mkdir -p "${secrets_dir}" && printf '%s' "${grafana_default_secret_key}" >"${secrets_dir}/grafana_secret_key")
  chmod 0644 "${secrets_dir}/grafana_secret_key"
  echo "Warning: Grafana's volume ${project}_grafana-data predates its own secret_key; it keeps Grafana's built-in key, which is public. For a random one (Grafana's own state goes; its provisioned data sources, dashboards and alert rules come back): make down; docker volume rm ${project}_grafana-data; rm ${secrets_dir}/grafana_secret_key; make up (docs/local-stack.md)." >&2
}

# Before anything is written or started: a wrong METRICS_BACKEND, no engine,
# floating versions and missing Grafana files each stop here with one sentence.
cmd_up() {
  resolve_backend
  require_engine
  load_versions
  require_valid_retention
  require_grafana_files
  keep_grafana_secret_key_of_an_older_stack
  ensure_env_file
  compose up -d --remove-orphans
  wait_healthy
  write_node_env
  print_summary
}

cmd_down() {
  require_engine
  load_versions
  [ -f "${env_file}" ] || die "${env_file} does not exist: the stack was never started here."
  resolve_backend
  compose down --remove-orphans
}

cmd_logs() {
  require_engine
  load_versions
  [ -f "${env_file}" ] || die "${env_file} does not exist: the stack was never started here."
  resolve_backend
  compose logs --follow --tail=200 "$@"
}

cmd_ps() {
  require_engine
  load_versions
  [ -f "${env_file}" ] || die "${env_file} does not exist: the stack was never started here."
  resolve_backend
  compose ps
}

cmd_clean() {
  require_engine
  load_versions
  [ -f "${env_file}" ] || die "${env_file} does not exist: nothing to clean."
  resolve_backend
  if [ "${VOLUMES:-0}" = 1 ]; then
    ensure_secrets # both backends' files are named by the compose files read together
    compose_every_backend down --remove-orphans --volumes
    rm -f "${node_env_file}"
    echo "Removed the containers and all volumes of both metrics backends (stored metrics, logs and dashboards state)."
  else
    compose down --remove-orphans
    echo "Removed the containers; the volumes (all stored data) are kept. 'make clean VOLUMES=1' deletes them too."
  fi
}

# The image key of the metrics store, and what a backup set holds of it.
store_image_key() {
  if [ "${backend}" = victoriametrics ]; then echo VICTORIAMETRICS_IMAGE; else echo INFLUXDB_IMAGE; fi
}
store_backup_name() {
  if [ "${backend}" = victoriametrics ]; then echo victoriametrics.tar.gz; else echo influxdb; fi
}

# VictoriaMetrics' own consistent copy: an instant snapshot (/snapshot/create
# answers {"status":"ok","snapshot":"<name>"}: VictoriaMetrics app/vmstorage/main.go),
# which is hard links to its parts under <data>/snapshots/<name>, joined by
# symbolic links; archived with the links followed, then deleted. The snapshot
# endpoints want -snapshotAuthKey: the backup tool sends it from the key file in
# the POST body, from a throw-away container on VictoriaMetrics' network.
backup_victoriametrics() {
  local set_dir="$1" owner="$2" name
  container_of victoriametrics >/dev/null
  echo "VictoriaMetrics: a snapshot (/snapshot/create), archived..."
  name="$(victoriametrics_snapshot vm-snapshot-create)" || die "VictoriaMetrics did not create a snapshot."
  [[ "${name}" =~ ^[0-9A-Za-z-]+$ ]] || die "VictoriaMetrics did not create a snapshot: ${name}"
  # The snapshot's hard links hold disk space until it is deleted: delete it whether
  # or not the archive was written, then report the archive's outcome.
  local status=0
  backup_helper victoriametrics "${set_dir}" snapshot "/victoria-metrics-data/snapshots/${name}" \
    /backup/victoriametrics.tar.gz --follow-links --owner "${owner}" || status=$?
  victoriametrics_snapshot vm-snapshot-delete "${name}" >/dev/null ||
    echo "VictoriaMetrics snapshot ${name} was not deleted: delete it with /snapshot/delete?snapshot=${name} and the key in ${secrets_dir}/victoriametrics_snapshot_auth_key" >&2
  [ "${status}" -eq 0 ] || die "The VictoriaMetrics snapshot could not be archived (exit ${status}); it was deleted."
}

# The backup tool's vm-snapshot-create or vm-snapshot-delete ($1, then its name)
# against VictoriaMetrics, with the snapshot key mounted read-only. A stack whose
# `make up` predates the key runs VictoriaMetrics without one: no key is sent.
victoriametrics_snapshot() {
  local action="$1" key="${secrets_dir}/victoriametrics_snapshot_auth_key" with_key=()
  shift
  if [ -s "${key}" ]; then
    with_key=(--volume "${key}:/run/secrets/snapshot_auth_key:ro")
    set -- "$@" --auth-key-file /run/secrets/snapshot_auth_key
  fi
  docker run --rm --network "container:$(container_of victoriametrics)" --user 65534:65534 --cap-drop ALL \
    --security-opt no-new-privileges:true \
    --volume "${backup_tool}:/usr/local/bin/telemetry_backup.py:ro" "${with_key[@]}" \
    "${PYTHON_IMAGE}" python /usr/local/bin/telemetry_backup.py "${action}" http://127.0.0.1:8428 "$@"
}

container_of() {
  local id
  id="$(compose ps -q "$1" 2>/dev/null || true)"
  [ -n "${id}" ] || die "The ${1} container does not exist: run 'make up' first."
  printf '%s' "${id}"
}

# Runs the backup tool in a throw-away Python container next to a service's
# volumes (--volumes-from), as root so that it may read the service's files, with
# no network and no capability beyond reading, writing and handing files over.
# $1: service, $2: the backup set directory (mounted at /backup), then the tool's arguments.
backup_helper() {
  local service="$1" set_dir="$2"
  shift 2
  docker run --rm --network none --volumes-from "$(container_of "${service}")" \
    --user 0:0 --cap-drop ALL --cap-add CHOWN --cap-add DAC_OVERRIDE --cap-add FOWNER \
    --security-opt no-new-privileges:true \
    --volume "${backup_tool}:/usr/local/bin/telemetry_backup.py:ro" --volume "${set_dir}:/backup" \
    "${PYTHON_IMAGE}" python /usr/local/bin/telemetry_backup.py "$@"
}

# A consistent copy of each service, each with its own online backup:
#   InfluxDB         its backup API (`influx backup`, run in its container)
#   VictoriaMetrics  an instant snapshot, archived (METRICS_BACKEND=victoriametrics)
#   Grafana          SQLite's online backup API on grafana.db
#   Loki             POST /flush, then a snapshot of its store (chunks, index and WAL)
# into compose/backups/<UTC stamp>/, keeping the newest BACKUP_KEEP sets. MANIFEST
# names the backend and the images; a set restores only onto the same backend.
cmd_backup() {
  require_engine
  load_versions
  [ -f "${env_file}" ] || die "${env_file} does not exist: the stack was never started here."
  resolve_backend
  local stamp set_dir influxdb loki owner key
  stamp="$(date -u +%Y%m%dT%H%M%SZ)"
  set_dir="${backups_dir}/${stamp}"
  owner="$(id -u):$(id -g)"
  (umask 077 && mkdir -p "${set_dir}.partial")
  chmod 0700 "${backups_dir}"
  loki="$(container_of loki)"

  if [ "${backend}" = victoriametrics ]; then
    backup_victoriametrics "${set_dir}.partial" "${owner}"
  else
    influxdb="$(container_of influxdb)"
    echo "InfluxDB: influx backup (its backup API)..."
    docker exec "${influxdb}" rm -rf /tmp/telemetry-backup
    docker exec "${influxdb}" influx backup /tmp/telemetry-backup >/dev/null
    docker cp "${influxdb}:/tmp/telemetry-backup" "${set_dir}.partial/influxdb" >/dev/null
    docker exec "${influxdb}" rm -rf /tmp/telemetry-backup
  fi

  echo "Grafana: SQLite online backup of grafana.db..."
  backup_helper grafana "${set_dir}.partial" sqlite-backup /var/lib/grafana/grafana.db /backup/grafana.db --owner "${owner}"

  echo "Loki: flush, then a snapshot of its store..."
  docker run --rm --network "container:${loki}" --user 65534:65534 --cap-drop ALL \
    --security-opt no-new-privileges:true \
    --volume "${backup_tool}:/usr/local/bin/telemetry_backup.py:ro" \
    "${PYTHON_IMAGE}" python /usr/local/bin/telemetry_backup.py flush http://127.0.0.1:3100
  backup_helper loki "${set_dir}.partial" snapshot /loki /backup/loki.tar.gz --owner "${owner}"

  key="$(store_image_key)"
  cat >"${set_dir}.partial/MANIFEST" <<TXT
stamp=${stamp}
METRICS_BACKEND=${backend}
${key}=${!key}
LOKI_IMAGE=${LOKI_IMAGE}
GRAFANA_IMAGE=${GRAFANA_IMAGE}
TXT
  mv "${set_dir}.partial" "${set_dir}"
  echo "Backup written to ${set_dir}."
  prune_backups
}

# The tested pruning of the backup tool: only <UTC stamp> directories are touched.
prune_backups() {
  docker run --rm --network none --user "$(id -u):$(id -g)" --cap-drop ALL \
    --security-opt no-new-privileges:true \
    --volume "${backup_tool}:/usr/local/bin/telemetry_backup.py:ro" --volume "${backups_dir}:/backups" \
    "${PYTHON_IMAGE}" python /usr/local/bin/telemetry_backup.py prune /backups --keep "${backup_keep}"
}

# Puts a backup set back (BACKUP=<stamp or directory>, the newest by default).
# InfluxDB restores online (`influx restore --full`); VictoriaMetrics, Grafana and
# Loki are stopped while their files are replaced, then started and waited for.
cmd_restore() {
  require_engine
  load_versions
  [ -f "${env_file}" ] || die "${env_file} does not exist: the stack was never started here."
  resolve_backend
  local set_dir="${BACKUP:-}" influxdb image name taken_on
  if [ -z "${set_dir}" ]; then
    set_dir="$(find "${backups_dir}" -mindepth 1 -maxdepth 1 -type d -regextype posix-extended \
      -regex '.*/[0-9]{8}T[0-9]{6}Z' 2>/dev/null | sort | tail -n 1 || true)"
    [ -n "${set_dir}" ] || die "No backup in ${backups_dir}: run 'make backup' first."
  elif [ ! -d "${set_dir}" ]; then
    set_dir="${backups_dir}/${set_dir}"
  fi
  [ -e "${set_dir}/MANIFEST" ] || die "${set_dir} is not a complete backup: MANIFEST is missing."
  # A set holds one backend's metrics (sets written before the switch existed: InfluxDB's).
  taken_on="$(grep -E '^METRICS_BACKEND=' "${set_dir}/MANIFEST" | cut -d= -f2- || true)"
  taken_on="${taken_on:-influxdb}"
  [ "${taken_on}" = "${backend}" ] \
    || die "${set_dir} was taken on METRICS_BACKEND=${taken_on}, but the stack runs ${backend}: switch with 'make up METRICS_BACKEND=${taken_on}' first."
  for name in "$(store_backup_name)" grafana.db loki.tar.gz; do
    [ -e "${set_dir}/${name}" ] || die "${set_dir} is not a complete backup: ${name} is missing."
  done
  # Grafana migrates its database forward only: restore with the images it was taken with.
  for name in "$(store_image_key)" LOKI_IMAGE GRAFANA_IMAGE; do
    image="$(grep -E "^${name}=" "${set_dir}/MANIFEST" | cut -d= -f2- || true)"
    [ "${image}" = "${!name}" ] || die "${set_dir} was taken with ${name}=${image}, but versions.env pins ${!name}: pin the backup's versions first (see docs/local-stack.md, Backups)."
  done
  echo "Restoring ${set_dir}."
  if [ "${backend}" = influxdb ]; then
    influxdb="$(container_of influxdb)"
    docker exec "${influxdb}" rm -rf /tmp/telemetry-restore
    docker cp "${set_dir}/influxdb" "${influxdb}:/tmp/telemetry-restore" >/dev/null
    docker exec "${influxdb}" influx restore --full /tmp/telemetry-restore >/dev/null
    docker exec "${influxdb}" rm -rf /tmp/telemetry-restore
    echo "InfluxDB restored."
  fi

  compose stop grafana >/dev/null
  backup_helper grafana "${set_dir}" sqlite-restore /backup/grafana.db /var/lib/grafana/grafana.db --owner 472:0
  compose stop loki >/dev/null
  backup_helper loki "${set_dir}" restore-snapshot /backup/loki.tar.gz /loki --owner 10001:10001
  if [ "${backend}" = victoriametrics ]; then
    # Stopped while its data directory is replaced (as vmrestore requires), then started.
    compose stop victoriametrics >/dev/null
    backup_helper victoriametrics "${set_dir}" restore-snapshot /backup/victoriametrics.tar.gz \
      /victoria-metrics-data --owner 65534:65534
    compose start victoriametrics >/dev/null
  fi
  compose start loki grafana >/dev/null
  wait_healthy
  echo "Restored ${set_dir}."
}

main() {
  local command="${1:-}"
  shift || true
  case "${command}" in
    up) cmd_up ;;
    env)
      # The VictoriaMetrics node token is ours, so its node.env can be written now.
      ensure_env_file
      if [ "${backend}" = victoriametrics ]; then write_node_env; fi
      ;;
    down) cmd_down ;;
    logs) cmd_logs "$@" ;;
    ps) cmd_ps ;;
    clean) cmd_clean ;;
    backup) cmd_backup ;;
    restore) cmd_restore ;;
    *) die "usage: $0 up|down|logs [service]|ps|clean (VOLUMES=1 to delete the data)|backup (BACKUP_KEEP=7)|restore (BACKUP=<stamp>)|env (only write compose/.env); METRICS_BACKEND=influxdb|victoriametrics chooses the metrics store" ;;
  esac
}

main "$@"
