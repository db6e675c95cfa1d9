"""Every metric name from outside ragpool and DCGM that the rules and dashboards use.

The single allow-list for third-party exporters. A test proves each name a rule or panel
uses is either a ragpool contract name (``ragpool_metrics``), a DCGM field enabled in
``dcgm-counters.csv``, a recording rule of ours, or listed here, and that nothing listed
here is unused. Add a name here only together with the rule or panel that needs it.

Sources and what each needs from the deployment (see ``dashboards/README.md``):

* ``kube-state-metrics``: the kube-prometheus-stack 88.5.3 subchart (kube-state-metrics
  chart 8.4.0, app 2.20.0). ``kube_node_labels`` / ``kube_pod_labels`` only carry the
  ``label_*`` labels our rules read when ``metricLabelsAllowlist`` includes
  ``KSM_METRIC_LABELS_ALLOWLIST`` below. KSM sanitises resource names, so the GPU
  resource ``nvidia.com/gpu`` appears as ``resource="nvidia_com_gpu"``.
* ``redis_exporter``: oliver006/redis_exporter next to ragpool's Redis (``redis_up`` is
  0 when the exporter cannot reach Redis; ``redis_instance_info`` carries ``role``).
* ``yace``: prometheus-community/yet-another-cloudwatch-exporter with the ``AWS/EFS``
  job in ``YACE_EFS_JOB``. YACE names a CloudWatch metric
  ``aws_<namespace>_<snake_case(MetricName)>_<statistic>``; snake_case puts ``_`` only
  between a lower-case letter or digit and an upper-case one, so ``MeteredIOBytes``
  becomes ``metered_iobytes``. The dimension arrives as the label
  ``dimension_FileSystemId``. CloudWatch is the only source of EFS burst credits and
  permitted throughput, hence a CloudWatch exporter rather than node-exporter.
* ``kuberay-operator``: the KubeRay operator 1.7.0 (chart value ``metrics.serviceMonitor``,
  ``honorLabels: true`` so ``name``/``namespace`` are the RayCluster's;
  ray-operator/controllers/ray/metrics/ray_cluster_metrics.go).
* ``ray``: Ray 2.58 on ragpool's RayClusters, scraped by the PodMonitors in KubeRay's shape
  (infra/ray_cluster.py), which add ``ray_io_cluster``. Core metrics (GCS, raylet) on each
  node's ``metrics`` port: ``ray_placement_groups{State}`` (State is the
  PlacementGroupTableData state name: PENDING, CREATED, REMOVED, RESCHEDULING),
  ``ray_tasks{State}`` (TaskStatus names, e.g. PENDING_NODE_ASSIGNMENT); the autoscaler's
  ``autoscaler_*`` (ray/autoscaler/_private/prom_metrics.py) on the head's ``as-metrics``.
  Ray's own dashboards (dashboards/boards/ray.py) read more of Ray's names; they are Ray's
  and are not listed here.
* ``keda``: the KEDA operator 2.20.2 (infra/keda.py; chart value ``prometheus.operator``,
  scraped by its PodMonitor). kedacore/keda v2.20.2 pkg/metricscollector/prommetrics.go:
  ``keda_scaler_metrics_value{namespace, scaledObject, scaler, triggerIndex, metric, type}``
  (``scaledObject`` holds the ScaledJob's name for ``type="scaledjob"``; a Redis trigger's
  value is the list's length), ``keda_build_info`` and ``keda_scaled_job_errors_total{namespace, scaledJob}`` (counted
  for every failed read in pkg/scaling/scale_handler.go getScaledJobMetrics; the per-scaler
  ``keda_scaler_detail_errors_total`` is not, for ScaledJobs, at that tag).
* ``kueue``: the Kueue controller (kubernetes-sigs/kueue v0.19.2 pkg/metrics/metrics.go; a Prometheus
  subsystem ``kueue``, so every name starts ``kueue_``): ``kueue_build_info`` (set to 1 at start),
  ``kueue_pending_workloads{cluster_queue, status}``, and the ClusterQueue resource gauges
  ``kueue_cluster_queue_nominal_quota`` / ``kueue_cluster_queue_resource_reservation`` ``{cohort,
  cluster_queue, flavor, resource}`` (``resource`` is the raw resource name, ``nvidia.com/gpu``), which
  pkg/cache/scheduler/clusterqueue.go ``reportResourceMetrics`` reports only with the Kueue config's
  ``metrics.enableClusterQueueResources: true``. Every series carries ``replica_role`` (leader,
  follower or standalone). The queries are in dashboards/teams.py.
* ``opencost``: OpenCost's exporter (opencost/opencost pkg/costmodel/metrics.go, commit 4ed1bcfe):
  ``node_total_hourly_cost{instance, node, instance_type, region, provider_id}``, the node's price per
  hour; scraped with ``honor_labels`` as OpenCost documents, so ``node`` is the node's name.
* ``prometheus``: Prometheus' own ``up`` of each scrape target. A PodMonitor's target carries ``endpoint`` (the
  port name), ``namespace``, ``pod``, ``container`` (prometheus-operator pkg/prometheus/promcfg.go
  ``generatePodMonitorConfig``) and the relabelings of its endpoint (``ray_io_cluster`` on the Ray PodMonitors).
* kube-state-metrics lane labels: a worker Job and its pods carry ``lane.ragpool.io/<lane>: "true"``
  for every lane their worker claims (contract/lanes.py ``lane_labels``); ``kube_job_labels``
  and ``kube_pod_labels`` carry them as ``label_lane_ragpool_io_<lane>`` (:func:`ksm_label`) because
  ``KSM_METRIC_LABELS_ALLOWLIST`` allows the key pattern ``lane.ragpool.io/*`` for jobs and pods: one
  ``*`` per key is a partial wildcard since kube-state-metrics v2.20.0 (kubernetes/kube-state-metrics
  v2.20.0 internal/store/utils.go createPrometheusLabelKeysValues, pkg/options/types.go
  MaxPartialWildcardsPerLabel; commit a3d2f640). The lane names change with the stack's pools, the
  pattern does not.
* kube-state-metrics Jobs and pods (internal/store/job.go, pod.go at v2.20.0): KEDA's Jobs carry
  the ScaledJob as controller owner (``kube_job_owner{owner_kind="ScaledJob"}``), their pods the
  Job (``kube_pod_owner{owner_kind="Job"}``); ``kube_job_created`` (a creation timestamp), ``kube_job_complete``/``kube_job_failed`` and
  ``kube_pod_status_ready`` carry ``condition`` (true|false|unknown), ``kube_pod_status_phase``
  ``phase``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from contract.names import POOL_LABEL
from contract.lanes import LANE_LABEL_PREFIX, Lane

Source = Literal["kube-state-metrics", "redis_exporter", "yace", "kuberay-operator", "ray", "keda", "prometheus",
                 "kueue", "opencost"]


@dataclass(frozen=True)
class ExternalMetric:
    """One third-party metric we rely on."""

    name: str
    """Exposed series name."""
    source: Source
    """Exporter that emits it."""
    labels: tuple[str, ...]
    """Labels the rules or panels read (besides target labels)."""
    note: str
    """Why we use it / what it needs."""


EXTERNAL_METRICS: tuple[ExternalMetric, ...] = (
    ExternalMetric("kube_node_labels", "kube-state-metrics",
                   ("node", "label_ragpool_io_pool", "label_karpenter_sh_capacity_type",
                    "label_node_kubernetes_io_instance_type"),
                   "node -> pool / capacity type / instance type; needs the node allow-list"),
    ExternalMetric("kube_node_status_capacity", "kube-state-metrics", ("node", "resource"),
                   "GPUs per node (resource=nvidia_com_gpu): fleet size, GPU-hours, missing GPUs"),
    ExternalMetric("kube_node_status_allocatable", "kube-state-metrics", ("node", "resource"),
                   "allocatable GPUs (the device plugin withholds unhealthy ones)"),
    ExternalMetric("kube_node_status_condition", "kube-state-metrics", ("node", "condition", "status"),
                   "Ready condition of GPU nodes"),
    ExternalMetric("kube_node_spec_taint", "kube-state-metrics", ("node", "key", "value"),
                   "a node's taints (internal/store/node.go: key, value, effect): the health-check fence "
                   "(RagpoolGpuNodeFenced)"),
    ExternalMetric("kube_pod_labels", "kube-state-metrics",
                   ("namespace", "pod", "label_ragpool_io_run_id", "label_lane_ragpool_io_<lane>"),
                   "pod -> run id, to name the run holding an idle GPU; worker pod -> the lanes it claims "
                   "(Autoscaling dashboard, a row per lane); needs the pod allow-list"),
    ExternalMetric("kube_job_labels", "kube-state-metrics", ("namespace", "job_name", "label_lane_ragpool_io_<lane>"),
                   "worker Job -> the lanes its worker claims (Autoscaling dashboard, a row per lane); needs the "
                   "job allow-list"),
    ExternalMetric("kube_pod_container_resource_requests", "kube-state-metrics",
                   ("namespace", "pod", "node", "resource"), "GPUs requested by pods (allocation vs capacity)"),
    ExternalMetric("kube_pod_container_status_ready", "kube-state-metrics", ("namespace", "pod", "container"),
                   "readiness of the Ray head container (ray-head): RagpoolRayHeadDown"),
    ExternalMetric("kube_job_owner", "kube-state-metrics", ("namespace", "job_name", "owner_kind", "owner_name"),
                   "Job -> the KEDA ScaledJob that started it"),
    ExternalMetric("kube_job_complete", "kube-state-metrics", ("namespace", "job_name", "condition"),
                   "finished Jobs (condition=true): no longer counted by KEDA"),
    ExternalMetric("kube_job_failed", "kube-state-metrics", ("namespace", "job_name", "condition"),
                   "failed Jobs (condition=true): no longer counted by KEDA"),
    ExternalMetric("kube_job_created", "kube-state-metrics", ("namespace", "job_name"),
                   "a Job's creation time: failed worker Jobs of the last 15 minutes (RagpoolLaneWorkerJobsFailing)"),
    ExternalMetric("kube_pod_owner", "kube-state-metrics", ("namespace", "pod", "owner_kind", "owner_name"),
                   "worker pod -> its Job"),
    ExternalMetric("kube_pod_status_ready", "kube-state-metrics", ("namespace", "pod", "condition"),
                   "Ready worker pods (a worker holding a claim): KEDA's pendingPodConditions [Ready]"),
    ExternalMetric("kube_pod_status_phase", "kube-state-metrics", ("namespace", "pod", "phase"),
                   "worker pods Pending (node coming) and Running"),
    ExternalMetric("keda_scaler_metrics_value", "keda", ("namespace", "scaledObject", "type"),
                   "each Redis trigger's last list length, per ScaledJob (scaledObject = its name)"),
    ExternalMetric("keda_scaled_job_errors_total", "keda", ("namespace", "scaledJob"),
                   "failed reads of a ScaledJob's triggers"),
    ExternalMetric("keda_build_info", "keda", (), "1 while an operator runs (registered at start): RagpoolKedaDown"),
    ExternalMetric("kuberay_cluster_info", "kuberay-operator", ("name", "namespace"),
                   "one series per RayCluster the operator knows"),
    ExternalMetric("ray_placement_groups", "ray", ("namespace", "ray_io_cluster", "State"),
                   "placement groups by state (GCS, head): pending reservations of the driver's stages"),
    ExternalMetric("ray_tasks", "ray", ("namespace", "ray_io_cluster", "State"),
                   "tasks by state: PENDING_NODE_ASSIGNMENT is demand waiting for a node"),
    ExternalMetric("up", "prometheus", ("namespace", "ray_io_cluster", "endpoint"),
                   "scrape health of the Ray head's autoscaler sidecar (endpoint as-metrics): RagpoolRayAutoscalerDown"),
    ExternalMetric("autoscaler_pending_nodes", "ray", ("namespace", "ray_io_cluster", "NodeType"),
                   "workers the Ray autoscaler is launching, per worker group"),
    ExternalMetric("kueue_build_info", "kueue", (), "1 while a Kueue controller runs: RagpoolKueueDown"),
    ExternalMetric("kueue_pending_workloads", "kueue", ("cluster_queue", "status", "replica_role"),
                   "workloads waiting per ClusterQueue (a team): RagpoolTeamStarvedWhileCohortIdle, Teams dashboard"),
    ExternalMetric("kueue_cluster_queue_nominal_quota", "kueue",
                   ("cohort", "cluster_queue", "flavor", "resource", "replica_role"),
                   "a team's nominal GPU quota per flavor (`ragpool usage`, Teams dashboard, cohort idle quota)"),
    ExternalMetric("kueue_cluster_queue_resource_reservation", "kueue",
                   ("cohort", "cluster_queue", "flavor", "resource", "replica_role"),
                   "GPUs reserved for a team's admitted workloads per flavor: above nominal = borrowed"),
    ExternalMetric("node_total_hourly_cost", "opencost", ("node",),
                   "a node's price per hour, shared over its GPUs: a team's dollars (`ragpool usage`, Teams dashboard)"),
    ExternalMetric("redis_up", "redis_exporter", ("instance",), "1 when the exporter reached Redis"),
    ExternalMetric("redis_instance_info", "redis_exporter", ("instance", "role"), "role=master|slave per instance"),
    ExternalMetric("redis_connected_clients", "redis_exporter", ("instance",), "clients (workers) connected"),
    ExternalMetric("redis_memory_used_bytes", "redis_exporter", ("instance",), "Redis memory in use"),
    ExternalMetric("aws_efs_burst_credit_balance_minimum", "yace", ("dimension_FileSystemId",),
                   "CloudWatch AWS/EFS BurstCreditBalance, Minimum, bytes"),
    ExternalMetric("aws_efs_metered_iobytes_sum", "yace", ("dimension_FileSystemId",),
                   "CloudWatch AWS/EFS MeteredIOBytes, Sum per 60 s period, bytes"),
    ExternalMetric("aws_efs_permitted_throughput_average", "yace", ("dimension_FileSystemId",),
                   "CloudWatch AWS/EFS PermittedThroughput, Average, bytes/s"),
)

#: ``kube-state-metrics.metricLabelsAllowlist`` entries the rules and dashboards assume.
KSM_METRIC_LABELS_ALLOWLIST: tuple[str, ...] = (
    f"nodes=[karpenter.sh/capacity-type,{POOL_LABEL},node.kubernetes.io/instance-type]",
    f"pods=[ragpool.io/run-id,{LANE_LABEL_PREFIX}*]",
    f"jobs=[{LANE_LABEL_PREFIX}*]",
)

_KSM_INVALID_LABEL_CHAR = re.compile(r"[^a-zA-Z0-9_]")
_KSM_ALL_CAP = re.compile(r"([a-z0-9])([A-Z])")


def ksm_label(key: str) -> str:
    """kube-state-metrics' label name for the Kubernetes label ``key`` on a ``kube_<kind>_labels``
    series: ``label_`` + the key with every character outside ``[a-zA-Z0-9_]`` made ``_``, then
    snake-cased and lower-cased (kubernetes/kube-state-metrics v2.20.0 internal/store/utils.go
    labelName, SanitizeLabelName, lintLabelName)."""
    return "label_" + _KSM_ALL_CAP.sub(r"\1_\2", _KSM_INVALID_LABEL_CHAR.sub("_", key)).lower()


def lane_ksm_label(lane: Lane) -> str:
    """The label of ``kube_job_labels`` / ``kube_pod_labels`` that is ``"true"`` on the worker Jobs and
    pods claiming ``lane`` (contract/lanes.py ``lane_labels``)."""
    return ksm_label(LANE_LABEL_PREFIX + lane.name)

#: CloudWatch period (seconds) the YACE EFS job uses; ``aws_efs_metered_iobytes_sum`` is a
#: per-period sum, so the throughput rule divides by it.
YACE_EFS_PERIOD_SECONDS = 60

#: The YACE discovery job (``config.discovery.jobs[]`` of the YACE config) that yields
#: exactly the ``yace`` names above.
YACE_EFS_JOB: dict[str, object] = {
    "type": "AWS/EFS",
    "regions": ["<stack region>"],
    "period": YACE_EFS_PERIOD_SECONDS,
    "length": 300,
    "metrics": [
        {"name": "BurstCreditBalance", "statistics": ["Minimum"]},
        {"name": "MeteredIOBytes", "statistics": ["Sum"]},
        {"name": "PermittedThroughput", "statistics": ["Average"]},
    ],
}


def yace_metric_name(namespace: str, metric: str, statistic: str) -> str:
    """The series name YACE exposes for a CloudWatch ``namespace``/``metric``/``statistic``.

    ``AWS/EFS`` -> ``efs``; CamelCase -> snake_case with ``_`` only after a lower-case
    letter or digit (YACE's ``PromString``), then lower-cased.
    """
    service = namespace.split("/", 1)[1].lower()
    parts: list[str] = []
    prev = ""
    for ch in metric:
        if ch.isupper() and (prev.islower() or prev.isdigit()):
            parts.append("_")
        parts.append(ch.lower())
        prev = ch
    return f"aws_{service}_{''.join(parts)}_{statistic.lower()}"


def external_by_name() -> dict[str, ExternalMetric]:
    """The allow-list keyed by metric name."""
    return {m.name: m for m in EXTERNAL_METRICS}
