"""``ragpool dashboards``: render the Grafana dashboards as JSON (no Grafana needed).

Registered by ``infra/cli.py``. Exit codes: 0 written, 2 the output path is unusable.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from contract import exit_codes


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "dashboards",
        help="render the Grafana dashboards to JSON files",
        description="Render every ragpool Grafana dashboard to DIR/<name>.json (deterministic output). "
                    "Import them in Grafana via Dashboards > New > Import, or load them from ConfigMaps.",
    )
    parser.add_argument("--out", required=True, type=Path, metavar="DIR", help="output directory (created if missing)")
    parser.add_argument("--lanes", metavar="LANE[,LANE...]", default=None,
                        help="the lanes of your stack, one Autoscaling row each (lane names as in RAGPOOL_LANES: "
                             "torchrun, torchrun.n<N>, pool.<pool>[.n<N>], ray); default: torchrun,ray. "
                             "A deployed stack's Grafana gets its own lanes from the Pulumi program.")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from dashboards.build import write_all  # the SDK import stays out of `ragpool --help`

    from contract.lanes import LaneError, parse_lane

    out: Path = args.out
    if out.exists() and not out.is_dir():
        print(f"ragpool dashboards: --out {out} exists and is not a directory", file=sys.stderr)
        return exit_codes.BAD_INPUT
    lanes = None
    if getattr(args, "lanes", None) is not None:
        try:
            lanes = [parse_lane(item) for item in args.lanes.split(",") if item.strip()]
            if not lanes:
                raise LaneError("--lanes names no lane")
        except LaneError as exc:
            print(f"ragpool dashboards: --lanes {args.lanes!r}: {exc}", file=sys.stderr)
            return exit_codes.BAD_INPUT
    try:
        written = write_all(out, lanes)
    except OSError as exc:
        print(f"ragpool dashboards: cannot write to {out}: {exc}", file=sys.stderr)
        return exit_codes.BAD_INPUT
    except ValueError as exc:  # lanes whose kube-state-metrics labels collide (dashboards/boards/autoscaling.py)
        print(f"ragpool dashboards: --lanes {args.lanes!r}: {exc}", file=sys.stderr)
        return exit_codes.BAD_INPUT
    for path in written:
        print(path)
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m dashboards.cli --out DIR [--lanes ...]``: the same command without the ``ragpool`` CLI."""
    parser = argparse.ArgumentParser(prog="python -m dashboards.cli")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["dashboards", *(sys.argv[1:] if argv is None else argv)])
    return args.handler(args)


if __name__ == "__main__":
    sys.exit(main())
