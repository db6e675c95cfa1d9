"""Reliable Redis task queue for training runs (redis-py + Lua, no framework).

Every state change is one Lua script, so it is atomic and costs one round trip;
time comes from the Redis server (``TIME``), so worker clocks never matter.

Keys (``P`` = ``<namespace>:``, default ``ragpool:``; needs a non-cluster Redis/Valkey,
e.g. an ElastiCache replication group with cluster mode off):

====================  =====  ===========================================================
``P ready:<prio>``     list   queued task ids per priority; LPUSH on submit, RPOP on claim
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
import time
import uuid
from dataclasses import dataclass
from typing import Any, Iterable

from training.scheduler.spec import PRIORITIES, RunSpec

STATES: tuple[str, ...] = ("queued", "running", "succeeded", "failed", "dead", "cancelled")
"""Every task state; the last three are terminal except that ``retry`` revives ``dead``."""
TERMINAL_STATES = frozenset({"succeeded", "dead", "cancelled"})
OUTCOMES: tuple[str, ...] = ("succeeded", "failed", "dead", "cancelled")
"""``outcome`` label values of the completion counter and duration histogram."""

DURATION_BUCKETS: tuple[float, ...] = (
    0.005, 0.05, 0.5, 1, 5, 30, 60, 300, 900, 1800, 3600, 7200, 14400, 28800, 86400,
)
"""Upper bounds (seconds) of the attempt-duration histogram; +Inf is implicit."""

MAX_ERROR_CHARS = 4000
"""Longest error text kept in a task hash."""
FREE_RELEASES = 20
"""Releases (graceful hand-backs: preemption, drain) a task gets for free; past this each
release spends an attempt, so a run that always exits retriable ends in the dead-letter list."""

_PRELUDE = """
local p = ARGV[1]
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local nows = string.format('%.6f', now)
local BUCKETS = {__BUCKETS__}
local PRIOS = {__PRIOS__}

-- Counter increments are summed here and written once at the end of the script
-- (a batch of 32 acks costs one HINCRBY per counter, not 32).
local pending, pending_float = {}, {}
local function bump(key, field, by)
  local k = key .. '\\31' .. field
  pending[k] = (pending[k] or 0) + by
end
local function bumpf(key, field, by)
  local k = key .. '\\31' .. field
  pending_float[k] = (pending_float[k] or 0) + by
end
local function flush()
  for k, by in pairs(pending) do
    local sep = string.find(k, '\\31', 1, true)
    redis.call('HINCRBY', string.sub(k, 1, sep - 1), string.sub(k, sep + 1), by)
  end
  for k, by in pairs(pending_float) do
    local sep = string.find(k, '\\31', 1, true)
    redis.call('HINCRBYFLOAT', string.sub(k, 1, sep - 1), string.sub(k, sep + 1), string.format('%.6f', by))
  end
end

local function observe(tk, outcome, claimed_at)
  local claimed = tonumber(claimed_at or redis.call('HGET', tk, 'claimed_at') or '')
  if not claimed then return end
  local d = now - claimed
  if d < 0 then d = 0 end
  local idx = #BUCKETS + 1
  for i, le in ipairs(BUCKETS) do
    if d <= le then idx = i break end
  end
  local hk = p .. 'duration:' .. outcome
  bump(hk, 'b' .. idx, 1)
  bumpf(hk, 'sum', d)
end

-- Terminal transition; was_running says whether an attempt just ended.
local function finish(id, tk, outcome, err, was_running, claimed_at)
  if was_running then observe(tk, outcome, claimed_at) end
  redis.call('ZREM', p .. 'leases', id)
  redis.call('HSET', tk, 'state', outcome, 'finished_at', nows, 'lease_token', '')
  if err then redis.call('HSET', tk, 'last_error', err) end
  bump(p .. 'stats', 'completed:' .. outcome, 1)
  if outcome == 'dead' then redis.call('LPUSH', p .. 'dead', id) end
  if outcome == 'succeeded' then redis.call('HINCRBY', tk, 'completions', 1) end
end

local function wake()
  redis.call('LPUSH', p .. 'wake', '1')
  redis.call('LTRIM', p .. 'wake', 0, 1023)
end

-- Back to the head of its priority list (it is resumed next).
local function requeue(id, tk)
  redis.call('ZREM', p .. 'leases', id)
  redis.call('HSET', tk, 'state', 'queued', 'enqueued_at', nows, 'lease_token', '')
  redis.call('RPUSH', p .. redis.call('HGET', tk, 'ready'), id)
  wake()
end

local function reap(id)
  local tk = p .. 'task:' .. id
  local st = redis.call('HMGET', tk, 'state', 'attempts', 'max_attempts', 'cancel_requested', 'worker')
  if st[1] ~= 'running' then
    redis.call('ZREM', p .. 'leases', id)
    return
  end
  local err = 'lease expired: worker ' .. tostring(st[5]) .. ' stopped heartbeating'
  if st[4] == '1' then
    finish(id, tk, 'cancelled', nil, true)
  elseif tonumber(st[2]) >= tonumber(st[3]) then
    finish(id, tk, 'dead', err, true)
  else
    observe(tk, 'failed')
    bump(p .. 'stats', 'completed:failed', 1)
    bump(p .. 'stats', 'retries_total', 1)
    bump(p .. 'stats', 'reaped_total', 1)
    redis.call('HSET', tk, 'last_error', err)
    requeue(id, tk)
  end
end

-- Reap expired leases and promote retries whose backoff is over (any claimer does this).
local function housekeeping()
  for _, id in ipairs(redis.call('ZRANGEBYSCORE', p .. 'leases', '-inf', nows, 'LIMIT', 0, 64)) do
    reap(id)
  end
  for _, id in ipairs(redis.call('ZRANGEBYSCORE', p .. 'delayed', '-inf', nows, 'LIMIT', 0, 128)) do
    redis.call('ZREM', p .. 'delayed', id)
    local tk = p .. 'task:' .. id
    if redis.call('HGET', tk, 'state') == 'failed' then requeue(id, tk) end
  end
end

-- Lease one task (highest priority, oldest first; or only_id) to worker; false when none.
local function take(worker, nonce, lease, only_id, suffix)
  local id = false
  if only_id ~= '' then
    local tk = p .. 'task:' .. only_id
    if redis.call('HGET', tk, 'state') == 'queued' then
      redis.call('LREM', p .. redis.call('HGET', tk, 'ready'), 1, only_id)
      id = only_id
    end
  else
    for _ = 1, 64 do
      for _, prio in ipairs(PRIOS) do
        id = redis.call('RPOP', p .. 'ready:' .. prio .. suffix)
        if id then break end
      end
      if not id then break end
      -- Defensive: a stale entry (state changed under it) is dropped, not run.
      if redis.call('HGET', p .. 'task:' .. id, 'state') == 'queued' then break end
      id = false
    end
  end
  if not id then return false end
  local tk = p .. 'task:' .. id
  local f = redis.call('HMGET', tk, 'attempts', 'fence', 'spec', 'max_attempts', 'enqueued_at', 'timeout_s')
  local attempts = tonumber(f[1]) + 1
  local token = nonce .. '.' .. (tonumber(f[2]) + 1)
  local deadline = string.format('%.6f', now + lease)
  redis.call('HSET', tk, 'state', 'running', 'worker', worker, 'lease_token', token, 'attempts', attempts,
             'fence', tonumber(f[2]) + 1, 'claimed_at', nows, 'heartbeat_at', nows, 'lease_deadline', deadline)
  redis.call('ZADD', p .. 'leases', deadline, id)
  -- One string per claim (fields joined by the ASCII unit separator, which JSON escapes):
  -- one reply element instead of eight keeps client-side parsing cheap.
  return table.concat({id, token, f[3], attempts, f[4], f[5], nows, f[6]}, '\\31')
end

-- Housekeeping, then lease up to n tasks; clears stale wake tokens when the queue is empty.
local function claim(worker, nonce, lease, only_id, n, nodes)
  local suffix = ''
  if nodes and nodes > 1 then suffix = ':n' .. nodes end
  housekeeping()
  redis.call('HSET', p .. 'workers', worker, nows)
  local out = {}
  for i = 1, n do
    local c = take(worker, nonce .. i, lease, only_id, suffix)
    if not c then break end
    out[i] = c
    if only_id ~= '' then break end
  end
  if #out < n and only_id == '' then redis.call('DEL', p .. 'wake') end
  return out
end

-- Check the fence: the task is running under this token.
local function owns(tk, token)
  local st = redis.call('HMGET', tk, 'state', 'lease_token', 'claimed_at')
  return st[1] == 'running' and st[2] == token, st[1], st[3]
end
"""

_SUBMIT = """
local id, spec, prio, max_attempts, timeout, nodes = ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6], tonumber(ARGV[7])
local tk = p .. 'task:' .. id
-- Multi-node runs wait in their own list per node count, claimed only by Jobs of that size.
local ready = 'ready:' .. prio
if nodes > 1 then
  ready = ready .. ':n' .. nodes
  redis.call('SADD', p .. 'nodesets', nodes)
end
if redis.call('EXISTS', tk) == 1 then
  local st = redis.call('HMGET', tk, 'state', 'spec')
  return {'exists', st[1], st[2] == spec and 1 or 0}
end
redis.call('HSET', tk, 'id', id, 'spec', spec, 'priority', prio, 'max_attempts', max_attempts,
           'timeout_s', timeout, 'state', 'queued', 'attempts', 0, 'fence', 0, 'completions', 0,
           'created_at', nows, 'enqueued_at', nows, 'nodes', nodes, 'ready', ready)
redis.call('ZADD', p .. 'tasks', nows, id)
redis.call('LPUSH', p .. ready, id)
wake()
return {'created', 'queued', 1}
"""

_CLAIM = """
return claim(ARGV[2], ARGV[3], tonumber(ARGV[4]), ARGV[5], tonumber(ARGV[6]), tonumber(ARGV[7]))
"""

_ACK = """
local id, token = ARGV[2], ARGV[3]
local tk = p .. 'task:' .. id
local ok, state, claimed_at = owns(tk, token)
if not ok then return {0, state or 'missing'} end
finish(id, tk, 'succeeded', nil, true, claimed_at)
return {1, 'succeeded'}
"""

_ACK_MANY = """
-- ARGV[2] = n acks, then n (id, token) pairs, then optionally worker, nonce, lease, n_claim.
local n = tonumber(ARGV[2])
local acked = {}
for i = 1, n do
  local id, token = ARGV[1 + 2 * i], ARGV[2 + 2 * i]
  local tk = p .. 'task:' .. id
  local ok, _, claimed_at = owns(tk, token)
  if ok then
    finish(id, tk, 'succeeded', nil, true, claimed_at)
    acked[i] = '1'
  else
    acked[i] = '0'
  end
end
acked = table.concat(acked)
local k = 3 + 2 * n
if ARGV[k] then
  return {acked, claim(ARGV[k], ARGV[k + 1], tonumber(ARGV[k + 2]), '', tonumber(ARGV[k + 3]), 1)}
end
return {acked, {}}
"""

_HEARTBEAT = """
local id, token, lease, worker = ARGV[2], ARGV[3], tonumber(ARGV[4]), ARGV[5]
local tk = p .. 'task:' .. id
redis.call('HSET', p .. 'workers', worker, nows)
if not owns(tk, token) then return 'lost' end
local deadline = string.format('%.6f', now + lease)
redis.call('ZADD', p .. 'leases', deadline, id)
redis.call('HSET', tk, 'heartbeat_at', nows, 'lease_deadline', deadline)
if redis.call('HGET', tk, 'cancel_requested') == '1' then return 'cancel' end
return 'ok'
"""

_FAIL = """
local id, token, err, retriable = ARGV[2], ARGV[3], ARGV[4], ARGV[5] == '1'
local base, cap = tonumber(ARGV[6]), tonumber(ARGV[7])
local tk = p .. 'task:' .. id
if not owns(tk, token) then return {'stale'} end
local f = redis.call('HMGET', tk, 'attempts', 'max_attempts', 'cancel_requested')
if f[3] == '1' then
  finish(id, tk, 'cancelled', err, true)
  return {'cancelled'}
end
local attempts = tonumber(f[1])
if (not retriable) or attempts >= tonumber(f[2]) then
  finish(id, tk, 'dead', err, true)
  return {'dead'}
end
observe(tk, 'failed')
local delay = math.min(cap, base * math.pow(2, attempts - 1))
local due = string.format('%.6f', now + delay)
redis.call('ZREM', p .. 'leases', id)
redis.call('HSET', tk, 'state', 'failed', 'last_error', err, 'lease_token', '', 'next_attempt_at', due)
redis.call('ZADD', p .. 'delayed', due, id)
bump(p .. 'stats', 'completed:failed', 1)
bump(p .. 'stats', 'retries_total', 1)
return {'retry', due}
"""

_RELEASE = """
local id, token, reason = ARGV[2], ARGV[3], ARGV[4]
local tk = p .. 'task:' .. id
if not owns(tk, token) then return 'stale' end
if redis.call('HGET', tk, 'cancel_requested') == '1' then
  finish(id, tk, 'cancelled', nil, true)
  return 'cancelled'
end
local releases = redis.call('HINCRBY', tk, 'releases', 1)
bump(p .. 'stats', 'released_total', 1)
redis.call('HSET', tk, 'last_error', reason)
if releases <= tonumber(ARGV[5]) then
  -- a graceful hand-back (preemption, drain) does not spend an attempt ...
  redis.call('HINCRBY', tk, 'attempts', -1)
else
  -- ... unless it keeps happening: a run that always exits retriable must not loop forever.
  local f = redis.call('HMGET', tk, 'attempts', 'max_attempts')
  if tonumber(f[1]) >= tonumber(f[2]) then
    finish(id, tk, 'dead', reason .. ' (released ' .. releases .. ' times)', true)
    return 'dead'
  end
end
requeue(id, tk)
return 'released'
"""

_CANCEL = """
local id = ARGV[2]
local tk = p .. 'task:' .. id
local st = redis.call('HMGET', tk, 'state', 'ready')
if not st[1] then return 'missing' end
if st[1] == 'queued' then
  redis.call('LREM', p .. st[2], 1, id)
  finish(id, tk, 'cancelled', nil, false)
  return 'cancelled'
elseif st[1] == 'failed' then
  redis.call('ZREM', p .. 'delayed', id)
  finish(id, tk, 'cancelled', nil, false)
  return 'cancelled'
elseif st[1] == 'running' then
  redis.call('HSET', tk, 'cancel_requested', '1')
  return 'cancelling'
end
return 'finished:' .. st[1]
"""

_RETRY = """
local id = ARGV[2]
local tk = p .. 'task:' .. id
local state = redis.call('HGET', tk, 'state')
if not state then return 'missing' end
if state ~= 'dead' then return state end
redis.call('LREM', p .. 'dead', 0, id)
redis.call('HSET', tk, 'attempts', 0, 'cancel_requested', '0', 'finished_at', '')
redis.call('HINCRBY', tk, 'retried_from_dead', 1)
redis.call('HSET', tk, 'state', 'queued', 'enqueued_at', nows)
redis.call('LPUSH', p .. redis.call('HGET', tk, 'ready'), id)
wake()
return 'requeued'
"""

_REAP = """
local n = 0
for _, id in ipairs(redis.call('ZRANGEBYSCORE', p .. 'leases', '-inf', nows, 'LIMIT', 0, 1000)) do
  reap(id)
  n = n + 1
end
return n
"""


def _script_text(body: str) -> str:
    prelude = _PRELUDE.replace("__BUCKETS__", ", ".join(repr(float(b)) for b in DURATION_BUCKETS))
    prelude = prelude.replace("__PRIOS__", ", ".join(f"'{p}'" for p in PRIORITIES))
    # Every exit path of the body goes through flush() of the deferred counters.
    return prelude + "local function main()\n" + body + "\nend\nlocal result = main()\nflush()\nreturn result\n"


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
            spec_json=h.get("spec", ""),
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


class TaskQueue:
    """The queue API over one redis-py client (``decode_responses=True``)."""

    def __init__(self, client, *, namespace: str = "ragpool", lease_seconds: float = 60.0,
                 backoff_base_s: float = 30.0, backoff_max_s: float = 3600.0) -> None:
        if lease_seconds <= 0 or backoff_base_s < 0 or backoff_max_s < backoff_base_s:
            raise ValueError("lease_seconds > 0 and 0 <= backoff_base_s <= backoff_max_s required")
        self.client = client
        self.prefix = f"{namespace}:"
        self.lease_seconds = float(lease_seconds)
        self.backoff_base_s = float(backoff_base_s)
        self.backoff_max_s = float(backoff_max_s)
        reg = client.register_script
        self._submit = reg(_script_text(_SUBMIT))
        self._claim = reg(_script_text(_CLAIM))
        self._ack = reg(_script_text(_ACK))
        self._ack_many = reg(_script_text(_ACK_MANY))
        self._heartbeat = reg(_script_text(_HEARTBEAT))
        self._fail = reg(_script_text(_FAIL))
        self._release = reg(_script_text(_RELEASE))
        self._cancel = reg(_script_text(_CANCEL))
        self._retry = reg(_script_text(_RETRY))
        self._reap = reg(_script_text(_REAP))

    def key(self, *parts: str) -> str:
        return self.prefix + ":".join(parts)

    # -- producers -------------------------------------------------------------------------

    def submit(self, spec: RunSpec) -> SubmitResult:
        """Enqueue a validated run; the same run id twice is one task (idempotent)."""
        return self.submit_payload(spec.run_id, spec.to_json(), priority=spec.priority,
                                   max_attempts=spec.max_attempts, timeout_s=spec.timeout_seconds,
                                   nodes=spec.nodes)

    def submit_payload(self, task_id: str, payload: str, *, priority: str = "normal",
                       max_attempts: int = 3, timeout_s: float = 86400, nodes: int = 1) -> SubmitResult:
        """Lower level :meth:`submit` for an already validated payload string."""
        if priority not in PRIORITIES:
            raise ValueError(f"priority must be one of {PRIORITIES}, got {priority!r}")
        status, state, same = self._submit(args=[self.prefix, task_id, payload, priority,
                                                 int(max_attempts), timeout_s, int(nodes)])
        return SubmitResult(created=status == "created", state=state, same_spec=bool(int(same)))

    def cancel(self, task_id: str) -> str:
        """Cancel: ``cancelled`` (was waiting), ``cancelling`` (running: its worker stops it at the
        next heartbeat), ``missing``, or ``finished:<state>`` when it had already ended."""
        return self._cancel(args=[self.prefix, task_id])

    def retry(self, task_id: str) -> str:
        """Move a dead-letter task back to the queue with fresh attempts: ``requeued``,
        ``missing``, or its current state when it is not dead (nothing changes then)."""
        return self._retry(args=[self.prefix, task_id])

    # -- consumers -------------------------------------------------------------------------

    def claim(self, worker_id: str, *, block_s: float = 0.0, run_id: str | None = None,
              poll_s: float = 1.0, nodes: int = 1) -> Claim | None:
        """Lease the next task (highest priority, oldest first) or ``run_id`` specifically.

        With ``block_s`` > 0 waits up to that long, woken by submits/requeues (BLPOP on
        the wake list) and re-checking at least every ``poll_s`` for due retries and
        expired leases. ``nodes`` > 1 claims only runs of exactly that many nodes (an
        Indexed Job's index-0 pod); ordinary single-pod workers never see multi-node runs.
        """
        claims = self.claim_batch(worker_id, 1, block_s=block_s, run_id=run_id, poll_s=poll_s, nodes=nodes)
        return claims[0] if claims else None

    def claim_batch(self, worker_id: str, max_tasks: int, *, block_s: float = 0.0,
                    run_id: str | None = None, poll_s: float = 1.0, nodes: int = 1) -> list[Claim]:
        """Lease up to ``max_tasks`` tasks in one round trip (each with its own lease and token)."""
        deadline = time.monotonic() + block_s
        while True:
            reply = self._claim(args=[self.prefix, worker_id, uuid.uuid4().hex[:16],
                                      self.lease_seconds, run_id or "", int(max_tasks), int(nodes)])
            if reply:
                return [Claim._from_reply(r) for r in reply]
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return []
            self.client.blpop([self.key("wake")], timeout=max(0.01, min(remaining, poll_s)))

    def ack_batch(self, claims: list[Claim], *, worker_id: str | None = None,
                  claim_next: int = 0) -> tuple[list[bool], list[Claim]]:
        """Ack ``claims`` and, when ``claim_next`` > 0, lease up to that many more tasks for
        ``worker_id``, all in one round trip. Returns (acked flags, new claims)."""
        args: list = [self.prefix, len(claims)]
        for c in claims:
            args += [c.task_id, c.token]
        if claim_next > 0:
            if worker_id is None:
                raise ValueError("claim_next needs worker_id")
            args += [worker_id, uuid.uuid4().hex[:16], self.lease_seconds, int(claim_next)]
        acked, new = self._ack_many(args=args)
        return [a == "1" for a in acked], [Claim._from_reply(r) for r in new]

    def ack_and_claim(self, claim: Claim, worker_id: str) -> tuple[bool, Claim | None]:
        """Ack ``claim`` and lease the next task in one round trip."""
        acked, new = self.ack_batch([claim], worker_id=worker_id, claim_next=1)
        return acked[0], (new[0] if new else None)

    def heartbeat(self, claim: Claim, worker_id: str) -> str:
        """Extend the lease: ``ok``, ``cancel`` (stop the run, then :meth:`cancelled`),
        or ``lost`` (the lease was reaped or the task changed: stop, do not ack)."""
        return self._heartbeat(args=[self.prefix, claim.task_id, claim.token, self.lease_seconds, worker_id])

    def ack(self, claim: Claim) -> bool:
        """Record success; False when the lease is no longer ours (nothing recorded)."""
        ok, _state = self._ack(args=[self.prefix, claim.task_id, claim.token])
        return bool(ok)

    def fail(self, claim: Claim, error: str, *, retriable: bool = True) -> str:
        """Record a failed attempt: ``retry`` (after exponential backoff), ``dead``
        (attempts exhausted or not retriable), ``cancelled`` or ``stale`` (not our lease)."""
        reply = self._fail(args=[self.prefix, claim.task_id, claim.token, error[-MAX_ERROR_CHARS:],
                                 "1" if retriable else "0", self.backoff_base_s, self.backoff_max_s])
        return reply[0]

    def release(self, claim: Claim, reason: str = "released by worker") -> str:
        """Give the task back without spending an attempt (graceful stop): ``released``,
        ``cancelled`` (a cancel was pending) or ``stale``. After ``FREE_RELEASES`` releases
        each further one spends an attempt, ending ``dead`` once attempts run out."""
        return self._release(args=[self.prefix, claim.task_id, claim.token, reason[-MAX_ERROR_CHARS:],
                                   FREE_RELEASES])

    def cancelled(self, claim: Claim) -> str:
        """Confirm a cancel the heartbeat reported (same fencing as release)."""
        return self.release(claim, "cancelled")

    def reap(self) -> int:
        """Return expired leases to the queue now (claims also do this); returns how many."""
        return int(self._reap(args=[self.prefix]))

    # -- reads -----------------------------------------------------------------------------

    def get(self, task_id: str) -> TaskInfo | None:
        h = self.client.hgetall(self.key("task", task_id))
        return TaskInfo.from_hash(h) if h else None

    def list(self, limit: int = 100, states: Iterable[str] | None = None) -> list[TaskInfo]:
        """Newest tasks first (up to ``limit``), optionally only in ``states``."""
        wanted = set(states) if states else None
        ids = self.client.zrevrange(self.key("tasks"), 0, max(0, limit - 1) if wanted is None else -1)
        out: list[TaskInfo] = []
        for start in range(0, len(ids), 500):
            pipe = self.client.pipeline(transaction=False)
            for task_id in ids[start:start + 500]:
                pipe.hgetall(self.key("task", task_id))
            for h in pipe.execute():
                if h and (wanted is None or h.get("state") in wanted):
                    out.append(TaskInfo.from_hash(h))
                    if len(out) >= limit:
                        return out
        return out

    def dead_letter(self) -> list[str]:
        return self.client.lrange(self.key("dead"), 0, -1)

    def stats(self) -> QueueStats:
        """Depths, ages, counters and histograms for the exporter (a few pipelined round trips)."""
        nodesets = sorted(int(n) for n in self.client.smembers(self.key("nodesets")))
        pipe = self.client.pipeline(transaction=False)
        pipe.time()
        pipe.zcard(self.key("leases"))
        pipe.zcard(self.key("delayed"))
        pipe.llen(self.key("dead"))
        pipe.hgetall(self.key("stats"))
        for outcome in OUTCOMES:
            pipe.hgetall(self.key("duration", outcome))
        pipe.hgetall(self.key("workers"))
        res = pipe.execute()
        sec, usec = res[0]
        now = sec + usec / 1e6
        j = 1
        running, delayed, dead = int(res[j]), int(res[j + 1]), int(res[j + 2])
        counters = {k: int(float(v)) for k, v in res[j + 3].items()}
        durations = {o: {k: float(v) for k, v in res[j + 4 + i].items()} for i, o in enumerate(OUTCOMES)}
        workers = {w: float(v) for w, v in res[j + 4 + len(OUTCOMES)].items()}
        # Oldest waiting task per priority over the single-node and every multi-node list.
        lists = [(prio, self.key("ready", prio) + (f":n{n}" if n > 1 else "")) for prio in PRIORITIES
                 for n in [1, *nodesets]]
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
            pipe.hget(self.key("task", task_id), "enqueued_at")
        ages = {prio: 0.0 for prio in PRIORITIES}
        for (prio, _id), enq in zip(heads, pipe.execute()):
            if enq:
                ages[prio] = max(ages[prio], now - float(enq))
        return QueueStats(now=now, depth=depth, oldest_age_s=ages, running=running, delayed=delayed,
                          dead_letter=dead, counters=counters, durations=durations, workers=workers)

    # -- multi-node groups -----------------------------------------------------------------

    def publish_group(self, group: str, claim: Claim, info: dict[str, Any], ttl_s: int) -> None:
        """Index-0 pod: share the claimed task with the other pods of its Indexed Job."""
        self.client.set(self.key("group", group), json.dumps({"task_id": claim.task_id,
                                                              "attempt": claim.attempt, **info}), ex=ttl_s)

    def read_group(self, group: str) -> dict[str, Any] | None:
        raw = self.client.get(self.key("group", group))
        return json.loads(raw) if raw else None

    def clear_group(self, group: str) -> None:
        self.client.delete(self.key("group", group))
