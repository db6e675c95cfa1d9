"""bench/kueue_gate.py without processes: Jobs become Workloads of their LocalQueue, are admitted
whole, evicted to reclaim lent quota, give their quota back once their pods are gone, and finish."""

from __future__ import annotations

import types

from bench.kueue_gate import KueueGate
from contract.names import GPU_RESOURCE, KUEUE_QUEUE_LABEL


def objects(teams=("a", "b"), gpus: int = 2) -> list[dict]:
    out: list[dict] = [{"kind": "Cohort", "metadata": {"name": "pool"}, "spec": {}}]
    for t in teams:
        out.append({"kind": "ClusterQueue", "metadata": {"name": f"team-{t}"}, "spec": {
            "cohortName": "pool", "preemption": {"reclaimWithinCohort": "Any", "withinClusterQueue": "LowerPriority"},
            "resourceGroups": [{"coveredResources": [GPU_RESOURCE], "flavors": [
                {"name": "gpu-spot", "resources": [{"name": GPU_RESOURCE, "nominalQuota": gpus}]}]}]}})
        out.append({"kind": "LocalQueue", "metadata": {"name": "ragpool", "namespace": f"team-{t}"},
                    "spec": {"clusterQueue": f"team-{t}"}})
    return out


def job(name: str, namespace: str, pods: int = 1, labelled: bool = True):
    labels = {KUEUE_QUEUE_LABEL: "ragpool"} if labelled else {}
    return types.SimpleNamespace(name=name, namespace=namespace, spec={"parallelism": pods, "template": {
        "metadata": {"labels": labels},
        "spec": {"containers": [{"resources": {"requests": {GPU_RESOURCE: 1}}}]}}})


def test_borrow_reclaim_and_hand_back():
    gate = KueueGate(objects())
    assert gate.gpus_reachable("team-b", "gpu-spot") == 4 and gate.nominal_gpus("team-b", "gpu-spot") == 2
    b_jobs = [job(f"b{i}", "team-b") for i in range(4)]
    for i, j in enumerate(b_jobs):
        gate.job_created(j, float(i))
    admitted = []
    for t in range(5):
        admitted += gate.schedule(float(t))[0]
    assert admitted == ["b0", "b1", "b2", "b3"]  # team a is idle: b borrows its 2 GPUs
    gate.job_created(job("a0", "team-a", pods=2, labelled=False), 10.0)  # the namespace's LocalQueue
    admitted, evictions = gate.schedule(10.0)
    assert admitted == [] and sorted(e.job for e in evictions) == ["b2", "b3"]
    assert {e.reason for e in evictions} == {"InCohortReclamation"} and {e.by for e in evictions} == {"a0"}
    assert gate.schedule(11.0) == ([], [])  # the victims' pods still stop
    for name in ("b2", "b3"):
        gate.pods_gone(types.SimpleNamespace(name=name))
    assert gate.schedule(12.0)[0] == ["a0"]  # both pods of the 2-pod Job at once
    gate.job_finished(types.SimpleNamespace(name="b0"))
    assert gate.schedule(13.0)[0] == ["b2"]  # an evicted Job is queued again and readmitted
    gate.job_finished(types.SimpleNamespace(name="b3"))  # finished while queued: it leaves the queue
    assert all(w.name != "b3" for w in gate.scheduler.pending["team-b"])
