"""bench/kueue_gate.py without processes: Jobs become Workloads of their LocalQueue, are admitted
whole, evicted to reclaim lent quota, give their quota back once their pods are gone, and finish."""

from __future__ import annotations

import types

from bench.kueue_gate import KueueGate
from contract.names import GPU_RESOURCE, KUEUE_PRIORITY_CLASS_LABEL, KUEUE_QUEUE_LABEL


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


def job(name: str, namespace: str, pods: int = 1, labelled: bool = True, priority: str | None = None):
    """A Job as bench/autoscale_sim.py makes one: its own labels (its ScaledJob's) and a pod template."""
    labels = {KUEUE_QUEUE_LABEL: "ragpool"} if labelled else {}
    if priority is not None:
        labels[KUEUE_PRIORITY_CLASS_LABEL] = priority
    return types.SimpleNamespace(name=name, namespace=namespace, labels=labels, spec={"parallelism": pods, "template": {
        "metadata": {"labels": {}},
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


def test_the_jobs_priority_class_label_orders_admission_and_preempts_lower_priorities():
    """The WorkloadPriorityClass named by the Job's own label (a per-priority ScaledJob's, copied by KEDA) is the
    Workload's priority: a high Job preempts a normal one in its full ClusterQueue, a low one waits; a label on the
    pod template alone is not Kueue's (priority 0)."""
    from infra.kueue_objects import priority_class_name, workload_priority_classes

    gate = KueueGate([*objects(teams=("a",)), *workload_priority_classes()])
    gate.job_created(job("n0", "team-a", priority=priority_class_name("normal")), 0.0)
    gate.job_created(job("n1", "team-a", priority=priority_class_name("normal")), 0.5)
    assert gate.schedule(1.0)[0] + gate.schedule(1.5)[0] == ["n0", "n1"]
    gate.job_created(job("l0", "team-a", priority=priority_class_name("low")), 2.0)
    assert gate.schedule(2.0) == ([], [])  # lower than every admitted Workload: it waits
    gate.job_created(job("h0", "team-a", priority=priority_class_name("high")), 3.0)
    admitted, evictions = gate.schedule(3.0)
    assert admitted == [] and [(e.job, e.reason, e.by) for e in evictions] == [("n1", "InClusterQueue", "h0")]  # the newest
    gate.pods_gone(types.SimpleNamespace(name="n1"))
    assert gate.schedule(4.0)[0] == ["h0"]
    unlabelled = job("t0", "team-a")
    unlabelled.spec["template"]["metadata"]["labels"][KUEUE_PRIORITY_CLASS_LABEL] = priority_class_name("high")
    assert gate.job_created(unlabelled, 5.0).priority == 0
