-- Shared by every queue script: run_queue.py loads this file once and puts it in front
-- of each command's body (one registered script per command).
--
-- ARGV[1] is the queue's layout as JSON, built in run_queue.py (the one home of these values):
--   prefix        the namespace prefix, e.g. "ragpool:"
--   keys          role -> key name under the prefix ("task" and "ready" are name stems;
--                 a ready list is ready:<prio><lane>, the lane chosen by run_queue.lane)
--   priorities    priority names, highest first
--   buckets       upper bounds (seconds) of the attempt-duration histogram; +Inf is implicit
-- ARGV[2..] are the command's own arguments.
local cfg = cjson.decode(ARGV[1])
local p, K
-- Point every key at the namespace prefix ``prefix`` (tick.lua walks several namespaces).
local function use_prefix(prefix)
  p = prefix
  K = {}
  for role, name in pairs(cfg.keys) do K[role] = p .. name end
end
use_prefix(cfg.prefix)
local BUCKETS, PRIOS = cfg.buckets, cfg.priorities

local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local nows = string.format('%.6f', now)

-- Counter increments are summed here and written once at the end of the script
-- (a batch of 32 acks costs one HINCRBY per counter, not 32).
local pending, pending_float = {}, {}
local function bump(key, field, by)
  local k = key .. '\31' .. field
  pending[k] = (pending[k] or 0) + by
end
local function bumpf(key, field, by)
  local k = key .. '\31' .. field
  pending_float[k] = (pending_float[k] or 0) + by
end
local function flush()
  for k, by in pairs(pending) do
    local sep = string.find(k, '\31', 1, true)
    redis.call('HINCRBY', string.sub(k, 1, sep - 1), string.sub(k, sep + 1), by)
  end
  for k, by in pairs(pending_float) do
    local sep = string.find(k, '\31', 1, true)
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
  local hk = K.duration .. outcome
  bump(hk, 'b' .. idx, 1)
  bumpf(hk, 'sum', d)
end

-- Terminal transition; was_running says whether an attempt just ended.
local function finish(id, tk, outcome, err, was_running, claimed_at)
  if was_running then observe(tk, outcome, claimed_at) end
  redis.call('ZREM', K.leases, id)
  redis.call('HSET', tk, 'state', outcome, 'finished_at', nows, 'lease_token', '')
  if err then redis.call('HSET', tk, 'last_error', err) end
  bump(K.stats, 'completed:' .. outcome, 1)
  if outcome == 'dead' then redis.call('LPUSH', K.dead, id) end
  if outcome == 'succeeded' then redis.call('HINCRBY', tk, 'completions', 1) end
end

local function wake()
  redis.call('LPUSH', K.wake, '1')
  redis.call('LTRIM', K.wake, 0, 1023)
end

-- Back to the head of its priority list (it is resumed next).
local function requeue(id, tk)
  redis.call('ZREM', K.leases, id)
  redis.call('HSET', tk, 'state', 'queued', 'enqueued_at', nows, 'lease_token', '')
  redis.call('RPUSH', p .. redis.call('HGET', tk, 'ready'), id)
  wake()
end

local function reap(id)
  local tk = K.task .. id
  local st = redis.call('HMGET', tk, 'state', 'attempts', 'max_attempts', 'cancel_requested', 'worker')
  if st[1] ~= 'running' then
    redis.call('ZREM', K.leases, id)
    return
  end
  local err = 'lease expired: worker ' .. tostring(st[5]) .. ' stopped heartbeating'
  if st[4] == '1' then
    finish(id, tk, 'cancelled', nil, true)
  elseif tonumber(st[2]) >= tonumber(st[3]) then
    finish(id, tk, 'dead', err, true)
  else
    observe(tk, 'failed')
    bump(K.stats, 'completed:failed', 1)
    bump(K.stats, 'retries_total', 1)
    bump(K.stats, 'reaped_total', 1)
    redis.call('HSET', tk, 'last_error', err)
    requeue(id, tk)
  end
end

-- Reap expired leases and promote retries whose backoff is over (any claimer does this, at most
-- 64 and 128 at a time; the keeper's tick.lua passes larger limits). Returns {reaped, promoted}.
local function housekeeping(max_leases, max_delayed)
  local reaped, promoted = 0, 0
  for _, id in ipairs(redis.call('ZRANGEBYSCORE', K.leases, '-inf', nows, 'LIMIT', 0, max_leases or 64)) do
    reap(id)
    reaped = reaped + 1
  end
  for _, id in ipairs(redis.call('ZRANGEBYSCORE', K.delayed, '-inf', nows, 'LIMIT', 0, max_delayed or 128)) do
    redis.call('ZREM', K.delayed, id)
    local tk = K.task .. id
    if redis.call('HGET', tk, 'state') == 'failed' then
      requeue(id, tk)
      promoted = promoted + 1
    end
  end
  return {reaped, promoted}
end

-- Lease one task to worker (highest priority first, then the worker's lanes in order, oldest
-- first; or only_id when it waits in one of those lanes); false when none. prios: the priorities
-- it claims, highest first (a subset of PRIOS).
local function take(worker, nonce, lease, only_id, lanes, prios)
  local id = false
  if only_id ~= '' then
    local tk = K.task .. only_id
    local st = redis.call('HMGET', tk, 'state', 'ready', 'priority')
    if st[1] == 'queued' then
      for _, prio in ipairs(prios) do
        for _, lane in ipairs(lanes) do
          if st[2] == cfg.keys.ready .. prio .. lane then id = only_id break end
        end
        if id then break end
      end
      if id then redis.call('LREM', p .. st[2], 1, only_id) end
    end
  else
    for _ = 1, 64 do
      for _, prio in ipairs(prios) do
        for _, lane in ipairs(lanes) do
          id = redis.call('RPOP', K.ready .. prio .. lane)
          if id then break end
        end
        if id then break end
      end
      if not id then break end
      -- Defensive: a stale entry (state changed under it) is dropped, not run.
      if redis.call('HGET', K.task .. id, 'state') == 'queued' then break end
      id = false
    end
  end
  if not id then return false end
  local tk = K.task .. id
  local f = redis.call('HMGET', tk, 'attempts', 'fence', 'spec', 'max_attempts', 'enqueued_at', 'timeout_s')
  local attempts = tonumber(f[1]) + 1
  local token = nonce .. '.' .. (tonumber(f[2]) + 1)
  local deadline = string.format('%.6f', now + lease)
  redis.call('HSET', tk, 'state', 'running', 'worker', worker, 'lease_token', token, 'attempts', attempts,
             'fence', tonumber(f[2]) + 1, 'claimed_at', nows, 'heartbeat_at', nows, 'lease_deadline', deadline)
  redis.call('ZADD', K.leases, deadline, id)
  -- One string per claim (fields joined by the ASCII unit separator, which JSON escapes):
  -- one reply element instead of eight keeps client-side parsing cheap.
  return table.concat({id, token, f[3], attempts, f[4], f[5], nows, f[6]}, '\31')
end

-- Housekeeping, then lease up to n tasks from the lanes (a JSON list, see run_queue.lane);
-- clears stale wake tokens when the queue is empty.
-- lanes_json: the lanes' suffixes (a JSON list: every priority), or {"lanes": [...], "priorities": [...]}
-- (only those priorities: a worker started for one priority's runs, contract/lanes.py PRIORITIES_ENV).
local function claim(worker, nonce, lease, only_id, n, lanes_json)
  local lanes, prios = cjson.decode(lanes_json), PRIOS
  if lanes.lanes then
    local wanted = {}
    for _, prio in ipairs(lanes.priorities or PRIOS) do wanted[prio] = true end
    prios = {}
    for _, prio in ipairs(PRIOS) do
      if wanted[prio] then prios[#prios + 1] = prio end
    end
    lanes = lanes.lanes
  end
  housekeeping()
  redis.call('HSET', K.workers, worker, nows)
  local out = {}
  for i = 1, n do
    local c = take(worker, nonce .. i, lease, only_id, lanes, prios)
    if not c then break end
    out[i] = c
    if only_id ~= '' then break end
  end
  if #out < n and only_id == '' then redis.call('DEL', K.wake) end
  return out
end

-- Check the fence: the task is running under this token.
local function owns(tk, token)
  local st = redis.call('HMGET', tk, 'state', 'lease_token', 'claimed_at')
  return st[1] == 'running' and st[2] == token, st[1], st[3]
end
