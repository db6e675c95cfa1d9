"""How one worker process behaves: :class:`WorkerConfig` (defaults, environment, checks) and its flags."""

from __future__ import annotations

import argparse
import dataclasses
import os
import socket
from dataclasses import dataclass, field

from contract.defaults import DEFAULT_BACKOFF_BASE_S, DEFAULT_BACKOFF_MAX_S, DEFAULT_GANG_DEADLINE_S, DEFAULT_LEASE_S
from contract.env import (EXECUTORS_ENV, GANG_DEADLINE_ENV, METRICS_PORT_ENV, NNODES_ENV, RDZV_HOST_ENV, RDZV_PORT_ENV,
                          RUN_ID_ENV, WORKER_GROUP_ENV, WORKER_ID_ENV)
from contract.lanes import EXECUTORS, Lane, format_lanes, lanes_from_env, priorities_from_env
from contract.paths import shared_root_from_env
from contract.ports import RDZV_PORT
from training.scheduler.run_queue import namespace_from_env
from training.scheduler.worker.child import ChildBuilder, builder_from_env


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
    (training/scheduler/worker/preflight.py). 0 = skip; the worker Job template turns it on."""
    metrics_port: int = field(default_factory=lambda: int(os.environ.get(METRICS_PORT_ENV) or 0))
    """Serve queue metrics on this port (0 = off; env RAGPOOL_QUEUE_METRICS_PORT).
    Also ``/ready``; the worker Jobs pass ``QUEUE_METRICS_PORT`` (9300, contract/ports.py)."""
    run_id: str | None = field(default_factory=lambda: os.environ.get(RUN_ID_ENV) or None)
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
    priorities: tuple[str, ...] = field(default_factory=lambda: priorities_from_env())
    """The priorities whose runs it claims, highest first (``RAGPOOL_PRIORITIES``, contract/lanes.py; default every
    one): a ScaledJob's worker claims only the priority its Job was started, and admitted by Kueue, for."""
    gang_deadline_seconds: float = field(
        default_factory=lambda: float(os.environ.get(GANG_DEADLINE_ENV) or DEFAULT_GANG_DEADLINE_S))
    """Multi-node: how long all pods of the gang get to join before it is given up (the run handed
    back without spending an attempt, every pod exits; env RAGPOOL_GANG_DEADLINE_SECONDS)."""
    child_builder: ChildBuilder = field(default_factory=builder_from_env)
    """How a claimed run becomes the child's argv and environment: the ``module:function`` that
    ``RAGPOOL_WORKER_CHILD_BUILDER`` names, default ``child.run_command`` (torchrun of the pipeline)."""

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


# Worker settings a command line may set: flag -> WorkerConfig field (defaults and help come
# from the dataclass, their one home).
FLAGS: tuple[tuple[str, str], ...] = (
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
    from training.config.run import describe_fields

    parser = parser or argparse.ArgumentParser(prog="python -m training.worker",
                                               description="Claim and run ragpool training tasks.")
    docs = dict(describe_fields(WorkerConfig))
    fields = {f.name: f for f in dataclasses.fields(WorkerConfig)}
    for flag, name in FLAGS:
        f = fields[name]
        default = f.default_factory() if f.default is dataclasses.MISSING else f.default
        kind = int if isinstance(default, int) else float
        parser.add_argument(flag, dest=name, type=kind, default=default,
                            help=f"{docs.get(name, '').splitlines()[0]} (default {default:g})")
    return parser
