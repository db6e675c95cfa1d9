"""The Redis task queue's records: its key layout, task states and the values its calls return.

The client that changes them, one Lua script per call, is ``run_queue.py``; this module holds only
what the queue stores and answers, so a reader (the exporter, ``ragpool status``, the worker) finds
the names without the client.

Keys (``P`` = ``<namespace>:``, default ``ragpool:``; needs a non-cluster Redis/Valkey,
e.g. an ElastiCache replication group with cluster mode off):

====================  =====  ===========================================================
``P ready:<prio><l>``  list   queued task ids per priority and lane (``<l>``, see ``run_queue.lane`` and
                             ``lanes.py``); LPUSH on submit, RPOP on claim
``P lanes``            set    the non-empty lane suffixes ever used (for ``stats``)
``P delayed``          zset   failed tasks waiting out their backoff, score = due time
``P leases``           zset   running tasks, score = lease deadline
``P dead``             list   dead-letter ids, newest first
``P tasks``            zset   every task id, score = creation time (``list``)
``P task:<id>``        hash   the task: state, attempts, spec, timestamps, worker, error
``P stats``            hash   cumulative counters (retries, completions per outcome)
``P duration:<o>``     hash   per-outcome attempt-duration histogram buckets
``P workers``          hash   worker id -> last heartbeat time
``P wake``             list   wake-up tokens for blocked claimers (BLPOP)
``P group:<name>``     str    multi-node: the task the index-0 pod claimed for its Job
                             (``worker/group.py`` reads and writes both group keys)
``P group:<name>:joined`` set  multi-node: the pods that joined the gang (``<task>-a<attempt>/<index>``)
``P worker_state``     hash   worker id -> JSON: its lanes, state (:class:`WorkerState`), run, time
``P audit``            stream the run API's audit events (who, what, when, result: training/api/audit.py)
``P export:<id>``      hash   the run API's latest export of the run: state, progress, destination, error
                             (training/api/exports.py)
====================  =====  ===========================================================

Task states: ``queued`` -> ``running`` -> ``succeeded``; a failed attempt goes
``running`` -> ``failed`` (waiting out exponential backoff in ``delayed``) ->
``queued``; after ``max_attempts`` it is ``dead`` (dead-letter list, last error kept);
``cancelled`` from any non-terminal state. An attempt is counted when it is claimed;
:meth:`run_queue.TaskQueue.release` (graceful stop, retriable exit) gives it back.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from contract.lanes import READY_STEM, Lane
from training.scheduler.spec import RunSpec


class State(StrEnum):
    """A task's state (the ``state`` field of its hash; the Lua scripts write these values)."""

    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    DEAD = "dead"
    CANCELLED = "cancelled"


STATES: tuple[str, ...] = tuple(State)
"""Every task state; the last three are terminal except that ``retry`` revives ``dead``."""
TERMINAL_STATES = frozenset({State.SUCCEEDED, State.DEAD, State.CANCELLED})
OUTCOMES: tuple[str, ...] = (State.SUCCEEDED, State.FAILED, State.DEAD, State.CANCELLED)
"""``outcome`` label values of the completion counter and duration histogram."""


class Heartbeat(StrEnum):
    """What :meth:`TaskQueue.heartbeat` reports (``lua/heartbeat.lua``)."""

    OK = "ok"
    """The lease is extended."""
    CANCEL = "cancel"
    """A cancel is pending: stop the run, then confirm with :meth:`TaskQueue.cancelled`."""
    LOST = "lost"
    """The lease was reaped or the task changed: stop, record nothing."""


class Release(StrEnum):
    """Why a run is handed back (:meth:`TaskQueue.release`; ``lua/release.lua`` reads the values)."""

    GRACEFUL = ""
    """The child exited with the retriable code on its own: free up to ``FREE_RELEASES`` times, then each
    spends an attempt (a run that always exits retriable must not loop forever)."""
    PREEMPTED = "preempted"
    """The worker was told to stop (SIGTERM to its pod: Kueue evicting its Job to reclaim quota, a spot
    reclaim, a node drain) and its run checkpointed: never spends an attempt however often it happens
    (being preempted is not the run's fault; it resumes from its checkpoint); counted on the task as
    ``preemptions`` (the last one's time, ``last_preempted_at``) and in ``released_total``."""
    GANG_TIMEOUT = "gang"
    """A multi-node gang that never formed: never spends an attempt (waiting for capacity is not
    the run's fault); counted as ``gang_timeouts:<ready list>`` (``ragpool_gang_timeouts_total``)."""
    UNAVAILABLE = "unavailable"
    """The executor's cluster could not be reached (Ray down, its token refused; the child exited
    ``exit_codes.UNAVAILABLE``): never spends an attempt, so an outage cannot dead-letter queued
    runs; counted as ``unavailable_releases_total``. The failing worker Jobs raise
    ``RagpoolLaneWorkerJobsFailing``."""


class Key(StrEnum):
    """Key names under the namespace prefix (see the module docstring); the Lua scripts get
    them in their layout argument, so this is their one home. ``TASK``, ``READY``,
    ``DURATION`` and ``GROUP`` are stems followed by an id, priority, outcome or group."""

    READY = READY_STEM
    DELAYED = "delayed"
    LEASES = "leases"
    DEAD = "dead"
    TASKS = "tasks"
    TASK = "task:"
    STATS = "stats"
    DURATION = "duration:"
    WORKERS = "workers"
    WAKE = "wake"
    GROUP = "group:"
    LANES = "lanes"
    WORKER_STATE = "worker_state"
    AUDIT = "audit"
    EXPORT = "export:"

DURATION_BUCKETS: tuple[float, ...] = (
    0.005, 0.05, 0.5, 1, 5, 30, 60, 300, 900, 1800, 3600, 7200, 14400, 28800, 86400,
)
"""Upper bounds (seconds) of the attempt-duration histogram; +Inf is implicit."""

FREE_RELEASES = 20
"""Releases (the child's own retriable exits, ``Release.GRACEFUL``) a task gets for free; past this each
release spends an attempt, so a run that always exits retriable ends in the dead-letter list. A worker's
SIGTERM hand-back (``Release.PREEMPTED``) is never counted against it."""

@dataclass(frozen=True)
class Claim:
    """A task leased to this worker; ``token`` fences every later call."""

    task_id: str
    token: str
    spec_json: str
    attempt: int
    max_attempts: int
    enqueued_at: float
    claimed_at: float
    timeout_s: float

    @property
    def spec(self) -> RunSpec:
        return RunSpec.from_json(self.spec_json)

    @classmethod
    def from_reply(cls, reply: str) -> "Claim":
        """A claim from one entry of the claim scripts' reply (fields joined by ``\\x1f``)."""
        task_id, token, spec_json, attempt, max_attempts, enqueued_at, claimed_at, timeout_s = reply.split("\x1f")
        return cls(task_id=task_id, token=token, spec_json=spec_json, attempt=int(attempt),
                   max_attempts=int(max_attempts), enqueued_at=float(enqueued_at),
                   claimed_at=float(claimed_at), timeout_s=float(timeout_s))


@dataclass(frozen=True)
class SubmitResult:
    """Outcome of :meth:`TaskQueue.submit`."""

    created: bool
    """True when this call created the task; False when the run id already existed."""
    state: str
    """The task's state after the call."""
    same_spec: bool
    """Whether the stored spec equals the submitted one (always True when created)."""
    team: str = ""
    """The team the run belongs to ('' for a run submitted without one: the direct CLI)."""


@dataclass(frozen=True)
class TaskInfo:
    """A snapshot of one task's state hash."""

    task_id: str
    state: str
    priority: str
    attempts: int
    max_attempts: int
    worker: str
    created_at: float | None
    enqueued_at: float | None
    claimed_at: float | None
    finished_at: float | None
    heartbeat_at: float | None
    next_attempt_at: float | None
    last_error: str
    completions: int
    cancel_requested: bool
    spec_json: str
    owner: str = ""
    """Who submitted it through the run API (an IAM ARN); '' when submitted directly to Redis."""
    team: str = ""
    """The team it belongs to (the run API's authorization); '' when submitted directly to Redis."""
    preemptions: int = 0
    """Times it was handed back preempted (``Release.PREEMPTED``: no attempt spent)."""
    last_preempted_at: float | None = None
    """When it was last handed back preempted (server time), None if never."""

    @classmethod
    def from_hash(cls, h: dict[str, str]) -> "TaskInfo":
        def ts(name: str) -> float | None:
            value = h.get(name) or ""
            return float(value) if value else None

        return cls(
            task_id=h.get("id", ""), state=h.get("state", ""), priority=h.get("priority", ""),
            attempts=int(h.get("attempts", 0)), max_attempts=int(h.get("max_attempts", 0)),
            worker=h.get("worker", ""), created_at=ts("created_at"), enqueued_at=ts("enqueued_at"),
            claimed_at=ts("claimed_at"), finished_at=ts("finished_at"), heartbeat_at=ts("heartbeat_at"),
            next_attempt_at=ts("next_attempt_at"), last_error=h.get("last_error", ""),
            completions=int(h.get("completions", 0)), cancel_requested=h.get("cancel_requested") == "1",
            spec_json=h.get("spec", ""), owner=h.get("owner", ""), team=h.get("team", ""),
            preemptions=int(h.get("preemptions", 0)), last_preempted_at=ts("last_preempted_at"),
        )


@dataclass(frozen=True)
class QueueStats:
    """What the Prometheus exporter reads, in one pipeline."""

    now: float
    depth: dict[str, int]
    oldest_age_s: dict[str, float]
    running: int
    delayed: int
    dead_letter: int
    counters: dict[str, int]
    durations: dict[str, dict[str, float]]
    workers: dict[str, float]


GANG_TIMEOUTS_STAT = "gang_timeouts:"
"""Stats-hash field stem (then the run's ready list) counting gangs that never formed."""


class WorkerState(StrEnum):
    """What a registered worker is doing (``worker_state`` hash; ``ragpool status``)."""

    WAITING = "waiting"
    """Started, looking for a run in its lanes (not Ready for Kubernetes)."""
    RUNNING = "running"
    """Holds a claim (or, for a gang, is gathering its pods)."""
    EXITING = "exiting"
    """Found its lanes empty, or was stopped: exiting."""


@dataclass(frozen=True)
class WorkerInfo:
    """One registered worker (:meth:`TaskQueue.worker_states`)."""

    worker_id: str
    lanes: tuple[Lane, ...]
    state: str
    run_id: str
    seen_at: float
    host: str


@dataclass
class LaneStats:
    """One lane of one queue (:meth:`TaskQueue.lane_stats`)."""

    queued: int = 0
    """Runs waiting in the lane's ready lists (all priorities): the runs that need a worker."""
    running: int = 0
    """Runs of the lane under a lease."""
    gang_timeouts: int = 0
    """Multi-node gangs of the lane that never formed (cumulative)."""
    workers: dict[str, int] = field(default_factory=dict)
    """Live registered workers claiming this lane, by :class:`WorkerState`."""
