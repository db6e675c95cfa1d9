"""Queue worker: the command of a GPU worker Job pod.

    python -m training.worker [--idle-exit-seconds 300] [--lease-seconds 60] [--metrics-port 9300]

(9300: ``QUEUE_METRICS_PORT``, contract/ports.py, the one home of ragpool's ports; off unless
``--metrics-port`` or ``RAGPOOL_QUEUE_METRICS_PORT`` sets it.) This module is the worker loop:
claiming, follower mode, heartbeats, supervision. The child it starts is built in
training/scheduler/child.py and what it records when the child ends is decided in
training/scheduler/outcome.py.

For each task it claims it validates the stored spec once, against this worker's shared root and
environment, writes the run's training config to ``<shared>/runs/<run_id>/run.yaml`` (every rank
only loads it) and runs the stages with torchrun over the pod::

    python -m torch.distributed.run --nnodes 1 --nproc-per-node G --max-restarts 0 --standalone \\
        -m training.pipeline --config <shared>/runs/<run_id>/run.yaml

(``G`` = the spec's ``gpus_per_node``, else the pod's CUDA device count, 1 on CPU.)
While the run goes it heartbeats the lease from a thread; on success it acks, on failure
it records the error (retry with backoff, dead-letter after ``max_attempts``; exit code 2
= bad config fails fast). A pending ``ragpool cancel`` stops the run at the next heartbeat.

SIGTERM (spot notice, eviction, scale-down): stop claiming, forward SIGTERM to torchrun
(which forwards it to the ranks so they checkpoint and exit with the retriable code),
wait up to ``--stop-grace-seconds``, then release the lease without spending an attempt
so another worker resumes from the checkpoint. torchrun itself exits 1 after a signal
whatever the ranks return, so any non-zero exit after *our* SIGTERM counts as
interrupted, not failed. A child that exits with the retriable code on its own is also
released. The worker exits 0 after ``--idle-exit-seconds`` with an empty queue (or
after ``--max-tasks``), and with the retriable code when SIGTERM interrupted a run.

Multi-node (an Indexed Job with ``completions = parallelism = N`` and a headless Service):
set ``RAGPOOL_NNODES=N``, ``RAGPOOL_WORKER_GROUP=<job name>`` and
``RAGPOOL_RDZV_HOST=<job>-0.<service>`` (the index-0 pod's DNS name); Kubernetes sets
``JOB_COMPLETION_INDEX``. Index 0 claims a run with ``nodes: N`` (optionally only
``RAGPOOL_RUN_ID``), publishes it under ``<ns>:group:<group>`` in Redis and owns the
lease; the other indices read that key and join with the same torchrun c10d rendezvous
(``--rdzv-endpoint <RAGPOOL_RDZV_HOST>:<RAGPOOL_RDZV_PORT> --rdzv-id <run>-a<attempt>
--rdzv-conf is_host=<index == 0>``).
Single-pod workers never claim multi-node runs.

Gang deadline: index 0 publishes the run as *gathering*; each other index joins
(``<ns>:group:<group>:joined``) and waits; only when all N-1 have joined does index 0 say *go*
and every pod start torchrun. If they have not all joined within ``--gang-deadline-seconds``
(env ``RAGPOOL_GANG_DEADLINE_SECONDS``, default 900: longer than a GPU node takes to come up)
index 0 marks the gang aborted, hands the run back WITHOUT spending an attempt, however often
it happens (``TaskQueue.release(kind=Release.GANG_TIMEOUT)``, counted in ``ragpool_gang_timeouts_total``
for an alert), and exits 0; a follower that sees the abort, or no run within the deadline,
exits 0 too. So a gang that cannot get N nodes holds no GPU longer than the deadline, and the
run waits in its lane for the next Job.

Readiness (Kubernetes): with a metrics port the worker also serves ``GET /ready``
(``exporter.READY_PATH``): 200 while it holds a claim (index 0 from its claim on; another
index once it has joined a gang) or when it has found its lanes empty and is exiting, 503
before (starting, health check, looking for a run) and between runs. A readiness probe on it
lets KEDA's ScaledJob ``pendingPodConditions: ["Ready"]`` count a started worker that has
not taken a run as pending, not as a Job that took one. Each worker also registers its lanes
and state (``TaskQueue.register_worker``; ``ragpool status`` reads them).

Environment: ``REDIS_URL``/``REDIS_PASSWORD``/``REDIS_PASSWORD_FILE`` (see
``training.scheduler.redis_conn``), ``RAGPOOL_SHARED_ROOT`` (default /mnt/shared),
``RAGPOOL_QUEUE_NAMESPACE`` (default ``ragpool``), ``RAGPOOL_WORKER_ID`` (default
``<hostname>-<pid>``), ``RAGPOOL_RUN_ID``, ``RAGPOOL_LANES`` (the lanes it claims, exactly:
lane names, comma-separated, see ``contract/lanes.py``; ``lanes.worker_env`` builds
it), else ``RAGPOOL_EXECUTORS`` (which runs it claims: ``torchrun``, the default, and/or
``ray``, from the unpinned lanes; a ray run is followed as a Ray job,
``python -m training.ray.job``, on the Ray cluster at ``RAY_ADDRESS``).

Test hooks (used only by tests; never set them in a Job): ``RAGPOOL_WORKER_TEST_COMMAND``
(a JSON list that replaces the whole torchrun command; ``{config}``, ``{run_id}``,
``{attempt}``, ``{node_index}`` are substituted) and ``RAGPOOL_WORKER_TEST_ENTRYPOINT``
(a script path torchrun runs instead of ``-m training.pipeline``).
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import TypeVar

from contract import exit_codes
from contract.defaults import DEFAULT_BACKOFF_BASE_S, DEFAULT_BACKOFF_MAX_S, DEFAULT_GANG_DEADLINE_S, DEFAULT_LEASE_S
from contract.env import (EXECUTORS_ENV, GANG_DEADLINE_ENV, METRICS_PORT_ENV, NNODES_ENV, RDZV_HOST_ENV, RDZV_PORT_ENV,
                          WORKER_GROUP_ENV, WORKER_ID_ENV)
from contract.paths import run_dir, shared_root_from_env
from contract.ports import RDZV_PORT
from training.scheduler.child import run_command, write_run_config
from contract.lanes import Lane, format_lanes, lanes_from_env
from training.scheduler.outcome import Action, ChildExit, Decision, Outcome, StopReason, decide, outcome_of
from training.scheduler.run_queue import Claim, Heartbeat, Key, Release, WorkerState, namespace_from_env
from contract.lanes import EXECUTORS
from training.scheduler.spec import RunSpec

__all__ = ["ChildExit", "Outcome", "StopReason", "Worker", "WorkerConfig", "build_arg_parser", "main", "worker_main"]

log = logging.getLogger("ragpool.worker")

OUTAGE_BACKOFF_BASE_S = 0.2
"""First wait after a temporary Redis error (doubles per consecutive failure, equal jitter)."""
OUTAGE_BACKOFF_CAP_S = 5.0
"""Longest wait between two tries while Redis is away: a returning primary is used within this."""

T = TypeVar("T")
STOPPED = object()
"""What :meth:`Worker._until_redis_answers` returns when the worker was told to stop during an outage."""


class Gang(StrEnum):
    """The ``state`` of a published multi-node group (a group without one is ``GO``: older workers)."""

    GATHERING = "gathering"
    """Index 0 holds the run and waits for the other indices to join."""
    GO = "go"
    """Every index joined: start torchrun."""
    ABORTED = "aborted"
    """Not all joined within the deadline: the run was handed back; every pod exits."""


GANG_POLL_S = 0.2
"""How often a gathering index 0, or a joined follower, looks at the gang."""
GANG_GO_MEMBER = "go"
"""Index 0 adds ``<task>-a<attempt>/go`` to the joined set when the gang forms (a follower that
polls after a short run already ended still knows it went)."""


def executors_from_env() -> tuple[str, ...]:
    """``$RAGPOOL_EXECUTORS`` split on commas (blanks dropped), default ``("torchrun",)``."""
    raw = os.environ.get(EXECUTORS_ENV, "")
    return tuple(e.strip() for e in raw.split(",") if e.strip()) or ("torchrun",)


def default_worker_id() -> str:
    return os.environ.get(WORKER_ID_ENV) or f"{socket.gethostname()}-{os.getpid()}"


@dataclass
class WorkerConfig:
    """How one worker process behaves."""

    worker_id: str = field(default_factory=default_worker_id)
    """Name in task hashes and the heartbeat metric."""
    namespace: str = field(default_factory=namespace_from_env)
    """Redis key prefix of the queue."""
    shared_root: str = field(default_factory=shared_root_from_env)
    """Where runs live (``runs/<run_id>/``): the EFS mount in pods."""
    lease_seconds: float = DEFAULT_LEASE_S
    """Lease length; a worker silent this long loses its task to the next claimer."""
    heartbeat_seconds: float | None = None
    """Heartbeat period; default a third of the lease."""
    idle_exit_seconds: float = 300.0
    """Exit after the queue stayed empty this long (0: exit at the first empty poll)."""
    poll_seconds: float = 1.0
    """Longest wait between claim attempts while idle (submits wake it sooner)."""
    stop_grace_seconds: float = 120.0
    """After forwarding SIGTERM/cancel, how long the run gets to checkpoint before SIGKILL."""
    backoff_base_s: float = DEFAULT_BACKOFF_BASE_S
    """First retry delay after a failed attempt; doubles each attempt."""
    backoff_max_s: float = DEFAULT_BACKOFF_MAX_S
    """Upper bound of the retry delay."""
    max_tasks: int = 0
    """Exit after this many tasks (0 = no limit)."""
    health_check_timeout_seconds: float = 0.0
    """Before claiming, run the node health check (``python -m training.components.health``,
    a subprocess) and give it this long; on failure exit HEALTH_CHECK_FAILED without claiming
    (training/scheduler/preflight.py). 0 = skip; the worker Job template turns it on."""
    metrics_port: int = field(default_factory=lambda: int(os.environ.get(METRICS_PORT_ENV) or 0))
    """Serve queue metrics on this port (0 = off; env RAGPOOL_QUEUE_METRICS_PORT).
    Also ``/ready``; the worker Jobs pass ``QUEUE_METRICS_PORT`` (9300, contract/ports.py)."""
    run_id: str | None = field(default_factory=lambda: os.environ.get("RAGPOOL_RUN_ID") or None)
    """Only claim this run (a Job dedicated to one run)."""
    nnodes: int = field(default_factory=lambda: int(os.environ.get(NNODES_ENV) or 1))
    """Pods in this worker's group (Indexed Job size); 1 for ordinary workers."""
    node_index: int = field(default_factory=lambda: int(os.environ.get("JOB_COMPLETION_INDEX") or 0))
    """This pod's index in the group (Kubernetes ``JOB_COMPLETION_INDEX``)."""
    group: str | None = field(default_factory=lambda: os.environ.get(WORKER_GROUP_ENV) or None)
    """Group name shared by the pods of one Indexed Job (the Job name)."""
    rdzv_host: str = field(default_factory=lambda: os.environ.get(RDZV_HOST_ENV) or "127.0.0.1")
    """Index-0 pod's DNS name (headless Service) for the torchrun c10d rendezvous."""
    rdzv_port: int = field(default_factory=lambda: int(os.environ.get(RDZV_PORT_ENV) or RDZV_PORT))
    """Rendezvous port on the index-0 pod."""
    executors: tuple[str, ...] = field(default_factory=lambda: executors_from_env())
    """Which runs this worker claims, by their spec's ``executor`` (``RAGPOOL_EXECUTORS``,
    comma-separated, default torchrun): the GPU pools' workers take ``torchrun`` runs, the
    CPU worker of the Ray template takes ``ray`` runs (run_queue.lane keeps them apart)."""
    lanes: tuple[Lane, ...] = ()
    """The lanes it claims, exactly (``RAGPOOL_LANES``, lane names, see contract/lanes.py);
    empty = from the environment, else the unpinned lanes of ``executors`` and ``nnodes``."""
    gang_deadline_seconds: float = field(
        default_factory=lambda: float(os.environ.get(GANG_DEADLINE_ENV) or DEFAULT_GANG_DEADLINE_S))
    """Multi-node: how long all pods of the gang get to join before it is given up (the run handed
    back without spending an attempt, every pod exits; env RAGPOOL_GANG_DEADLINE_SECONDS)."""
    test_command: list[str] | None = field(default_factory=lambda: _json_list_env("RAGPOOL_WORKER_TEST_COMMAND"))
    """TEST ONLY: replaces the whole torchrun command."""
    test_entrypoint: str | None = field(default_factory=lambda: os.environ.get("RAGPOOL_WORKER_TEST_ENTRYPOINT") or None)
    """TEST ONLY: a script torchrun runs instead of ``-m training.pipeline``."""

    def __post_init__(self) -> None:
        if self.lease_seconds <= 0:
            raise ValueError(f"lease_seconds must be > 0, got {self.lease_seconds}")
        if self.heartbeat_seconds is None:
            self.heartbeat_seconds = self.lease_seconds / 3
        if not 0 < self.heartbeat_seconds < self.lease_seconds:
            raise ValueError(f"heartbeat_seconds must be in (0, lease_seconds), got {self.heartbeat_seconds}")
        if self.nnodes < 1 or not 0 <= self.node_index < self.nnodes:
            raise ValueError(f"JOB_COMPLETION_INDEX={self.node_index} must be in [0, RAGPOOL_NNODES={self.nnodes})")
        if not self.gang_deadline_seconds > 0:
            raise ValueError(f"gang_deadline_seconds must be > 0, got {self.gang_deadline_seconds}")
        if self.nnodes > 1 and not self.group:
            raise ValueError("RAGPOOL_NNODES > 1 needs RAGPOOL_WORKER_GROUP (the Indexed Job's name)")
        unknown = [e for e in self.executors if e not in EXECUTORS]
        if unknown or not self.executors:
            raise ValueError(f"{EXECUTORS_ENV}={','.join(self.executors)!r}: each executor must be one of "
                             f"{', '.join(EXECUTORS)} (comma-separated)")
        if not self.lanes:
            self.lanes = lanes_from_env(self.executors, self.nnodes)
        lane_executors = tuple(dict.fromkeys(lane.executor for lane in self.lanes))
        if os.environ.get(EXECUTORS_ENV) and set(lane_executors) != set(self.executors):
            raise ValueError(f"{EXECUTORS_ENV}={','.join(self.executors)!r} disagrees with the lanes "
                             f"{format_lanes(self.lanes)!r}; set one of them")
        self.executors = lane_executors
        if self.nnodes > 1 and "ray" in self.executors:
            raise ValueError(f"{EXECUTORS_ENV} includes ray but RAGPOOL_NNODES={self.nnodes}: a ray run is one "
                             "Ray job submitted by a single-pod worker; multi-node Jobs run torchrun only")


def _json_list_env(name: str) -> list[str] | None:
    raw = os.environ.get(name)
    if not raw:
        return None
    value = json.loads(raw)
    if not isinstance(value, list) or not all(isinstance(x, str) for x in value):
        raise ValueError(f"{name} must be a JSON list of strings")
    return value


class Worker:
    """Claim → run → heartbeat → ack loop (see the module docstring)."""

    def __init__(self, queue, config: WorkerConfig) -> None:
        self.queue = queue
        self.config = config
        self.stopping = threading.Event()
        self.retriable_code = exit_codes.RETRIABLE
        self._child: subprocess.Popen | None = None
        # Re-entrant: the SIGTERM handler runs on the main thread, which may hold it.
        self._child_lock = threading.RLock()
        self._sigterm_sent_to: int | None = None
        self.tasks_done = 0
        self.ready = threading.Event()
        """Kubernetes readiness (``/ready``): set while it holds a claim or joined a gang, and when exiting."""
        self.ray_unavailable = False
        """A ray run's child exited UNAVAILABLE (Ray cluster unreachable or token refused): stop claiming."""

    # -- signals ---------------------------------------------------------------------------

    def install_signal_handlers(self) -> None:
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)

    def _on_signal(self, signum, _frame) -> None:
        log.info("worker %s: got %s, finishing up", self.config.worker_id, signal.Signals(signum).name)
        self.stopping.set()
        self._signal_child(signal.SIGTERM)

    def _signal_child(self, sig: int) -> None:
        with self._child_lock:
            child = self._child
        if child is not None and child.poll() is None:
            try:
                os.killpg(child.pid, sig)  # torchrun and anything else in its session
            except ProcessLookupError:
                return
            if sig == signal.SIGTERM:
                self._sigterm_sent_to = child.pid

    # -- main loop -------------------------------------------------------------------------

    def run(self) -> int:
        if self.config.metrics_port:
            from training.scheduler.exporter import start_queue_metrics_server

            start_queue_metrics_server(self.queue, self.config.metrics_port, ready=self.ready.is_set)
        try:
            if self.config.nnodes > 1 and self.config.node_index > 0:
                return self._run_follower()
            return self._run_claimer()
        finally:
            self.ready.set()  # exiting: never counted as a pending worker
            self._register(WorkerState.EXITING)

    def _register(self, state: WorkerState, run_id: str = "") -> None:
        """Best effort: record this worker's lanes and state (``ragpool status``, lane gauges)."""
        try:
            if state == WorkerState.EXITING:
                self.queue.unregister_worker(self.config.worker_id)
            else:
                self.queue.register_worker(self.config.worker_id, self.config.lanes, state, run_id)
        except Exception as exc:
            if not _is_redis_error(exc):
                raise

    def _run_claimer(self) -> int:
        self._register(WorkerState.WAITING)
        interrupted = False
        idle_since = time.monotonic()

        def claim_once(_again: bool) -> Claim | None:
            idle_left = self.config.idle_exit_seconds - (time.monotonic() - idle_since)
            return self.queue.claim(self.config.worker_id, run_id=self.config.run_id,
                                    nodes=self.config.nnodes, lanes=self.config.lanes,
                                    block_s=max(0.0, min(self.config.poll_seconds, idle_left)),
                                    poll_s=self.config.poll_seconds)

        while not self.stopping.is_set():
            if self.config.max_tasks and self.tasks_done >= self.config.max_tasks:
                break
            claim = self._until_redis_answers(claim_once, "queue unavailable")
            if claim is STOPPED:
                break
            if claim is None:
                if time.monotonic() - idle_since >= self.config.idle_exit_seconds:
                    log.info("worker %s: queue empty for %.0fs, exiting", self.config.worker_id,
                             self.config.idle_exit_seconds)
                    break
                continue
            self.ready.set()
            self._register(WorkerState.RUNNING, claim.task_id)
            outcome = self.run_task(claim)
            interrupted = outcome == Outcome.INTERRUPTED or interrupted
            if outcome == Outcome.GANG_TIMEOUT:
                log.warning("worker %s: the gang of %s did not form within %.0fs; exiting", self.config.worker_id,
                            claim.task_id, self.config.gang_deadline_seconds)
                break
            self.ready.clear()
            self._register(WorkerState.WAITING)
            if self.ray_unavailable:  # every ray run would fail the same way: leave them queued
                log.error("worker %s: the Ray cluster is unreachable or refuses this worker's token; "
                          "stopping", self.config.worker_id)
                return exit_codes.UNAVAILABLE
            self.tasks_done += 1
            idle_since = time.monotonic()
        return self.retriable_code if interrupted else 0

    def _run_follower(self) -> int:
        """Index > 0 of an Indexed Job: join whatever run index 0 publishes."""
        seen: tuple | None = None
        idle_since = time.monotonic()
        while not self.stopping.is_set():
            group = self._until_redis_answers(lambda _again: self.queue.read_group(self.config.group),
                                              "queue unavailable")
            if group is STOPPED:
                break
            key = (group["task_id"], group["attempt"]) if group else None
            if group and key != seen:
                seen = key
                state = group.get("state", Gang.GO)
                if state == Gang.ABORTED or (state == Gang.GATHERING and not self._join_gang(key)):
                    log.warning("worker %s (index %d): the gang of run %s did not form; exiting", self.config.worker_id,
                                self.config.node_index, key[0])
                    break
                self.ready.set()
                # Index 0 validated the spec when it claimed it and wrote its run.yaml: this pod only builds
                # its own torchrun command from it.
                spec = RunSpec.from_validated_json(group["spec_json"])
                cmd, env = self._command(spec, Path(group["config"]), group["attempt"])
                # Index 0 holds the lease and heartbeats it: this pod only runs its share.
                ended = self._supervise(cmd, env, run_id=spec.run_id, attempt=group["attempt"],
                                        timeout_s=spec.timeout_seconds, lease=None)
                log.info("worker %s (index %d): run %s exited %s", self.config.worker_id,
                         self.config.node_index, spec.run_id, ended.code)
                self.tasks_done += 1
                self.ready.clear()
                idle_since = time.monotonic()
                if self.config.max_tasks and self.tasks_done >= self.config.max_tasks:
                    break
                continue
            # Before its first run a follower waits no longer than the gang deadline: index 0 may
            # never come (its node could not be had), and this pod must not hold its GPUs forever.
            wait_limit = self.config.idle_exit_seconds
            if not self.tasks_done:
                wait_limit = min(wait_limit, self.config.gang_deadline_seconds)
            if time.monotonic() - idle_since >= wait_limit:
                break
            self.stopping.wait(min(self.config.poll_seconds, 0.5))
        return 0

    def _join_gang(self, key: tuple) -> bool:
        """Follower: join the gang index 0 is gathering for run ``key`` (task, attempt) and wait for
        its go; False when it aborts, disappears or the deadline passes (then this pod exits)."""
        cfg, q = self.config, self.queue
        ttl = int(cfg.lease_seconds * 2) + 1
        deadline = time.monotonic() + cfg.gang_deadline_seconds
        joined = False
        while not self.stopping.is_set() and time.monotonic() < deadline:
            try:
                if not joined:
                    q.join_group(cfg.group, _gang_member(key, cfg.node_index), ttl)
                    joined = True
                group = q.read_group(cfg.group)
            except Exception as exc:
                if not _is_redis_error(exc):
                    raise
                self.stopping.wait(GANG_POLL_S)
                continue
            if group and (group["task_id"], group["attempt"]) == key and group.get("state", Gang.GO) == Gang.GO:
                return True
            if not group or (group["task_id"], group["attempt"]) != key or group.get("state") == Gang.ABORTED:
                # Gone or replaced: it went (and maybe finished already) only if index 0 marked it so.
                try:
                    return _gang_member(key, GANG_GO_MEMBER) in q.group_members(cfg.group)
                except Exception as exc:
                    if not _is_redis_error(exc):
                        raise
                    return False
            self.stopping.wait(GANG_POLL_S)
        return False

    def _gather(self, claim: Claim, info: dict) -> Outcome | None:
        """Index 0: publish the run as gathering and wait until every other index joined (then
        publish go and return None), heartbeating the lease meanwhile. Otherwise record and return
        the outcome: GANG_TIMEOUT (handed back, no attempt spent), INTERRUPTED, CANCELLED or LOST."""
        cfg, q = self.config, self.queue
        ttl = int(cfg.lease_seconds * 2) + 1
        key = (claim.task_id, claim.attempt)
        wanted = {_gang_member(key, i) for i in range(1, cfg.nnodes)}
        q.reset_group_members(cfg.group)
        q.publish_group(cfg.group, claim, {**info, "state": Gang.GATHERING}, ttl_s=ttl)
        stop_heartbeat = threading.Event()
        verdict: dict[str, Heartbeat] = {}
        threading.Thread(target=self._heartbeat_loop, args=(claim, stop_heartbeat, verdict), daemon=True).start()
        deadline = time.monotonic() + cfg.gang_deadline_seconds
        try:
            while True:
                try:
                    if wanted <= q.group_members(cfg.group):
                        q.join_group(cfg.group, _gang_member(key, GANG_GO_MEMBER), ttl)
                        q.publish_group(cfg.group, claim, {**info, "state": Gang.GO}, ttl_s=ttl)
                        return None
                except Exception as exc:
                    if not _is_redis_error(exc):
                        raise
                if verdict.get("state") in (Heartbeat.CANCEL, Heartbeat.LOST) or self.stopping.is_set() \
                        or time.monotonic() > deadline:
                    break
                self.stopping.wait(GANG_POLL_S)
        finally:
            stop_heartbeat.set()
        q.publish_group(cfg.group, claim, {**info, "state": Gang.ABORTED}, ttl_s=ttl)
        if verdict.get("state") == Heartbeat.LOST:
            return Outcome.LOST
        if verdict.get("state") == Heartbeat.CANCEL:
            return self._keep_trying(claim, lambda again: Outcome(q.cancelled(claim)))
        if self.stopping.is_set():
            self._keep_trying(claim, lambda again: q.release(claim, "interrupted by worker shutdown (SIGTERM) "
                                                                     "while its gang gathered"))
            return Outcome.INTERRUPTED
        missing = sorted(wanted - q.group_members(cfg.group))
        reason = (f"gang timeout: {len(missing)} of {cfg.nnodes} pods did not join within "
                  f"{cfg.gang_deadline_seconds:.0f}s ({', '.join(m.rsplit('/', 1)[1] for m in missing)}); "
                  "handed back without spending an attempt")
        log.warning("run %s: %s", claim.task_id, reason)
        self._keep_trying(claim, lambda again: q.release(claim, reason, kind=Release.GANG_TIMEOUT))
        return Outcome.GANG_TIMEOUT

    # -- one task --------------------------------------------------------------------------

    def _command(self, spec: RunSpec, config_path: Path, attempt: int) -> tuple[list[str], dict[str, str]]:
        """This pod's child for one attempt (training/scheduler/child.py builds it)."""
        cfg = self.config
        return run_command(spec, config_path, attempt, shared_root=cfg.shared_root, node_index=cfg.node_index,
                           rdzv_host=cfg.rdzv_host, rdzv_port=cfg.rdzv_port, entrypoint=cfg.test_entrypoint,
                           test_command=cfg.test_command)

    def run_task(self, claim: Claim) -> Outcome:
        """Run one claimed task to an outcome; returns what was recorded."""
        q, cfg = self.queue, self.config
        try:
            # The one validation of this run on the worker: the spec, its training config (against this
            # worker's shared root), its parallelism and, for a ray run, this cluster's pools
            # (RAGPOOL_RAY_POOLS). The run.yaml written below is that validated config: ranks only load it.
            spec = RunSpec.from_json(claim.spec_json, shared_root=cfg.shared_root)
        except Exception as exc:  # a stored spec that no longer validates (allow-list or pools changed)
            error = f"stored run spec is invalid: {exc}"
            return self._keep_trying(claim, lambda again: Outcome(q.fail(claim, error, retriable=False)))
        log.info("worker %s: claimed %s (attempt %d/%d)", cfg.worker_id, spec.run_id, claim.attempt,
                 claim.max_attempts)
        try:
            config_path = write_run_config(spec, cfg.shared_root)
        except OSError as exc:
            error = f"cannot write run config under {cfg.shared_root}: {exc}"
            return self._keep_trying(claim, lambda again: Outcome(q.fail(claim, error)))
        cmd, env = self._command(spec, config_path, claim.attempt)
        if cfg.nnodes > 1:
            gathered = self._gather(claim, {"spec_json": claim.spec_json, "config": str(config_path)})
            if gathered is not None:
                return gathered
        try:
            ended = self._supervise(cmd, env, run_id=spec.run_id, attempt=claim.attempt,
                                    timeout_s=claim.timeout_s, lease=claim)
        finally:
            if cfg.nnodes > 1:
                try:
                    q.clear_group(cfg.group)
                except Exception as exc:  # the key expires on its own (ttl above)
                    if not _is_redis_error(exc):
                        raise
        return self._record(claim, ended, spec)

    def _record(self, claim: Claim, ended: ChildExit, spec: RunSpec) -> Outcome:
        """Record how the run ended: what :func:`outcome.decide` decides (see :meth:`_keep_trying`)."""
        decision = decide(ended, executor=spec.executor, timeout_s=claim.timeout_s)
        if decision.action == Action.NOTHING:
            log.warning("run %s: lease lost (reaped or taken over); not recording anything", claim.task_id)
        outcome = self._keep_trying(claim, lambda again: self._record_once(claim, decision, again=again),
                                    heartbeat=decision.action != Action.NOTHING)
        if decision.stop_claiming:  # e.g. the Ray cluster is away: every run of these lanes would fail alike
            self.ray_unavailable = True
        return outcome

    def _keep_trying(self, claim: Claim, record: Callable[[bool], T], *, heartbeat: bool = True) -> T:
        """``record(again)`` until Redis takes it: through an outage or failover of any length
        the worker keeps the outcome, retries with backoff (reconnecting each time, so a new
        primary is found) and heartbeats the lease meanwhile. ``again`` is True on repeats;
        the fenced scripts then decide whether the outcome still counts (an ack after the
        lease was reaped and the run went to another worker is refused). SIGTERM does not
        cut this short: the outcome is worth the grace period."""
        stop_heartbeat = threading.Event()

        def heartbeat_meanwhile() -> None:
            if heartbeat:
                threading.Thread(target=self._heartbeat_loop, args=(claim, stop_heartbeat, {}), daemon=True).start()

        try:
            return self._until_redis_answers(record, f"run {claim.task_id}: outcome not recorded yet",
                                             interruptible=False, on_outage=heartbeat_meanwhile)
        finally:
            stop_heartbeat.set()

    def _until_redis_answers(self, call: Callable[[bool], T], what: str, *, interruptible: bool = True,
                             on_outage: Callable[[], None] | None = None) -> T:
        """``call(again)`` until Redis answers it (``again``: True on repeats), the one retry of a
        temporary Redis error (restarting, failing over, demoted, unreachable:
        ``redis_conn.is_temporary_error``; any other error is raised). After each such error: log
        ``what``, drop the connections so the next command finds the primary again (Sentinel or
        DNS), and back off exponentially with jitter (``OUTAGE_BACKOFF_*``); ``on_outage`` runs at
        the first. ``interruptible``: a SIGTERM cuts the wait short and :data:`STOPPED` is returned."""
        from redis.backoff import EqualJitterBackoff

        failures = 0
        while True:
            try:
                return call(failures > 0)
            except Exception as exc:
                if not _is_redis_error(exc):
                    raise
                failures += 1
                if failures == 1 and on_outage is not None:
                    on_outage()
                delay = EqualJitterBackoff(cap=OUTAGE_BACKOFF_CAP_S, base=OUTAGE_BACKOFF_BASE_S).compute(failures)
                log.warning("worker %s: %s (%s: %s); retry %d in %.1fs", self.config.worker_id, what,
                            type(exc).__name__, exc, failures, delay)
                self.queue.reconnect()
                if not interruptible:
                    time.sleep(delay)
                elif self.stopping.wait(delay):
                    return STOPPED  # type: ignore[return-value]

    def _record_once(self, claim: Claim, decision: Decision, *, again: bool = False) -> Outcome:
        """Make the one queue call ``decision`` names; its :class:`Outcome` from the queue's reply."""
        q = self.queue
        if decision.action == Action.NOTHING:
            reply = None
        elif decision.action == Action.CANCELLED:
            reply = q.cancelled(claim)
        elif decision.action == Action.ACK:
            reply = q.ack(claim, again=again)
        elif decision.action == Action.RELEASE:
            reply = q.release(claim, decision.reason, kind=decision.release)
        else:
            reply = q.fail(claim, decision.reason, retriable=decision.retriable)
        return outcome_of(decision, reply)

    def _supervise(self, cmd: list[str], env: dict[str, str], *, run_id: str, attempt: int, timeout_s: float,
                   lease: Claim | None) -> ChildExit:
        """Run the child to its exit, enforcing timeout and shutdown. ``lease`` is the claim this
        pod holds: it is heartbeated, and a cancel or lost lease stops the child. A follower pod of
        a multi-node run passes None (index 0 holds the lease)."""
        cfg = self.config
        log_dir = run_dir(cfg.shared_root, run_id) / "logs"
        log_dir.mkdir(parents=True, exist_ok=True)
        log_path = log_dir / f"attempt-{attempt}-node-{cfg.node_index}.log"
        tail: collections.deque[str] = collections.deque(maxlen=40)
        with self._child_lock:
            if self.stopping.is_set() and lease is not None:
                return ChildExit(None, "", StopReason.SHUTDOWN)
            child = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True)
            self._child = child
        reader = threading.Thread(target=_pump, args=(child, log_path, tail), daemon=True)
        reader.start()
        stopped: StopReason | None = None
        stop_heartbeat = threading.Event()
        verdict: dict[str, Heartbeat] = {}
        if lease is not None:
            beat = threading.Thread(target=self._heartbeat_loop, args=(lease, stop_heartbeat, verdict), daemon=True)
            beat.start()
        deadline = time.monotonic() + timeout_s
        signalled_at: float | None = None
        try:
            while True:
                try:
                    code = child.wait(timeout=0.05)
                    break
                except subprocess.TimeoutExpired:
                    pass
                if not stopped:
                    if verdict.get("state") in (Heartbeat.CANCEL, Heartbeat.LOST):
                        stopped = StopReason.CANCEL if verdict["state"] == Heartbeat.CANCEL else StopReason.LOST
                    elif self.stopping.is_set():
                        stopped = StopReason.SHUTDOWN  # the signal handler already forwarded SIGTERM
                    elif time.monotonic() > deadline:
                        stopped = StopReason.TIMEOUT
                    if stopped:
                        # Once only: a second SIGTERM would cut torchrun's own shutdown short.
                        if self._sigterm_sent_to != child.pid:
                            self._signal_child(signal.SIGTERM)
                        signalled_at = time.monotonic()
                elif signalled_at is not None and time.monotonic() - signalled_at > cfg.stop_grace_seconds:
                    log.warning("run %s: no exit %.0fs after SIGTERM, killing", run_id, cfg.stop_grace_seconds)
                    self._signal_child(signal.SIGKILL)
                    signalled_at = None
        finally:
            stop_heartbeat.set()
            with self._child_lock:
                self._child = None
            reader.join(timeout=10)
        if not stopped and self.stopping.is_set() and code != 0:
            stopped = StopReason.SHUTDOWN
        if verdict.get("state") == Heartbeat.LOST:
            stopped = StopReason.LOST
        return ChildExit(code, "".join(tail), stopped)

    def _heartbeat_loop(self, claim: Claim, stop: threading.Event, verdict: dict[str, Heartbeat]) -> None:
        cfg = self.config
        while not stop.wait(cfg.heartbeat_seconds):
            try:
                state = self.queue.heartbeat(claim, cfg.worker_id)
                if cfg.nnodes > 1:
                    self.queue.client.expire(self.queue.key(Key.GROUP, cfg.group), int(cfg.lease_seconds * 2) + 1)
            except Exception as exc:
                if not _is_redis_error(exc):
                    raise
                log.warning("run %s: heartbeat failed (%s); retrying", claim.task_id, exc)
                continue
            if state in (Heartbeat.CANCEL, Heartbeat.LOST):
                verdict["state"] = state
                return


def _gang_member(key: tuple, index: int | str) -> str:
    """A pod's entry in its gang's joined set: ``<task>-a<attempt>/<index>``."""
    return f"{key[0]}-a{key[1]}/{index}"


def _pump(child: subprocess.Popen, log_path: Path, tail: collections.deque) -> None:
    """Copy the child's output to our stdout (pod logs), a per-attempt log file and a tail buffer."""
    with open(log_path, "a", encoding="utf-8", errors="replace") as log_file:
        for raw in iter(child.stdout.readline, b""):
            line = raw.decode("utf-8", errors="replace")
            tail.append(line)
            log_file.write(line)
            log_file.flush()
            sys.stdout.write(line)
            sys.stdout.flush()
    child.stdout.close()


def _is_redis_error(exc: Exception) -> bool:
    """Redis restarting, failing over, demoted or unreachable: wait and retry, never exit."""
    from training.scheduler.redis_conn import is_temporary_error

    return is_temporary_error(exc)


# Worker settings a command line may set: flag -> WorkerConfig field (defaults and help come
# from the dataclass, their one home).
_FLAGS: tuple[tuple[str, str], ...] = (
    ("--idle-exit-seconds", "idle_exit_seconds"),
    ("--lease-seconds", "lease_seconds"),
    ("--poll-seconds", "poll_seconds"),
    ("--stop-grace-seconds", "stop_grace_seconds"),
    ("--backoff-base-seconds", "backoff_base_s"),
    ("--backoff-max-seconds", "backoff_max_s"),
    ("--max-tasks", "max_tasks"),
    ("--metrics-port", "metrics_port"),
    ("--health-check-timeout-seconds", "health_check_timeout_seconds"),
    ("--gang-deadline-seconds", "gang_deadline_seconds"),
)


def build_arg_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    from training.config import describe_fields

    parser = parser or argparse.ArgumentParser(prog="python -m training.worker",
                                               description="Claim and run ragpool training tasks.")
    docs = dict(describe_fields(WorkerConfig))
    fields = {f.name: f for f in dataclasses.fields(WorkerConfig)}
    for flag, name in _FLAGS:
        f = fields[name]
        default = f.default_factory() if f.default is dataclasses.MISSING else f.default
        kind = int if isinstance(default, int) else float
        parser.add_argument(flag, dest=name, type=kind, default=default,
                            help=f"{docs.get(name, '').splitlines()[0]} (default {default:g})")
    return parser


def worker_main(args: argparse.Namespace) -> int:
    """Shared by ``python -m training.worker`` and ``ragpool worker``."""
    from training.scheduler.run_queue import open_queue
    from training.scheduler.redis_conn import RedisConfigError, settings_from_env

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        config = WorkerConfig(**{name: getattr(args, name) for _, name in _FLAGS})
        settings = settings_from_env()
    except (ValueError, RedisConfigError) as exc:
        print(f"ragpool worker: {exc}", file=sys.stderr)
        return exit_codes.BAD_INPUT
    queue = open_queue(settings, namespace=config.namespace, lease_seconds=config.lease_seconds,
                       backoff_base_s=config.backoff_base_s, backoff_max_s=config.backoff_max_s)
    try:
        queue.client.ping()
    except Exception as exc:
        if not _is_redis_error(exc):
            raise
        print(f"ragpool worker: cannot reach Redis at {settings.endpoint}: {exc}", file=sys.stderr)
        return exit_codes.FAILED
    from training.scheduler.preflight import health_gate

    unhealthy = health_gate(config.worker_id, config.health_check_timeout_seconds, config.metrics_port)
    if unhealthy is not None:
        return unhealthy
    worker = Worker(queue, config)
    worker.install_signal_handlers()
    return worker.run()


def main(argv: list[str] | None = None) -> int:
    return worker_main(build_arg_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
