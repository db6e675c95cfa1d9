"""Kueue's objects and snapshot, transcribed: Workloads, ClusterQueues, and the cluster of ClusterQueues,
Cohorts and LocalQueues built from their v1beta2 manifests (bad fields named in the error).

Source: kubernetes-sigs/kueue tag v0.19.2 (:data:`infra.charts.KUEUE_TAG`), Apache-2.0:

- ``apis/kueue/v1beta2/clusterqueue_types.go``: the preemption policies and queueing strategies;
- ``pkg/cache/scheduler/clusterqueue_snapshot.go``: ``Available``, ``Borrowing``, ``BorrowingWith``,
  ``Fits``, ``SimulateUsageAddition`` / ``SimulateUsageRemoval``, ``IsBorrowingWithinCohortForbidden``;
- ``pkg/cache/scheduler/fair_sharing.go``: ``parseFairWeight`` (default weight 1);
- ``pkg/workload`` ``Info`` (``Usage``, ``WorkloadUsesResources``) and the snapshot's
  ``AddWorkload`` / ``RemoveWorkload``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from bench.kueue.quota import (DEFAULT_WEIGHT, FR, Cohort, Node, ResourceQuota, add_usage, amount, available,
                               quantity, remove_usage, update_cohort_resource_node)

# Preemption policies (apis/kueue/v1beta2/clusterqueue_types.go) and queueing strategies.
NEVER, LOWER_PRIORITY, LOWER_OR_NEWER_EQUAL, ANY = "Never", "LowerPriority", "LowerOrNewerEqualPriority", "Any"
POLICIES = (NEVER, LOWER_PRIORITY, LOWER_OR_NEWER_EQUAL, ANY)
BEST_EFFORT_FIFO, STRICT_FIFO = "BestEffortFIFO", "StrictFIFO"


@dataclass
class PodSet:
    """One pod set of a Workload: ``count`` pods each requesting ``requests`` (Kueue units)."""

    count: int
    requests: dict[str, int]
    name: str = "main"


@dataclass(eq=False)
class Workload:
    """``workload.Info`` of one Job: all its pod sets are admitted together or not at all."""

    name: str
    cluster_queue: str
    pod_sets: list[PodSet]
    priority: int = 0
    created: float = 0.0
    """The queue-order timestamp (``GetQueueOrderTimestamp``: creation)."""
    uid: str = ""
    flavors: dict[str, str] | None = None
    """Once quota is reserved: resource -> flavor (``status.admission``)."""
    quota_reserved_at: float | None = None
    evicted: bool = False
    """``Evicted`` condition True (preempted; its pods still stopping, its quota still held)."""
    preempted_reason: str | None = None

    def total_requests(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for ps in self.pod_sets:
            for res, q in ps.requests.items():
                out[res] = out.get(res, 0) + q * ps.count
        return out

    def usage(self) -> dict[FR, int]:
        """``Info.Usage().Quota``: the admitted flavor per resource × the totals."""
        assert self.flavors is not None, f"{self.name} holds no quota"
        return {(self.flavors[res], res): q for res, q in self.total_requests().items()}

    def uses(self, frs: Iterable[FR]) -> bool:
        """``WorkloadUsesResources``."""
        frs = set(frs)
        return self.flavors is not None and any((self.flavors[r], r) in frs for r in self.total_requests())


class ClusterQueue(Node):
    def __init__(self, name: str, quotas: dict[FR, ResourceQuota], flavor_order: list[tuple[list[str], list[str]]],
                 *, within_cluster_queue: str = NEVER, reclaim_within_cohort: str = NEVER,
                 borrow_within_cohort: dict | None = None, fair_weight: float = DEFAULT_WEIGHT,
                 queueing_strategy: str = BEST_EFFORT_FIFO) -> None:
        super().__init__(name, quotas, fair_weight)
        self.flavor_order = flavor_order
        """Per resource group: (coveredResources, flavor names in order)."""
        self.within_cluster_queue = within_cluster_queue
        self.reclaim_within_cohort = reclaim_within_cohort
        self.borrow_within_cohort = borrow_within_cohort
        self.queueing_strategy = queueing_strategy
        self.workloads: dict[str, Workload] = {}
        """Workloads holding quota here (admitted, or evicted and still stopping)."""
        self.subtree_quota = {fr: q.nominal for fr, q in quotas.items()}

    # clusterqueue_snapshot.go
    def available(self, fr: FR) -> int:
        return max(0, available(self, fr))

    def borrowing_with(self, fr: FR, val: int) -> bool:
        quota = self.quotas.get(fr)
        return (quota.nominal if quota else 0) < self.usage.get(fr, 0) + val

    def borrowing(self, fr: FR) -> bool:
        return self.borrowing_with(fr, 0)

    def fits(self, usage: dict[FR, int]) -> bool:
        return all(self.available(fr) >= q for fr, q in usage.items())

    def add_usage(self, usage: dict[FR, int]) -> None:
        for fr, q in usage.items():
            add_usage(self, fr, q)

    def remove_usage(self, usage: dict[FR, int]) -> None:
        for fr, q in usage.items():
            remove_usage(self, fr, q)

    def borrowing_within_cohort_forbidden(self) -> tuple[bool, int | None]:
        """``IsBorrowingWithinCohortForbidden``."""
        bwc = self.borrow_within_cohort
        if not bwc or bwc.get("policy", NEVER) == NEVER:
            return True, None
        return False, bwc.get("maxPriorityThreshold")



# -- the cluster: ClusterQueues and Cohorts from their manifests ------------------------------------

def _quotas(kind: str, name: str, spec: dict) -> tuple[dict[FR, ResourceQuota], list[tuple[list[str], list[str]]]]:
    quotas: dict[FR, ResourceQuota] = {}
    order = []
    for gi, group in enumerate(spec.get("resourceGroups") or []):
        covered = list(group.get("coveredResources") or [])
        flavors = []
        for fi, flavor in enumerate(group.get("flavors") or []):
            flavors.append(flavor["name"])
            for ri, res in enumerate(flavor.get("resources") or []):
                where = f"{kind} {name} spec.resourceGroups[{gi}].flavors[{fi}].resources[{ri}]"
                rname = res.get("name")
                if covered and rname not in covered:
                    raise ValueError(f"{where}.name: {rname!r} is not in the group's coveredResources {covered}")
                try:
                    quota = ResourceQuota(
                        amount(rname, res.get("nominalQuota", 0)),
                        None if res.get("borrowingLimit") is None else amount(rname, res["borrowingLimit"]),
                        None if res.get("lendingLimit") is None else amount(rname, res["lendingLimit"]))
                except ValueError as exc:
                    raise ValueError(f"{where}: {exc}") from None
                if quota.lending_limit is not None and quota.lending_limit > quota.nominal:
                    raise ValueError(f"{where}.lendingLimit: {res['lendingLimit']!r} exceeds nominalQuota "
                                     f"{res.get('nominalQuota', 0)!r}; lower it")
                quotas[(flavor["name"], rname)] = quota
        order.append((covered or sorted({r["name"] for f in group.get("flavors") or [] for r in f.get("resources") or []}),
                      flavors))
    return quotas, order


def _weight(kind: str, name: str, spec: dict) -> float:
    """``parseFairWeight``."""
    weight = (spec.get("fairSharing") or {}).get("weight")
    if weight is None:
        return DEFAULT_WEIGHT
    try:
        return quantity(weight)
    except ValueError:
        raise ValueError(f"{kind} {name} spec.fairSharing.weight: {weight!r} is not a quantity") from None


class Cluster:
    """The cache/snapshot: every ClusterQueue and Cohort, and the Workloads holding quota."""

    def __init__(self, cluster_queues: Iterable[dict], cohorts: Iterable[dict] = (),
                 local_queues: Iterable[dict] = ()) -> None:
        self.cqs: dict[str, ClusterQueue] = {}
        self.cohorts: dict[str, Cohort] = {}
        self.local_queues: dict[tuple[str, str], str] = {}
        for manifest in cohorts:
            name = manifest["metadata"]["name"]
            spec = manifest.get("spec") or {}
            quotas, _ = _quotas("Cohort", name, spec)
            self.cohorts[name] = Cohort(name, quotas, _weight("Cohort", name, spec))
        for manifest in cohorts:
            parent = (manifest.get("spec") or {}).get("parentName")
            if parent:
                self._link(self.cohorts[manifest["metadata"]["name"]], self._cohort(parent))
        for manifest in cluster_queues:
            name = manifest["metadata"]["name"]
            spec = manifest.get("spec") or {}
            if "cohort" in spec:
                raise ValueError(f"ClusterQueue {name} spec.cohort: v1beta2 names it spec.cohortName")
            quotas, order = _quotas("ClusterQueue", name, spec)
            preemption = spec.get("preemption") or {}
            for key in ("withinClusterQueue", "reclaimWithinCohort"):
                if preemption.get(key, NEVER) not in POLICIES:
                    raise ValueError(f"ClusterQueue {name} spec.preemption.{key}: {preemption[key]!r} is not one of {POLICIES}")
            strategy = spec.get("queueingStrategy", BEST_EFFORT_FIFO)
            if strategy not in (BEST_EFFORT_FIFO, STRICT_FIFO):
                raise ValueError(f"ClusterQueue {name} spec.queueingStrategy: {strategy!r} is not "
                                 f"{BEST_EFFORT_FIFO} or {STRICT_FIFO}")
            cq = ClusterQueue(name, quotas, order, within_cluster_queue=preemption.get("withinClusterQueue", NEVER),
                              reclaim_within_cohort=preemption.get("reclaimWithinCohort", NEVER),
                              borrow_within_cohort=preemption.get("borrowWithinCohort"),
                              fair_weight=_weight("ClusterQueue", name, spec), queueing_strategy=strategy)
            self.cqs[name] = cq
            if spec.get("cohortName"):
                self._link(cq, self._cohort(spec["cohortName"]))
        for manifest in local_queues:
            meta = manifest["metadata"]
            target = (manifest.get("spec") or {}).get("clusterQueue")
            if target not in self.cqs:
                raise ValueError(f"LocalQueue {meta.get('namespace')}/{meta['name']} spec.clusterQueue: "
                                 f"{target!r} is not a ClusterQueue here")
            self.local_queues[(meta.get("namespace", "default"), meta["name"])] = target
        for root in {c.root() for c in self.cohorts.values()}:
            update_cohort_resource_node(root)

    def _cohort(self, name: str) -> Cohort:
        if name not in self.cohorts:  # a Cohort named by a ClusterQueue exists implicitly
            self.cohorts[name] = Cohort(name)
        return self.cohorts[name]

    @staticmethod
    def _link(child: Node, parent: Cohort) -> None:
        child.parent = parent
        (parent.child_cohorts if isinstance(child, Cohort) else parent.child_cqs).append(child)

    def cluster_queue_of(self, namespace: str, local_queue: str) -> str:
        """The ClusterQueue a Workload submitted to LocalQueue ``namespace/local_queue`` goes to."""
        try:
            return self.local_queues[(namespace, local_queue)]
        except KeyError:
            raise ValueError(f"no LocalQueue {namespace}/{local_queue}") from None

    # Snapshot.AddWorkload / RemoveWorkload
    def add_workload(self, wl: Workload) -> None:
        cq = self.cqs[wl.cluster_queue]
        cq.workloads[wl.name] = wl
        cq.add_usage(wl.usage())

    def remove_workload(self, wl: Workload) -> None:
        cq = self.cqs[wl.cluster_queue]
        del cq.workloads[wl.name]
        cq.remove_usage(wl.usage())

    def reserve(self, wl: Workload, flavors: dict[str, str], now: float) -> None:
        """Quota reserved (admitted): the Workload's usage counts from now on."""
        wl.flavors, wl.quota_reserved_at, wl.evicted = dict(flavors), now, False
        self.add_workload(wl)

    def release(self, wl: Workload) -> None:
        """The Workload finished, or its pods are gone after an eviction: its quota is free."""
        self.remove_workload(wl)
        wl.flavors, wl.quota_reserved_at = None, None
