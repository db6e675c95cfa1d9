"""Who may reach whom: the labels the NetworkPolicies of the worker plane select by, and the queue as a peer.

The bottom of infra's worker plane: infra/training_namespace.py (the namespace and its policies),
infra/queue_redis.py (the queue), infra/keda.py (the operator), infra/keeper.py and infra/worker_jobs.py (the
queue's clients) all import these, and this module imports none of them, so the plane imports one way:
peers -> training_namespace -> queue_redis -> keda, ray_cluster -> keeper -> worker_jobs.
"""

from __future__ import annotations

from typing import Any

from contract.names import TRAINING_NAMESPACE  # noqa: F401  (its home; infra imports it from here)
from infra.config import StackConfig

TRAINING_NAMESPACE_LABEL = {"ragpool.io/training": "true"}
"""Every training namespace (the main one and the teams') carries it: the queue admits its clients by it."""
REDIS_SERVICE = "ragpool-redis"
"""The queue's Service, its Valkey pods' ``app.kubernetes.io/name`` (dev)."""
REDIS_CLIENT_LABEL = {"ragpool.io/redis-client": "true"}
"""Pods carrying it may talk to the queue (workers, the keeper, the exporter)."""
RAY_CLIENT_LABEL = {"ragpool.io/ray-client": "true"}
"""Pods of the Ray worker template carry it: the namespace's NetworkPolicies let them (and only them, besides
Ray's own pods) reach the Ray head's Jobs API."""


def redis_peer(cfg: StackConfig) -> dict[str, Any]:
    """The queue as a NetworkPolicy peer: prod ElastiCache in the VPC, dev the Valkey pods."""
    return ({"ipBlock": {"cidr": cfg.network.vpc_cidr}} if cfg.is_prod else
            {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": TRAINING_NAMESPACE}},
             "podSelector": {"matchLabels": {"app.kubernetes.io/name": REDIS_SERVICE}}})
