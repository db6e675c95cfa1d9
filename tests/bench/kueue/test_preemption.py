"""bench/kueue/preemption.py against cases of Kueue's own tests at the pinned tag (v0.19.2):
``pkg/scheduler/preemption/preemption_test.go`` ``TestPreemption`` (classical preemption: priority,
reclaim within the cohort, lending limits) and ``pkg/scheduler/preemption/preemption_fair_test.go``
``TestFairPreemptions`` (fair sharing); each test names its upstream case."""

from __future__ import annotations

import pytest

from bench.kueue.cluster import Cluster, Workload
from bench.kueue.preemption import Preemptor
from tests.support.kueue import ANY, LP, NEVER, cq, wl

# TestPreemption's defaultClusterQueues (the ones the replayed cases use).
DEFAULT_CQS = [
    {**cq("standalone", {"default": {"cpu": ("6",)}}, within=LP)},
    cq("c1", {"default": {"cpu": ("6", "6"), "memory": ("3Gi", "3Gi")}}, cohort="cohort", within=LP, reclaim=LP),
    cq("c2", {"default": {"cpu": ("6", "6"), "memory": ("3Gi", "3Gi")}}, cohort="cohort", within=NEVER, reclaim=ANY),
    cq("lend1", {"default": {"cpu": ("6", "", "4")}}, cohort="cohort-lend", within=LP, reclaim=LP),
    cq("lend2", {"default": {"cpu": ("6", "", "2")}}, cohort="cohort-lend", within=LP, reclaim=LP),
]
# standalone's second resource group: memory in flavors alpha then beta.
DEFAULT_CQS[0]["spec"]["resourceGroups"].append({"coveredResources": ["memory"], "flavors": [
    {"name": "alpha", "resources": [{"name": "memory", "nominalQuota": "3Gi"}]},
    {"name": "beta", "resources": [{"name": "memory", "nominalQuota": "3Gi"}]}]})


def targets(cluster_queues, admitted, incoming: Workload, preempt: dict[str, str], fit: dict[str, str] | None = None,
            *, fair: bool = False) -> set[tuple[str, str]]:
    """``Preemptor.GetTargets`` for ``incoming`` whose assignment puts resource -> flavor in
    ``preempt`` (mode Preempt) and ``fit`` (mode Fit): {(victim, reason)}."""
    cluster = Cluster(cluster_queues)
    for w in admitted:
        w.quota_reserved_at = 0.0
        cluster.add_workload(w)
    def usage():
        return {n: {fr: v for fr, v in c.usage.items() if v} for n, c in cluster.cqs.items()}
    before = usage()
    flavors = {**(fit or {}), **preempt}
    totals = incoming.total_requests()
    requests = {(flavors[r], r): q for r, q in totals.items()}
    got = Preemptor(cluster, fair_sharing=fair).get_targets(incoming, requests, {(f, r) for r, f in preempt.items()})
    assert usage() == before, "the snapshot was not restored"
    return {(t.workload.name, t.reason) for t in got}


IN_CQ, RECLAIM, FAIR = "InClusterQueue", "InCohortReclamation", "InCohortFairSharing"
CPU = {"cpu": "default"}



# -- TestPreemption (preemption_test.go) ----------------------------------------------------------

def standalone_three(low: str, mid: str, high: str):
    return [wl("low", "standalone", priority=-1, cpu=low), wl("mid", "standalone", cpu=mid),
            wl("high", "standalone", priority=1, cpu=high)]


@pytest.mark.parametrize("case, admitted, incoming, want", [
    ("preempt lowest priority", standalone_three("2", "2", "2"),
     wl("in", "standalone", priority=1, flavor=None, cpu="2"), {("low", IN_CQ)}),
    ("no preemption for low priority", standalone_three("3", "3", "0")[:2],
     wl("in", "standalone", priority=-1, flavor=None, cpu="1"), set()),
    ("not enough low priority workloads", standalone_three("3", "3", "0")[:2],
     wl("in", "standalone", flavor=None, cpu="4"), set()),
    ("some free quota, preempt low priority", standalone_three("1", "1", "3"),
     wl("in", "standalone", priority=1, flavor=None, cpu="2"), {("low", IN_CQ)}),
    ("minimal set excludes low priority", standalone_three("1", "2", "3"),
     wl("in", "standalone", priority=1, flavor=None, cpu="2"), {("mid", IN_CQ)}),
])
def test_preemption_within_cluster_queue(case, admitted, incoming, want):
    assert targets(DEFAULT_CQS, admitted, incoming, CPU) == want, case


def test_only_preempt_workloads_using_the_chosen_flavor():  # TestPreemption
    admitted = [wl("low", "standalone", priority=-1, flavor="alpha", memory="2Gi"),
                wl("mid", "standalone", flavor="beta", memory="1Gi"),
                wl("high", "standalone", priority=1, flavor="beta", memory="1Gi")]
    incoming = wl("in", "standalone", priority=1, flavor=None, cpu="1", memory="2Gi")
    assert targets(DEFAULT_CQS, admitted, incoming, {"memory": "beta"}, {"cpu": "default"}) == {("mid", IN_CQ)}


@pytest.mark.parametrize("case, admitted, incoming, want", [
    ("reclaim quota from borrower",
     [wl("c1-low", "c1", priority=-1, cpu="3"), wl("c2-mid", "c2", cpu="3"), wl("c2-high", "c2", priority=1, cpu="6")],
     wl("in", "c1", priority=1, flavor=None, cpu="3"), {("c2-mid", RECLAIM)}),
    ("no workloads borrowing",
     [wl("c1-high", "c1", priority=1, cpu="4"), wl("c2-low-1", "c2", priority=-1, cpu="4")],
     wl("in", "c1", priority=1, flavor=None, cpu="4"), set()),
    ("not enough workloads borrowing",
     [wl("c1-high", "c1", priority=1, cpu="4"), wl("c2-low-1", "c2", priority=-1, cpu="4"),
      wl("c2-low-2", "c2", priority=-1, cpu="4")],
     wl("in", "c1", priority=1, flavor=None, cpu="4"), set()),
    ("do not reclaim borrowed quota from same priority for withinCohort=ReclaimFromLowerPriority",
     [wl("c1", "c1", cpu="2"), wl("c2-1", "c2", cpu="4"), wl("c2-2", "c2", cpu="4")],
     wl("in", "c1", flavor=None, cpu="4"), set()),
    ("reclaim borrowed quota from same priority for withinCohort=ReclaimFromAny",
     [wl("c1-1", "c1", cpu="4"), wl("c1-2", "c1", priority=1, cpu="4"), wl("c2", "c2", cpu="2")],
     wl("in", "c2", flavor=None, cpu="4"), {("c1-1", RECLAIM)}),
    ("preempt from all ClusterQueues in cohort",
     [wl("c1-low", "c1", priority=-1, cpu="3"), wl("c1-mid", "c1", cpu="2"),
      wl("c2-low", "c2", priority=-1, cpu="3"), wl("c2-mid", "c2", cpu="4")],
     wl("in", "c1", flavor=None, cpu="4"), {("c1-low", IN_CQ), ("c2-low", RECLAIM)}),
    ("can't preempt workloads in ClusterQueue for withinClusterQueue=Never",
     [wl("c2-low", "c2", priority=-1, cpu="3")], wl("in", "c2", priority=1, flavor=None, cpu="4"), set()),
])
def test_preemption_reclaim_within_cohort(case, admitted, incoming, want):
    assert targets(DEFAULT_CQS, admitted, incoming, CPU) == want, case


@pytest.mark.parametrize("case, admitted, incoming, want", [
    ("reclaim quota from lender",
     [wl("lend1-low", "lend1", priority=-1, cpu="3"), wl("lend2-mid", "lend2", cpu="3"),
      wl("lend2-high", "lend2", priority=1, cpu="4")],
     wl("in", "lend1", priority=1, flavor=None, cpu="3"), {("lend2-mid", RECLAIM)}),
    ("preempt from all ClusterQueues in cohort-lend",
     [wl("lend1-low", "lend1", priority=-1, cpu="3"), wl("lend1-mid", "lend1", cpu="2"),
      wl("lend2-low", "lend2", priority=-1, cpu="3"), wl("lend2-mid", "lend2", cpu="4")],
     wl("in", "lend1", flavor=None, cpu="4"), {("lend1-low", IN_CQ), ("lend2-low", RECLAIM)}),
    ("cannot preempt from other ClusterQueues if exceeds requestable quota including lending limit",
     [wl("lend2-low", "lend2", priority=-1, cpu="10")], wl("in", "lend1", flavor=None, cpu="9"), set()),
])
def test_preemption_with_lending_limits(case, admitted, incoming, want):
    assert targets(DEFAULT_CQS, admitted, incoming, CPU) == want, case


# -- TestFairPreemptions (preemption_fair_test.go) -------------------------------------------------

BWC = {"policy": "LowerPriority", "maxPriorityThreshold": -3}
FAIR_CQS = [cq(n, {"default": {"cpu": ("3",)}}, cohort="all", within=LP, reclaim=ANY, borrow_within=BWC)
            for n in "abc"] + [cq("preemptible", {"default": {"cpu": ("0",)}}, cohort="all")]


def units(cq_name: str, n: int, start: int = 1, **kw) -> list[Workload]:
    return [wl(f"{cq_name}{i}", cq_name, cpu="1", **kw) for i in range(start, start + n)]


@pytest.mark.parametrize("case, admitted, incoming, want", [
    ("reclaim nominal from user using the most", units("a", 3) + units("b", 5) + units("c", 1),
     wl("c_incoming", "c", flavor=None, cpu="1"), {("b1", RECLAIM)}),
    ("reclaim borrowable quota from user using the most", units("a", 3) + units("b", 5) + units("c", 1),
     wl("a_incoming", "a", flavor=None, cpu="1"), {("b1", FAIR)}),
    ("preempt one from each CQ borrowing",
     [wl("a1", "a", cpu="0.5"), wl("a2", "a", cpu="0.5"), wl("a3", "a", cpu="3"),
      wl("b1", "b", cpu="0.5"), wl("b2", "b", cpu="0.5"), wl("b3", "b", cpu="3")],
     wl("c_incoming", "c", flavor=None, cpu="2"), {("a1", RECLAIM), ("b1", RECLAIM)}),
    ("can't preempt when everyone under nominal", units("a", 3) + units("b", 3) + units("c", 3),
     wl("c_incoming", "c", flavor=None, cpu="1"), set()),
    ("can't preempt when it would switch the imbalance", units("a", 3) + units("b", 5),
     wl("a_incoming", "a", flavor=None, cpu="2"), set()),
    ("can preempt lower priority workloads from same CQ",
     [wl("a1_low", "a", priority=-1, cpu="1"), wl("a2_low", "a", priority=-1, cpu="1")]
     + units("a", 2, start=3) + units("b", 5),
     wl("a_incoming", "a", flavor=None, cpu="2"), {("a1_low", IN_CQ), ("a2_low", IN_CQ)}),
    ("can preempt a combination of same CQ and highest user",
     [wl("a_low", "a", priority=-1, cpu="1")] + units("a", 2, start=2) + units("b", 6),
     wl("a_incoming", "a", flavor=None, cpu="2"), {("a_low", IN_CQ), ("b1", FAIR)}),
])
def test_fair_preemptions(case, admitted, incoming, want):
    assert targets(FAIR_CQS, admitted, incoming, CPU, fair=True) == want, case


def test_cq_with_higher_weight_can_preempt_more():  # TestFairPreemptions
    cqs = [cq("a", {"default": {"cpu": ("3",)}}, cohort="all", within=LP, reclaim=ANY, weight="2")]
    cqs += [cq(n, {"default": {"cpu": ("3",)}}, cohort="all", within=LP, reclaim=ANY) for n in "bc"]
    got = targets(cqs, units("a", 3) + units("b", 6), wl("a_incoming", "a", flavor=None, cpu="2"), CPU, fair=True)
    assert got == {("b1", FAIR), ("b2", FAIR)}
