"""Kueue's fair sharing, transcribed: a node's dominant resource share (DRS) and how two compare.

Source: kubernetes-sigs/kueue tag v0.19.2 (:data:`infra.charts.KUEUE_TAG`), Apache-2.0:

- ``pkg/cache/scheduler/fair_sharing.go``: ``DRS``, ``CompareDRS``, ``dominantResourceShare``,
  ``calculateLendable`` (``parseFairWeight``, default weight 1: :mod:`bench.kueue.cluster`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from bench.kueue.quota import DEFAULT_WEIGHT, FR, Node, potential_available

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
