"""The ``ragpool`` command line.

Each area registers its own subcommands; modules are imported only when the
command line is built, and each module keeps heavy imports (torch, pulumi) inside
its handlers so ``ragpool --help`` stays fast.

Exit codes scripts can rely on: 0 ok, 1 operation failed, 2 bad input or config,
3 not found, 141 its output pipe closed (quietly, like SIGPIPE). Individual commands document anything more
specific.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from contract.exit_codes import BROKEN_PIPE

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
    "dashboards.usage",
    "policy.offline",
    "infra.cli_tree",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ragpool",
        description="GPU training pool on EKS for RAG models: offline plans, runs, dashboards.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    parser.add_argument("--team", dest="api_team", metavar="TEAM",
                        help="act on this team's queue through the run API (admins; a member may name only its own); "
                             "default: your team's")
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
    from infra.cli_tree import add_output_options

    add_output_options(parser)  # --output json wherever a command has --json
    parser.set_defaults(root_parser=parser)  # `ragpool completion` walks the whole tree
    return parser


def _version() -> str:
    """The installed package's version (its metadata), or "unknown" when run from a bare source tree."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("ragpool")
    except PackageNotFoundError:
        return "unknown"


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    from infra.cli_tree import apply_output

    apply_output(args)
    if args.api_team:
        from contract.env import TEAM_ENV

        os.environ[TEAM_ENV] = args.api_team  # the run API client reads it (training/api/client.py remote_from_env)
    try:
        code = int(args.handler(args) or 0)
        sys.stdout.flush()
        return code
    except BrokenPipeError:
        # The reader went away (``ragpool logs RUN | head``): stop quietly, as a Unix tool killed by SIGPIPE
        # does; point stdout at /dev/null so the interpreter's last flush cannot raise again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return BROKEN_PIPE


if __name__ == "__main__":
    sys.exit(main())
