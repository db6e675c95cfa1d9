-- claim(worker, nonce, lease_s, only_id, n, lanes_json) -> up to n claim strings
return claim(ARGV[2], ARGV[3], tonumber(ARGV[4]), ARGV[5], tonumber(ARGV[6]), ARGV[7])
