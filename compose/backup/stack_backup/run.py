"""A backup run: every store staged, sent to restic and unstaged, one at a time, under the lock.

Order per store: free-space check against the store's size, stage, `restic
backup`, and the staging copy removed whatever happened. A store that fails
does not stop the others; the run then fails and last_success stays where it
was. Retention (`restic forget --prune`) runs after a run whose stores all
succeeded. Whatever an earlier run left in the staging directory (killed
midway, power loss) is removed first.
"""

from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path

from . import lock, state, stores
from .config import Config, shown_repository
from .restic import Restic, ResticError
from .space import NoSpace, require_free


class PartialRunFailed(Exception):
    """A run of some stores only (`--store`) failed."""


def _empty(directory: Path) -> list[str]:
    """Remove everything inside directory (the staging directory is the tool's alone)."""
    removed = []
    for entry in sorted(directory.iterdir()):
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()
        removed.append(entry.name)
    return removed


def _say(message: str) -> None:
    print(f"stack_backup: {message}", flush=True)


def report(config: Config, current: state.State | None = None, now: float | None = None) -> str:
    """Write this host's stack_backup point to the metrics store (when a URL is set); returns the line.

    With a state file that cannot be read (state.StateError, raised after the
    point is written), the point says the last run failed and counts the age from
    the file's last change: runs stop writing it, so the host ages into the
    overdue alert, where a host that stopped reporting would only drop out of it.
    """
    now = time.time() if now is None else now
    unusable = None
    if current is None:
        try:
            current = state.load(config.state_file, now)
        except state.StateError as error:
            unusable = error
            current = state.State(installed=_changed_at(config.state_file, now), last_error=str(error))
    line = state.metric_line(config.host, current, now)
    if config.report.url:
        state.write_metric(config.report, line)
    if unusable is not None:
        raise unusable
    return line


def _changed_at(path: Path, now: float) -> float:
    """When `path` last changed; `now` if that cannot be told."""
    try:
        return path.stat().st_mtime
    except OSError:
        return now


def backup(config: Config, only: list[str] | None = None) -> state.State:
    """One run (see the module docstring); returns the saved state. Raises lock.Busy if a run is going on.

    `only` backs up those stores alone (a backup before an image change): such a
    run is logged, but the state and its metric speak of complete runs only.
    """
    unknown = sorted(set(only or []) - {s.name for s in config.stores})
    if unknown:
        raise ValueError(f"no store named {', '.join(unknown)} in the settings")
    with lock.exclusive(config.lock_file):
        current = state.load(config.state_file)
        started = time.time()
        errors: list[str] = []
        added = 0
        outcome: dict[str, dict] = {}
        staging = config.staging_dir
        staging.mkdir(mode=0o700, parents=True, exist_ok=True)
        staging.chmod(0o700)
        leftovers = _empty(staging)
        if leftovers:
            _say(f"removed what an earlier run left in {staging}: {', '.join(leftovers)}")
        repository = Restic(config)
        try:
            if repository.ensure_repository():
                _say(f"created the restic repository {shown_repository(config.repository)}")
        except ResticError as error:
            errors.append(str(error))
        chosen = [s for s in config.stores if not only or s.name in only]
        for store in chosen if not errors else []:
            target = staging / store.name
            began = time.time()
            try:
                require_free(
                    staging,
                    store.name,
                    stores.expected_size(store, staging),
                    config.space_margin,
                    config.space_reserve_bytes,
                )
                target.mkdir(mode=0o700)
                stores.stage(store, target)
                result = repository.backup(target, store.name, store.settings.get("tags"))
                added += result.added_bytes
                outcome[store.name] = {
                    "ok": True,
                    "snapshot": result.snapshot_id,
                    "added_bytes": result.added_bytes,
                    "files": result.files,
                    "seconds": round(time.time() - began, 3),
                }
                _say(f"{store.name}: snapshot {result.snapshot_id}, {result.files} files, {result.added_bytes} B new")
            except (stores.StageError, NoSpace, ResticError, OSError) as error:
                errors.append(str(error))
                outcome[store.name] = {"ok": False, "error": str(error)}
                print(f"stack_backup: {error}", file=sys.stderr, flush=True)
            finally:
                if target.exists():
                    shutil.rmtree(target)
        stored = not errors
        if stored and not only:  # retention after complete runs only (docs/deployment.md)
            try:
                repository.forget()
            except ResticError as error:
                errors.append(f"retention: {error}")
        ended = time.time()
        if only:
            if errors:
                raise PartialRunFailed("; ".join(errors))
            return current
        current.last_run = ended
        current.last_run_ok = not errors
        current.last_duration_seconds = round(ended - started, 3)
        current.added_bytes = added
        current.last_error = "; ".join(errors)[:2000]
        current.stores = outcome
        if stored:
            current.last_success = ended
        state.save(config.state_file, current)
        return current
