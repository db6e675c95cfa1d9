-- compare_set of the rendezvous Store (training/elastic/rendezvous.py), as torch's TCPStore does it:
-- KEYS[1]: the key; ARGV[1]: expected ("" with the key absent = create), ARGV[2]: desired, ARGV[3]: TTL s.
-- Returns the value now stored, or ARGV[1] when the key is absent and ARGV[1] is not "".
local current = redis.call('GET', KEYS[1])
if current == false then
  if ARGV[1] == '' then
    redis.call('SET', KEYS[1], ARGV[2], 'EX', tonumber(ARGV[3]))
    return ARGV[2]
  end
  return ARGV[1]
end
if current == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2], 'EX', tonumber(ARGV[3]))
  return ARGV[2]
end
return current
