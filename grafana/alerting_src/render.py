"""Fill the settings into the generated alerting files, as every deployment does before Grafana reads them.

grafana/alerting/ holds the files with `${ALERT_...}` placeholders; Grafana would not
expand them inside a query model (grafana/grafana pkg/services/provisioning/alerting/
rules_types.go passes Model.Raw on), so they are replaced first: here (the simulator
and the tests), in compose/grafana/entrypoint.sh (the local stack) and in the Ansible
grafana role (production). All three do the same: replace each known placeholder by
its checked value, refuse an unknown one, keep the contact point files only when
their address is configured (Grafana refuses a contact point without one, and with
none configured the alerts still show in Grafana), and add the retire files that
delete what an unset address left in Grafana (`selected_files`).

The contact points' addresses are not filled in here: Grafana expands
`${ALERTING_WEBHOOK_URL}` and `${ALERTING_EMAIL_ADDRESSES}` in contact point settings
itself (since 9.1.7, grafana/grafana#55666), so a secret webhook URL stays in
Grafana's environment and is never written to a file.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

from grafana.alerting_src import settings as st

PLACEHOLDER = re.compile(r"\$\{(ALERT_[A-Z0-9_]+)\}")
RULES_FILE = "rules.yaml"
# File name to the environment variable that must be set for Grafana to get it.
CONTACT_FILES: dict[str, str] = {
    "contact-point-webhook.yaml": "ALERTING_WEBHOOK_URL",
    "contact-point-email.yaml": "ALERTING_EMAIL_ADDRESSES",
}
POLICY_FILE = "policies.yaml"
# Grafana's provisioning never deletes what a file no longer holds: a contact point
# file left out leaves its integration in place. With another address still set, the
# retire file of the unset one deletes its integration; with none set, nothing is
# deleted unless RETIRE_SWITCH is "true": then the policy tree goes back to Grafana's
# default (RESET_FILE, which also undoes a policy made in Grafana's UI) and both
# integrations are deleted.
RETIRE_FILES: dict[str, str] = {name: f"retire-{name}" for name in CONTACT_FILES}
RESET_FILE = "reset-policies.yaml"
RETIRE_SWITCH = "ALERTING_RETIRE_CONTACT_POINTS"


def fill(text: str, values: Mapping[str, str]) -> str:
    """Replace every ${ALERT_...} by its value; ValueError for a placeholder no setting defines."""

    def value(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in values:
            raise ValueError(f"unknown alert setting ${{{name}}} in the alerting files")
        return values[name]

    return PLACEHOLDER.sub(value, text)


def selected_files(environment: Mapping[str, str]) -> list[str]:
    """Which generated files a Grafana with this environment gets."""
    contacts = [name for name, variable in CONTACT_FILES.items() if environment.get(variable, "").strip()]
    if contacts:
        return [RULES_FILE, *contacts, POLICY_FILE, *(RETIRE_FILES[n] for n in CONTACT_FILES if n not in contacts)]
    if environment.get(RETIRE_SWITCH, "").strip() == "true":
        return [RULES_FILE, RESET_FILE, *RETIRE_FILES.values()]
    return [RULES_FILE]


def render_dir(
    source: Path, target: Path, overrides: Mapping[str, str] | None = None, environment: Mapping[str, str] = {}
) -> list[Path]:
    """Write the rendered files of `source` into `target` (created); returns the files written."""
    values = st.resolve(dict(overrides or {}))
    target.mkdir(parents=True, exist_ok=True)
    written = []
    for name in selected_files(environment):
        path = target / name
        path.write_text(fill((source / name).read_text(encoding="utf-8"), values), encoding="utf-8")
        written.append(path)
    return written
