-- retry(id) -> 'requeued' (was dead) | 'resumed' (was cancelled) | 'missing' | the current state otherwise
local id = ARGV[2]
local tk = K.task .. id
local state = redis.call('HGET', tk, 'state')
if not state then return 'missing' end
if state ~= 'dead' and state ~= 'cancelled' then return state end
if state == 'dead' then redis.call('LREM', K.dead, 0, id) end
redis.call('HSET', tk, 'attempts', 0, 'cancel_requested', '0', 'finished_at', '')
if state == 'dead' then redis.call('HINCRBY', tk, 'retried_from_dead', 1) end
redis.call('HSET', tk, 'state', 'queued', 'enqueued_at', nows)
redis.call('LPUSH', p .. redis.call('HGET', tk, 'ready'), id)
wake()
return state == 'dead' and 'requeued' or 'resumed'
