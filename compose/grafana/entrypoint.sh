#!/bin/sh
# Grafana's provisioning reads the InfluxDB read token from the environment
# (INFLUXDB_READ_TOKEN). The token is never put in the container's configuration,
# where `docker inspect` would show it: this wrapper reads it from the file that
# INFLUXDB_READ_TOKEN_FILE names, then starts Grafana as the image would. In the
# local stack InfluxDB writes that file into a shared volume at first start; the
# Ansible grafana role mounts it from its secrets directory.
# The token is needed only when a provisioned data source expands it: the
# VictoriaMetrics provisioning (grafana/provisioning-victoriametrics) does not, and
# that stack has no InfluxDB to write the file.
set -eu
token_file="${INFLUXDB_READ_TOKEN_FILE:-/run/telemetry-tokens/grafana-read.token}"
provisioning="${GF_PATHS_PROVISIONING:-/etc/grafana/provisioning}"
needs_token=1
if [ -d "${provisioning}/datasources" ] \
  && ! grep -rhs -v '^[[:space:]]*#' "${provisioning}/datasources" | grep -q 'INFLUXDB_READ_TOKEN'; then
  needs_token=0
fi
if [ "${needs_token}" = 1 ] && [ -z "${INFLUXDB_READ_TOKEN:-}" ]; then
  if [ ! -r "${token_file}" ]; then
    echo "grafana: ${token_file} is missing; the InfluxDB volume was set up without it." >&2
    echo "grafana: local stack: reset it with 'make clean VOLUMES=1' and 'make up';" >&2
    echo "grafana: production: run the playbook again (ansible-playbook site.yml)." >&2
    exit 1
  fi
  INFLUXDB_READ_TOKEN="$(cat "${token_file}")"
  export INFLUXDB_READ_TOKEN
fi

# Alert rules. grafana/alerting, or grafana/alerting-victoriametrics for that
# backend (mounted at TELEMETRY_ALERTING_DIR), holds the
# generated files with ${ALERT_...} placeholders, which Grafana does not expand
# inside a rule's query (grafana/grafana pkg/services/provisioning/alerting/
# rules_types.go passes the model on raw). This fills them in from the
# environment, or from the defaults of settings.env, checks each value, and hands
# Grafana a copy of its provisioning with the rendered files in alerting/. The
# contact point files are included only when their address is set (Grafana
# refuses a contact point without one); Grafana expands those addresses itself.
# The retire files delete what an unset address left behind (see below).
# grafana/alerting_src/render.py does exactly the same (a test compares them).
alerting_dir="${TELEMETRY_ALERTING_DIR:-/etc/telemetry/alerting}"
if [ -d "${alerting_dir}" ]; then
  fail() {
    echo "grafana: $*" >&2
    exit 1
  }
  if [ -z "${ALERTING_WEBHOOK_URL:-}" ] && [ -n "${ALERTING_WEBHOOK_URL_FILE:-}" ]; then
    [ -r "${ALERTING_WEBHOOK_URL_FILE}" ] || fail "${ALERTING_WEBHOOK_URL_FILE} (ALERTING_WEBHOOK_URL_FILE) is not readable."
    ALERTING_WEBHOOK_URL="$(cat "${ALERTING_WEBHOOK_URL_FILE}")"
    export ALERTING_WEBHOOK_URL
  fi
  # Each setting's comment in settings.env ends with its kind and what Grafana needs of
  # it (grafana/build_alerting.py writes them, grafana/alerting_src/settings.py checks
  # the same): "(choice, one of a b c)" for a setting that takes one of a few words,
  # "(seconds, a multiple of 10)" for the rule groups' interval (Grafana
  # refuses to start on an interval that is not a multiple of its 10 s scheduler tick),
  # "(seconds, above X for <rules>)" for a query's window, which must start before it
  # ends (X is 0 or the setting where it ends; Grafana refuses to start otherwise).
  script=""
  spec=""
  windows=""
  while IFS= read -r line; do
    case "${line}" in
      "#"*")")
        spec="${line##*(}"
        spec="${spec%)}"
        ;;
      ALERT_*=*)
        name="${line%%=*}"
        eval "value=\${${name}:-}"
        [ -n "${value}" ] || value="${line#*=}"
        kind="${spec%%,*}"
        case "${kind}:${name}:${value}" in
          seconds:*:*[!0-9]* | seconds:*: | seconds:*:0?* | count:*:*[!0-9]* | count:*: | count:*:0*) bad=1 ;;
          number:*:*[!0-9.]* | number:*: | number:*:.* | number:*:*. | number:*:*.*.* | number:*:0[!.]*) bad=1 ;;
          choice:*:*[!A-Za-z0-9_-]* | choice:*:) bad=1 ;;
          *) bad=0 ;;
        esac
        [ "${bad}" = 0 ] || fail "${name}=${value} is not a valid ${kind} (see docs/alerting.md)."
        eval "setting_${name}=\${value}"
        rest="${spec#"${kind}"}"
        while [ -n "${rest}" ]; do
          rest="${rest#, }"
          clause="${rest%%, *}"
          rest="${rest#"${clause}"}"
          case "${clause}" in
            "a multiple of "*)
              step="${clause#a multiple of }"
              if [ "${value}" -eq 0 ] || [ $((value % step)) -ne 0 ]; then
                fail "${name}=${value} must be a multiple of ${step} above 0: Grafana refuses to start on a rule group interval that is not (see docs/alerting.md)."
              fi
              ;;
            "one of "*)
              case " ${clause#one of } " in
                *" ${value} "*) ;;
                *) fail "${name}=${value} must be one of: ${clause#one of } (see docs/alerting.md)." ;;
              esac
              ;;
            "above "*) windows="${windows}${name} ${clause#above }
" ;;
          esac
        done
        script="${script}s|\${${name}}|${value}|g;"
        ;;
    esac
  done <"${alerting_dir}/settings.env"
  # Once every value is known: each window starts before it ends (from > to).
  while read -r name bound _ rules; do
    [ -n "${name}" ] || continue
    eval "start=\${setting_${name}}"
    end=0
    [ "${bound}" = 0 ] || eval "end=\${setting_${bound}}"
    if [ "${start}" -le "${end}" ]; then
      [ "${bound}" = 0 ] || bound="${bound}=${end}"
      [ -n "${rules}" ] || fail "${name}=${start} must be above ${bound} (see docs/alerting.md)."
      fail "${name}=${start} must be above ${bound} for ${rules}: a query's window must start before it ends, and Grafana refuses to start otherwise (see docs/alerting.md)."
    fi
  done <<EOF
${windows}
EOF
  source_dir="${GF_PATHS_PROVISIONING:-/etc/grafana/provisioning}"
  target_dir="${TELEMETRY_PROVISIONING_DIR:-/tmp/telemetry-provisioning}"
  rm -rf "${target_dir}"
  mkdir -p "${target_dir}"
  cp -R "${source_dir}/." "${target_dir}/"
  rm -rf "${target_dir}/alerting"
  mkdir -p "${target_dir}/alerting"
  render() {
    sed "${script}" "${alerting_dir}/$1" >"${target_dir}/alerting/$1"
    if grep -q '\${ALERT_' "${target_dir}/alerting/$1"; then
      fail "$1 uses a setting settings.env does not define: $(grep -o '\${ALERT_[A-Z0-9_]*}' "${target_dir}/alerting/$1" | head -n 1)"
    fi
  }
  render rules.yaml
  contacts=0
  if [ -n "${ALERTING_WEBHOOK_URL:-}" ]; then
    render contact-point-webhook.yaml
    contacts=1
  fi
  if [ -n "${ALERTING_EMAIL_ADDRESSES:-}" ]; then
    render contact-point-email.yaml
    contacts=1
  fi
  # Grafana never deletes what a file no longer holds (docs/alerting.md): with one
  # address set, the other's integration is deleted; with none, only when
  # ALERTING_RETIRE_CONTACT_POINTS=true, which also resets the policy tree.
  if [ "${contacts}" = 1 ]; then
    render policies.yaml
    [ -n "${ALERTING_WEBHOOK_URL:-}" ] || render retire-contact-point-webhook.yaml
    [ -n "${ALERTING_EMAIL_ADDRESSES:-}" ] || render retire-contact-point-email.yaml
  elif [ "${ALERTING_RETIRE_CONTACT_POINTS:-}" = true ]; then
    render reset-policies.yaml
    render retire-contact-point-webhook.yaml
    render retire-contact-point-email.yaml
  fi
  GF_PATHS_PROVISIONING="${target_dir}"
  export GF_PATHS_PROVISIONING
fi
exec "${GRAFANA_RUN:-/run.sh}" "$@"
