"""bench/kueue/scheduler.py: the scheduling cycle on the stack's shape (borrowing, reclaim, all-or-nothing
gangs), then cases of Kueue's own ``pkg/scheduler/scheduler_test.go`` at the pinned tag (v0.19.2):
``TestSchedule`` and ``TestEntryComparerLess``; each test names its upstream case."""

from __future__ import annotations

import pytest

from bench.kueue.cluster import Cluster, PodSet, Workload
from bench.kueue.fair_sharing import DRS, NEGATIVE_DRS
from bench.kueue.scheduler import Scheduler, entry_less
from tests.support.kueue import ANY, LP, cq, wl

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
ZERO_DRS = DRS(fair_weight=0.0)
"""Go's zero ``DRS{}``."""
BORROWING_DRS = DRS(borrowing=True, borrowed_frs=(CPU_DEFAULT,))
"""``BorrowingDRS(cpuDefault)``."""


@pytest.mark.parametrize("case, a_drs, b_drs, want", [
    ("non-borrowing subtree preferred over borrowing subtree", ZERO_DRS, BORROWING_DRS, True),
    ("both borrowing on requested flavors falls through to FIFO", BORROWING_DRS, BORROWING_DRS, False),
    ("lower DRS preferred over higher DRS", NEGATIVE_DRS, ZERO_DRS, True),
])
def test_entry_comparer_less(case, a_drs, b_drs, want):
    a = Workload("a", "cq", [PodSet(1, {"cpu": 1})], created=1.0)  # a was created one second after b
    b = Workload("b", "cq", [PodSet(1, {"cpu": 1})], created=0.0)
    assert entry_less(a, a_drs, {CPU_DEFAULT: 1}, b, b_drs, {CPU_DEFAULT: 1}) is want, case
