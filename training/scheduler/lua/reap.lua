-- reap() -> how many expired leases were handled
local n = 0
for _, id in ipairs(redis.call('ZRANGEBYSCORE', K.leases, '-inf', nows, 'LIMIT', 0, 1000)) do
  reap(id)
  n = n + 1
end
return n
