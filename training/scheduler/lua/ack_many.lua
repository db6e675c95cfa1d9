-- ack_many(n, n (id, token) pairs[, worker, nonce, lease_s, n_claim, lanes_json]) -> {acked flags '1'/'0', new claims}
local n = tonumber(ARGV[2])
local acked = {}
for i = 1, n do
  local id, token = ARGV[1 + 2 * i], ARGV[2 + 2 * i]
  local tk = K.task .. id
  local ok, _, claimed_at = owns(tk, token)
  if ok then
    finish(id, tk, 'succeeded', nil, true, claimed_at)
    acked[i] = '1'
  else
    acked[i] = '0'
  end
end
acked = table.concat(acked)
local k = 3 + 2 * n
if ARGV[k] then
  return {acked, claim(ARGV[k], ARGV[k + 1], tonumber(ARGV[k + 2]), '', tonumber(ARGV[k + 3]), ARGV[k + 4])}
end
return {acked, {}}
