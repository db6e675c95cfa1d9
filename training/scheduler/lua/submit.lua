-- submit(id, spec, priority, max_attempts, timeout_s, nodes, lane, owner, team)
--   -> {created|exists, state, same_spec, team}
-- owner (an IAM ARN) and team: who submitted it through the run API ('' from the direct CLI).
local id, spec, prio, max_attempts, timeout, nodes, lane = ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6],
  tonumber(ARGV[7]), ARGV[8]
local owner, team = ARGV[9] or '', ARGV[10] or ''
local tk = K.task .. id
-- Each lane (multi-node runs of one size, ray runs) waits in its own list, claimed only by
-- workers that asked for that lane.
local ready = cfg.keys.ready .. prio .. lane
if lane ~= '' then redis.call('SADD', K.lanes, lane) end
if redis.call('EXISTS', tk) == 1 then
  local st = redis.call('HMGET', tk, 'state', 'spec', 'team')
  return {'exists', st[1], st[2] == spec and 1 or 0, st[3] or ''}
end
redis.call('HSET', tk, 'id', id, 'spec', spec, 'priority', prio, 'max_attempts', max_attempts,
           'timeout_s', timeout, 'state', 'queued', 'attempts', 0, 'fence', 0, 'completions', 0,
           'created_at', nows, 'enqueued_at', nows, 'nodes', nodes, 'ready', ready)
if owner ~= '' or team ~= '' then redis.call('HSET', tk, 'owner', owner, 'team', team) end
redis.call('ZADD', K.tasks, nows, id)
redis.call('LPUSH', p .. ready, id)
wake()
return {'created', 'queued', 1, team}
