"""AWS storage and cluster: EFS and EKS secrets encryption, the EKS endpoint, the prod task queue's auth and TLS,
protected stateful prod resources, cost tags."""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from policy.checks.model import (EC2NODECLASS_TYPES, NON_TAGGABLE_AWS_TYPES, REQUIRED_TAGS, STATEFUL_TYPES, Context,
                                 Resource)
from policy.checks.values import _first, _is_blank, _is_true
from policy.pod_templates import POD_SPEC_PATHS
from policy.pod_templates import as_list as _as_list
from policy.pod_templates import containers as _containers
from policy.pod_templates import get as _get


_SELF_HOSTED_REDIS_IMAGE = re.compile(r"(^|/)(redis|valkey)(:|@|$)")


def check_efs_encrypted(resource: Resource, ctx: Context) -> Iterator[str]:
    if resource.type != "aws:efs/fileSystem:FileSystem":
        return
    value = _get(resource.inputs, "encrypted")
    if not _is_true(value):
        yield (f"encrypted is {value!r}: the shared file system holds datasets and checkpoints "
               "and must be encrypted at rest; set encrypted=True (with kms_key_id) — "
               "encryption cannot be added later, so this replaces the file system")


def check_eks_secrets_encrypted(resource: Resource, ctx: Context) -> Iterator[str]:
    if resource.type != "aws:eks/cluster:Cluster":
        return
    config = _first(_get(resource.inputs, "encryptionConfig"))
    if not isinstance(config, Mapping):
        yield ("encryptionConfig is missing: Kubernetes secrets must be envelope-encrypted; "
               "set encryption_config={resources: ['secrets'], provider: {key_arn: <KMS key>}}")
        return
    resources = [str(r) for r in _as_list(_get(config, "resources"))]
    if "secrets" not in resources:
        yield (f"encryptionConfig.resources is {resources!r}: it must include 'secrets'")
    key_arn = _get(_first(_get(config, "provider")), "keyArn")
    if _is_blank(key_arn):
        yield "encryptionConfig.provider.keyArn is empty: point it at a customer-managed KMS key"


def check_eks_endpoint_access(resource: Resource, ctx: Context) -> Iterator[str]:
    if resource.type != "aws:eks/cluster:Cluster":
        return
    vpc = _first(_get(resource.inputs, "vpcConfig"))
    vpc = vpc if isinstance(vpc, Mapping) else {}
    # AWS defaults: public access on (open to 0.0.0.0/0), private access off.
    public = vpc.get("endpointPublicAccess", True)
    private = vpc.get("endpointPrivateAccess", False)
    environment = ctx.environment_of(resource)
    if environment == "prod":
        if _is_true(public) or public is None:
            yield (f"vpcConfig.endpointPublicAccess is {public!r} in {environment}: the prod API "
                   "endpoint must be private; set ragpool:endpointPublicAccess false (reach it "
                   "through the VPC or a VPN)")
        if not _is_true(private):
            yield (f"vpcConfig.endpointPrivateAccess is {private!r} in {environment}: nodes and "
                   "operators need the private endpoint; set endpoint_private_access=True")
        return
    if _is_true(public):
        cidrs = [str(c) for c in _as_list(vpc.get("publicAccessCidrs"))]
        if not cidrs:
            yield ("vpcConfig.publicAccessCidrs is empty with a public endpoint, so AWS opens it "
                   "to 0.0.0.0/0; set ragpool:publicAccessCidrs to your office/VPN ranges")
        for cidr in cidrs:
            if cidr in ("0.0.0.0/0", "::/0"):
                yield (f"vpcConfig.publicAccessCidrs contains {cidr}: the public API endpoint is "
                       "open to the internet; list only your office/VPN ranges")


def check_redis_auth_tls_in_prod(resource: Resource, ctx: Context) -> Iterator[str]:
    if ctx.environment_of(resource) != "prod":
        return
    if resource.type == "aws:elasticache/replicationGroup:ReplicationGroup":
        transit = _get(resource.inputs, "transitEncryptionEnabled")
        if not _is_true(transit):
            yield (f"transitEncryptionEnabled is {transit!r}: the prod task queue must use TLS; "
                   "set transit_encryption_enabled=True")
        token = _get(resource.inputs, "authToken")
        user_groups = _as_list(_get(resource.inputs, "userGroupIds"))
        if _is_blank(token) and not user_groups:
            yield ("authToken is not set and no userGroupIds: the prod task queue must require "
                   "auth; set auth_token from a generated secret (or RBAC user groups)")
        return
    if resource.type == "aws:elasticache/cluster:Cluster":
        engine = str(_get(resource.inputs, "engine") or "")
        if engine in ("redis", "valkey"):
            yield (f"a single ElastiCache {engine} cluster cannot take an auth token: in prod run "
                   "the queue as a ReplicationGroup with auth_token and TLS")
        return
    path = POD_SPEC_PATHS.get(resource.type)
    if path is None:
        return
    for container in _containers(_get(resource.inputs, *path)):
        image = str(_get(container, "image") or "")
        if _SELF_HOSTED_REDIS_IMAGE.search(image):
            yield (f"container {_get(container, 'name')!r} runs {image} in prod: the self-hosted "
                   "queue has no TLS; prod uses ElastiCache with auth and TLS")


def check_prod_stateful_protected(resource: Resource, ctx: Context) -> Iterator[str]:
    if resource.type not in STATEFUL_TYPES or ctx.environment_of(resource) != "prod":
        return
    if not resource.protect:
        yield ("protect is not set on a stateful prod resource: `pulumi destroy` or a replace "
               "would delete it; create it with infra/common.py stateful(parent, cfg) "
               "(protect and retain_on_delete in prod)")


def check_required_tags(resource: Resource, ctx: Context) -> Iterator[str]:
    required = [str(t) for t in _as_list(ctx.config.get("requiredTags", REQUIRED_TAGS))]
    if resource.type in EC2NODECLASS_TYPES:
        # Karpenter copies these onto the GPU instances and volumes it launches.
        yield from _tag_problems("spec.tags", _get(resource.inputs, "spec", "tags"), required, ctx)
        return
    if not resource.type.startswith("aws:") or resource.type in NON_TAGGABLE_AWS_TYPES:
        return
    yield from _tag_problems("tags", _get(resource.inputs, "tags"), required, ctx)
    if resource.type == "aws:ec2/launchTemplate:LaunchTemplate":
        for i, spec in enumerate(_as_list(_get(resource.inputs, "tagSpecifications"))):
            kind = _get(spec, "resourceType") or i
            yield from _tag_problems(f"tagSpecifications[{kind}].tags", _get(spec, "tags"), required, ctx)


def _tag_problems(where: str, tags: Any, required: Sequence[str], ctx: Context) -> Iterator[str]:
    tags = tags if isinstance(tags, Mapping) else {}
    missing = [key for key in required if _is_blank(tags.get(key))]
    if missing:
        yield (f"{where} lack {', '.join(missing)}: cost reports group GPU and storage spend by "
               "these tags; tag with infra/common.py aws_tags(cfg, name) (owner and cost-center "
               "come from ragpool:owner and ragpool:costCenter)")
    stack_tag = tags.get("stack")
    if ctx.stack and isinstance(stack_tag, str) and stack_tag and stack_tag != ctx.stack:
        yield f"{where}.stack is {stack_tag!r} but the stack is {ctx.stack!r}: costs would land on the wrong stack"
