"""Where each workload kind keeps its pod templates, and the value helpers every policy reads inputs with.

One home for both, so a rule over "every pod template" (policy/checks/, policy/secret_access.py) sees
the same templates: the workload kinds of core and apps/batch, KEDA's ScaledJob (its ``jobTargetRef``
is a Job spec: kedacore/keda v2.20.2 apis/keda/v1alpha1/scaledjob_types.go) and KubeRay's RayCluster,
RayJob and RayService (the head group and every worker group of the cluster spec; ray-project/kuberay
v1.7.0 ray-operator/apis/ray/v1). Nothing here imports Pulumi.

Values are read through ``Mapping``/``Sequence`` (never ``dict``/``list``): CrossGuard hands inputs over
as read-only proxies.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

# Where each workload kind keeps its pod spec.
POD_SPEC_PATHS: dict[str, tuple[str, ...]] = {
    "kubernetes:core/v1:Pod": ("spec",),
    "kubernetes:apps/v1:Deployment": ("spec", "template", "spec"),
    "kubernetes:apps/v1:StatefulSet": ("spec", "template", "spec"),
    "kubernetes:apps/v1:DaemonSet": ("spec", "template", "spec"),
    "kubernetes:apps/v1:ReplicaSet": ("spec", "template", "spec"),
    "kubernetes:batch/v1:Job": ("spec", "template", "spec"),
    "kubernetes:batch/v1:CronJob": ("spec", "jobTemplate", "spec", "template", "spec"),
}

SCALED_JOB_TYPE = "kubernetes:keda.sh/v1alpha1:ScaledJob"
SCALED_JOB_POD_PATH = ("spec", "jobTargetRef", "template", "spec")
"""A ScaledJob's worker pod: ``jobTargetRef`` is the spec of every Job KEDA creates."""

# Where each KubeRay kind keeps the spec of the RayCluster it runs (ray-project/kuberay v1.7.0
# ray-operator/apis/ray/v1: RayJob ``rayClusterSpec``, RayService ``rayClusterConfig``). ray.io/v1alpha1
# has no authOptions (the CRD schema): such a cluster cannot run with token authentication.
RAY_CLUSTER_SPEC_PATHS: dict[str, tuple[str, ...]] = {
    "kubernetes:ray.io/v1:RayCluster": ("spec",),
    "kubernetes:ray.io/v1alpha1:RayCluster": ("spec",),
    "kubernetes:ray.io/v1:RayJob": ("spec", "rayClusterSpec"),
    "kubernetes:ray.io/v1alpha1:RayJob": ("spec", "rayClusterSpec"),
    "kubernetes:ray.io/v1:RayService": ("spec", "rayClusterConfig"),
}


def get(obj: Any, *path: str | int) -> Any:
    """obj[path0][path1]... or None where a step is missing or of the wrong kind."""
    for step in path:
        if isinstance(step, int):
            if not is_list(obj) or step >= len(obj):
                return None
        elif not isinstance(obj, Mapping) or step not in obj:
            return None
        obj = obj[step]
    return obj


def is_list(value: Any) -> bool:
    return isinstance(value, Sequence) and not isinstance(value, (str, bytes))


def as_list(value: Any) -> list[Any]:
    if value is None:
        return []
    return list(value) if is_list(value) else [value]


def containers(pod_spec: Any) -> list[Any]:
    """A pod's init containers, then its containers."""
    return as_list(get(pod_spec, "initContainers")) + as_list(get(pod_spec, "containers"))


def pod_templates(resource_type: str, inputs: Any) -> Iterator[tuple[str, Any]]:
    """Every pod template of one resource, as (where, pod spec): ``where`` names the template in the
    resource's inputs (``spec.template.spec``, ``spec.headGroupSpec``, ``spec.workerGroupSpecs['gpu']``)."""
    path = SCALED_JOB_POD_PATH if resource_type == SCALED_JOB_TYPE else POD_SPEC_PATHS.get(resource_type)
    if path is not None:
        pod = get(inputs, *path)
        if isinstance(pod, Mapping):
            yield ".".join(path), pod
        return
    path = RAY_CLUSTER_SPEC_PATHS.get(resource_type)
    spec = get(inputs, *path) if path is not None else None
    if not isinstance(spec, Mapping):  # not a Ray kind, or a RayJob on an existing cluster
        return
    where = ".".join(path)
    head = get(spec, "headGroupSpec", "template", "spec")
    if isinstance(head, Mapping):
        yield f"{where}.headGroupSpec", head
    for group in as_list(get(spec, "workerGroupSpecs")):
        pod = get(group, "template", "spec")
        if isinstance(pod, Mapping):
            yield f"{where}.workerGroupSpecs[{get(group, 'groupName')!r}]", pod
