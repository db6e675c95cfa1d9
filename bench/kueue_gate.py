"""Kueue in front of the simulated Job controller (bench/autoscale_sim.py): Jobs are created
suspended, the transcribed scheduler (bench/kueue/, Kueue v0.19.2) admits them, and a
preempted Job is suspended again, its pods deleted (SIGTERM, then SIGKILL after the grace).

What Kueue's job integration does, and what is simulated of it (kubernetes-sigs/kueue v0.19.2):

- ``pkg/controller/jobs/job/job_controller.go`` / ``pkg/controller/jobframework/reconciler.go``: a Job
  of a namespace with a LocalQueue (the ``kueue.x-k8s.io/queue-name`` label, or the namespace's
  defaulting LocalQueue) is created with ``spec.suspend: true`` (the webhook) and gets a Workload of
  one pod set: ``parallelism`` pods with the container's requests (``PodSets``); admission
  unsuspends it (``RunWithPodSetsInfo``), the Job controller then creates every pod at once;
- eviction (``IsEvicted``): the Job is suspended (``Suspend``), so the Job controller deletes its
  active pods (SIGTERM, the grace period, SIGKILL); once no pod is active the Workload's quota is
  released and it is queued again (``workload.UnsetQuotaReservationWithCondition``);
- a finished Job finishes its Workload: its quota is released.

The ``activeDeadlineSeconds`` clock of a suspended Job is stopped (kubernetes pkg/controller/job: a
suspended Job has no ``startTime``). Not simulated: matching a flavor's ``nodeLabels`` against the
pods' node selector (the flavor scan takes the ClusterQueue's flavors in order; the dev stack has one
GPU pool, so one flavor).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from bench.kueue.cluster import Cluster, PodSet, Workload
from bench.kueue.quota import potential_available
from bench.kueue.scheduler import Scheduler
from contract.names import GPU_RESOURCE, KUEUE_PRIORITY_CLASS_LABEL, KUEUE_QUEUE_LABEL


@dataclass
class Eviction:
    at: float
    job: str
    """The evicted Job's name (its Workload's)."""
    reason: str
    by: str
    """The preemptor Workload."""
    pods: list[str] = field(default_factory=list)


class KueueGate:
    """Workloads for the simulation's Jobs, admitted by :class:`bench.kueue.scheduler.Scheduler`."""

    def __init__(self, objects: list[dict], *, fair_sharing: bool = False,
                 on_evict: Callable[[Eviction], None] | None = None) -> None:
        def kind(k: str) -> list[dict]:
            return [o for o in objects if o.get("kind") == k]
        self.cluster = Cluster(kind("ClusterQueue"), kind("Cohort"), kind("LocalQueue"))
        self.scheduler = Scheduler(self.cluster, fair_sharing=fair_sharing)
        self.priorities = {o["metadata"]["name"]: int(o.get("value", 0)) for o in kind("WorkloadPriorityClass")}
        self.workloads: dict[str, Workload] = {}
        """Job name -> its Workload."""
        self.evictions: list[Eviction] = []
        self.on_evict = on_evict
        self.waits: dict[str, str] = {}
        """Workload -> why it was not admitted in the last cycle."""

    # -- the Job's side ----------------------------------------------------------------------

    def cluster_queue_of(self, job) -> str:
        """The ClusterQueue of the LocalQueue the Job's own labels name (``job.labels``: KEDA gives a Job its
        ScaledJob's labels; Kueue does not read the pod template's), else of its namespace's only LocalQueue."""
        queue = job.labels.get(KUEUE_QUEUE_LABEL)
        if queue is None:  # the namespace's defaulting LocalQueue: there is one per training namespace
            names = [lq for (ns, lq) in self.cluster.local_queues if ns == job.namespace]
            if len(names) != 1:
                raise ValueError(f"Job {job.name}: no {KUEUE_QUEUE_LABEL} label and {len(names)} LocalQueues "
                                 f"in {job.namespace}")
            queue = names[0]
        return self.cluster.cluster_queue_of(job.namespace, queue)

    def job_created(self, job, now: float) -> Workload:
        """The Job's Workload, queued (the Job stays suspended until it is admitted)."""
        template = job.spec["template"]
        container = template["spec"]["containers"][0]
        gpus = int(container.get("resources", {}).get("requests", {}).get(GPU_RESOURCE, 0))
        # The Job's WorkloadPriorityClass label, else 0 (the sim has no PriorityClass objects: a Job without the label
        # ranks by its pods' PriorityClass in Kueue, pkg/controller/jobframework/reconciler.go ExtractPriority).
        label = job.labels.get(KUEUE_PRIORITY_CLASS_LABEL)
        wl = Workload(job.name, self.cluster_queue_of(job), [PodSet(int(job.spec.get("parallelism", 1)),
                                                                           {GPU_RESOURCE: gpus} if gpus else {})],
                         priority=self.priorities.get(label, 0), created=now, uid=job.name)
        self.workloads[job.name] = wl
        self.scheduler.submit(wl)
        return wl

    def job_finished(self, job) -> None:
        wl = self.workloads.get(job.name)
        if wl is None:
            return
        if wl.flavors is not None:
            self.scheduler.finish(wl)
        else:
            queue = self.scheduler.pending[wl.cluster_queue]
            if wl in queue:
                queue.remove(wl)

    def pods_gone(self, job) -> None:
        """An evicted Job has no active pod left: its quota is free, its Workload queued again."""
        wl = self.workloads[job.name]
        if wl.evicted and wl.flavors is not None:
            self.scheduler.evicted_pods_gone(wl)

    # -- one scheduling cycle ----------------------------------------------------------------

    def schedule(self, now: float) -> tuple[list[str], list[Eviction]]:
        """(Jobs to unsuspend, evictions to carry out) after one scheduling cycle."""
        result = self.scheduler.schedule(now)
        self.waits = dict(result.waiting)
        evictions = []
        for preemptor, target in result.preempted:
            ev = Eviction(now, target.workload.name, target.reason, preemptor.name)
            evictions.append(ev)
            self.evictions.append(ev)
        return [w.name for w in result.admitted], evictions

    def gpus_reachable(self, namespace: str, pool: str) -> int:
        """The most GPUs of ``pool`` the namespace's ClusterQueue can hold (``potentialAvailable``)."""
        cq_name = next(cq for (ns, _), cq in self.cluster.local_queues.items() if ns == namespace)
        return potential_available(self.cluster.cqs[cq_name], (pool, GPU_RESOURCE))

    def nominal_gpus(self, namespace: str, pool: str) -> int:
        cq_name = next(cq for (ns, _), cq in self.cluster.local_queues.items() if ns == namespace)
        quota = self.cluster.cqs[cq_name].quotas.get((pool, GPU_RESOURCE))
        return quota.nominal if quota else 0
