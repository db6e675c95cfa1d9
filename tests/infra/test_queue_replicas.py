"""Every queue client of a stack declares the replicas its writes must reach (issue 25).

Whether a submission, claim or ack must be confirmed by replicas is configuration the stack
owns (``infra.queue_redis.required_replicas``), carried by the queue's connection ConfigMap to
every container that talks to Redis, never what a client observes at connect time. The URL comes from
the same ConfigMap: nothing secret reaches a client's environment (round-4 audit, item 7).
"""

from __future__ import annotations

from typing import Any, Iterator

import pytest

from infra.stack import load_stack, validate_stack
from infra.queue_redis import (CONNECTION_CONFIG, CONNECTION_SECRET, EXPORTER_PASSWORDS_KEY, REQUIRED_REPLICAS_KEY, URL_KEY,
                               required_replicas)
from tests.infra.harness import kubernetes_objects
from contract.env import REQUIRED_REPLICAS_ENV
from training.scheduler.redis_conn import settings_from_env


def _env_lists(node: Any) -> Iterator[list[dict]]:
    """Every container ``env`` list anywhere in a Kubernetes object (Pods, Jobs, CronJobs, ScaledJobs)."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "env" and isinstance(value, list) and all(isinstance(e, dict) and "name" in e for e in value):
                yield value
            else:
                yield from _env_lists(value)
    elif isinstance(node, list):
        for item in node:
            yield from _env_lists(item)


@pytest.mark.parametrize("stack, replicas", [("dev", 0), ("prod", 1)])
def test_every_queue_client_declares_the_stacks_required_replicas(committed_plans, stack, replicas):
    plan = committed_plans[stack]
    configs = {r["inputs"]["metadata"]["namespace"]: r["inputs"]["data"] for r in plan["resources"]
               if r["type"] == "kubernetes:core/v1:ConfigMap" and r["inputs"]["metadata"]["name"] == CONNECTION_CONFIG}
    secrets = {r["inputs"]["metadata"]["namespace"]: r["inputs"]["stringData"] for r in plan["resources"]
               if r["type"] == "kubernetes:core/v1:Secret" and r["inputs"]["metadata"]["name"] == CONNECTION_SECRET}
    assert configs and configs.keys() == secrets.keys(), "a queue connection ConfigMap beside every Secret"
    # Every namespace's copy carries it, derived from the stack's config, and it is a value the clients
    # accept; the Secret holds the password alone.
    assert all(data[REQUIRED_REPLICAS_KEY] == str(replicas) and URL_KEY in data for data in configs.values()), configs
    assert all(set(data) <= {"password", EXPORTER_PASSWORDS_KEY} for data in secrets.values()), secrets
    assert required_replicas(validate_stack(load_stack(stack))) == replicas
    assert settings_from_env({REQUIRED_REPLICAS_ENV: str(replicas)}).required_replicas == replicas

    clients = 0
    for _resource, obj in kubernetes_objects(plan):
        namespace = obj.get("metadata", {}).get("namespace")
        for env in _env_lists(obj):
            names = {e["name"]: e for e in env}
            if "REDIS_URL" not in names:
                continue
            clients += 1
            where = f"{obj['kind']} {obj['metadata']['name']} in {namespace}"
            assert REQUIRED_REPLICAS_ENV in names, f"{where} talks to the queue without {REQUIRED_REPLICAS_ENV}"
            ref = names[REQUIRED_REPLICAS_ENV]["valueFrom"]["configMapKeyRef"]
            url_ref = names["REDIS_URL"]["valueFrom"]["configMapKeyRef"]
            assert ref == {"name": url_ref["name"], "key": REQUIRED_REPLICAS_KEY}, where
            assert url_ref == {"name": CONNECTION_CONFIG, "key": URL_KEY} and namespace in configs, where
            # No client gets a Secret through its environment: the password is the mounted file.
            assert not [e["name"] for e in env if "secretKeyRef" in (e.get("valueFrom") or {})], where
    assert clients >= 2, "expected the worker templates (and the keeper) to talk to the queue"


def _required(stack: str) -> int:
    return required_replicas(validate_stack(load_stack(stack)))


def test_the_required_replicas_fit_each_stacks_topology(committed_plans):
    """prod waits for at least one replica but fewer than the group has (one per other AZ), so a
    replica or an AZ down does not stop the queue; dev's single Valkey has none to wait for."""
    [group] = [r["inputs"] for r in committed_plans["prod"]["resources"]
               if r["type"] == "aws:elasticache/replicationGroup:ReplicationGroup"]
    assert 1 <= _required("prod") < group["numCacheClusters"] - 1
    [valkey] = [r["inputs"]["spec"] for r in committed_plans["dev"]["resources"] if r["type"] == "kubernetes:apps/v1:StatefulSet"
                and r["inputs"]["metadata"]["name"] == "ragpool-redis"]
    assert valkey["replicas"] == 1 and _required("dev") == 0
