"""Karpenter GPU pools: what counts as a GPU NodePool, its taint and GPU limit, the prod GPU AMI pin."""

from __future__ import annotations

from collections.abc import Iterator

from contract.names import GPU_RESOURCE
from infra.config_schema import GPU_INSTANCE_FAMILIES, is_gpu_instance_type  # Pulumi-free: the one GPU-family rule
from policy.checks.model import EC2NODECLASS_TYPES, NODEPOOL_TYPES, Context, Resource
from policy.checks.values import _number
from policy.pod_templates import as_list as _as_list
from policy.pod_templates import get as _get


def is_gpu_nodepool(resource: Resource) -> bool:
    """A NodePool that can launch NVIDIA GPU instances."""
    if resource.type not in NODEPOOL_TYPES:
        return False
    spec = _get(resource.inputs, "spec")
    if _get(spec, "limits", GPU_RESOURCE) is not None:
        return True
    for req in _as_list(_get(spec, "template", "spec", "requirements")):
        key = _get(req, "key")
        values = [str(v) for v in _as_list(_get(req, "values"))]
        if isinstance(key, str) and key.startswith("karpenter.k8s.aws/instance-gpu"):
            return True
        if key == "node.kubernetes.io/instance-type" and any(is_gpu_instance_type(v) for v in values):
            return True
        if key == "karpenter.k8s.aws/instance-category" and {"g", "p"} & set(values):
            return True
        if key == "karpenter.k8s.aws/instance-family" and any(v in GPU_INSTANCE_FAMILIES for v in values):
            return True
    return False


def check_gpu_nodepool_tainted(resource: Resource, ctx: Context) -> Iterator[str]:
    if not is_gpu_nodepool(resource):
        return
    taints = _as_list(_get(resource.inputs, "spec", "template", "spec", "taints"))
    if not any(_get(t, "key") == GPU_RESOURCE and _get(t, "effect") == "NoSchedule" for t in taints):
        found = [f"{_get(t, 'key')}={_get(t, 'value')}:{_get(t, 'effect')}" for t in taints]
        yield (f"spec.template.spec.taints is {found!r}: GPU nodes must carry "
               f"{GPU_RESOURCE}=true:NoSchedule so only pods that tolerate it (training workers) "
               "land on them")


def check_gpu_nodepool_limits(resource: Resource, ctx: Context) -> Iterator[str]:
    if not is_gpu_nodepool(resource):
        return
    limit = _get(resource.inputs, "spec", "limits", GPU_RESOURCE)
    count = _number(limit)
    if count is None or count <= 0 or count != int(count):
        yield (f"spec.limits[{GPU_RESOURCE!r}] is {limit!r}: without a positive GPU limit "
               "Karpenter can launch GPU instances without bound; set the pool's gpuLimit in "
               "ragpool:gpuPools")


def check_gpu_ami_pinned_in_prod(resource: Resource, ctx: Context) -> Iterator[str]:
    if resource.type not in EC2NODECLASS_TYPES or ctx.environment_of(resource) != "prod":
        return
    for term in _as_list(_get(resource.inputs, "spec", "amiSelectorTerms")):
        alias = _get(term, "alias")
        if isinstance(alias, str) and alias.endswith("@latest"):
            yield (f"spec.amiSelectorTerms alias is {alias!r} in prod: a new AMI rolls every GPU "
                   "node on its own schedule; pin a dated version with ragpool:gpuAmiAlias "
                   "(al2023@vYYYYMMDD)")
