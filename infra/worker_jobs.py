"""Worker Jobs: one KEDA ``ScaledJob`` per kind of worker, and the same Job as a suspended CronJob.

A kind of worker is a pool and a pod count (single-pod torchrun per GPU pool, an Indexed Job of N
pods for each N the pool can hold) or the CPU Ray worker; it claims exactly its lanes
(contract/lanes.py ``worker_lanes``, set through RAGPOOL_LANES). Its ``ScaledJob``
(``ragpool-worker-<pool>[-n<N>]``, ``ragpool-worker-ray``; infra/keda.py builds the spec) starts
Jobs from zero when those lanes' ready lists hold runs, one Job per run: its worker takes one run
and exits (``--max-tasks 1``, infra/keda.py ``one_run_per_job``). KEDA's history limits and the
Job TTL remove finished Jobs.

The suspended CronJob of the same name carries the same Job for manual use:
``kubectl -n ragpool-training create job --from=cronjob/ragpool-worker-<pool> <name>``
starts a worker that claims runs from its lanes, one after another, runs them through torchrun
on the pod's GPUs, and exits when the queue stays empty (600 s). It is a template, never scheduled.
Multi-node Jobs are Indexed Jobs of N pods (``completions`` = ``parallelism`` = N); pod 0
claims and hosts rendezvous behind the headless ``ragpool-workers`` Service.

``ragpool-worker-ray`` (when Ray is enabled) is a small CPU-only worker on the system nodes:
it claims only ``executor: ray`` runs and submits them to the namespace's RayCluster through
the Ray Jobs API (RAY_ADDRESS), holding no GPU while the Ray cluster does the work. GPU
workers claim only ``executor: torchrun`` runs. The worker reads which executors it takes
from RAGPOOL_EXECUTORS.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_kubernetes as k8s

from infra.component import RagpoolComponent
from infra.common import GPU_TOLERATION, POOL_LABEL, SHARED_MOUNT_PATH, SYSTEM_NODE_SELECTOR, TRAINING_UID, child, k8s_labels
from infra.config import StackConfig
from infra.config_gpu import STOP_MARGIN_S, TERMINATION_GRACE_S, GpuPoolConfig, pod_grace_seconds
from infra.efa_devices import efa_env, pool_efa_devices
from infra.gpu_memory import pod_memory
from infra.keda import (
    KEDA_EXCLUDED_LABELS, KedaQueue, WorkerKind, jobs_quota, ray_worker_lanes, scaled_job_kinds, scaled_job_labels,
    scaled_job_spec, served_lanes, worker_kinds,
)
from infra.keeper import KEEPER_NAME, keeper_deployment_spec, keeper_network_policy
from infra.kueue_objects import LOCAL_QUEUE
from infra.node_fence import token_volume
from infra.peers import RAY_CLIENT_LABEL, REDIS_CLIENT_LABEL
from infra.queue_redis import redis_client_env, redis_secret_volume
from infra.pod_security import container_security_context, pod_security_context
from infra.ray_cluster import RayEndpoint, max_workers
from infra.training_namespace import MAX_RANKS_PER_POD, WORKER_SERVICE_ACCOUNT, WORKERS_SERVICE
from contract import exit_codes
from contract.ports import QUEUE_METRICS_PORT, RANK_METRICS_PORT, RDZV_PORT
from contract.defaults import DEFAULT_LEASE_S
from contract.env import (EXECUTORS_ENV, EXPECTED_GPUS_ENV, NAMESPACE_ENV, NODE_NAME_ENV, RDZV_HOST_ENV, RDZV_PORT_ENV,
                          WORKER_GROUP_ENV, WORKER_ID_ENV)
from contract.lanes import Executor
from contract.names import EFA_RESOURCE, GPU_RESOURCE, KUEUE_QUEUE_LABEL
from contract.paths import SHARED_ROOT_ENV
from contract.ray_auth import SECRET_ENV, TOKEN_SECRET_KEY, client_env
from contract.ray_pools import POOLS_ENV
from contract.ports import READY_PATH
from contract.lanes import lane_labels, worker_env

BACKOFF_LIMIT = 6
"""Counted pod failures (``podFailurePolicy`` Count, or no rule matched) a worker Job survives, all its pods together."""
BACKOFF_LIMIT_PER_INDEX = 3
"""Counted failures of one index (one node of a gang) before that index is failed and its pod no longer replaced."""
# Importing torch, one CUDA context per GPU, a matmul each and an NCCL all-reduce: minutes at most.
HEALTH_CHECK_TIMEOUT_SECONDS = 300


WORKER_LABELS = {**k8s_labels("worker", "ragpool-worker"), **REDIS_CLIENT_LABEL}
RAY_WORKER_TEMPLATE = "ragpool-worker-ray"
JOBS_QUOTA = "ragpool-worker-jobs"


@dataclass(frozen=True)
class WorkerJobsArgs:
    config: StackConfig
    k8s_provider: k8s.Provider
    namespace: pulumi.Input[str]
    image: pulumi.Input[str]
    redis_secret: str
    shared_claim: str
    depends_on: list[pulumi.Resource]
    queue_namespace: str = "ragpool"
    """Redis key namespace of this namespace's queue (teams get their own)."""
    ray: RayEndpoint | None = None
    """This namespace's RayCluster (its Jobs API and pools); None: no Ray worker template."""
    gpu_quota: int | None = None
    """The namespace's GPU quota (teams); None: the pools' total. Bounds the ScaledJobs."""
    keda: pulumi.Input[KedaQueue] | None = None
    """How KEDA reads the queue (infra/keda.py); None: CronJob templates only, no ScaledJobs."""
    keeper_queue_namespaces: tuple[str, ...] = ()
    """Run the queue keeper here for these key namespaces (the main namespace: every queue)."""


RAY_TOKEN_DIR = "/var/run/secrets/ragpool/ray"


def ray_token_volume(ray: RayEndpoint) -> tuple[dict[str, Any], dict[str, Any]]:
    """The namespace's Ray token Secret as a read-only volume (the file ``RAY_AUTH_TOKEN_PATH`` names).
    Not a subPath mount: the kubelet refreshes the file in place after a rotation."""
    volume = {"name": "ray-token", "secret": {"secretName": ray.auth_secret,
                                              "items": [{"key": TOKEN_SECRET_KEY, "path": TOKEN_SECRET_KEY}],
                                              "defaultMode": 0o440}}
    return volume, {"name": "ray-token", "mountPath": RAY_TOKEN_DIR, "readOnly": True}


def _worker_pod(*, image: str, redis_secret: str, shared_claim: str, queue_namespace: str,
                node_selector: dict[str, str], args: list[str], env: list[dict[str, Any]],
                ports: list[dict[str, Any]], resources: dict[str, Any], tmp_size: str,
                shm_size: str | None = None, secret_volumes: tuple[tuple[dict[str, Any], dict[str, Any]], ...] = (),
                grace_s: int = TERMINATION_GRACE_S, **pod_fields: Any) -> dict[str, Any]:
    """The pod of a queue worker (``python -m training.worker``), what every worker template shares:
    the worker identity, the restricted security context, the queue's Redis (URL and password file),
    the shared storage, a sized /tmp (and /dev/shm when ``shm_size``). ``args`` and ``env`` follow
    the common ones; ``secret_volumes`` are (volume, mount) pairs of this template alone (the Ray
    token, the GPU worker's API token); ``grace_s``: its ``terminationGracePeriodSeconds`` (a GPU pool's:
    infra/config_gpu.py ``pod_grace_seconds``); ``pod_fields`` add pod-level fields (tolerations, subdomain)."""
    volumes = [{"name": "shared", "persistentVolumeClaim": {"claimName": shared_claim}}]
    mounts = [{"name": "shared", "mountPath": SHARED_MOUNT_PATH}]
    if shm_size:
        # NCCL and DataLoader workers share tensors through /dev/shm.
        volumes.append({"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": shm_size}})
        mounts.append({"name": "dshm", "mountPath": "/dev/shm"})
    redis_volume, redis_mount = redis_secret_volume(redis_secret)
    volumes += [{"name": "tmp", "emptyDir": {"sizeLimit": tmp_size}}, redis_volume]
    mounts += [{"name": "tmp", "mountPath": "/tmp"}, redis_mount]
    volumes += [volume for volume, _ in secret_volumes]
    mounts += [mount for _, mount in secret_volumes]
    return {
        "restartPolicy": "Never",
        "serviceAccountName": WORKER_SERVICE_ACCOUNT,
        "automountServiceAccountToken": False,
        "priorityClassName": "ragpool-training",
        "nodeSelector": node_selector,
        # Time for a SIGTERM'd run to reach its next step boundary and checkpoint (or for a Ray
        # job to be stopped) and the run to be handed back.
        "terminationGracePeriodSeconds": grace_s,
        "securityContext": pod_security_context(TRAINING_UID, fs_group=TRAINING_UID),
        **pod_fields,
        "containers": [{
            "name": "worker",
            "image": image,
            "command": ["python", "-m", "training.worker"],
            "args": ["--metrics-port", str(QUEUE_METRICS_PORT), "--idle-exit-seconds", "600",
                     # A worker silent this long (lost node) loses its run to the next claimer.
                     "--lease-seconds", f"{DEFAULT_LEASE_S:g}",
                     *args,
                     # Leave the pod's grace period a margin after the run checkpointed.
                     "--stop-grace-seconds", str(grace_s - STOP_MARGIN_S)],
            "env": [
                *redis_client_env(),
                {"name": SHARED_ROOT_ENV, "value": SHARED_MOUNT_PATH},
                {"name": NAMESPACE_ENV, "value": queue_namespace},
                {"name": WORKER_ID_ENV, "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                *env,
            ],
            "ports": ports,
            # Ready = holds a claim (an idle worker looking for a run is not): KEDA's `accurate` strategy
            # counts a Job with no Ready pod as pending (infra/keda.py, docs/DESIGN.md).
            "readinessProbe": {"httpGet": {"path": READY_PATH, "port": "queue-metrics"},
                               "periodSeconds": 5, "failureThreshold": 1},
            "resources": resources,
            "securityContext": container_security_context(TRAINING_UID),
            "volumeMounts": mounts,
        }],
        "volumes": volumes,
    }


def worker_cronjob_spec(cfg: StackConfig, pool: GpuPoolConfig, image: str, namespace: str,
                        redis_secret: str, shared_claim: str, queue_namespace: str = "ragpool") -> dict[str, Any]:
    """A suspended CronJob whose jobTemplate is the single-pod worker Job for ``pool``."""
    [kind] = [k for k in worker_kinds(cfg, None, None) if k.pool == pool and k.nodes == 1]
    return worker_cronjob(gpu_worker_job_spec(kind, image, namespace, redis_secret, shared_claim, queue_namespace))


def gpu_worker_job_spec(kind: WorkerKind, image: str, namespace: str, redis_secret: str, shared_claim: str,
                        queue_namespace: str = "ragpool") -> dict[str, Any]:
    """The Job of a GPU worker kind: ``kind.nodes`` pods of ``kind.pool`` claiming ``kind.lanes``."""
    pool = kind.pool
    assert pool is not None, kind
    gpus = pool.gpus_per_worker
    ports = [{"name": "queue-metrics", "containerPort": QUEUE_METRICS_PORT},
             {"name": "rdzv", "containerPort": RDZV_PORT}]
    ports += [{"name": f"rank-{r}", "containerPort": RANK_METRICS_PORT + r} for r in range(min(gpus, MAX_RANKS_PER_POD))]
    efa = {EFA_RESOURCE: str(devices)} if (devices := pool_efa_devices(pool)) else {}
    pod_spec = _worker_pod(
        image=image, redis_secret=redis_secret, shared_claim=shared_claim, queue_namespace=queue_namespace,
        node_selector={POOL_LABEL: pool.name},
        # Pre-flight node health check before claiming (training/components/health.py).
        args=["--health-check-timeout-seconds", f"{HEALTH_CHECK_TIMEOUT_SECONDS:g}"],
        env=[
            {"name": WORKER_GROUP_ENV, "valueFrom": {"fieldRef": {
                "fieldPath": "metadata.labels['batch.kubernetes.io/job-name']"}}},
            {"name": RDZV_HOST_ENV, "value": f"$({WORKER_GROUP_ENV})-0.{WORKERS_SERVICE}.{namespace}.svc"},
            {"name": RDZV_PORT_ENV, "value": str(RDZV_PORT)},
            # Exactly its lanes (RAGPOOL_LANES) and their pod count (RAGPOOL_NNODES).
            *({"name": k, "value": v} for k, v in worker_env(kind.lanes).items()),
            # What the health check expects to see, and the node its failure metric names.
            {"name": EXPECTED_GPUS_ENV, "value": str(gpus)},
            {"name": NODE_NAME_ENV, "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
            {"name": EXECUTORS_ENV, "value": Executor.TORCHRUN.value},  # never a Ray run: those go to ragpool-worker-ray
            {"name": "HF_HOME", "value": "/tmp/hf"},
            # EFA pools: libfabric on EFA (infra/efa.py efa_env); none for the others.
            *efa_env(pool),
        ],
        ports=ports,
        # Memory from the pool's instance RAM (infra/gpu_memory.py pod_memory): an FSDP stage stages its
        # checkpoints and gathers the full model in host memory (training/rank_memory.py host_fits).
        # EFA pools also request their share of the node's EFA devices: the request makes Karpenter attach
        # the interfaces and the device plugin hand them to the pod (infra/efa.py).
        resources={
            "requests": {GPU_RESOURCE: str(gpus), **efa, "cpu": str(2 * gpus), "memory": pod_memory(pool)},
            "limits": {GPU_RESOURCE: str(gpus), **efa, "memory": pod_memory(pool)},
        },
        tmp_size="20Gi", shm_size=f"{4 * gpus}Gi",
        # The token and CA the worker fences its node with after a failed health check (infra/node_fence.py).
        secret_volumes=(token_volume(),),
        # A spot pool's pods: SIGTERM from Karpenter's interruption drain, SIGKILL within the 2-minute notice.
        grace_s=pod_grace_seconds(pool),
        subdomain=WORKERS_SERVICE, tolerations=[GPU_TOLERATION])
    return worker_job_spec({**WORKER_LABELS, POOL_LABEL: pool.name, **lane_labels(kind.lanes)}, pod_spec, kind.nodes)


def worker_job_spec(labels: dict[str, str], pod_spec: dict[str, Any], nodes: int = 1) -> dict[str, Any]:
    """A worker Job around its pod: an Indexed Job of ``nodes`` pods (all or none of a gang start
    together), with the retry rules shared by every worker kind.

    A lost pod is replaced, index by index (an elastic run's node comes back, docs/DESIGN.md "Elastic torchrun
    runs"), under the Job controller's rules for the fields below (kubernetes/kubernetes
    pkg/controller/job/indexed_job_utils.go; bench/autoscale_sim.py ``failed_pod_outcome`` applies them):

    - ``podReplacementPolicy: Failed``: the replacement of index i is created only once its old pod is terminal
      (``firstPendingIndexes`` counts terminating pods as not pending), so a spot-noticed pod checkpointing in its
      grace period never shares its index, GPUs' quota or rendezvous name with its successor. The only value
      allowed with a ``podFailurePolicy`` (and its default then). Feature gate JobPodReplacementPolicy
      (KEP-3939): beta and on by default 1.29-1.33, GA 1.34 (pkg/features/kube_features.go).
    - ``backoffLimitPerIndex`` / ``maxFailedIndexes``: each index retries on its own budget (``isIndexFailed``:
      a counted failure of a pod whose ``batch.kubernetes.io/job-index-failure-count`` is already at the limit,
      or a FailIndex rule, fails the index); a failed index is not replaced and the others go on, so a gang
      with one bad node keeps training at the nodes left. ``maxFailedIndexes`` = ``nodes - 1``: the Job fails
      once every index has. ``backoffLimit`` still bounds the counted failures of the whole Job. Feature
      gate JobBackoffLimitPerIndex (KEP-3850): beta 1.29-1.32, GA 1.33, the oldest version the stack takes
      (infra/config_schema.py ``SUPPORTED_KUBERNETES_VERSIONS``). Disruptions (the Ignore rule) count against neither,
      but with a per-index limit the replacement waits the pod back-off of the index's failures, ignored
      ones included (``getRemainingTimePerIndex``: 10 s, doubling)."""
    return {
        "completionMode": "Indexed",
        "completions": nodes,
        "parallelism": nodes,
        "backoffLimit": BACKOFF_LIMIT,
        "backoffLimitPerIndex": BACKOFF_LIMIT_PER_INDEX,
        "maxFailedIndexes": nodes - 1,
        "podReplacementPolicy": "Failed",
        "ttlSecondsAfterFinished": 86400,
        "podFailurePolicy": {"rules": [
            # Bad run config or data: retrying cannot help.
            {"action": "FailJob", "onExitCodes": {"containerName": "worker", "operator": "In",
                                                   "values": [exit_codes.BAD_INPUT]}},
            # The pre-flight health check failed: nothing was claimed (no run attempt spent), and the
            # worker tainted its node out of scheduling before exiting (infra/node_fence.py). Failing the
            # Job does not move the next one: KEDA sees it finished (kedacore/keda v2.20.2
            # pkg/scaling/executor/scale_jobs.go isJobFinished) and, the run still queued, starts another
            # whose pod would land on the same empty node but for that taint; a retry of this Job's pod
            # would do the same. The alerts RagpoolWorkerHealthCheckFailed and RagpoolGpuNodeFenced page.
            {"action": "FailJob", "onExitCodes": {"containerName": "worker", "operator": "In",
                                                   "values": [exit_codes.HEALTH_CHECK_FAILED]}},
            # A multi-node run's gang did not form within the gang deadline (the run was handed back
            # unspent): fail the whole Job, so no pod of it still Pending (its node never came) keeps
            # the Job unfinished with no Ready pod, which KEDA's accurate strategy counts as pending and
            # would start no replacement for (kedacore/keda v2.20.2 pkg/scaling/executor/scale_jobs.go
            # getPendingJobCount). The job controller removes the Job's other pods when it fails it.
            {"action": "FailJob", "onExitCodes": {"containerName": "worker", "operator": "In",
                                                   "values": [exit_codes.GANG_TIMEOUT]}},
            # The Ray worker: the Ray cluster is unreachable or refuses the token (training/ray/job.py);
            # the run was handed back unspent and the worker stopped claiming. Fail the Job: without this
            # rule the exit matched none and was counted (kubernetes/kubernetes
            # pkg/controller/job/pod_failure_policy.go matchPodFailurePolicy: rules in order, the first
            # match decides, none counts against backoffLimit), so the Job retried the pod up to
            # backoffLimit times, each one taking a ray run and handing it back. Failed, the Job is no
            # longer running for KEDA, which starts a fresh one at its next poll only while runs are
            # queued; Jobs that keep failing with runs queued raise RagpoolLaneWorkerJobsFailing.
            {"action": "FailJob", "onExitCodes": {"containerName": "worker", "operator": "In",
                                                   "values": [exit_codes.UNAVAILABLE]}},
            # Node drained, spot reclaimed, preempted: not the job's fault, retry for free.
            {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
            # Checkpointed after SIGTERM: retry (counted), resuming from the checkpoint.
            {"action": "Count", "onExitCodes": {"containerName": "worker", "operator": "In",
                                                 "values": [exit_codes.RETRIABLE]}},
        ]},
        "template": {
            "metadata": {
                "labels": labels,
                # Karpenter must never consolidate or expire a node under a running worker.
                "annotations": {"karpenter.sh/do-not-disrupt": "true"},
            },
            "spec": pod_spec,
        },
    }


def worker_cronjob(job_spec: dict[str, Any]) -> dict[str, Any]:
    """The suspended CronJob around a worker Job: its template for ``kubectl create job --from``, which copies the
    template's labels onto the Job: the queue label too, so a Job started by hand waits for Kueue's admission
    like KEDA's (docs/DESIGN.md, "KEDA and Kueue")."""
    return {
        "schedule": "@yearly",
        "suspend": True,  # a template: Jobs are created from it on demand, never on schedule
        "concurrencyPolicy": "Allow",
        "jobTemplate": {"metadata": {"labels": {**job_spec["template"]["metadata"]["labels"],
                                                KUEUE_QUEUE_LABEL: LOCAL_QUEUE}},
                        "spec": job_spec},
    }


def ray_worker_cronjob_spec(image: str, redis_secret: str, shared_claim: str, ray: RayEndpoint,
                            queue_namespace: str = "ragpool") -> dict[str, Any]:
    """A suspended CronJob whose jobTemplate is the Ray worker's Job."""
    return worker_cronjob(ray_worker_job_spec(image, redis_secret, shared_claim, ray, queue_namespace))


def ray_worker_job_spec(image: str, redis_secret: str, shared_claim: str, ray: RayEndpoint,
                        queue_namespace: str = "ragpool") -> dict[str, Any]:
    """The CPU-only worker that takes ``executor: ray`` runs: on the system nodes, no GPU."""
    lanes = ray_worker_lanes()
    pod_spec = _worker_pod(
        image=image, redis_secret=redis_secret, shared_claim=shared_claim, queue_namespace=queue_namespace,
        node_selector=dict(SYSTEM_NODE_SELECTOR), args=[],
        env=[
            {"name": EXECUTORS_ENV, "value": Executor.RAY.value},
            *({"name": k, "value": v} for k, v in worker_env(lanes).items()),
            {"name": "RAY_ADDRESS", "value": ray.address},
            # The worker re-checks each ray run's stages against the pools it can reach.
            {"name": POOLS_ENV, "value": ray.pools},
            # The cluster's token, sent on every Jobs API call (contract/ray_auth.py), and the Secret
            # a refusal names.
            *[{"name": k, "value": v} for k, v in client_env(f"{RAY_TOKEN_DIR}/{TOKEN_SECRET_KEY}").items()],
            {"name": SECRET_ENV, "value": f"{ray.namespace}/{ray.auth_secret}"},
        ],
        secret_volumes=(ray_token_volume(ray),),
        ports=[{"name": "queue-metrics", "containerPort": QUEUE_METRICS_PORT}],
        resources={"requests": {"cpu": "250m", "memory": "512Mi"}, "limits": {"memory": "1Gi"}},
        tmp_size="1Gi")
    return worker_job_spec({**WORKER_LABELS, **RAY_CLIENT_LABEL, **SYSTEM_NODE_SELECTOR, **lane_labels(lanes)},
                           pod_spec)


class WorkerJobs(RagpoolComponent):
    def __init__(self, name: str, args: WorkerJobsArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("ragpool:infra:WorkerJobs", name, opts, k8s_provider=args.k8s_provider)
        name = self.child_prefix
        cfg = args.config
        self.templates: list[str] = []
        ray_max_jobs = sum(max_workers(cfg, p, args.gpu_quota) for p in cfg.gpu_pools) if args.ray else None
        kinds = worker_kinds(cfg, args.gpu_quota, ray_max_jobs)
        self.served_lanes: str = served_lanes(kinds) if args.keda is not None else ""
        """``RAGPOOL_SERVED_LANES`` of this namespace: the lanes its ScaledJobs start workers for."""
        # Room for every Job its ScaledJobs keep and run, and the others (infra/keda.py jobs_quota).
        k8s.core.v1.ResourceQuota(
            f"{name}-jobs-quota", metadata={"name": JOBS_QUOTA, "namespace": args.namespace,
                                            "labels": k8s_labels("worker", JOBS_QUOTA)},
            spec={"hard": {"count/jobs.batch": str(jobs_quota(scaled_job_kinds(kinds)))}},
            opts=child(self, depends_on=args.depends_on))
        for kind in kinds:
            if kind.pool is None:
                job = pulumi.Output.from_input(args.image).apply(
                    lambda image: ray_worker_job_spec(image, args.redis_secret, args.shared_claim,
                                                      args.ray, args.queue_namespace))
                resource, labels = f"{name}-ray", {**k8s_labels("worker"), **RAY_CLIENT_LABEL}
            else:
                job = pulumi.Output.all(args.image, args.namespace).apply(
                    lambda a, kind=kind: gpu_worker_job_spec(kind, a[0], a[1], args.redis_secret,
                                                             args.shared_claim, args.queue_namespace))
                suffix = "" if kind.nodes == 1 else f"-n{kind.nodes}"
                resource, labels = f"{name}-{kind.pool.name}{suffix}", {**k8s_labels("worker"), POOL_LABEL: kind.pool.name}
            k8s.batch.v1.CronJob(
                resource, metadata={"name": kind.name, "namespace": args.namespace, "labels": labels},
                spec=job.apply(worker_cronjob), opts=child(self, depends_on=args.depends_on))
            self.templates.append(kind.name)
            for sj in (scaled_job_kinds([kind]) if args.keda is not None else []):
                # KEDA copies these labels onto every Job it creates (scale_jobs.go generateJobs), the queue label
                # and a per-priority ScaledJob's priority class too: Kueue reads them from the Job's own labels
                # (docs/DESIGN.md, "KEDA and Kueue"). The default priority's keeps the kind's names (scaled_job_kinds).
                k8s.apiextensions.CustomResource(
                    f"{resource}{sj.name[len(kind.name):]}-scaledjob", api_version="keda.sh/v1alpha1",
                    kind="ScaledJob",
                    metadata={"name": sj.name, "namespace": args.namespace,
                              "labels": {**k8s_labels("worker", sj.name), **({POOL_LABEL: kind.pool.name} if kind.pool else {}),
                                         **lane_labels(kind.lanes), KUEUE_QUEUE_LABEL: LOCAL_QUEUE, **scaled_job_labels(sj)},
                              # ... except managed-by: KEDA manages those Jobs, not Pulumi (the annotation's
                              # name: apis/keda/v1alpha1/scaledjob_types.go ScaledJobExcludedLabelsAnnotation).
                              "annotations": {KEDA_EXCLUDED_LABELS: "app.kubernetes.io/managed-by"}},
                    spec=pulumi.Output.all(job, args.keda).apply(
                        lambda a, sj=sj: scaled_job_spec(a[0], sj, args.queue_namespace, a[1])),
                    opts=child(self, depends_on=args.depends_on))
        if args.keeper_queue_namespaces:
            meta = {"name": KEEPER_NAME, "namespace": args.namespace, "labels": k8s_labels("queue-keeper", KEEPER_NAME)}
            k8s.apps.v1.Deployment(
                f"{name}-keeper", metadata=meta,
                spec=pulumi.Output.from_input(args.image).apply(
                    lambda image: keeper_deployment_spec(image, args.redis_secret, args.keeper_queue_namespaces)),
                opts=child(self, depends_on=args.depends_on))
            k8s.networking.v1.NetworkPolicy(
                f"{name}-keeper", metadata=meta, spec=keeper_network_policy(cfg),
                opts=child(self, depends_on=args.depends_on))
        self.register_outputs({"templates": self.templates, "servedLanes": self.served_lanes})
