"""Why a queued run's lane waits for Kueue: its Workloads' conditions as one line each (torch-free, stdlib only).

A queued run has no Job of its own: KEDA starts the Jobs of its lane's ScaledJob, each for whichever run of the
lane its worker claims (docs/DESIGN.md, "One Job, one run"). So the answer is per lane. The lane's Jobs carry
``lane.ragpool.io/<lane>=true`` (``contract.lanes.lane_selector``; KEDA copies the ScaledJob's labels onto each
Job); Kueue gives each Job one Workload whose controller ownerReference (and label ``kueue.x-k8s.io/job-uid``)
names the Job (kubernetes-sigs/kueue v0.19.2 pkg/controller/jobframework/reconciler.go ``ConstructWorkload``).
Kueue copies no other label onto a Workload unless configured (``labelKeysToCopy``), so the Jobs are listed first.

What a condition means (v0.19.2 apis/kueue/v1beta2/workload_types.go):

- ``QuotaReserved=False`` with reason ``WaitingForQuota`` (the ClusterQueue, borrowing included, has too few unused
  GPUs now), ``ExceedsMaxQuota`` (more than it can ever reach), ``NoMatchingFlavor``, ...: its ``message`` is the
  flavor assigner's (pkg/scheduler/flavorassigner/flavorassigner.go ``fitsResourceQuota``: "couldn't assign
  flavors to pod set main: insufficient unused quota for nvidia.com/gpu in flavor gpu-spot, 2 more needed").
- ``Evicted=True`` with reason ``Preempted``, and the ``Preempted`` condition's reason: ``InClusterQueue``,
  ``InCohortReclamation``, ``InCohortFairSharing``, ``InCohortReclaimWhileBorrowing``; its lastTransitionTime is
  when.
- ``QuotaReserved=True`` without ``Admitted=True``: admission checks pending; ``Admitted`` or ``Finished``: not
  waiting for quota.

The ClusterQueue (named by the LocalQueue the Workload names, ``spec.queueName``) gives the numbers: its GPUs in
use (``status.flavorsReservation``), nominal quota and borrowing limit per flavor (``spec.resourceGroups``).

In the cluster the run API asks the API server with its pod's service-account token
(``training.scheduler.worker.node_fence.KubeApi``), in the namespace of the run's queue (its own, or a
trainingTeams team's: :meth:`KubeTarget.in_namespace`); what it may read is infra/run_api.py's Roles (list Jobs and
Workloads, get the LocalQueue, in its namespace and each team's) and ClusterRole (get those namespaces'
ClusterQueues). Never raises
for the API server's answers: a refusal or no answer becomes ``QuotaWait.error``.
"""

from __future__ import annotations

import os
import threading
import time
import urllib.error
import urllib.parse
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from contract.lanes import Lane, lane_selector
from contract.names import GPU_RESOURCE, KUEUE_API_VERSION
from contract.paths import SERVICE_ACCOUNT_DIR

QUOTA_RESERVED = "QuotaReserved"
ADMITTED = "Admitted"
FINISHED = "Finished"
EVICTED = "Evicted"
PREEMPTED = "Preempted"
"""Condition types (workload_types.go ``WorkloadQuotaReserved``, ...); ``Preempted`` is also the Evicted reason
(``WorkloadEvictedByPreemption``)."""
PREEMPTED_BECAUSE = {
    "InClusterQueue": "by a higher-priority workload of its own ClusterQueue",
    "InCohortReclamation": "to give borrowed GPUs back to their owner in the cohort",
    "InCohortFairSharing": "by fair sharing in the cohort",
    "InCohortReclaimWhileBorrowing": "to give GPUs back to a queue of the cohort (which was borrowing itself)",
}
"""The Preempted condition's reasons (workload_types.go ``InClusterQueueReason``, ...)."""
WAITING_BECAUSE = {
    "WaitingForQuota": "its ClusterQueue has too few unused GPUs, borrowing included",
    "ExceedsMaxQuota": "it asks more GPUs than its ClusterQueue can ever reach (nominal + borrowing limit)",
    "NoMatchingFlavor": "no ResourceFlavor of its ClusterQueue matches it",
    "WaitingForPreemptedWorkloads": "preempted workloads are still stopping to make room for it",
    "Misconfigured": "its ClusterQueue is misconfigured",
    "Suspended": "its queue is stopped",
    "Inadmissible": "its LocalQueue or ClusterQueue is missing or inactive",
}
"""QuotaReserved=False reasons (workload_types.go ``WorkloadQuotaReservedReason*``, ``WorkloadInadmissible``)."""
JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"
"""The label Kueue puts on a Job's Workload: the Job's uid (v0.19.2 pkg/controller/constants/constants.go
``JobUIDLabel``)."""
CACHE_S = 5.0
"""How long the run API reuses what it read about one lane (KEDA polls every 10 s; Kueue's answer changes no faster
for a person)."""
MAX_LINES = 3
"""Most Workload lines per lane (the oldest first)."""


def _condition(wl: dict, kind: str) -> dict | None:
    return next((c for c in (wl.get("status") or {}).get("conditions") or [] if c.get("type") == kind), None)


def _true(wl: dict, kind: str) -> bool:
    return (_condition(wl, kind) or {}).get("status") == "True"


def _when(timestamp: str | None) -> str:
    """A Kubernetes time (RFC 3339, UTC ``Z``) as ``YYYY-MM-DD HH:MM:SS UTC``; the text itself if unparsable."""
    if not timestamp:
        return "an unknown time"
    try:
        t = datetime.fromisoformat(timestamp.replace("Z", "+00:00"))
    except ValueError:
        return timestamp
    return t.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def preemption_line(wl: dict) -> str | None:
    """``preempted at T (why)`` when Kueue evicted the Workload by preemption, else None."""
    evicted = _condition(wl, EVICTED)
    if not evicted or evicted.get("status") != "True" or evicted.get("reason") != PREEMPTED:
        return None
    why = PREEMPTED_BECAUSE.get((_condition(wl, PREEMPTED) or {}).get("reason", ""), "by Kueue")
    return f"its Job was preempted at {_when(evicted.get('lastTransitionTime'))} ({why})"


def workload_line(wl: dict) -> str | None:
    """One line for a person on what a Workload waits for; None when it does not wait for Kueue (admitted,
    finished, or no condition yet)."""
    if _true(wl, FINISHED) or _true(wl, ADMITTED):
        return None
    name = (wl.get("metadata") or {}).get("name", "?")
    preempted = preemption_line(wl)
    reserved = _condition(wl, QUOTA_RESERVED)
    if reserved and reserved.get("status") == "True":
        line = f"Workload {name} has quota reserved and waits for admission checks"
    elif reserved and reserved.get("status") == "False":
        reason = reserved.get("reason", "")
        why = WAITING_BECAUSE.get(reason, reason or "not admitted yet")
        message = " ".join(str(reserved.get("message", "")).split())[:300]
        line = f"Workload {name} waits for quota: {why}" + (f" (Kueue: {message})" if message else "")
    elif preempted:
        line = f"Workload {name} is being requeued"
    else:
        return None
    return f"{line}; {preempted}" if preempted else line


def _count(quantity: Any) -> int | None:
    """A GPU quantity (an integer, or its string form) as an int; None for anything else."""
    try:
        return int(str(quantity))
    except ValueError:
        return None


def cluster_queue_line(cq: dict) -> str | None:
    """``ClusterQueue Q has U of N GPUs in use and may borrow B more``: N the nominal quota and B what its
    borrowing limits leave, summed over its flavors (no limit: "may borrow what the cohort lends")."""
    name = (cq.get("metadata") or {}).get("name", "?")
    nominal, limit_left, unlimited = 0, 0, False
    borrowed: dict[str, int] = {}
    used = 0
    for usage in (cq.get("status") or {}).get("flavorsReservation") or []:
        for r in usage.get("resources") or []:
            if r.get("name") == GPU_RESOURCE:
                used += _count(r.get("total", 0)) or 0
                borrowed[usage.get("name", "")] = _count(r.get("borrowed", 0)) or 0
    found = False
    for group in (cq.get("spec") or {}).get("resourceGroups") or []:
        for flavor in group.get("flavors") or []:
            for r in flavor.get("resources") or []:
                if r.get("name") != GPU_RESOURCE:
                    continue
                found = True
                nominal += _count(r.get("nominalQuota", 0)) or 0
                if r.get("borrowingLimit") is None:
                    unlimited = True
                else:
                    limit_left += max(0, (_count(r["borrowingLimit"]) or 0) - borrowed.get(flavor.get("name", ""), 0))
    if not found:
        return None
    borrow = "may borrow what the cohort lends" if unlimited else f"may borrow {limit_left} more"
    return f"ClusterQueue {name} has {used} of {nominal} GPUs in use and {borrow}"


@dataclass
class QuotaWait:
    """What Kueue says about a lane's Jobs."""

    lines: list[str] = field(default_factory=list)
    """One per Workload waiting for Kueue (at most :data:`MAX_LINES`), then the ClusterQueue's numbers."""
    waiting: int = 0
    """The lane's Workloads that wait for Kueue."""
    error: str = ""
    """Why the API server could not be asked ('' when it was)."""

    def to_dict(self) -> dict[str, Any]:
        return {"lines": list(self.lines), "waiting": self.waiting, "error": self.error}


def lane_workloads(jobs: list[dict], workloads: list[dict]) -> list[dict]:
    """The Workloads of ``jobs`` (by the controller ownerReference's uid, else the job-uid label), oldest first."""
    uids = {(j.get("metadata") or {}).get("uid") for j in jobs} - {None}
    mine = []
    for wl in workloads:
        meta = wl.get("metadata") or {}
        owners = {o.get("uid") for o in meta.get("ownerReferences") or [] if o.get("kind") == "Job"}
        if owners & uids or (meta.get("labels") or {}).get(JOB_UID_LABEL) in uids:
            mine.append(wl)
    return sorted(mine, key=lambda w: ((w.get("metadata") or {}).get("creationTimestamp") or "",
                                       (w.get("metadata") or {}).get("name") or ""))


def explain_lane(jobs: list[dict], workloads: list[dict], cluster_queue: dict | None) -> QuotaWait:
    """:class:`QuotaWait` from the lane's Jobs, the namespace's Workloads and the ClusterQueue (None: unknown)."""
    lines = [line for line in (workload_line(w) for w in lane_workloads(jobs, workloads)) if line]
    answer = QuotaWait(lines[:MAX_LINES], len(lines))
    if len(lines) > MAX_LINES:
        answer.lines.append(f"... and {len(lines) - MAX_LINES} more Workload(s) of the lane")
    if lines and cluster_queue is not None:
        cq_line = cluster_queue_line(cluster_queue)
        if cq_line:
            answer.lines.append(cq_line)
    return answer


def fetch_lane(api, namespace: str, lane: Lane) -> QuotaWait:
    """Ask the API server (``api``: a ``node_fence.KubeApi``) about ``lane``'s Jobs in ``namespace``."""
    from training.scheduler.worker.node_fence import FenceError

    ns = urllib.parse.quote(namespace, safe="")
    kueue = f"/apis/{KUEUE_API_VERSION}"
    try:
        jobs = api.request("GET", f"/apis/batch/v1/namespaces/{ns}/jobs?labelSelector="
                           + urllib.parse.quote(lane_selector(lane), safe="")).get("items") or []
        if not jobs:
            return QuotaWait()
        workloads = api.request("GET", f"{kueue}/namespaces/{ns}/workloads").get("items") or []
        cluster_queue = None
        waiting = [w for w in lane_workloads(jobs, workloads) if workload_line(w)]
        queue_name = ((waiting[0].get("spec") or {}).get("queueName") if waiting else None)
        if queue_name:
            try:
                local = api.request("GET", f"{kueue}/namespaces/{ns}/localqueues/"
                                    + urllib.parse.quote(queue_name, safe=""))
                cq_name = (local.get("spec") or {}).get("clusterQueue")
                if cq_name:
                    cluster_queue = api.request("GET", f"{kueue}/clusterqueues/" + urllib.parse.quote(cq_name, safe=""))
            except urllib.error.HTTPError:
                cluster_queue = None  # the numbers are a bonus: the Workloads' lines stand without them
    except urllib.error.HTTPError as exc:
        return QuotaWait(error=f"the Kubernetes API answered {exc.code} ({exc.reason})")
    except FenceError as exc:
        return QuotaWait(error=str(exc))
    return explain_lane(jobs, workloads, cluster_queue)


@dataclass
class KubeTarget:
    """The API server as this pod reaches it, and the pod's own namespace (where its lanes' Jobs run); answers per
    lane are kept :data:`CACHE_S` (``submit --wait`` polls status; many people ask about one lane)."""

    api: Any
    """A ``training.scheduler.worker.node_fence.KubeApi``."""
    namespace: str
    ttl_s: float = CACHE_S
    """How long one lane's answer is reused."""
    _cache: dict[str, tuple[float, QuotaWait]] = field(default_factory=dict, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def lane(self, lane: Lane) -> QuotaWait:
        """:func:`fetch_lane` of ``lane``, at most once per :attr:`ttl_s`."""
        key = f"{self.namespace}/{lane.name}"
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None and time.monotonic() - hit[0] < self.ttl_s:
                return hit[1]
        answer = fetch_lane(self.api, self.namespace, lane)
        with self._lock:
            self._cache[key] = (time.monotonic(), answer)
        return answer

    def in_namespace(self, namespace: str) -> KubeTarget:
        """The same API server, token and answer cache, asking about the lanes of ``namespace`` (a trainingTeams
        team's, whose workers' Jobs run there)."""
        return replace(self, namespace=namespace)


def in_cluster(environ: dict[str, str] | None = None, sa_dir: str = SERVICE_ACCOUNT_DIR) -> KubeTarget | None:
    """The pod's API server, token and namespace (the projected service-account volume's ``token``, ``ca.crt``,
    ``namespace``); None outside a pod or without that volume (then ``ragpool status`` adds nothing)."""
    from training.scheduler.worker.node_fence import HOST_ENV, FenceError, KubeApi

    env = os.environ if environ is None else environ
    if not env.get(HOST_ENV):
        return None
    try:
        namespace = (Path(sa_dir) / "namespace").read_text().strip()
        api = KubeApi.in_cluster(env, sa_dir)
    except (OSError, FenceError):
        return None
    if not namespace or not api.token_file.is_file():
        return None
    return KubeTarget(api, namespace)
