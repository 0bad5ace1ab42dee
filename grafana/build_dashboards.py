"""Build the Grafana dashboards in grafana/dashboards/ from Python.

Why generated rather than hand-written JSON: six dashboards share the same
template variables, filters and panel conventions; one function per convention
keeps them identical, a review reads a few hundred lines of Python instead of
thousands of lines of JSON, and tests/test_dashboards.py fails when the committed
JSON differs from what the builder produces (run this after every change).

    python grafana/build_dashboards.py          # rewrite grafana/dashboards/*.json and grafana/downsampling/
    python grafana/build_dashboards.py --check  # exit 1 when they are out of date

The shared builder is the package grafana/builder/ (targets, queries, variables,
panels); each dashboard is a module of grafana/dashboards_src/ with a build().
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script from anywhere: grafana.* and telemetry_client live here
    sys.path.insert(0, str(ROOT))

from grafana.builder import downsampling  # noqa: E402
from grafana.builder.queries import DROP_REASONS  # noqa: E402
from grafana.dashboards_src import BUILDERS  # noqa: E402

__all__ = ["BUILDERS", "DROP_REASONS", "main", "render"]

OUT_DIR = Path(__file__).resolve().parent / "dashboards"
DOWNSAMPLING_DIR = Path(__file__).resolve().parent / "downsampling"


def render() -> dict[str, str]:
    """File name (in grafana/dashboards/) to the exact text the committed file must have."""
    return {
        name: json.dumps(build(), indent=2, sort_keys=True, ensure_ascii=False) + "\n"
        for name, build in BUILDERS.items()
    }


def render_all(out: Path, downsampling_out: Path) -> dict[Path, str]:
    """Every generated file: the dashboards in `out`, the downsampling setup in `downsampling_out`."""
    files = {out / name: text for name, text in render().items()}
    files.update({downsampling_out / name: text for name, text in downsampling.render().items()})
    return files


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--check", action="store_true", help="exit 1 when a generated file differs from what is committed"
    )
    parser.add_argument("--out", type=Path, default=OUT_DIR)
    parser.add_argument("--downsampling-out", type=Path, default=DOWNSAMPLING_DIR)
    args = parser.parse_args(argv)
    stale = []
    for path, text in render_all(args.out, args.downsampling_out).items():
        current = path.read_text(encoding="utf-8") if path.exists() else None
        if current == text:
            continue
        stale.append(path)
        if not args.check:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
    if args.check and stale:
        names = ", ".join(str(path) for path in stale)
        print(f"out of date: {names}; run python grafana/build_dashboards.py", file=sys.stderr)
        return 1
    for name in stale:
        print(f"wrote {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
