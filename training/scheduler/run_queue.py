"""Reliable Redis task queue for training runs (redis-py + Lua, no framework).

Every state change is one Lua script (``lua/<command>.lua`` after the shared
``lua/prelude.lua``), so it is atomic and costs one round trip;
time comes from the Redis server (``TIME``), so worker clocks never matter.

Keys (``P`` = ``<namespace>:``, default ``ragpool:``; needs a non-cluster Redis/Valkey,
e.g. an ElastiCache replication group with cluster mode off):

====================  =====  ===========================================================
``P ready:<prio><l>``  list   queued task ids per priority and lane (``<l>``, see :func:`lane` and
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
``P group:<name>:joined`` set  multi-node: the pods that joined the gang (``<task>-a<attempt>/<index>``)
``P worker_state``     hash   worker id -> JSON: its lanes, state (:class:`WorkerState`), run, time
``P audit``            stream the run API's audit events (who, what, when, result: training/api/audit.py)
====================  =====  ===========================================================

Task states: ``queued`` -> ``running`` -> ``succeeded``; a failed attempt goes
``running`` -> ``failed`` (waiting out exponential backoff in ``delayed``) ->
``queued``; after ``max_attempts`` it is ``dead`` (dead-letter list, last error kept);
``cancelled`` from any non-terminal state. An attempt is counted when it is claimed;
:meth:`TaskQueue.release` (graceful stop, retriable exit) gives it back.

Leases are fenced: a claim returns a token, and heartbeat/ack/fail/release only act
when the task is still ``running`` under that token. A worker whose lease expired and
was reaped (by *any* claimer) can therefore neither extend nor complete it, and a
task's completion is recorded exactly once (``completions`` in its hash) even when two
workers ran it.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any, Iterable, Sequence

from contract.lanes import (  # noqa: F401 (RAY_LANE, ready_list re-exported)
    RAY_LANE, READY_STEM, Lane, known_lanes, lane_of, lane_of_ready_list, lanes_from_env, parse_lane, ready_list,
)
from training.scheduler.redis_conn import (
    DEFAULT_REPLICA_WAIT_MS, NotReplicatedError, RedisSettings, connect, reconnect, settings_from_env, single_attempt,
)
from contract.lanes import PRIORITIES
from contract.defaults import DEFAULT_BACKOFF_BASE_S, DEFAULT_BACKOFF_MAX_S, DEFAULT_LEASE_S
from contract.env import NAMESPACE_ENV
from contract.names import DEFAULT_NAMESPACE
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


def lane(executor: str = "torchrun", nodes: int = 1, pool: str | None = None) -> str:
    """The ready-list suffix of a run: which workers may claim it (``lanes.Lane.suffix``, the one
    home of the lane rules: ``""``, ``:n<N>``, ``:pool:<P>[:n<N>]``, ``:ray``)."""
    return lane_of(executor, nodes, pool).suffix


DURATION_BUCKETS: tuple[float, ...] = (
    0.005, 0.05, 0.5, 1, 5, 30, 60, 300, 900, 1800, 3600, 7200, 14400, 28800, 86400,
)
"""Upper bounds (seconds) of the attempt-duration histogram; +Inf is implicit."""

MAX_ERROR_CHARS = 4000
"""Longest error text kept in a task hash."""
FREE_RELEASES = 20
"""Releases (the child's own retriable exits, ``Release.GRACEFUL``) a task gets for free; past this each
release spends an attempt, so a run that always exits retriable ends in the dead-letter list. A worker's
SIGTERM hand-back (``Release.PREEMPTED``) is never counted against it."""


def namespace_from_env() -> str:
    """The queue's key namespace for this process: ``$RAGPOOL_QUEUE_NAMESPACE``, else the default."""
    return os.environ.get(NAMESPACE_ENV) or DEFAULT_NAMESPACE


def open_queue(settings: RedisSettings | None = None, **kwargs: Any) -> "TaskQueue":
    """The queue on ``settings``' Redis (default: the environment's), its writes confirmed as the
    settings say (``REDIS_REQUIRED_REPLICAS`` within ``REDIS_REPLICA_WAIT_MS``): the one rule of
    every process that writes, the worker loop and the one-shot ``ragpool`` CLI alike.
    ``kwargs`` are :class:`TaskQueue`'s other arguments (namespace, lease...)."""
    settings = settings or settings_from_env()
    return TaskQueue(connect(settings), required_replicas=settings.required_replicas,
                     replica_wait_ms=settings.replica_wait_ms, **kwargs)

LUA_DIR = Path(__file__).with_name("lua")
"""The queue's Lua scripts: ``prelude.lua`` (shared helpers) and one file per command."""


def _load_scripts() -> dict[str, str]:
    """Each command's script text: the prelude, then its body run by ``main`` so that every
    exit path writes the deferred counters (``flush``). Read once, at import."""
    prelude = (LUA_DIR / "prelude.lua").read_text(encoding="utf-8")
    scripts = {}
    for path in sorted(LUA_DIR.glob("*.lua")):
        if path.stem != "prelude":
            body = path.read_text(encoding="utf-8")
            scripts[path.stem] = (f"{prelude}\nlocal function main()\n{body}\nend\n"
                                  "local result = main()\nflush()\nreturn result\n")
    return scripts


_SCRIPTS = _load_scripts()


def _lanes(executors: Sequence[str], nodes: int, lanes: Sequence[Lane] | None = None) -> str:
    """The claim scripts' lanes argument (a JSON list of suffixes, in the order the worker prefers
    them): ``lanes`` when given, else the unpinned lanes of ``executors`` and ``nodes``."""
    if lanes is None:
        if not executors:
            raise ValueError("a worker needs at least one executor")
        lanes = lanes_from_env(executors, nodes, environ={})
    if not lanes:
        raise ValueError("a worker needs at least one lane")
    return json.dumps(list(dict.fromkeys(lane.suffix for lane in lanes)))

SINGLE_ATTEMPT_SCRIPTS = frozenset({"claim", "ack", "ack_many", "fail", "release"})
"""Scripts sent at most once per call (``redis_conn.single_attempt``): resending a claim whose
reply was lost would lease a second task, and a resent ack/fail/release would report the
fence's "not yours" for a change it made itself. Their callers handle the error (the worker
keeps the outcome and repeats the fenced call). The others are idempotent and retried."""


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
    def _from_reply(cls, reply: str) -> "Claim":
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


TICK_LIMIT = 100_000
"""Most lapsed leases, and most due retries, one keeper tick moves per namespace."""
GANG_TIMEOUTS_STAT = "gang_timeouts:"
"""Stats-hash field stem (then the run's ready list) counting gangs that never formed."""
WORKER_LIVE_S = 180.0
"""A registered worker not seen (registry, claim or heartbeat) for this long is gone."""
GROUP_JOINED = ":joined"
"""Suffix of a gang's ``group:<name>`` key naming the set of pods that joined it."""


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


class TaskQueue:
    """The queue API over one redis-py client (``decode_responses=True``)."""

    def __init__(self, client, *, namespace: str = DEFAULT_NAMESPACE, lease_seconds: float = DEFAULT_LEASE_S,
                 backoff_base_s: float = DEFAULT_BACKOFF_BASE_S, backoff_max_s: float = DEFAULT_BACKOFF_MAX_S,
                 required_replicas: int = 0, replica_wait_ms: int = DEFAULT_REPLICA_WAIT_MS) -> None:
        if lease_seconds <= 0 or backoff_base_s < 0 or backoff_max_s < backoff_base_s:
            raise ValueError("lease_seconds > 0 and 0 <= backoff_base_s <= backoff_max_s required")
        if required_replicas < 0 or (required_replicas and replica_wait_ms <= 0):
            raise ValueError("required_replicas >= 0, and replica_wait_ms > 0 when it is > 0")
        self.client = client
        self.prefix = f"{namespace}:"
        self.lease_seconds = float(lease_seconds)
        self.backoff_base_s = float(backoff_base_s)
        self.backoff_max_s = float(backoff_max_s)
        # The layout every script reads from ARGV[1] (see lua/prelude.lua).
        self._layout = json.dumps({
            "prefix": self.prefix, "keys": {k.name.lower(): k.value for k in Key},
            "priorities": list(PRIORITIES), "buckets": list(DURATION_BUCKETS),
        })
        self._scripts = {name: client.register_script(text) for name, text in _SCRIPTS.items()}
        self.once = single_attempt(client)
        """Same server as ``client``, commands never resent (``SINGLE_ATTEMPT_SCRIPTS``)."""
        self.required_replicas = int(required_replicas)
        """Replicas that must confirm each submission, claim and ack (``WAIT n``; 0: none).
        Configuration (``REDIS_REQUIRED_REPLICAS``, see :func:`open_queue`), never what the
        primary happens to have right now: a failover cannot turn the confirmation off."""
        self.replica_wait_ms = int(replica_wait_ms)
        """How long each of those writes waits for its replicas (``REDIS_REPLICA_WAIT_MS``)."""

    def _call(self, script: str, *args, client=None):
        """Run the queue script ``script`` (a ``lua/<script>.lua`` command) with ``args``;
        ``client`` may be a pipeline to batch calls."""
        if client is None and script in SINGLE_ATTEMPT_SCRIPTS:
            client = self.once
        return self._scripts[script](args=[self._layout, *args], client=client)

    def _call_replicated(self, script: str, *args):
        """:meth:`_call`, then ``WAIT <required_replicas> <replica_wait_ms>`` on the same
        connection, one round trip (no ``WAIT`` when ``required_replicas`` is 0).

        A counter bump between the two is a write of this connection after the script, so the
        WAIT covers the script's effects even when the script wrote nothing (an idempotent
        resubmit, a repeated ack): the replica then has whatever the primary said.
        Raises :class:`NotReplicatedError` (its ``reply`` is the script's) when fewer replicas
        confirmed in time."""
        if not self.required_replicas:
            return self._call(script, *args)
        pipe = (self.once if script in SINGLE_ATTEMPT_SCRIPTS else self.client).pipeline(transaction=False)
        self._call(script, *args, client=pipe)
        pipe.hincrby(self.key(Key.STATS), "replica_waits_total", 1)
        pipe.wait(self.required_replicas, self.replica_wait_ms)
        reply, _count, replicas = pipe.execute()
        if int(replicas) < self.required_replicas:
            raise NotReplicatedError(f"{script} {args[0] if args else ''}".strip(), reply, self.replica_wait_ms,
                                     required=self.required_replicas, confirmed=int(replicas))
        return reply

    def reconnect(self) -> None:
        """Drop every connection: the next command re-resolves the endpoint (Sentinel or DNS)."""
        reconnect(self.client, self.once)

    def key(self, name: Key | str, suffix: str = "") -> str:
        """Full Redis key of ``name`` (a :class:`Key`) plus ``suffix`` (an id, priority...)."""
        return self.prefix + Key(name) + suffix

    # -- producers -------------------------------------------------------------------------

    def submit(self, spec: RunSpec, *, owner: str = "", team: str = "") -> SubmitResult:
        """Enqueue a validated run; the same run id twice is one task (idempotent). ``owner`` and
        ``team`` (the run API's caller) are recorded with it, in the same script."""
        return self.submit_payload(spec.run_id, spec.to_json(), priority=spec.priority,
                                   max_attempts=spec.max_attempts, timeout_s=spec.timeout_seconds,
                                   nodes=spec.nodes, executor=spec.executor, pool=spec.pool, owner=owner, team=team)

    def submit_payload(self, task_id: str, payload: str, *, priority: str = "normal",
                       max_attempts: int = 3, timeout_s: float = 86400, nodes: int = 1,
                       executor: str = "torchrun", pool: str | None = None, owner: str = "",
                       team: str = "") -> SubmitResult:
        """Lower level :meth:`submit` for an already validated payload string."""
        if priority not in PRIORITIES:
            raise ValueError(f"priority must be one of {PRIORITIES}, got {priority!r}")
        status, state, same, stored_team = self._call_replicated(
            "submit", task_id, payload, priority, int(max_attempts), timeout_s, int(nodes), lane(executor, nodes, pool),
            owner, team)
        return SubmitResult(created=status == "created", state=state, same_spec=bool(int(same)), team=stored_team)

    def cancel(self, task_id: str) -> str:
        """Cancel: ``cancelled`` (was waiting), ``cancelling`` (running: its worker stops it at the
        next heartbeat), ``missing``, or ``finished:<state>`` when it had already ended."""
        return self._call("cancel", task_id)

    def retry(self, task_id: str) -> str:
        """Move a dead-letter (``requeued``) or cancelled (``resumed``) task back to the queue with fresh
        attempts; ``missing``, or its current state otherwise (nothing changes then)."""
        return self._call("retry", task_id)

    # -- consumers -------------------------------------------------------------------------

    def claim(self, worker_id: str, *, block_s: float = 0.0, run_id: str | None = None,
              poll_s: float = 1.0, nodes: int = 1, executors: Sequence[str] = ("torchrun",),
              lanes: Sequence[Lane] | None = None) -> Claim | None:
        """Lease the next task (highest priority, oldest first) or ``run_id`` specifically.

        With ``block_s`` > 0 waits up to that long, woken by submits/requeues (BLPOP on
        the wake list) and re-checking at least every ``poll_s`` for due retries and
        expired leases. Only runs of the lanes of ``executors`` and ``nodes`` are claimed
        (:func:`lane`): ``nodes`` > 1 claims only torchrun runs of exactly that many nodes
        (an Indexed Job's index-0 pod), so single-pod workers never see multi-node runs, and
        only a worker with ``ray`` in ``executors`` sees ray runs. ``run_id`` too must be
        in one of those lanes. ``lanes`` (``lanes.Lane``) replaces ``executors``/``nodes`` with an
        exact set of lanes (pinned pools: ``lanes.worker_lanes``).
        """
        claims = self.claim_batch(worker_id, 1, block_s=block_s, run_id=run_id, poll_s=poll_s, nodes=nodes,
                                  executors=executors, lanes=lanes)
        return claims[0] if claims else None

    def claim_batch(self, worker_id: str, max_tasks: int, *, block_s: float = 0.0,
                    run_id: str | None = None, poll_s: float = 1.0, nodes: int = 1,
                    executors: Sequence[str] = ("torchrun",), lanes: Sequence[Lane] | None = None) -> list[Claim]:
        """Lease up to ``max_tasks`` tasks in one round trip (each with its own lease and token).

        A claim no replica confirmed is handed back at once (best effort) and
        :class:`NotReplicatedError` raised: running it could run it twice if a failover
        then lost the claim. The claim script is sent once; on a connection error the
        caller tries again later (a lease whose reply was lost expires and is reaped)."""
        lanes_json = _lanes(executors, nodes, lanes)
        deadline = time.monotonic() + block_s
        while True:
            try:
                reply = self._call_replicated("claim", worker_id, uuid.uuid4().hex[:16], self.lease_seconds,
                                              run_id or "", int(max_tasks), lanes_json)
            except NotReplicatedError as exc:
                self._hand_back([Claim._from_reply(r) for r in exc.reply or []])
                raise
            if reply:
                return [Claim._from_reply(r) for r in reply]
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return []
            self.client.blpop([self.key(Key.WAKE)], timeout=max(0.01, min(remaining, poll_s)))

    def _hand_back(self, claims: list[Claim]) -> None:
        for claim in claims:
            try:
                self.release(claim, "claim not confirmed by a replica")
            except Exception:  # best effort: a lease not handed back expires and is reaped
                pass

    def ack_batch(self, claims: list[Claim], *, worker_id: str | None = None, claim_next: int = 0,
                  executors: Sequence[str] = ("torchrun",),
                  lanes: Sequence[Lane] | None = None) -> tuple[list[bool], list[Claim]]:
        """Ack ``claims`` and, when ``claim_next`` > 0, lease up to that many more single-pod tasks
        of ``executors`` (or of ``lanes``) for ``worker_id``, all in one round trip. Returns (acked
        flags, new claims)."""
        args: list = [len(claims)]
        for c in claims:
            args += [c.task_id, c.token]
        if claim_next > 0:
            if worker_id is None:
                raise ValueError("claim_next needs worker_id")
            args += [worker_id, uuid.uuid4().hex[:16], self.lease_seconds, int(claim_next), _lanes(executors, 1, lanes)]
        acked, new = self._call_replicated("ack_many", *args)
        return [a == "1" for a in acked], [Claim._from_reply(r) for r in new]

    def ack_and_claim(self, claim: Claim, worker_id: str, executors: Sequence[str] = ("torchrun",),
                      lanes: Sequence[Lane] | None = None) -> tuple[bool, Claim | None]:
        """Ack ``claim`` and lease the next task in one round trip."""
        acked, new = self.ack_batch([claim], worker_id=worker_id, claim_next=1, executors=executors, lanes=lanes)
        return acked[0], (new[0] if new else None)

    def heartbeat(self, claim: Claim, worker_id: str) -> Heartbeat:
        """Extend the lease (see :class:`Heartbeat` for the replies)."""
        return Heartbeat(self._call("heartbeat", claim.task_id, claim.token, self.lease_seconds, worker_id))

    def ack(self, claim: Claim, *, again: bool = False) -> bool:
        """Record success; False when the lease is no longer ours (nothing recorded).

        ``again``: this repeats an ack whose reply or replication was not seen (connection
        lost, :class:`NotReplicatedError`). The fence decides: still running under our
        token (a failover lost the first ack) records it now; already ``succeeded`` means
        the completion stands (recorded once); anything else is False."""
        ok, state = self._call_replicated("ack", claim.task_id, claim.token)
        return bool(ok) or (again and state == State.SUCCEEDED)

    def fail(self, claim: Claim, error: str, *, retriable: bool = True) -> str:
        """Record a failed attempt: ``retry`` (after exponential backoff), ``dead``
        (attempts exhausted or not retriable), ``cancelled`` or ``stale`` (not our lease)."""
        reply = self._call("fail", claim.task_id, claim.token, error[-MAX_ERROR_CHARS:], "1" if retriable else "0",
                           self.backoff_base_s, self.backoff_max_s)
        return reply[0]

    def release(self, claim: Claim, reason: str = "released by worker", *,
                kind: Release = Release.GRACEFUL) -> str:
        """Give the task back (``released``), or ``cancelled`` (a cancel was pending), ``dead`` or
        ``stale``. How often it may happen without spending an attempt depends on ``kind``
        (:class:`Release`)."""
        return self._call("release", claim.task_id, claim.token, reason[-MAX_ERROR_CHARS:], FREE_RELEASES,
                          Release(kind).value)

    def cancelled(self, claim: Claim) -> str:
        """Confirm a cancel the heartbeat reported (same fencing as release)."""
        return self.release(claim, "cancelled")

    def reap(self) -> int:
        """Return expired leases to the queue now (claims also do this); returns how many."""
        return int(self._call("reap"))

    # -- keeper, lanes and workers (issue 22) ----------------------------------------------

    def tick(self, namespaces: Sequence[str]) -> dict[str, tuple[int, int]]:
        """One keeper tick (``lua/tick.lua``, one script for all ``namespaces``): reap lapsed
        leases and move due retries back to their ready lists. Returns namespace -> (reaped,
        promoted). Afterwards each lane's ready lists hold exactly its runs that need a worker
        (up to ``TICK_LIMIT`` of each kind per namespace per tick)."""
        reply = self._call("tick", TICK_LIMIT, *(f"{ns}:" for ns in namespaces))
        return {ns: (int(r[0]), int(r[1])) for ns, r in zip(namespaces, reply)}

    def lane_stats(self) -> dict[Lane, LaneStats]:
        """Per-lane queued (LLEN summed over priorities: what KEDA's Redis scaler reads), running,
        gang timeouts and live workers by state, for every lane the queue has seen."""
        lanes = known_lanes(self.client.smembers(self.key(Key.LANES)))
        pipe = self.client.pipeline(transaction=False)
        for lane in lanes:
            for name in lane.ready_lists():
                pipe.llen(self.prefix + name)
        pipe.zrange(self.key(Key.LEASES), 0, -1)
        pipe.hgetall(self.key(Key.STATS))
        res = pipe.execute()
        n = len(PRIORITIES)
        out = {lane: LaneStats(queued=sum(int(x) for x in res[i * n:(i + 1) * n])) for i, lane in enumerate(lanes)}
        leased, counters = res[-2], res[-1]
        pipe = self.client.pipeline(transaction=False)
        for task_id in leased:
            pipe.hget(self.key(Key.TASK, task_id), "ready")
        for ready in pipe.execute() if leased else []:
            found = lane_of_ready_list(ready or "")
            if found:
                out.setdefault(found[1], LaneStats()).running += 1
        for field_name, value in counters.items():
            if field_name.startswith(GANG_TIMEOUTS_STAT):
                found = lane_of_ready_list(field_name[len(GANG_TIMEOUTS_STAT):])
                if found:
                    out.setdefault(found[1], LaneStats()).gang_timeouts += int(float(value))
        for worker in self.worker_states().values():
            for lane in worker.lanes:
                stats = out.setdefault(lane, LaneStats())
                stats.workers[worker.state] = stats.workers.get(worker.state, 0) + 1
        return out

    def register_worker(self, worker_id: str, lanes: Sequence[Lane], state: "WorkerState", run_id: str = "") -> None:
        """Record what a worker claims and does (``ragpool status`` and the lane gauges read it)."""
        info = {"lanes": [lane.name for lane in lanes], "state": str(state), "run": run_id, "at": time.time(),
                "host": os.environ.get("HOSTNAME", "")}
        self.client.hset(self.key(Key.WORKER_STATE), worker_id, json.dumps(info))

    def unregister_worker(self, worker_id: str) -> None:
        self.client.hdel(self.key(Key.WORKER_STATE), worker_id)

    def worker_states(self, *, live_s: float = WORKER_LIVE_S) -> dict[str, WorkerInfo]:
        """Registered workers seen within ``live_s`` of the Redis clock (the later of their registry
        time, written with the worker's clock, and their last claim or heartbeat, Redis's clock);
        older entries (a worker SIGKILLed with its node) are dropped here and pruned."""
        pipe = self.client.pipeline(transaction=False)
        pipe.time()
        pipe.hgetall(self.key(Key.WORKER_STATE))
        pipe.hgetall(self.key(Key.WORKERS))
        (sec, usec), raw, seen = pipe.execute()
        now = sec + usec / 1e6
        out: dict[str, WorkerInfo] = {}
        stale = []
        for worker_id, text in raw.items():
            try:
                info = json.loads(text)
                lanes = tuple(parse_lane(name) for name in info["lanes"])
                at = max(float(info["at"]), float(seen.get(worker_id) or 0))
            except (ValueError, KeyError, TypeError):
                stale.append(worker_id)
                continue
            if now - at > live_s:
                stale.append(worker_id)
                continue
            out[worker_id] = WorkerInfo(worker_id, lanes, info.get("state", ""), info.get("run", ""), at,
                                        info.get("host", ""))
        if stale:
            self.client.hdel(self.key(Key.WORKER_STATE), *stale)
        return out

    # -- reads -----------------------------------------------------------------------------

    def get(self, task_id: str) -> TaskInfo | None:
        h = self.client.hgetall(self.key(Key.TASK, task_id))
        return TaskInfo.from_hash(h) if h else None

    def list(self, limit: int = 100, states: Iterable[str] | None = None) -> list[TaskInfo]:
        """Newest tasks first (up to ``limit``), optionally only in ``states``."""
        wanted = set(states) if states else None
        ids = self.client.zrevrange(self.key(Key.TASKS), 0, max(0, limit - 1) if wanted is None else -1)
        out: list[TaskInfo] = []
        for start in range(0, len(ids), 500):
            pipe = self.client.pipeline(transaction=False)
            for task_id in ids[start:start + 500]:
                pipe.hgetall(self.key(Key.TASK, task_id))
            for h in pipe.execute():
                if h and (wanted is None or h.get("state") in wanted):
                    out.append(TaskInfo.from_hash(h))
                    if len(out) >= limit:
                        return out
        return out

    def dead_letter(self) -> list[str]:
        return self.client.lrange(self.key(Key.DEAD), 0, -1)

    def stats(self) -> QueueStats:
        """Depths, ages, counters and histograms for the exporter (a few pipelined round trips)."""
        lanes = sorted(self.client.smembers(self.key(Key.LANES)))
        pipe = self.client.pipeline(transaction=False)
        pipe.time()
        pipe.zcard(self.key(Key.LEASES))
        pipe.zcard(self.key(Key.DELAYED))
        pipe.llen(self.key(Key.DEAD))
        pipe.hgetall(self.key(Key.STATS))
        for outcome in OUTCOMES:
            pipe.hgetall(self.key(Key.DURATION, outcome))
        pipe.hgetall(self.key(Key.WORKERS))
        res = pipe.execute()
        sec, usec = res[0]
        now = sec + usec / 1e6
        j = 1
        running, delayed, dead = int(res[j]), int(res[j + 1]), int(res[j + 2])
        counters = {k: int(float(v)) for k, v in res[j + 3].items()}
        durations = {o: {k: float(v) for k, v in res[j + 4 + i].items()} for i, o in enumerate(OUTCOMES)}
        workers = {w: float(v) for w, v in res[j + 4 + len(OUTCOMES)].items()}
        # Oldest waiting task per priority over the lists of every lane.
        lists = [(prio, self.prefix + ready_list(prio, lane_suffix)) for prio in PRIORITIES
                 for lane_suffix in ["", *lanes]]
        pipe = self.client.pipeline(transaction=False)
        for _prio, key in lists:
            pipe.lindex(key, -1)
            pipe.llen(key)
        res = pipe.execute()
        heads: list[tuple[str, str]] = []
        depth = {prio: 0 for prio in PRIORITIES}
        for i, (prio, _key) in enumerate(lists):
            depth[prio] += int(res[2 * i + 1])
            if res[2 * i]:
                heads.append((prio, res[2 * i]))
        pipe = self.client.pipeline(transaction=False)
        for _prio, task_id in heads:
            pipe.hget(self.key(Key.TASK, task_id), "enqueued_at")
        ages = {prio: 0.0 for prio in PRIORITIES}
        for (prio, _id), enq in zip(heads, pipe.execute()):
            if enq:
                ages[prio] = max(ages[prio], now - float(enq))
        return QueueStats(now=now, depth=depth, oldest_age_s=ages, running=running, delayed=delayed,
                          dead_letter=dead, counters=counters, durations=durations, workers=workers)

    # -- multi-node groups -----------------------------------------------------------------

    def publish_group(self, group: str, claim: Claim, info: dict[str, Any], ttl_s: int) -> None:
        """Index-0 pod: share the claimed task with the other pods of its Indexed Job."""
        self.client.set(self.key(Key.GROUP, group), json.dumps({"task_id": claim.task_id,
                                                              "attempt": claim.attempt, **info}), ex=ttl_s)

    def read_group(self, group: str) -> dict[str, Any] | None:
        raw = self.client.get(self.key(Key.GROUP, group))
        return json.loads(raw) if raw else None

    def clear_group(self, group: str) -> None:
        self.client.delete(self.key(Key.GROUP, group))

    def join_group(self, group: str, member: str, ttl_s: int) -> None:
        """A follower pod joins the gang its index-0 pod is gathering (``member``: run, attempt, index)."""
        key = self.key(Key.GROUP, group + GROUP_JOINED)
        pipe = self.client.pipeline(transaction=False)
        pipe.sadd(key, member)
        pipe.expire(key, ttl_s)
        pipe.execute()

    def group_members(self, group: str) -> set[str]:
        """The pods that joined the gang of ``group`` (see :meth:`join_group`)."""
        return set(self.client.smembers(self.key(Key.GROUP, group + GROUP_JOINED)))

    def reset_group_members(self, group: str) -> None:
        self.client.delete(self.key(Key.GROUP, group + GROUP_JOINED))
