-- ack(id, token) -> {1, 'succeeded'} or {0, current state}
local id, token = ARGV[2], ARGV[3]
local tk = K.task .. id
local ok, state, claimed_at = owns(tk, token)
if not ok then return {0, state or 'missing'} end
finish(id, tk, 'succeeded', nil, true, claimed_at)
return {1, 'succeeded'}
