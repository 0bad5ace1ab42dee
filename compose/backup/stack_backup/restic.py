"""The restic repository: created on first use, a snapshot per store, retention, restores.

restic (https://restic.net, Debian package `restic`) encrypts and authenticates
everything it writes with the repository password (AES-256 in counter mode with
Poly1305-AES) and deduplicates by content-defined chunks, so a daily copy of a
store costs only what changed. The password reaches restic as a file
(RESTIC_PASSWORD_FILE), never on a command line.
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from .config import Config


class ResticError(Exception):
    """restic failed; the message has the command (never a secret) and restic's own words."""


@dataclass
class BackupResult:
    snapshot_id: str
    added_bytes: int
    files: int


def _env_file(path: Path) -> dict[str, str]:
    """KEY=VALUE lines (e.g. AWS_ACCESS_KEY_ID for an s3: repository); # starts a comment."""
    values = {}
    for number, line in enumerate(path.read_text().splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        if not sep or not key.strip():
            raise ResticError(f"{path} line {number} is not KEY=VALUE")
        values[key.strip()] = value.strip()
    return values


class Restic:
    """restic against the configured repository, as this host."""

    def __init__(self, config: Config, timeout: float = 24 * 3600) -> None:
        self.config = config
        self.timeout = timeout

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        if self.config.repository_env_file is not None:
            env.update(_env_file(self.config.repository_env_file))
        env["RESTIC_REPOSITORY"] = self.config.repository
        env["RESTIC_PASSWORD_FILE"] = str(self.config.password_file)
        env.pop("RESTIC_PASSWORD", None)
        env.pop("RESTIC_PASSWORD_COMMAND", None)
        return env

    def run(self, *args: str, cwd: Path | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
        options = [arg for option in self.config.restic_options for arg in ("-o", option)]
        argv = [self.config.restic, *options, *args]
        try:
            result = subprocess.run(
                argv, env=self._env(), cwd=cwd, capture_output=True, text=True, timeout=self.timeout, check=False
            )
        except FileNotFoundError as error:
            raise ResticError(f"{self.config.restic} is not installed (Debian package restic)") from error
        except subprocess.TimeoutExpired as error:
            raise ResticError(f"restic {args[0]} did not finish within {self.timeout:g} s") from error
        if check and result.returncode != 0:
            raise ResticError(f"restic {args[0]} failed (exit {result.returncode}): {result.stderr.strip()[-1500:]}")
        return result

    def ensure_repository(self) -> bool:
        """Create the repository unless it exists; True when it was created.

        `restic init` refuses a location that already holds a repository, so an
        unreachable one is never overwritten, only reported.
        """
        if not self.config.password_file.is_file():
            raise ResticError(f"the repository password file {self.config.password_file} does not exist")
        if self.run("cat", "config", check=False).returncode == 0:
            return False
        self.run("init")
        return True

    def backup(self, directory: Path, store: str, tags: list[str] | None = None) -> BackupResult:
        """A snapshot of directory's contents (stored at its root), tagged with the store (and tags), as this host."""
        extra = [arg for tag in tags or [] for arg in ("--tag", tag)]
        result = self.run(
            "backup", "--json", "--host", self.config.host, "--tag", f"store={store}", *extra, ".", cwd=directory
        )
        summary = None
        for line in result.stdout.splitlines():
            if line.startswith("{") and '"summary"' in line:
                summary = json.loads(line)
        if summary is None:
            raise ResticError(f"restic backup of {store} printed no summary: {result.stdout[-500:]}")
        return BackupResult(
            snapshot_id=summary["snapshot_id"],
            added_bytes=int(summary.get("data_added", 0)),
            files=int(summary.get("total_files_processed", 0)),
        )

    def forget(self) -> str:
        """Retention by age and count of this host's snapshots, then prune what nothing references.

        restic groups snapshots by host and paths: each store (its own staging
        path) keeps its own keep_within and keep_last.
        """
        result = self.run(
            "forget",
            "--host",
            self.config.host,
            "--keep-within",
            self.config.keep_within,
            "--keep-last",
            str(self.config.keep_last),
            "--prune",
        )
        return result.stdout

    def snapshots(self, store: str | None = None, host: str | None = None) -> list[dict]:
        args = ["snapshots", "--json", "--host", host or self.config.host]
        if store:
            args += ["--tag", f"store={store}"]
        return json.loads(self.run(*args).stdout or "[]")

    def choose(self, store: str, snapshot: str = "latest", host: str | None = None) -> dict:
        """The snapshot of the store to restore: the newest, or the one whose id starts with `snapshot`."""
        found = sorted(self.snapshots(store, host), key=lambda s: s["time"])
        if snapshot != "latest":
            found = [s for s in found if s["id"].startswith(snapshot)]
        if not found:
            raise ResticError(f"no snapshot {snapshot} of {store} from {host or self.config.host} in the repository")
        return found[-1]

    def restore(
        self,
        store: str,
        target: Path,
        snapshot: str = "latest",
        host: str | None = None,
        expect: list[str] | None = None,
    ) -> str:
        """Put a snapshot of the store into target (the store's staging layout, not its live place).

        `expect` lists KEY=VALUE tags the snapshot must carry with these values
        (the image versions it was taken with): a snapshot with another value is
        refused before anything is restored. Returns the snapshot's id.
        """
        chosen = self.choose(store, snapshot, host)
        tags = {t.partition("=")[0]: t.partition("=")[2] for t in chosen.get("tags") or [] if "=" in t}
        for wanted in expect or []:
            key, _, value = wanted.partition("=")
            if key in tags and tags[key] != value:
                raise ResticError(
                    f"snapshot {chosen['short_id']} of {store} was taken with {key}={tags[key]}, but {value} is "
                    "pinned now: pin the backup's version, deploy it, then restore (docs/deployment.md)"
                )
        target.mkdir(parents=True, exist_ok=True)
        self.run("restore", chosen["id"], "--target", str(target))
        return chosen["id"]
