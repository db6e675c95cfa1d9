"""Ray on the cluster: the KubeRay operator and one long-lived, autoscaling RayCluster per
training namespace (``ragpool-training`` and each team's), scraped and on Grafana.

- **Operator**: Helm chart kuberay-operator (infra/charts.py) on the system nodes, with
  ``skipCrds``: Helm installs a chart's crds/ only on first install and never upgrades
  them, so the CRDs are applied by Pulumi (server-side) from the chart's crds/ at the
  commit of its tag, vendored in infra/crds/kuberay/, and a chart bump upgrades them too.
- **RayCluster** ``ragpool-ray`` per namespace: the head on the system nodes with
  ``num-cpus: 0`` (it schedules, it does not compute); one worker group per GPU pool,
  minReplicas 0, maxReplicas from the pool (config ``rayMaxWorkers``, else
  gpuLimit / gpusPerWorker; a team namespace is capped by its GPU quota), the pool's node
  selector and GPU toleration, whole GPUs per worker, the Ray node label
  ``ragpool.io/pool=<pool>`` and the custom resource ``ragpool-pool-<pool>-gpus`` (one unit
  per GPU) so the driver can reserve bundles on a pool. In-tree autoscaling (autoscaler v2)
  adds and removes worker pods; Karpenter brings GPU nodes up for them and removes the
  empty ones. ``/dev/shm`` (object store) and ``/tmp/ray`` are sized explicitly, the shared
  EFS claim is mounted at the training mount path, Ray logs go to stderr
  (``--no-redirect-output``). Every Ray port is pinned (infra/training_namespace.py), so
  the namespace's NetworkPolicies open exactly those. Services stay ClusterIP.
- **Token authentication** (Ray 2.58 ``RAY_AUTH_MODE=token``): every RayCluster's ``authOptions``
  names its namespace's Secret ``ragpool-ray-auth`` (key ``auth_token``), a Pulumi RandomPassword
  per namespace (never shared between teams); KubeRay hands it to every Ray container
  (:func:`auth_options`). The Ray worker template mounts the same Secret (infra/worker_jobs.py);
  nothing else does. The dashboard, the Jobs API, the GCS and the client port all ask for it.
- **Metrics**: PodMonitors in KubeRay's shape (config/prometheus/podMonitor.yaml: head
  ``metrics``/``as-metrics``/``dash-metrics``, workers ``metrics``, label ``ray_io_cluster``)
  and Ray's Grafana dashboards generated from the pinned Ray (dashboards/boards/ray.py).

The Ray Jobs API of a namespace's cluster is ``ray_address(namespace)``; the CPU worker
template (infra/worker_jobs.py ``ragpool-worker-ray``) submits ``executor: ray`` runs there.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_kubernetes as k8s
import pulumi_random as random

from dashboards.boards.ray import committed as ray_dashboards
from infra.component import RagpoolComponent
from infra.charts import KUBERAY_CRD_DIR, KUBERAY_CRD_FILES, KUBERAY_OPERATOR
from infra.common import GPU_TOLERATION, POOL_LABEL, SHARED_MOUNT_PATH, SYSTEM_NODE_SELECTOR, TRAINING_UID, child, k8s_labels, load_values
from infra.config import StackConfig
from infra.config_gpu import STOP_MARGIN_S, GpuPoolConfig, pod_grace_seconds
from infra.efa_devices import efa_env, pool_efa_devices
from infra.gpu_memory import pod_memory_gib
from infra.pod_security import container_security_context, pod_security_context
from contract.ray_auth import TOKEN_MODE, TOKEN_SECRET_KEY
from contract.names import EFA_RESOURCE, GPU_RESOURCE, RAY_NOTICE_MODULE, RAY_VERSION
from contract.paths import SHARED_ROOT_ENV
from contract.ray_pools import format_pools
from infra.training_namespace import (
    RAY_AUTOSCALER_METRICS_PORT, RAY_CLIENT_PORT, RAY_DASHBOARD_AGENT_GRPC_PORT, RAY_DASHBOARD_AGENT_LISTEN_PORT,
    RAY_DASHBOARD_METRICS_PORT, RAY_DASHBOARD_PORT, RAY_GCS_PORT, RAY_MAX_WORKER_PORT, RAY_METRICS_PORT,
    RAY_MIN_WORKER_PORT, RAY_NODE_MANAGER_PORT, RAY_OBJECT_MANAGER_PORT, RAY_POD_LABELS, RAY_RUNTIME_ENV_AGENT_PORT,
)

KUBERAY_NAMESPACE = "kuberay-system"
RAY_CLUSTER_NAME = "ragpool-ray"
# KubeRay names the head Service <cluster>-head-svc (utils.GenerateHeadServiceName).
RAY_HEAD_SERVICE = f"{RAY_CLUSTER_NAME}-head-svc"
# The namespace's Ray token (key TOKEN_SECRET_KEY), one per namespace, never shared between teams:
# referenced by the RayCluster's authOptions and mounted by the Ray worker template (worker_jobs.py).
RAY_AUTH_SECRET = f"{RAY_CLUSTER_NAME}-auth"
RAY_TOKEN_LENGTH = 64  # alphanumeric: ~380 bits (Ray's own generator makes 256)
HEAD_CONTAINER = "ray-head"
WORKER_CONTAINER = "ray-worker"
# KubeRay's names for the volumes it would otherwise add unsized (pod.go): declaring them
# with a size makes KubeRay keep ours, and the autoscaler sidecar shares ray-logs.
SHM_VOLUME = "shared-mem"
RAY_TMP_VOLUME = "ray-logs"
RAY_TMP_PATH = "/tmp/ray"
AUTOSCALER_IDLE_TIMEOUT_SECONDS = 300
HEAD_RAY_TMP_GIB = 10
WORKER_RAY_TMP_GIB = 50  # spilled objects and session files of training workers


# Ray's autoscaler owns these once it has scaled a group: it JSON-patches /spec/workerGroupSpecs/<i>/replicas
# and .../scaleStrategy (workersToDelete). `pulumi up` ignores them (no diff, never an update of its own),
# and forces the server-side apply (pulumi.com/patchForce) because workerGroupSpecs is an atomic list in
# KubeRay's CRD (no listType): without force the next change of the RayCluster fails with 409. Forcing
# writes the declared replicas (0) back, which kills no worker: with in-tree autoscaling KubeRay deletes
# only the pods in workersToDelete, and Ray's autoscaler restores replicas from the workers it observes.
# Sources (pulumi-kubernetes await.go handleSSAIgnoreFields/patchForce, KubeRay raycluster_controller.go,
# Ray's KubeRay cloud provider): infra/reference/raycluster_autoscaler_fields.yaml.
AUTOSCALER_OWNED = tuple(f"spec.workerGroupSpecs[*].{field}" for field in ("replicas", "scaleStrategy"))
PATCH_FORCE = {"pulumi.com/patchForce": "true"}


def ray_address(namespace: str) -> str:
    """The Ray Jobs API (dashboard port) of the RayCluster in ``namespace``."""
    return f"http://{RAY_HEAD_SERVICE}.{namespace}.svc:{RAY_DASHBOARD_PORT}"


@dataclass(frozen=True)
class RayEndpoint:
    """What a namespace's Ray worker template needs to know of its RayCluster."""

    address: str
    """The Jobs API (``RAY_ADDRESS``)."""
    pools: str
    """``RAGPOOL_RAY_POOLS``: the pools the cluster offers (:func:`ray_pools`, contract/ray_pools.py format)."""
    namespace: str
    """The namespace of the cluster (and of its token Secret)."""
    auth_secret: str
    """The Secret holding the cluster's token (key ``auth_token``): :data:`RAY_AUTH_SECRET`."""


def pool_resource(pool: str) -> str:
    """The Ray custom resource a pool's workers carry: one unit per GPU.

    Never ending in ``gpu``: KubeRay (utils.IsGPUResourceKey) would read such a group
    resource as the node's GPU count (``--num-gpus``) instead of a custom resource.
    """
    return f"ragpool-pool-{pool}-gpus"


def worker_group_name(pool: str) -> str:
    return pool


def _pinned_ports() -> dict[str, str]:
    """rayStartParams that pin every port Ray would otherwise choose (infra/training_namespace.py)."""
    return {
        "node-manager-port": str(RAY_NODE_MANAGER_PORT),
        "object-manager-port": str(RAY_OBJECT_MANAGER_PORT),
        "runtime-env-agent-port": str(RAY_RUNTIME_ENV_AGENT_PORT),
        "dashboard-agent-grpc-port": str(RAY_DASHBOARD_AGENT_GRPC_PORT),
        "dashboard-agent-listen-port": str(RAY_DASHBOARD_AGENT_LISTEN_PORT),
        "metrics-export-port": str(RAY_METRICS_PORT),
        "min-worker-port": str(RAY_MIN_WORKER_PORT),
        "max-worker-port": str(RAY_MAX_WORKER_PORT),
        # Ray 2.58: the flag that keeps Ray's processes (and, through RAY_LOG_TO_STDERR, its
        # workers) logging to the container's stderr instead of files under /tmp/ray.
        "no-redirect-output": "true",
    }


def _env(namespace: str) -> list[dict[str, Any]]:
    return [
        {"name": "RAY_LOG_TO_STDERR", "value": "1"},
        {"name": SHARED_ROOT_ENV, "value": SHARED_MOUNT_PATH},
        {"name": "RAGPOOL_RAY_NAMESPACE", "value": namespace},
        {"name": "HOME", "value": "/tmp"},
        {"name": "HF_HOME", "value": "/tmp/hf"},
    ]


def _volumes(shared_claim: str, shm_gib: int, ray_tmp_gib: int) -> tuple[list[dict], list[dict]]:
    """(volumes, mounts): the shared EFS claim, /dev/shm, /tmp/ray and /tmp, each sized."""
    volumes = [
        {"name": "shared", "persistentVolumeClaim": {"claimName": shared_claim}},
        {"name": SHM_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": f"{shm_gib}Gi"}},
        {"name": RAY_TMP_VOLUME, "emptyDir": {"sizeLimit": f"{ray_tmp_gib}Gi"}},
        {"name": "tmp", "emptyDir": {"sizeLimit": "2Gi"}},
    ]
    mounts = [
        {"name": "shared", "mountPath": SHARED_MOUNT_PATH},
        {"name": SHM_VOLUME, "mountPath": "/dev/shm"},
        {"name": "tmp", "mountPath": "/tmp"},
        {"name": RAY_TMP_VOLUME, "mountPath": RAY_TMP_PATH},
    ]
    return volumes, mounts


def notice_hook(pool: GpuPoolConfig) -> dict[str, Any]:
    """A Ray GPU worker's preStop hook (training/ray/notice.py): drain its Ray node as preempted, the deadline the
    pod's grace less the margin, and wait that long at most for the ranks' checkpoint and restart elsewhere."""
    deadline = pod_grace_seconds(pool) - STOP_MARGIN_S
    return {"preStop": {"exec": {"command": ["python", "-m", RAY_NOTICE_MODULE, "--deadline-s", str(deadline),
                                             "--wait-s", str(deadline)]}}}


def worker_resources(pool: GpuPoolConfig) -> dict[str, Any]:
    """A worker pod of ``pool``: whole GPUs (gpusPerWorker), the CPU and memory the pool's torchrun
    workers get (infra/worker_jobs.py; memory from the instance RAM, infra/gpu_memory.py), the object
    store inside its /dev/shm."""
    gpus = pool.gpus_per_worker
    return {
        "gpus": gpus, "cpus": 2 * gpus, "memory_gib": pod_memory_gib(pool),
        "shm_gib": 4 * gpus, "object_store_gib": 3 * gpus,
    }


def max_workers(cfg: StackConfig, pool: GpuPoolConfig, gpu_quota: int | None) -> int:
    """Most workers of ``pool`` in a namespace: the pool's Ray limit, within the namespace's GPU quota."""
    most = cfg.ray.pool_max_workers(pool)
    if gpu_quota is not None:
        most = min(most, gpu_quota // pool.gpus_per_worker)
    return most


def ray_pools(cfg: StackConfig, gpu_quota: int | None = None) -> dict[str, int]:
    """The pools a namespace's RayCluster can place stages on: pool -> GPUs of one of its Ray workers
    (``ray.<stage>.gpus`` may not exceed it). A pool whose group may not scale above 0 there (a team
    quota below one worker's GPUs) is left out: a stage on it would wait for nothing. This is what
    ``RAGPOOL_RAY_POOLS`` carries (contract/ray_pools.py) for ``ragpool submit`` and the Ray worker."""
    return {p.name: worker_resources(p)["gpus"] for p in cfg.gpu_pools if max_workers(cfg, p, gpu_quota) > 0}


def ray_endpoint(cfg: StackConfig, namespace: str, gpu_quota: int | None = None) -> RayEndpoint:
    """The Ray cluster of ``namespace`` as its worker template and ``ragpool submit`` see it."""
    pools = ray_pools(cfg, gpu_quota)
    # ... and each pool's most Ray workers there (its group's maxReplicas): what Ray Tune can run at
    # once on an idle cluster (training/ray/tune.py concurrency).
    nodes = {p.name: max_workers(cfg, p, gpu_quota) for p in cfg.gpu_pools if p.name in pools}
    return RayEndpoint(ray_address(namespace), format_pools(pools, nodes), namespace, RAY_AUTH_SECRET)


def auth_options() -> dict[str, Any]:
    """``spec.authOptions`` of every RayCluster: Ray token authentication with the namespace's own token.

    KubeRay 1.7 (ray-project/kuberay v1.7.0, ray-operator/controllers/ray/common/pod.go
    ``configureTokenAuth``/``SetContainerTokenAuthEnvVars``) then gives the head, every worker, the
    autoscaler sidecar and the ``wait-gcs-ready`` init container ``RAY_AUTH_MODE=token`` and
    ``RAY_AUTH_TOKEN`` from key ``auth_token`` of ``secretName``, and with ``secretName`` set skips
    generating its own Secret (raycluster_controller.go ``reconcileAuthSecret``). ``mode`` is explicit:
    KubeRay enables token auth only for ``mode: token`` (utils.IsAuthEnabled), never for an empty one.
    """
    return {"mode": TOKEN_MODE, "secretName": RAY_AUTH_SECRET}


def ray_cluster_spec(cfg: StackConfig, namespace: str, image: str, shared_claim: str,
                     gpu_quota: int | None = None) -> dict[str, Any]:
    """The RayCluster spec for ``namespace`` (gpu_quota: the team's, None for the main namespace)."""
    head_volumes, head_mounts = _volumes(shared_claim, shm_gib=1, ray_tmp_gib=HEAD_RAY_TMP_GIB)
    head_mem = f"{cfg.ray.head_memory_gib}Gi"
    head = {
        "serviceType": "ClusterIP",
        "rayStartParams": {
            "num-cpus": "0",  # the head schedules; tasks and actors run on the workers
            "dashboard-host": "0.0.0.0",
            "object-store-memory": str(512 * 2**20),
            **_pinned_ports(),
        },
        "template": {
            "metadata": {"labels": {**k8s_labels("ray", RAY_CLUSTER_NAME), **RAY_POD_LABELS}},
            "spec": {
                "nodeSelector": dict(SYSTEM_NODE_SELECTOR),
                "priorityClassName": "ragpool-training",
                "securityContext": pod_security_context(TRAINING_UID, fs_group=TRAINING_UID),
                "containers": [{
                    "name": HEAD_CONTAINER,
                    "image": image,
                    "env": _env(namespace),
                    "ports": [
                        {"name": "gcs-server", "containerPort": RAY_GCS_PORT},
                        {"name": "dashboard", "containerPort": RAY_DASHBOARD_PORT},
                        {"name": "client", "containerPort": RAY_CLIENT_PORT},
                        {"name": "metrics", "containerPort": RAY_METRICS_PORT},
                        {"name": "as-metrics", "containerPort": RAY_AUTOSCALER_METRICS_PORT},
                        {"name": "dash-metrics", "containerPort": RAY_DASHBOARD_METRICS_PORT},
                    ],
                    "resources": {"requests": {"cpu": str(cfg.ray.head_cpu), "memory": head_mem},
                                  "limits": {"memory": head_mem}},
                    "securityContext": container_security_context(TRAINING_UID),
                    "volumeMounts": head_mounts,
                }],
                "volumes": head_volumes,
            },
        },
    }
    groups = []
    for pool in cfg.gpu_pools:
        size = worker_resources(pool)
        efa = {EFA_RESOURCE: str(devices)} if (devices := pool_efa_devices(pool)) else {}
        volumes, mounts = _volumes(shared_claim, shm_gib=size["shm_gib"], ray_tmp_gib=WORKER_RAY_TMP_GIB)
        groups.append({
            "groupName": worker_group_name(pool.name),
            "replicas": 0,
            "minReplicas": 0,
            "maxReplicas": max_workers(cfg, pool, gpu_quota),
            # Ray's view of the node: its resources and labels (keys may not start with ray.io/).
            "resources": {"CPU": str(size["cpus"]), "GPU": str(size["gpus"]),
                          # Ray's heap memory: the pod's less the object store (in /dev/shm, counted in the pod).
                          "memory": str(max(1, size["memory_gib"] - size["object_store_gib"]) * 2**30),
                          pool_resource(pool.name): str(size["gpus"])},
            "labels": {POOL_LABEL: pool.name},
            "rayStartParams": {"object-store-memory": str(size["object_store_gib"] * 2**30), **_pinned_ports()},
            "template": {
                "metadata": {
                    "labels": {**k8s_labels("ray", RAY_CLUSTER_NAME), **RAY_POD_LABELS, POOL_LABEL: pool.name},
                    # Karpenter must not consolidate or expire a node under a running Ray worker;
                    # the Ray autoscaler removes idle workers and Karpenter then the empty node.
                    "annotations": {"karpenter.sh/do-not-disrupt": "true"},
                },
                "spec": {
                    "nodeSelector": {POOL_LABEL: pool.name},
                    "tolerations": [dict(GPU_TOLERATION)],
                    "priorityClassName": "ragpool-training",
                    "automountServiceAccountToken": False,
                    # A spot notice: the preStop hook has the pod's grace to checkpoint the ranks before SIGTERM.
                    "terminationGracePeriodSeconds": pod_grace_seconds(pool),
                    "securityContext": pod_security_context(TRAINING_UID, fs_group=TRAINING_UID),
                    "containers": [{
                        "name": WORKER_CONTAINER,
                        "image": image,
                        "lifecycle": notice_hook(pool),
                        # EFA pools: libfabric on EFA and the pod's share of the node's EFA devices, as the
                        # pool's torchrun workers (infra/efa.py); nothing for the other pools.
                        "env": [*_env(namespace), *efa_env(pool)],
                        "ports": [{"name": "metrics", "containerPort": RAY_METRICS_PORT}],
                        "resources": {
                            "requests": {GPU_RESOURCE: str(size["gpus"]), **efa, "cpu": str(size["cpus"]),
                                         "memory": f"{size['memory_gib']}Gi"},
                            "limits": {GPU_RESOURCE: str(size["gpus"]), **efa, "memory": f"{size['memory_gib']}Gi"},
                        },
                        "securityContext": container_security_context(TRAINING_UID),
                        "volumeMounts": mounts,
                    }],
                    "volumes": volumes,
                },
            },
        })
    return {
        "rayVersion": RAY_VERSION,
        "enableInTreeAutoscaling": True,
        "autoscalerOptions": {
            "version": "v2",
            "upscalingMode": "Default",
            "idleTimeoutSeconds": AUTOSCALER_IDLE_TIMEOUT_SECONDS,
            "env": [{"name": "RAY_LOG_TO_STDERR", "value": "1"}, {"name": "HOME", "value": "/tmp"}],
            "resources": {"requests": {"cpu": "250m", "memory": "512Mi"}, "limits": {"memory": "512Mi"}},
            "securityContext": container_security_context(TRAINING_UID),
            "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
        },
        "authOptions": auth_options(),
        "headGroupSpec": head,
        "workerGroupSpecs": groups,
    }


def pod_monitors(namespaces: list[str]) -> dict[str, dict[str, Any]]:
    """KubeRay's PodMonitors (config/prometheus/podMonitor.yaml) for ragpool's training namespaces."""
    relabel = [{"action": "replace", "sourceLabels": ["__meta_kubernetes_pod_label_ray_io_cluster"],
                "targetLabel": "ray_io_cluster"}]
    return {
        "ray-head-monitor": {
            "jobLabel": "ray-head",
            "namespaceSelector": {"matchNames": list(namespaces)},
            "selector": {"matchLabels": {"ray.io/node-type": "head", **RAY_POD_LABELS}},
            "podMetricsEndpoints": [{"port": port, "relabelings": relabel}
                                    for port in ("metrics", "as-metrics", "dash-metrics")],
        },
        "ray-workers-monitor": {
            "jobLabel": "ray-workers",
            "namespaceSelector": {"matchNames": list(namespaces)},
            "selector": {"matchLabels": {"ray.io/node-type": "worker", **RAY_POD_LABELS}},
            "podMetricsEndpoints": [{"port": "metrics", "relabelings": relabel}],
        },
    }


@dataclass(frozen=True)
class RayNamespace:
    """A training namespace that gets a RayCluster."""

    namespace: str
    gpu_quota: int | None = None
    """The namespace's GPU quota (teams); None: the pools' total (the main namespace)."""


@dataclass(frozen=True)
class RayArgs:
    config: StackConfig
    k8s_provider: k8s.Provider
    image: pulumi.Input[str]
    shared_claim: str
    namespaces: list[RayNamespace]
    monitoring_namespace: pulumi.Input[str]
    depends_on: list[pulumi.Resource]
    """The namespaces (with their shared claims) and the monitoring release (PodMonitor CRD)."""


class Ray(RagpoolComponent):
    def __init__(self, name: str, args: RayArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("ragpool:infra:Ray", name, opts, k8s_provider=args.k8s_provider)
        name = self.child_prefix
        cfg = args.config

        operator_ns = k8s.core.v1.Namespace(
            f"{name}-operator-ns", metadata={"name": KUBERAY_NAMESPACE, "labels": k8s_labels("ray-operator")},
            opts=child(self, depends_on=args.depends_on))
        # The chart's CRDs, vendored (infra/crds/kuberay/) and applied by Pulumi so every chart bump reaches them.
        crds = [k8s.yaml.v2.ConfigFile(
            f"{name}-crd-{file.removesuffix('.yaml').removeprefix('ray.io_')}", file=f"{KUBERAY_CRD_DIR}/{file}",
            opts=child(self, depends_on=args.depends_on))
            for file in KUBERAY_CRD_FILES]
        self.operator = k8s.helm.v3.Release(
            f"{name}-operator", name="kuberay-operator", namespace=KUBERAY_NAMESPACE,
            values=load_values("kuberay-operator.yaml"), skip_crds=True,
            atomic=True, cleanup_on_fail=True, **KUBERAY_OPERATOR.release_args(),
            opts=child(self, depends_on=[operator_ns, *crds, *args.depends_on]))

        self.addresses: dict[str, str] = {}
        self.pools: dict[str, str] = {}
        """Namespace -> ``RAGPOOL_RAY_POOLS`` of its cluster (the ``rayPools`` stack output)."""
        for target in args.namespaces:
            ns = target.namespace
            # The namespace's own token: a Pulumi secret, in a Secret only its Ray pods and its Ray
            # worker template read. `pulumi up --replace` of the RandomPassword rotates it (README).
            token = random.RandomPassword(f"{name}-token-{ns}", length=RAY_TOKEN_LENGTH, special=False,
                                          opts=child(self))
            token_secret = k8s.core.v1.Secret(
                f"{name}-token-secret-{ns}",
                metadata={"name": RAY_AUTH_SECRET, "namespace": ns, "labels": k8s_labels("ray", RAY_AUTH_SECRET)},
                type="Opaque", string_data={TOKEN_SECRET_KEY: pulumi.Output.secret(token.result)},
                opts=child(self, depends_on=args.depends_on))
            k8s.apiextensions.CustomResource(
                f"{name}-cluster-{ns}", api_version="ray.io/v1", kind="RayCluster",
                metadata={"name": RAY_CLUSTER_NAME, "namespace": ns, "labels": k8s_labels("ray", RAY_CLUSTER_NAME),
                          "annotations": dict(PATCH_FORCE)},
                spec=pulumi.Output.from_input(args.image).apply(
                    lambda image, ns=ns, quota=target.gpu_quota: ray_cluster_spec(
                        cfg, ns, image, args.shared_claim, quota)),
                opts=child(self, depends_on=[self.operator, *crds, token_secret, *args.depends_on],
                           ignore_changes=list(AUTOSCALER_OWNED)))
            endpoint = ray_endpoint(cfg, ns, target.gpu_quota)
            self.addresses[ns], self.pools[ns] = endpoint.address, endpoint.pools

        for monitor, spec in pod_monitors([t.namespace for t in args.namespaces]).items():
            k8s.apiextensions.CustomResource(
                f"{name}-{monitor}", api_version="monitoring.coreos.com/v1", kind="PodMonitor",
                metadata={"name": monitor, "namespace": args.monitoring_namespace,
                          "labels": k8s_labels("monitoring", monitor)},
                spec=spec, opts=child(self, depends_on=args.depends_on))

        for filename, body in sorted(ray_dashboards().items()):
            stem = filename.removesuffix(".json")
            k8s.core.v1.ConfigMap(
                f"{name}-dashboard-{stem}",
                metadata={"name": f"ragpool-dashboard-{stem}", "namespace": args.monitoring_namespace,
                          "labels": {**k8s_labels("dashboards", stem), "grafana_dashboard": "1"}},
                data={filename: body},
                opts=child(self, depends_on=args.depends_on))
        self.register_outputs({"addresses": self.addresses, "pools": self.pools})
