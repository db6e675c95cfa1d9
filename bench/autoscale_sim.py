"""A from-zero simulation of the worker pool: KEDA's ScaledJob loop drives a small fake Job
controller whose pods are real local ``python -m training.worker`` processes on a real
``redis-server``, with the real keeper (``python -m training.scheduler.keeper``).

What is real: the ScaledJob objects (built by infra, the same dicts ``pulumi up`` applies),
KEDA's job-count algorithm (:mod:`bench.keda_scaledjob`, transcribed from KEDA v2.20.2),
the exact command KEDA's Redis scaler sends for each trigger (``EVAL`` of its Lua script on the
trigger's ``listName``), the worker processes with the job template's command, args and
environment (``value``, ``fieldRef``, ``secretKeyRef``, ``configMapKeyRef``, ``$(VAR)`` expansion as the kubelet does),
their ``/ready`` endpoint as the readiness probe the template declares, the queue and the keeper.

What stands in for the cluster (:class:`Cluster`):

- Nodes: a pod starts at once (a node is there) unless its pool (the pod's
  ``ragpool.io/pool`` node selector) would then run more GPUs than ``gpu_capacity`` (the
  NodePool's ``limits``, or less to make nodes scarce); then it stays Pending, as when
  Karpenter cannot get a node. ``node_delay(pod)``, when given, keeps a pod Pending that many
  seconds after it was created: its node comes late (a cold pool), or never.
- ResourceQuota: a pod whose GPU request would take its namespace's non-terminal pods past
  ``requests.nvidia.com/gpu`` is not created; the Job controller tries again (1 s).
- Deployments (the keeper): one pod, restarted when it exits.
- Mounts and ports: no mount or network namespace, so an env value or arg that starts with a
  volume's ``mountPath`` is rewritten to a local directory (the PVC: the simulation's shared
  root; a secret volume: its keys written as files; an emptyDir: a fresh directory), and a
  value equal to a declared ``containerPort`` becomes a free local port of that pod.
- Kueue, with ``Simulation(kueue=True)`` (:mod:`bench.kueue_gate` over the plan's ClusterQueues, Cohort
  and LocalQueues: Kueue v0.19.2's scheduler transcribed in :mod:`bench.kueue_admission`): a ScaledJob's
  Job is created suspended; once admitted all its pods are created at once; an evicted Job is suspended
  again and its pods deleted (SIGTERM, SIGKILL after the grace), its quota free once they are gone.
- The Job controller (:class:`Job`): Indexed Jobs of ``parallelism`` pods, restartPolicy Never,
  ``podFailurePolicy`` (FailJob / Ignore / Count on exit codes; a lost node is a
  ``DisruptionTarget``), ``backoffLimit`` with the kubelet's 10 s doubling pod back-off,
  ``backoffLimitPerIndex``/``maxFailedIndexes`` and ``podReplacementPolicy`` (:func:`failed_pod_outcome`,
  :meth:`Simulation.drain_node_of`),
  ``activeDeadlineSeconds``; a Job whose every index succeeded is Complete.
- The run itself: the workers' child builder is the tests' (``RAGPOOL_WORKER_CHILD_BUILDER``,
  tests/support/worker_child.py, importable from the repository root on their ``PYTHONPATH``), which runs
  :data:`WORKLOAD` in place of torchrun: ``max_steps`` steps of ``step_s``, a checkpoint file
  after each step, resumed from on the next attempt, each finished execution appended to
  ``runs/<id>/sim-done-<node>`` (so a run done twice is seen); an attempt for which
  ``runs/<id>/sim-fail-attempt-<n>`` exists exits 1 at once (a failed attempt, retried); while
  ``runs/<id>/sim-exit`` exists, every execution exits with the code it holds (e.g. 4, the Ray
  cluster unreachable: :meth:`Simulation.exit_with`).
- The worker's settings KEDA's timing depends on (``--lease-seconds``, ``--idle-exit-seconds``,
  ``--poll-seconds``, ``--gang-deadline-seconds``, the retry back-off), the ScaledJob's ``pollingInterval`` and the
  keeper's ``--interval-seconds`` are set from :class:`Settings`;
  the health check is off (no GPU here).

Every wait has a bound and says what it saw (:meth:`Simulation.wait_for`, ``bench.recovery.wait_until``).
"""

from __future__ import annotations

import collections
import json
import os
import random
import re
import shutil
import signal
import string
import subprocess
import sys
import threading
import time
import traceback
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable

from bench import keda_scaledjob as keda
from bench.recovery import lose_node, wait_until
from training.localdev.redis_server import LocalRedisServer
from contract.paths import child_env
from contract.ports import free_port
from contract.names import POOL_LABEL
from contract.env import REDIS_URL_ENV
from contract.names import GPU_RESOURCE

if TYPE_CHECKING:
    from bench.kueue_gate import Eviction, KueueGate

NODE_WAIT_S = 1.0
"""A Job whose first pod started later than this after the Job was created waited for a node."""
KUEUE_CYCLES_PER_TICK = 50
"""Most Kueue scheduling cycles per tick of the fake controller (each admits at most one Workload per
ClusterQueue; Kueue runs the next cycle at once after a successful one)."""
POD_BACKOFF_S = 10.0
"""The Job controller's pod back-off after a counted failure (doubles per failure, k8s default)."""

WORKLOAD = r"""
set -e
d="$RAGPOOL_SHARED_ROOT/runs/{run_id}"
steps=$(sed -n 's/^  max_steps: //p' "{config}" | head -n 1)
ck="$d/sim-ckpt-{node_index}"
if [ -f "$d/sim-fail-attempt-{attempt}" ]; then echo "attempt {attempt} fails as asked" >&2; exit 1; fi
if [ -f "$d/sim-exit" ]; then echo "exits $(cat "$d/sim-exit") as asked" >&2; exit "$(cat "$d/sim-exit")"; fi
s=$(cat "$ck" 2>/dev/null || echo 0)
echo "attempt {attempt} node {node_index} worker $RAGPOOL_WORKER_ID from step $s" >> "$d/sim-log"
while [ "$s" -lt "${steps:-1}" ]; do
  sleep "$SIM_STEP_S"
  s=$((s + 1))
  echo "$s" > "$ck.tmp" && mv "$ck.tmp" "$ck"
done
echo "{attempt}" >> "$d/sim-done-{node_index}"
"""
"""The run's stand-in (see the module docstring): ``{...}`` are the worker's test-hook substitutions."""


@dataclass(frozen=True)
class Settings:
    """What the simulation runs under."""

    polling_interval_s: float = 2.0
    """The ScaledJobs' ``pollingInterval`` (KEDA's default is 30 s; whole seconds in the CRD)."""
    idle_exit_s: float = 3.0
    """The workers' ``--idle-exit-seconds``."""
    lease_s: float = 4.0
    """The workers' ``--lease-seconds`` (a lost worker's run is requeued this long after its last heartbeat)."""
    keeper_interval_s: float = 1.0
    """The keeper's ``--interval-seconds``."""
    worker_poll_s: float = 0.5
    """The workers' ``--poll-seconds``."""
    backoff_s: float = 6.0
    """The workers' retry back-off (``--backoff-base-seconds`` = ``--backoff-max-seconds``): longer
    than idle-exit, so a failed run's retry comes due when no worker is left."""
    gang_deadline_s: float = 6.0
    """The workers' ``--gang-deadline-seconds`` (all pods of a multi-node Job join by then, or none runs)."""
    step_s: float = 0.25
    """One workload step."""
    stop_grace_s: float = 10.0
    """Longest SIGTERM grace when the Job controller deletes a pod (the template's, capped)."""
    reconcile_s: float = 0.1
    """How often the fake Job controller looks at its pods."""


# -- Kubernetes bits the kubelet would do -------------------------------------------------

_VAR_REF = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


def expand(value: str, env: dict[str, str]) -> str:
    """The kubelet's ``$(VAR)`` expansion of a container env value or arg: a reference to a
    variable defined before it is replaced, an unknown one kept, ``$$`` is one ``$``."""
    def sub(m: re.Match) -> str:
        if m.group(0) == "$$":
            return "$"
        return env.get(m.group(1), m.group(0))
    return _VAR_REF.sub(sub, value)


def field_ref(path: str, pod: "Pod") -> str:
    """A ``fieldRef.fieldPath`` of the downward API for ``pod``."""
    if path == "metadata.name":
        return pod.name
    if path == "metadata.namespace":
        return pod.job.namespace
    if path == "spec.nodeName":
        return pod.node
    if path in ("status.podIP", "status.hostIP"):
        return "127.0.0.1"
    m = re.fullmatch(r"metadata\.(labels|annotations)\['([^']+)'\]", path)
    if m:
        return (pod.labels if m.group(1) == "labels" else pod.annotations).get(m.group(2), "")
    raise ValueError(f"fieldRef {path!r} is not simulated")


def pod_failure_action(job_spec: dict, code: int, *, container: str = "worker", disrupted: bool = False) -> str:
    """What the Job controller does with a failed pod whose ``container`` exited ``code`` (not 0):
    the action of the first ``podFailurePolicy`` rule that matches, ``Count`` when none does
    (kubernetes/kubernetes pkg/controller/job/pod_failure_policy.go ``matchPodFailurePolicy``;
    ``DisruptionTarget`` is the only pod condition simulated: a lost node)."""
    for rule in (job_spec.get("podFailurePolicy") or {}).get("rules", []):
        on_codes = rule.get("onExitCodes")
        if on_codes is not None:
            if on_codes.get("containerName") not in (None, container):
                continue
            values = set(on_codes.get("values", []))
            if (code in values) == (on_codes.get("operator", "In") == "In"):
                return rule["action"]
            continue
        for cond in rule.get("onPodConditions", []):
            if cond.get("type") == "DisruptionTarget" and cond.get("status", "True") == "True" and disrupted:
                return rule["action"]
    return "Count"


def replaces_terminating(job_spec: dict) -> bool:
    """``podReplacementPolicy``: TerminatingOrFailed replaces a pod once it is terminating, Failed only once it is
    terminal; Failed is the default, and the only value allowed, with a ``podFailurePolicy`` (the API's JobSpec
    description; kubernetes/kubernetes pkg/controller/job/indexed_job_utils.go ``firstPendingIndexes`` counts a
    terminating pod's index as not pending under Failed)."""
    default = "Failed" if job_spec.get("podFailurePolicy") else "TerminatingOrFailed"
    return job_spec.get("podReplacementPolicy", default) == "TerminatingOrFailed"


@dataclass(frozen=True)
class FailedPod:
    """What the Job controller does after one pod failed (:func:`failed_pod_outcome`)."""

    action: str
    """The ``podFailurePolicy`` action (``Count`` when no rule matched)."""
    counted: bool
    """Counted against ``backoffLimit`` and the index's ``backoffLimitPerIndex`` (every action but Ignore)."""
    index_failed: bool = False
    """The index is failed (``backoffLimitPerIndex``): never replaced; the other indexes go on."""
    job_failed: str | None = None
    """The reason the Job is Failed now, or None."""
    retry_after_s: float | None = None
    """Seconds until the index's replacement pod is created; None: no replacement."""


def failed_pod_outcome(job_spec: dict, code: int, *, disrupted: bool = False, job_failures: int = 0,
                       index_failures: int = 0, index_ignored: int = 0, failed_indexes: int = 0,
                       succeeded: int = 0) -> FailedPod:
    """The Job controller on a failed pod of an Indexed Job (kubernetes/kubernetes pkg/controller/job):
    ``job_failures`` counted failures of the Job before this one; ``index_failures``/``index_ignored`` the failed
    pod's ``batch.kubernetes.io/job-index-failure-count``/``-ignored-failure-count`` annotations (its index's
    counted and ignored failures before it); ``failed_indexes``/``succeeded`` the other indexes' state.

    - ``backoffLimit`` first (job_controller.go ``exceedsBackoffLimit``: counted failures > it; with a
      ``backoffLimitPerIndex`` and no ``backoffLimit`` it defaults to MaxInt32).
    - With ``backoffLimitPerIndex`` (indexed_job_utils.go ``isIndexFailed``): the index fails on a FailIndex rule or
      a counted failure of a pod already at the limit; then the Job fails once the failed indexes exceed
      ``maxFailedIndexes`` (MaxFailedIndexesExceeded), or once every index is failed or succeeded with one failed
      (FailedIndexes). Else the replacement waits 10 s doubling per failure of the index, ignored ones included
      (job_controller.go ``getRemainingTimePerIndex``).
    - Without: the replacement waits 10 s doubling per counted failure of the Job, none for an ignored one."""
    action = pod_failure_action(job_spec, code, disrupted=disrupted)
    if action == "FailJob":
        return FailedPod(action, True, job_failed="PodFailurePolicy")
    counted = action != "Ignore"
    failures = job_failures + counted
    per_index = job_spec.get("backoffLimitPerIndex")
    limit = job_spec.get("backoffLimit", 2**31 - 1 if per_index is not None else 6)
    if failures > int(limit):
        return FailedPod(action, counted, job_failed="BackoffLimitExceeded")
    if per_index is None:
        return FailedPod(action, counted, retry_after_s=POD_BACKOFF_S * 2 ** (failures - 1) if counted else 0.0)
    if action == "FailIndex" or (counted and index_failures >= int(per_index)):
        failed = failed_indexes + 1
        max_failed = job_spec.get("maxFailedIndexes")
        if max_failed is not None and failed > int(max_failed):
            return FailedPod(action, counted, index_failed=True, job_failed="MaxFailedIndexesExceeded")
        if failed + succeeded >= int(job_spec.get("completions", 1)):
            return FailedPod(action, counted, index_failed=True, job_failed="FailedIndexes")
        return FailedPod(action, counted, index_failed=True)
    return FailedPod(action, counted, retry_after_s=POD_BACKOFF_S * 2 ** (index_failures + index_ignored))


# -- pods and Jobs -------------------------------------------------------------------------

@dataclass
class Pod:
    job: "Job"
    index: int
    name: str
    labels: dict[str, str]
    annotations: dict[str, str]
    created_at: float
    pool: str | None
    gpus: int
    node: str = ""
    phase: str = "Pending"
    proc: subprocess.Popen | None = None
    started_at: float | None = None
    ended_at: float | None = None
    exit_code: int | None = None
    ready: bool = False
    ready_at: float | None = None
    disrupted: bool = False
    """Lost with its node (the pod gets a DisruptionTarget condition)."""
    drained: bool = False
    """Its node drained (a spot notice): terminating while the Job goes on (:meth:`Simulation.drain_node_of`)."""
    index_failures: tuple[int, int] = (0, 0)
    """Its index's counted and ignored failures before it (the ``job-index-failure-count`` annotations)."""
    probe_url: str | None = None
    next_probe_at: float = 0.0
    deleting_since: float | None = None
    log_path: Path | None = None

    def view(self) -> keda.PodView:
        conditions = {"PodScheduled"} if self.node else set()
        if self.ready:
            conditions.add("Ready")
        if self.disrupted:
            conditions.add("DisruptionTarget")
        return keda.PodView(self.phase, frozenset(conditions))


@dataclass
class Job:
    scaled_job: "ScaledJob"
    name: str
    created_at: float
    spec: dict
    pods: list[Pod] = field(default_factory=list)
    succeeded: set[int] = field(default_factory=set)
    failures: int = 0
    condition: str | None = None
    """``Complete`` or ``Failed`` once finished."""
    finished_at: float | None = None
    retry_at: dict[int, float] = field(default_factory=dict)
    failed_indexes: set[int] = field(default_factory=set)
    """Indexes failed by ``backoffLimitPerIndex``: never replaced."""
    index_failures: dict[int, tuple[int, int]] = field(default_factory=dict)
    """Index -> its counted and ignored pod failures (what its next pod's annotations carry)."""
    suspended: bool = False
    """``spec.suspend``: under Kueue (:mod:`bench.kueue_gate`) until admitted, and again once evicted."""
    labels: dict[str, str] = field(default_factory=dict)
    """The Job's own labels (:func:`job_labels`: its ScaledJob's, as KEDA copies them)."""

    @property
    def namespace(self) -> str:
        return self.scaled_job.namespace

    @property
    def finished(self) -> bool:
        return self.condition is not None

    def active_pods(self) -> list[Pod]:
        return [p for p in self.pods if p.phase in ("Pending", "Running")]


@dataclass
class ScaledJob:
    """One ScaledJob object (``keda.sh/v1alpha1``) as infra declares it."""

    manifest: dict
    jobs: list[Job] = field(default_factory=list)
    next_poll_at: float = 0.0
    polls: int = 0
    errors: int = 0
    at_max: list[float] = field(default_factory=list)
    """When a poll left the ScaledJob at its ``maxReplicaCount`` (unfinished Jobs after it created
    its Jobs): a run still without a Job then waits for capacity, not for KEDA."""

    @property
    def name(self) -> str:
        return self.manifest["metadata"]["name"]

    @property
    def namespace(self) -> str:
        return self.manifest["metadata"].get("namespace", "default")

    @property
    def spec(self) -> dict:
        return self.manifest["spec"]

    def unfinished(self) -> list[Job]:
        return [j for j in self.jobs if not j.finished]


@dataclass
class Event:
    at: float
    kind: str
    """``job-created``, ``job-finished``, ``pod-started``, ``pod-ready``, ``pod-exited``, ``pod-lost``."""
    scaled_job: str
    job: str
    detail: dict = field(default_factory=dict)


def _suffix(n: int = 5) -> str:
    return "".join(random.choices(string.ascii_lowercase + string.digits, k=n))


class Cluster:
    """KEDA's scale loop and the Job controller over local processes (see the module docstring)."""

    def __init__(self, scaled_jobs: Iterable[dict], *, redis_client, secrets: dict[str, dict[str, str]],
                 shared_root: Path, work_dir: Path, settings: Settings, gpu_capacity: dict[str, int] | None = None,
                 gpu_quotas: dict[str, int] | None = None, extra_env: dict[str, str] | None = None,
                 node_delay: Callable[[Pod], float] | None = None,
                 config_maps: dict[str, dict[str, str]] | None = None, kueue: "KueueGate | None" = None) -> None:
        self.scaled_jobs = [ScaledJob(m) for m in scaled_jobs]
        self.redis = redis_client
        self.secrets = secrets
        self.config_maps = config_maps or {}
        self.shared_root = shared_root
        self.work_dir = work_dir
        self.settings = settings
        self.gpu_capacity = dict(gpu_capacity or {})
        """Most GPUs running at once per pool (absent: unlimited)."""
        self.gpu_quotas = dict(gpu_quotas or {})
        """Namespace -> its ResourceQuota's ``requests.nvidia.com/gpu``."""
        self.deployments: list[ScaledJob] = []
        """Deployments' stand-ins: a never-polled ScaledJob shell holding one always-restarted Job."""
        self.extra_env = dict(extra_env or {})
        self.node_delay = node_delay
        """Seconds a pod waits Pending for its node after it was created (None: none)."""
        self.events: list[Event] = []
        self.created: list[Job] = []
        """Every Job the ScaledJobs created, also those KEDA's clean-up removed since."""
        self.lock = threading.RLock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.max_unfinished: dict[str, int] = {sj.name: 0 for sj in self.scaled_jobs}
        self.max_gpus: dict[str, int] = {}
        self.errors: list[str] = []
        self._nodes = 0
        self.kueue = kueue
        """Kueue in front of the Job controller (None: Jobs start at once, as without Kueue)."""

    # -- the loop -----------------------------------------------------------------------

    def start(self) -> "Cluster":
        now = time.time()
        for sj in self.scaled_jobs:
            sj.next_poll_at = now
        self._thread = threading.Thread(target=self._loop, name="fake-cluster", daemon=True)
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                with self.lock:
                    now = time.time()
                    self.reconcile_jobs(now)
                    if self.kueue is not None:
                        self.kueue_cycle(now)
                    self.reap_deleted(now)
                    for sj in self.scaled_jobs:
                        if now >= sj.next_poll_at:
                            # startScaleLoop: the next check is due one interval after this one starts.
                            sj.next_poll_at = now + keda.polling_interval_s(sj.spec)
                            self.check_scaled_job(sj, now)
                    self._record_bounds()
            except Exception as exc:  # reported by the waits (Simulation.wait_for fails at once)
                self.errors.append(f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=-3)}")
            self._stop.wait(self.settings.reconcile_s)

    def stop(self) -> None:
        """Stop the loops, then every pod (SIGKILL with everything under it)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        with self.lock:
            for job in self._every_job():
                for pod in job.pods:
                    if pod.proc is not None and pod.proc.poll() is None:
                        lose_node(pod.proc)

    def _every_job(self) -> list[Job]:
        """Every Job ever created, the Deployments' too (also those KEDA's clean-up removed)."""
        return [*self.created, *(job for d in self.deployments for job in d.jobs)]

    # -- KEDA (scale_handler.checkScalers -> RequestJobScale) ----------------------------

    def trigger_readings(self, sj: ScaledJob) -> tuple[list[tuple[float, float | None, bool]], bool]:
        """Per trigger: (length, listLength target, active) as KEDA's Redis scaler reads it; and
        whether any trigger failed (isError)."""
        readings, error = [], False
        for trigger in sj.spec.get("triggers", []):
            if trigger.get("type") != "redis":
                raise ValueError(f"ScaledJob {sj.name}: trigger type {trigger.get('type')!r} is not simulated")
            meta = trigger.get("metadata", {})
            try:
                length = keda.redis_list_length(self.redis, meta["listName"])
            except Exception as exc:
                if "redis" not in type(exc).__module__:
                    raise
                error = True
                continue
            target = float(meta.get("listLength", keda.REDIS_DEFAULT_LIST_LENGTH))
            activation = int(meta.get("activationListLength", keda.REDIS_DEFAULT_ACTIVATION_LIST_LENGTH))
            readings.append((float(length), target, keda.redis_trigger_is_active(length, activation)))
        return readings, error

    def check_scaled_job(self, sj: ScaledJob, now: float) -> int:
        readings, error = self.trigger_readings(sj)
        # Jobs are created after the lists were read: a run submitted while this loop ran is never
        # counted by a Job stamped before its submit.
        now = max(now, time.time())
        sj.polls += 1
        sj.errors += int(error)
        is_active, scale_to, max_scale = keda.scaled_job_state(sj.spec, readings)
        unfinished = sj.unfinished()
        conditions = (sj.spec.get("scalingStrategy") or {}).get("pendingPodConditions") or []
        pending = sum(keda.job_is_pending([p.view() for p in j.pods], conditions) for j in unfinished)
        n = keda.jobs_to_create(sj.spec, is_active=is_active, scale_to=scale_to, max_scale=max_scale,
                                running=len(unfinished), pending=pending)
        for _ in range(n):
            self.create_job(sj, now)
        if len(unfinished) + n >= keda.max_replica_count(sj.spec):
            sj.at_max.append(now)
        self._clean_up(sj)
        return n

    def _clean_up(self, sj: ScaledJob) -> None:
        """``cleanUp``: keep the newest ``successfulJobsHistoryLimit`` / ``failedJobsHistoryLimit``
        finished Jobs (default 100 each)."""
        for condition, key in (("Complete", "successfulJobsHistoryLimit"), ("Failed", "failedJobsHistoryLimit")):
            limit = sj.spec.get(key, 100)
            done = sorted((j for j in sj.jobs if j.condition == condition), key=lambda j: j.finished_at or 0)
            for job in done[:max(0, len(done) - limit)]:
                sj.jobs.remove(job)

    # -- the Job controller --------------------------------------------------------------

    def create_job(self, sj: ScaledJob, now: float) -> Job:
        spec = json.loads(json.dumps(sj.spec["jobTargetRef"]))
        job = Job(scaled_job=sj, name=f"{sj.name}-{_suffix()}", created_at=now, spec=spec,
                  labels=job_labels(sj.manifest))
        sj.jobs.append(job)
        if sj in self.scaled_jobs:
            self.created.append(job)
        self.events.append(Event(now, "job-created", sj.name, job.name))
        if self.kueue is not None and sj in self.scaled_jobs:
            job.suspended = True  # Kueue's webhook: created suspended, its Workload queued
            self.kueue.job_created(job, now)
            return job
        for index in range(int(spec.get("parallelism", 1))):
            self._new_pod(job, index, now)
        return job

    def kueue_cycle(self, now: float) -> None:
        """One Kueue scheduling cycle: unsuspend the admitted Jobs (every pod at once), suspend the
        evicted ones (their pods deleted: SIGTERM, SIGKILL after the grace); an evicted Job with no
        active pod left gives its quota back."""
        jobs = {j.name: j for j in self.created}
        admitted, evictions = [], []
        for _ in range(KUEUE_CYCLES_PER_TICK):
            # Kueue's loop starts its next cycle at once after one that admitted or evicted (wait.KeepGoing).
            more, evicting = self.kueue.schedule(now)
            admitted += more
            evictions += evicting
            if not more and not evicting:
                break
        for name in admitted:
            job = jobs[name]
            job.suspended = False
            self.events.append(Event(now, "job-admitted", job.scaled_job.name, job.name))
            for index in range(int(job.spec.get("parallelism", 1))):
                if index not in job.succeeded:
                    self._new_pod(job, index, now)
        for ev in evictions:
            job = jobs[ev.job]
            job.suspended = True
            job.retry_at.clear()
            for pod in job.active_pods():
                ev.pods.append(pod.name)
                if pod.phase == "Pending":
                    pod.phase, pod.ended_at = "Failed", now
                elif pod.deleting_since is None:
                    pod.deleting_since = now
                    pod.proc.send_signal(signal.SIGTERM)
            self.events.append(Event(now, "job-evicted", job.scaled_job.name, job.name,
                                     {"reason": ev.reason, "by": ev.by, "pods": list(ev.pods)}))
            if self.kueue.on_evict is not None:
                self.kueue.on_evict(ev)
        for job in jobs.values():
            if job.suspended and not job.finished and not job.active_pods():
                self.kueue.pods_gone(job)

    def _new_pod(self, job: Job, index: int, now: float) -> Pod | None:
        template = job.spec["template"]
        meta, pod_spec = template.get("metadata", {}), template["spec"]
        container = pod_spec["containers"][0]
        gpus = int(container.get("resources", {}).get("requests", {}).get(GPU_RESOURCE, 0))
        quota = self.gpu_quotas.get(job.namespace)
        if gpus and quota is not None and self.requested_gpus(job.namespace) + gpus > quota:
            job.retry_at[index] = now + 1.0  # "exceeded quota": the Job controller tries again
            return None
        labels = {**meta.get("labels", {}), "job-name": job.name, "batch.kubernetes.io/job-name": job.name,
                  "scaledjob.keda.sh/name": job.scaled_job.name}
        if job.spec.get("completionMode") == "Indexed":
            labels["batch.kubernetes.io/job-completion-index"] = str(index)
        pod = Pod(job=job, index=index, name=f"{job.name}-{index}-{_suffix()}", labels=labels,
                  annotations=dict(meta.get("annotations", {})), created_at=now,
                  pool=(pod_spec.get("nodeSelector") or {}).get(POOL_LABEL), gpus=gpus,
                  index_failures=job.index_failures.get(index, (0, 0)))
        job.pods.append(pod)
        return pod

    def running_gpus_in_pool(self, pool: str | None) -> int:
        return sum(p.gpus for sj in self.scaled_jobs for j in sj.jobs for p in j.pods
                   if p.pool == pool and p.phase == "Running")

    def requested_gpus(self, namespace: str) -> int:
        """GPUs requested by the namespace's non-terminal pods (what ResourceQuota counts)."""
        return sum(p.gpus for sj in self.scaled_jobs if sj.namespace == namespace for j in sj.jobs for p in j.pods
                   if p.phase in ("Pending", "Running"))

    def reconcile_jobs(self, now: float) -> None:
        for sj in [*self.scaled_jobs, *self.deployments]:
            for job in sj.unfinished():
                self._reconcile_job(job, now)

    def run_deployment(self, manifest: dict, args: dict[str, str] | None = None) -> Job:
        """Run a Deployment's pod (one replica) with ``args`` flags set; it is restarted when it exits."""
        template = json.loads(json.dumps(manifest["spec"]["template"]))
        container = template["spec"]["containers"][0]
        for flag, value in (args or {}).items():
            container["args"] = set_flag(container.get("args", []), flag, value)
        shell = ScaledJob({"metadata": manifest["metadata"], "spec": {"jobTargetRef": {
            "parallelism": 1, "completions": 1, "backoffLimit": 1_000_000, "template": template,
            "podFailurePolicy": {"rules": [{"action": "Ignore", "onExitCodes": {"operator": "NotIn", "values": []}}]}}}})
        with self.lock:
            self.deployments.append(shell)
            return self.create_job(shell, time.time())

    def _reconcile_job(self, job: Job, now: float) -> None:
        deadline = job.spec.get("activeDeadlineSeconds")
        if deadline is not None and not job.suspended and now - job.created_at > float(deadline):
            self._finish(job, "Failed", now, "DeadlineExceeded")
            return
        for pod in list(job.pods):
            if pod.phase == "Pending" and pod.deleting_since is None:
                limit = self.gpu_capacity.get(pod.pool) if pod.pool is not None else None
                if self.node_delay is not None and now - pod.created_at < self.node_delay(pod):
                    continue  # its node is not there yet
                if limit is None or self.running_gpus_in_pool(pod.pool) + pod.gpus <= limit:
                    self._start_pod(pod, now)
            elif pod.phase == "Running":
                code = pod.proc.poll()
                if code is not None:
                    self._pod_exited(job, pod, code, now)
                    if job.finished:
                        return
                elif pod.deleting_since is not None:
                    if now - pod.deleting_since > self._grace(job):
                        lose_node(pod.proc)
                else:
                    self._probe(pod, now)
        for index, at in list(job.retry_at.items()):
            if now >= at and not job.suspended:
                del job.retry_at[index]
                self._new_pod(job, index, now)

    def _grace(self, job: Job) -> float:
        grace = job.spec["template"]["spec"].get("terminationGracePeriodSeconds", 30)
        return min(float(grace), self.settings.stop_grace_s)

    def _pod_exited(self, job: Job, pod: Pod, code: int, now: float) -> None:
        pod.exit_code, pod.ended_at, pod.ready = code, now, False
        pod.phase = "Succeeded" if code == 0 else "Failed"
        self.events.append(Event(now, "pod-exited", job.scaled_job.name, job.name,
                                 {"pod": pod.name, "code": code, "disrupted": pod.disrupted}))
        if (pod.deleting_since is not None and not pod.drained) or job.finished:
            return  # deleted with its Job (finished, or evicted by Kueue)
        if code == 0:
            job.succeeded.add(pod.index)
            if len(job.succeeded) >= int(job.spec.get("completions", 1)):
                self._finish(job, "Complete", now, "Completed")
            elif job.failed_indexes and len(job.succeeded | job.failed_indexes) >= int(job.spec.get("completions", 1)):
                self._finish(job, "Failed", now, "FailedIndexes")  # every index done, one failed (see failed_pod_outcome)
            return
        counted, ignored = pod.index_failures
        outcome = failed_pod_outcome(
            job.spec, code, disrupted=pod.disrupted, job_failures=job.failures, index_failures=counted,
            index_ignored=ignored, failed_indexes=len(job.failed_indexes), succeeded=len(job.succeeded))
        job.failures += outcome.counted
        job.index_failures[pod.index] = (counted + 1, ignored) if outcome.counted else (counted, ignored + 1)
        if outcome.index_failed:
            job.failed_indexes.add(pod.index)
            job.retry_at.pop(pod.index, None)
        if outcome.job_failed is not None:
            self._finish(job, "Failed", now, outcome.job_failed)
        elif outcome.retry_after_s is not None and not (pod.drained and replaces_terminating(job.spec)):
            job.retry_at[pod.index] = now + outcome.retry_after_s

    def _finish(self, job: Job, condition: str, now: float, reason: str) -> None:
        job.condition, job.finished_at = condition, now
        job.retry_at.clear()
        for pod in job.pods:  # the Job controller deletes what is still active
            if pod.phase == "Pending":
                pod.phase = "Failed"
                pod.ended_at = now
            elif pod.phase == "Running" and pod.proc is not None and pod.deleting_since is None:
                pod.deleting_since = now
                pod.proc.send_signal(signal.SIGTERM)
        self.events.append(Event(now, "job-finished", job.scaled_job.name, job.name,
                                 {"condition": condition, "reason": reason}))
        if self.kueue is not None:
            self.kueue.job_finished(job)

    def reap_deleted(self, now: float) -> None:
        """Pods of finished Jobs that were sent SIGTERM: SIGKILL after the grace, then forget them."""
        for job in self._every_job():
            if job.finished:
                for pod in job.pods:
                    if pod.phase == "Running" and pod.proc is not None:
                        code = pod.proc.poll()
                        if code is None and now - (pod.deleting_since or now) > self._grace(job):
                            lose_node(pod.proc)
                            code = pod.proc.returncode
                        if code is not None:
                            pod.phase, pod.exit_code, pod.ended_at, pod.ready = "Failed", code, now, False

    def _probe(self, pod: Pod, now: float) -> None:
        """The kubelet's readiness probe (the template's ``readinessProbe.httpGet``, its
        ``periodSeconds``); without a probe a started container is Ready."""
        if pod.probe_url is None:
            if not pod.ready:
                pod.ready, pod.ready_at = True, now
            return
        if now < pod.next_probe_at:
            return
        probe = pod.job.spec["template"]["spec"]["containers"][0]["readinessProbe"]
        pod.next_probe_at = now + float(probe.get("periodSeconds", 10))
        try:
            with urllib.request.urlopen(pod.probe_url, timeout=float(probe.get("timeoutSeconds", 1))) as reply:
                ok = 200 <= reply.status < 400
        except Exception:
            ok = False
        if ok and not pod.ready:
            pod.ready_at = now
            self.events.append(Event(now, "pod-ready", pod.job.scaled_job.name, pod.job.name, {"pod": pod.name}))
        pod.ready = ok

    # -- starting a pod: the container as the kubelet would run it -----------------------

    def _start_pod(self, pod: Pod, now: float) -> None:
        job = pod.job
        pod_spec = job.spec["template"]["spec"]
        container = pod_spec["containers"][0]
        self._nodes += 1
        pod.node = f"sim-node-{pod.pool or 'system'}-{self._nodes}"
        pod_dir = self.work_dir / "pods" / pod.name
        pod_dir.mkdir(parents=True)
        mounts = self._mounts(pod_spec, container, pod_dir)
        ports = {int(p["containerPort"]): free_port() for p in container.get("ports", [])}
        port_names = {p["name"]: int(p["containerPort"]) for p in container.get("ports", []) if "name" in p}

        def local(value: str) -> str:
            for mount_path, local_dir in mounts:
                if value == mount_path or value.startswith(mount_path.rstrip("/") + "/"):
                    return str(local_dir) + value[len(mount_path.rstrip("/")):]
            if value.isdigit() and int(value) in ports:
                return str(ports[int(value)])
            return value

        env: dict[str, str] = {}
        if job.spec.get("completionMode") == "Indexed":
            env["JOB_COMPLETION_INDEX"] = str(pod.index)
        for var in container.get("env", []):
            if "value" in var:
                value = expand(var["value"], env)
            elif "fieldRef" in var.get("valueFrom", {}):
                value = field_ref(var["valueFrom"]["fieldRef"]["fieldPath"], pod)
            elif "secretKeyRef" in var.get("valueFrom", {}):
                ref = var["valueFrom"]["secretKeyRef"]
                value = self.secrets[ref["name"]][ref["key"]]
            elif "configMapKeyRef" in var.get("valueFrom", {}):
                ref = var["valueFrom"]["configMapKeyRef"]
                value = self.config_maps[ref["name"]][ref["key"]]
            else:
                raise ValueError(f"env {var['name']}: {var.get('valueFrom')} is not simulated")
            env[var["name"]] = local(value)
        env.update(self.extra_env)
        command = [sys.executable if part == "python" else part for part in container["command"]]
        args = [local(expand(a, env)) for a in container.get("args", [])]
        base = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(pod_dir), "LANG": "C.UTF-8",
                "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
        probe = container.get("readinessProbe", {}).get("httpGet")
        if probe:
            port = probe["port"]
            port = port_names[port] if isinstance(port, str) else int(port)
            pod.probe_url = f"http://127.0.0.1:{ports[port]}{probe.get('path', '/')}"
            pod.next_probe_at = now + float(container["readinessProbe"].get("initialDelaySeconds", 0))
        pod.log_path = pod_dir / "log.txt"
        with open(pod.log_path, "wb") as log:
            pod.proc = subprocess.Popen(command + args, env=child_env({**base, **env}), stdout=log,
                                        stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=pod_dir,
                                        start_new_session=True)
        pod.phase, pod.started_at = "Running", now
        self.events.append(Event(now, "pod-started", job.scaled_job.name, job.name,
                                 {"pod": pod.name, "index": pod.index, "pool": pod.pool, "gpus": pod.gpus}))

    def _mounts(self, pod_spec: dict, container: dict, pod_dir: Path) -> list[tuple[str, Path]]:
        volumes = {v["name"]: v for v in pod_spec.get("volumes", [])}
        out = []
        for mount in container.get("volumeMounts", []):
            volume = volumes[mount["name"]]
            if "persistentVolumeClaim" in volume:
                local = self.shared_root
            elif "secret" in volume:
                local = pod_dir / "volumes" / mount["name"]
                local.mkdir(parents=True)
                data = self.secrets[volume["secret"]["secretName"]]
                items = volume["secret"].get("items") or [{"key": k, "path": k} for k in data]
                for item in items:
                    (local / item["path"]).write_text(data[item["key"]])
            else:  # emptyDir
                local = pod_dir / "volumes" / mount["name"]
                local.mkdir(parents=True)
            out.append((mount["mountPath"], local))
        return sorted(out, key=lambda m: -len(m[0]))  # the deepest mount wins

    # -- what the tests look at ---------------------------------------------------------

    def _record_bounds(self) -> None:
        gpus: dict[str, int] = {}
        for sj in self.scaled_jobs:
            self.max_unfinished[sj.name] = max(self.max_unfinished[sj.name], len(sj.unfinished()))
            for job in sj.jobs:
                for pod in job.pods:
                    if pod.phase == "Running":
                        gpus[sj.namespace] = gpus.get(sj.namespace, 0) + pod.gpus
        for ns, n in gpus.items():
            self.max_gpus[ns] = max(self.max_gpus.get(ns, 0), n)

    def unfinished_jobs(self) -> int:
        with self.lock:
            return sum(len(sj.unfinished()) for sj in self.scaled_jobs)

    def live_pods(self) -> list[Pod]:
        with self.lock:
            return [p for sj in self.scaled_jobs for j in sj.jobs for p in j.pods if p.phase in ("Pending", "Running")]

    def all_pods(self) -> list[Pod]:
        """Every pod of every Job the ScaledJobs ever created (history-limit clean-up included)."""
        with self.lock:
            return [p for j in self.created for p in j.pods]

    def pod_named(self, name: str) -> Pod | None:
        return next((p for p in self.all_pods() if p.name == name), None)

    def drain_node_of(self, pod: Pod) -> float:
        """The pod's node is drained (Karpenter on a spot notice): the pod gets a DisruptionTarget condition and is
        deleted (SIGTERM, SIGKILL after the grace) while its Job goes on. Its index is replaced once the pod is
        terminal, or at once under ``podReplacementPolicy: TerminatingOrFailed`` (:func:`replaces_terminating`).
        Returns the time of the SIGTERM."""
        with self.lock:
            at = time.time()
            pod.disrupted = pod.drained = True
            pod.deleting_since = at
            pod.proc.send_signal(signal.SIGTERM)
            if replaces_terminating(pod.job.spec):
                pod.job.retry_at[pod.index] = at
            self.events.append(Event(at, "pod-drained", pod.job.scaled_job.name, pod.job.name, {"pod": pod.name}))
            return at

    def lose_node_of(self, pod: Pod) -> float:
        """The pod's node is lost: SIGKILL the worker and everything under it; the pod gets a
        DisruptionTarget condition (podFailurePolicy's Ignore rule). Returns the time of the kill."""
        with self.lock:
            pod.disrupted = True
            at = lose_node(pod.proc)
            self.events.append(Event(at, "pod-lost", pod.job.scaled_job.name, pod.job.name, {"pod": pod.name}))
            return at

    def describe(self) -> str:
        """One line per ScaledJob: its Jobs and pods, for timeout messages."""
        with self.lock:
            lines = []
            for sj in self.scaled_jobs:
                jobs = ", ".join(f"{j.name}[{j.condition or 'active'}: " +
                                 " ".join(f"{p.index}:{p.phase}{'/R' if p.ready else ''}" for p in j.pods) + "]"
                                 for j in sj.jobs[-6:])
                lines.append(f"{sj.name}: {len(sj.unfinished())} unfinished; {jobs or 'no Jobs'}")
            if self.errors:
                lines.append(f"loop errors ({len(self.errors)}), the first: {self.errors[0]}")
            return "\n".join(lines)


# -- the harness: Redis, the keeper, the cluster, the runs -----------------------------------

def set_flag(args: list[str], flag: str, value: str) -> list[str]:
    """``args`` with ``flag``'s value set to ``value`` (appended when absent)."""
    out = list(args)
    if flag in out:
        out[out.index(flag) + 1] = value
    else:
        out += [flag, value]
    return out


def localize(manifest: dict, settings: Settings) -> dict:
    """A ScaledJob as the simulation runs it: its ``pollingInterval`` and the worker's timing flags
    from ``settings`` (:class:`Settings`), the GPU health check off (no GPU here). Nothing else changes."""
    out = json.loads(json.dumps(manifest))
    out["spec"]["pollingInterval"] = int(settings.polling_interval_s)
    container = out["spec"]["jobTargetRef"]["template"]["spec"]["containers"][0]
    args = container.get("args", [])
    for flag, value in (("--lease-seconds", settings.lease_s), ("--idle-exit-seconds", settings.idle_exit_s),
                        ("--poll-seconds", settings.worker_poll_s), ("--health-check-timeout-seconds", 0),
                        ("--gang-deadline-seconds", settings.gang_deadline_s),
                        ("--backoff-base-seconds", settings.backoff_s), ("--backoff-max-seconds", settings.backoff_s)):
        args = set_flag(args, flag, f"{value:g}")
    container["args"] = args
    return out


@dataclass
class Submitted:
    run_id: str
    namespace: str
    """The queue namespace (Redis key prefix) it went to."""
    submitted_at: float
    nodes: int = 1
    lane: Any = None
    """Its lane (contract/lanes.py ``Lane``): the ScaledJob that starts Jobs for it."""


@dataclass
class Stack:
    """What the simulation takes from a plan (:func:`stack_from_plan`)."""

    scaled_jobs: list[dict]
    keeper: dict | None
    """The keeper Deployment (None: the plan has none)."""
    gpu_capacity: dict[str, int]
    """Pool -> its NodePool's ``limits`` of GPUs (what Karpenter may bring up)."""
    gpu_quotas: dict[str, int]
    """Namespace -> its ResourceQuota's ``requests.nvidia.com/gpu``."""
    redis_config: str
    """The ConfigMap the workers' ``REDIS_URL`` and required replicas come from (the password is a file of the
    connection Secret, infra/queue_redis.py ``CONNECTION_SECRET``)."""
    kueue_objects: list[dict] = field(default_factory=list)
    """The plan's Kueue objects (ClusterQueues, Cohorts, LocalQueues, WorkloadPriorityClasses): what
    :class:`bench.kueue_gate.KueueGate` admits by when the simulation runs with ``kueue=True``."""

    def queue_namespaces(self) -> list[str]:
        return sorted({queue_namespace(m) for m in self.scaled_jobs})


class Simulation:
    """Redis (with a password, as the connection Secret gives it), the keeper Deployment and a
    :class:`Cluster` running the stack's ScaledJobs. A context manager."""

    def __init__(self, work_dir: Path, stack: Stack, settings: Settings = Settings(),
                 node_delay: Callable[[Pod], float] | None = None, *, kueue: bool = False,
                 fair_sharing: bool = False, on_evict: Callable[["Eviction"], None] | None = None) -> None:
        """``kueue``: Jobs go through Kueue (:mod:`bench.kueue_gate`: the stack's Kueue objects, its fair
        sharing when ``fair_sharing``); ``on_evict`` is called with each eviction as it is issued."""
        self.kueue, self.fair_sharing, self.on_evict = kueue, fair_sharing, on_evict
        self.work_dir = work_dir
        self.node_delay = node_delay
        self.settings = settings
        self.stack = stack
        self.manifests = [localize(m, settings) for m in stack.scaled_jobs]
        self.shared_root = work_dir / "shared"
        self.server: LocalRedisServer | None = None
        self.cluster: Cluster | None = None
        self.keeper: Job | None = None
        self.client = None
        self.submitted: dict[str, Submitted] = {}
        self._queues: dict[str, Any] = {}

    def __enter__(self) -> "Simulation":
        from infra.queue_redis import REQUIRED_REPLICAS_KEY, URL_KEY
        from tests.support.worker_child import worker_env

        shutil.rmtree(self.work_dir, ignore_errors=True)
        (self.shared_root / "runs").mkdir(parents=True)
        password = _suffix(24)
        self.server = LocalRedisServer(data_dir=self.work_dir / "redis", password=password).start()
        self.client = self.server.client()
        try:
            gate = None
            if self.kueue:
                from bench.kueue_gate import KueueGate

                if not self.stack.kueue_objects:
                    raise ValueError("kueue=True but the plan declares no Kueue objects")
                gate = KueueGate(self.stack.kueue_objects, fair_sharing=self.fair_sharing, on_evict=self.on_evict)
            self.cluster = Cluster(
                self.manifests, redis_client=self.client, secrets=self._secrets(password),
                config_maps={self.stack.redis_config: {URL_KEY: self.server.url, REQUIRED_REPLICAS_KEY: "0"}},
                shared_root=self.shared_root, work_dir=self.work_dir, settings=self.settings, kueue=gate,
                gpu_capacity=self.stack.gpu_capacity, gpu_quotas=self.stack.gpu_quotas,
                extra_env={**worker_env(command=["sh", "-c", WORKLOAD]),
                           "SIM_STEP_S": f"{self.settings.step_s:g}"}, node_delay=self.node_delay)
            if self.stack.keeper is not None:
                self.keeper = self.cluster.run_deployment(
                    self.stack.keeper, {"--interval-seconds": f"{self.settings.keeper_interval_s:g}"})
            self.cluster.start()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def _secrets(self, password: str) -> dict[str, dict[str, str]]:
        """The queue's connection Secret as infra's holds it (the password) for this Redis; any other Secret a
        template names (the Ray token) gets random values."""
        from infra.queue_redis import CONNECTION_SECRET

        secrets: dict[str, dict[str, str]] = collections.defaultdict(lambda: collections.defaultdict(lambda: _suffix(24)))
        secrets[CONNECTION_SECRET] = {"password": password}
        return secrets

    def __exit__(self, *exc) -> None:
        if self.cluster is not None:
            self.cluster.stop()
            with open(self.work_dir / "events.jsonl", "w") as fh:  # the timeline, for a look afterwards
                for e in self.cluster.events:
                    fh.write(json.dumps({"at": e.at, "kind": e.kind, "scaled_job": e.scaled_job, "job": e.job,
                                         **e.detail}) + "\n")
        if self.client is not None:
            self.client.close()
        for queue in self._queues.values():
            queue.client.close()
        if self.server is not None:
            self.server.stop()

    # -- runs --------------------------------------------------------------------------

    def queue(self, namespace: str):
        from training.scheduler.run_queue import TaskQueue

        if namespace not in self._queues:
            self._queues[namespace] = TaskQueue(self.server.client(), namespace=namespace,
                                                lease_seconds=self.settings.lease_s)
        return self._queues[namespace]

    def submit(self, namespace: str, run_id: str, *, max_steps: int = 4, fail_attempts: Iterable[int] = (),
               **fields: Any) -> Submitted:
        """Submit a run (validated like ``ragpool submit``) whose workload takes ``max_steps`` steps
        and fails on the attempts ``fail_attempts``."""
        from contract.lanes import lane_of
        from training.scheduler.spec import parse_spec

        raw = {"run_id": run_id, "stages": ["retriever"], "hyperparameters": {"retriever": {"max_steps": max_steps}},
               **fields}
        spec = parse_spec(raw, shared_root=str(self.shared_root))
        for attempt in fail_attempts:
            run_dir = self.shared_root / "runs" / run_id
            run_dir.mkdir(parents=True, exist_ok=True)
            (run_dir / f"sim-fail-attempt-{attempt}").touch()
        at = time.time()
        result = self.queue(namespace).submit(spec)
        if not result.created:
            raise ValueError(f"run {run_id} already existed in {namespace}")
        self.submitted[run_id] = Submitted(run_id, namespace, at, spec.nodes,
                                          lane_of(spec.executor, spec.nodes, spec.pool))
        return self.submitted[run_id]

    def exit_with(self, run_id: str, code: int | None) -> None:
        """From now on every execution of ``run_id`` exits ``code`` at once (None: runs normally again)."""
        path = self.shared_root / "runs" / run_id / "sim-exit"
        if code is None:
            path.unlink(missing_ok=True)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(f"{code}\n")

    def info(self, run_id: str):
        return self.queue(self.submitted[run_id].namespace).get(run_id)

    def states(self) -> dict[str, str]:
        return {run_id: (self.info(run_id).state if self.info(run_id) else "missing") for run_id in self.submitted}

    def run_log(self, run_id: str) -> list[str]:
        path = self.shared_root / "runs" / run_id / "sim-log"
        return path.read_text().splitlines() if path.is_file() else []

    def executions(self, run_id: str, node: int = 0) -> int:
        """How many times the run's workload ran to its end on ``node``."""
        path = self.shared_root / "runs" / run_id / f"sim-done-{node}"
        return len(path.read_text().splitlines()) if path.is_file() else 0

    def checkpoint(self, run_id: str, node: int = 0) -> int:
        path = self.shared_root / "runs" / run_id / f"sim-ckpt-{node}"
        try:
            return int(path.read_text().strip() or 0)
        except (OSError, ValueError):
            return 0

    def seen(self) -> str:
        """What the cluster and the runs look like now (for timeout messages)."""
        states: dict[str, list[str]] = {}
        for run_id, state in self.states().items():
            states.setdefault(state, []).append(run_id)
        summary = "; ".join(f"{state}: {len(ids)} ({', '.join(sorted(ids)[:5])})" for state, ids in sorted(states.items()))
        keeper = self.keeper.pods[-1] if self.keeper and self.keeper.pods else None
        keeper_state = f"{keeper.phase} (exits: {len(self.keeper.pods) - 1})" if keeper else "none"
        return f"runs: {summary}\nkeeper: {keeper_state}\n{self.cluster.describe()}"

    def wait_for(self, predicate: Callable[[], Any], timeout_s: float, what: str) -> Any:
        """``bench.recovery.wait_until``, failing at once when the cluster's loop has failed."""
        def check():
            if self.cluster.errors:
                raise RuntimeError(f"the simulated cluster failed while waiting for {what}:\n{self.seen()}")
            return predicate()
        return wait_until(check, timeout_s, what, poll_s=0.1, seen=self.seen)

    def all_done(self) -> bool:
        return all(state == "succeeded" for state in self.states().values())

    def settle(self, timeout_s: float) -> None:
        """Wait until every submitted run succeeded and no Job is left unfinished."""
        self.wait_for(self.all_done, timeout_s, "every run to succeed")
        self.wait_for(lambda: self.cluster.unfinished_jobs() == 0, timeout_s,
                      "every Job to finish (workers exit after idle-exit)")

    # -- figures -----------------------------------------------------------------------

    def claimer_pods(self, run_id: str) -> list[str]:
        """Pods (worker ids) that ran the run's workload, in order."""
        return [line.split(" worker ", 1)[1].split()[0] for line in self.run_log(run_id) if " worker " in line]

    def figures(self, run_ids: Iterable[str] | None = None) -> dict[str, Any]:
        """The bench's figures over ``run_ids`` (default every run) and every Job so far."""
        run_ids = list(run_ids or self.submitted)
        pods = {p.name: p for p in self.cluster.all_pods()}
        busy_by_job = {}
        lost = double = 0
        for run_id in run_ids:
            info = self.info(run_id)
            if info is None or info.state != "succeeded":
                lost += 1
            nodes = self.submitted[run_id].nodes
            if info is not None and (info.completions > 1 or any(self.executions(run_id, n) > 1 for n in range(nodes))):
                double += 1
            claimers = self.claimer_pods(run_id)
            if info is not None and info.claimed_at and info.finished_at and claimers and claimers[-1] in pods:
                job = pods[claimers[-1]].job
                busy_by_job[job.name] = busy_by_job.get(job.name, 0.0) + (info.finished_at - info.claimed_at)
        jobs = list(self.cluster.created)
        claimed_jobs = {pods[c].job.name for r in self.submitted for c in self.claimer_pods(r) if c in pods}
        surplus = [j for j in jobs if j.name not in claimed_jobs]
        now = time.time()
        worker_s = sum(((p.ended_at or now) - p.started_at) for p in pods.values() if p.started_at is not None)
        busy_s = sum(busy * len([p for p in pods.values() if p.job.name == name and p.started_at is not None])
                     for name, busy in busy_by_job.items())
        to_job, capacity_wait = self.job_delays(run_ids)
        return {
            "submit_to_job_p95_s": round(_percentile(to_job, 95), 2) if to_job else None,
            "capacity_wait_p95_s": round(_percentile(capacity_wait, 95), 2) if capacity_wait else None,
            "runs_that_waited_for_capacity": len(capacity_wait),
            "idle_worker_s_per_run": round(max(0.0, worker_s - busy_s) / max(1, len(run_ids)), 2),
            "surplus_jobs": len(surplus),
            # Of which: Jobs whose pods waited for a node (NodePool limit, quota) while running workers
            # took the runs they were created for.
            "surplus_jobs_that_waited_for_a_node": sum(
                1 for j in surplus if not j.pods or j.pods[0].started_at is None
                or j.pods[0].started_at - j.created_at > NODE_WAIT_S),
            "jobs_created": len(jobs),
            "lost_runs": lost,
            "double_runs": double,
        }


    def job_delays(self, run_ids: list[str]) -> tuple[list[float], list[float]]:
        """Submit -> the Job KEDA created for it, per run, split in (runs whose lane had room,
        runs that waited because their lane was at ``maxReplicaCount``).

        KEDA starts Jobs for a count of queued runs, not for a run by name, so per ScaledJob the
        k-th run submitted to its lanes is matched with the k-th Job it created from the first
        of those submits on, whichever run that Job's worker took (a Job is one run). A run
        waited for capacity when a poll between its submit and its Job's creation left the
        ScaledJob at ``maxReplicaCount``. A run with no Job of its own (fewer Jobs than runs)
        counts as waiting until now, never as 0 s."""
        now = time.time()
        to_job: list[float] = []
        capacity_wait: list[float] = []
        for sj in self.cluster.scaled_jobs:
            lanes = set(lanes_of(sj.manifest))
            runs = sorted((self.submitted[r] for r in run_ids if self.submitted[r].lane in lanes),
                          key=lambda s: s.submitted_at)
            if not runs:
                continue
            jobs = sorted((j for j in self.cluster.created if j.scaled_job is sj and j.created_at >= runs[0].submitted_at),
                          key=lambda j: j.created_at)
            for k, run in enumerate(runs):
                created = jobs[k].created_at if k < len(jobs) else now
                delay = created - run.submitted_at
                waited = any(run.submitted_at <= at < created for at in sj.at_max)
                (capacity_wait if waited else to_job).append(delay)
        return to_job, capacity_wait


def _percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile."""
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * q // 100))
    return ordered[int(rank) - 1]


SCALED_JOB_TYPE = "kubernetes:keda.sh/v1alpha1:ScaledJob"
"""The Pulumi type of a ScaledJob in ``ragpool plan``'s output."""
KUEUE_TYPE_PREFIX = "kubernetes:kueue.x-k8s.io/v1beta2:"
"""The Pulumi types of Kueue's objects in ``ragpool plan``'s output."""


def stack_from_plan(plan: dict, namespace: str | None = None) -> Stack:
    """The ScaledJobs (of Kubernetes namespace ``namespace`` only, when given), the keeper, the
    NodePools' GPU limits and the namespaces' GPU quotas of an offline plan."""
    def objects(kind: str) -> list[dict]:
        return [r["inputs"] for r in plan["resources"] if r["type"].endswith(kind)]

    scaled_jobs = scaled_jobs_from_plan(plan, namespace)
    keepers = [d for d in objects(":apps/v1:Deployment")
               if d["spec"]["template"]["spec"]["containers"][0].get("command", [])[-1:] == ["training.scheduler.keeper"]]
    capacity = {}
    for pool in objects(":karpenter.sh/v1:NodePool"):
        label = pool["spec"]["template"]["metadata"].get("labels", {}).get(POOL_LABEL)
        limit = (pool["spec"].get("limits") or {}).get(GPU_RESOURCE)
        if label and limit is not None:
            capacity[label] = int(limit)
    quotas = {q["metadata"]["namespace"]: int(q["spec"]["hard"][f"requests.{GPU_RESOURCE}"])
              for q in objects(":core/v1:ResourceQuota") if f"requests.{GPU_RESOURCE}" in q["spec"].get("hard", {})}
    container = scaled_jobs[0]["spec"]["jobTargetRef"]["template"]["spec"]["containers"][0]
    [config] = [e["valueFrom"]["configMapKeyRef"]["name"] for e in container["env"] if e["name"] == REDIS_URL_ENV]
    kueue_objects = [r["inputs"] for r in plan["resources"] if r["type"].startswith(KUEUE_TYPE_PREFIX)]
    return Stack(scaled_jobs=scaled_jobs, keeper=keepers[0] if keepers else None, gpu_capacity=capacity,
                 gpu_quotas=quotas, redis_config=config, kueue_objects=kueue_objects)


def scaled_jobs_from_plan(plan: dict, namespace: str | None = None) -> list[dict]:
    """The ScaledJob objects of an offline plan (``infra.plan.plan``: what ``pulumi up`` would
    apply), those of Kubernetes namespace ``namespace`` only when given."""
    out = [r["inputs"] for r in plan["resources"] if r["type"] == SCALED_JOB_TYPE]
    if namespace is not None:
        out = [m for m in out if m["metadata"].get("namespace") == namespace]
    if not out:
        raise ValueError(f"the plan declares no ScaledJob{' in ' + namespace if namespace else ''}")
    return out


def job_labels(manifest: dict) -> dict[str, str]:
    """The labels KEDA gives each Job of the ScaledJob ``manifest``: its own (less ``app.kubernetes.io/version``, the
    operator's), then the ScaledJob's labels but
    those its excluded-labels annotation lists (kedacore/keda v2.20.2 pkg/scaling/executor/scale_jobs.go
    ``generateJobs``: the annotation split on commas, untrimmed)."""
    from contract.names import KEDA_EXCLUDED_LABELS

    meta = manifest.get("metadata", {})
    name = meta.get("name", "")
    excluded = set((meta.get("annotations") or {}).get(KEDA_EXCLUDED_LABELS, "").split(","))
    return {"app.kubernetes.io/name": name, "app.kubernetes.io/part-of": name,
            "app.kubernetes.io/managed-by": "keda-operator", "scaledjob.keda.sh/name": name,
            **{k: v for k, v in (meta.get("labels") or {}).items() if k not in excluded}}


def container_env(manifest: dict, name: str) -> str | None:
    """The literal value of env ``name`` in a ScaledJob's worker container, or None."""
    container = manifest["spec"]["jobTargetRef"]["template"]["spec"]["containers"][0]
    return next((e.get("value") for e in container.get("env", []) if e["name"] == name), None)


def queue_namespace(manifest: dict) -> str:
    """The queue key namespace a ScaledJob's workers claim from (their ``RAGPOOL_QUEUE_NAMESPACE``)."""
    from contract.env import NAMESPACE_ENV

    value = container_env(manifest, NAMESPACE_ENV)
    if not value:
        raise ValueError(f"ScaledJob {manifest['metadata']['name']}: no {NAMESPACE_ENV} in its worker")
    return value


def lanes_of(manifest: dict):
    """The lanes a ScaledJob's workers claim (their ``RAGPOOL_LANES``)."""
    from contract.lanes import LANES_ENV, parse_lanes

    return parse_lanes(container_env(manifest, LANES_ENV) or "")
