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

from . import config as settings
from . import lock, run, state
from .restic import Restic, ResticError


def _fail(message: str, code: int = 1) -> int:
    print(f"stack_backup: {message}", file=sys.stderr, flush=True)
    return code


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="stack_backup", description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, required=True, help="the settings file (JSON) the backup role renders")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("run", help="back up every store, apply retention, report")
    commands.add_parser("report", help="write this host's stack_backup metric now")
    commands.add_parser("check-config", help="check the settings file and say what it backs up")
    listing = commands.add_parser("snapshots", help="this host's snapshots as JSON")
    listing.add_argument("--store")
    restore = commands.add_parser("restore", help="put a store's snapshot into a directory")
    restore.add_argument("--store", required=True)
    restore.add_argument("--target", type=Path, required=True)
    restore.add_argument("--snapshot", default="latest")
    restore.add_argument("--host", help="the host that made the snapshot (default: this one)")
    args = parser.parse_args(argv)
    os.umask(0o077)
    try:
        config = settings.load(args.config)
    except settings.ConfigError as error:
        return _fail(f"{args.config}: {error}")
    if args.command == "check-config":
        stores = ", ".join(f"{s.name} ({s.kind})" for s in config.stores)
        print(f"{config.host}: {stores} -> restic {config.repository}")
        return 0
    if args.command == "snapshots":
        try:
            print(json.dumps(Restic(config).snapshots(args.store), indent=2))
        except ResticError as error:
            return _fail(str(error))
        return 0
    if args.command == "restore":
        try:
            Restic(config).restore(args.store, args.target, args.snapshot, args.host)
        except ResticError as error:
            return _fail(str(error))
        print(f"stack_backup: restored {args.store} ({args.snapshot}) into {args.target}")
        return 0
    if args.command == "report":
        try:
            print(run.report(config), end="")
        except state.ReportError as error:
            return _fail(str(error))
        return 0
    try:
        outcome = run.backup(config)
    except lock.Busy as error:
        return _fail(str(error), 3)
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
