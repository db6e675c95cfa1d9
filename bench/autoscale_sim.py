"""A from-zero simulation of the worker pool: KEDA's ScaledJob loop drives a small fake Job
controller whose pods are real local ``python -m training.worker`` processes on a real
``redis-server``, with the real keeper (``python -m training.scheduler.keeper``).

What is real: the ScaledJob objects (built by infra, the same dicts ``pulumi up`` applies),
KEDA's job-count algorithm (:mod:`bench.keda_scaledjob`, transcribed from KEDA v2.20.2),
the exact command KEDA's Redis scaler sends for each trigger (``EVAL`` of its Lua script on the
trigger's ``listName``), the worker processes with the job template's command, args and
environment (``value``, ``fieldRef``, ``secretKeyRef``, ``configMapKeyRef``, ``$(VAR)`` expansion as the kubelet does),
their ``/ready`` endpoint as the readiness probe the template declares, the queue and the keeper.

What stands in for the cluster, by module:

- bench/autoscale_sim_cluster.py (:class:`bench.autoscale_sim_cluster.Cluster`): KEDA's ScaledJob loop, the Job
  controller, nodes (Karpenter-ish: NodePool GPU limits, late or lost nodes, spot drains), ResourceQuota, the keeper
  Deployment, and Kueue in front of the Job controller with ``Simulation(kueue=True)`` (:mod:`bench.kueue_gate` over
  the plan's ClusterQueues, Cohort and LocalQueues: Kueue v0.19.2's scheduler, transcribed).
- bench/autoscale_sim_jobs.py: the Job controller's objects and rules (``podFailurePolicy``, ``backoffLimit`` with
  the 10 s doubling pod back-off, ``backoffLimitPerIndex``/``maxFailedIndexes``, ``podReplacementPolicy``).
- bench/autoscale_sim_kubelet.py: a pod's container as a local process (env, mounts and ports made local) and its
  readiness probe.
- bench/autoscale_sim_plan.py: what is read from the offline plan (:func:`bench.autoscale_sim_plan.stack_from_plan`)
  and the simulation's timing (:class:`bench.autoscale_sim_plan.Settings`).

This module is the harness (:class:`Simulation`): Redis, the keeper, the cluster, the runs and the bench's figures.

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
  keeper's ``--interval-seconds`` are set from :class:`bench.autoscale_sim_plan.Settings`;
  the health check is off (no GPU here).

Every wait has a bound and says what it saw (:meth:`Simulation.wait_for`, ``bench.recovery.wait_until``).
"""

from __future__ import annotations

import collections
import json
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable

from bench.autoscale_sim_cluster import Cluster
from bench.autoscale_sim_jobs import Job, Pod, random_suffix
from bench.autoscale_sim_plan import Settings, Stack, lanes_of, localize
from bench.recovery import wait_until
from training.localdev.redis_server import LocalRedisServer

if TYPE_CHECKING:
    from bench.kueue_gate import Eviction

NODE_WAIT_S = 1.0
"""A Job whose first pod started later than this after the Job was created waited for a node."""

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


@dataclass
class Submitted:
    run_id: str
    namespace: str
    """The queue namespace (Redis key prefix) it went to."""
    submitted_at: float
    nodes: int = 1
    lane: Any = None
    """Its lane (contract/lanes.py ``Lane``): the ScaledJob that starts Jobs for it."""



class Simulation:
    """Redis (with a password, as the connection Secret gives it), the keeper Deployment and a
    :class:`bench.autoscale_sim_cluster.Cluster` running the stack's ScaledJobs. A context manager."""

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
        password = random_suffix(24)
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

        secrets: dict[str, dict[str, str]] = collections.defaultdict(
            lambda: collections.defaultdict(lambda: random_suffix(24)))
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
