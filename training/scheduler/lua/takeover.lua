-- takeover(id, attempt, holder_token, nonce, lease_s, worker, stale_s) -> {'taken', claim} | {'held'} | {'lost'} | {'fixed'}
-- An elastic run's survivor (a follower pod whose torchrun trains on without the lease's holder) takes the
-- lease of attempt ``attempt`` over from ``holder_token``, whose heartbeat is ``stale_s`` old or older, or which
-- handed its lease off (handoff.lua: its pod is leaving on SIGTERM): same attempt (none spent), a new fenced
-- token, so the old holder's heartbeat/ack/fail/release find it 'lost'/'stale'.
-- 'taken': the claim string (as claim's take(): id, token, spec, attempts, max_attempts, enqueued_at,
-- claimed_at, timeout_s); 'held': the holder is live or another survivor took it first (the run goes on);
-- 'lost': the attempt is over (ended, reaped, another attempt); 'fixed': not an elastic run (refused: a
-- fixed-size gang cannot train without a pod, so its run goes back to its lane as before).
local id, attempt, holder, nonce = ARGV[2], tonumber(ARGV[3]), ARGV[4], ARGV[5]
local lease, worker, stale = tonumber(ARGV[6]), ARGV[7], tonumber(ARGV[8])
local tk = K.task .. id
redis.call('HSET', K.workers, worker, nows)
local f = redis.call('HMGET', tk, 'state', 'lease_token', 'attempts', 'heartbeat_at', 'fence', 'spec',
                     'max_attempts', 'enqueued_at', 'claimed_at', 'timeout_s', 'handoff')
if f[1] ~= 'running' or tonumber(f[3]) ~= attempt then return {'lost'} end
local ok, spec = pcall(cjson.decode, f[6] or '')
if not ok or type(spec) ~= 'table' or type(spec.nodes) ~= 'table' then return {'fixed'} end
if f[2] ~= holder or (f[11] ~= holder and now - tonumber(f[4] or '0') < stale) then return {'held'} end
local fence = tonumber(f[5]) + 1
local token = nonce .. '.' .. fence
local deadline = string.format('%.6f', now + lease)
redis.call('HSET', tk, 'worker', worker, 'lease_token', token, 'fence', fence, 'heartbeat_at', nows,
           'lease_deadline', deadline)
redis.call('HDEL', tk, 'handoff')
redis.call('HINCRBY', tk, 'takeovers', 1)
redis.call('ZADD', K.leases, deadline, id)
bump(K.stats, 'takeovers_total', 1)
return {'taken', table.concat({id, token, f[6], f[3], f[7], f[8], f[9], f[10]}, '\31')}
