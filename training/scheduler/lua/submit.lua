-- submit(id, spec, priority, max_attempts, timeout_s, nodes) -> {created|exists, state, same_spec}
local id, spec, prio, max_attempts, timeout, nodes = ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6], tonumber(ARGV[7])
local tk = K.task .. id
-- Multi-node runs wait in their own list per node count, claimed only by Jobs of that size.
local ready = cfg.keys.ready .. prio
if nodes > 1 then
  ready = ready .. cfg.nodes_suffix .. nodes
  redis.call('SADD', K.nodesets, nodes)
end
if redis.call('EXISTS', tk) == 1 then
  local st = redis.call('HMGET', tk, 'state', 'spec')
  return {'exists', st[1], st[2] == spec and 1 or 0}
end
redis.call('HSET', tk, 'id', id, 'spec', spec, 'priority', prio, 'max_attempts', max_attempts,
           'timeout_s', timeout, 'state', 'queued', 'attempts', 0, 'fence', 0, 'completions', 0,
           'created_at', nows, 'enqueued_at', nows, 'nodes', nodes, 'ready', ready)
redis.call('ZADD', K.tasks, nows, id)
redis.call('LPUSH', p .. ready, id)
wake()
return {'created', 'queued', 1}
