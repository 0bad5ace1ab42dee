"""Putting restored files in place: a store's directory replaced whole, or credentials filled in.

The restic snapshot is first restored into a directory of its own (the restore
step of restore.yml); these put its contents where the server reads them,
with the server stopped.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import telemetry_backup

from .stores import copy_tree, make_parents_like, same_owner


def replace_directory(source: Path, target: Path, owner: tuple[int, int] | None = None) -> int:
    """Make target's contents exactly source's (target's own server is stopped); returns files copied."""
    if not source.is_dir() or not any(source.iterdir()):
        raise ValueError(f"{source} is empty: refusing to replace {target} with nothing")
    target.mkdir(parents=True, exist_ok=True)
    telemetry_backup.empty_directory(target)
    count = copy_tree(source, target)
    if owner is not None:
        telemetry_backup.chown_tree(target, owner)
    return count


def fill_missing(source: Path, root: Path = Path("/")) -> list[Path]:
    """Copy each file of source (a files store: absolute paths below it) to its place unless one is there.

    A credential that exists on the host is newer than any backup (rotations),
    so only what the host lost comes back. Each file, and each directory made
    for it, gets the mode and owner it had when it was backed up.
    """
    restored = []
    for base, _dirs, files in os.walk(source):
        for name in files:
            path = Path(base) / name
            relative = path.relative_to(source)
            destination = root / relative
            if destination.exists():
                continue
            make_parents_like(relative, source, root)
            shutil.copy2(path, destination)
            same_owner(path, destination)
            restored.append(destination)
    return restored
