"""Run the guardrail policies on an offline plan, with no cloud account and no Pulumi CLI.

    python -m policy.offline --stack prod              # plan the stack under mocks, then check
    python -m policy.offline --plan plan-prod.json     # check a saved `ragpool plan --format json`
    ragpool plan --stack prod --format json | python -m policy.offline --plan -

The checks are the functions in ``policy/checks/`` that the CrossGuard pack runs under
``pulumi preview --policy-pack policy``, so a stack that passes here passes there (up to
values only the cloud knows). ``--config`` takes the same JSON file as
``pulumi preview --policy-pack-config``: ``{"all": "advisory", "<policy>": "disabled" |
{"enforcementLevel": "...", "<property>": value}}``.

Exit codes: 0 no mandatory violation, 1 mandatory violations or the program failed, 2 bad input or config,
3 plan or config file not found.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from contract import exit_codes
from policy.checks import ENFORCEMENT_LEVELS, MANDATORY, RULES, RULES_BY_NAME, Context, Resource, Rule


class PolicyInputError(ValueError):
    """A plan document or policy config that cannot be evaluated; the message says why."""


@dataclass(frozen=True)
class Violation:
    """One policy violation on one resource (or on the whole stack)."""

    policy: str
    enforcement: str
    resource_type: str | None
    resource_name: str | None
    message: str

    @property
    def mandatory(self) -> bool:
        return self.enforcement == MANDATORY

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def __str__(self) -> str:
        where = f'{self.resource_type} "{self.resource_name}"' if self.resource_type else "stack"
        return f"[{self.enforcement}] {self.policy}: {where}: {self.message}"


# ------------------------------------------------------------------ config


def resolve_config(rule: Rule, config: Mapping[str, Any] | None) -> tuple[str, dict[str, Any]]:
    """(enforcement level, properties with schema defaults) of one rule under a pack config."""
    level = rule.enforcement
    props = rule.defaults()
    for key in ("all", rule.name):
        entry = (config or {}).get(key)
        if entry is None:
            continue
        if isinstance(entry, str):
            level = entry
        elif isinstance(entry, Mapping):
            entry = dict(entry)
            level = entry.pop("enforcementLevel", level)
            if key == rule.name:
                props.update(entry)
    return level, props


def validate_config(config: Any, source: str = "policy config") -> dict[str, Any]:
    """Check a pack config against the rules; raise PolicyInputError listing every problem."""
    if not isinstance(config, Mapping):
        raise PolicyInputError(f"{source}: expected a JSON object of policy name -> settings, got {type(config).__name__}")
    problems = []
    for key, entry in config.items():
        rule = RULES_BY_NAME.get(key)
        if rule is None and key != "all":
            problems.append(f"{source}: unknown policy {key!r}; known: all, {', '.join(sorted(RULES_BY_NAME))}")
            continue
        level = entry if isinstance(entry, str) else entry.get("enforcementLevel") if isinstance(entry, Mapping) else None
        if not isinstance(entry, (str, Mapping)):
            problems.append(f"{source}: {key}: expected an enforcement level or an object, got {entry!r}")
            continue
        if level is not None and level not in ENFORCEMENT_LEVELS:
            problems.append(f"{source}: {key}: enforcementLevel {level!r} is not one of {', '.join(ENFORCEMENT_LEVELS)}")
        if isinstance(entry, Mapping) and rule is not None:
            for prop in entry:
                if prop != "enforcementLevel" and prop not in rule.config_schema:
                    allowed = ", ".join(sorted(rule.config_schema)) or "none"
                    problems.append(f"{source}: {key}: unknown property {prop!r}; allowed: {allowed}")
    if problems:
        raise PolicyInputError("\n".join(problems))
    return dict(config)


def load_config(path: Path) -> dict[str, Any]:
    try:
        doc = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise PolicyInputError(f"{path}: not valid JSON: {exc}") from None
    return validate_config(doc, source=str(path))


# ------------------------------------------------------------------ evaluation


def resources_of(plan_doc: Any) -> list[Resource]:
    """The plan's resources as policy Resources; PolicyInputError if the document is malformed."""
    listed = plan_doc.get("resources") if isinstance(plan_doc, Mapping) else None
    if not isinstance(listed, Sequence) or isinstance(listed, (str, bytes)):
        raise PolicyInputError("plan document: expected {\"stack\", \"resources\": [...]} as written by "
                               "`ragpool plan --format json`")
    resources = []
    for i, entry in enumerate(plan_doc["resources"]):
        if not isinstance(entry, Mapping) or not isinstance(entry.get("type"), str) or not isinstance(entry.get("name"), str):
            raise PolicyInputError(f"plan document: resources[{i}] lacks a string type and name: {entry!r:.200}")
        inputs = entry.get("inputs") or {}
        if not isinstance(inputs, Mapping):
            raise PolicyInputError(f"plan document: resources[{i}] ({entry['name']}): inputs is not an object")
        resources.append(Resource(type=entry["type"], name=entry["name"], inputs=inputs,
                                  protect=bool(entry.get("protect", False)),
                                  dependencies=tuple(str(d) for d in entry.get("dependsOn") or ())))
    return resources


def evaluate(plan_doc: Mapping[str, Any], config: Mapping[str, Any] | None = None,
             rules: Sequence[Rule] = RULES) -> list[Violation]:
    """Every violation of ``rules`` in an offline plan document, in rule then resource order."""
    resources = resources_of(plan_doc)
    stack = plan_doc.get("stack")
    violations: list[Violation] = []
    for rule in rules:
        level, props = resolve_config(rule, config)
        if level == "disabled":
            continue
        ctx = Context(stack=stack if isinstance(stack, str) else None, config=props)
        if rule.scope == "stack":
            for resource, message in rule.check(resources, ctx):
                violations.append(Violation(rule.name, level, resource.type if resource else None,
                                            resource.name if resource else None, message))
            continue
        for resource in resources:
            for message in rule.check(resource, ctx):
                violations.append(Violation(rule.name, level, resource.type, resource.name, message))
    return violations


def format_report(violations: Sequence[Violation], stack: str | None, rules: Sequence[Rule] = RULES) -> str:
    mandatory = sum(v.mandatory for v in violations)
    lines = [str(v) for v in violations]
    failing = {v.policy for v in violations}
    lines.append(f"policy check {stack or '?'}: {len(rules) - len(failing)}/{len(rules)} policies clean; "
                 f"{mandatory} mandatory, {len(violations) - mandatory} advisory violation(s)")
    return "\n".join(lines)


# ------------------------------------------------------------------ CLI


def add_arguments(parser: argparse.ArgumentParser) -> None:
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--stack", help="plan this stack offline (Pulumi.<stack>.yaml) and check it")
    source.add_argument("--plan", help="a `ragpool plan --format json` file, or - for stdin")
    parser.add_argument("--config", type=Path, help="policy config JSON (same format as --policy-pack-config)")
    parser.add_argument("--format", choices=("text", "json"), default="text")


def run(args: argparse.Namespace) -> int:
    prog = "policy check"
    try:
        config = load_config(args.config) if args.config else None
        if args.stack:
            from infra.config import StackConfigError  # the program's own loader; heavy, so imported here
            from infra.plan import ProgramError, plan

            try:
                doc = plan(args.stack)  # the program as the Pulumi language host runs it
            except StackConfigError as exc:
                print(f"{prog}: {exc}", file=sys.stderr)
                return exit_codes.BAD_INPUT
            except ProgramError as exc:
                print(f"{prog}: {exc}", file=sys.stderr)
                return exit_codes.FAILED
        elif args.plan == "-":
            doc = json.load(sys.stdin)
        else:
            doc = json.loads(Path(args.plan).read_text())
        violations = evaluate(doc, config)
    except FileNotFoundError as exc:
        print(f"{prog}: {exc.filename}: no such file", file=sys.stderr)
        return exit_codes.NOT_FOUND
    except json.JSONDecodeError as exc:
        print(f"{prog}: plan is not valid JSON: {exc}", file=sys.stderr)
        return exit_codes.BAD_INPUT
    except PolicyInputError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return exit_codes.BAD_INPUT
    if args.format == "json":
        print(json.dumps({"stack": doc.get("stack"), "violations": [v.as_dict() for v in violations]}, indent=2))
    else:
        print(format_report(violations, doc.get("stack")))
    return exit_codes.FAILED if any(v.mandatory for v in violations) else exit_codes.OK


def register(subparsers: argparse._SubParsersAction) -> None:
    """Adds `policy-check` to the ragpool CLI (infra/cli.py)."""
    parser = subparsers.add_parser("policy-check", help="run the guardrail policies on an offline plan",
                                   description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    parser.set_defaults(handler=run)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m policy.offline", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
