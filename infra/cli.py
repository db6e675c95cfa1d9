"""The ``ragpool`` command line.

Each area registers its own subcommands; modules are imported only when the
command line is built, and each module keeps heavy imports (torch, pulumi) inside
its handlers so ``ragpool --help`` stays fast.

Exit codes scripts can rely on: 0 ok, 1 operation failed, 2 bad input or config,
3 not found. Individual commands document anything more specific.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# Modules that contribute subcommands: each defines ``register(subparsers)``.
COMMAND_MODULES = (
    "infra.plan",
    "infra.config_check",
    "infra.leftovers",
    "training.scheduler.cli",
    "training.api.cli",
    "training.reports.cli",
    "training.datasets.cli",
    "dashboards.cli",
    "policy.offline",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ragpool",
        description="GPU training pool on EKS for RAG models: offline plans, runs, dashboards.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            # Only tolerate the contributing module itself being absent (a partial
            # checkout); a missing dependency inside it is a real error.
            if exc.name != name and not name.startswith(exc.name + "."):
                raise
            continue
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    return int(args.handler(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
