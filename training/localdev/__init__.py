"""Local development servers that demos, tests and benchmarks start on 127.0.0.1 (no cloud, no fakes).

- :mod:`.redis_server`: a throwaway ``redis-server`` (optionally AOF, password, TLS) and a
  primary + replicas + ``redis-sentinel`` group for failover tests.
- :mod:`.ray_head`: a local Ray head with the Jobs API and token authentication.
- :mod:`.s3_server`: a local S3 API (moto's server) for the data import tests and benchmark.
- :mod:`.sts_server`: a local STS (moto's server, verifying presigned URLs) and :mod:`.run_api`: the run API
  in a thread, for the run API's tests and benchmark.

Free local ports come from :func:`contract.ports.free_ports`. Nothing starts at import time; none
of this runs in a cluster.
"""
