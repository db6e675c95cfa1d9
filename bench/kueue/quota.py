"""Kueue's quota arithmetic, transcribed: Kubernetes quantities in Kueue's units and the resource tree of
ClusterQueues and Cohorts (what each node may use, lend and borrow).

Source: kubernetes-sigs/kueue tag v0.19.2 (commit 8eab68778fc1b52affe165fdf5af29d1e9b4f3cb, 2026-08-20,
the newest release mirrored here), Apache-2.0:

- ``pkg/cache/scheduler/resource_node.go``: ``localQuota``, ``LocalAvailable``, ``available``,
  ``potentialAvailable``, ``addUsage``, ``removeUsage``, ``updateCohortResourceNode``,
  ``accumulateFromChild``, ``QuantitiesFitInQuota``, ``IsWithinNominalInResources``.

Quantities are integers in Kueue's units (``resources.ResourceValue``: milli-units for ``cpu``).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Iterable, Iterator


FR = tuple[str, str]
"""``resources.FlavorResource``: (flavor, resource)."""

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


class Cohort(Node):
    def __init__(self, name: str, quotas: dict[FR, ResourceQuota] | None = None, fair_weight: float = DEFAULT_WEIGHT):
        super().__init__(name, quotas or {}, fair_weight)
        self.child_cohorts: list[Cohort] = []
        self.child_cqs: list[Node] = []
        """Its ClusterQueues (:class:`bench.kueue.cluster.ClusterQueue`)."""

    def root(self) -> "Cohort":
        node = self
        while node.parent is not None:
            node = node.parent
        return node

    def subtree_cluster_queues(self) -> list[Node]:
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
