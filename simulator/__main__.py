"""Entry point of `python -m simulator` (see simulator/cli.py and docs/simulator.md)."""

from simulator.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
