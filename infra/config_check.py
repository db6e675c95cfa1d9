"""``ragpool config check --stack S``: validate a stack file without running the program.

``--deploy`` also refuses placeholders a real ``pulumi up`` cannot use (the example-account
deploy role the committed stack files carry). Prints every problem at once (file, key, value, fix) and exits 2, or prints a
one-line summary and exits 0.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def cmd_check(args: argparse.Namespace) -> int:
    from infra.config import StackConfigError
    from infra.deploy_config import deploy_problems
    from infra.stack import load_stack, validate_stack

    status = 0
    for stack in args.stack:
        try:
            cfg = validate_stack(load_stack(stack, Path(args.root)))
            if args.deploy and (problems := deploy_problems(cfg)):
                raise StackConfigError(problems, f"Pulumi.{stack}.yaml")
        except StackConfigError as exc:
            print(f"{exc.source}: {len(exc.problems)} problem(s)", file=sys.stderr)
            for problem in exc.problems:
                print(f"  {exc.source}: {problem}", file=sys.stderr)
            status = 2
            continue
        print(f"Pulumi.{stack}.yaml: ok ({cfg.environment}, {len(cfg.network.availability_zones)} AZs, "
              f"{len(cfg.gpu_pools)} GPU pool(s))")
    return status


def cmd_preview(args: argparse.Namespace) -> int:
    """One line per stack, ``<stack> on|off``: whether its PR preview runs against the cluster
    (ragpool:previewRoleArn set). The PR workflow picks the preview job's runner from it and
    .ci/plan-diff.sh the comment's first line."""
    from infra.config import StackConfigError
    from infra.stack import load_stack, validate_stack
    from contract import exit_codes

    lines = []
    for stack in args.stack:
        try:
            cfg = validate_stack(load_stack(stack, Path(args.root)))
        except StackConfigError as exc:
            print(f"{exc.source}: {len(exc.problems)} problem(s)", file=sys.stderr)
            for problem in exc.problems:
                print(f"  {exc.source}: {problem}", file=sys.stderr)
            return exit_codes.BAD_INPUT
        lines.append(f"{stack} {'on' if cfg.cluster.cluster_preview else 'off'}")
    print("\n".join(lines))
    return exit_codes.OK


def register(sub: argparse._SubParsersAction) -> None:
    from infra.plan import add_root_argument

    p = sub.add_parser("config", help="stack configuration tools")
    csub = p.add_subparsers(dest="config_command", required=True, metavar="SUBCOMMAND")
    c = csub.add_parser("check", help="validate stack files; print every problem at once")
    c.add_argument("--stack", action="append", required=True, help="stack to check (repeatable)")
    add_root_argument(c)
    c.add_argument("--deploy", action="store_true",
                   help="also refuse what only a real deployment cannot use (example-account role ARNs)")
    c.set_defaults(handler=cmd_check)
    v = csub.add_parser("preview", help="print `<stack> on|off`: whether the PR preview runs against the cluster")
    v.add_argument("--stack", action="append", required=True, help="stack (repeatable)")
    add_root_argument(v)
    v.set_defaults(handler=cmd_preview)
