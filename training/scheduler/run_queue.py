"""The Redis task queue's client, :class:`TaskQueue` (redis-py + Lua, no framework).

Every state change is one Lua script (``lua/<command>.lua`` after the shared
``lua/prelude.lua``), so it is atomic and costs one round trip;
time comes from the Redis server (``TIME``), so worker clocks never matter.
The key layout, the task states and the records the calls return are in ``queue_records.py``;
a multi-node gang's keys are the worker's (``worker/group.py``).

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
from pathlib import Path
from typing import Any, Iterable, Sequence

from contract.defaults import DEFAULT_BACKOFF_BASE_S, DEFAULT_BACKOFF_MAX_S, DEFAULT_LEASE_S
from contract.env import NAMESPACE_ENV
from contract.lanes import DEFAULT_PRIORITY, PRIORITIES, Lane, known_lanes, lane_of, lane_of_ready_list, lanes_from_env, parse_lane, ready_list
from contract.names import DEFAULT_NAMESPACE
from training.scheduler.queue_records import (
    DURATION_BUCKETS, FREE_RELEASES, GANG_TIMEOUTS_STAT, OUTCOMES, Claim, Heartbeat, Key, LaneStats, QueueStats,
    Release, State, SubmitResult, TaskInfo, WorkerInfo, WorkerState,
)
from training.scheduler.redis_conn import (
    DEFAULT_REPLICA_WAIT_MS, NotReplicatedError, RedisSettings, connect, reconnect, settings_from_env, single_attempt,
)
from training.scheduler.spec import RunSpec


def lane(executor: str = "torchrun", nodes: int = 1, pool: str | None = None) -> str:
    """The ready-list suffix of a run: which workers may claim it (``lanes.Lane.suffix``, the one
    home of the lane rules: ``""``, ``:n<N>``, ``:pool:<P>[:n<N>]``, ``:ray``)."""
    return lane_of(executor, nodes, pool).suffix


MAX_ERROR_CHARS = 4000
"""Longest error text kept in a task hash."""


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


def _lanes(executors: Sequence[str], nodes: int, lanes: Sequence[Lane] | None = None,
           priorities: Sequence[str] | None = None) -> str:
    """The claim scripts' lanes argument: a JSON list of suffixes, in the order the worker prefers
    them (``lanes`` when given, else the unpinned lanes of ``executors`` and ``nodes``), or, when
    ``priorities`` names fewer than every priority (a per-priority ScaledJob's worker,
    ``RAGPOOL_PRIORITIES``), ``{"lanes": [...], "priorities": [...]}`` (lua/prelude.lua ``claim``)."""
    if lanes is None:
        if not executors:
            raise ValueError("a worker needs at least one executor")
        lanes = lanes_from_env(executors, nodes, environ={})
    if not lanes:
        raise ValueError("a worker needs at least one lane")
    suffixes = list(dict.fromkeys(lane.suffix for lane in lanes))
    if priorities is None:
        return json.dumps(suffixes)
    if not priorities or set(priorities) - set(PRIORITIES):
        raise ValueError(f"priorities must be some of {PRIORITIES}, got {list(priorities)!r}")
    chosen = [prio for prio in PRIORITIES if prio in priorities]
    if len(chosen) == len(PRIORITIES):
        return json.dumps(suffixes)
    return json.dumps({"lanes": suffixes, "priorities": chosen})

SINGLE_ATTEMPT_SCRIPTS = frozenset({"claim", "ack", "ack_many", "fail", "release", "takeover"})
"""Scripts sent at most once per call (``redis_conn.single_attempt``): resending a claim whose
reply was lost would lease a second task, and a resent ack/fail/release would report the
fence's "not yours" for a change it made itself (a resent takeover: "held" for its own). Their callers
handle the error (the worker keeps the outcome and repeats the fenced call). The others are idempotent
and retried."""


TICK_LIMIT = 100_000
"""Most lapsed leases, and most due retries, one keeper tick moves per namespace."""
WORKER_LIVE_S = 180.0
"""A registered worker not seen (registry, claim or heartbeat) for this long is gone."""


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

    def submit_payload(self, task_id: str, payload: str, *, priority: str = DEFAULT_PRIORITY,
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
              lanes: Sequence[Lane] | None = None, priorities: Sequence[str] | None = None) -> Claim | None:
        """Lease the next task (highest priority, oldest first) or ``run_id`` specifically.

        With ``block_s`` > 0 waits up to that long, woken by submits/requeues (BLPOP on
        the wake list) and re-checking at least every ``poll_s`` for due retries and
        expired leases. Only runs of the lanes of ``executors`` and ``nodes`` are claimed
        (:func:`lane`): ``nodes`` > 1 claims only torchrun runs of exactly that many nodes
        (an Indexed Job's index-0 pod), so single-pod workers never see multi-node runs, and
        only a worker with ``ray`` in ``executors`` sees ray runs. ``run_id`` too must be
        in one of those lanes. ``lanes`` (``lanes.Lane``) replaces ``executors``/``nodes`` with an
        exact set of lanes (pinned pools: ``lanes.worker_lanes``). ``priorities`` (default: every one)
        claims only runs of those priorities (a per-priority ScaledJob's worker, ``RAGPOOL_PRIORITIES``).
        """
        claims = self.claim_batch(worker_id, 1, block_s=block_s, run_id=run_id, poll_s=poll_s, nodes=nodes,
                                  executors=executors, lanes=lanes, priorities=priorities)
        return claims[0] if claims else None

    def claim_batch(self, worker_id: str, max_tasks: int, *, block_s: float = 0.0,
                    run_id: str | None = None, poll_s: float = 1.0, nodes: int = 1,
                    executors: Sequence[str] = ("torchrun",), lanes: Sequence[Lane] | None = None,
                    priorities: Sequence[str] | None = None) -> list[Claim]:
        """Lease up to ``max_tasks`` tasks in one round trip (each with its own lease and token).

        A claim no replica confirmed is handed back at once (best effort) and
        :class:`NotReplicatedError` raised: running it could run it twice if a failover
        then lost the claim. The claim script is sent once; on a connection error the
        caller tries again later (a lease whose reply was lost expires and is reaped)."""
        lanes_json = _lanes(executors, nodes, lanes, priorities)
        deadline = time.monotonic() + block_s
        while True:
            try:
                reply = self._call_replicated("claim", worker_id, uuid.uuid4().hex[:16], self.lease_seconds,
                                              run_id or "", int(max_tasks), lanes_json)
            except NotReplicatedError as exc:
                self._hand_back([Claim.from_reply(r) for r in exc.reply or []])
                raise
            if reply:
                return [Claim.from_reply(r) for r in reply]
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
                  executors: Sequence[str] = ("torchrun",), lanes: Sequence[Lane] | None = None,
                  priorities: Sequence[str] | None = None) -> tuple[list[bool], list[Claim]]:
        """Ack ``claims`` and, when ``claim_next`` > 0, lease up to that many more single-pod tasks
        of ``executors`` (or of ``lanes``; of ``priorities``, default every one) for ``worker_id``, all
        in one round trip. Returns (acked flags, new claims)."""
        args: list = [len(claims)]
        for c in claims:
            args += [c.task_id, c.token]
        if claim_next > 0:
            if worker_id is None:
                raise ValueError("claim_next needs worker_id")
            args += [worker_id, uuid.uuid4().hex[:16], self.lease_seconds, int(claim_next),
                     _lanes(executors, 1, lanes, priorities)]
        acked, new = self._call_replicated("ack_many", *args)
        return [a == "1" for a in acked], [Claim.from_reply(r) for r in new]

    def ack_and_claim(self, claim: Claim, worker_id: str, executors: Sequence[str] = ("torchrun",),
                      lanes: Sequence[Lane] | None = None,
                      priorities: Sequence[str] | None = None) -> tuple[bool, Claim | None]:
        """Ack ``claim`` and lease the next task (of ``priorities``, default every one) in one round trip."""
        acked, new = self.ack_batch([claim], worker_id=worker_id, claim_next=1, executors=executors, lanes=lanes,
                                    priorities=priorities)
        return acked[0], (new[0] if new else None)

    def heartbeat(self, claim: Claim, worker_id: str) -> Heartbeat:
        """Extend the lease (see :class:`Heartbeat` for the replies)."""
        return Heartbeat(self._call("heartbeat", claim.task_id, claim.token, self.lease_seconds, worker_id))

    def take_over(self, task_id: str, attempt: int, worker_id: str, *, stale_s: float) -> Claim | str:
        """An elastic run's survivor takes over the lease of ``attempt`` (``lua/takeover.lua``) when its holder's
        heartbeat is at least ``stale_s`` old (the holder's pod died: torch elastic trains on without it), or the
        holder handed it off (:meth:`hand_off`). The same attempt, a new token: the old holder is fenced (its
        heartbeat answers lost). Returns the new :class:`Claim`, or why not: ``held`` (the holder is live, or
        another survivor won), ``lost`` (the attempt is over) or ``fixed`` (a fixed-size run: refused). The
        holder's token is read here; the script's compare-and-set on it and on the heartbeat's age (or the
        hand-off) lets exactly one of two survivors win."""
        if stale_s <= 0:
            raise ValueError(f"stale_s must be > 0 (a fresh lease is never taken), got {stale_s}")
        holder = self.client.hget(self.key(Key.TASK, task_id), "lease_token") or ""
        status, *rest = self._call("takeover", task_id, int(attempt), holder, uuid.uuid4().hex[:16],
                                   self.lease_seconds, worker_id, float(stale_s))
        return Claim.from_reply(rest[0]) if status == "taken" else status

    def hand_off(self, claim: Claim) -> str:
        """An elastic run's holder leaving on SIGTERM while its gang trains on (``lua/handoff.lua``): mark the
        lease of ``claim`` as given up, so a survivor's :meth:`take_over` takes it at its next poll instead of
        after ``stale_s``. ``handed``, or ``stale`` (not ours any more). The lease is otherwise unchanged: the
        holder still releases the run if no survivor takes it."""
        return self._call("handoff", claim.task_id, claim.token)

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

