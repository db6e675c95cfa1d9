"""The TCP ports ragpool's own processes listen on: the one place they are defined.

Torch-free and dependency-free, so both the scheduler and the Pulumi program (infra/) import
them: infra renders them into container ports, NetworkPolicies, Services, security groups and
KEDA's scaler addresses; the worker, keeper and stage commands use them as their defaults.
Ray's own ports (GCS, dashboard, client, ...) are Ray's facts and live with the Ray cluster's
policy in infra/training_namespace.py. :func:`free_ports` picks free ones on 127.0.0.1 for the
local servers of demos and tests.
"""

import socket

#: The run queue's Redis (in-cluster Valkey StatefulSet, ElastiCache, a local redis-server).
REDIS_PORT = 6379
#: Redis Sentinel's default port (``REDIS_SENTINELS=host[:port],...``).
REDIS_SENTINEL_PORT = 26379
#: Queue metrics (claims, leases, outcomes, queue depth) of the worker and the keeper:
#: ``--metrics-port`` / ``RAGPOOL_QUEUE_METRICS_PORT``.
QUEUE_METRICS_PORT = 9300
#: Training metrics of the ranks: the rank with local rank r serves on ``RANK_METRICS_PORT + r``
#: (``metrics.port`` of a run config; training.components.metrics).
RANK_METRICS_PORT = 9400
#: torchrun's c10d rendezvous on a multi-node run's first pod (``RAGPOOL_RDZV_PORT``;
#: torch.distributed.run's own default).
RDZV_PORT = 29400
#: The run API (training/api/server.py): its container port and Service port.
RUN_API_PORT = 8090
#: The Kubernetes readiness path of the worker and the keeper on QUEUE_METRICS_PORT
#: (training/scheduler/exporter.py serves it).
READY_PATH = "/ready"
#: The keeper's Kubernetes liveness path on QUEUE_METRICS_PORT: its tick loop came round lately.
LIVE_PATH = "/live"


def free_ports(count: int) -> list[int]:
    """``count`` distinct TCP ports on 127.0.0.1 that nothing listens on right now (all held open
    while picking, so no two are the same): for the local servers of demos, tests and benchmarks
    (training.localdev), never for a process in a cluster, which listens on the ports above."""
    socks = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("127.0.0.1", 0))
            socks.append(sock)
        return [sock.getsockname()[1] for sock in socks]
    finally:
        for sock in socks:
            sock.close()


def free_port() -> int:
    """One TCP port on 127.0.0.1 that nothing listens on right now (:func:`free_ports`)."""
    return free_ports(1)[0]
