"""Kueue's preemption, transcribed: which admitted Workloads to evict so that a pending one fits, classically
(within the ClusterQueue, reclaiming within the Cohort, borrowing within it) or by fair sharing.

Source: kubernetes-sigs/kueue tag v0.19.2 (:data:`infra.charts.KUEUE_TAG`), Apache-2.0:

- ``pkg/scheduler/preemption/preemption.go``: ``classicalPreemptions``, ``fillBackWorkloads``,
  ``fairPreemptions``, ``runFirstFsStrategy``, ``runSecondFsStrategy``, ``findCandidates``,
  ``cqIsBorrowing``, ``workloadFits``, ``workloadFitsForFairSharing``,
  ``queueUnderNominalInResourcesNeedingPreemption``, ``parseStrategies`` (default
  ``[LessThanOrEqualToFinalShare, LessThanInitialShare]``);
- ``pkg/scheduler/preemption/classical/candidate_generator.go`` and ``hierarchical_preemption.go``:
  the candidate iterator, ``classifyPreemptionVariant``, ``collectCandidatesForHierarchicalReclaim``
  (``FindHeightOfLowestSubtreeThatFits``: :mod:`bench.kueue.flavor_assigner`);
- ``pkg/scheduler/preemption/common/ordering.go`` ``CandidatesOrdering`` and
  ``preemption_policy.go`` ``SatisfiesPreemptionPolicy``;
- ``pkg/scheduler/preemption/fairsharing/``: ``ordering.go`` (``TargetClusterQueueOrdering``),
  ``target.go``, ``least_common_ancestor.go``, ``strategy.go``;
- ``apis/kueue/v1beta2/workload_types.go``: the preemption reasons.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

from bench.kueue.cluster import ANY, LOWER_OR_NEWER_EQUAL, LOWER_PRIORITY, NEVER, Cluster, ClusterQueue, Workload
from bench.kueue.fair_sharing import DRS, NEGATIVE_DRS, compare_drs, dominant_resource_share
from bench.kueue.quota import FR, Cohort, Node, ResourceQuota, is_within_nominal_in_resources, quantities_fit_in_quota

# Preemption reasons (apis/kueue/v1beta2/workload_types.go).
IN_CLUSTER_QUEUE = "InClusterQueue"
IN_COHORT_RECLAMATION = "InCohortReclamation"
IN_COHORT_FAIR_SHARING = "InCohortFairSharing"
IN_COHORT_RECLAIM_WHILE_BORROWING = "InCohortReclaimWhileBorrowing"


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
        return dominant_resource_share(preemptor, {}), dominant_resource_share(target, {})

    def share_after_removal(self, wl: Workload) -> DRS:
        usage = wl.usage()
        self.cq.remove_usage(usage)
        try:
            return dominant_resource_share(self._almost_lcas()[1], {})
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
            drs = dominant_resource_share(cq, {})
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
            drs = dominant_resource_share(child, {})
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
