"""The alert rules, one function each: what a rule watches, when it fires, and why.

The metrics rules are built for the metrics store of the build
(grafana.builder.backend): their queries come from grafana/alerting_src/queries.py,
which writes each in InfluxQL or MetricsQL, naming only what
telemetry_client/catalog.py defines; the log rules are LogQL over the stream labels
the Loki handler sets, the same for either store; the edge rule is LogQL over the edge's
audit stream (grafana/builder/audit.py); the backup rule reads what the stack writes
about its own backups (stack_backup, one series per host). Every rule's labels come from the query's
GROUP BY / `by` (network, role, uid...), so one alert instance is one node (or process,
or device; for the edge rule, one address; for the backup rule, one host).

Annotations and labels use Go templates over `.Labels` and `.Values`, never `$`:
Grafana expands `$NAME` in labels as an environment variable when it reads the file
(grafana/grafana pkg/services/provisioning/values/values.go).
"""

from __future__ import annotations

from grafana.alerting_src import queries as q
from grafana.alerting_src.queries import NODE
from grafana.builder import audit
from grafana.builder.alerts import (
    PanelLink,
    Rule,
    TimeRange,
    loki_query,
    math,
    metrics_query,
    placeholder,
    reduce,
    threshold,
)
from grafana.builder.backend import Backend, building_for
from grafana.builder.queries import uid_from_tenant
from telemetry_client.catalog import DROP_REASONS

# Measurements whose points prove a node is working, one per role. An InfluxQL query over
# several measurements returns one series per measurement, labelled with its tags only, and
# Grafana makes a rule with two results of the same labels one Error (simulator/expressions.py
# cites where): since each of these is written by one role only (telemetry_client/catalog.py),
# grouping by role, or by node, keeps every series' labels unique.
WORK_MEASUREMENTS: tuple[str, ...] = ("training_step", "validator_scores", "aggregator_step", "evaluator_benchmark")
# Drops that mean the data did not arrive. sampled_out is the caller's choice, and so is
# disabled (a logger left off); non_finite drops one value of a point that is delivered
# (mixed precision overflows now and then, and a non-finite loss is the loss rule's business).
LOST_DROP_REASONS: tuple[str, ...] = tuple(
    r for r in DROP_REASONS if r not in ("sampled_out", "disabled", "non_finite")
)
PENDING = "${ALERT_PENDING_SECONDS}s"
NODE_TEXT = "{{ .Labels.uid }} ({{ .Labels.role }}, network {{ .Labels.network }})"


def node_silent() -> Rule:
    # 0 exactly when a node seen in the lookback sent nothing for the last steps.
    query = q.reporting("window", WORK_MEASUREMENTS, "${ALERT_NODE_SILENT_STEPS}", "${ALERT_NODE_SILENT_STEP_SECONDS}")
    return Rule(
        uid="telemetry-node-silent",
        title="Node stopped reporting",
        summary="Node " + NODE_TEXT + " stopped reporting",
        description=(
            "No training_step, validator_scores, aggregator_step or evaluator_benchmark point from node "
            + NODE_TEXT
            + " for the last ALERT_NODE_SILENT_STEPS x ALERT_NODE_SILENT_STEP_SECONDS seconds, although it "
            f"reported within the lookback. The process stopped, hung, or lost its connection to {q.store_name()}."
        ),
        severity="critical",
        data=[
            metrics_query("A", query, TimeRange("ALERT_NODE_SILENT_LOOKBACK_SECONDS")),
            reduce("B", "A", "last"),
            math("C", "$B == 0"),
        ],
        condition="C",
        no_data_state="OK",
        no_data_reason="no node reported in the whole lookback: an empty fleet or a store that is down, "
        "which the store rules report once instead of once per node",
        exec_err_state="KeepLast",
        exec_err_reason="a failing query says nothing about the nodes; the store rules report it, and every "
        "node flapping on a blip would bury that one alert",
        panel=PanelLink("telemetry-health", "Records sent per second"),
        pending="0s",  # the silence window is the duration already
        fired_by=("silent",),
    )


def loss_diverging() -> Rule:
    recent = TimeRange("ALERT_LOSS_WINDOW_SECONDS")
    baseline = TimeRange("ALERT_LOSS_BASELINE_SECONDS", "ALERT_LOSS_WINDOW_SECONDS")
    return Rule(
        uid="telemetry-loss-diverging",
        title="Training loss diverging or not finite",
        summary="Loss of miner " + NODE_TEXT + " is diverging or not finite",
        description=(
            "Miner " + NODE_TEXT + ": the mean loss of the last ALERT_LOSS_WINDOW_SECONDS seconds is more than "
            'ALERT_LOSS_JUMP_RATIO times its mean before (recent {{ (index .Values "D").Value }}, baseline '
            '{{ (index .Values "E").Value }}), or steps were logged without a loss '
            '({{ (index .Values "F").Value }}): the client drops a NaN or infinite loss, so a step '
            "without one had a non-finite loss."
        ),
        severity="critical",
        data=[
            metrics_query("A", q.mean("loss", "training_step"), recent),
            metrics_query("B", q.mean("loss", "training_step"), baseline),
            metrics_query("C", q.missing("loss", "window", "training_step"), recent),
            reduce("D", "A", "last"),
            reduce("E", "B", "last"),
            # null when no step of the window had a loss at all: every loss was non-finite.
            reduce("F", "C", "last", "replaceNN", 1),
            math("G", "$D > ${ALERT_LOSS_JUMP_RATIO} * $E || $F > 0"),
        ],
        condition="G",
        no_data_state="OK",
        no_data_reason="no miner trained in the window or in the baseline (a new network, or miners that "
        "stopped, which the node-silent rule reports)",
        exec_err_state="KeepLast",
        exec_err_reason="the store rules report a failing metrics store once; this rule keeps its last state",
        panel=PanelLink("telemetry-training", "Training loss"),
        pending=PENDING,
        fired_by=("loss-divergence",),
    )


def validator_window_stalled() -> Rule:
    return Rule(
        uid="telemetry-validator-window-stalled",
        title="Validator window not advancing",
        summary="Validator " + NODE_TEXT + " is stuck in one window",
        description=(
            "Validator " + NODE_TEXT + " kept scoring miners, but the window of its validator_scores did not "
            "change in the last ALERT_WINDOW_STALL_SECONDS seconds: it lost sync with the chain or is stuck."
        ),
        severity="warning",
        data=[
            metrics_query("A", q.spread("window", "validator_scores"), TimeRange("ALERT_WINDOW_STALL_SECONDS")),
            reduce("B", "A", "last"),
            threshold("C", "B", "lt", 1),
        ],
        condition="C",
        no_data_state="OK",
        no_data_reason="no validator scored in the window: a network without validators, or validators "
        "that stopped, which the node-silent rule reports",
        exec_err_state="KeepLast",
        exec_err_reason="the store rules report a failing metrics store once; this rule keeps its last state",
        panel=PanelLink("telemetry-validators", "Validator window"),
        pending="0s",  # the window is the duration already
        fired_by=("window-stall",),
    )


def gpu_memory_high() -> Rule:
    query = q.last_percent("memory_used_bytes", "memory_total_bytes", "gpu", (*NODE, "gpu_index"))
    return Rule(
        uid="telemetry-gpu-memory-high",
        title="GPU memory nearly full",
        summary="GPU {{ .Labels.gpu_index }} of " + NODE_TEXT + " is nearly out of memory",
        description=(
            "GPU {{ .Labels.gpu_index }} of node " + NODE_TEXT + " uses "
            '{{ printf "%.1f" (index .Values "B").Value }}% of its memory (threshold ALERT_GPU_MEMORY_PERCENT): '
            "the next larger batch or a fragmentation spike ends in CUDA out of memory."
        ),
        severity="warning",
        data=[
            metrics_query("A", query, TimeRange("ALERT_RESOURCE_WINDOW_SECONDS")),
            reduce("B", "A", "last"),
            threshold("C", "B", "gt", "ALERT_GPU_MEMORY_PERCENT"),
        ],
        condition="C",
        no_data_state="OK",
        no_data_reason="nodes without a GPU (or with GPU metrics off) report no gpu points: nothing to watch",
        exec_err_state="KeepLast",
        exec_err_reason="the store rules report a failing metrics store once; this rule keeps its last state",
        panel=PanelLink("telemetry-system", "GPU memory used (all processes)"),
        pending=PENDING,
        fired_by=("gpu-oom",),
    )


def _host_rule(uid: str, field: str, what: str, setting: str, panel: str, fault: str) -> Rule:
    return Rule(
        uid=uid,
        title=f"Host {what} nearly full",
        summary=f"Host {what} of " + NODE_TEXT + " is nearly full",
        description=(
            f"The host of node {NODE_TEXT} had {what} in use up to "
            '{{ printf "%.1f" (index .Values "B").Value }}% in the last ALERT_RESOURCE_WINDOW_SECONDS seconds '
            f"(threshold {setting}). The node will be killed or fail to write checkpoints."
        ),
        severity="warning",
        data=[
            metrics_query("A", q.maximum(field, "system"), TimeRange("ALERT_RESOURCE_WINDOW_SECONDS")),
            reduce("B", "A", "last"),
            threshold("C", "B", "gt", setting),
        ],
        condition="C",
        no_data_state="OK",
        no_data_reason="nodes that log without system metrics send no system points: nothing to watch",
        exec_err_state="KeepLast",
        exec_err_reason="the store rules report a failing metrics store once; this rule keeps its last state",
        panel=PanelLink("telemetry-system", panel),
        pending=PENDING,
        fired_by=(fault,),
    )


def host_memory_high() -> Rule:
    return _host_rule(
        "telemetry-host-memory-high", "memory_percent", "memory", "ALERT_HOST_MEMORY_PERCENT", "Memory", "memory-full"
    )


def host_disk_high() -> Rule:
    return _host_rule(
        "telemetry-host-disk-high", "disk_percent", "disk", "ALERT_HOST_DISK_PERCENT", "Disk", "disk-full"
    )


def client_drops() -> Rule:
    # The counters are cumulative per process (runtime_id): their spread is their increase in
    # the window. The client's `dropped_<reason>_delta` fields would be simpler, but they are
    # written only when they grew, and InfluxQL's sum(a) + sum(b) is null when either is.
    dropped = [f"dropped_{reason}" for reason in LOST_DROP_REASONS]
    query = q.increase(dropped, "telemetry_client", (*NODE, "runtime_id", "sink"))
    return Rule(
        uid="telemetry-client-drops",
        title="Telemetry client dropping data",
        summary="Node " + NODE_TEXT + ' dropped {{ (index .Values "B").Value }} {{ .Labels.sink }} records',
        description=(
            "The telemetry client of node " + NODE_TEXT + " (process {{ .Labels.runtime_id }}) dropped "
            '{{ (index .Values "B").Value }} records bound for {{ .Labels.sink }} in the last '
            "ALERT_DROPS_WINDOW_SECONDS seconds, for a reason other than sampling (buffer full through an "
            "outage, rejected by the server, invalid, too large...). The Telemetry health dashboard shows which reason."
        ),
        severity="warning",
        data=[
            metrics_query("A", query, TimeRange("ALERT_DROPS_WINDOW_SECONDS")),
            reduce("B", "A", "last"),
            math("C", "$B >= ${ALERT_DROPS_MIN}"),
        ],
        condition="C",
        no_data_state="OK",
        no_data_reason="clients with self-metrics turned off send no counters: nothing to watch",
        exec_err_state="KeepLast",
        exec_err_reason="the store rules report a failing metrics store once; this rule keeps its last state",
        panel=PanelLink("telemetry-health", "Dropped per second, by reason"),
        pending="0s",  # a drop is lost data: report it at once
        fired_by=("drops",),
    )


ERROR_LINES = '{environment=~".+", level=~"error|critical"}'


def network_from_environment(expr: str) -> str:
    """The log lines' `environment` label as `network`, the label the notification policy groups by.

    The logging handler names the network `environment` in Loki; the metrics rules carry
    `network`, so without this a log alert of one network is grouped with every other's.
    """
    return f'label_replace({expr}, "network", "$1", "environment", "(.*)")'


ALL_LINES = '{environment=~".+"}'


def log_errors_above_baseline() -> Rule:
    recent = TimeRange("ALERT_LOG_ERRORS_WINDOW_SECONDS")
    baseline = TimeRange("ALERT_LOG_ERRORS_BASELINE_SECONDS", "ALERT_LOG_ERRORS_WINDOW_SECONDS")
    window, before = "${ALERT_LOG_ERRORS_WINDOW_SECONDS}", "${ALERT_LOG_ERRORS_BASELINE_SECONDS}"
    recent_errors = f"count_over_time({ERROR_LINES} [$__range])"
    return Rule(
        uid="telemetry-log-errors",
        title="Error logs above baseline",
        summary="Node {{ .Labels.uid }} ({{ .Labels.role }}) logs errors far above the baseline",
        description=(
            "Node {{ .Labels.uid }} ({{ .Labels.role }}, network {{ .Labels.network }}) logged "
            '{{ (index .Values "D").Value }} error and critical lines in the last ALERT_LOG_ERRORS_WINDOW_SECONDS '
            "seconds: more than ALERT_LOG_ERRORS_RATIO times what a node of the fleet logged in as long "
            "before (baseline window ALERT_LOG_ERRORS_BASELINE_SECONDS), and at least ALERT_LOG_ERRORS_MIN."
        ),
        severity="warning",
        data=[
            # The node is its Loki tenant's uid where Loki has one tenant per node (production):
            # a node cannot spread its errors over uids it writes, nor raise the node count.
            loki_query(
                "A",
                f"sum by (network, role, uid) ({network_from_environment(uid_from_tenant(recent_errors))})",
                recent,
            ),
            loki_query("B", f"sum(count_over_time({ERROR_LINES} [$__range]))", baseline),
            loki_query(
                "C",
                f"count(sum by (uid) ({uid_from_tenant(f'count_over_time({ALL_LINES} [$__range])')}))",
                baseline,
            ),
            reduce("D", "A", "last"),
            reduce("E", "B", "last"),
            reduce("F", "C", "last"),
            math(
                "G",
                f"$D > ${{ALERT_LOG_ERRORS_RATIO}} * $E / $F * {window} / ({before} - {window}) "
                "&& $D >= ${ALERT_LOG_ERRORS_MIN}",
            ),
        ],
        condition="G",
        no_data_state="OK",
        no_data_reason="no error line in the window (the healthy case) or none in the whole baseline, so no "
        "baseline to compare with",
        exec_err_state="KeepLast",
        exec_err_reason="the Loki store rule reports a failing Loki once; this rule keeps its last state",
        panel=PanelLink("telemetry-logs", "Errors per second by service"),
        pending=PENDING,
        fired_by=("error-burst",),
    )


def metrics_store_unavailable() -> Rule:
    store = q.store_name()
    return Rule(
        uid="telemetry-influxdb-unavailable",  # kept for either store: silences and links name it
        title=f"{store} down or empty",
        summary=f"{store} does not answer, or holds no point from any node",
        description=(
            f"Grafana's query to {store} failed, or {store} holds no training_step, validator_scores, "
            "aggregator_step or evaluator_benchmark point from the last ALERT_STORE_WINDOW_SECONDS seconds. "
            f"Every {store} rule is blind meanwhile."
        ),
        severity="critical",
        data=[
            # Per role: all together would be one series per measurement, all labelled {} (see WORK_MEASUREMENTS).
            metrics_query(
                "A", q.points("window", WORK_MEASUREMENTS, ("role",)), TimeRange("ALERT_STORE_WINDOW_SECONDS")
            ),
            reduce("B", "A", "sum"),
            # Never true on data: this rule fires through its no-data and error states only.
            math("C", "$B < 0"),
        ],
        condition="C",
        no_data_state="Alerting",
        no_data_reason=f"nothing stored from any node: ingestion is broken even if {store} answers",
        exec_err_state="Alerting",
        exec_err_reason=f"this is the rule that reports a failing {store}; the others keep their last state",
        panel=PanelLink("telemetry-health", "Records sent per second"),
        pending=PENDING,
        fired_by=("metrics-down",),
    )


def loki_unavailable() -> Rule:
    return Rule(
        uid="telemetry-loki-unavailable",
        title="Loki down or empty",
        summary="Loki does not answer, or holds no log line from any node",
        description=(
            "Grafana's query to Loki failed, or Loki holds no line from the last ALERT_STORE_WINDOW_SECONDS "
            "seconds. The log rule is blind meanwhile."
        ),
        severity="critical",
        data=[
            loki_query(
                "A", 'sum(count_over_time({environment=~".+"} [$__range]))', TimeRange("ALERT_STORE_WINDOW_SECONDS")
            ),
            reduce("B", "A", "sum"),
            math("C", "$B < 0"),
        ],
        condition="C",
        no_data_state="Alerting",
        no_data_reason="nothing stored from any node: log shipping is broken even if Loki answers",
        exec_err_state="Alerting",
        exec_err_reason="this is the rule that reports a failing Loki; the log rule keeps its last state",
        panel=PanelLink("telemetry-logs", "Log lines by level"),
        pending=PENDING,
        fired_by=("loki-down",),
    )


def edge_refused_credentials() -> Rule:
    # One instance per address: a request without a known credential names no node (user_id "-").
    refused = audit.refused_count(("request_remote_ip",), "$__range", statuses=(401,))
    return Rule(
        uid="telemetry-edge-refused-credentials",
        title="Burst of refused credentials at the edge",
        summary='The edge refused {{ (index .Values "B").Value }} requests from {{ .Labels.request_remote_ip }} '
        "for their credential",
        description=(
            'The production edge answered 401 to {{ (index .Values "B").Value }} requests from address '
            "{{ .Labels.request_remote_ip }} in the last ALERT_EDGE_REFUSED_WINDOW_SECONDS seconds (threshold "
            "ALERT_EDGE_REFUSED_MIN): requests without a credential the edge knows, from a node whose credential "
            "was revoked or rotated away, a node set up with a wrong one, or someone guessing. The Telemetry health "
            "dashboard shows which site and path; the edge's audit stream (Loki tenant "
            f"{audit.EDGE_TENANT}) holds every request."
        ),
        severity="warning",
        data=[
            loki_query("A", refused, TimeRange("ALERT_EDGE_REFUSED_WINDOW_SECONDS")),
            reduce("B", "A", "last"),
            math("C", "$B >= ${ALERT_EDGE_REFUSED_MIN}"),
        ],
        condition="C",
        no_data_state="OK",
        no_data_reason="no request was refused for its credential in the window (the healthy case), or the "
        "stack has no edge (the local stack)",
        exec_err_state="KeepLast",
        exec_err_reason="the Loki store rule reports a failing Loki once; this rule keeps its last state",
        panel=PanelLink("telemetry-health", "Refused requests at the edge, by node"),
        pending="0s",  # the window is the duration already
        fired_by=("refused-credentials",),
    )


def backup_overdue() -> Rule:
    # One instance per host: the measurement is the stack's own (no node tags), one series per host.
    return Rule(
        uid="telemetry-backup-overdue",
        title="Backup overdue",
        # A NoData alert has neither the host label nor a value B: the if keeps the template from reading them.
        summary='{{ if .Labels.host }}No successful backup of {{ .Labels.host }} for {{ printf "%.0f" '
        '(index .Values "B").Value }} seconds{{ else }}No host reported its backups{{ end }}',
        description=(
            "{{ if .Labels.host }}Host {{ .Labels.host }} reported that its last successful backup ended {{ printf "
            '"%.0f" (index .Values "B").Value }} seconds ago (threshold ALERT_BACKUP_MAX_AGE_SECONDS): its '
            "scheduled backups fail or stopped running, and losing the host now loses what changed since."
            "{{ else }}No host reported its backups in the last ALERT_BACKUP_REPORT_WINDOW_SECONDS seconds: the "
            "backup role's report timers stopped, or cannot write to the metrics store.{{ end }} The host's "
            "backup journal tells why; the Telemetry health dashboard shows every host's age."
        ),
        severity="warning",
        data=[
            metrics_query(
                "A", q.last("age_seconds", "stack_backup", ("host",)), TimeRange("ALERT_BACKUP_REPORT_WINDOW_SECONDS")
            ),
            reduce("B", "A", "last"),
            threshold("C", "B", "gt", "ALERT_BACKUP_MAX_AGE_SECONDS"),
        ],
        condition="C",
        # Alerting by default; OK where no backup is scheduled (the local stack), which would fire forever.
        no_data_state=placeholder("ALERT_BACKUP_NO_REPORT_STATE"),
        no_data_reason="no host reported in the window: the report timers are not running, so nothing says "
        "whether any backup is taken (ALERT_BACKUP_NO_REPORT_STATE: Alerting, or OK where none is scheduled)",
        exec_err_state="KeepLast",
        exec_err_reason="the store rules report a failing metrics store once; this rule keeps its last state",
        panel=PanelLink("telemetry-health", "Time since the last successful backup, by host"),
        pending="0s",  # the age and the report window are durations already
        fired_by=("backup-overdue",),
    )


def groups(backend: Backend = "influxdb") -> dict[str, tuple[Rule, ...]]:
    """Group name to its rules, built for `backend`; a group is evaluated as one at ALERT_EVALUATION_SECONDS."""
    with building_for(backend):
        return {
            "nodes": (node_silent(), loss_diverging(), validator_window_stalled()),
            "resources": (gpu_memory_high(), host_memory_high(), host_disk_high()),
            "telemetry": (client_drops(), log_errors_above_baseline(), metrics_store_unavailable(), loki_unavailable()),
            "edge": (edge_refused_credentials(),),
            "stack": (backup_overdue(),),
        }


# Uids of rules that were provisioned once and are no more. Leaving a rule out of the files
# does not remove it from Grafana, which keeps evaluating it; the build lists these in the
# rules file's deleteRules, which Grafana deletes at every start (a no-op once gone).
RETIRED_RULE_UIDS: tuple[str, ...] = ()

# The rules as built for InfluxDB: their uids and faults are the same for either store.
GROUPS: dict[str, tuple[Rule, ...]] = groups()
RULES: tuple[Rule, ...] = tuple(rule for rules in GROUPS.values() for rule in rules)
