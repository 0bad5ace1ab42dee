"""`python -m telemetry_client doctor ...`: the command-line tools of the client (today: the doctor)."""

from __future__ import annotations

import sys

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help"):
        print("usage: python -m telemetry_client doctor [--json] [--send-test] [--stack] ...  (doctor --help)")
        return 0 if args else 2
    if args[0] != "doctor":
        print(f"unknown command {args[0]!r}; the only command is: doctor", file=sys.stderr)
        return 2
    from telemetry_client.doctor import main as doctor

    return doctor(args[1:])


if __name__ == "__main__":
    sys.exit(main())
