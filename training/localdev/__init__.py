"""Local development servers that demos, tests and benchmarks start on 127.0.0.1 (no cloud, no fakes).

- :mod:`.redis_server`: a throwaway ``redis-server`` (optionally AOF, password, TLS) and a
  primary + replicas + ``redis-sentinel`` group for failover tests.
- :mod:`.ray_head`: a local Ray head with the Jobs API and token authentication.

Free local ports come from :func:`contract.ports.free_ports`. Nothing starts at import time; none
of this runs in a cluster.
"""
