"""Kueue's objects from the stack config: plain functions (no Pulumi resource), so the program (infra/kueue.py), the policies
(policy/checks/kueue.py), the tests and the admission simulation read the same objects.

Fields: kubernetes-sigs/kueue v0.19.2 apis/kueue/v1beta2 (vendored CRDs: vendor/upstream/crds/kueue.x-k8s.io/).

- A ``ResourceFlavor`` per GPU pool (:func:`resource_flavor`): the pool's node labels (its ``ragpool.io/pool`` and
  Karpenter's ``karpenter.sh/capacity-type``, so spot and on-demand GPUs are different flavors) and the GPU
  taint's toleration. A worker pod's own nodeSelector names its pool: Kueue picks only a flavor whose
  nodeLabels agree (pkg/scheduler/flavorassigner/flavorassigner.go at the tag).
- One ``Cohort`` (:data:`COHORT`): every ClusterQueue lends to and borrows from it.
- A ``ClusterQueue`` per training namespace (:func:`cluster_queue`, named as the namespace), covering
  ``nvidia.com/gpu`` only (the manager's ``resources.quotaCheckStrategy: IgnoreUndeclared`` leaves CPU,
  memory and EFA devices to the namespace's LimitRange and the nodes): per flavor a nominal quota
  (:func:`nominal_quotas`), the team's borrowingLimit / lendingLimit, ``preemption`` (reclaim lent GPUs
  from any workload, preempt lower priorities within the queue) and the team's fair-sharing weight.
- A ``LocalQueue`` :data:`LOCAL_QUEUE` per training namespace: the queue the worker Jobs name
  (``contract.names.KUEUE_QUEUE_LABEL``).
- ``WorkloadPriorityClass`` ``ragpool-<priority>`` per queue priority (``contract.lanes.PRIORITIES``).
"""

from __future__ import annotations

from typing import Any

import yaml

from contract.lanes import PRIORITIES
from contract.names import GPU_RESOURCE, KUEUE_API_VERSION, POOL_LABEL
from infra.common import GPU_TOLERATION, k8s_labels
from infra.config import StackConfig
from infra.config_gpu import GpuPoolConfig, TeamConfig
from infra.peers import TRAINING_NAMESPACE, TRAINING_NAMESPACE_LABEL
from infra.training_namespace import PRIORITY_CLASSES

API_VERSION = KUEUE_API_VERSION
"""The storage version at the pin (v1beta1 is served, deprecated)."""
KUEUE_NAMESPACE = "kueue-system"
"""The chart's release namespace (its README installs it there)."""
RELEASE_NAME = "kueue"
"""The Helm release: with the chart's name it makes every object name ``kueue-...`` (templates/_helpers.tpl
``kueue.fullname``)."""
MANAGER_POD_LABELS = {"app.kubernetes.io/name": "kueue", "app.kubernetes.io/instance": RELEASE_NAME,
                      "control-plane": "controller-manager"}
"""The controller manager's pods (templates/_helpers.tpl ``kueue.selectorLabels``)."""
METRICS_SERVICE_LABELS = {**MANAGER_POD_LABELS, "app.kubernetes.io/component": "metrics-service"}
"""The metrics Service (templates/manager/auth_proxy_service.yaml, ``kueue.metricsService.labels``)."""
# The manager's ports (templates/manager/manager.yaml containerPort; the config below binds them).
METRICS_PORT = 8443
WEBHOOK_PORT = 9443
VISIBILITY_PORT = 8082
HEALTH_PORT = 8081
COHORT = "ragpool"
LOCAL_QUEUE = "ragpool"
"""Every training namespace's LocalQueue."""
CAPACITY_TYPE_LABEL = "karpenter.sh/capacity-type"
"""Karpenter's well-known node label (spot / on-demand; infra/gpu_pools.py requires it per pool)."""
PREEMPTION = {"reclaimWithinCohort": "Any", "withinClusterQueue": "LowerPriority"}
"""Lent GPUs come back when their owner needs them, whatever the borrower's priority; inside one queue a
higher priority preempts a lower one."""
WORKER_PRIORITY_CLASS = "ragpool-training"
"""The worker pods' PriorityClass (infra/worker_jobs.py): Kueue takes its value as the priority of a Job without
the priority-class label (pkg/util/priority/priority.go at the tag)."""
# WorkloadPriorityClass values: ``normal`` is the workers' PriorityClass value, so an unlabelled worker Job ranks
# as a normal one; ``high`` above it, ``low`` below.
PRIORITY_VALUES = {"high": 2 * PRIORITY_CLASSES[WORKER_PRIORITY_CLASS][0], "normal": PRIORITY_CLASSES[WORKER_PRIORITY_CLASS][0],
                   "low": PRIORITY_CLASSES[WORKER_PRIORITY_CLASS][0] // 2}
FAIR_SHARING_STRATEGIES = ["LessThanOrEqualToFinalShare", "LessThanInitialShare"]
"""Required with fair sharing on; one of the sets Kueue accepts (pkg/config/validation.go validStrategySets)."""


def _labels(name: str) -> dict[str, str]:
    return k8s_labels("queueing", name)


def priority_class_name(priority: str) -> str:
    return f"ragpool-{priority}"


def resource_flavor(pool: GpuPoolConfig) -> dict[str, Any]:
    """The pool's ResourceFlavor (named as the pool)."""
    return {"apiVersion": API_VERSION, "kind": "ResourceFlavor", "metadata": {"name": pool.name, "labels": _labels(pool.name)},
            "spec": {"nodeLabels": {POOL_LABEL: pool.name, CAPACITY_TYPE_LABEL: pool.capacity_type},
                     "tolerations": [dict(GPU_TOLERATION)]}}


def cohort() -> dict[str, Any]:
    return {"apiVersion": API_VERSION, "kind": "Cohort", "metadata": {"name": COHORT, "labels": _labels(COHORT)},
            "spec": {}}


def training_namespaces(cfg: StackConfig) -> list[tuple[str, TeamConfig | None]]:
    """(namespace, its team; None for the main namespace), the main namespace first."""
    return [(TRAINING_NAMESPACE, None), *((t.namespace, t) for t in cfg.teams)]


def nominal_quotas(cfg: StackConfig) -> dict[str, dict[str, int]]:
    """namespace -> pool -> nominal GPUs. Kueue's quotas are per flavor; a team's gpuQuota is spread over the
    pools in the stack's order, whole workers (the pool's gpusPerWorker) first, then any rest where GPUs are
    left; the main namespace gets what the teams leave of every pool. Per pool the sum is its gpuLimit."""
    free = {p.name: p.gpu_limit for p in cfg.gpu_pools}
    out: dict[str, dict[str, int]] = {}
    for team in cfg.teams:
        share = {p.name: 0 for p in cfg.gpu_pools}
        left = team.gpu_quota
        for whole in (True, False):
            for p in cfg.gpu_pools:
                take = min(left, free[p.name])
                if whole:
                    take -= take % p.gpus_per_worker
                share[p.name] += take
                free[p.name] -= take
                left -= take
        out[team.namespace] = share
    return {TRAINING_NAMESPACE: free, **out}


def _flavor_quota(pool: str, nominal: int, team: TeamConfig | None) -> dict[str, Any]:
    resource: dict[str, Any] = {"name": GPU_RESOURCE, "nominalQuota": nominal}
    if team is not None and team.borrowing_limit is not None:
        resource["borrowingLimit"] = team.borrowing_limit
    if team is not None and team.lending_limit is not None:
        resource["lendingLimit"] = min(team.lending_limit, nominal)
    return {"name": pool, "resources": [resource]}


def cluster_queue(cfg: StackConfig, namespace: str, team: TeamConfig | None) -> dict[str, Any]:
    """The ClusterQueue of a training namespace (named as the namespace; only its own LocalQueue's Jobs)."""
    nominal = nominal_quotas(cfg)[namespace]
    return {"apiVersion": API_VERSION, "kind": "ClusterQueue", "metadata": {"name": namespace, "labels": _labels(namespace)},
            "spec": {
                "cohortName": COHORT,
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
                "queueingStrategy": "BestEffortFIFO",
                "resourceGroups": [{"coveredResources": [GPU_RESOURCE],
                                    "flavors": [_flavor_quota(p.name, nominal[p.name], team) for p in cfg.gpu_pools]}],
                "preemption": dict(PREEMPTION),
                "fairSharing": {"weight": team.fair_share_weight if team else 1},
            }}


def local_queue(namespace: str) -> dict[str, Any]:
    return {"apiVersion": API_VERSION, "kind": "LocalQueue",
            "metadata": {"name": LOCAL_QUEUE, "namespace": namespace, "labels": _labels(LOCAL_QUEUE)},
            "spec": {"clusterQueue": namespace}}


def workload_priority_classes() -> list[dict[str, Any]]:
    return [{"apiVersion": API_VERSION, "kind": "WorkloadPriorityClass",
             "metadata": {"name": priority_class_name(p), "labels": _labels(priority_class_name(p))},
             "value": PRIORITY_VALUES[p], "description": f"ragpool queue priority {p}"} for p in PRIORITIES]


def kueue_objects(cfg: StackConfig) -> list[dict[str, Any]]:
    """Every Kueue object of the stack, in the order they may be created."""
    return [*(resource_flavor(p) for p in cfg.gpu_pools), cohort(), *workload_priority_classes(),
            *(cluster_queue(cfg, ns, team) for ns, team in training_namespaces(cfg)),
            *(local_queue(ns) for ns, _ in training_namespaces(cfg))]


def reachable_gpus(cfg: StackConfig, namespace: str) -> int:
    """The most GPUs a namespace's Jobs can hold at once: per pool its nominal quota plus what it may borrow
    (its borrowingLimit, and no more than the others lend), within the pool's gpuLimit. The namespace's
    ResourceQuota and its ScaledJobs' maxReplicaCount follow this, not the nominal quota (docs/DESIGN.md,
    "KEDA and Kueue")."""
    nominal = nominal_quotas(cfg)
    teams = {ns: team for ns, team in training_namespaces(cfg)}
    team = teams[namespace]
    total = 0
    for p in cfg.gpu_pools:
        lent = sum(q[p.name] if teams[ns] is None or teams[ns].lending_limit is None
                   else min(teams[ns].lending_limit, q[p.name]) for ns, q in nominal.items() if ns != namespace)
        borrow = lent if team is None or team.borrowing_limit is None else min(team.borrowing_limit, lent)
        total += min(p.gpu_limit, nominal[namespace][p.name] + borrow)
    return total


def manager_config() -> dict[str, Any]:
    """The controller manager's Configuration (config.kueue.x-k8s.io/v1beta2; apis/config/v1beta2 at the tag),
    the chart's ``managerConfig.controllerManagerConfigYaml``: the chart's defaults for the ports, probes and
    leader election, and ragpool's choices: only ``batch/job`` (the worker Jobs; fewer integrations, fewer
    watches), only Jobs that name a queue (``contract.names.KUEUE_QUEUE_LABEL``) in a training namespace, fair sharing
    on (the ClusterQueues' weights), and quota checked for the covered resources only (``IgnoreUndeclared``;
    feature gate QuotaCheckStrategy, beta and on by default at v0.19)."""
    return {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2", "kind": "Configuration",
        "health": {"healthProbeBindAddress": f":{HEALTH_PORT}"},
        # the ClusterQueues' quota and usage series (kueue_cluster_queue_nominal_quota, ..._resource_reservation):
        # what `ragpool usage` and the Teams board read (pkg/controller/core/core.go WithReportResourceMetrics)
        "metrics": {"bindAddress": f":{METRICS_PORT}", "enableClusterQueueResources": True},
        "webhook": {"port": WEBHOOK_PORT},
        "leaderElection": {"leaderElect": True, "resourceName": "c1f6bfd2.kueue.x-k8s.io"},
        "manageJobsWithoutQueueName": False,
        "managedJobsNamespaceSelector": {"matchLabels": dict(TRAINING_NAMESPACE_LABEL)},
        "integrations": {"frameworks": ["batch/job"]},
        "fairSharing": {"preemptionStrategies": list(FAIR_SHARING_STRATEGIES)},
        "resources": {"quotaCheckStrategy": "IgnoreUndeclared"},
    }


def manager_config_yaml() -> str:
    return yaml.safe_dump(manager_config(), sort_keys=False)

