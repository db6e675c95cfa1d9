"""The contract between ragpool's planes: what infra/, dashboards/, policy/ and training/ all read.

Torch-free and free of every other dependency, and it imports nothing of theirs, so each plane imports it
without pulling in another (tests/training/test_torch_boundary.py, tests/test_imports.py):

- :mod:`contract.ports`: the TCP ports ragpool's own processes listen on;
- :mod:`contract.exit_codes`: the process exit codes of every command;
- :mod:`contract.messages`: how an error message quotes a value someone wrote;
- :mod:`contract.paths`: the shared root, the run-id rule and the one path-confinement rule;
- :mod:`contract.lanes`: which workers claim which runs, the executors (:class:`contract.lanes.Executor`),
  priorities and node limit a lane is made of;
- :mod:`contract.env`: the environment variables one plane sets and another reads (those with a shape keep
  their names beside their parsers: lanes, :mod:`contract.ray_pools`, :mod:`contract.pool_gpus`,
  :mod:`contract.ray_auth`, paths);
- :mod:`contract.names`: names and labels several planes use (the pool label, the GPU resource, the queue's
  default namespace, the log group, the Ray version);
- :mod:`contract.defaults`: the lease, backoff, keeper interval and gang deadline both sides use;
- :mod:`contract.mappings`: the one nested-merge helper.
"""
