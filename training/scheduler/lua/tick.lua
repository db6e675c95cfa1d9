-- tick(limit, prefix...) -> {reaped, promoted} per prefix: the keeper's housekeeping for each key
-- namespace (its prefix, e.g. "ragpool:"), so that lapsed leases and due retries are back in their
-- ready lists even when no worker is claiming (KEDA counts those lists to start workers).
local limit = tonumber(ARGV[2])
local out = {}
for i = 3, #ARGV do
  use_prefix(ARGV[i])
  out[#out + 1] = housekeeping(limit, limit)
end
use_prefix(cfg.prefix)
return out
