"""``ragpool status RUN`` for a queued run says what Kueue says about its lane (training/scheduler/quota_wait.py), and
how often the run was preempted (lua/release.lua ``last_preempted_at``).

Workloads, LocalQueues and ClusterQueues are dicts shaped like kueue v0.19.2's v1beta2 CRDs; the LocalQueue and
ClusterQueue fixtures are validated against the vendored schemas. The Workload CRD is not vendored
(vendor/upstream/README.md: 1.4 MB, ragpool declares no Workload): its fixtures were validated once against the
v0.19.2 CRD (config/components/crd/bases/kueue.x-k8s.io_workloads.yaml made strict by scripts/vendor_schemas.py),
and are validated here whenever ``workload_v1beta2.json`` is vendored."""

from __future__ import annotations

import time
import urllib.parse
from contextlib import contextmanager

import pytest
from tests.support.kube_api import FakeKubeApi, gpu_node
from tests.support.redis_fixtures import make_spec

from contract.lanes import Lane, lane_labels, lane_selector
from contract.names import GPU_RESOURCE, KUEUE_API_VERSION
from training.scheduler.quota_wait import (JOB_UID_LABEL, MAX_LINES, PREEMPTED_BECAUSE, cluster_queue_line,
                                           explain_lane, fetch_lane, in_cluster, workload_line)

NS = "team-a"
LANE = Lane("torchrun")
OTHER_LANE = Lane("torchrun", 2)
KUEUE = f"/apis/{KUEUE_API_VERSION}"
WAITING_MESSAGE = ("couldn't assign flavors to pod set main: insufficient unused quota for nvidia.com/gpu in flavor "
                   "gpu-spot, 1 more needed")


def job(name: str, uid: str, lane: Lane = LANE) -> dict:
    """A worker Job as KEDA creates it: the ScaledJob's labels, one per lane its worker claims."""
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": name, "namespace": NS, "uid": uid, "labels": lane_labels([lane])}}


def condition(kind: str, status: str, reason: str, message: str = "", at: str = "2026-12-04T21:30:00Z") -> dict:
    return {"type": kind, "status": status, "reason": reason, "message": message, "lastTransitionTime": at}


def workload(name: str, job_uid: str, *conditions: dict, created: str = "2026-12-04T21:00:00Z") -> dict:
    """A Workload as Kueue's job reconciler builds it for a Job (ConstructWorkload: job-uid label, the Job as its
    controller owner, one pod set ``main``)."""
    return {"apiVersion": KUEUE_API_VERSION, "kind": "Workload",
            "metadata": {"name": name, "namespace": NS, "creationTimestamp": created, "labels": {JOB_UID_LABEL: job_uid},
                         "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": name[4:-6],
                                              "uid": job_uid, "controller": True, "blockOwnerDeletion": True}]},
            "spec": {"queueName": "ragpool", "podSets": [{"name": "main", "count": 1, "template": {"spec": {
                "containers": [{"name": "worker", "resources": {"requests": {GPU_RESOURCE: "1"}}}]}}}]},
            "status": {"conditions": list(conditions)}}


def local_queue() -> dict:
    return {"apiVersion": KUEUE_API_VERSION, "kind": "LocalQueue", "metadata": {"name": "ragpool", "namespace": NS},
            "spec": {"clusterQueue": NS}}


def cluster_queue(used: int, nominal: int = 8, borrowing_limit: int | None = 0, borrowed: int = 0) -> dict:
    resource: dict = {"name": GPU_RESOURCE, "nominalQuota": nominal}
    if borrowing_limit is not None:
        resource["borrowingLimit"] = borrowing_limit
    return {"apiVersion": KUEUE_API_VERSION, "kind": "ClusterQueue", "metadata": {"name": NS},
            "spec": {"cohortName": "ragpool", "resourceGroups": [{"coveredResources": [GPU_RESOURCE],
                                                                   "flavors": [{"name": "gpu-spot",
                                                                                "resources": [resource]}]}]},
            "status": {"flavorsReservation": [{"name": "gpu-spot", "resources": [
                {"name": GPU_RESOURCE, "total": str(used), "borrowed": str(borrowed)}]}]}}


WAITING = workload("job-ragpool-worker-abcde-1a2b3", "uid-1",
                   condition("QuotaReserved", "False", "WaitingForQuota", WAITING_MESSAGE))
PREEMPTED = workload("job-ragpool-worker-fghij-4c5d6", "uid-2",
                     condition("QuotaReserved", "False", "WaitingForQuota", WAITING_MESSAGE),
                     condition("Evicted", "True", "Preempted", "Preempted to accommodate a workload (UID: x, JobUID: "
                               "y) due to reclamation within the cohort", "2026-12-04T21:31:07Z"),
                     condition("Preempted", "True", "InCohortReclamation", "Preempted to accommodate a workload",
                               "2026-12-04T21:31:07Z"), created="2026-12-04T20:00:00Z")
ADMITTED = workload("job-ragpool-worker-klmno-7e8f9", "uid-3", condition("QuotaReserved", "True", "QuotaReserved"),
                    condition("Admitted", "True", "Admitted"))
TOO_BIG = workload("job-ragpool-worker-pqrst-0a1b2", "uid-4", condition(
    "QuotaReserved", "False", "ExceedsMaxQuota", "couldn't assign flavors to pod set main: insufficient quota for "
    "nvidia.com/gpu in flavor gpu-spot, previously considered podsets requests (0) + current podset request (16) > "
    "maximum capacity (8)"))


def test_the_fixtures_are_shaped_like_the_crds():
    from tests.infra.harness import SCHEMAS_DIR, validate_custom

    validate_custom(local_queue())
    validate_custom(cluster_queue(8))
    validate_custom(cluster_queue(3, borrowing_limit=None))
    vendored = (SCHEMAS_DIR / "crds" / "kueue.x-k8s.io" / "workload_v1beta2.json").is_file()
    for wl in (WAITING, PREEMPTED, ADMITTED, TOO_BIG):
        if vendored:  # not today (vendor/upstream/README.md): checked once against the v0.19.2 CRD by hand
            validate_custom(wl)
        for c in wl["status"]["conditions"]:  # metav1.Condition's required fields, Kueue's types and reasons
            assert set(c) >= {"type", "status", "reason", "message", "lastTransitionTime"}
            assert c["type"] in {"QuotaReserved", "Admitted", "Evicted", "Preempted", "Finished"}
            assert c["reason"] in {"WaitingForQuota", "ExceedsMaxQuota", "QuotaReserved", "Admitted", "Preempted",
                                   *PREEMPTED_BECAUSE}, c


def test_each_condition_becomes_one_line():
    assert workload_line(WAITING) == (
        "Workload job-ragpool-worker-abcde-1a2b3 waits for quota: its ClusterQueue has too few unused GPUs, "
        f"borrowing included (Kueue: {WAITING_MESSAGE})")
    line = workload_line(PREEMPTED)
    assert line.endswith("; its Job was preempted at 2026-12-04 21:31:07 UTC (to give borrowed GPUs back to their "
                         "owner in the cohort)")
    assert "more than its ClusterQueue can ever reach" not in line
    assert "can ever reach" in workload_line(TOO_BIG) and "maximum capacity (8)" in workload_line(TOO_BIG)
    assert workload_line(ADMITTED) is None
    finished = workload("job-x-abcde-00000", "u", condition("Finished", "True", "Succeeded"))
    assert workload_line(finished) is None
    assert workload_line(workload("job-x-abcde-00000", "u")) is None  # no condition yet: Kueue has not looked
    reserved = workload("job-x-abcde-00000", "u", condition("QuotaReserved", "True", "QuotaReserved"))
    assert "waits for admission checks" in workload_line(reserved)


def test_the_cluster_queue_in_numbers():
    assert cluster_queue_line(cluster_queue(8)) == "ClusterQueue team-a has 8 of 8 GPUs in use and may borrow 0 more"
    assert cluster_queue_line(cluster_queue(10, borrowing_limit=4, borrowed=2)) == (
        "ClusterQueue team-a has 10 of 8 GPUs in use and may borrow 2 more")
    assert cluster_queue_line(cluster_queue(3, borrowing_limit=None)).endswith("may borrow what the cohort lends")
    assert cluster_queue_line({"metadata": {"name": "x"}, "spec": {}}) is None


def test_a_lane_is_explained_by_its_own_jobs_workloads_only():
    jobs = [job("ragpool-worker-abcde", "uid-1"), job("ragpool-worker-fghij", "uid-2"),
            job("ragpool-worker-klmno", "uid-3")]
    other = workload("job-ragpool-worker-n2-zzzzz-9z9z9", "uid-9", condition("QuotaReserved", "False",
                                                                              "WaitingForQuota", "other lane"))
    answer = explain_lane(jobs, [WAITING, other, ADMITTED, PREEMPTED], cluster_queue(8))
    assert answer.waiting == 2
    assert [x.split(" ")[1] for x in answer.lines[:2]] == ["job-ragpool-worker-fghij-4c5d6",  # the oldest first
                                                           "job-ragpool-worker-abcde-1a2b3"]
    assert answer.lines[-1] == "ClusterQueue team-a has 8 of 8 GPUs in use and may borrow 0 more"
    assert explain_lane(jobs, [ADMITTED], cluster_queue(8)).lines == []  # nothing waits: no numbers either
    many = [workload(f"job-w{i}-abcde-00000", f"u{i}", condition("QuotaReserved", "False", "WaitingForQuota", "m"))
            for i in range(MAX_LINES + 2)]
    answer = explain_lane([job(f"w{i}", f"u{i}") for i in range(MAX_LINES + 2)], many, None)
    assert answer.waiting == MAX_LINES + 2 and answer.lines[-1] == "... and 2 more Workload(s) of the lane"


@contextmanager
def lane_kube(tmp_path):
    """A fake API server in a pod of namespace team-a: one Job of lane torchrun whose Workload waits for quota (and
    one admitted), one of another lane; the LocalQueue and the full ClusterQueue. Yields (server, KubeTarget)."""
    jobs_path = f"/apis/batch/v1/namespaces/{NS}/jobs"
    with FakeKubeApi(gpu_node("unused", "gpu-spot"), tmp_path, collections={
            jobs_path: [job("ragpool-worker-abcde", "uid-1"), job("ragpool-worker-n2-zzzzz", "uid-9", OTHER_LANE)],
            f"{KUEUE}/namespaces/{NS}/workloads": [WAITING, ADMITTED]},
            objects={f"{KUEUE}/namespaces/{NS}/localqueues/ragpool": local_queue(),
                     f"{KUEUE}/clusterqueues/{NS}": cluster_queue(8)}) as api:
        (api.sa_dir / "namespace").write_text(NS + "\n")
        target = in_cluster(api.environ, str(api.sa_dir))
        assert target is not None and target.namespace == NS
        yield api, target


@pytest.fixture
def kube(tmp_path):
    with lane_kube(tmp_path) as pair:
        yield pair


def test_fetched_from_the_api_server_with_the_pods_token(kube):
    api, target = kube
    answer = fetch_lane(target.api, target.namespace, LANE)
    assert answer.error == "" and answer.waiting == 1
    assert answer.lines == [workload_line(WAITING), "ClusterQueue team-a has 8 of 8 GPUs in use and may borrow 0 more"]
    paths = [p for _, p, _, _ in api.requests]
    assert paths[0] == f"/apis/batch/v1/namespaces/{NS}/jobs?labelSelector=" + urllib.parse.quote(lane_selector(LANE),
                                                                                                    safe="")
    assert all(method == "GET" and auth == "Bearer fake-projected-token" for method, _, auth, _ in api.requests)
    before = len(api.requests)
    assert target.lane(LANE).lines == answer.lines and len(api.requests) == before + 4
    assert target.lane(LANE).lines == answer.lines and len(api.requests) == before + 4, "reused within ttl_s"
    # without the ClusterQueue (RBAC): the Workloads' lines stand alone
    api.forbidden.add(f"{KUEUE}/clusterqueues/{NS}")
    assert fetch_lane(target.api, target.namespace, LANE).lines == [workload_line(WAITING)]
    # no Job of the lane: nothing to say, and no more requests
    before = len(api.requests)
    assert fetch_lane(target.api, target.namespace, Lane("ray")).lines == []
    assert len(api.requests) == before + 1
    # every read refused: said, not raised
    api.forbid = True
    assert "403" in fetch_lane(target.api, target.namespace, LANE).error


def test_not_in_a_pod_means_no_kubernetes(tmp_path):
    assert in_cluster({}, str(tmp_path)) is None
    assert in_cluster({"KUBERNETES_SERVICE_HOST": "10.0.0.1"}, str(tmp_path)) is None  # no token volume


def test_status_of_a_queued_preempted_run_direct_and_in_cluster(make_queue, kube):
    from training.scheduler import verbs
    from training.scheduler.cli import _render_run
    from training.scheduler.queue_records import Release

    api, target = kube
    q = make_queue()
    q.submit(make_spec("borrower"))
    for _ in range(2):
        assert q.release(q.claim("w"), "interrupted by worker shutdown (SIGTERM)", kind=Release.PREEMPTED) == "released"
    info = q.get("borrower")
    assert info.preemptions == 2 and abs(info.last_preempted_at - time.time()) < 30
    direct = verbs.status(q, "borrower").data
    assert direct["preemptions"] == 2 and direct["last_preempted_at"] == info.last_preempted_at
    assert "quota" not in direct["waiting"]  # no Kubernetes API: nothing extra, no error
    text = _render_run(direct)
    when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(info.last_preempted_at))
    assert f"preempted 2 times, last at {when} (resumes from its checkpoint)" in text
    assert "kueue:" not in text
    data = verbs.status(q, "borrower", kube=target).data
    assert (data["waiting"]["on"], data["waiting"]["detail"]) == (
        "waiting for quota", "1 worker Job(s) of lane torchrun wait for Kueue to admit them (first in its lane)")
    assert data["waiting"]["quota"]["lines"][-1] == "ClusterQueue team-a has 8 of 8 GPUs in use and may borrow 0 more"
    assert "kueue: ClusterQueue team-a has 8 of 8 GPUs in use and may borrow 0 more" in _render_run(data)
    assert "kueue: Workload job-ragpool-worker-abcde-1a2b3 waits for quota" in _render_run(data)
    claim = q.claim("w")
    before = len(api.requests)
    assert "quota" not in verbs.status(q, "borrower", kube=target).data["waiting"]  # running: Kueue is not asked
    assert len(api.requests) == before and q.ack(claim)
