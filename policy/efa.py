"""Policy ``efa-pool-requests-devices``: every GPU worker template (Jobs, ScaledJobs, Ray worker groups) of a pool whose instance types have EFA
requests (limits = requests) its share of the node's EFA devices, and no other template requests any.

Why (round-4 audit, item 4): Karpenter attaches a node's EFA interfaces only when the pod it launches the
node for requests ``vpc.amazonaws.com/efa`` (aws/karpenter-provider-aws v1.14.1
pkg/providers/amifamily/resolver.go efaCount), and then as many as the instance type has; a pod that asks for
fewer leaves the rest idle, one that asks for none trains over TCP on a node bought for EFA. The expected count
is infra/efa_devices.py ``efa_devices`` of the NodePool's instance types (infra/reference/efa_interfaces.yaml)
and the template's GPUs: the same rule the program applies, read back from the plan. The request must match
every instance type the NodePool may launch: a pool whose types give a worker different counts (p4d.24xlarge 4,
p5.48xlarge 32; ``mixed_efa_shares``, which the config refuses too) fails whatever its pods ask. Nothing here
imports Pulumi.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from contract.names import EFA_RESOURCE, GPU_RESOURCE, POOL_LABEL
from infra.efa_devices import efa_devices, efa_shares, mixed_efa_shares
from policy.pod_templates import as_list, containers, get, pod_templates

INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"


def _pool_instance_types(resources: Sequence[Any], nodepool_types: frozenset[str]) -> dict[str, list[str]]:
    """GPU NodePool name (its pool label) -> the instance types its requirements allow."""
    pools: dict[str, list[str]] = {}
    for r in resources:
        if r.type not in nodepool_types:
            continue
        pool = get(r.inputs, "spec", "template", "metadata", "labels", POOL_LABEL)
        for req in as_list(get(r.inputs, "spec", "template", "spec", "requirements")):
            if get(req, "key") == INSTANCE_TYPE_LABEL and get(req, "operator") == "In" and isinstance(pool, str):
                pools[pool] = [str(t) for t in as_list(get(req, "values"))]
    return pools


def _number(value: Any) -> int | None:
    try:
        return int(str(value))
    except (TypeError, ValueError):
        return None


def check_efa_pool_requests_devices(resources: Sequence[Any], ctx: Any, *, nodepool_types: frozenset[str],
                                    ) -> Iterator[tuple[Any, str]]:
    pools = _pool_instance_types(resources, nodepool_types)
    for r, where, pod in ((r, where, pod) for r in resources for where, pod in pod_templates(r.type, r.inputs)):
        pool = get(pod, "nodeSelector", POOL_LABEL)
        if pool not in pools:
            continue
        for container in containers(pod):
            requests = get(container, "resources", "requests")
            limits = get(container, "resources", "limits")
            gpus = _number(get(requests, GPU_RESOURCE))
            if not gpus:
                continue
            want = efa_devices(pools[pool], gpus)
            got_request, got_limit = get(requests, EFA_RESOURCE), get(limits, EFA_RESOURCE)
            name = f"{get(r.inputs, 'metadata', 'namespace')}/{get(r.inputs, 'metadata', 'name')} {where}"
            types = ", ".join(pools[pool])
            if mixed_efa_shares(pools[pool], gpus):
                shares = ", ".join(f"{t} {n}" for t, n in efa_shares(pools[pool], gpus).items())
                yield r, (f"{name} container {get(container, 'name')!r} (pool {pool!r}; {gpus} GPUs) requests "
                          f"{EFA_RESOURCE} {got_request!r}, but its NodePool may launch instance types that give a "
                          f"worker different EFA device counts ({shares}; infra/reference/efa_interfaces.yaml): one "
                          "request cannot match them all, the larger nodes' interfaces sit idle; split the pool, one "
                          "per EFA count (infra/efa_devices.py efa_pool_problems)")
                continue
            expected = str(want) if want else None
            if (got_request, got_limit) != (expected, expected):
                yield r, (f"{name} container {get(container, 'name')!r} (pool {pool!r}: {types}; {gpus} GPUs) requests "
                          f"{EFA_RESOURCE} {got_request!r} (limit {got_limit!r}) but its pool gives a worker "
                          f"{want or 'no'} EFA device(s) (infra/reference/efa_interfaces.yaml): "
                          + (f"request and limit {want}, or Karpenter attaches the interfaces to no node or leaves "
                             "them idle (infra/efa.py, infra/worker_jobs.py)" if want else
                             f"drop the {EFA_RESOURCE} request (the pool's nodes have no EFA share for this pod)"))

