"""``ragpool dashboards``: render the Grafana dashboards as JSON (no Grafana needed).

Registered by ``infra/cli.py``. Exit codes: 0 written, 2 the output path is unusable.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "dashboards",
        help="render the Grafana dashboards to JSON files",
        description="Render every ragpool Grafana dashboard to DIR/<name>.json (deterministic output). "
                    "Import them in Grafana via Dashboards > New > Import, or load them from ConfigMaps.",
    )
    parser.add_argument("--out", required=True, type=Path, metavar="DIR", help="output directory (created if missing)")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from dashboards.build import write_all  # the SDK import stays out of `ragpool --help`

    out: Path = args.out
    if out.exists() and not out.is_dir():
        print(f"ragpool dashboards: --out {out} exists and is not a directory", file=sys.stderr)
        return 2
    try:
        written = write_all(out)
    except OSError as exc:
        print(f"ragpool dashboards: cannot write to {out}: {exc}", file=sys.stderr)
        return 2
    for path in written:
        print(path)
    return 0
