-- Compare-and-set of one elastic run's rendezvous state (training/elastic/rendezvous.py).
-- KEYS[1]: the state hash {state, token}.
-- ARGV[1]: the token the writer read ("" = it saw no state), ARGV[2]: the new state,
-- ARGV[3]: the new token (unique per write), ARGV[4]: TTL in seconds.
-- Returns {1, state, token} when written; {0, state, token} with the stored state when the token is stale;
-- {0} when there is no state and the writer expected one (it expired: the writer starts over).
local current = redis.call('HGET', KEYS[1], 'token')
if (current == false and ARGV[1] == '') or (current ~= false and current == ARGV[1]) then
  redis.call('HSET', KEYS[1], 'state', ARGV[2], 'token', ARGV[3])
  redis.call('EXPIRE', KEYS[1], tonumber(ARGV[4]))
  return {1, ARGV[2], ARGV[3]}
end
if current == false then
  return {0}
end
return {0, redis.call('HGET', KEYS[1], 'state'), current}
