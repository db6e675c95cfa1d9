"""The TCP ports ragpool's own processes listen on: the one place they are defined.

Torch-free and dependency-free, so both the scheduler and the Pulumi program (infra/) import
them: infra renders them into container ports, NetworkPolicies, Services, security groups and
KEDA's scaler addresses; the worker, keeper and stage commands use them as their defaults.
Ray's own ports (GCS, dashboard, client, ...) are Ray's facts and live with the Ray cluster's
policy in infra/training_namespace.py.
"""

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
