"""EC2 metadata service: launch templates, instances and Karpenter node classes require IMDSv2."""

from __future__ import annotations

from collections.abc import Iterator

from policy.checks.model import EC2NODECLASS_TYPES, Context, Resource
from policy.checks.values import _first
from policy.pod_templates import get as _get


def check_imdsv2_required(resource: Resource, ctx: Context) -> Iterator[str]:
    if resource.type in ("aws:ec2/launchTemplate:LaunchTemplate", "aws:ec2/instance:Instance"):
        options, where = _first(_get(resource.inputs, "metadataOptions")), "metadataOptions"
    elif resource.type in EC2NODECLASS_TYPES:
        options, where = _get(resource.inputs, "spec", "metadataOptions"), "spec.metadataOptions"
    else:
        return
    tokens = _get(options, "httpTokens")
    if tokens != "required":
        yield (f"{where}.httpTokens is {tokens!r}: require IMDSv2 so a pod cannot lift the node "
               "role's credentials with a plain GET; set httpTokens: required")
