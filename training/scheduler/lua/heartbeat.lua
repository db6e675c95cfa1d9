-- heartbeat(id, token, lease_s, worker) -> 'ok' | 'cancel' | 'lost'
local id, token, lease, worker = ARGV[2], ARGV[3], tonumber(ARGV[4]), ARGV[5]
local tk = K.task .. id
redis.call('HSET', K.workers, worker, nows)
if not owns(tk, token) then return 'lost' end
local deadline = string.format('%.6f', now + lease)
redis.call('ZADD', K.leases, deadline, id)
redis.call('HSET', tk, 'heartbeat_at', nows, 'lease_deadline', deadline)
if redis.call('HGET', tk, 'cancel_requested') == '1' then return 'cancel' end
return 'ok'
