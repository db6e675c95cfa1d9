"""Kueue's quota arithmetic and admission cycle, transcribed (no Kubernetes, no torch).

Source: kubernetes-sigs/kueue tag v0.19.2 (commit 8eab68778fc1b52affe165fdf5af29d1e9b4f3cb, 2026-08-20,
the newest release mirrored here), Apache-2.0. Transcribed for what the stack uses: ClusterQueues in
a Cohort tree, ``nominalQuota`` / ``borrowingLimit`` / ``lendingLimit`` per flavor and resource, a
Workload's pod sets admitted all at once (all-or-nothing: ``count`` × the per-pod requests), preemption
(``withinClusterQueue``, ``reclaimWithinCohort``, ``borrowWithinCohort``) and fair sharing (weights,
the dominant resource share, DRS):

- ``pkg/cache/scheduler/resource_node.go``: ``localQuota``, ``LocalAvailable``, ``available``,
  ``potentialAvailable``, ``addUsage``, ``removeUsage``, ``updateCohortResourceNode``,
  ``accumulateFromChild``, ``QuantitiesFitInQuota``, ``IsWithinNominalInResources``;
- ``pkg/cache/scheduler/fair_sharing.go``: ``DRS``, ``CompareDRS``, ``dominantResourceShare``,
  ``calculateLendable``, ``parseFairWeight`` (default weight 1);
- ``pkg/cache/scheduler/clusterqueue_snapshot.go``: ``Available``, ``Borrowing``, ``BorrowingWith``,
  ``Fits``, ``SimulateUsageAddition`` / ``SimulateUsageRemoval``;
- ``pkg/scheduler/preemption/preemption.go``: ``classicalPreemptions``, ``fillBackWorkloads``,
  ``fairPreemptions``, ``runFirstFsStrategy``, ``runSecondFsStrategy``, ``findCandidates``,
  ``cqIsBorrowing``, ``workloadFits``, ``workloadFitsForFairSharing``,
  ``queueUnderNominalInResourcesNeedingPreemption``, ``parseStrategies`` (default
  ``[LessThanOrEqualToFinalShare, LessThanInitialShare]``);
- ``pkg/scheduler/preemption/classical/candidate_generator.go`` and ``hierarchical_preemption.go``:
  the candidate iterator, ``classifyPreemptionVariant``, ``collectCandidatesForHierarchicalReclaim``,
  ``FindHeightOfLowestSubtreeThatFits``;
- ``pkg/scheduler/preemption/common/ordering.go`` ``CandidatesOrdering`` and
  ``preemption_policy.go`` ``SatisfiesPreemptionPolicy``;
- ``pkg/scheduler/preemption/fairsharing/``: ``ordering.go`` (``TargetClusterQueueOrdering``),
  ``target.go``, ``least_common_ancestor.go``, ``strategy.go``;
- ``pkg/scheduler/preemption/preemption_oracle.go`` ``SimulatePreemption`` and
  ``pkg/scheduler/flavorassigner/flavorassigner.go`` ``fitsResourceQuota``, ``isPreferred``;
- ``pkg/scheduler/scheduler.go``: ``schedule``, ``processEntry``, ``fits``,
  ``makeClassicalIterator``; ``pkg/scheduler/fair_sharing_iterator.go``: the tournament
  (``runTournament``, ``entryComparer.less``, ``computeDRS``).

Feature gates at their v0.19.2 defaults (``pkg/features/kube_features.go``): PrioritySortingWithinCohort,
FairSharingPreemptWithinNominal and FairSharingPrioritizeNonBorrowing on, PrioritizePreemptorWorkloads off;
Topology-Aware Scheduling, admission checks, partial admission, AdmissionFairSharing and elastic
workload slices are not transcribed (the stack uses none of them).

Simplified, and said so where it is: the flavor scan (``getInitialAssignments``) keeps the
v1beta2 defaults (``whenCanBorrow: MayStopSearch``, ``whenCanPreempt: TryNextFlavor``, no preference)
and one flavor per resource group for all pod sets; the queue manager (``pkg/cache/queue``) is a
per-ClusterQueue list ordered by priority then creation (``baseCompareFunc``) where, under
``BestEffortFIFO``, a Workload found inadmissible is skipped until the cohort's usage changes
(``QueueInadmissibleWorkloads``), and under ``StrictFIFO`` it blocks its queue. Quantities are
integers in Kueue's units (``resources.ResourceValue``: milli-units for ``cpu``).

The unit tests (tests/bench/test_kueue_admission.py) replay cases of Kueue's own tests at the same tag.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Sequence

KUEUE_TAG = "v0.19.2"
"""The Kueue release transcribed."""
KUEUE_COMMIT = "8eab68778fc1b52affe165fdf5af29d1e9b4f3cb"
"""The commit of :data:`KUEUE_TAG`."""

FR = tuple[str, str]
"""``resources.FlavorResource``: (flavor, resource)."""

# Preemption policies (apis/kueue/v1beta2/clusterqueue_types.go) and reasons (workload_types.go).
NEVER, LOWER_PRIORITY, LOWER_OR_NEWER_EQUAL, ANY = "Never", "LowerPriority", "LowerOrNewerEqualPriority", "Any"
POLICIES = (NEVER, LOWER_PRIORITY, LOWER_OR_NEWER_EQUAL, ANY)
IN_CLUSTER_QUEUE = "InClusterQueue"
IN_COHORT_RECLAMATION = "InCohortReclamation"
IN_COHORT_FAIR_SHARING = "InCohortFairSharing"
IN_COHORT_RECLAIM_WHILE_BORROWING = "InCohortReclaimWhileBorrowing"
BEST_EFFORT_FIFO, STRICT_FIFO = "BestEffortFIFO", "StrictFIFO"
DEFAULT_WEIGHT = 1.0
"""``fair_sharing.go`` ``defaultWeight``."""

# -- quantities ----------------------------------------------------------------------------------

_SUFFIX = {"": 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18,
           "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}


def quantity(value: Any) -> float:
    """A Kubernetes quantity (``8``, ``500m``, ``2Gi``, ``0.5``) as a number."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    m = re.fullmatch(r"\s*([+-]?[0-9]*\.?[0-9]+)(m|[kMGTPE]i?|)\s*", str(value))
    if not m or m.group(2) == "ki":
        raise ValueError(f"{value!r} is not a Kubernetes quantity (e.g. 8, 500m, 2Gi)")
    return float(m.group(1)) * (0.001 if m.group(2) == "m" else _SUFFIX[m.group(2)])


def amount(resource: str, value: Any) -> int:
    """``resources.ResourceValue`` of a Kubernetes quantity: milli-units for ``cpu``, units otherwise
    (rounded up, as ``Quantity.Value()`` does)."""
    value = quantity(value)
    return math.ceil(round(value * 1000, 6)) if resource == "cpu" else math.ceil(round(value, 9))


# -- the resource tree (pkg/cache/scheduler) -----------------------------------------------------

@dataclass(frozen=True)
class ResourceQuota:
    """``ResourceQuota``: one flavor/resource's quotas (None: unlimited)."""

    nominal: int
    borrowing_limit: int | None = None
    lending_limit: int | None = None


class Node:
    """``resourceNode`` plus the hierarchy: a ClusterQueue or a Cohort."""

    def __init__(self, name: str, quotas: dict[FR, ResourceQuota], fair_weight: float) -> None:
        self.name = name
        self.quotas = quotas
        self.subtree_quota: dict[FR, int] = {}
        self.usage: dict[FR, int] = {}
        self.parent: Cohort | None = None
        self.fair_weight = fair_weight

    def has_parent(self) -> bool:
        return self.parent is not None

    def path_parent_to_root(self) -> Iterator["Cohort"]:
        node = self.parent
        while node is not None:
            yield node
            node = node.parent

    def local_quota(self, fr: FR) -> int:
        """``resourceNode.localQuota``: capacity never lent to the parent."""
        quota = self.quotas.get(fr)
        if quota is not None and quota.lending_limit is not None:
            return max(0, self.subtree_quota.get(fr, 0) - quota.lending_limit)
        return 0

    def dominant_resource_share(self) -> "DRS":
        return dominant_resource_share(self, {})


class Cohort(Node):
    def __init__(self, name: str, quotas: dict[FR, ResourceQuota] | None = None, fair_weight: float = DEFAULT_WEIGHT):
        super().__init__(name, quotas or {}, fair_weight)
        self.child_cohorts: list[Cohort] = []
        self.child_cqs: list[ClusterQueue] = []

    def root(self) -> "Cohort":
        node = self
        while node.parent is not None:
            node = node.parent
        return node

    def subtree_cluster_queues(self) -> list["ClusterQueue"]:
        out = list(self.child_cqs)
        for child in self.child_cohorts:
            out.extend(child.subtree_cluster_queues())
        return out

    def child_count(self) -> int:
        return len(self.child_cohorts) + len(self.child_cqs)


def local_available(node: Node, fr: FR) -> int:
    """``LocalAvailable``."""
    return max(0, node.local_quota(fr) - node.usage.get(fr, 0))


def available(node: Node, fr: FR) -> float:
    """``available``: what remains for ``node`` (may be negative on overadmission; ``inf`` unlimited)."""
    if node.parent is None:
        return node.subtree_quota.get(fr, 0) - node.usage.get(fr, 0)
    parent_available = available(node.parent, fr)
    quota = node.quotas.get(fr)
    if quota is not None and quota.borrowing_limit is not None:
        lq = node.local_quota(fr)
        stored_in_parent = node.subtree_quota.get(fr, 0) - lq
        used_in_parent = max(0, node.usage.get(fr, 0) - lq)
        parent_available = min(stored_in_parent - used_in_parent + quota.borrowing_limit, parent_available)
    return local_available(node, fr) + parent_available


def potential_available(node: Node, fr: FR) -> int:
    """``potentialAvailable``: the most ``node`` could get with no usage, within borrowing limits."""
    if node.parent is None:
        return node.subtree_quota.get(fr, 0)
    avail = node.local_quota(fr) + potential_available(node.parent, fr)
    quota = node.quotas.get(fr)
    if quota is not None and quota.borrowing_limit is not None:
        avail = min(node.subtree_quota.get(fr, 0) + quota.borrowing_limit, avail)
    return avail


def add_usage(node: Node, fr: FR, val: int) -> None:
    """``addUsage``: usage past the local quota bubbles up to the Cohort."""
    local = local_available(node, fr)
    node.usage[fr] = node.usage.get(fr, 0) + val
    if node.parent is not None and val > local:
        add_usage(node.parent, fr, val - local)


def remove_usage(node: Node, fr: FR, val: int) -> None:
    """``removeUsage``."""
    stored_in_parent = node.usage.get(fr, 0) - node.local_quota(fr)
    node.usage[fr] = node.usage.get(fr, 0) - val
    if stored_in_parent <= 0 or node.parent is None:
        return
    remove_usage(node.parent, fr, min(val, stored_in_parent))


def update_cohort_resource_node(cohort: Cohort) -> None:
    """``updateCohortResourceNode`` (from the root): SubtreeQuota and Usage of the tree."""
    cohort.subtree_quota = {fr: q.nominal for fr, q in cohort.quotas.items()}
    cohort.usage = {}
    for child in cohort.child_cohorts:
        update_cohort_resource_node(child)
        _accumulate_from_child(cohort, child)
    for cq in cohort.child_cqs:
        cq.subtree_quota = {fr: q.nominal for fr, q in cq.quotas.items()}  # updateClusterQueueResourceNode
        _accumulate_from_child(cohort, cq)


def _accumulate_from_child(parent: Cohort, child: Node) -> None:
    for fr, child_quota in child.subtree_quota.items():
        parent.subtree_quota[fr] = parent.subtree_quota.get(fr, 0) + child_quota - child.local_quota(fr)
    for fr, child_usage in child.usage.items():
        parent.usage[fr] = parent.usage.get(fr, 0) + max(0, child_usage - child.local_quota(fr))


def quantities_fit_in_quota(node: Node, requests: dict[FR, int]) -> tuple[bool, dict[FR, int]]:
    """``QuantitiesFitInQuota``: (fits in the node's subtree quota, what exceeds its local quota)."""
    fits = True
    remaining = {}
    for fr, v in requests.items():
        if node.subtree_quota.get(fr, 0) < node.usage.get(fr, 0) + v:
            fits = False
        remaining[fr] = max(0, v - local_available(node, fr))
    return fits, remaining


def is_within_nominal_in_resources(node: Node, frs: Iterable[FR]) -> bool:
    """``IsWithinNominalInResources``."""
    return all(node.subtree_quota.get(fr, 0) >= node.usage.get(fr, 0) for fr in frs)


# -- fair sharing (fair_sharing.go) --------------------------------------------------------------

@dataclass(frozen=True)
class DRS:
    """``DRS``: a node's dominant resource share."""

    fair_weight: float = DEFAULT_WEIGHT
    unweighted_ratio: float = 0.0
    dominant_resource: str = ""
    borrowing: bool = False
    borrowed_frs: tuple[FR, ...] = ()

    def is_zero(self) -> bool:
        return self.unweighted_ratio == 0

    def is_borrowing_on(self, requested: dict[FR, int]) -> bool:
        return any(requested.get(fr, 0) > 0 for fr in self.borrowed_frs)

    def precise_weighted_share(self) -> float:
        if self.is_zero():
            return 0.0
        if self.fair_weight == 0:
            return math.inf
        return self.unweighted_ratio / self.fair_weight

    def zero_weight_borrows(self) -> bool:
        return self.fair_weight == 0 and not self.is_zero()

    def rounded_weighted_share(self) -> tuple[int, str]:
        """``roundedWeightedShare`` (``math.MaxInt64`` for a zero weight that borrows)."""
        if self.zero_weight_borrows():
            return 2**63 - 1, self.dominant_resource
        return math.ceil(self.precise_weighted_share()), self.dominant_resource


NEGATIVE_DRS = DRS(unweighted_ratio=-1)
"""``NegativeDRS``."""


def _cmp(a, b) -> int:
    return (a > b) - (a < b)


def compare_drs(a: DRS, b: DRS) -> int:
    """``CompareDRS``: lower is preferred for scheduling, higher for preemption."""
    if a.zero_weight_borrows() and b.zero_weight_borrows():
        return _cmp(a.unweighted_ratio, b.unweighted_ratio)
    if a.zero_weight_borrows():
        return 1
    if b.zero_weight_borrows():
        return -1
    return _cmp(a.precise_weighted_share(), b.precise_weighted_share())


def dominant_resource_share(node: Node, wl_req: dict[FR, int]) -> DRS:
    """``dominantResourceShare``: the largest (usage above quota) / (lendable in the cohort) × 1000."""
    if node.parent is None:
        return DRS(fair_weight=node.fair_weight)
    borrowed_frs = []
    borrowing: dict[str, int] = {}
    for fr, quota in node.subtree_quota.items():
        borrowed = wl_req.get(fr, 0) + node.usage.get(fr, 0) - quota
        if borrowed > 0:
            borrowing[fr[1]] = borrowing.get(fr[1], 0) + borrowed
            borrowed_frs.append(fr)
    if not borrowing:
        return DRS(fair_weight=node.fair_weight)
    ratio, dominant = 0.0, ""
    lendable = calculate_lendable(node.parent)
    for name, b in borrowing.items():
        lr = lendable.get(name, 0)
        if lr > 0:
            r = b * 1000.0 / lr
            if r > ratio or (r == ratio and name < dominant):
                ratio, dominant = r, name
    return DRS(node.fair_weight, ratio, dominant, True, tuple(borrowed_frs))


def calculate_lendable(node: Node) -> dict[str, int]:
    """``calculateLendable``: per resource, the node's potential available over the root's flavors."""
    root = node
    while root.parent is not None:
        root = root.parent
    lendable: dict[str, int] = {}
    for fr in root.subtree_quota:
        lendable[fr[1]] = lendable.get(fr[1], 0) + potential_available(node, fr)
    return lendable


# -- objects ---------------------------------------------------------------------------------------

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


# -- preemption ------------------------------------------------------------------------------------

def satisfies_preemption_policy(preemptor: Workload, candidate: Workload, policy: str) -> bool:
    """``SatisfiesPreemptionPolicy`` (the timestamp buffer gate off)."""
    lower = preemptor.priority > candidate.priority
    if policy == LOWER_PRIORITY:
        return lower
    if policy == LOWER_OR_NEWER_EQUAL:
        return lower or (preemptor.priority == candidate.priority and preemptor.created < candidate.created)
    return policy == ANY


def candidates_ordering_key(cq_name: str, now: float) -> Callable[[Workload], tuple]:
    """``CandidatesOrdering`` as a sort key: evicted first, other ClusterQueues first, lower
    priority first, most recently admitted first, then UID."""
    def key(w: Workload) -> tuple:
        reserved = w.quota_reserved_at if w.quota_reserved_at is not None else now
        return (not w.evicted, w.cluster_queue == cq_name, w.priority, -reserved, w.uid or w.name)
    return key


@dataclass
class Target:
    workload: Workload
    reason: str


# classical/hierarchical_preemption.go preemptionVariant
_NEVER_V, _WITHIN_CQ, _HIERARCHICAL, _RECLAIM_WITHOUT_BORROWING, _RECLAIM_WHILE_BORROWING = range(5)
_REASON = {_WITHIN_CQ: IN_CLUSTER_QUEUE, _HIERARCHICAL: IN_COHORT_RECLAMATION,
           _RECLAIM_WHILE_BORROWING: IN_COHORT_RECLAIM_WHILE_BORROWING, _RECLAIM_WITHOUT_BORROWING: IN_COHORT_RECLAMATION}


class Preemptor:
    """``Preemptor``: which admitted Workloads to evict so that ``wl`` fits."""

    def __init__(self, cluster: Cluster, *, fair_sharing: bool = False, now: float = 0.0) -> None:
        self.cluster = cluster
        self.fair_sharing = fair_sharing
        self.now = now

    def get_targets(self, wl: Workload, requests: dict[FR, int], frs_need_preemption: set[FR]) -> list[Target]:
        """``getTargets``: ``requests`` is the assignment's usage of ``wl``."""
        cq = self.cluster.cqs[wl.cluster_queue]
        if self.fair_sharing:
            return self._fair_preemptions(wl, cq, requests, frs_need_preemption)
        return self._classical_preemptions(wl, cq, requests, frs_need_preemption)

    # preemption.go workloadFits
    @staticmethod
    def _workload_fits(cq: ClusterQueue, requests: dict[FR, int], allow_borrowing: bool) -> bool:
        for fr, v in requests.items():
            if not allow_borrowing and cq.borrowing_with(fr, v):
                return False
            if v > cq.available(fr):
                return False
        return True

    def _fill_back(self, cq: ClusterQueue, requests: dict[FR, int], targets: list[Target], allow_borrowing: bool) -> list[Target]:
        """``fillBackWorkloads``: in reverse order, add back each target the Workload fits without."""
        i = len(targets) - 2
        while i >= 0:
            self.cluster.add_workload(targets[i].workload)
            if self._workload_fits(cq, requests, allow_borrowing):
                targets[i] = targets[-1]  # O(1) deletion, as upstream
                targets.pop()
            else:
                self.cluster.remove_workload(targets[i].workload)
            i -= 1
        return targets

    def _restore(self, targets: list[Target]) -> None:
        for t in targets:
            self.cluster.add_workload(t.workload)

    # -- classical (candidate_generator.go, hierarchical_preemption.go) --------------------------

    def _classify(self, wl: Workload, cq: ClusterQueue, cand: Workload, frs: set[FR], advantage: bool) -> int:
        if not cand.uses(frs):
            return _NEVER_V
        policy = cq.within_cluster_queue if cand.cluster_queue == cq.name else cq.reclaim_within_cohort
        if not satisfies_preemption_policy(wl, cand, policy):
            return _NEVER_V
        if cand.cluster_queue == cq.name:
            return _WITHIN_CQ
        if advantage:
            return _HIERARCHICAL
        forbidden, threshold = cq.borrowing_within_cohort_forbidden()
        if forbidden:
            return _RECLAIM_WITHOUT_BORROWING
        if cand.priority >= wl.priority or (threshold is not None and cand.priority > threshold):
            return _RECLAIM_WITHOUT_BORROWING  # isAboveBorrowingThreshold
        return _RECLAIM_WHILE_BORROWING

    def _from_cq(self, wl, cq, source: ClusterQueue, lca, frs, advantage) -> list[tuple[Workload, Any, int]]:
        out = []
        for cand in source.workloads.values():
            variant = self._classify(wl, cq, cand, frs, advantage)
            if variant != _NEVER_V:
                out.append((cand, lca, variant))
        return out

    def _collect_in_subtree(self, wl, cq, current: Cohort, subtree_root: Cohort, skip, frs, advantage, result) -> None:
        for child in current.child_cohorts:
            if child is skip or is_within_nominal_in_resources(child, frs):
                continue
            self._collect_in_subtree(wl, cq, child, subtree_root, skip, frs, advantage, result)
        for child_cq in current.child_cqs:
            if child_cq is cq:
                continue
            if not is_within_nominal_in_resources(child_cq, frs):
                result.extend(self._from_cq(wl, cq, child_cq, subtree_root, frs, advantage))

    def _candidate_list(self, wl: Workload, cq: ClusterQueue, requests: dict[FR, int], frs: set[FR]):
        """``NewCandidateIterator``: (ordered candidates, NoCandidateFromOtherQueues,
        NoCandidateForHierarchicalReclaim)."""
        same = [] if cq.within_cluster_queue == NEVER else self._from_cq(wl, cq, cq, None, frs, False)
        hierarchy: list = []
        priority: list = []
        if cq.parent is not None and cq.reclaim_within_cohort != NEVER:
            previous = None
            advantage, remaining = quantities_fit_in_quota(cq, requests)
            for subtree_root in cq.path_parent_to_root():
                self._collect_in_subtree(wl, cq, subtree_root, subtree_root, previous, frs, advantage,
                                         hierarchy if advantage else priority)
                fits, remaining = quantities_fit_in_quota(subtree_root, remaining)
                advantage = advantage or fits
                previous = subtree_root
        key = candidates_ordering_key(cq.name, self.now)
        ordered = []
        lists = [sorted(x, key=lambda c: key(c[0])) for x in (hierarchy, priority, same)]
        for evicted in (True, False):  # splitEvicted: every list's evicted prefix first
            for lst in lists:
                ordered.extend(c for c in lst if c[0].evicted is evicted)
        return ordered, not hierarchy and not priority, not hierarchy

    def _candidate_valid(self, cq: ClusterQueue, cand, borrow: bool, frs: set[FR]) -> bool:
        """``candidateIsValid``."""
        wl, lca, variant = cand
        if wl.cluster_queue == cq.name:
            return True
        if borrow and variant == _RECLAIM_WITHOUT_BORROWING:
            return False
        ccq = self.cluster.cqs[wl.cluster_queue]
        if is_within_nominal_in_resources(ccq, frs):
            return False
        for node in ccq.path_parent_to_root():
            if node is lca:
                break
            if is_within_nominal_in_resources(node, frs):
                return False
        return True

    def _classical_preemptions(self, wl: Workload, cq: ClusterQueue, requests: dict[FR, int], frs: set[FR]) -> list[Target]:
        """``classicalPreemptions``: remove candidates in order until the Workload fits, then add back
        what it does not need."""
        candidates, none_from_others, none_hierarchical = self._candidate_list(wl, cq, requests, frs)
        forbidden, _ = cq.borrowing_within_cohort_forbidden()
        under_nominal = all(cq.quotas.get(fr, ResourceQuota(0)).nominal > cq.usage.get(fr, 0) for fr in frs)
        if none_from_others or (forbidden and not under_nominal):
            attempts = [True]
        elif forbidden and none_hierarchical:
            attempts = [False, True]
        else:
            attempts = [True, False]
        for borrow in attempts:
            targets: list[Target] = []
            for cand in candidates:
                if not self._candidate_valid(cq, cand, borrow, frs):
                    continue
                self.cluster.remove_workload(cand[0])
                targets.append(Target(cand[0], _REASON[cand[2]]))
                if self._workload_fits(cq, requests, borrow):
                    targets = self._fill_back(cq, requests, targets, borrow)
                    self._restore(targets)
                    return targets
            self._restore(targets)
        return []

    # -- fair sharing (preemption.go fairPreemptions, fairsharing/) ------------------------------

    def _find_candidates(self, wl: Workload, cq: ClusterQueue, frs: set[FR]) -> list[Workload]:
        """``findCandidates``."""
        out = []
        if cq.within_cluster_queue != NEVER:
            out += [c for c in cq.workloads.values()
                    if satisfies_preemption_policy(wl, c, cq.within_cluster_queue) and c.uses(frs)]
        if cq.parent is not None and cq.reclaim_within_cohort != NEVER:
            for other in cq.parent.root().subtree_cluster_queues():
                if other is cq or not any(other.borrowing(fr) for fr in frs):  # cqIsBorrowing
                    continue
                out += [c for c in other.workloads.values()
                        if satisfies_preemption_policy(wl, c, cq.reclaim_within_cohort) and c.uses(frs)]
        return out

    def _fits_fs(self, cq: ClusterQueue, requests: dict[FR, int]) -> bool:
        """``workloadFitsForFairSharing``."""
        cq.remove_usage(requests)
        try:
            return self._workload_fits(cq, requests, True)
        finally:
            cq.add_usage(requests)

    def _fair_preemptions(self, wl: Workload, cq: ClusterQueue, requests: dict[FR, int], frs: set[FR]) -> list[Target]:
        candidates = self._find_candidates(wl, cq, frs)
        if not candidates:
            return []
        candidates.sort(key=candidates_ordering_key(cq.name, self.now))
        cq.add_usage(requests)  # DRS values include the incoming Workload
        fits, targets, retry = self._first_fs_strategy(cq, requests, candidates, frs)
        if not fits:
            fits, targets = self._second_fs_strategy(cq, requests, retry, targets)
        cq.remove_usage(requests)
        if not fits:
            self._restore(targets)
            return []
        targets = self._fill_back(cq, requests, targets, True)
        self._restore(targets)
        return targets

    def _first_fs_strategy(self, cq, requests, candidates, frs):
        """``runFirstFsStrategy`` with ``LessThanOrEqualToFinalShare`` (rule S2-a)."""
        ordering = _TargetOrdering(self, cq, candidates)
        targets: list[Target] = []
        retry: list[Workload] = []
        # queueWithinNominalInResourcesNeedingPreemption (FairSharingPreemptWithinNominal).
        within_nominal = not any(cq.borrowing(fr) for fr in frs)
        for target in ordering:
            if target.cq is cq:
                cand = target.pop()
                self.cluster.remove_workload(cand)
                targets.append(Target(cand, IN_CLUSTER_QUEUE))
                if self._fits_fs(cq, requests):
                    return True, targets, []
                continue
            if within_nominal:
                cand = target.pop()
                self.cluster.remove_workload(cand)
                targets.append(Target(cand, IN_COHORT_RECLAMATION))
                if self._fits_fs(cq, requests):
                    return True, targets, []
                continue
            preemptor_new, target_old = target.compute_shares()
            if math.isinf(preemptor_new.precise_weighted_share()) and not math.isinf(target_old.precise_weighted_share()):
                while target.has_workload():  # fsStrategyUnsatisfiable
                    retry.append(target.pop())
                continue
            while target.has_workload():
                cand = target.pop()
                target_new = target.share_after_removal(cand)
                if compare_drs(preemptor_new, target_new) <= 0:  # LessThanOrEqualToFinalShare
                    self.cluster.remove_workload(cand)
                    targets.append(Target(cand, IN_COHORT_FAIR_SHARING))
                    if self._fits_fs(cq, requests):
                        return True, targets, []
                    break
                retry.append(cand)
        return False, targets, retry

    def _second_fs_strategy(self, cq, requests, retry, targets):
        """``runSecondFsStrategy``: ``LessThanInitialShare`` (rule S2-b), one Workload per ClusterQueue."""
        ordering = _TargetOrdering(self, cq, retry)
        for target in ordering:
            preemptor_new, target_old = target.compute_shares()
            cand = target.pop()
            if compare_drs(preemptor_new, target_old) < 0:
                self.cluster.remove_workload(cand)
                targets.append(Target(cand, IN_COHORT_FAIR_SHARING))
                if self._fits_fs(cq, requests):
                    return True, targets
            ordering.drop(target.cq)
        return False, targets


class _Target:
    """``TargetClusterQueue``."""

    def __init__(self, ordering: "_TargetOrdering", cq: ClusterQueue) -> None:
        self.ordering, self.cq = ordering, cq

    def pop(self) -> Workload:
        return self.ordering.by_cq[self.cq.name].pop(0)

    def has_workload(self) -> bool:
        return bool(self.ordering.by_cq.get(self.cq.name))

    def _almost_lcas(self) -> tuple[Node, Node]:
        """``getAlmostLCAs`` (least_common_ancestor.go)."""
        ancestors = self.ordering.preemptor_ancestors
        lca = next(a for a in self.cq.path_parent_to_root() if a in ancestors)

        def almost(cq: ClusterQueue) -> Node:
            node: Node = cq
            for ancestor in cq.path_parent_to_root():
                if ancestor is lca:
                    return node
                node = ancestor
            raise AssertionError("no almost-LCA")
        return almost(self.ordering.preemptor_cq), almost(self.cq)

    def compute_shares(self) -> tuple[DRS, DRS]:
        preemptor, target = self._almost_lcas()
        return preemptor.dominant_resource_share(), target.dominant_resource_share()

    def share_after_removal(self, wl: Workload) -> DRS:
        usage = wl.usage()
        self.cq.remove_usage(usage)
        try:
            return self._almost_lcas()[1].dominant_resource_share()
        finally:
            self.cq.add_usage(usage)


class _TargetOrdering:
    """``TargetClusterQueueOrdering``: the ClusterQueue to take the next victim from, walking from
    the root to the child with the highest DRS that still has candidates."""

    def __init__(self, preemptor: Preemptor, cq: ClusterQueue, candidates: Sequence[Workload]) -> None:
        self.preemptor = preemptor
        self.preemptor_cq = cq
        self.preemptor_ancestors = set(cq.path_parent_to_root())
        self.by_cq: dict[str, list[Workload]] = {}
        for c in candidates:
            self.by_cq.setdefault(c.cluster_queue, []).append(c)
        self.pruned_cqs: set[str] = set()
        self.pruned_cohorts: set[str] = set()

    def drop(self, cq: ClusterQueue) -> None:
        self.pruned_cqs.add(cq.name)

    def __iter__(self) -> Iterator[_Target]:
        cq = self.preemptor_cq
        if cq.parent is None:
            target = _Target(self, cq)
            while cq.name not in self.pruned_cqs and target.has_workload():
                yield target
            return
        root = cq.parent.root()
        while root.name not in self.pruned_cohorts:
            target = self._next(root)
            if target is not None:
                yield target

    def _next(self, cohort: Cohort) -> _Target | None:
        key = candidates_ordering_key(self.preemptor_cq.name, self.preemptor.now)
        highest_cq, highest_cq_drs = None, NEGATIVE_DRS
        for cq in cohort.child_cqs:
            if cq.name in self.pruned_cqs:
                continue
            drs = cq.dominant_resource_share()
            if (not drs.borrowing and cq is not self.preemptor_cq) or not self.by_cq.get(cq.name):
                self.pruned_cqs.add(cq.name)
            elif highest_cq is not None and compare_drs(drs, highest_cq_drs) == 0:
                if key(self.by_cq[cq.name][0]) < key(self.by_cq[highest_cq.name][0]):
                    highest_cq = cq
            elif compare_drs(drs, highest_cq_drs) == 1:
                highest_cq, highest_cq_drs = cq, drs
        highest_cohort, highest_cohort_drs = None, NEGATIVE_DRS
        for child in cohort.child_cohorts:
            if child.name in self.pruned_cohorts:
                continue
            drs = child.dominant_resource_share()
            if not drs.borrowing and child not in self.preemptor_ancestors:
                self.pruned_cohorts.add(child.name)
            elif compare_drs(drs, highest_cohort_drs) >= 0:
                highest_cohort, highest_cohort_drs = child, drs
        if highest_cohort is None and highest_cq is None:
            self.pruned_cohorts.add(cohort.name)
            return None
        if compare_drs(highest_cohort_drs, highest_cq_drs) >= 0:
            return self._next(highest_cohort)
        return _Target(self, highest_cq)


# -- flavor assignment (flavorassigner.go) ---------------------------------------------------------

NO_FIT, NO_CANDIDATES, PREEMPT, RECLAIM, FIT = range(5)
"""``preemptionMode`` (worst to best)."""


def _node_height(node: Cohort) -> int:
    """``getNodeHeight``."""
    height = min(node.child_count(), 1)
    for child in node.child_cohorts:
        height = max(height, _node_height(child) + 1)
    return height


def lowest_subtree_that_fits(cq: ClusterQueue, fr: FR, val: int) -> tuple[int, bool]:
    """``FindHeightOfLowestSubtreeThatFits``: (borrowing level, may reclaim in the hierarchy)."""
    if not cq.borrowing_with(fr, val) or cq.parent is None:
        return 0, cq.parent is not None
    remaining = val - local_available(cq, fr)
    for node in cq.path_parent_to_root():
        if not (node.subtree_quota.get(fr, 0) < node.usage.get(fr, 0) + remaining):  # Cohort BorrowingWith
            return _node_height(node), node.parent is not None
        remaining -= local_available(node, fr)
    return _node_height(cq.parent.root()), False


@dataclass
class Assignment:
    """``flavorassigner.Assignment`` reduced to one flavor per resource."""

    flavors: dict[str, str]
    mode: int
    borrow: int
    usage: dict[FR, int]
    preempt_frs: set[FR]
    message: str = ""

    def representative_mode(self) -> int:
        return self.mode


def assign_flavors(cluster: Cluster, wl: Workload, *, fair_sharing: bool = False, now: float = 0.0) -> Assignment:
    """The flavor scan for ``wl``'s whole request (every pod set together: all-or-nothing)."""
    cq = cluster.cqs[wl.cluster_queue]
    totals = wl.total_requests()
    flavors: dict[str, str] = {}
    mode, borrow, preempt_frs, messages = FIT, 0, set(), []
    for covered, group_flavors in cq.flavor_order:
        wanted = [r for r in covered if r in totals]
        if not wanted:
            continue
        best: tuple[int, int, str] | None = None
        for flavor in group_flavors:
            f_mode, f_borrow = FIT, 0
            for res in wanted:
                m, b, msg = _fits_resource_quota(cluster, cq, wl, (flavor, res), totals[res], fair_sharing, now)
                if msg:
                    messages.append(msg)
                f_mode, f_borrow = min(f_mode, m), max(f_borrow, b)
            if best is None or _is_preferred((f_mode, f_borrow), best[:2]):
                best = (f_mode, f_borrow, flavor)
            if f_mode == FIT:  # whenCanBorrow: MayStopSearch stops at the first flavor that fits
                break
        assert best is not None
        f_mode, f_borrow, flavor = best
        for res in wanted:
            flavors[res] = flavor
            if PREEMPT <= f_mode < FIT or f_mode == NO_CANDIDATES:
                preempt_frs.add((flavor, res))
        mode, borrow = min(mode, f_mode), max(borrow, f_borrow)
    missing = [r for r in totals if r not in flavors]
    if missing:
        return Assignment({}, NO_FIT, 0, {}, set(), f"resource {missing[0]} unavailable in ClusterQueue {cq.name}")
    usage = {(flavors[r], r): q for r, q in totals.items()}
    return Assignment(flavors, mode, borrow, usage, preempt_frs, "; ".join(messages))


def _is_preferred(a: tuple[int, int], b: tuple[int, int]) -> bool:
    """``isPreferred`` without a fungibility preference (borrowing over preemption)."""
    if a[0] == NO_FIT:
        return False
    if b[0] == NO_FIT:
        return True
    if (a[0] == NO_CANDIDATES) != (b[0] == NO_CANDIDATES):
        return a[0] != NO_CANDIDATES
    if a[0] != b[0]:
        return a[0] > b[0]
    return a[1] < b[1]


def _fits_resource_quota(cluster: Cluster, cq: ClusterQueue, wl: Workload, fr: FR, val: int,
                         fair_sharing: bool, now: float) -> tuple[int, int, str]:
    """``fitsResourceQuota``: (mode, borrowing level, why not)."""
    avail = cq.available(fr)
    if val > potential_available(cq, fr):
        return NO_FIT, 0, (f"insufficient quota for {fr[1]} in flavor {fr[0]}, request ({val}) > maximum "
                           f"capacity ({potential_available(cq, fr)})")
    borrow, may_reclaim = lowest_subtree_that_fits(cq, fr, val)
    if val <= avail:
        return FIT, borrow, ""
    msg = f"insufficient unused quota for {fr[1]} in flavor {fr[0]}, {val - avail} more needed"
    can_preempt_while_borrowing = (cq.borrow_within_cohort or {}).get("policy", NEVER) != NEVER or (
        fair_sharing and cq.reclaim_within_cohort != NEVER)
    quota = cq.quotas.get(fr, ResourceQuota(0))
    if quota.nominal >= val or may_reclaim or can_preempt_while_borrowing:
        # preemption_oracle.go SimulatePreemption
        targets = Preemptor(cluster, fair_sharing=fair_sharing, now=now).get_targets(wl, {fr: val}, {fr})
        if not targets:
            return NO_CANDIDATES, lowest_subtree_that_fits(cq, fr, val)[0], msg
        for t in targets:
            cluster.remove_workload(t.workload)
        borrow_after = lowest_subtree_that_fits(cq, fr, val)[0]
        for t in targets:
            cluster.add_workload(t.workload)
        mode = PREEMPT if any(t.workload.cluster_queue == cq.name for t in targets) else RECLAIM
        return mode, borrow_after, msg
    return NO_FIT, borrow, msg


# -- the scheduler (scheduler.go) -------------------------------------------------------------------

def _quota_to_reserve(cq: ClusterQueue, assignment: Assignment) -> dict[FR, int]:
    """``quotaResourcesToReserve`` of a Preempt entry without candidates."""
    out = {}
    for fr, usage in assignment.usage.items():
        quota = cq.quotas.get(fr, ResourceQuota(0))
        if assignment.borrow > 0:
            out[fr] = usage if quota.borrowing_limit is None else max(0, min(
                usage, quota.nominal + quota.borrowing_limit - cq.usage.get(fr, 0)))
        else:
            out[fr] = max(0, min(usage, quota.nominal - cq.usage.get(fr, 0)))
    return out


@dataclass
class CycleResult:
    admitted: list[Workload] = field(default_factory=list)
    preempted: list[tuple[Workload, Target]] = field(default_factory=list)
    """(preemptor, target) for each eviction issued this cycle."""
    waiting: dict[str, str] = field(default_factory=dict)
    """Workload name -> why it was not admitted this cycle."""


class Scheduler:
    """The queue manager and ``Scheduler.schedule`` over a :class:`Cluster`."""

    def __init__(self, cluster: Cluster, *, fair_sharing: bool = False) -> None:
        self.cluster = cluster
        self.fair_sharing = fair_sharing
        self.pending: dict[str, list[Workload]] = {name: [] for name in cluster.cqs}
        self.inadmissible: set[str] = set()

    def submit(self, wl: Workload) -> None:
        if wl.cluster_queue not in self.cluster.cqs:
            raise ValueError(f"Workload {wl.name}: no ClusterQueue {wl.cluster_queue!r}")
        self.pending[wl.cluster_queue].append(wl)

    def _queue_changed(self, cq_name: str) -> None:
        """``QueueInadmissibleWorkloads`` for the ClusterQueue's cohort tree."""
        cq = self.cluster.cqs[cq_name]
        names = ({c.name for c in cq.parent.root().subtree_cluster_queues()} if cq.parent else {cq_name})
        self.inadmissible = {w for w in self.inadmissible if self._cq_of_pending(w) not in names}

    def _cq_of_pending(self, name: str) -> str | None:
        for cq, wls in self.pending.items():
            if any(w.name == name for w in wls):
                return cq
        return None

    def finish(self, wl: Workload) -> None:
        """The Workload's Job finished: its quota is released."""
        self.cluster.release(wl)
        self._queue_changed(wl.cluster_queue)

    def evicted_pods_gone(self, wl: Workload) -> None:
        """An evicted Workload's pods are gone: its quota is released and it is queued again."""
        self.cluster.release(wl)
        wl.evicted = False
        self.pending[wl.cluster_queue].append(wl)
        self._queue_changed(wl.cluster_queue)

    def heads(self) -> list[Workload]:
        """``Heads``: per ClusterQueue, its first Workload by priority then creation; under
        BestEffortFIFO the first one not found inadmissible since the cohort last changed."""
        out = []
        for name, wls in self.pending.items():
            ordered = sorted(wls, key=lambda w: (-w.priority, w.created, w.name))
            if self.cluster.cqs[name].queueing_strategy == BEST_EFFORT_FIFO:
                ordered = [w for w in ordered if w.name not in self.inadmissible]
            if ordered:
                out.append(ordered[0])
        return out

    def schedule(self, now: float) -> CycleResult:
        """One scheduling cycle: nominate every head, then admit or preempt in order."""
        result = CycleResult()
        heads = self.heads()
        if not heads:
            return result
        entries = []
        for wl in heads:
            assignment = assign_flavors(self.cluster, wl, fair_sharing=self.fair_sharing, now=now)
            targets: list[Target] = []
            if assignment.mode in (PREEMPT, RECLAIM, NO_CANDIDATES):
                requests = assignment.usage
                targets = Preemptor(self.cluster, fair_sharing=self.fair_sharing, now=now).get_targets(
                    wl, requests, assignment.preempt_frs)
            entries.append((wl, assignment, targets))
        reserved: list[tuple[ClusterQueue, dict[FR, int]]] = []
        preempted: dict[int, Workload] = {}
        for wl, assignment, targets in self._iterate(entries):
            cq = self.cluster.cqs[wl.cluster_queue]
            mode = assignment.mode
            if mode == NO_FIT:
                result.waiting[wl.name] = assignment.message or "no fit"
                self.inadmissible.add(wl.name)
                continue
            if mode != FIT and not targets:
                result.waiting[wl.name] = f"no preemption candidates: {assignment.message}"
                self.inadmissible.add(wl.name)
                if cq.reclaim_within_cohort != ANY:  # reserveCapacityForUnreclaimablePreempt
                    usage = _quota_to_reserve(cq, assignment)
                    cq.add_usage(usage)
                    reserved.append((cq, usage))
                continue
            if any(id(t.workload) in preempted for t in targets):
                result.waiting[wl.name] = "overlapping preemption targets with another workload"
                continue
            # fits(): with this cycle's preemption targets and this entry's removed (MergeWithTargets).
            merged = {**preempted, **{id(t.workload): t.workload for t in targets}}
            live = [w for w in merged.values() if w.name in self.cluster.cqs[w.cluster_queue].workloads]
            for w in live:
                self.cluster.remove_workload(w)
            fits = cq.fits(assignment.usage)
            for w in live:
                self.cluster.add_workload(w)
            if not fits:
                result.waiting[wl.name] = "no longer fits after processing another workload"
                continue
            preempted.update((id(t.workload), t.workload) for t in targets)
            if mode != FIT:
                cq.add_usage(assignment.usage)
                reserved.append((cq, assignment.usage))
                for t in targets:
                    if not t.workload.evicted:
                        t.workload.evicted, t.workload.preempted_reason = True, t.reason
                        result.preempted.append((wl, t))
                result.waiting[wl.name] = "waiting for preempted workloads"
                continue
            self.pending[wl.cluster_queue].remove(wl)
            self.cluster.reserve(wl, assignment.flavors, now)
            result.admitted.append(wl)
        for cq, usage in reserved:
            cq.remove_usage(usage)
        return result

    def _iterate(self, entries):
        if not self.fair_sharing:
            # makeClassicalIterator: fewer borrowing levels, higher priority, then FIFO.
            yield from sorted(entries, key=lambda e: (e[1].borrow, -e[0].priority, e[0].created))
            return
        remaining = {e[0].cluster_queue: e for e in entries}
        while remaining:
            cq = self.cluster.cqs[next(iter(remaining))]
            if cq.parent is None:
                yield remaining.pop(cq.name)
                continue
            root = cq.parent.root()
            drs = self._compute_drs(root, remaining)
            winner = self._tournament(root, remaining, drs)
            if winner is None:  # the rest are in other cohort trees
                other = next(n for n in remaining if self.cluster.cqs[n].parent is None
                             or self.cluster.cqs[n].parent.root() is not root)
                yield remaining.pop(other)
                continue
            yield remaining.pop(winner[0].cluster_queue)

    def _compute_drs(self, root: Cohort, remaining) -> dict[tuple[str, str], DRS]:
        """``entryComparer.computeDRS``."""
        out = {}
        for cq in root.subtree_cluster_queues():
            entry = remaining.get(cq.name)
            if entry is None:
                continue
            usage = entry[1].usage
            cq.add_usage(usage)
            drs = cq.dominant_resource_share()
            for ancestor in cq.path_parent_to_root():
                out[(ancestor.name, entry[0].name)] = drs
                drs = ancestor.dominant_resource_share()
            cq.remove_usage(usage)
        return out

    def _tournament(self, cohort: Cohort, remaining, drs):
        """``runTournament`` with ``entryComparer.less``."""
        candidates = [c for c in (self._tournament(child, remaining, drs) for child in cohort.child_cohorts) if c]
        candidates += [remaining[cq.name] for cq in cohort.child_cqs if cq.name in remaining]
        if not candidates:
            return None

        def less(a, b) -> bool:
            return entry_less(a[0], drs[(cohort.name, a[0].name)], a[1].usage,
                              b[0], drs[(cohort.name, b[0].name)], b[1].usage)

        best = candidates[0]
        for current in candidates[1:]:
            if less(current, best):
                best = current
        return best


def entry_less(a: Workload, a_drs: DRS, a_requested: dict[FR, int],
               b: Workload, b_drs: DRS, b_requested: dict[FR, int]) -> bool:
    """``entryComparer.less``: not borrowing on its requested flavors first
    (FairSharingPrioritizeNonBorrowing), then the lower DRS, the higher priority, FIFO."""
    a_borrows, b_borrows = a_drs.is_borrowing_on(a_requested), b_drs.is_borrowing_on(b_requested)
    if a_borrows != b_borrows:
        return not a_borrows
    c = compare_drs(a_drs, b_drs)
    if c != 0:
        return c == -1
    if a.priority != b.priority:
        return a.priority > b.priority
    return a.created < b.created
