-- fail(id, token, error, retriable '1'/'0', backoff_base_s, backoff_max_s) -> {'retry', due} | {'dead'} | {'cancelled'} | {'stale'}
local id, token, err, retriable = ARGV[2], ARGV[3], ARGV[4], ARGV[5] == '1'
local base, cap = tonumber(ARGV[6]), tonumber(ARGV[7])
local tk = K.task .. id
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
redis.call('ZREM', K.leases, id)
redis.call('HSET', tk, 'state', 'failed', 'last_error', err, 'lease_token', '', 'next_attempt_at', due)
redis.call('ZADD', K.delayed, due, id)
bump(K.stats, 'completed:failed', 1)
bump(K.stats, 'retries_total', 1)
return {'retry', due}
