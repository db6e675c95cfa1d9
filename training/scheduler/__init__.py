"""The scheduling plane, in three parts (torch-free by contract: ``ragpool submit`` validates specs without
torch; ``tests/training/test_torch_boundary.py`` enforces it).

- **The queue**: the Redis client ``run_queue.py`` (one Lua script per call, ``lua/``) and its key layout,
  states and records ``queue_records.py``; the connection ``redis_conn.py``; the ``keeper.py`` that reaps
  lapsed leases and promotes due retries; the queue metrics ``exporter.py``; what a queued run waits on,
  ``waiting.py`` and ``quota_wait.py`` (Kueue).
- **The run**: the run spec ``spec.py`` (read from a file by ``spec_file.py``), whether it fits the stack
  ``fit.py`` and its shared storage ``submit_checks.py``, the run verbs ``verbs.py`` and the ``ragpool`` run
  commands ``cli.py`` (which reach the runs through ``cli_route.py``: the run API or Redis directly).
- **The worker** (``worker/``, ``python -m training.worker``): claims runs and supervises their children;
  a multi-node run's gang and its Redis keys are there too (``worker/gang.py``, ``worker/group.py``).
"""
