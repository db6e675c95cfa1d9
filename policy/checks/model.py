"""The data model every guardrail check shares: :class:`Resource`, :class:`Context`, :class:`Rule`, the
enforcement levels and the resource types and defaults more than one family of checks reads.

Values are read through ``Mapping``/``Sequence`` (never ``dict``/``list``) because CrossGuard hands inputs over as
read-only proxies (see the package docstring). Nothing here imports Pulumi.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from policy.pod_templates import get as _get


MANDATORY = "mandatory"
ADVISORY = "advisory"
ENFORCEMENT_LEVELS = (MANDATORY, ADVISORY, "disabled")

ENVIRONMENTS = ("dev", "staging", "prod")
REQUIRED_TAGS = ("project", "stack", "environment", "owner", "cost-center")
DEFAULT_TRAINING_NAMESPACES = ("ragpool-training",)

# AWS resource types this program declares that take no `tags` input. Every other `aws:*`
# type counts as taggable, so a new resource type is held to the tag rule until someone
# adds it here; tests/policy checks this list against the pulumi_aws SDK.
NON_TAGGABLE_AWS_TYPES = frozenset({
    "aws:backup/selection:Selection",
    "aws:cloudwatch/eventTarget:EventTarget",
    "aws:ec2/routeTableAssociation:RouteTableAssociation",
    "aws:ec2/spotDatafeedSubscription:SpotDatafeedSubscription",
    "aws:eks/accessPolicyAssociation:AccessPolicyAssociation",
    "aws:ecr/lifecyclePolicy:LifecyclePolicy",
    "aws:efs/fileSystemPolicy:FileSystemPolicy",
    "aws:efs/mountTarget:MountTarget",
    "aws:iam/rolePolicy:RolePolicy",
    "aws:iam/rolePolicyAttachment:RolePolicyAttachment",
    "aws:kms/alias:Alias",
    "aws:s3/bucketLifecycleConfiguration:BucketLifecycleConfiguration",
    "aws:s3/bucketOwnershipControls:BucketOwnershipControls",
    "aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock",
    "aws:s3/bucketServerSideEncryptionConfiguration:BucketServerSideEncryptionConfiguration",
    "aws:sqs/queuePolicy:QueuePolicy",
})

# Stateful resources whose loss loses data or keys: `protect` is required on them in prod.
STATEFUL_TYPES = frozenset({
    "aws:efs/fileSystem:FileSystem",
    "aws:kms/key:Key",
    "aws:backup/vault:Vault",
    "aws:elasticache/replicationGroup:ReplicationGroup",
})

NODEPOOL_TYPES = frozenset({
    "kubernetes:karpenter.sh/v1:NodePool",
    "kubernetes:karpenter.sh/v1beta1:NodePool",
})
EC2NODECLASS_TYPES = frozenset({
    "kubernetes:karpenter.k8s.aws/v1:EC2NodeClass",
    "kubernetes:karpenter.k8s.aws/v1beta1:EC2NodeClass",
})


NAMESPACE_TYPE = "kubernetes:core/v1:Namespace"
NETWORK_POLICY_TYPE = "kubernetes:networking.k8s.io/v1:NetworkPolicy"
SERVICE_TYPE = "kubernetes:core/v1:Service"
HELM_RELEASE_TYPE = "kubernetes:helm.sh/v3:Release"


# ------------------------------------------------------------------ data model


@dataclass(frozen=True)
class Resource:
    """One resource as a policy sees it, whichever side (CrossGuard or offline plan) built it."""

    type: str
    """Pulumi type token, e.g. ``aws:efs/fileSystem:FileSystem``."""
    name: str
    """Logical resource name (the plan's ``name``, the URN's last part)."""
    inputs: Mapping[str, Any]
    """Inputs in camelCase as the engine records them (CrossGuard: ``args.props``)."""
    protect: bool = False
    """The ``protect`` resource option."""
    urn: str | None = None
    """The URN under CrossGuard; None offline."""
    dependencies: tuple[str, ...] = ()
    """What the engine creates first, as ``type::name`` (plan ``dependsOn``; CrossGuard stack
    policies: ``PolicyResource.dependencies``). Resource policies do not see them."""

    @property
    def label(self) -> str:
        return f'{self.type} "{self.name}"'


@dataclass(frozen=True)
class Context:
    """What a check knows beyond one resource: the stack and this rule's config."""

    stack: str | None
    """Stack name (offline: the plan's ``stack``; CrossGuard: parsed from the URN)."""
    config: Mapping[str, Any] = field(default_factory=dict)
    """This rule's config properties with schema defaults filled in."""

    def environment_of(self, resource: Resource) -> str:
        """Environment class a resource belongs to: dev, staging or prod.

        Order: the rule's ``environment`` config; the resource's own ``environment`` tag
        (the program tags every AWS resource and Karpenter node class with it, from the
        stack's ``ragpool:environment``); the stack name when it is an environment name.
        Anything else counts as prod, so an unknown stack gets the strict checks.
        """
        configured = self.config.get("environment")
        if configured:
            return str(configured)
        tag = _tags_of(resource).get("environment")
        if isinstance(tag, str) and tag in ENVIRONMENTS:
            return tag
        if self.stack in ENVIRONMENTS:
            return str(self.stack)
        return "prod"


ResourceCheck = Callable[[Resource, Context], Iterable[str]]
StackCheck = Callable[[Sequence[Resource], Context], Iterable[tuple["Resource | None", str]]]


@dataclass(frozen=True)
class Rule:
    """One policy: metadata shared by both runners plus its check function."""

    name: str
    description: str
    enforcement: str
    remediation: str
    check: Callable[..., Iterable[Any]]
    scope: str = "resource"  # "resource": check(Resource, Context) -> messages;
    #                          "stack": check(resources, Context) -> (resource|None, message)
    config_schema: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.enforcement not in (MANDATORY, ADVISORY):
            raise ValueError(f"rule {self.name}: enforcement {self.enforcement!r} is not mandatory|advisory")
        if self.scope not in ("resource", "stack"):
            raise ValueError(f"rule {self.name}: scope {self.scope!r} is not resource|stack")

    def defaults(self) -> dict[str, Any]:
        return {k: v["default"] for k, v in self.config_schema.items() if "default" in v}


def _tags_of(resource: Resource) -> Mapping[str, Any]:
    if resource.type in EC2NODECLASS_TYPES:
        tags = _get(resource.inputs, "spec", "tags")
    else:
        tags = _get(resource.inputs, "tags")
    return tags if isinstance(tags, Mapping) else {}
