"""The worker's loop: claim a run, run it to an outcome, record it, until idle, told to stop or done.

    python -m training.worker [--idle-exit-seconds 300] [--lease-seconds 60] [--metrics-port 9300]

(the package docstring, training/scheduler/worker/__init__.py, says what the worker does.)
"""

from __future__ import annotations

import argparse
import logging
import subprocess
import sys
import threading
import time
from pathlib import Path

from contract import exit_codes
from training.scheduler.queue_records import Claim, WorkerState
from training.scheduler.spec import RunSpec
from training.scheduler.worker import log
from training.scheduler.worker.child import write_run_config
from training.scheduler.worker.gang import GANG_TRAINS_ON, GangMember
from training.scheduler.worker.outage import STOPPED, OutageRetry, is_redis_error
from training.scheduler.worker.outcome import Action, ChildExit, Decision, Outcome, decide, outcome_of
from training.scheduler.worker.settings import FLAGS, WorkerConfig, build_arg_parser
from training.scheduler.worker.supervision import ChildSupervisor

__all__ = ["Worker", "WorkerConfig", "build_arg_parser", "main", "worker_main"]


class Worker(ChildSupervisor, GangMember, OutageRetry):
    """Claim -> run -> heartbeat -> ack loop (training/scheduler/worker/__init__.py)."""

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
            if not is_redis_error(exc):
                raise

    def _run_claimer(self) -> int:
        self._register(WorkerState.WAITING)
        interrupted = False
        if self.config.nnodes > 1 and self._rejoin_elastic_run():  # a replaced index 0: its elastic run grows back
            self.tasks_done += 1
        idle_since = time.monotonic()

        def claim_once(_again: bool) -> Claim | None:
            idle_left = self.config.idle_exit_seconds - (time.monotonic() - idle_since)
            return self.queue.claim(self.config.worker_id, run_id=self.config.run_id,
                                    nodes=self.config.nnodes, lanes=self.config.lanes,
                                    priorities=self.config.priorities,
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
            interrupted = outcome in (Outcome.INTERRUPTED, Outcome.HANDED_OFF) or interrupted
            if outcome == Outcome.GANG_TIMEOUT:  # the Job fails (podFailurePolicy): none of its pods waits on
                log.warning("worker %s: the gang of %s did not form within %.0fs; exiting", self.config.worker_id,
                            claim.task_id, self.config.gang_deadline_seconds)
                return exit_codes.GANG_TIMEOUT
            self.ready.clear()
            self._register(WorkerState.WAITING)
            if self.ray_unavailable:  # every ray run would fail the same way: leave them queued
                log.error("worker %s: the Ray cluster is unreachable or refuses this worker's token; "
                          "stopping", self.config.worker_id)
                return exit_codes.UNAVAILABLE
            self.tasks_done += 1
            idle_since = time.monotonic()
        return self.retriable_code if interrupted else 0

    def _command(self, spec: RunSpec, config_path: Path, attempt: int) -> tuple[list[str], dict[str, str]]:
        """This pod's child for one attempt: the configured builder's (default ``child.run_command``)."""
        cfg = self.config
        return cfg.child_builder(spec, config_path, attempt, shared_root=cfg.shared_root, node_index=cfg.node_index,
                                 rdzv_host=cfg.rdzv_host, rdzv_port=cfg.rdzv_port)

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
            gathered = self._gather(claim, {"spec_json": claim.spec_json, "config": str(config_path)},
                                    min_nodes=spec.min_nodes)
            if gathered is not None:
                return gathered
        ended = None
        try:
            ended = self._supervise(cmd, env, run_id=spec.run_id, attempt=claim.attempt,
                                    timeout_s=claim.timeout_s, lease=claim)
        finally:
            if cfg.nnodes > 1 and ended is None:
                self._clear_group()
        return self._record(claim, ended, spec)

    def _record(self, claim: Claim, ended: ChildExit, spec: RunSpec) -> Outcome:
        """Record how the run ended: what :func:`outcome.decide` decides (see :meth:`_keep_trying`); then,
        unless the run trains on without this pod, clear its gang."""
        decision = decide(ended, executor=spec.executor, timeout_s=claim.timeout_s, elastic=spec.min_nodes is not None)
        if decision.action == Action.NOTHING:
            log.warning("run %s: lease lost (reaped or taken over); not recording anything", claim.task_id)
        outcome = self._keep_trying(claim, lambda again: self._record_once(claim, decision, again=again),
                                    heartbeat=decision.action != Action.NOTHING)
        if self.config.nnodes > 1 and not (spec.min_nodes is not None and outcome in GANG_TRAINS_ON):
            self._clear_group()
        if decision.stop_claiming:  # e.g. the Ray cluster is away: every run of these lanes would fail alike
            self.ray_unavailable = True
        return outcome

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
        elif decision.action == Action.HAND_OFF:
            reply = self._hand_off(claim, decision)
        else:
            reply = q.fail(claim, decision.reason, retriable=decision.retriable)
        return outcome_of(decision, reply)


def worker_main(args: argparse.Namespace) -> int:
    """Shared by ``python -m training.worker`` and ``ragpool worker``."""
    from training.scheduler.run_queue import open_queue
    from training.scheduler.redis_conn import RedisConfigError, settings_from_env

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        config = WorkerConfig(**{name: getattr(args, name) for _, name in FLAGS})
        settings = settings_from_env()
    except (ValueError, RedisConfigError) as exc:
        print(f"ragpool worker: {exc}", file=sys.stderr)
        return exit_codes.BAD_INPUT
    queue = open_queue(settings, namespace=config.namespace, lease_seconds=config.lease_seconds,
                       backoff_base_s=config.backoff_base_s, backoff_max_s=config.backoff_max_s)
    try:
        queue.client.ping()
    except Exception as exc:
        if not is_redis_error(exc):
            raise
        print(f"ragpool worker: cannot reach Redis at {settings.endpoint}: {exc}", file=sys.stderr)
        return exit_codes.FAILED
    from training.scheduler.worker.preflight import health_gate

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
