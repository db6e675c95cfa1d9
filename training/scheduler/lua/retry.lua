-- retry(id) -> 'requeued' | 'missing' | the current state when not dead
local id = ARGV[2]
local tk = K.task .. id
local state = redis.call('HGET', tk, 'state')
if not state then return 'missing' end
if state ~= 'dead' then return state end
redis.call('LREM', K.dead, 0, id)
redis.call('HSET', tk, 'attempts', 0, 'cancel_requested', '0', 'finished_at', '')
redis.call('HINCRBY', tk, 'retried_from_dead', 1)
redis.call('HSET', tk, 'state', 'queued', 'enqueued_at', nows)
redis.call('LPUSH', p .. redis.call('HGET', tk, 'ready'), id)
wake()
return 'requeued'
