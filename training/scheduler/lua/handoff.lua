-- handoff(id, token) -> 'handed' | 'stale'
-- An elastic run's holder leaving (its pod got SIGTERM: a spot notice, a drain) while the rest of the gang trains
-- on: marks its lease as given up, so a survivor's takeover (takeover.lua) takes it at once instead of waiting for
-- the heartbeat to go stale. The lease itself is unchanged: if no survivor takes it, the holder still releases the
-- run with its token (release.lua), or the keeper reaps it when it lapses. 'stale': not this token's run any more.
-- Idempotent (a resend marks the same token again).
local id, token = ARGV[2], ARGV[3]
local tk = K.task .. id
if not owns(tk, token) then return 'stale' end
redis.call('HSET', tk, 'handoff', token)
return 'handed'
