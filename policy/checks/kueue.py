"""Kueue: the ClusterQueues' nominal GPU quotas fit the GPU pools, and every Job KEDA creates is Kueue's to admit.

Objects: kubernetes-sigs/kueue v0.19.2 apis/kueue/v1beta2 (infra/kueue_objects.py builds them). The queue a
Job waits in is its ``kueue.x-k8s.io/queue-name`` label (pkg/controller/jobframework/utils.go QueueNameForObject
reads the Job's own labels), and KEDA gives a Job the labels of its ScaledJob (kedacore/keda v2.20.2
pkg/scaling/executor/scale_jobs.go generateJobs, minus ``scaledjob.keda.sh/job-excluded-labels``).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from contract.names import (GPU_RESOURCE, KEDA_EXCLUDED_LABELS, KUEUE_PRIORITY_CLASS_LABEL, KUEUE_QUEUE_LABEL,
                            POOL_LABEL)
from policy.checks.karpenter import is_gpu_nodepool
from policy.checks.model import Context, Resource
from policy.checks.values import _metadata_name, _number
from policy.pod_templates import SCALED_JOB_TYPE
from policy.pod_templates import as_list as _as_list
from policy.pod_templates import get as _get

KUEUE_VERSIONS = ("v1beta2", "v1beta1")
CLUSTER_QUEUE_TYPES = frozenset(f"kubernetes:kueue.x-k8s.io/{v}:ClusterQueue" for v in KUEUE_VERSIONS)
LOCAL_QUEUE_TYPES = frozenset(f"kubernetes:kueue.x-k8s.io/{v}:LocalQueue" for v in KUEUE_VERSIONS)
RESOURCE_FLAVOR_TYPES = frozenset(f"kubernetes:kueue.x-k8s.io/{v}:ResourceFlavor" for v in KUEUE_VERSIONS)
WORKLOAD_PRIORITY_CLASS_TYPES = frozenset(f"kubernetes:kueue.x-k8s.io/{v}:WorkloadPriorityClass" for v in KUEUE_VERSIONS)


def check_kueue_quota_within_pools(resources: Sequence[Resource], ctx: Context) -> Iterator[tuple[Resource | None, str]]:
    """The ClusterQueues' ``nominalQuota`` of ``nvidia.com/gpu``, summed per ResourceFlavor, never exceeds the
    ``gpuLimit`` (NodePool ``spec.limits``) of the GPU pool the flavor's nodeLabels name, and in total never
    exceeds the pools' total: Kueue would admit Jobs for GPUs Karpenter may not launch, and they would hold
    their quota while their pods stay Pending. A GPU quota on a flavor of no GPU pool is refused too."""
    limits: dict[str, float] = {}
    for r in resources:
        if is_gpu_nodepool(r):
            pool = _get(r.inputs, "spec", "template", "metadata", "labels", POOL_LABEL)
            limit = _number(_get(r.inputs, "spec", "limits", GPU_RESOURCE))
            if isinstance(pool, str) and limit is not None:
                limits[pool] = limit
    flavors = {_metadata_name(r): _get(r.inputs, "spec", "nodeLabels", POOL_LABEL)
               for r in resources if r.type in RESOURCE_FLAVOR_TYPES}
    per_flavor: dict[str, float] = {}
    for r in resources:
        if r.type not in CLUSTER_QUEUE_TYPES:
            continue
        for group in _as_list(_get(r.inputs, "spec", "resourceGroups")):
            for flavor in _as_list(_get(group, "flavors")):
                name = str(_get(flavor, "name"))
                for res in _as_list(_get(flavor, "resources")):
                    if _get(res, "name") != GPU_RESOURCE:
                        continue
                    quota = _number(_get(res, "nominalQuota"))
                    if quota is None:
                        yield r, (f"ClusterQueue {_metadata_name(r)}: flavor {name!r} nominalQuota of {GPU_RESOURCE} is "
                                  f"{_get(res, 'nominalQuota')!r}, not a GPU count; build it with infra/kueue_objects.py")
                        continue
                    per_flavor[name] = per_flavor.get(name, 0) + quota
                    if quota and flavors.get(name) not in limits:
                        yield r, (f"ClusterQueue {_metadata_name(r)}: {quota:g} {GPU_RESOURCE} on flavor {name!r}, which "
                                  f"is no ResourceFlavor of a GPU pool (its nodeLabels {POOL_LABEL}: "
                                  f"{flavors.get(name)!r}; pools: {sorted(limits)}): declare a flavor per pool "
                                  "(infra/kueue_objects.py resource_flavor)")
    for name, total in sorted(per_flavor.items()):
        pool = flavors.get(name)
        if pool in limits and total > limits[pool]:
            yield None, (f"the ClusterQueues' nominal {GPU_RESOURCE} on flavor {name!r} add up to {total:g}, above pool "
                         f"{pool!r}'s gpuLimit {limits[pool]:g}: lower the trainingTeams' gpuQuota or raise the pool's "
                         "gpuLimit (infra/kueue_objects.py nominal_quotas)")
    total, pools_total = sum(per_flavor.values()), sum(limits.values())
    if limits and total > pools_total:
        yield None, (f"the ClusterQueues' nominal {GPU_RESOURCE} add up to {total:g}, above the GPU pools' total "
                     f"gpuLimit {pools_total:g}: lower the trainingTeams' gpuQuota")


def check_scaled_jobs_kueue_managed(resources: Sequence[Resource], ctx: Context) -> Iterator[tuple[Resource | None, str]]:
    """Every ScaledJob gives its Jobs the label ``kueue.x-k8s.io/queue-name`` (in its own labels, which KEDA
    copies onto each Job, and not excluded from the copy) naming a LocalQueue declared in its namespace: a Job
    without it runs outside every quota, one naming no LocalQueue waits forever. A ScaledJob whose worker claims
    one priority only (RAGPOOL_PRIORITIES) labels its Jobs ``kueue.x-k8s.io/priority-class`` with a declared
    WorkloadPriorityClass, so Kueue orders and preempts them by their runs' priority; one whose worker claims
    several does not (its Jobs' priority would not be their runs')."""
    from policy.checks.keda import claimed_priorities

    local = {(_get(r.inputs, "metadata", "namespace"), _metadata_name(r)) for r in resources if r.type in LOCAL_QUEUE_TYPES}
    classes = {_metadata_name(r) for r in resources if r.type in WORKLOAD_PRIORITY_CLASS_TYPES}
    for r in resources:
        if r.type != SCALED_JOB_TYPE:
            continue
        ns, name = _get(r.inputs, "metadata", "namespace"), _metadata_name(r)
        queue = _get(r.inputs, "metadata", "labels", KUEUE_QUEUE_LABEL)
        excluded = str(_get(r.inputs, "metadata", "annotations", KEDA_EXCLUDED_LABELS) or "").split(",")
        wpc = _get(r.inputs, "metadata", "labels", KUEUE_PRIORITY_CLASS_LABEL)
        prios = claimed_priorities(_get(r.inputs, "spec", "jobTargetRef", "template", "spec"))
        if len(prios) == 1 and (not wpc or KUEUE_PRIORITY_CLASS_LABEL in (e.strip() for e in excluded)):
            yield r, (f"ScaledJob {ns}/{name}: its workers claim only {prios[0]} runs but its Jobs carry no "
                      f"{KUEUE_PRIORITY_CLASS_LABEL}, so Kueue ranks them all alike; label the ScaledJob with the "
                      f"priority's WorkloadPriorityClass (infra/keda.py scaled_job_labels)")
        elif wpc and len(prios) != 1:
            yield r, (f"ScaledJob {ns}/{name}: {KUEUE_PRIORITY_CLASS_LABEL} is {wpc!r} but its workers claim runs of "
                      f"{len(prios)} priorities: remove the label, or set the worker's RAGPOOL_PRIORITIES to one")
        elif wpc and wpc not in classes:
            yield r, (f"ScaledJob {ns}/{name}: {KUEUE_PRIORITY_CLASS_LABEL} is {wpc!r}, but no WorkloadPriorityClass "
                      f"of that name is declared ({sorted(classes)}); Kueue cannot make their Workloads and they stay suspended "
                      "(infra/kueue_objects.py workload_priority_classes)")
        if not isinstance(queue, str) or not queue:
            yield r, (f"ScaledJob {ns}/{name}: no {KUEUE_QUEUE_LABEL} label, so the Jobs KEDA creates bypass Kueue; "
                      "label the ScaledJob with its namespace's LocalQueue (infra/worker_jobs.py)")
        elif KUEUE_QUEUE_LABEL in (e.strip() for e in excluded):
            yield r, (f"ScaledJob {ns}/{name}: {KEDA_EXCLUDED_LABELS} lists {KUEUE_QUEUE_LABEL}, so KEDA drops it "
                      "from the Jobs it creates and they bypass Kueue; remove it from the annotation")
        elif (ns, queue) not in local:
            yield r, (f"ScaledJob {ns}/{name}: {KUEUE_QUEUE_LABEL} is {queue!r}, but namespace {ns!r} has no "
                      f"LocalQueue of that name (declared: {sorted(q for n, q in local if n == ns)}); its Jobs would "
                      "stay suspended forever (infra/kueue_objects.py local_queue)")
