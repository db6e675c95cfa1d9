"""What a run is waiting on, for ``ragpool status RUN`` (torch-free).

Queue-side facts come from Redis: the run's lane (``lanes.py``), the runs ahead of it in that
lane, and the live workers registered for the lane (``TaskQueue.worker_states``). Kubernetes-side
facts come from ``kubectl get jobs,pods -l lane.ragpool.io/<lane>=true -o json`` (``lanes.lane_selector``;
every worker Job and pod carries one such label per lane its worker claims, ``lanes.lane_labels``),
only when asked (``ragpool status --cluster``, or
``RAGPOOL_STATUS_CLUSTER=1``) and ``kubectl`` is on PATH; otherwise the answer says it cannot
see Jobs.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import dataclass, field
from enum import StrEnum

from contract.lanes import Lane, lane_of, lane_selector
from contract.lanes import PRIORITIES

CLUSTER_ENV = "RAGPOOL_STATUS_CLUSTER"
"""``1``: ``ragpool status`` also asks Kubernetes (kubectl) about the lane's worker Jobs and pods."""
KUBECTL_TIMEOUT_S = 20.0
"""Longest ``kubectl get`` may take before ``ragpool status`` gives up on it."""


class WaitingOn(StrEnum):
    """What a run waits on (``ragpool status``)."""

    NO_WORKER = "no worker yet"
    """Queued; no worker of its lane exists (KEDA starts one for it)."""
    WORKER_PENDING = "worker pending (node coming)"
    """Queued; a worker Job of its lane exists but its pod is not running yet (Karpenter brings a node)."""
    QUOTA = "waiting for quota"
    """Queued; its lane's worker Jobs wait for Kueue to admit them (the run API asks Kueue:
    training/scheduler/quota_wait.py)."""
    WORKER_STARTING = "worker starting"
    """Queued; a worker of its lane is up and about to claim (or busy with the runs ahead)."""
    RUNNING = "running"
    """A worker holds it."""
    RETRY_BACKOFF = "retry backoff"
    """A failed attempt waits out its backoff before it is queued again."""
    NOTHING = "nothing"
    """Finished (succeeded, dead or cancelled)."""


@dataclass
class Waiting:
    """The answer for one run."""

    on: WaitingOn
    lane: str
    """The run's lane name (``lanes.Lane.name``)."""
    detail: str
    """One sentence for a person."""
    runs_ahead: int | None = None
    """Queued runs of the same lane claimed before it (queued runs only)."""
    workers: dict[str, int] = field(default_factory=dict)
    """Live registered workers of its lane by state."""
    jobs_seen: bool = False
    """Whether Kubernetes was asked (else the answer is from the queue alone)."""

    def to_dict(self) -> dict:
        return {"on": str(self.on), "lane": self.lane, "detail": self.detail, "runs_ahead": self.runs_ahead,
                "workers": self.workers, "jobs_seen": self.jobs_seen}


def cluster_from_env() -> bool:
    return os.environ.get(CLUSTER_ENV, "") in ("1", "true", "yes")


def explain(queue, info, *, cluster: bool = False, kube_namespace: str | None = None) -> Waiting:
    """What ``info`` (a ``TaskInfo`` of ``queue``) waits on."""
    spec = json.loads(info.spec_json or "{}")
    nodes = spec.get("nodes", 1)
    nodes = nodes["max"] if isinstance(nodes, dict) else nodes  # an elastic run waits in the lane of its most
    lane = lane_of(spec.get("executor", "torchrun"), nodes, spec.get("pool"))
    workers: dict[str, int] = {}
    for worker in queue.worker_states().values():
        if lane in worker.lanes:
            workers[worker.state] = workers.get(worker.state, 0) + 1
    if info.state == "running":
        return Waiting(WaitingOn.RUNNING, lane.name, f"running on worker {info.worker}", workers=workers)
    if info.state == "failed":
        return Waiting(WaitingOn.RETRY_BACKOFF, lane.name, "a failed attempt waits out its retry backoff, then "
                       "it is queued again in its lane", workers=workers)
    if info.state != "queued":
        return Waiting(WaitingOn.NOTHING, lane.name, f"finished ({info.state})", workers=workers)
    ahead = _runs_ahead(queue, lane, info)
    ahead_text = f"{ahead} run(s) of lane {lane.name} ahead of it" if ahead else f"first in lane {lane.name}"
    if not cluster:
        if workers.get("waiting"):
            return Waiting(WaitingOn.WORKER_STARTING, lane.name, f"a worker of its lane is up and claims it next "
                           f"({ahead_text})", ahead, workers)
        seen = "cannot see Jobs (pass --cluster with kubectl on PATH to ask Kubernetes)"
        if workers.get("running"):
            return Waiting(WaitingOn.NO_WORKER, lane.name, f"no free worker yet: the lane's workers are busy "
                           f"({ahead_text}); {seen}", ahead, workers)
        return Waiting(WaitingOn.NO_WORKER, lane.name, f"no worker of its lane yet ({ahead_text}); {seen}",
                       ahead, workers)
    pods = _kubectl_lane_objects(lane, kube_namespace)
    if isinstance(pods, str):
        return Waiting(WaitingOn.NO_WORKER if not workers.get("waiting") else WaitingOn.WORKER_STARTING, lane.name,
                       f"cannot see Jobs: {pods} ({ahead_text})", ahead, workers)
    jobs, pending, starting = pods
    if workers.get("waiting") or starting:
        return Waiting(WaitingOn.WORKER_STARTING, lane.name, f"a worker pod of its lane is running and claims it "
                       f"next ({ahead_text})", ahead, workers, True)
    if pending or jobs:
        why = "; ".join(sorted(set(pending))) or "pod not created yet"
        return Waiting(WaitingOn.WORKER_PENDING, lane.name, f"{jobs} worker Job(s) of its lane, pod(s) Pending: "
                       f"node coming ({why}; {ahead_text})", ahead, workers, True)
    return Waiting(WaitingOn.NO_WORKER, lane.name, f"no worker Job of its lane yet: KEDA starts one at its next "
                   f"poll ({ahead_text})", ahead, workers, True)


def _runs_ahead(queue, lane: Lane, info) -> int | None:
    """Queued runs of ``lane`` a worker claims before this one (higher priorities, then older)."""
    lists = lane.ready_lists()
    try:
        mine = lists[PRIORITIES.index(info.priority)]
    except ValueError:
        return None
    pipe = queue.client.pipeline(transaction=False)
    for name in lists[:lists.index(mine)]:
        pipe.llen(queue.prefix + name)
    pipe.llen(queue.prefix + mine)
    pipe.lpos(queue.prefix + mine, info.task_id)
    *higher, length, pos = pipe.execute()
    if pos is None:
        return None
    return sum(int(n) for n in higher) + int(length) - 1 - int(pos)  # claims pop the oldest, at the tail


def _kubectl_lane_objects(lane: Lane, kube_namespace: str | None) -> tuple[int, list[str], int] | str:
    """(active worker Jobs, a reason per Pending pod, running pods not Ready yet) of the lane, or why not."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        return "kubectl is not on PATH"
    cmd = [kubectl, "get", "jobs,pods", "-l", lane_selector(lane), "-o", "json"]
    if kube_namespace:
        cmd += ["-n", kube_namespace]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=KUBECTL_TIMEOUT_S, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"kubectl failed ({type(exc).__name__})"
    if out.returncode != 0:
        return f"kubectl exited {out.returncode}: {' '.join(out.stderr.split())[:200]}"
    try:
        items = json.loads(out.stdout).get("items", [])
    except ValueError:
        return "kubectl printed no JSON"
    jobs, pending, starting = 0, [], 0
    for item in items:
        kind, status = item.get("kind"), item.get("status") or {}
        if kind == "Job":
            done = status.get("completionTime") or any(
                c.get("type") in ("Complete", "Failed") and c.get("status") == "True" for c in status.get("conditions") or [])
            jobs += 0 if done else 1
        elif kind == "Pod" and status.get("phase") == "Pending":
            cond = next((c for c in status.get("conditions") or [] if c.get("type") == "PodScheduled"), {})
            pending.append(cond.get("reason") or "scheduling")
        elif kind == "Pod" and status.get("phase") == "Running":
            ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])
            starting += 0 if ready else 1
    return jobs, pending, starting
