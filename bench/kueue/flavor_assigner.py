"""Kueue's flavor assignment, transcribed: the flavor scan that picks, per resource group, the flavor a
Workload's whole request fits in (or may fit in by preempting), and how far up the Cohort tree it borrows.

Source: kubernetes-sigs/kueue tag v0.19.2 (:data:`infra.charts.KUEUE_TAG`), Apache-2.0:

- ``pkg/scheduler/flavorassigner/flavorassigner.go`` ``fitsResourceQuota``, ``isPreferred``;
- ``pkg/scheduler/preemption/preemption_oracle.go`` ``SimulatePreemption``;
- ``pkg/scheduler/preemption/classical/hierarchical_preemption.go`` ``FindHeightOfLowestSubtreeThatFits``.

Simplified, and said so where it is: the flavor scan (``getInitialAssignments``) keeps the
v1beta2 defaults (``whenCanBorrow: MayStopSearch``, ``whenCanPreempt: TryNextFlavor``, no preference)
and one flavor per resource group for all pod sets.
"""

from __future__ import annotations

from dataclasses import dataclass

from bench.kueue.cluster import NEVER, Cluster, ClusterQueue, Workload
from bench.kueue.preemption import Preemptor
from bench.kueue.quota import FR, Cohort, ResourceQuota, local_available, potential_available

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
