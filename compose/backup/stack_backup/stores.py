"""Each store staged by its own consistent method into a directory restic then backs up.

Kinds (the `kind` of a store in the settings):
  command          a server's own backup command writes into the staging directory
                   (InfluxDB 2: `influx backup` in its container, which mounts it;
                   InfluxDB 1.x: `influxd backup -portable`); {staging} in argv is
                   replaced, env_files puts secrets in the child's environment only
  sqlite           SQLite's online backup API (Grafana's grafana.db)
  victoriametrics  a /snapshot/create snapshot (with -snapshotAuthKey), copied with
                   vmbackup when given, else its parts hard-linked (same disk) or
                   copied; the snapshot is deleted afterwards whatever happened
  paused-copy      the server frozen (`docker pause`), its directory copied, thawed
                   again whatever happened: a crash-consistent copy (Loki: chunks,
                   index and the WAL it replays at start)
  files            plain files and directories (the stack's credentials)
"""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys
from pathlib import Path

from .config import Store
from .space import tree_size

# compose/backup/telemetry_backup.py: the SQLite and VictoriaMetrics primitives the local stack uses too.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import telemetry_backup

DEFAULT_TIMEOUT = 6 * 3600.0


class StageError(Exception):
    """A store could not be staged; the message says which and why."""


def _run(store: str, what: str, argv: list[str], env: dict[str, str] | None = None, timeout: float = 600) -> None:
    try:
        result = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout, check=False)
    except FileNotFoundError as error:
        raise StageError(f"{store}: {what}: {argv[0]} not found") from error
    except subprocess.TimeoutExpired as error:
        raise StageError(f"{store}: {what} did not finish within {timeout:g} s") from error
    if result.returncode != 0:
        detail = (result.stderr or result.stdout).strip()[-800:]
        raise StageError(f"{store}: {what} failed (exit {result.returncode}): {detail}")


def same_owner(source: Path, copy: Path) -> None:
    """As root, give a copy its source's owner: a credential comes back readable by its server's user only."""
    if os.geteuid() == 0:
        status = os.lstat(source)
        os.lchown(copy, status.st_uid, status.st_gid)


def copy_tree(source: Path, target: Path, follow_links: bool = False, link: bool = False) -> int:
    """Copy a directory; with `link`, hard-link files instead where the disk allows (immutable parts).

    Returns the number of files. Symbolic links are kept as links unless `follow_links`.
    Modes are kept, and owners too when running as root (`same_owner`).
    """
    if not source.is_dir():
        raise StageError(f"{source} is not a directory")
    count = 0
    for root, dirs, files in os.walk(source, followlinks=follow_links):
        relative = Path(root).relative_to(source)
        destination = target / relative
        destination.mkdir(parents=True, exist_ok=True)
        shutil.copystat(root, destination)
        same_owner(Path(root), destination)
        dirs.sort()
        for name in list(dirs):
            path = Path(root) / name
            if path.is_symlink() and not follow_links:
                os.symlink(os.readlink(path), destination / name)
                same_owner(path, destination / name)
                dirs.remove(name)
        for name in files:
            path = Path(root) / name
            if path.is_symlink() and not follow_links:
                os.symlink(os.readlink(path), destination / name)
                same_owner(path, destination / name)
                continue
            real = path.resolve() if follow_links else path
            if link:
                try:
                    os.link(real, destination / name)
                    count += 1
                    continue
                except OSError as error:
                    if error.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK):
                        raise
            shutil.copy2(real, destination / name)
            same_owner(real, destination / name)
            count += 1
    return count


def _secret_env(store: Store) -> dict[str, str]:
    env = dict(os.environ)
    for name, path in (store.settings.get("env_files") or {}).items():
        try:
            env[name] = Path(path).read_text().strip()
        except OSError as error:
            raise StageError(f"{store.name}: cannot read {name} from {path}: {error.strerror}") from error
    return env


def _stage_command(store: Store, target: Path) -> None:
    argv = [arg.replace("{staging}", str(target)) for arg in store.settings["argv"]]
    timeout = float(store.settings.get("timeout_seconds", DEFAULT_TIMEOUT))
    _run(store.name, "the backup command", argv, env=_secret_env(store), timeout=timeout)
    if not any(target.iterdir()):
        raise StageError(f"{store.name}: the backup command wrote nothing into {target}")


def _stage_sqlite(store: Store, target: Path) -> None:
    source = Path(store.settings["path"])
    try:
        telemetry_backup.sqlite_backup(source, target / source.name)
    except (telemetry_backup.BackupError, OSError) as error:
        raise StageError(f"{store.name}: {error}") from error


def _stage_victoriametrics(store: Store, target: Path) -> None:
    url = store.settings["url"]
    data_dir = Path(store.settings["data_dir"])
    key = store.settings.get("auth_key_file") or None
    key_file = Path(key) if key else None
    try:
        name = telemetry_backup.victoriametrics_snapshot(url, "create", key_file)
    except (telemetry_backup.BackupError, OSError) as error:
        raise StageError(f"{store.name}: {error}") from error
    try:
        vmbackup = store.settings.get("vmbackup") or ""
        if vmbackup:
            argv = [vmbackup, f"-storageDataPath={data_dir}", f"-snapshotName={name}", f"-dst=fs://{target}"]
            _run(store.name, "vmbackup", argv, timeout=float(store.settings.get("timeout_seconds", DEFAULT_TIMEOUT)))
        else:
            # The snapshot's parts are immutable hard links into the data directory.
            copy_tree(data_dir / "snapshots" / name, target, follow_links=True, link=True)
    finally:
        try:
            telemetry_backup.victoriametrics_snapshot(url, "delete", key_file, name)
        except telemetry_backup.BackupError as error:
            print(f"stack_backup: {store.name}: snapshot {name} left behind: {error}", file=sys.stderr)


def _stage_paused_copy(store: Store, target: Path) -> None:
    data_dir = Path(store.settings["data_dir"])
    if not data_dir.is_dir():
        raise StageError(f"{store.name}: {data_dir} is not a directory")
    _run(store.name, "pausing the server", store.settings["pause"])
    try:
        copy_tree(data_dir, target)
    finally:
        _run(store.name, "resuming the server", store.settings["resume"])


def _stage_files(store: Store, target: Path) -> None:
    for path in store.paths("paths"):
        if not path.exists():
            raise StageError(f"{store.name}: {path} does not exist")
        relative = path.relative_to(path.anchor)
        destination = target / relative
        make_parents_like(relative, Path(path.anchor), target)  # the directories above it, as on the host
        if path.is_dir():
            copy_tree(path, destination)
        else:
            shutil.copy2(path, destination)
            same_owner(path, destination)


def make_parents_like(relative: Path, source_root: Path, target_root: Path) -> None:
    """Make the directories above `relative` missing under target_root, each with the mode and owner of the
    same directory under source_root."""
    for parent in reversed(relative.parents[:-1]):
        made = target_root / parent
        if not made.exists():
            made.mkdir()
            shutil.copystat(source_root / parent, made)
            same_owner(source_root / parent, made)


STAGERS = {
    "command": _stage_command,
    "sqlite": _stage_sqlite,
    "victoriametrics": _stage_victoriametrics,
    "paused-copy": _stage_paused_copy,
    "files": _stage_files,
}


def stage(store: Store, target: Path) -> None:
    """Write the store's consistent copy into the (empty, existing) target directory."""
    STAGERS[store.kind](store, target)


def expected_size(store: Store, staging: Path) -> int:
    """Bytes the staging copy of the store will take, from the size of its data."""
    settings = store.settings
    if store.kind == "command":
        return sum(tree_size(p) for p in store.paths("size_paths"))
    if store.kind == "sqlite":
        return tree_size(Path(settings["path"]))
    if store.kind == "files":
        return sum(tree_size(p) for p in store.paths("paths"))
    data_dir = Path(settings["data_dir"])
    if store.kind == "victoriametrics" and not settings.get("vmbackup"):
        try:
            if data_dir.stat().st_dev == staging.stat().st_dev:
                return 0  # hard links
        except FileNotFoundError:
            return 0
    return tree_size(data_dir)
