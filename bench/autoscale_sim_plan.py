"""What the from-zero simulation (bench/autoscale_sim.py) reads from an offline plan and how it runs it: the
stack (:func:`stack_from_plan`: the ScaledJobs, the keeper Deployment, the NodePools' GPU limits, the namespaces'
GPU quotas, the Kueue objects), the labels KEDA gives a ScaledJob's Jobs, what a ScaledJob's worker claims (its
queue namespace and lanes), and the simulation's timing (:class:`Settings`, applied to a ScaledJob by
:func:`localize`)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from contract.env import REDIS_URL_ENV
from contract.names import GPU_RESOURCE, POOL_LABEL


@dataclass(frozen=True)
class Settings:
    """What the simulation runs under."""

    polling_interval_s: float = 2.0
    """The ScaledJobs' ``pollingInterval`` (KEDA's default is 30 s; whole seconds in the CRD)."""
    idle_exit_s: float = 3.0
    """The workers' ``--idle-exit-seconds``."""
    lease_s: float = 4.0
    """The workers' ``--lease-seconds`` (a lost worker's run is requeued this long after its last heartbeat)."""
    keeper_interval_s: float = 1.0
    """The keeper's ``--interval-seconds``."""
    worker_poll_s: float = 0.5
    """The workers' ``--poll-seconds``."""
    backoff_s: float = 6.0
    """The workers' retry back-off (``--backoff-base-seconds`` = ``--backoff-max-seconds``): longer
    than idle-exit, so a failed run's retry comes due when no worker is left."""
    gang_deadline_s: float = 6.0
    """The workers' ``--gang-deadline-seconds`` (all pods of a multi-node Job join by then, or none runs)."""
    step_s: float = 0.25
    """One workload step."""
    stop_grace_s: float = 10.0
    """Longest SIGTERM grace when the Job controller deletes a pod (the template's, capped)."""
    reconcile_s: float = 0.1
    """How often the fake Job controller looks at its pods."""



def set_flag(args: list[str], flag: str, value: str) -> list[str]:
    """``args`` with ``flag``'s value set to ``value`` (appended when absent)."""
    out = list(args)
    if flag in out:
        out[out.index(flag) + 1] = value
    else:
        out += [flag, value]
    return out


def localize(manifest: dict, settings: Settings) -> dict:
    """A ScaledJob as the simulation runs it: its ``pollingInterval`` and the worker's timing flags
    from ``settings`` (:class:`Settings`), the GPU health check off (no GPU here). Nothing else changes."""
    out = json.loads(json.dumps(manifest))
    out["spec"]["pollingInterval"] = int(settings.polling_interval_s)
    container = out["spec"]["jobTargetRef"]["template"]["spec"]["containers"][0]
    args = container.get("args", [])
    for flag, value in (("--lease-seconds", settings.lease_s), ("--idle-exit-seconds", settings.idle_exit_s),
                        ("--poll-seconds", settings.worker_poll_s), ("--health-check-timeout-seconds", 0),
                        ("--gang-deadline-seconds", settings.gang_deadline_s),
                        ("--backoff-base-seconds", settings.backoff_s), ("--backoff-max-seconds", settings.backoff_s)):
        args = set_flag(args, flag, f"{value:g}")
    container["args"] = args
    return out


@dataclass
class Stack:
    """What the simulation takes from a plan (:func:`stack_from_plan`)."""

    scaled_jobs: list[dict]
    keeper: dict | None
    """The keeper Deployment (None: the plan has none)."""
    gpu_capacity: dict[str, int]
    """Pool -> its NodePool's ``limits`` of GPUs (what Karpenter may bring up)."""
    gpu_quotas: dict[str, int]
    """Namespace -> its ResourceQuota's ``requests.nvidia.com/gpu``."""
    redis_config: str
    """The ConfigMap the workers' ``REDIS_URL`` and required replicas come from (the password is a file of the
    connection Secret, infra/queue_redis.py ``CONNECTION_SECRET``)."""
    kueue_objects: list[dict] = field(default_factory=list)
    """The plan's Kueue objects (ClusterQueues, Cohorts, LocalQueues, WorkloadPriorityClasses): what
    :class:`bench.kueue_gate.KueueGate` admits by when the simulation runs with ``kueue=True``."""

    def queue_namespaces(self) -> list[str]:
        return sorted({queue_namespace(m) for m in self.scaled_jobs})



SCALED_JOB_TYPE = "kubernetes:keda.sh/v1alpha1:ScaledJob"
"""The Pulumi type of a ScaledJob in ``ragpool plan``'s output."""
KUEUE_TYPE_PREFIX = "kubernetes:kueue.x-k8s.io/v1beta2:"
"""The Pulumi types of Kueue's objects in ``ragpool plan``'s output."""


def stack_from_plan(plan: dict, namespace: str | None = None) -> Stack:
    """The ScaledJobs (of Kubernetes namespace ``namespace`` only, when given), the keeper, the
    NodePools' GPU limits and the namespaces' GPU quotas of an offline plan."""
    def objects(kind: str) -> list[dict]:
        return [r["inputs"] for r in plan["resources"] if r["type"].endswith(kind)]

    scaled_jobs = scaled_jobs_from_plan(plan, namespace)
    keepers = [d for d in objects(":apps/v1:Deployment")
               if d["spec"]["template"]["spec"]["containers"][0].get("command", [])[-1:] == ["training.scheduler.keeper"]]
    capacity = {}
    for pool in objects(":karpenter.sh/v1:NodePool"):
        label = pool["spec"]["template"]["metadata"].get("labels", {}).get(POOL_LABEL)
        limit = (pool["spec"].get("limits") or {}).get(GPU_RESOURCE)
        if label and limit is not None:
            capacity[label] = int(limit)
    quotas = {q["metadata"]["namespace"]: int(q["spec"]["hard"][f"requests.{GPU_RESOURCE}"])
              for q in objects(":core/v1:ResourceQuota") if f"requests.{GPU_RESOURCE}" in q["spec"].get("hard", {})}
    container = scaled_jobs[0]["spec"]["jobTargetRef"]["template"]["spec"]["containers"][0]
    [config] = [e["valueFrom"]["configMapKeyRef"]["name"] for e in container["env"] if e["name"] == REDIS_URL_ENV]
    kueue_objects = [r["inputs"] for r in plan["resources"] if r["type"].startswith(KUEUE_TYPE_PREFIX)]
    return Stack(scaled_jobs=scaled_jobs, keeper=keepers[0] if keepers else None, gpu_capacity=capacity,
                 gpu_quotas=quotas, redis_config=config, kueue_objects=kueue_objects)


def scaled_jobs_from_plan(plan: dict, namespace: str | None = None) -> list[dict]:
    """The ScaledJob objects of an offline plan (``infra.plan.plan``: what ``pulumi up`` would
    apply), those of Kubernetes namespace ``namespace`` only when given."""
    out = [r["inputs"] for r in plan["resources"] if r["type"] == SCALED_JOB_TYPE]
    if namespace is not None:
        out = [m for m in out if m["metadata"].get("namespace") == namespace]
    if not out:
        raise ValueError(f"the plan declares no ScaledJob{' in ' + namespace if namespace else ''}")
    return out


def job_labels(manifest: dict) -> dict[str, str]:
    """The labels KEDA gives each Job of the ScaledJob ``manifest``: its own (less ``app.kubernetes.io/version``, the
    operator's), then the ScaledJob's labels but
    those its excluded-labels annotation lists (kedacore/keda v2.20.2 pkg/scaling/executor/scale_jobs.go
    ``generateJobs``: the annotation split on commas, untrimmed)."""
    from contract.names import KEDA_EXCLUDED_LABELS

    meta = manifest.get("metadata", {})
    name = meta.get("name", "")
    excluded = set((meta.get("annotations") or {}).get(KEDA_EXCLUDED_LABELS, "").split(","))
    return {"app.kubernetes.io/name": name, "app.kubernetes.io/part-of": name,
            "app.kubernetes.io/managed-by": "keda-operator", "scaledjob.keda.sh/name": name,
            **{k: v for k, v in (meta.get("labels") or {}).items() if k not in excluded}}


def container_env(manifest: dict, name: str) -> str | None:
    """The literal value of env ``name`` in a ScaledJob's worker container, or None."""
    container = manifest["spec"]["jobTargetRef"]["template"]["spec"]["containers"][0]
    return next((e.get("value") for e in container.get("env", []) if e["name"] == name), None)


def queue_namespace(manifest: dict) -> str:
    """The queue key namespace a ScaledJob's workers claim from (their ``RAGPOOL_QUEUE_NAMESPACE``)."""
    from contract.env import NAMESPACE_ENV

    value = container_env(manifest, NAMESPACE_ENV)
    if not value:
        raise ValueError(f"ScaledJob {manifest['metadata']['name']}: no {NAMESPACE_ENV} in its worker")
    return value


def lanes_of(manifest: dict):
    """The lanes a ScaledJob's workers claim (their ``RAGPOOL_LANES``)."""
    from contract.lanes import LANES_ENV, parse_lanes

    return parse_lanes(container_env(manifest, LANES_ENV) or "")
