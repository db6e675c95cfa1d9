"""bench/kueue_admission.py against cases of Kueue's own tests at the pinned tag (v0.19.2):
``pkg/scheduler/preemption/preemption_test.go`` ``TestPreemption`` (classical preemption: priority,
reclaim within the cohort, lending limits), ``pkg/scheduler/preemption/preemption_fair_test.go``
``TestFairPreemptions`` (fair sharing) and ``pkg/cache/scheduler/fair_sharing_test.go``
``TestDominantResourceShare`` (DRS values); each test names its upstream case. Then the scheduler
cycle on the stack's shape: borrowing, reclaim, all-or-nothing gangs."""

from __future__ import annotations

import pytest

from bench import kueue_admission as kq
from bench.kueue_admission import Cluster, Preemptor, Scheduler, Workload, PodSet

GI = 2**30


def cq(name: str, flavors: dict[str, dict[str, tuple]], *, cohort: str | None = None, within: str | None = None,
       reclaim: str | None = None, borrow_within: dict | None = None, weight=None) -> dict:
    """A v1beta2 ClusterQueue manifest; ``flavors``: flavor -> resource -> (nominal, borrowingLimit,
    lendingLimit) like upstream's ``MakeFlavorQuotas(...).Resource(name, qs...)`` ("" or missing: unset)."""
    resources = sorted({r for f in flavors.values() for r in f})
    group = {"coveredResources": resources, "flavors": []}
    for fname, res in flavors.items():
        entries = []
        for rname, qs in res.items():
            entry = {"name": rname, "nominalQuota": qs[0]}
            for key, value in zip(("borrowingLimit", "lendingLimit"), qs[1:]):
                if value != "":
                    entry[key] = value
            entries.append(entry)
        group["flavors"].append({"name": fname, "resources": entries})
    spec: dict = {"resourceGroups": [group]}
    if cohort:
        spec["cohortName"] = cohort
    preemption = {k: v for k, v in (("withinClusterQueue", within), ("reclaimWithinCohort", reclaim),
                                    ("borrowWithinCohort", borrow_within)) if v is not None}
    if preemption:
        spec["preemption"] = preemption
    if weight is not None:
        spec["fairSharing"] = {"weight": weight}
    return {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue", "metadata": {"name": name}, "spec": spec}


LP, ANY, NEVER = "LowerPriority", "Any", "Never"

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


def wl(name: str, cq_name: str, *, priority: int = 0, count: int = 1, flavor: str | None = "default",
       **requests) -> Workload:
    """``MakeWorkload(name).Priority(p).Request(...)``; with ``flavor`` its quota is reserved in
    that flavor (``SimpleReserveQuota``); ``requests`` as quantities (``cpu="2"``, ``memory="2Gi"``)."""
    reqs = {r: kq.amount(r, q) for r, q in requests.items()}
    return Workload(name, cq_name, [PodSet(count, reqs)], priority=priority, uid=name,
                    flavors={r: flavor for r in reqs} if flavor else None)


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


# -- TestDominantResourceShare (fair_sharing_test.go) ----------------------------------------------

GPU = "example.com/gpu"


def drs_case(cq_weight, lending_gpu: str, usage: dict[str, int], cpu: bool = True) -> tuple[int, str]:
    res = {"cpu": ("2",), GPU: ("5",)} if cpu else {GPU: ("5",)}
    lend = {"cpu": ("8",), GPU: (lending_gpu,)} if cpu else {GPU: (lending_gpu,)}
    cluster = Cluster([cq("cq", {"default": res}, cohort="test-cohort", weight=cq_weight),
                       cq("lending-cq", {"default": lend}, cohort="test-cohort", weight="1")])
    cluster.cqs["cq"].add_usage({("default", r): v for r, v in usage.items()})
    assert cluster.cqs["lending-cq"].dominant_resource_share().rounded_weighted_share() == (0, "")
    assert cluster.cohorts["test-cohort"].dominant_resource_share().rounded_weighted_share() == (0, "")
    return cluster.cqs["cq"].dominant_resource_share().rounded_weighted_share()


@pytest.mark.parametrize("case, args, want", [
    ("usage below nominal", ("1", "5", {"cpu": 1000, GPU: 2}), (0, "")),
    ("usage above nominal", ("1", "5", {"cpu": 3000, GPU: 7}), (200, GPU)),  # (7-5)*1000/10
    ("above nominal with integer weight", ("2", "5", {GPU: 7}, False), (100, GPU)),
    ("above nominal with decimal weight", ("0.5", "5", {GPU: 7}, False), (400, GPU)),
    ("above nominal with zero weight", ("0", "10", {GPU: 7}, False), (2**63 - 1, GPU)),
])
def test_dominant_resource_share(case, args, want):
    assert drs_case(*args) == want, case


def test_dominant_resource_share_affected_by_borrowing_limit():  # "resource share affected by borrowing limit"
    cohorts = [{"metadata": {"name": "child-cohort"}, "spec": {"parentName": "root", "resourceGroups": [
                   {"coveredResources": [GPU], "flavors": [{"name": "default", "resources": [
                       {"name": GPU, "nominalQuota": "0", "borrowingLimit": "10"}]}]}]}},
               {"metadata": {"name": "root"}, "spec": {"resourceGroups": [
                   {"coveredResources": [GPU], "flavors": [{"name": "default", "resources": [
                       {"name": GPU, "nominalQuota": "50"}]}]}]}}]
    cluster = Cluster([cq("cq", {"default": {GPU: ("0",)}}, cohort="child-cohort")], cohorts)
    cluster.cqs["cq"].add_usage({("default", GPU): 10})
    assert cluster.cqs["cq"].dominant_resource_share().rounded_weighted_share() == (1000, GPU)
    assert cluster.cohorts["child-cohort"].dominant_resource_share().rounded_weighted_share() == (200, GPU)
    assert cluster.cohorts["root"].dominant_resource_share().rounded_weighted_share() == (0, "")


# -- quota arithmetic: borrowing and lending limits (resource_node.go) ------------------------------

def test_available_respects_borrowing_and_lending_limits():
    """Team A 4 GPUs lending at most 2, team B 4 GPUs borrowing at most 1, team C 4: B may take
    4 + min(1, A's 2 + C's 4) = 5; C may take 4 + 2 + 4 = 10."""
    g = "nvidia.com/gpu"
    cluster = Cluster([cq("a", {"on-demand": {g: ("4", "", "2")}}, cohort="pool"),
                       cq("b", {"on-demand": {g: ("4", "1")}}, cohort="pool"),
                       cq("c", {"on-demand": {g: ("4",)}}, cohort="pool")])
    fr = ("on-demand", g)
    assert [cluster.cqs[n].available(fr) for n in "abc"] == [12, 5, 10]
    assert kq.potential_available(cluster.cqs["b"], fr) == 5
    cluster.reserve(wl("c-big", "c", flavor=None, **{g: "9"}), {g: "on-demand"}, 0.0)
    assert [cluster.cqs[n].available(fr) for n in "abc"] == [3, 1, 1]  # A keeps its 2 unlent GPUs


def test_cluster_queue_manifest_errors_name_the_field():
    with pytest.raises(ValueError, match=r"spec.cohort: v1beta2 names it spec.cohortName"):
        Cluster([{"metadata": {"name": "x"}, "spec": {"cohort": "pool"}}])
    bad = cq("x", {"default": {"cpu": ("2", "", "3")}})
    with pytest.raises(ValueError, match=r"ClusterQueue x spec.resourceGroups\[0\].flavors\[0\].resources\[0\].lendingLimit"):
        Cluster([bad])
    with pytest.raises(ValueError, match=r"spec.preemption.withinClusterQueue: 'Sometimes'"):
        Cluster([cq("x", {"default": {"cpu": ("2",)}}, within="Sometimes")])


# -- the scheduling cycle on the stack's shape --------------------------------------------------------

G = "nvidia.com/gpu"


def three_teams(fair: bool) -> Scheduler:
    cqs = [cq(n, {"on-demand": {G: ("4",)}}, cohort="pool", within=LP, reclaim=ANY) for n in ("a", "b", "c")]
    lqs = [{"metadata": {"namespace": f"team-{n}", "name": "runs"}, "spec": {"clusterQueue": n}} for n in "abc"]
    return Scheduler(Cluster(cqs, local_queues=lqs), fair_sharing=fair)


def job(name: str, team: str, pods: int = 1, gpus: int = 1, at: float = 0.0, priority: int = 0) -> Workload:
    return Workload(name, team, [PodSet(pods, {G: gpus})], priority=priority, created=at, uid=name)


@pytest.mark.parametrize("fair", [False, True])
def test_idle_team_lends_then_reclaims(fair):
    s = three_teams(fair)
    assert s.cluster.cluster_queue_of("team-b", "runs") == "b"
    for i in range(12):  # B bursts to all 12 GPUs of the cohort while A and C are idle
        s.submit(job(f"b{i:02}", "b", at=i))
    admitted = []
    for t in range(14):  # one head per ClusterQueue per cycle
        admitted += [w.name for w in s.schedule(float(t)).admitted]
    assert admitted == [f"b{i:02}" for i in range(12)]
    s.submit(job("a0", "a", gpus=4, at=20))
    r = s.schedule(20.0)
    assert r.admitted == [] and r.waiting["a0"] == "waiting for preempted workloads"
    victims = [t.workload for _, t in r.preempted]
    # The newest 4 of B's borrowed runs are evicted to give A its nominal quota.
    assert sorted(v.name for v in victims) == ["b08", "b09", "b10", "b11"]
    assert {t.reason for _, t in r.preempted} == {"InCohortReclamation"}
    assert s.schedule(21.0).admitted == []  # the victims' pods still stop: their quota is held
    for v in victims:
        s.evicted_pods_gone(v)
    assert [w.name for w in s.schedule(22.0).admitted] == ["a0"]
    assert s.cluster.cqs["a"].usage[("on-demand", G)] == 4


def test_gang_is_admitted_all_or_nothing():
    s = three_teams(False)
    s.submit(job("c-small", "c", gpus=4))
    s.submit(job("b-small", "b", gpus=3))
    s.schedule(0.0)
    s.submit(job("a-gang", "a", pods=2, gpus=4, at=1))  # needs 8 at once; 5 are free
    r = s.schedule(1.0)
    assert r.admitted == [] and "a-gang" in r.waiting
    assert s.cluster.cqs["a"].usage.get(("on-demand", G), 0) == 0  # no partial gang holds GPUs
    s.finish(s.cluster.cqs["c"].workloads["c-small"])
    assert [w.name for w in s.schedule(2.0).admitted] == ["a-gang"]


# -- TestSchedule (scheduler_test.go) ------------------------------------------------------------------

SCHEDULE_CQS = [
    cq("eng-alpha", {"on-demand": {"cpu": ("50", "50")}, "spot": {"cpu": ("100", "0")}}, cohort="eng"),
    cq("eng-beta", {"on-demand": {"cpu": ("50", "10")}, "spot": {"cpu": ("0", "100")}}, cohort="eng",
       within=LP, reclaim=ANY),
    cq("lend-a", {"default": {"cpu": ("3", "", "2")}}, cohort="lend"),
    cq("lend-b", {"default": {"cpu": ("2", "", "2")}}, cohort="lend"),
]
for _m in SCHEDULE_CQS[:2]:
    _m["spec"]["queueingStrategy"] = "StrictFIFO"


@pytest.mark.parametrize("case, beta_pods, admitted", [
    ("cannot borrow if cohort was assigned and would result in overadmission", 56, ["eng-alpha/new"]),
    ("can borrow if cohort was assigned and will not result in overadmission", 55, ["eng-alpha/new", "eng-beta/new"]),
])
def test_schedule_borrowing_in_one_cycle(case, beta_pods, admitted):
    s = Scheduler(Cluster(SCHEDULE_CQS))
    s.submit(Workload("eng-alpha/new", "eng-alpha", [PodSet(45, {"cpu": 1000})]))
    s.submit(Workload("eng-beta/new", "eng-beta", [PodSet(beta_pods, {"cpu": 1000})]))
    r = s.schedule(0.0)
    assert [w.name for w in r.admitted] == admitted, case
    assert {w.name: w.flavors for w in r.admitted}["eng-alpha/new"] == {"cpu": "on-demand"}
    if len(admitted) == 1:
        assert r.waiting["eng-beta/new"] == "no longer fits after processing another workload"


def test_schedule_workload_exceeds_lending_limit_when_borrow_in_cohort():  # TestSchedule
    s = Scheduler(Cluster(SCHEDULE_CQS))
    a = wl("lend/a", "lend-b", cpu="2")
    s.cluster.reserve(a, a.flavors, 0.0)
    s.submit(wl("lend/b", "lend-b", flavor=None, cpu="3"))
    r = s.schedule(0.0)
    assert r.admitted == []
    assert r.waiting["lend/b"] == "insufficient unused quota for cpu in flavor default, 1000 more needed"
    assert "lend/b" in s.inadmissible  # wantInadmissibleLeft


# -- TestEntryComparerLess (scheduler_test.go): the fair-sharing tournament's order ------------------

CPU_DEFAULT = ("default", "cpu")
ZERO_DRS = kq.DRS(fair_weight=0.0)
"""Go's zero ``DRS{}``."""
BORROWING_DRS = kq.DRS(borrowing=True, borrowed_frs=(CPU_DEFAULT,))
"""``BorrowingDRS(cpuDefault)``."""


@pytest.mark.parametrize("case, a_drs, b_drs, want", [
    ("non-borrowing subtree preferred over borrowing subtree", ZERO_DRS, BORROWING_DRS, True),
    ("both borrowing on requested flavors falls through to FIFO", BORROWING_DRS, BORROWING_DRS, False),
    ("lower DRS preferred over higher DRS", kq.NEGATIVE_DRS, ZERO_DRS, True),
])
def test_entry_comparer_less(case, a_drs, b_drs, want):
    a = Workload("a", "cq", [PodSet(1, {"cpu": 1})], created=1.0)  # a was created one second after b
    b = Workload("b", "cq", [PodSet(1, {"cpu": 1})], created=0.0)
    assert kq.entry_less(a, a_drs, {CPU_DEFAULT: 1}, b, b_drs, {CPU_DEFAULT: 1}) is want, case
