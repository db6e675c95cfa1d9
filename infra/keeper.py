"""The queue keeper: one always-on pod that returns lapsed leases and due retries to the ready lists.

``python -m training.scheduler.keeper`` on the system nodes, a Redis client like the workers, keeping every
queue namespace of the stack. Leases lapse and retries fall due only inside claims, so with zero workers KEDA
would never see those runs (docs/DESIGN.md, "Lanes and the keeper"). Declared by infra/worker_jobs.py in the
main training namespace (``WorkerJobsArgs.keeper_queue_namespaces``).
"""

from __future__ import annotations

from typing import Any

from contract.defaults import KEEPER_INTERVAL_S
from contract.env import NAMESPACES_ENV
from contract.ports import LIVE_PATH, QUEUE_METRICS_PORT, READY_PATH, REDIS_PORT
from infra.common import SYSTEM_NODE_SELECTOR, TRAINING_UID, k8s_labels
from infra.config import StackConfig
from infra.peers import REDIS_CLIENT_LABEL, redis_peer
from infra.pod_security import container_security_context, pod_security_context
from infra.queue_redis import redis_client_env, redis_secret_volume

KEEPER_NAME = "ragpool-queue-keeper"


def keeper_deployment_spec(image: str, redis_secret: str, queue_namespaces: tuple[str, ...]) -> dict[str, Any]:
    """The always-on keeper: one pod on the system nodes, a Redis client like the workers."""
    labels = {**k8s_labels("queue-keeper", KEEPER_NAME), **REDIS_CLIENT_LABEL}
    volume, mount = redis_secret_volume(redis_secret)
    return {
        "replicas": 1,
        # Never two keepers at once during a rollout (both would be harmless, one is enough).
        "strategy": {"type": "Recreate"},
        "selector": {"matchLabels": {"app.kubernetes.io/name": KEEPER_NAME}},
        "template": {"metadata": {"labels": labels}, "spec": {
            "automountServiceAccountToken": False,
            "nodeSelector": dict(SYSTEM_NODE_SELECTOR),
            # fsGroup: the password file is 0440 root's until the kubelet hands it to this group
            # (policy/secret_access.py, rule secret-volumes-readable).
            "securityContext": pod_security_context(TRAINING_UID, fs_group=TRAINING_UID),
            "containers": [{
                "name": "keeper",
                "image": image,
                "command": ["python", "-m", "training.scheduler.keeper"],
                # A lost worker's run is back in its ready list within a lease and one interval.
                "args": ["--interval-seconds", f"{KEEPER_INTERVAL_S:g}",
                         "--metrics-port", str(QUEUE_METRICS_PORT)],
                "env": [*redis_client_env(),
                        {"name": NAMESPACES_ENV, "value": ",".join(queue_namespaces)}],
                "ports": [{"name": "queue-metrics", "containerPort": QUEUE_METRICS_PORT}],
                # A hung tick loop is restarted (a Redis outage is not: the loop still comes round); the
                # keeper is ready while its ticks succeed (training/scheduler/keeper.py STALL_S).
                "livenessProbe": {"httpGet": {"path": LIVE_PATH, "port": "queue-metrics"},
                                  "periodSeconds": 30, "timeoutSeconds": 5, "failureThreshold": 3},
                "readinessProbe": {"httpGet": {"path": READY_PATH, "port": "queue-metrics"},
                                   "periodSeconds": 10, "timeoutSeconds": 5},
                "resources": {"requests": {"cpu": "50m", "memory": "128Mi"}, "limits": {"memory": "256Mi"}},
                "securityContext": container_security_context(),
                "volumeMounts": [mount, {"name": "tmp", "mountPath": "/tmp"}],
            }],
            "volumes": [volume, {"name": "tmp", "emptyDir": {"sizeLimit": "64Mi"}}],
        }},
    }


def keeper_network_policy(cfg: StackConfig) -> dict[str, Any]:
    """The keeper: out to the queue only (DNS: the namespace's allow-dns), in from Prometheus."""

    return {"podSelector": {"matchLabels": {"app.kubernetes.io/name": KEEPER_NAME}},
            "policyTypes": ["Ingress", "Egress"],
            "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}],
                         "ports": [{"protocol": "TCP", "port": QUEUE_METRICS_PORT}]}],
            "egress": [{"to": [redis_peer(cfg)], "ports": [{"protocol": "TCP", "port": REDIS_PORT}]}]}
