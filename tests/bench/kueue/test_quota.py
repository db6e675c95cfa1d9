"""bench/kueue/quota.py: the quota tree's borrowing and lending limits (``resource_node.go``) on the stack's
shape."""

from __future__ import annotations

from bench.kueue.cluster import Cluster
from bench.kueue.quota import potential_available
from tests.support.kueue import cq, wl


def test_available_respects_borrowing_and_lending_limits():
    """Team A 4 GPUs lending at most 2, team B 4 GPUs borrowing at most 1, team C 4: B may take
    4 + min(1, A's 2 + C's 4) = 5; C may take 4 + 2 + 4 = 10."""
    g = "nvidia.com/gpu"
    cluster = Cluster([cq("a", {"on-demand": {g: ("4", "", "2")}}, cohort="pool"),
                       cq("b", {"on-demand": {g: ("4", "1")}}, cohort="pool"),
                       cq("c", {"on-demand": {g: ("4",)}}, cohort="pool")])
    fr = ("on-demand", g)
    assert [cluster.cqs[n].available(fr) for n in "abc"] == [12, 5, 10]
    assert potential_available(cluster.cqs["b"], fr) == 5
    cluster.reserve(wl("c-big", "c", flavor=None, **{g: "9"}), {g: "on-demand"}, 0.0)
    assert [cluster.cqs[n].available(fr) for n in "abc"] == [3, 1, 1]  # A keeps its 2 unlent GPUs
