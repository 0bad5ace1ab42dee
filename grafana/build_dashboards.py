"""Build the Grafana dashboards in grafana/dashboards/ (InfluxDB) and grafana/dashboards-victoriametrics/ from Python.

Why generated rather than hand-written JSON: six dashboards share the same
template variables, filters and panel conventions; one function per convention
keeps them identical, a review reads a few hundred lines of Python instead of
thousands of lines of JSON, and tests/test_dashboards.py fails when the committed
JSON differs from what the builder produces (run this after every change).

    python -m grafana.build_dashboards          # rewrite both dashboard sets and grafana/downsampling/
    python -m grafana.build_dashboards --check  # exit 1 when they are out of date

The shared builder is the package grafana/builder/ (targets, queries, variables,
panels); each dashboard is a module of grafana/dashboards_src/ with a build().
Each dashboard is built twice, once per metrics backend (grafana.builder.backend):
InfluxQL panels into grafana/dashboards/, MetricsQL panels for VictoriaMetrics into
grafana/dashboards-victoriametrics/, with the same file names and dashboard uids
(only one set is provisioned at a time). Loki panels are LogQL in both.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from grafana.builder import downsampling
from grafana.builder.backend import Backend, building_for
from grafana.builder.generated import write_generated
from grafana.builder.queries import DROP_REASONS
from grafana.dashboards_src import BUILDERS

__all__ = ["BUILDERS", "DROP_REASONS", "main", "render"]

OUT_DIR = Path(__file__).resolve().parent / "dashboards"
VICTORIAMETRICS_OUT_DIR = Path(__file__).resolve().parent / "dashboards-victoriametrics"
DOWNSAMPLING_DIR = Path(__file__).resolve().parent / "downsampling"


def render(backend: Backend = "influxdb") -> dict[str, str]:
    """File name to the exact text the committed dashboard must have, for `backend`'s set."""
    with building_for(backend):
        return {
            name: json.dumps(build(), indent=2, sort_keys=True, ensure_ascii=False) + "\n"
            for name, build in BUILDERS.items()
        }


def render_all(
    out: Path, downsampling_out: Path, victoriametrics_out: Path = VICTORIAMETRICS_OUT_DIR
) -> dict[Path, str]:
    """Every generated file: the InfluxDB dashboards in `out`, the VictoriaMetrics ones in
    `victoriametrics_out`, the downsampling setup in `downsampling_out`."""
    files = {out / name: text for name, text in render("influxdb").items()}
    files.update({victoriametrics_out / name: text for name, text in render("victoriametrics").items()})
    files.update({downsampling_out / name: text for name, text in downsampling.render().items()})
    return files


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--check", action="store_true", help="exit 1 when a generated file differs from what is committed"
    )
    parser.add_argument("--out", type=Path, default=OUT_DIR)
    parser.add_argument("--downsampling-out", type=Path, default=DOWNSAMPLING_DIR)
    parser.add_argument("--victoriametrics-out", type=Path, default=VICTORIAMETRICS_OUT_DIR)
    args = parser.parse_args(argv)
    files = render_all(args.out, args.downsampling_out, args.victoriametrics_out)
    return write_generated(files, args.check, "python -m grafana.build_dashboards")


if __name__ == "__main__":
    sys.exit(main())
