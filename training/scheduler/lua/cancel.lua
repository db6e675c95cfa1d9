-- cancel(id) -> 'cancelled' | 'cancelling' | 'missing' | 'finished:<state>'
local id = ARGV[2]
local tk = K.task .. id
local st = redis.call('HMGET', tk, 'state', 'ready')
if not st[1] then return 'missing' end
if st[1] == 'queued' then
  redis.call('LREM', p .. st[2], 1, id)
  finish(id, tk, 'cancelled', nil, false)
  return 'cancelled'
elseif st[1] == 'failed' then
  redis.call('ZREM', K.delayed, id)
  finish(id, tk, 'cancelled', nil, false)
  return 'cancelled'
elseif st[1] == 'running' then
  redis.call('HSET', tk, 'cancel_requested', '1')
  return 'cancelling'
end
return 'finished:' .. st[1]
