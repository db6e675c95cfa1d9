"""Training namespace: where worker Jobs run and the shared PVC lives.

Resource isolation: a ResourceQuota capping GPUs at the pools' total, a LimitRange
with container defaults, PriorityClasses (training vs. preemptible batch stages), and
default-deny NetworkPolicies that open only the flows training needs: DNS, Redis,
EFS, rendezvous/NCCL between workers, HTTPS to AWS APIs, and metrics scrapes from the
monitoring namespace. With Ray enabled, Ray's pods (the namespace's RayCluster) reach each
other on exactly Ray's ports, the Ray worker template reaches the head's Jobs API, and
monitoring scrapes Ray's metrics. Ray's worker pods also reach each other on every port: Ray Train's
rendezvous port and the collectives' (gloo, NCCL) connections are ephemeral, outside Ray's range.

The worker Job templates live in infra/worker_jobs.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_kubernetes as k8s

from infra.component import RagpoolComponent
from infra.common import RESTRICTED_NAMESPACE_LABELS, child, k8s_labels, stateful
from infra.config import StackConfig
from infra.peers import RAY_CLIENT_LABEL, TRAINING_NAMESPACE, TRAINING_NAMESPACE_LABEL, redis_peer
from infra.storage import STORAGE_CLASS
from contract.ports import QUEUE_METRICS_PORT, RANK_METRICS_PORT, RDZV_PORT, REDIS_PORT

WORKER_SERVICE_ACCOUNT = "ragpool-worker"
WORKERS_SERVICE = "ragpool-workers"  # headless: stable DNS for Indexed Job pods (rendezvous)
MAX_RANKS_PER_POD = 8
PRIORITY_CLASSES = {
    # Long GPU training (retriever, generator): expensive to lose, may preempt batch work.
    "ragpool-training": (1000, "PreemptLowerPriority",
                         "ragpool training stages (retriever, generator): preempt batch work"),
    # Index builds and evaluations: cheap to rerun, never preempt anything.
    "ragpool-batch": (100, "Never", "ragpool batch stages (index, evaluate): never preempt"),
}


# Ray's ports, every one pinned so the policies below can name them: Ray 2.58's `ray start`
# defaults where it has one, and for the ports Ray would otherwise pick at random (node
# manager, object manager, agents) the values infra/ray_cluster.py passes as rayStartParams.
RAY_GCS_PORT = 6379  # --port (head)
RAY_DASHBOARD_PORT = 8265  # --dashboard-port (head): dashboard and the Ray Jobs API
RAY_CLIENT_PORT = 10001  # --ray-client-server-port (head)
RAY_NODE_MANAGER_PORT = 6380
RAY_OBJECT_MANAGER_PORT = 6381
RAY_RUNTIME_ENV_AGENT_PORT = 6382
RAY_DASHBOARD_AGENT_GRPC_PORT = 6383
RAY_DASHBOARD_AGENT_LISTEN_PORT = 52365  # --dashboard-agent-listen-port default
RAY_MIN_WORKER_PORT, RAY_MAX_WORKER_PORT = 10002, 19999  # --min/--max-worker-port defaults
RAY_METRICS_PORT = 8080  # --metrics-export-port (KubeRay's default, container port `metrics`)
RAY_AUTOSCALER_METRICS_PORT = 44217  # AUTOSCALER_METRIC_PORT (head, autoscaler sidecar)
RAY_DASHBOARD_METRICS_PORT = 44227  # DASHBOARD_METRIC_PORT (head)
# Labels of the pods of ragpool's RayClusters (infra/ray_cluster.py sets them on both groups).
RAY_POD_LABELS = {"app.kubernetes.io/component": "ray"}
RAY_HEAD_POD_LABELS = {**RAY_POD_LABELS, "ray.io/node-type": "head"}  # ray.io/node-type: set by KubeRay
# (ray-project/kuberay v1.7.0 ray-operator/apis/ray/v1/raycluster_types.go: HeadNode "head", WorkerNode "worker")
RAY_WORKER_POD_LABELS = {**RAY_POD_LABELS, "ray.io/node-type": "worker"}


def ray_internal_ports() -> list[dict[str, Any]]:
    """Ports Ray's nodes use to talk to each other (the head's and every node's)."""
    single = [RAY_GCS_PORT, RAY_DASHBOARD_PORT, RAY_CLIENT_PORT, RAY_NODE_MANAGER_PORT, RAY_OBJECT_MANAGER_PORT,
              RAY_RUNTIME_ENV_AGENT_PORT, RAY_DASHBOARD_AGENT_GRPC_PORT, RAY_DASHBOARD_AGENT_LISTEN_PORT]
    return ([{"protocol": "TCP", "port": p} for p in single]
            + [{"protocol": "TCP", "port": RAY_MIN_WORKER_PORT, "endPort": RAY_MAX_WORKER_PORT}])


def ray_metrics_ports() -> list[dict[str, Any]]:
    return [{"protocol": "TCP", "port": p}
            for p in (RAY_METRICS_PORT, RAY_AUTOSCALER_METRICS_PORT, RAY_DASHBOARD_METRICS_PORT)]


@dataclass(frozen=True)
class TrainingNamespaceArgs:
    config: StackConfig
    k8s_provider: k8s.Provider
    depends_on: list[pulumi.Resource]
    namespace: str = TRAINING_NAMESPACE
    gpu_quota: int | None = None
    """GPUs this namespace may request; None: the pools' total."""
    cluster_scoped: bool = True
    """Create the cluster-wide PriorityClasses (only the main namespace does)."""
    shared_claim: str | None = None
    """Create this RWX claim on the EFS StorageClass (team namespaces: their own directory)."""


def ray_network_policies(cfg: StackConfig) -> dict[str, dict[str, Any]]:
    """Ray's flows: node to node on Ray's ports, the Ray worker template to the head's Jobs
    API, EFS, HTTPS (the head's autoscaler calls the Kubernetes API), metrics scrapes."""
    ray = {"podSelector": {"matchLabels": dict(RAY_POD_LABELS)}}
    head = {"podSelector": {"matchLabels": dict(RAY_HEAD_POD_LABELS)}}
    ray_workers = {"podSelector": {"matchLabels": dict(RAY_WORKER_POD_LABELS)}}
    clients = {"podSelector": {"matchLabels": dict(RAY_CLIENT_LABEL)}}
    monitoring = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
    jobs_api = [{"protocol": "TCP", "port": RAY_DASHBOARD_PORT}]
    return {
        "ray-ingress": {
            "podSelector": ray["podSelector"], "policyTypes": ["Ingress"],
            "ingress": [
                {"from": [ray], "ports": ray_internal_ports()},
                {"from": [monitoring], "ports": ray_metrics_ports()},
            ],
        },
        "ray-head-jobs-api": {
            "podSelector": head["podSelector"], "policyTypes": ["Ingress"],
            "ingress": [{"from": [clients], "ports": jobs_api}],
        },
        "ray-egress": {
            "podSelector": ray["podSelector"], "policyTypes": ["Egress"],
            "egress": [
                {"to": [ray], "ports": ray_internal_ports()},
                {"to": [{"ipBlock": {"cidr": cfg.network.vpc_cidr}}], "ports": [{"protocol": "TCP", "port": 2049}]},  # EFS
                {"to": [{"ipBlock": {"cidr": "0.0.0.0/0"}}], "ports": [{"protocol": "TCP", "port": 443}]},  # API server, AWS
            ],
        },
        "ray-clients-egress": {
            "podSelector": clients["podSelector"], "policyTypes": ["Egress"],
            "egress": [{"to": [head], "ports": jobs_api}],
        },
        # Ray Train between the worker pods of this namespace's cluster, every port (as workers-ingress
        # for torchrun): rank 0 hosts the process group's store on `find_free_port()` (ray 2.58
        # train/torch/config.py get_address_and_port -> ray/_common/network_utils.py: bind to port 0,
        # a kernel ephemeral port), and gloo/NCCL connect on ephemeral ports too. The head runs no
        # training worker (num-cpus 0) and keeps Ray's pinned ports only.
        "ray-train-ingress": {
            "podSelector": ray_workers["podSelector"], "policyTypes": ["Ingress"],
            "ingress": [{"from": [ray_workers]}],
        },
        "ray-train-egress": {
            "podSelector": ray_workers["podSelector"], "policyTypes": ["Egress"],
            "egress": [{"to": [ray_workers]}],
        },
    }


def baseline_policies(prefix: str = "") -> dict[str, dict[str, Any]]:
    """What every ragpool namespace starts from: deny everything both ways, then DNS for every pod."""
    return {
        f"{prefix}default-deny": {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]},
        f"{prefix}allow-dns": {
            "podSelector": {}, "policyTypes": ["Egress"],
            "egress": [{"to": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
                                "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}}}],
                        "ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]}],
        },
    }


def network_policies(cfg: StackConfig) -> dict[str, dict[str, Any]]:
    vpc = cfg.network.vpc_cidr
    workers = {"matchLabels": {"app.kubernetes.io/component": "worker"}}
    monitoring = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
    return {
        **baseline_policies(),
        "workers-egress": {
            "podSelector": workers, "policyTypes": ["Egress"],
            "egress": [
                {"to": [redis_peer(cfg)], "ports": [{"protocol": "TCP", "port": REDIS_PORT}]},
                {"to": [{"ipBlock": {"cidr": vpc}}], "ports": [{"protocol": "TCP", "port": 2049}]},  # EFS
                {"to": [{"podSelector": workers}]},  # torchrun rendezvous + NCCL (dynamic ports)
                {"to": [{"ipBlock": {"cidr": "0.0.0.0/0"}}], "ports": [{"protocol": "TCP", "port": 443}]},  # AWS APIs
            ],
        },
        "workers-ingress": {
            "podSelector": workers, "policyTypes": ["Ingress"],
            "ingress": [
                {"from": [{"podSelector": workers}]},
                {"from": [monitoring], "ports": [
                    {"protocol": "TCP", "port": QUEUE_METRICS_PORT},
                    {"protocol": "TCP", "port": RANK_METRICS_PORT, "endPort": RANK_METRICS_PORT + MAX_RANKS_PER_POD - 1}]},
            ],
        },
        **(ray_network_policies(cfg) if cfg.ray.enabled else {}),
    }


class TrainingNamespace(RagpoolComponent):
    def __init__(self, name: str, args: TrainingNamespaceArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("ragpool:infra:TrainingNamespace", name, opts, k8s_provider=args.k8s_provider)
        name = self.child_prefix
        cfg = args.config
        self.namespace = k8s.core.v1.Namespace(
            f"{name}-ns",
            metadata={"name": args.namespace, "labels": {
                **k8s_labels("training", args.namespace), **TRAINING_NAMESPACE_LABEL,
                **RESTRICTED_NAMESPACE_LABELS}},
            opts=child(self, depends_on=args.depends_on))
        self.name = self.namespace.metadata.name
        ns_opts = child(self, depends_on=[self.namespace])

        gpu_total = args.gpu_quota or sum(p.gpu_limit for p in cfg.gpu_pools)
        k8s.core.v1.ResourceQuota(
            f"{name}-quota", metadata={"name": "ragpool-training", "namespace": self.name, "labels": k8s_labels("training")},
            # requests.<extended resource> only: the API server's pod quota evaluator counts no limits.*
            # of an extended resource (infra/reference/kubernetes_quota.yaml), so such a key caps nothing.
            # count/jobs.batch: the worker Jobs' own quota, sized from the ScaledJobs (infra/worker_jobs.py).
            spec={"hard": {"requests.nvidia.com/gpu": str(gpu_total),
                           "pods": "300", "persistentvolumeclaims": "10"}},
            opts=ns_opts)
        k8s.core.v1.LimitRange(
            f"{name}-limits", metadata={"name": "ragpool-training", "namespace": self.name, "labels": k8s_labels("training")},
            spec={"limits": [{"type": "Container",
                              "defaultRequest": {"cpu": "500m", "memory": "1Gi"},
                              "default": {"memory": "4Gi"}}]},
            opts=ns_opts)
        for pc_name, (value, preemption, description) in (PRIORITY_CLASSES.items() if args.cluster_scoped else ()):
            k8s.scheduling.v1.PriorityClass(
                f"{name}-{pc_name}", metadata={"name": pc_name, "labels": k8s_labels("training")},
                value=value, preemption_policy=preemption, global_default=False, description=description,
                opts=child(self, depends_on=args.depends_on))
        for np_name, spec in network_policies(cfg).items():
            k8s.networking.v1.NetworkPolicy(
                f"{name}-{np_name}", metadata={"name": np_name, "namespace": self.name, "labels": k8s_labels("training")},
                spec=spec, opts=ns_opts)
        k8s.core.v1.ServiceAccount(
            f"{name}-worker-sa",
            # No IAM role: workers need no AWS API (EFS is mounted by the CSI driver).
            metadata={"name": WORKER_SERVICE_ACCOUNT, "namespace": self.name, "labels": k8s_labels("worker")},
            automount_service_account_token=False, opts=ns_opts)
        k8s.core.v1.Service(
            f"{name}-workers-headless",
            metadata={"name": WORKERS_SERVICE, "namespace": self.name, "labels": k8s_labels("worker", WORKERS_SERVICE)},
            spec={"clusterIP": "None", "publishNotReadyAddresses": True,
                  "selector": {"app.kubernetes.io/component": "worker"},
                  "ports": [{"name": "rdzv", "port": RDZV_PORT, "targetPort": RDZV_PORT}]},
            opts=ns_opts)
        self.claim: k8s.core.v1.PersistentVolumeClaim | None = None
        """A team namespace's shared claim (its own EFS access point; the run API mounts its volume read-only)."""
        if args.shared_claim:
            self.claim = k8s.core.v1.PersistentVolumeClaim(
                f"{name}-shared-pvc",
                metadata={"name": args.shared_claim, "namespace": self.name,
                          "labels": k8s_labels("storage", args.shared_claim)},
                spec={"accessModes": ["ReadWriteMany"], "storageClassName": STORAGE_CLASS,
                      "resources": {"requests": {"storage": "1Ti"}}},
                opts=stateful(self, cfg, depends_on=[self.namespace]))
        self.register_outputs({"name": self.name})
