"""Kueue's scheduling cycle, transcribed: the queue manager (what is pending, what is inadmissible until the
Cohort changes) and ``Scheduler.schedule`` (nominate every head, then admit or preempt in order, classically or
by the fair-sharing tournament).

Source: kubernetes-sigs/kueue tag v0.19.2 (:data:`infra.charts.KUEUE_TAG`), Apache-2.0:

- ``pkg/scheduler/scheduler.go``: ``schedule``, ``processEntry``, ``fits``,
  ``makeClassicalIterator``; ``pkg/scheduler/fair_sharing_iterator.go``: the tournament
  (``runTournament``, ``entryComparer.less``, ``computeDRS``).

Simplified, and said so where it is: the queue manager (``pkg/cache/queue``) is a
per-ClusterQueue list ordered by priority then creation (``baseCompareFunc``) where, under
``BestEffortFIFO``, a Workload found inadmissible is skipped until the cohort's usage changes
(``QueueInadmissibleWorkloads``), and under ``StrictFIFO`` it blocks its queue.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from bench.kueue.cluster import ANY, BEST_EFFORT_FIFO, Cluster, ClusterQueue, Workload
from bench.kueue.fair_sharing import DRS, compare_drs, dominant_resource_share
from bench.kueue.flavor_assigner import FIT, NO_CANDIDATES, NO_FIT, PREEMPT, RECLAIM, Assignment, assign_flavors
from bench.kueue.preemption import Preemptor, Target
from bench.kueue.quota import FR, Cohort, ResourceQuota

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
            drs = dominant_resource_share(cq, {})
            for ancestor in cq.path_parent_to_root():
                out[(ancestor.name, entry[0].name)] = drs
                drs = dominant_resource_share(ancestor, {})
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
