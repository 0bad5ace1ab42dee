"""Command line: python3 -m stack_backup {run,report,restore,snapshots,check-config} --config FILE.

Exit status: 0 done; 1 a failed backup, restore or check; 2 the backup worked
but its metric could not be written; 3 another run holds the lock.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import telemetry_backup

from . import config as settings
from . import lock, putback, run, state
from .restic import Restic, ResticError


def _fail(message: str, code: int = 1) -> int:
    print(f"stack_backup: {message}", file=sys.stderr, flush=True)
    return code


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="stack_backup", description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, required=True, help="the settings file (JSON) the backup role renders")
    commands = parser.add_subparsers(dest="command", required=True)
    backup = commands.add_parser("run", help="back up every store, apply retention, report")
    backup.add_argument("--store", action="append", help="only this store (repeatable; state and metric untouched)")
    commands.add_parser("report", help="write this host's stack_backup metric now")
    commands.add_parser("check-config", help="check the settings file and say what it backs up")
    listing = commands.add_parser("snapshots", help="this host's snapshots as JSON")
    listing.add_argument("--store")
    restore = commands.add_parser("restore", help="put a store's snapshot into a directory")
    restore.add_argument("--store", required=True)
    restore.add_argument("--target", type=Path, required=True)
    restore.add_argument("--snapshot", default="latest")
    restore.add_argument("--host", help="the host that made the snapshot (default: this one)")
    restore.add_argument(
        "--expect-tag", action="append", help="KEY=VALUE the snapshot must carry if it has KEY (an image version)"
    )
    put = commands.add_parser("put-back", help="put a restored store in place (its server stopped)")
    put.add_argument("--source", type=Path, required=True, help="where `restore` put the store")
    put.add_argument("--target", type=Path, required=True, help="the store's directory, replaced whole")
    put.add_argument("--owner", type=telemetry_backup.owner, help="UID or UID:GID the files get")
    fill = commands.add_parser("fill-missing", help="copy restored credentials back where the host lost them")
    fill.add_argument("--source", type=Path, required=True)
    fill.add_argument("--root", type=Path, default=Path("/"), help="prefix of the absolute paths (render root)")
    args = parser.parse_args(argv)
    os.umask(0o077)
    try:
        config = settings.load(args.config)
    except settings.ConfigError as error:
        return _fail(f"{args.config}: {error}")
    if args.command == "check-config":
        stores = ", ".join(f"{s.name} ({s.kind})" for s in config.stores)
        print(f"{config.host}: {stores} -> restic {settings.shown_repository(config.repository)}")
        return 0
    if args.command == "snapshots":
        try:
            print(json.dumps(Restic(config).snapshots(args.store), indent=2))
        except ResticError as error:
            return _fail(str(error))
        return 0
    if args.command == "restore":
        try:
            chosen = Restic(config).restore(args.store, args.target, args.snapshot, args.host, args.expect_tag)
        except ResticError as error:
            return _fail(str(error))
        print(f"stack_backup: restored {args.store} (snapshot {chosen[:8]}) into {args.target}")
        return 0
    if args.command == "put-back":
        try:
            count = putback.replace_directory(args.source, args.target, args.owner)
        except (ValueError, OSError) as error:
            return _fail(str(error))
        print(f"stack_backup: {args.target} now holds the {count} restored files")
        return 0
    if args.command == "fill-missing":
        for path in putback.fill_missing(args.source, args.root):
            print(f"stack_backup: restored {path}")
        return 0
    if args.command == "report":
        try:
            print(run.report(config), end="")
        except (state.ReportError, state.StateError) as error:
            return _fail(str(error))
        return 0
    try:
        outcome = run.backup(config, args.store)
    except lock.Busy as error:
        return _fail(str(error), 3)
    except (ValueError, run.PartialRunFailed, state.StateError) as error:
        return _fail(str(error))
    if args.store:
        print(f"stack_backup: backed up {', '.join(args.store)}", flush=True)
        return 0
    try:
        run.report(config, outcome)
    except state.ReportError as error:
        _fail(str(error))
        if outcome.last_run_ok:
            return 2
    if not outcome.last_run_ok:
        return _fail(f"the backup run failed: {outcome.last_error}")
    print("stack_backup: every store is backed up", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
