"""Every threshold and duration of the alert rules, with its default and what it means.

Defaults fit a network of a few hundred nodes whose miners log a step every few
seconds to a minute and whose windows last a few minutes. `simulated` is the value
`python -m simulator` evaluates the rules with, so that a run of a minute or less
shows every rule fire on its fault (the simulator scales the windows to the run).

Durations are whole seconds (Grafana's relativeTimeRange takes seconds); numbers are
plain decimals; a choice is one of its `choices`. All are checked wherever the files
are rendered, and so is what Grafana itself refuses, which would stop it from starting
(its provisioning error is fatal; grafana/grafana, the version pinned in versions.env):

- a rule group's interval must be above 0 and a multiple of the scheduler's base
  interval, 10 s (pkg/services/ngalert/models/alert_rule.go ValidateRuleGroupInterval;
  SchedulerBaseInterval in pkg/setting/setting_unified_alerting.go);
- every data query's relativeTimeRange must start before it ends, `from` > `to`
  (pkg/services/ngalert/models/alert_query.go, AlertQuery.PreSave; expressions are
  exempt). Which settings bound which query is read from the rules themselves
  (`time_ranges`), so a window must be above 0 and a baseline above its window.

compose/grafana/entrypoint.sh checks the same, from the constraints
grafana/build_alerting.py writes into settings.env.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

PREFIX = "ALERT_"
# No leading zeros: a YAML reader may take 010 for an octal number.
WHOLE = re.compile(r"^(0|[1-9][0-9]*)$")
NUMBER = re.compile(r"^(0|[1-9][0-9]*)(\.[0-9]+)?$")
PLACEHOLDER = re.compile(r"^\$\{(ALERT_[A-Z0-9_]+)\}$")
# Grafana's scheduler ticks every 10 s; a rule group's interval must be a multiple of it.
BASE_INTERVAL_SECONDS = 10


@dataclass(frozen=True)
class Setting:
    name: str
    default: str
    kind: str  # "seconds" or "count" (whole numbers), "number" (decimals), or "choice"
    description: str
    simulated: str | None = None  # None: the simulator derives it from the run (see simulator/alerting.py)
    choices: tuple[str, ...] = ()
    multiple_of: int = 0  # seconds: above 0 and a multiple of this
    positive: bool = False  # seconds: above 0
    why: str = ""  # what breaks when `multiple_of` or `positive` is not met

    def check(self, value: str) -> str:
        """The value as it goes into the files; ValueError with the setting's name when it is malformed."""
        text = str(value).strip()
        if self.kind == "choice":
            if text not in self.choices:
                raise ValueError(f"{self.name} must be one of {', '.join(self.choices)}, got {value!r}")
            return text
        pattern = NUMBER if self.kind == "number" else WHOLE
        if not pattern.match(text) or (self.kind == "count" and int(text) == 0):
            what = {"number": "a non-negative decimal number", "count": "a whole number above 0"}.get(
                self.kind, "a whole number of seconds"
            )
            raise ValueError(f"{self.name} must be {what}, got {value!r}")
        if self.multiple_of and (int(text) == 0 or int(text) % self.multiple_of):
            raise ValueError(f"{self.name} must be a multiple of {self.multiple_of} above 0 ({self.why}), got {text}")
        if self.positive and int(text) == 0:
            raise ValueError(f"{self.name} must be above 0 ({self.why}), got {text}")
        return text

    def constraints(self) -> list[str]:
        """What `check` asks beyond the kind, as settings.env states it for the entrypoint and the Ansible role."""
        return (
            [f"one of {' '.join(self.choices)}"] * bool(self.choices)
            + [f"a multiple of {self.multiple_of}"] * bool(self.multiple_of)
            + ["above 0"] * self.positive
        )


SETTINGS: tuple[Setting, ...] = (
    Setting(
        "ALERT_WEBHOOK_TYPE",
        "webhook",
        "choice",
        "kind of ALERTING_WEBHOOK_URL: discord, slack (an incoming webhook) or webhook (any JSON receiver)",
        choices=("discord", "slack", "webhook"),
    ),
    Setting(
        "ALERT_EVALUATION_SECONDS",
        "60",
        "seconds",
        "how often Grafana evaluates every rule",
        multiple_of=BASE_INTERVAL_SECONDS,
        why="every rule group's interval; Grafana refuses to start on any other",
    ),
    Setting(
        "ALERT_PENDING_SECONDS",
        "300",
        "seconds",
        "how long a threshold rule's condition must hold before it fires (the rules' `for`)",
        "0",
    ),
    Setting(
        "ALERT_NODE_SILENT_STEP_SECONDS",
        "60",
        "seconds",
        "node silent: resolution of the silence check (points are counted per step)",
        "1",
        positive=True,
        why="InfluxQL's moving_average needs a GROUP BY time interval: the rule would fail at every evaluation",
    ),
    Setting(
        "ALERT_NODE_SILENT_STEPS",
        "10",
        "count",
        "node silent: a node fires after this many steps without a point (10 x 60 s = 10 min)",
        "3",
    ),
    Setting(
        "ALERT_NODE_SILENT_LOOKBACK_SECONDS",
        "3600",
        "seconds",
        "node silent: only nodes that reported within this time are watched; a node gone longer resolves",
    ),
    Setting("ALERT_LOSS_WINDOW_SECONDS", "600", "seconds", "loss: the recent window compared to the baseline", "3"),
    Setting(
        "ALERT_LOSS_BASELINE_SECONDS",
        "3600",
        "seconds",
        "loss: the baseline starts this long ago and ends where the recent window starts",
    ),
    Setting("ALERT_LOSS_JUMP_RATIO", "1.5", "number", "loss: fires when the recent mean exceeds baseline x ratio"),
    Setting(
        "ALERT_WINDOW_STALL_SECONDS",
        "1200",
        "seconds",
        "validator window: fires when a scoring validator's window did not change for this long",
        "4",
    ),
    Setting("ALERT_GPU_MEMORY_PERCENT", "95", "number", "GPU: device memory in use, percent of the device"),
    Setting("ALERT_HOST_MEMORY_PERCENT", "95", "number", "host: memory in use, percent of what is available"),
    Setting("ALERT_HOST_DISK_PERCENT", "90", "number", "host: disk in use, percent of the working directory's disk"),
    Setting("ALERT_RESOURCE_WINDOW_SECONDS", "300", "seconds", "GPU and host: window of the readings", "3"),
    Setting("ALERT_DROPS_WINDOW_SECONDS", "900", "seconds", "drops: window in which drops are added up", "4"),
    Setting("ALERT_DROPS_MIN", "1", "number", "drops: fires at this many dropped records in the window per process"),
    Setting("ALERT_LOG_ERRORS_WINDOW_SECONDS", "300", "seconds", "log errors: the recent window", "3"),
    Setting(
        "ALERT_LOG_ERRORS_BASELINE_SECONDS",
        "3600",
        "seconds",
        "log errors: the baseline starts this long ago and ends where the recent window starts",
    ),
    Setting(
        "ALERT_LOG_ERRORS_RATIO",
        "3",
        "number",
        "log errors: fires when a node's error and critical lines exceed ratio x the fleet's per-node baseline",
    ),
    Setting(
        "ALERT_LOG_ERRORS_MIN",
        "20",
        "number",
        "log errors: ... and exceed this many lines in the recent window (quiet nodes stay quiet)",
    ),
    Setting(
        "ALERT_EDGE_REFUSED_WINDOW_SECONDS",
        "300",
        "seconds",
        "edge: window in which the requests the edge refused for their credential (401) are counted, per address",
    ),
    Setting(
        "ALERT_EDGE_REFUSED_MIN",
        "100",
        "number",
        "edge: fires at this many refused requests from one address in the window",
        "10",
    ),
    Setting(
        "ALERT_BACKUP_MAX_AGE_SECONDS",
        "93600",
        "seconds",
        "backups: fires when a host's latest report says its last successful backup ended longer ago than "
        "this (26 h: a daily backup, its randomized delay and its run time)",
        "93600",
    ),
    Setting(
        "ALERT_BACKUP_REPORT_WINDOW_SECONDS",
        "2700",
        "seconds",
        "backups: fires when no host reported its backups in this window (a report comes every 15 minutes)",
    ),
    Setting(
        "ALERT_BACKUP_NO_REPORT_STATE",
        "Alerting",
        "choice",
        "backups: what the rule shows when no host reported in ALERT_BACKUP_REPORT_WINDOW_SECONDS: Alerting (it "
        "fires), or OK for a stack whose backups are not scheduled (the local one sets OK)",
        "Alerting",
        choices=("Alerting", "OK"),
    ),
    Setting(
        "ALERT_STORE_WINDOW_SECONDS",
        "600",
        "seconds",
        "stores: fires when InfluxDB or Loki errors, or holds nothing from any node in this window",
    ),
)

BY_NAME: dict[str, Setting] = {s.name: s for s in SETTINGS}


def defaults() -> dict[str, str]:
    return {s.name: s.default for s in SETTINGS}


@dataclass(frozen=True)
class Window:
    """A data query's relativeTimeRange as settings: from `start` to `end` seconds ago ("0" or a setting)."""

    start: str
    end: str
    rules: tuple[str, ...]  # uids of the rules with a query over it

    @property
    def constraint(self) -> str:
        """As settings.env states it: `above <end> for <rule> <rule>`."""
        return f"above {self.end} for {' '.join(self.rules)}"


def time_ranges() -> list[Window]:
    """Every distinct (from, to) of the rules' data queries that names a setting, with the rules using it."""
    from grafana.alerting_src.rules import RULES  # the rules are built from the builder, which needs no settings

    def bound(value: object) -> str:
        match = PLACEHOLDER.match(str(value))
        return match.group(1) if match else str(value)

    found: dict[tuple[str, str], list[str]] = {}
    for rule in RULES:
        for query in rule.data:
            if query["datasourceUid"] == "__expr__":
                continue  # Grafana checks the time range of data queries only
            window = query["relativeTimeRange"]
            users = found.setdefault((bound(window["from"]), bound(window["to"])), [])
            if rule.uid not in users:
                users.append(rule.uid)
    return [Window(start, end, tuple(rules)) for (start, end), rules in found.items() if start in BY_NAME]


def check_windows(values: Mapping[str, str]) -> None:
    """ValueError naming the setting and the rules when a query's window would not start before it ends."""
    for window in time_ranges():
        start, end = int(values[window.start]), int(values.get(window.end, window.end))
        if start <= end:
            bound = "0" if window.end == "0" else f"{window.end} ({end})"
            raise ValueError(
                f"{window.start} ({start}) must be above {bound} for {', '.join(window.rules)}: "
                "a query's window must start before it ends, and Grafana refuses to start otherwise"
            )


def resolve(overrides: dict[str, str] | None = None) -> dict[str, str]:
    """Every setting's value: the defaults with `overrides` on top, each checked, then the windows they bound."""
    values = defaults()
    for name, value in (overrides or {}).items():
        if name not in BY_NAME:
            raise ValueError(f"unknown alert setting {name}; known: {', '.join(sorted(BY_NAME))}")
        if value not in (None, ""):
            values[name] = value
    checked = {name: BY_NAME[name].check(value) for name, value in values.items()}
    check_windows(checked)
    return checked
