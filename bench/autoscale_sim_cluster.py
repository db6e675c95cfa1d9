"""The cluster the from-zero simulation (bench/autoscale_sim.py) runs on (:class:`Cluster`): KEDA's ScaledJob
loop (:mod:`bench.keda_scaledjob`'s job-count algorithm over the Redis lists, the history clean-up) and a fake
Job controller whose pods are local processes (bench/autoscale_sim_kubelet.py), on a loop of its own.

- Nodes: a pod starts at once (a node is there) unless its pool (the pod's
  ``ragpool.io/pool`` node selector) would then run more GPUs than ``gpu_capacity`` (the
  NodePool's ``limits``, or less to make nodes scarce); then it stays Pending, as when
  Karpenter cannot get a node. ``node_delay(pod)``, when given, keeps a pod Pending that many
  seconds after it was created: its node comes late (a cold pool), or never. A node is drained
  (:meth:`Cluster.drain_node_of`, a spot notice) or lost (:meth:`Cluster.lose_node_of`).
- ResourceQuota: a pod whose GPU request would take its namespace's non-terminal pods past
  ``requests.nvidia.com/gpu`` is not created; the Job controller tries again (1 s).
- Deployments (the keeper): one pod, restarted when it exits.
- Kueue, when given a :class:`bench.kueue_gate.KueueGate`: a ScaledJob's Job is created suspended; once
  admitted all its pods are created at once; an evicted Job is suspended again and its pods deleted (SIGTERM,
  SIGKILL after the grace), its quota free once they are gone.
- The Job controller: Indexed Jobs of ``parallelism`` pods, restartPolicy Never, its rules on a failed pod
  (bench/autoscale_sim_jobs.py ``failed_pod_outcome``), ``activeDeadlineSeconds``; a Job whose every index
  succeeded is Complete.
"""

from __future__ import annotations

import json
import signal
import threading
import time
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable

from bench import autoscale_sim_kubelet as kubelet
from bench import keda_scaledjob as keda
from bench.autoscale_sim_jobs import (
    Event, Job, Pod, ScaledJob, failed_pod_outcome, random_suffix, replaces_terminating,
)
from bench.autoscale_sim_plan import Settings, job_labels, set_flag
from bench.recovery import lose_node
from contract.names import GPU_RESOURCE, POOL_LABEL

if TYPE_CHECKING:
    from bench.kueue_gate import KueueGate

KUEUE_CYCLES_PER_TICK = 50
"""Most Kueue scheduling cycles per tick of the fake controller (each admits at most one Workload per
ClusterQueue; Kueue runs the next cycle at once after a successful one)."""


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
        job = Job(scaled_job=sj, name=f"{sj.name}-{random_suffix()}", created_at=now, spec=spec,
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
        pod = Pod(job=job, index=index, name=f"{job.name}-{index}-{random_suffix()}", labels=labels,
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
        """The kubelet's readiness probe (:func:`bench.autoscale_sim_kubelet.probe`)."""
        if kubelet.probe(pod, now):
            self.events.append(Event(now, "pod-ready", pod.job.scaled_job.name, pod.job.name, {"pod": pod.name}))

    # -- starting a pod: the container as the kubelet would run it -----------------------

    def _start_pod(self, pod: Pod, now: float) -> None:
        job = pod.job
        self._nodes += 1
        pod.node = f"sim-node-{pod.pool or 'system'}-{self._nodes}"
        pod_dir = self.work_dir / "pods" / pod.name
        pod_dir.mkdir(parents=True)
        kubelet.start_container(pod, now, pod_dir, secrets=self.secrets, config_maps=self.config_maps,
                                shared_root=self.shared_root, extra_env=self.extra_env)
        pod.phase, pod.started_at = "Running", now
        self.events.append(Event(now, "pod-started", job.scaled_job.name, job.name,
                                 {"pod": pod.name, "index": pod.index, "pool": pod.pool, "gpus": pod.gpus}))

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
