#!/usr/bin/env python3
"""Backups of the stack's state, with the servers' own consistent copies.

One file, standard library only, because it runs wherever the state is: on a
production host (the Ansible backup role copies it there) and in a throw-away
container next to the local stack's volumes (compose/stack.sh). Subcommands:

  sqlite-backup SRC DEST     online copy of a live SQLite database (Grafana's
                             grafana.db) with SQLite's backup API, then checked
  sqlite-restore BACKUP DEST put a checked copy in place (the server is stopped)
  snapshot DIR ARCHIVE       tar.gz of a directory that may change meanwhile
                             (Loki's store, after POST /flush); --follow-links
                             archives what symbolic links point to (a
                             VictoriaMetrics snapshot is links to its parts)
  restore-snapshot ARCHIVE DIR   replace the contents of DIR with an archive
  flush URL                  ask Loki to write its in-memory chunks (POST /flush)
  vm-snapshot-create URL     a VictoriaMetrics snapshot (/snapshot/create); prints its name
  vm-snapshot-delete URL NAME    delete it (/snapshot/delete); both send the key of
                             -snapshotAuthKey from --auth-key-file in the POST body
  prune DIR --keep N         keep the N newest backup sets (named by stamp);
                             the <stamp>.partial sets of failed runs go too
  stamp                      print a new backup-set name (UTC, sortable)

Every file written holds secrets or user data: mode 0600.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import shutil
import sqlite3
import sys
import tarfile
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

STAMP = re.compile(r"^\d{8}T\d{6}Z$")
PARTIAL = re.compile(r"^\d{8}T\d{6}Z\.partial$")
# A file bigger than this is staged on disk, not in memory, while it is archived.
SPOOL_BYTES = 64 * 1024 * 1024


class BackupError(Exception):
    """A backup or restore step that must stop the run, with the reason."""


def new_stamp() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")  # noqa: UP017 (runs on Python 3.10)


def _private(path: Path) -> None:
    os.chmod(path, 0o600)


def _check_database(path: Path) -> None:
    """SQLite's own integrity check; a damaged copy is never kept or restored."""
    connection = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        result = connection.execute("PRAGMA integrity_check").fetchall()
    except sqlite3.DatabaseError as error:
        raise BackupError(f"{path} is not a usable SQLite database: {error}") from error
    finally:
        connection.close()
    if result != [("ok",)]:
        raise BackupError(f"{path} failed SQLite's integrity check: {result[:5]}")


def sqlite_backup(source: Path, destination: Path) -> None:
    """Copy a database that a server is using, as one consistent snapshot.

    sqlite3.Connection.backup copies page by page under SQLite's locking and
    restarts when the source changes meanwhile, so the copy is the state of one
    committed transaction (https://www.sqlite.org/backup.html). The source is
    opened read-only: the backup never writes to the live database.
    """
    if not source.is_file():
        raise BackupError(f"{source} does not exist")
    destination.parent.mkdir(parents=True, exist_ok=True)
    partial = destination.with_name(destination.name + ".partial")
    partial.unlink(missing_ok=True)
    reader = sqlite3.connect(f"file:{source}?mode=ro", uri=True, timeout=60)
    writer = sqlite3.connect(partial)
    try:
        _private(partial)
        reader.backup(writer)
    finally:
        writer.close()
        reader.close()
    _check_database(partial)
    partial.replace(destination)


def sqlite_restore(backup: Path, destination: Path) -> None:
    """Put a backup in place of a database whose server is stopped.

    The journal and WAL files of the replaced database belong to it and would be
    applied to the restored one, so they go too.
    """
    _check_database(backup)
    staged = destination.with_name(destination.name + ".restoring")
    shutil.copyfile(backup, staged)
    _private(staged)
    for suffix in ("-wal", "-shm", "-journal"):
        destination.with_name(destination.name + suffix).unlink(missing_ok=True)
    staged.replace(destination)


def snapshot(directory: Path, archive: Path, follow_links: bool = False) -> tuple[int, int]:
    """Archive a directory that its server may still be writing to.

    Each file is read completely first and then added with the size that was
    read, so a file that grows or shrinks meanwhile cannot corrupt the archive.
    A file removed meanwhile (compaction, retention) is left out. Returns
    (files archived, files that vanished).

    With `follow_links`, a symbolic link is archived as what it points to: a
    VictoriaMetrics snapshot (`/snapshot/create`) is a directory whose `data/small`,
    `data/big` and `indexdb` are relative links to hard-linked parts elsewhere in
    its data directory (VictoriaMetrics docs, "How to work with snapshots"), and
    restoring one means copying it with the links dereferenced.
    """
    if not directory.is_dir():
        raise BackupError(f"{directory} is not a directory")
    archive.parent.mkdir(parents=True, exist_ok=True)
    partial = archive.with_name(archive.name + ".partial")
    archived = vanished = 0
    with tarfile.open(partial, "w:gz") as tar:
        _private(partial)
        for root, dirs, files in os.walk(directory, followlinks=follow_links):
            dirs.sort()
            for name in sorted(dirs) + sorted(files):
                path = Path(root) / name
                arcname = str(path.relative_to(directory))
                try:
                    info = tar.gettarinfo(str(path.resolve() if follow_links else path), arcname)
                    if info.isfile():
                        with open(path, "rb") as source, tempfile.SpooledTemporaryFile(SPOOL_BYTES) as staged:
                            shutil.copyfileobj(source, staged)
                            info.size = staged.tell()
                            staged.seek(0)
                            tar.addfile(info, staged)
                        archived += 1
                    elif info.isdir() or info.issym():
                        tar.addfile(info)
                except FileNotFoundError:
                    vanished += 1
    partial.replace(archive)
    return archived, vanished


def _safe_members(tar: tarfile.TarFile, destination: Path) -> list[tarfile.TarInfo]:
    """Members that stay inside the destination: no absolute paths, no '..', no device files."""
    root = destination.resolve()
    members = []
    for member in tar.getmembers():
        target = (root / member.name).resolve()
        if member.name.startswith("/") or (target != root and root not in target.parents):
            raise BackupError(f"refusing archive member outside the destination: {member.name}")
        if member.islnk() or member.isdev():
            raise BackupError(f"refusing archive member of unexpected type: {member.name}")
        if member.issym() and (os.path.isabs(member.linkname) or ".." in Path(member.linkname).parts):
            raise BackupError(f"refusing symbolic link out of the archive: {member.name}")
        members.append(member)
    return members


def empty_directory(directory: Path) -> None:
    """Remove everything in directory (not the directory itself; a symbolic link is removed, not followed)."""
    for entry in directory.iterdir():
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()


def chown_tree(directory: Path, owner: tuple[int, int]) -> None:
    """Give directory and everything in it to owner (uid, gid); symbolic links themselves, not their targets."""
    for root, dirs, files in os.walk(directory):
        for name in dirs + files:
            os.lchown(Path(root) / name, *owner)
    os.chown(directory, *owner)


def restore_snapshot(archive: Path, directory: Path, owner: tuple[int, int] | None = None) -> int:
    """Replace the contents of directory (its server is stopped) with an archive."""
    directory.mkdir(parents=True, exist_ok=True)
    with tarfile.open(archive, "r:gz") as tar:
        members = _safe_members(tar, directory)
        empty_directory(directory)
        if hasattr(tarfile, "data_filter"):
            tar.extractall(directory, members=members, filter="data")
        else:  # Python without extraction filters: members were checked above.
            tar.extractall(directory, members=members)
    if owner is not None:
        chown_tree(directory, owner)
    return len(members)


def flush(url: str, timeout: float = 120.0) -> None:
    """POST /flush: Loki writes its in-memory chunks to the store and answers 204."""
    request = urllib.request.Request(url.rstrip("/") + "/flush", method="POST", data=b"")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            status = response.status
    except urllib.error.HTTPError as error:
        status = error.code
    except OSError as error:
        raise BackupError(f"Loki at {url} did not answer the flush: {error}") from error
    if status not in (200, 204):
        raise BackupError(f"Loki at {url} answered the flush with HTTP {status}")


def victoriametrics_snapshot(
    url: str, action: str, key_file: Path | None = None, name: str = "", timeout: float = 600.0
) -> str:
    """POST /snapshot/<action> (create or delete) and return the snapshot's name.

    The key of -snapshotAuthKey goes in the form body, which VictoriaMetrics reads
    as the authKey argument (lib/httpserver/httpserver.go, CheckAuthFlag): never
    in a URL or on a command line, where logs and `ps` would show it.
    """
    form = {"snapshot": name} if name else {}
    if key_file is not None:
        form["authKey"] = key_file.read_text().strip()
    request = urllib.request.Request(
        f"{url.rstrip('/')}/snapshot/{action}", method="POST", data=urllib.parse.urlencode(form).encode()
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            body = response.read()
    except urllib.error.HTTPError as error:
        detail = error.read().decode(errors="replace").strip()[:200]
        refused = f"VictoriaMetrics at {url} refused /snapshot/{action} (HTTP {error.code})"
        raise BackupError(f"{refused}: {detail}") from error
    except OSError as error:
        raise BackupError(f"VictoriaMetrics at {url} did not answer /snapshot/{action}: {error}") from error
    try:
        answer = json.loads(body)
    except ValueError as error:
        raise BackupError(f"VictoriaMetrics at {url} answered /snapshot/{action} with {body[:200]!r}") from error
    if answer.get("status") != "ok":
        raise BackupError(f"VictoriaMetrics at {url} did not {action} the snapshot: {answer}")
    return str(answer.get("snapshot") or name)


def prune(directory: Path, keep: int) -> list[Path]:
    """Delete all but the `keep` newest backup sets, and every set a failed run left unfinished.

    Only stamp-named entries are touched. A `<stamp>.partial` set is one whose run
    failed or was killed before it completed (a run renames its set when done), so
    it can never be restored and only holds disk space.
    """
    if keep < 1:
        raise BackupError("--keep must be 1 or more: a backup run never deletes its own backup")
    if not directory.is_dir():
        return []
    sets = sorted(p for p in directory.iterdir() if STAMP.match(p.name))
    removed = sets[:-keep] + sorted(p for p in directory.iterdir() if PARTIAL.match(p.name))
    for path in removed:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()
    return removed


def owner(text: str) -> tuple[int, int]:
    """`UID` or `UID:GID` (a command-line argument) as (uid, gid)."""
    uid, sep, gid = text.partition(":")
    if not uid.isdigit() or (sep and not gid.isdigit()):
        raise argparse.ArgumentTypeError(f"not UID or UID:GID: {text!r}")
    return int(uid), int(gid or uid)


def _give(path: Path, owner: tuple[int, int] | None) -> None:
    if owner is not None:
        os.chown(path, *owner)
        if path.parent.name and STAMP.match(path.parent.name):
            os.chown(path.parent, *owner)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    owner_help = "UID:GID to give the written files (when run as root in a helper container)"
    for name in ("sqlite-backup", "sqlite-restore"):
        command = commands.add_parser(name)
        command.add_argument("source", type=Path)
        command.add_argument("destination", type=Path)
        command.add_argument("--owner", type=owner, help=owner_help)
    command = commands.add_parser("snapshot")
    command.add_argument("directory", type=Path)
    command.add_argument("archive", type=Path)
    command.add_argument("--owner", type=owner, help=owner_help)
    command.add_argument("--follow-links", action="store_true", help="archive what symbolic links point to")
    command = commands.add_parser("restore-snapshot")
    command.add_argument("archive", type=Path)
    command.add_argument("directory", type=Path)
    command.add_argument("--owner", type=owner, help=owner_help)
    command = commands.add_parser("flush")
    command.add_argument("url")
    key_help = "the file holding VictoriaMetrics' -snapshotAuthKey"
    command = commands.add_parser("vm-snapshot-create")
    command.add_argument("url")
    command.add_argument("--auth-key-file", type=Path, help=key_help)
    command = commands.add_parser("vm-snapshot-delete")
    command.add_argument("url")
    command.add_argument("name")
    command.add_argument("--auth-key-file", type=Path, help=key_help)
    command = commands.add_parser("prune")
    command.add_argument("directory", type=Path)
    command.add_argument("--keep", type=int, required=True)
    commands.add_parser("stamp")
    args = parser.parse_args(argv)
    os.umask(0o077)
    try:
        if args.command == "sqlite-backup":
            sqlite_backup(args.source, args.destination)
            _give(args.destination, args.owner)
            print(f"backed up {args.source} to {args.destination}")
        elif args.command == "sqlite-restore":
            sqlite_restore(args.source, args.destination)
            _give(args.destination, args.owner)
            print(f"restored {args.destination} from {args.source}")
        elif args.command == "snapshot":
            archived, vanished = snapshot(args.directory, args.archive, args.follow_links)
            _give(args.archive, args.owner)
            print(f"archived {archived} files of {args.directory} to {args.archive} ({vanished} vanished meanwhile)")
        elif args.command == "restore-snapshot":
            count = restore_snapshot(args.archive, args.directory, args.owner)
            print(f"restored {count} entries into {args.directory}")
        elif args.command == "flush":
            flush(args.url)
            print(f"flushed {args.url}")
        elif args.command == "vm-snapshot-create":
            print(victoriametrics_snapshot(args.url, "create", args.auth_key_file))
        elif args.command == "vm-snapshot-delete":
            print(f"deleted snapshot {victoriametrics_snapshot(args.url, 'delete', args.auth_key_file, args.name)}")
        elif args.command == "prune":
            for path in prune(args.directory, args.keep):
                print(f"removed {path}")
        else:
            print(new_stamp())
    except BackupError as error:
        print(f"telemetry_backup: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
