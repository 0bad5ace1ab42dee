"""Putting restored files in place: a store's directory replaced whole, or credentials filled in.

The restic snapshot is first restored into a directory of its own (the restore
step of restore.yml); these put its contents where the server reads them,
with the server stopped.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from .stores import copy_tree, same_owner


def _chown_tree(root: Path, owner: tuple[int, int]) -> None:
    os.chown(root, *owner)
    for base, dirs, files in os.walk(root):
        for name in dirs + files:
            os.lchown(Path(base) / name, *owner)


def replace_directory(source: Path, target: Path, owner: tuple[int, int] | None = None) -> int:
    """Make target's contents exactly source's (target's own server is stopped); returns files copied."""
    if not source.is_dir() or not any(source.iterdir()):
        raise ValueError(f"{source} is empty: refusing to replace {target} with nothing")
    target.mkdir(parents=True, exist_ok=True)
    for entry in target.iterdir():
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()
    count = copy_tree(source, target)
    if owner is not None:
        _chown_tree(target, owner)
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
            for parent in reversed(relative.parents[:-1]):
                if not (root / parent).exists():
                    (root / parent).mkdir()
                    shutil.copystat(source / parent, root / parent)
                    same_owner(source / parent, root / parent)
            shutil.copy2(path, destination)
            same_owner(path, destination)
            restored.append(destination)
    return restored
