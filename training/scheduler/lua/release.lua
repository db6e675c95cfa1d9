-- release(id, token, reason, free_releases[, kind]) -> 'released' | 'cancelled' | 'dead' | 'stale'
-- kind (queue_records.Release): '' the child's own retriable exit; 'preempted' the worker's SIGTERM hand-back;
-- 'gang' a gang that never formed; 'unavailable' the executor's cluster could not be reached (Ray down,
-- token refused).
local id, token, reason = ARGV[2], ARGV[3], ARGV[4]
local tk = K.task .. id
if not owns(tk, token) then return 'stale' end
if redis.call('HGET', tk, 'cancel_requested') == '1' then
  finish(id, tk, 'cancelled', nil, true)
  return 'cancelled'
end
local kind = ARGV[6] or ''
if kind == 'gang' or kind == 'unavailable' then
  -- The run never started: a multi-node gang that never formed (not all pods joined in time), or
  -- an executor whose cluster could not be reached. Neither is the run's fault, so this never
  -- spends an attempt however often it happens; counted for the alerts.
  if kind == 'gang' then
    redis.call('HINCRBY', tk, 'gang_timeouts', 1)
    bump(K.stats, 'gang_timeouts:' .. redis.call('HGET', tk, 'ready'), 1)
  else
    redis.call('HINCRBY', tk, 'unavailable_releases', 1)
    bump(K.stats, 'unavailable_releases_total', 1)
  end
  redis.call('HINCRBY', tk, 'attempts', -1)
  redis.call('HSET', tk, 'last_error', reason)
  requeue(id, tk)
  return 'released'
end
if kind == 'preempted' then
  -- The worker was told to stop (Kueue evicted its Job, a spot reclaim, a drain) and the run
  -- checkpointed: never spends an attempt and never counts towards free_releases, so a run
  -- preempted any number of times is never dead-lettered for it. When (server time) is kept for
  -- ``ragpool status``.
  redis.call('HINCRBY', tk, 'preemptions', 1)
  bump(K.stats, 'released_total', 1)
  redis.call('HINCRBY', tk, 'attempts', -1)
  redis.call('HSET', tk, 'last_error', reason, 'last_preempted_at', nows)
  requeue(id, tk)
  return 'released'
end
local releases = redis.call('HINCRBY', tk, 'releases', 1)
bump(K.stats, 'released_total', 1)
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
