.PHONY: setup check test lint bench simulate doctor up down logs ps clean backup restore node-add node-revoke node-rotate node-retire node-credentials

PYTHON ?= python3

# Python packages (editable, with the development tools) and, on Debian or Ubuntu
# as root, the real servers the tests run against.
setup:
	$(PYTHON) -m pip install -e '.[dev]'
	@if command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ]; then \
		apt-get -o DPkg::Lock::Timeout=300 update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq -o DPkg::Lock::Timeout=300 influxdb victoria-metrics docker-compose caddy iptables iproute2 restic openssh-server; \
	else \
		echo "Install Debian's influxdb, victoria-metrics, docker-compose, caddy, iptables and iproute2 packages to run every test."; \
	fi

# While editing: the linters that take seconds, then the fast tier (tests not marked
# slow, see tests/conftest.py), and the wall time it took. ansible-lint costs about a
# minute and a half of CPU: `make lint` and `make test` (tests/test_ansible.py) run it.
check:
	@start=$$(date +%s); \
	  $(QUICK_LINT) && $(PYTHON) -m pytest -m "not slow" -q; status=$$?; \
	  echo "make check: $$(( $$(date +%s) - start )) s wall"; exit $$status

# Before a merge: the whole suite, spread over one worker per core (pytest-xdist). A
# module's tests share one worker (its module fixtures are built once) unless it says
# otherwise (tests/conftest.py). TEST_WORKERS=0 runs it in this process.
TEST_WORKERS ?= auto
test:
	$(PYTHON) -m pytest -n $(TEST_WORKERS) --dist loadgroup

QUICK_LINT = ruff check . && ruff format --check . && yamllint .

lint:
	$(QUICK_LINT)
	ansible-lint

bench:
	$(PYTHON) bench/bench_log_caller.py
	$(PYTHON) bench/bench_throughput.py
	$(PYTHON) bench/bench_busy_threads.py
	$(PYTHON) bench/bench_outage_memory.py
	$(PYTHON) bench/bench_small_buffer.py
	$(PYTHON) bench/bench_outage_recovery.py
	$(PYTHON) bench/bench_log_stalls.py
	$(PYTHON) bench/bench_loki_emit.py
	$(PYTHON) bench/bench_loki_delivery.py
	$(PYTHON) bench/bench_flood.py
	$(PYTHON) bench/bench_stores.py
	$(PYTHON) bench/bench_dashboards.py
	$(PYTHON) bench/bench_backup.py

# The metrics store of the local stack: influxdb (the default) or victoriametrics.
# `make up METRICS_BACKEND=victoriametrics` switches and compose/.env keeps the
# choice; simulate and doctor follow the stack's (docs/local-stack.md, "Metrics backend").
METRICS_BACKEND ?=
# The backend the stack runs: the one compose/.env keeps (influxdb when unset).
STACK_BACKEND = $$(grep -E '^METRICS_BACKEND=' compose/.env 2>/dev/null | tail -n 1 | cut -d= -f2- | grep . || echo influxdb)

# Flood the local stack with a simulated network and check every dashboard through
# Grafana (docs/simulator.md). Needs `make up`. More flags: make simulate SIMULATE_ARGS="--duration 120"
simulate:
	@test -f compose/node.env || { echo "compose/node.env is missing: run 'make up' first." >&2; exit 2; }
	@set -a; . compose/node.env; METRICS_BACKEND="$(STACK_BACKEND)"; set +a; \
	  GRAFANA_URL="http://127.0.0.1:$$(grep -E '^GRAFANA_PORT=' compose/.env | cut -d= -f2- | grep . || echo 3000)" \
	  GRAFANA_USER="$$(grep -E '^GRAFANA_ADMIN_USER=' compose/.env | cut -d= -f2- | grep . || echo admin)" \
	  GRAFANA_PASSWORD="$$(cat compose/secrets/grafana_admin_password)" \
	  $(PYTHON) -m simulator --report simulate-report.json $(SIMULATE_ARGS)

# Check the local stack and a node on this machine (docs/troubleshooting.md): services,
# Grafana's data sources, dashboards and alert rules, and what each token may do.
# Stores nothing. More flags: make doctor DOCTOR_ARGS="--json"
doctor:
	@test -f compose/.env || { echo "compose/.env is missing: run 'make up' first." >&2; exit 2; }
	@set -a; [ -f compose/node.env ] && . compose/node.env; METRICS_BACKEND="$(STACK_BACKEND)"; set +a; \
	  influxdb="$$( [ "$$METRICS_BACKEND" = influxdb ] && docker ps -q -f label=com.docker.compose.project=$${COMPOSE_PROJECT_NAME:-telemetry} \
	    -f label=com.docker.compose.service=influxdb 2>/dev/null | head -n 1)"; \
	  INFLUXDB_READ_TOKEN="$${INFLUXDB_READ_TOKEN:-$$( [ -n "$$influxdb" ] && \
	    docker exec "$$influxdb" cat /run/telemetry-tokens/grafana-read.token 2>/dev/null)}" \
	  GRAFANA_URL="http://127.0.0.1:$$(grep -E '^GRAFANA_PORT=' compose/.env | cut -d= -f2- | grep . || echo 3000)" \
	  GRAFANA_USER="$$(grep -E '^GRAFANA_ADMIN_USER=' compose/.env | cut -d= -f2- | grep . || echo admin)" \
	  GRAFANA_PASSWORD="$$(cat compose/secrets/grafana_admin_password)" \
	  $(PYTHON) -m telemetry_client doctor --stack $(DOCTOR_ARGS)

# The local stack (compose/): see docs/local-stack.md.
STACK := bash compose/stack.sh

up:
	@METRICS_BACKEND=$(METRICS_BACKEND) $(STACK) up

down:
	@$(STACK) down

logs:
	@$(STACK) logs $(SERVICE)

ps:
	@$(STACK) ps

# A consistent backup of InfluxDB, Grafana and Loki into compose/backups/<stamp>/,
# keeping the newest 7 (make backup BACKUP_KEEP=14); make restore puts the newest
# back (make restore BACKUP=<stamp>). See docs/local-stack.md.
backup:
	@BACKUP_KEEP=$(BACKUP_KEEP) $(STACK) backup

restore:
	@BACKUP=$(BACKUP) $(STACK) restore

# Keeps the data unless asked: make clean VOLUMES=1
clean:
	@VOLUMES=$(VOLUMES) $(STACK) clean

# One node's credentials in production (docs/deployment.md, "Nodes"): its own
# InfluxDB write token and Loki push login, listed in
# $(INVENTORY)/group_vars/all/nodes.yml. Each target changes the list or the
# node's credentials, deploys (site.yml), and writes the node's env file on this
# machine (~/.config/telemetry/nodes/<name>.env, mode 0600) where it changed.
# node-rotate issues new credentials beside the previous ones, which keep working
# until node-retire or the end of a date (default: in telemetry_rotation_grace_days;
# RETIRE_AFTER=YYYY-MM-DD, UTC, to choose it).
#   make node-add NODE=miner-07   [INVENTORY=inventory/prod] [ANSIBLE_ARGS=--ask-vault-pass]
INVENTORY ?= inventory/prod
ANSIBLE_ARGS ?= --ask-vault-pass
RETIRE_AFTER ?=
# NODE and RETIRE_AFTER reach the shell only through the environment, quoted
# ("$$NODE"), and NODE must be a node name before anything runs: a value with
# spaces, quotes or ';' is refused, never run as a command.
export NODE RETIRE_AFTER
NODE_PLAY = ansible-playbook -i $(INVENTORY) ansible/nodes.yml $(ANSIBLE_ARGS) -e "node=$$NODE"
DEPLOY = ansible-playbook -i $(INVENTORY) site.yml $(ANSIBLE_ARGS)
NODE_NAME_CHECK = @printf '%s' "$$NODE" | grep -Eqx '[a-z0-9][a-z0-9._-]{0,62}' || { \
	  echo "NODE must be a node name (lower-case letters, digits, '.', '_' and '-', starting with a letter or digit, 63 characters at most)." >&2; exit 2; }

node-add:
	$(NODE_NAME_CHECK)
	$(NODE_PLAY) -e node_action=add
	$(DEPLOY)
	$(NODE_PLAY) -e node_action=credentials

node-rotate:
	$(NODE_NAME_CHECK)
	$(NODE_PLAY) -e node_action=rotate $(if $(RETIRE_AFTER),-e "node_retire_after=$$RETIRE_AFTER")
	$(DEPLOY)
	$(NODE_PLAY) -e node_action=credentials

node-retire:
	$(NODE_NAME_CHECK)
	$(NODE_PLAY) -e node_action=retire
	$(DEPLOY)

node-revoke:
	$(NODE_NAME_CHECK)
	$(NODE_PLAY) -e node_action=revoke
	$(DEPLOY)

node-credentials:
	$(NODE_NAME_CHECK)
	$(NODE_PLAY) -e node_action=credentials
