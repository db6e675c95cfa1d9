"""KEDA and quotas: a ScaledJob per lane that can hold a run, and job quotas that hold what the ScaledJobs keep."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from contract.names import GPU_RESOURCE, POOL_LABEL
from policy.checks.karpenter import is_gpu_nodepool
from policy.checks.model import NAMESPACE_TYPE, Context, Resource
from policy.checks.values import _first, _metadata_name, _number
from policy.checks.workloads import training_namespaces
from policy.pod_templates import POD_SPEC_PATHS, SCALED_JOB_POD_PATH, SCALED_JOB_TYPE
from policy.pod_templates import as_list as _as_list
from policy.pod_templates import get as _get


RESOURCE_QUOTA_TYPE = "kubernetes:core/v1:ResourceQuota"
RAYCLUSTER_TYPES = frozenset({"kubernetes:ray.io/v1:RayCluster"})


def _worker_env(pod_spec: Any) -> dict[str, str]:
    """The plain env values of a worker pod's first container."""
    containers = _as_list(_get(pod_spec, "containers"))
    return {str(_get(e, "name")): str(_get(e, "value")) for e in _as_list(_get(_first(containers), "env"))
            if _get(e, "value") is not None} if containers else {}


def _claimed_lanes(pod_spec: Any) -> tuple[Any, ...]:
    """The lanes a worker pod claims (its RAGPOOL_LANES); () when it names none or they do not parse."""
    from contract.lanes import LANES_ENV, LaneError, parse_lanes

    text = _worker_env(pod_spec).get(LANES_ENV)
    try:
        return parse_lanes(text) if text else ()
    except LaneError:
        return ()


def claimed_priorities(pod_spec: Any) -> tuple[str, ...]:
    """The priorities a worker pod claims (its RAGPOOL_PRIORITIES; every one when unset); () when they do not parse."""
    from contract.lanes import PRIORITIES_ENV, LaneError, parse_priorities

    try:
        return parse_priorities(_worker_env(pod_spec).get(PRIORITIES_ENV, ""))
    except LaneError:
        return ()


def check_lanes_have_one_scaled_job(resources: Sequence[Resource], ctx: Context) -> Iterator[tuple[Resource | None, str]]:
    """In every training namespace, every lane that can hold a run has exactly one ScaledJob per priority (one
    for every priority, or one per priority whose worker claims only it, RAGPOOL_PRIORITIES), and
    each ScaledJob triggers on exactly its lanes' ready lists (of its priorities) of its own queue,
    summed. Lanes that can hold a run, for every GPU NodePool P of which at least one worker fits
    (its GPU limit, within the namespace's GPU quota, over the GPUs of P's worker pod): ``pool.<P>``
    and ``pool.<P>.n<N>`` for N from 2 to the workers P holds, and for the default pool (the one
    whose workers take the unpinned lane, the stack's first) ``torchrun`` and ``torchrun.n<N>``
    likewise; ``ray`` where a RayCluster runs. (A namespace whose quota fits no worker of a pool
    has no lane of it: such runs are the submitter's to pin elsewhere.)"""
    from contract.lanes import LANES_ENV, MAX_NODES, PRIORITIES, PRIORITIES_ENV, Lane
    from contract.env import NAMESPACE_ENV
    from contract.names import DEFAULT_NAMESPACE

    pools: dict[str, float] = {}
    for r in resources:
        if is_gpu_nodepool(r):
            pool = _get(r.inputs, "spec", "template", "metadata", "labels", POOL_LABEL)
            limit = _number(_get(r.inputs, "spec", "limits", GPU_RESOURCE))
            if isinstance(pool, str) and limit:
                pools[pool] = limit
    if not pools:
        return
    configured = training_namespaces(ctx)
    namespaces = [_metadata_name(r) for r in resources if r.type == NAMESPACE_TYPE and (
        _metadata_name(r) in configured or _get(r.inputs, "metadata", "labels", "app.kubernetes.io/component") == "training")]
    # GPUs per worker pod of each pool, and the default pool: the same in every namespace.
    gpus: dict[str, float] = {}
    default_pool = None
    for r in resources:
        path = SCALED_JOB_POD_PATH if r.type == SCALED_JOB_TYPE else POD_SPEC_PATHS.get(r.type)
        pod = _get(r.inputs, *path) if path else None
        pool = _get(pod, "nodeSelector", POOL_LABEL)
        count = _number(_get(_first(_as_list(_get(pod, "containers"))), "resources", "requests", GPU_RESOURCE))
        if pool in pools and count:
            gpus[pool] = count
            if Lane() in _claimed_lanes(pod):
                default_pool = pool
    for ns in namespaces:
        def here(r: Resource) -> bool:
            return _get(r.inputs, "metadata", "namespace") == ns  # noqa: B023 (used at once)

        scaled = [r for r in resources if r.type == SCALED_JOB_TYPE and here(r)]
        quota = next((_number(_get(r.inputs, "spec", "hard", f"requests.{GPU_RESOURCE}")) for r in resources
                      if r.type == RESOURCE_QUOTA_TYPE and here(r)
                      and _get(r.inputs, "spec", "hard", f"requests.{GPU_RESOURCE}") is not None), None)
        expected = set() if default_pool else {Lane()}  # no worker takes unpinned runs: say so below
        for pool, limit in pools.items():
            if pool not in gpus:
                expected.add(Lane(pool=pool))  # no worker of the pool anywhere: its lane is uncovered
                continue
            workers = int(min(limit, quota) if quota is not None else limit) // int(gpus[pool])
            for nodes in range(1, min(workers, MAX_NODES) + 1):
                expected.add(Lane(nodes=nodes, pool=pool))
                if pool == default_pool:
                    expected.add(Lane(nodes=nodes))
        if any(r.type in RAYCLUSTER_TYPES and here(r) for r in resources):
            expected.add(Lane("ray"))
        owners: dict[Any, list[str]] = {(lane, prio): [] for lane in expected for prio in PRIORITIES}
        for r in scaled:
            spec = _get(r.inputs, "spec")
            pod = _get(spec, "jobTargetRef", "template", "spec")
            lanes = _claimed_lanes(pod)
            name = _metadata_name(r)
            if not lanes:
                yield r, (f"ScaledJob {ns}/{name}: its worker names no valid {LANES_ENV} (jobTargetRef's first "
                          "container): KEDA would start workers that claim lanes nobody counted; build the Job "
                          "with infra/worker_jobs.py (worker_env of its lanes)")
                continue
            prios = claimed_priorities(pod)
            if not prios:
                yield r, (f"ScaledJob {ns}/{name}: its worker's {PRIORITIES_ENV} names no valid priority (one or more "
                          f"of {', '.join(PRIORITIES)}, or unset for every one)")
                continue
            for lane in lanes:
                for prio in prios:
                    owners.setdefault((lane, prio), []).append(name)
            queue = _worker_env(pod).get(NAMESPACE_ENV) or DEFAULT_NAMESPACE
            want = sorted(key for lane in lanes for key in lane.ready_keys(queue, prios))
            triggers = _as_list(_get(spec, "triggers"))
            got = sorted(str(_get(t, "metadata", "listName")) for t in triggers)
            if got != want or any(_get(t, "type") not in ("redis", "redis-sentinel") for t in triggers):
                yield r, (f"ScaledJob {ns}/{name}: triggers on {got!r} but its workers claim "
                          f"{[lane.name for lane in lanes]!r} of queue {queue!r}, whose ready lists are {want!r}: "
                          "one redis trigger per list, no other (infra/keda.py redis_triggers)")
            calc = _get(spec, "scalingStrategy", "multipleScalersCalculation")
            if len(triggers) > 1 and calc != "sum":
                yield r, (f"ScaledJob {ns}/{name}: scalingStrategy.multipleScalersCalculation is {calc!r}: its "
                          "lists together hold the runs that need a worker; set sum")
        for lane in sorted({lane for lane, _ in owners}, key=lambda lane: lane.name):
            per_prio = {prio: sorted(owners.get((lane, prio), [])) for prio in PRIORITIES}
            # One message for the lane when every priority is off alike (one ScaledJob for every priority).
            groups = [("", per_prio[PRIORITIES[0]])] if len({tuple(v) for v in per_prio.values()}) == 1 else [
                (f" {prio}", names) for prio, names in per_prio.items()]
            for what, names in groups:
                if len(names) == 1:
                    continue
                found = f"{len(names)} ({', '.join(names)})" if names else "none"
                yield None, (f"lane {lane.name!r} in namespace {ns!r} can hold a{what} run but has {found} ScaledJobs: "
                             "exactly one must start its workers, or its runs wait forever (none) or get two "
                             "Jobs each (two); declare one per worker kind (infra/keda.py worker_kinds)")


# KEDA's defaults for a ScaledJob field left unset (kedacore/keda v2.20.2 apis/keda/v1alpha1/scaledjob_types.go;
# pkg/scaling/executor/scale_jobs.go cleanUp keeps that many finished Jobs of each kind).
KEDA_DEFAULT_JOBS_HISTORY = 100
KEDA_DEFAULT_MAX_REPLICAS = 100


def check_jobs_quota_covers_scaled_jobs(resources: Sequence[Resource], ctx: Context
                                        ) -> Iterator[tuple[Resource | None, str]]:
    """In every namespace with ScaledJobs, each ResourceQuota's ``count/jobs.batch`` holds what they can keep at
    once: per ScaledJob, ``successfulJobsHistoryLimit`` + ``failedJobsHistoryLimit`` finished Jobs (KEDA deletes
    older ones) and up to ``maxReplicaCount`` unfinished ones. At the quota the API server refuses the next Job
    KEDA creates, and the lane's runs wait with no worker and no error but KEDA's log."""
    need: dict[Any, int] = {}
    for r in resources:
        if r.type != SCALED_JOB_TYPE:
            continue
        spec = _get(r.inputs, "spec")
        counts = [_number(_get(spec, "successfulJobsHistoryLimit")), _number(_get(spec, "failedJobsHistoryLimit")),
                  _number(_get(spec, "maxReplicaCount"))]
        defaults = (KEDA_DEFAULT_JOBS_HISTORY, KEDA_DEFAULT_JOBS_HISTORY, KEDA_DEFAULT_MAX_REPLICAS)
        ns = _get(r.inputs, "metadata", "namespace")
        need[ns] = need.get(ns, 0) + sum(int(c if c is not None else d) for c, d in zip(counts, defaults))
    for r in resources:
        if r.type != RESOURCE_QUOTA_TYPE:
            continue
        ns = _get(r.inputs, "metadata", "namespace")
        hard = _number(_get(r.inputs, "spec", "hard", "count/jobs.batch"))
        if hard is not None and ns in need and hard < need[ns]:
            yield r, (f"ResourceQuota {ns}/{_metadata_name(r)}: count/jobs.batch {hard:g} is below the {need[ns]} "
                      "Jobs the namespace's ScaledJobs can hold (history limits + maxReplicaCount each); KEDA's next "
                      "Job would be refused. Size it with infra/keda.py jobs_quota")
