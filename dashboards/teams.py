"""Per-team GPU usage in PromQL: the one home of the queries ``ragpool usage`` runs and the
"ragpool / Teams" dashboard shows (dashboards/boards/teams.py, dashboards/usage.py).

A team is a training namespace: ``trainingTeams[].name`` owns ``ragpool-team-<name>``
(``contract.names.TEAM_NAMESPACE_PREFIX``), the main training namespace holds what the teams do not own,
and each has a Kueue ClusterQueue named after it (infra/kueue.py). Every expression here yields one
series per ``namespace`` (and per ``capacity_type`` where it says so); :func:`team_of` turns a
namespace into the team name people type.

Sources (the names are in dashboards/external_metrics.py with their upstream files):

* **allocated**: GPUs requested (``kube_pod_container_resource_requests``, kube-state-metrics) by pods
  that are Running (``kube_pod_status_phase``) on a node of a ragpool GPU pool (``kube_node_labels``),
  split by the node's Karpenter capacity type (spot / on-demand);
* **used**: DCGM's ``DCGM_FI_DEV_GPU_UTIL`` (0-100 per GPU) of the GPUs a team's pods hold, /100:
  a GPU busy half the time counts half a GPU;
* **nominal / reserved / borrowed**: Kueue's ClusterQueue resource metrics for ``nvidia.com/gpu``
  (kubernetes-sigs/kueue v0.19.2 pkg/metrics/metrics.go ``cluster_queue_nominal_quota``,
  ``cluster_queue_resource_reservation``; reported by pkg/cache/scheduler/clusterqueue.go
  ``reportResourceMetrics`` per flavor only with the Kueue config's
  ``metrics.enableClusterQueueResources: true``). Borrowed = reservation above nominal, per flavor
  (Kueue quota is per flavor and resource). ``replica_role="follower"`` series of an HA Kueue are left
  out (the leader's count);
* **dollars**: OpenCost's ``node_total_hourly_cost`` (opencost/opencost pkg/costmodel/metrics.go,
  labels ``instance, node, instance_type, region, provider_id``) shared over the node's GPUs
  (``kube_node_status_capacity``): a team pays for its share of each GPU node it holds, CPU and memory
  included, because on a GPU instance they come with the GPUs.

Window figures (:func:`gpu_hours`, :func:`dollars`) integrate a per-minute subquery: each minute a
series is present counts 1/60 hour.
"""

from __future__ import annotations

import re

from contract.names import GPU_RESOURCE, POOL_LABEL
from dashboards.external_metrics import ksm_label
from contract.names import TEAM_NAMESPACE_PREFIX

STEP = "1m"
"""Subquery resolution of the window figures."""
STEP_PER_HOUR = 60
"""Subquery points per hour (``STEP``)."""
CAPACITY_TYPE_LABEL = "karpenter.sh/capacity-type"
"""The Karpenter node label naming spot / on-demand (kubernetes-sigs/karpenter pkg/apis/v1 labels.go)."""

_KSM_GPU = re.sub(r"[^a-zA-Z0-9_]", "_", GPU_RESOURCE)  # kube-state-metrics sanitises resource names
_KUEUE_GPU = f'resource="{GPU_RESOURCE}", replica_role!="follower"'


def _namespace_from(expr: str, label: str) -> str:
    return f'label_replace({expr}, "namespace", "$1", "{label}", "(.+)")'


# --------------------------------------------------------------------------- instant expressions

NODE_CAPACITY_TYPE = (
    f'max by (node, capacity_type) (label_replace(kube_node_labels{{{ksm_label(POOL_LABEL)}!=""}}, '
    f'"capacity_type", "$1", "{ksm_label(CAPACITY_TYPE_LABEL)}", "(.+)"))'
)
"""Node -> capacity type, for the nodes of ragpool GPU pools."""

POD_GPUS = (
    f'sum by (namespace, pod, node) (kube_pod_container_resource_requests{{resource="{_KSM_GPU}"}}) '
    f'* on (namespace, pod) group_left () '
    f'(max by (namespace, pod) (kube_pod_status_phase{{phase="Running"}}) == 1)'
)
"""GPUs each Running pod holds, with its node."""

ALLOCATED = (
    f"sum by (namespace, capacity_type) (({POD_GPUS}) * on (node) group_left (capacity_type) {NODE_CAPACITY_TYPE})"
)
"""GPUs held by each team's Running pods on ragpool GPU nodes, by capacity type."""

POOL_NODES = f'max by (node) (kube_node_labels{{{ksm_label(POOL_LABEL)}!=""}})'
"""The nodes of ragpool GPU pools (value 1)."""

USED = _namespace_from(
    f'sum by (exported_namespace) (DCGM_FI_DEV_GPU_UTIL{{exported_namespace!=""}} * on (node) group_left () {POOL_NODES})',
    "exported_namespace") + " / 100"
"""GPUs' worth of DCGM utilisation of the GPUs each team's pods hold on ragpool GPU nodes."""

NOMINAL = (
    f"sum by (namespace) ({_namespace_from(f'max by (cluster_queue, flavor) (kueue_cluster_queue_nominal_quota{{{_KUEUE_GPU}}})', 'cluster_queue')})"
)
"""Each team's ClusterQueue's nominal GPU quota, all flavors."""

RESERVED = (
    f"sum by (namespace) ({_namespace_from(f'max by (cluster_queue, flavor) (kueue_cluster_queue_resource_reservation{{{_KUEUE_GPU}}})', 'cluster_queue')})"
)
"""GPUs Kueue has reserved for each team's admitted workloads, all flavors."""

_BORROWED_BY_FLAVOR = (
    f"clamp_min(max by (cluster_queue, flavor) (kueue_cluster_queue_resource_reservation{{{_KUEUE_GPU}}}) "
    f"- max by (cluster_queue, flavor) (kueue_cluster_queue_nominal_quota{{{_KUEUE_GPU}}}), 0)"
)
BORROWED = f"sum by (namespace) ({_namespace_from(_BORROWED_BY_FLAVOR, 'cluster_queue')})"
"""GPUs each team holds above its nominal quota (borrowed from the cohort), summed over flavors."""

PENDING = "sum by (namespace) (" + _namespace_from('kueue_pending_workloads{replica_role!="follower"}',
                                                  "cluster_queue") + ")"
"""Workloads waiting in each team's ClusterQueue (active and inadmissible)."""

GPU_HOURLY_PRICE = (
    f'max by (node) (node_total_hourly_cost) / max by (node) (kube_node_status_capacity{{resource="{_KSM_GPU}"}} > 0)'
)
"""Each GPU node's hourly price per GPU (OpenCost's node price over the node's GPUs)."""

COST_PER_HOUR = f"sum by (namespace) (({POD_GPUS}) * on (node) group_left () ({GPU_HOURLY_PRICE}))"
"""Dollars per hour of the GPUs each team's Running pods hold."""

COHORT_IDLE_GPUS = (
    f"sum by (cohort) (max by (cohort, cluster_queue, flavor) (kueue_cluster_queue_nominal_quota{{{_KUEUE_GPU}, cohort!=\"\"}})) "
    f"- sum by (cohort) (max by (cohort, cluster_queue, flavor) "
    f"(kueue_cluster_queue_resource_reservation{{{_KUEUE_GPU}, cohort!=\"\"}}))"
)
"""GPUs of each cohort's nominal quota that no workload reserves (the alert RagpoolTeamStarvedWhileCohortIdle
reads the same difference; dashboards/rules/teams.yaml)."""


# --------------------------------------------------------------------------- window figures

def gpu_hours(expr: str, window: str, by: str = "namespace") -> str:
    """GPU-hours of ``expr`` (a GPU count) over the ``window`` (a PromQL duration or ``$__range``) that ends
    at the query's evaluation time, per ``by``."""
    return f"sum by ({by}) (sum_over_time(({expr})[{window}:{STEP}])) / {STEP_PER_HOUR}"


def dollars(window: str) -> str:
    """Dollars each team's GPUs cost over ``window``."""
    return gpu_hours(COST_PER_HOUR, window)


def team_of(namespace: str) -> str:
    """The team name of a training namespace: ``ragpool-team-a`` -> ``a``; the main namespace keeps its name."""
    return namespace.removeprefix(TEAM_NAMESPACE_PREFIX)
