"""The guardrail rules as CrossGuard policies (``pulumi_policy`` 1.21).

Each rule in ``policy.checks.RULES`` becomes a ``ResourceValidationPolicy`` (or, for a
check that spans resources, a ``StackValidationPolicy``) whose validate function builds a
``policy.checks.Resource`` from the SDK's arguments and reports what the shared check yields:

- ``args.props`` are the resource's inputs (read-only proxies that raise on values unknown
  during preview; the SDK turns that into a "can't run policy" note);
- ``args.opts.protect`` is the ``protect`` option (``PolicyResourceOptions`` carries no
  ``retain_on_delete``, so no rule depends on it);
- the stack name is parsed from ``args.urn``; policy config comes from ``args.get_config()``
  with the rule's schema defaults under it.
"""

from __future__ import annotations

from typing import Any

from pulumi_policy import (
    EnforcementLevel,
    PolicyConfigSchema,
    PolicyPack,
    ReportViolation,
    ResourceValidationArgs,
    ResourceValidationPolicy,
    StackValidationArgs,
    StackValidationPolicy,
)

from policy.checks import RULES, Context, Resource, Rule, stack_from_urn

PACK_NAME = "ragpool-guardrails"

_LEVELS = {"mandatory": EnforcementLevel.MANDATORY, "advisory": EnforcementLevel.ADVISORY}


def _context(rule: Rule, urn: str | None, config: Any) -> Context:
    props = rule.defaults()
    props.update(dict(config or {}))
    return Context(stack=stack_from_urn(urn), config=props)


def _resource_validator(rule: Rule):
    def validate(args: ResourceValidationArgs, report_violation: ReportViolation) -> None:
        resource = Resource(type=args.resource_type, name=args.name, inputs=args.props,
                            protect=bool(args.opts.protect) if args.opts is not None else False,
                            urn=args.urn)
        for message in rule.check(resource, _context(rule, args.urn, args.get_config())):
            report_violation(message, None)

    validate.__name__ = f"validate_{rule.name.replace('-', '_')}"
    return validate


def _stack_validator(rule: Rule):
    def validate(args: StackValidationArgs, report_violation: ReportViolation) -> None:
        resources = [
            Resource(type=r.resource_type, name=r.name, inputs=r.props,
                     protect=bool(r.opts.protect) if r.opts is not None else False, urn=r.urn,
                     dependencies=tuple(f"{d.resource_type}::{d.name}" for d in (r.dependencies or [])))
            for r in args.resources
        ]
        urn = next((r.urn for r in resources if r.urn), None)
        for resource, message in rule.check(resources, _context(rule, urn, args.get_config())):
            report_violation(message, resource.urn if resource is not None else None)

    validate.__name__ = f"validate_{rule.name.replace('-', '_')}"
    return validate


def build_policies() -> list[ResourceValidationPolicy | StackValidationPolicy]:
    """One CrossGuard policy per rule, same names and enforcement levels as the offline run."""
    policies: list[ResourceValidationPolicy | StackValidationPolicy] = []
    for rule in RULES:
        common = dict(
            name=rule.name,
            description=rule.description,
            enforcement_level=_LEVELS[rule.enforcement],
            config_schema=PolicyConfigSchema(properties={k: dict(v) for k, v in rule.config_schema.items()})
            if rule.config_schema else None,
            remediation_steps=rule.remediation,
        )
        if rule.scope == "stack":
            policies.append(StackValidationPolicy(validate=_stack_validator(rule), **common))
        else:
            policies.append(ResourceValidationPolicy(validate=_resource_validator(rule), **common))
    return policies


def serve() -> None:
    """Start the analyzer for the Pulumi CLI (prints its port, then blocks)."""
    PolicyPack(name=PACK_NAME, policies=build_policies(), enforcement_level=EnforcementLevel.ADVISORY,
               description="ragpool guardrails: the same checks run offline by `python -m policy.offline`.")
