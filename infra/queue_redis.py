"""Redis: the training-task queue.

dev: an in-cluster Valkey StatefulSet with AOF on a gp3 volume, a generated password,
and a NetworkPolicy that admits only queue clients. prod: an ElastiCache (Valkey)
replication group, Multi-AZ with automatic failover, TLS in transit, KMS encryption at
rest and a generated auth token, reachable only from cluster nodes.

Either way clients get the same Secret in the training namespace: ``url`` (redis:// or
rediss://, no credentials), ``password`` and ``required_replicas`` (:func:`required_replicas`);
workers read them as REDIS_URL, REDIS_PASSWORD_FILE and REDIS_REQUIRED_REPLICAS
(training/scheduler/redis_conn.py), never from the command line. The ``redisRequiredReplicas``
stack output gives the last to ``ragpool submit`` (README).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_aws as aws
import pulumi_kubernetes as k8s
import pulumi_random as random

from infra.component import RagpoolComponent
from infra.common import SYSTEM_NODE_SELECTOR, aws_tags, child, k8s_labels, stateful
from infra.config import StackConfig
from infra.pod_security import container_security_context, pod_security_context
from infra.peers import REDIS_CLIENT_LABEL, REDIS_SERVICE, TRAINING_NAMESPACE_LABEL
from contract.env import REDIS_PASSWORD_FILE_ENV, REDIS_URL_ENV, REQUIRED_REPLICAS_ENV
from contract.ports import REDIS_PORT

# Official Valkey image (BSD-licensed Redis fork; same protocol and AOF semantics).
VALKEY_IMAGE = "valkey/valkey:8.1.7"
REDIS_EXPORTER_IMAGE = "oliver006/redis_exporter:v1.87.0"
VALKEY_UID = 999  # the `valkey` user of the official image
EXPORTER_UID = 59000  # the redis_exporter image's user
CONNECTION_SECRET = "ragpool-redis"
REQUIRED_REPLICAS_KEY = "required_replicas"
"""Key of the connection Secret that holds :func:`required_replicas` (REDIS_REQUIRED_REPLICAS)."""
ELASTICACHE_ENGINE_VERSION = "8.0"
EXPORTER_PORT = 9121
EXPORTER_NAME = "ragpool-redis-exporter"


REDIS_SECRET_DIR = "/var/run/secrets/ragpool/redis"


def redis_client_env(redis_secret: str) -> list[dict[str, Any]]:
    """The queue's Redis for a client container: the URL from the connection Secret, the password
    as a file (``redis_secret_volume``), never on the command line, and the replicas every write
    must reach (the stack's ``queue_redis.required_replicas``, from the same Secret)."""
    return [{"name": REDIS_URL_ENV, "valueFrom": {"secretKeyRef": {"name": redis_secret, "key": "url"}}},
            {"name": REDIS_PASSWORD_FILE_ENV, "value": f"{REDIS_SECRET_DIR}/password"},
            {"name": REQUIRED_REPLICAS_ENV, "valueFrom": {"secretKeyRef": {"name": redis_secret,
                                                                           "key": REQUIRED_REPLICAS_KEY}}}]


def redis_secret_volume(redis_secret: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """(volume, mount) of the connection Secret's password at REDIS_SECRET_DIR."""
    return ({"name": "redis", "secret": {"secretName": redis_secret, "items": [{"key": "password", "path": "password"}],
                                         "defaultMode": 0o440}},
            {"name": "redis", "mountPath": REDIS_SECRET_DIR, "readOnly": True})


def required_replicas(cfg: StackConfig) -> int:
    """Replicas that must confirm every acknowledged submission, claim and ack of this stack's
    queue (``REDIS_REQUIRED_REPLICAS``; training/scheduler/redis_conn.py): what the topology
    below declares, never what a client sees at connect time (issue 25).

    prod: 1. The replication group has a replica in each other AZ (``num_cache_clusters`` =
    the AZs, at least 3); a write one replica confirmed survives a failover because ElastiCache
    promotes the replica with the least replication lag ("When selecting the replica to promote
    to primary, ElastiCache selects the replica with the least replication lag",
    https://docs.aws.amazon.com/AmazonElastiCache/latest/UserGuide/AutoFailover.html), which
    has every write any replica has. Requiring all of them would stop the queue whenever one
    replica or AZ is down. dev: 0, the single-node Valkey has no replica to wait for."""
    return 1 if cfg.is_prod else 0


@dataclass(frozen=True)
class RedisArgs:
    config: StackConfig
    k8s_provider: k8s.Provider
    namespace: pulumi.Input[str]
    vpc_id: pulumi.Input[str]
    private_subnet_ids: list[pulumi.Input[str]]
    node_security_group_id: pulumi.Input[str]
    kms_key_arn: pulumi.Input[str]
    depends_on: list[pulumi.Resource]
    client_namespaces: tuple[pulumi.Input[str], ...] = ()
    """Further namespaces (team namespaces) that get the connection Secret."""


def valkey_statefulset_spec(namespace: str) -> dict:
    labels = k8s_labels("queue", REDIS_SERVICE)
    password_env = {"name": "REDIS_PASSWORD", "valueFrom": {"secretKeyRef": {"name": CONNECTION_SECRET,
                                                                             "key": "password"}}}
    return {
        "serviceName": REDIS_SERVICE,
        "replicas": 1,
        "selector": {"matchLabels": {"app.kubernetes.io/name": REDIS_SERVICE}},
        "template": {
            "metadata": {"labels": labels},
            "spec": {
                "nodeSelector": dict(SYSTEM_NODE_SELECTOR),
                "securityContext": pod_security_context(fs_group=VALKEY_UID),
                "automountServiceAccountToken": False,
                "terminationGracePeriodSeconds": 30,
                "containers": [
                    {
                        "name": "valkey",
                        "image": VALKEY_IMAGE,
                        # appendfsync always: an acknowledged submit survives a crash.
                        "args": ["--appendonly", "yes", "--appendfsync", "always", "--dir", "/data",
                                 "--requirepass", "$(REDIS_PASSWORD)", "--maxmemory-policy", "noeviction"],
                        "env": [password_env],
                        "ports": [{"name": "redis", "containerPort": REDIS_PORT}],
                        "readinessProbe": {"exec": {"command": ["sh", "-c", "valkey-cli -a \"$REDIS_PASSWORD\" --no-auth-warning ping"]},
                                           "periodSeconds": 10},
                        "livenessProbe": {"tcpSocket": {"port": "redis"}, "periodSeconds": 20},
                        "resources": {"requests": {"cpu": "250m", "memory": "512Mi"}, "limits": {"memory": "1Gi"}},
                        "securityContext": container_security_context(VALKEY_UID),
                        "volumeMounts": [{"name": "data", "mountPath": "/data"}],
                    },
                    {
                        "name": "exporter",
                        "image": REDIS_EXPORTER_IMAGE,
                        "env": [{"name": "REDIS_ADDR", "value": f"redis://localhost:{REDIS_PORT}"},
                                {"name": "REDIS_PASSWORD", "valueFrom": password_env["valueFrom"]}],
                        "ports": [{"name": "redis-metrics", "containerPort": EXPORTER_PORT}],
                        "resources": {"requests": {"cpu": "20m", "memory": "32Mi"}, "limits": {"memory": "64Mi"}},
                        "securityContext": container_security_context(EXPORTER_UID),
                    },
                ],
            },
        },
        "volumeClaimTemplates": [{
            "metadata": {"name": "data"},
            "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "gp3",
                     "resources": {"requests": {"storage": "20Gi"}}},
        }],
    }


def exporter_deployment_spec() -> dict:
    labels = {**k8s_labels("queue-metrics", EXPORTER_NAME)}
    return {
        "replicas": 1,
        "selector": {"matchLabels": {"app.kubernetes.io/name": EXPORTER_NAME}},
        "template": {
            "metadata": {"labels": {**labels, **REDIS_CLIENT_LABEL}},
            "spec": {
                "automountServiceAccountToken": False,
                "nodeSelector": dict(SYSTEM_NODE_SELECTOR),
                "securityContext": pod_security_context(EXPORTER_UID),
                "containers": [{
                    "name": "exporter",
                    "image": REDIS_EXPORTER_IMAGE,
                    "env": [
                        {"name": "REDIS_ADDR", "valueFrom": {"secretKeyRef": {"name": CONNECTION_SECRET, "key": "url"}}},
                        {"name": "REDIS_PASSWORD", "valueFrom": {"secretKeyRef": {"name": CONNECTION_SECRET,
                                                                                  "key": "password"}}},
                    ],
                    "ports": [{"name": "redis-metrics", "containerPort": EXPORTER_PORT}],
                    "resources": {"requests": {"cpu": "20m", "memory": "32Mi"}, "limits": {"memory": "64Mi"}},
                    "securityContext": container_security_context(),
                }],
            },
        },
    }


class Redis(RagpoolComponent):
    def __init__(self, name: str, args: RedisArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("ragpool:infra:Redis", name, opts, k8s_provider=args.k8s_provider)
        name = self.child_prefix
        cfg = args.config
        password = random.RandomPassword(f"{name}-password", length=48, special=False, opts=child(self))

        if cfg.is_prod:
            subnets = aws.elasticache.SubnetGroup(f"{name}-subnets", name=f"{cfg.name_prefix}-redis",
                                                  description="ragpool task queue", subnet_ids=args.private_subnet_ids,
                                                  tags=aws_tags(cfg, f"{cfg.name_prefix}-redis"), opts=child(self))
            sg = aws.ec2.SecurityGroup(
                f"{name}-sg", vpc_id=args.vpc_id, description="Redis from EKS nodes only",
                ingress=[{"protocol": "tcp", "from_port": REDIS_PORT, "to_port": REDIS_PORT,
                          "security_groups": [args.node_security_group_id], "description": "Redis from EKS nodes"}],
                egress=[], tags=aws_tags(cfg, f"{cfg.name_prefix}-redis"), opts=child(self))
            group = aws.elasticache.ReplicationGroup(
                f"{name}-elasticache", replication_group_id=f"{cfg.name_prefix}-queue",
                description="ragpool training-task queue", engine="valkey",
                engine_version=ELASTICACHE_ENGINE_VERSION, node_type=cfg.redis_node_type, port=REDIS_PORT,
                num_cache_clusters=len(cfg.network.availability_zones),
                preferred_cache_cluster_azs=list(cfg.network.availability_zones),
                # The queue's Lua scripts touch keys they do not declare: cluster mode must stay off.
                cluster_mode="disabled", automatic_failover_enabled=True, multi_az_enabled=True,
                transit_encryption_enabled=True, at_rest_encryption_enabled=True, kms_key_id=args.kms_key_arn,
                auth_token=password.result, subnet_group_name=subnets.name, security_group_ids=[sg.id],
                snapshot_retention_limit=7, final_snapshot_identifier=f"{cfg.name_prefix}-queue-final",
                tags=aws_tags(cfg, f"{cfg.name_prefix}-queue"), opts=stateful(self, cfg))
            url = group.primary_endpoint_address.apply(lambda host: f"rediss://{host}:{REDIS_PORT}/0")
            deps: list[pulumi.Resource] = [group]
        else:
            url = pulumi.Output.from_input(args.namespace).apply(
                lambda ns: f"redis://{REDIS_SERVICE}.{ns}.svc.cluster.local:{REDIS_PORT}/0")
            deps = []

        connection = {"url": url, "password": password.result, REQUIRED_REPLICAS_KEY: str(required_replicas(cfg))}
        self.secret = k8s.core.v1.Secret(
            f"{name}-connection",
            metadata={"name": CONNECTION_SECRET, "namespace": args.namespace, "labels": k8s_labels("queue", CONNECTION_SECRET)},
            string_data=connection,
            opts=child(self, depends_on=[*args.depends_on, *deps]))
        for i, client_ns in enumerate(args.client_namespaces):
            k8s.core.v1.Secret(
                f"{name}-connection-{i}",
                metadata={"name": CONNECTION_SECRET, "namespace": client_ns, "labels": k8s_labels("queue", CONNECTION_SECRET)},
                string_data=connection,
                opts=child(self, depends_on=[*args.depends_on, *deps]))

        if not cfg.is_prod:
            ns = args.namespace
            self.service = k8s.core.v1.Service(
                f"{name}-service",
                metadata={"name": REDIS_SERVICE, "namespace": ns, "labels": k8s_labels("queue", REDIS_SERVICE)},
                spec={"selector": {"app.kubernetes.io/name": REDIS_SERVICE}, "type": "ClusterIP",
                      "ports": [{"name": "redis", "port": REDIS_PORT, "targetPort": "redis"},
                                {"name": "redis-metrics", "port": EXPORTER_PORT, "targetPort": "redis-metrics"}]},
                opts=child(self, depends_on=args.depends_on))
            self.statefulset = k8s.apps.v1.StatefulSet(
                f"{name}-statefulset",
                metadata={"name": REDIS_SERVICE, "namespace": ns, "labels": k8s_labels("queue", REDIS_SERVICE)},
                spec=pulumi.Output.from_input(ns).apply(valkey_statefulset_spec),
                opts=child(self, depends_on=[self.secret, self.service]))
            k8s.networking.v1.NetworkPolicy(
                f"{name}-clients-only",
                metadata={"name": f"{REDIS_SERVICE}-clients-only", "namespace": ns, "labels": k8s_labels("queue")},
                spec={"podSelector": {"matchLabels": {"app.kubernetes.io/name": REDIS_SERVICE}},
                      "policyTypes": ["Ingress"],
                      "ingress": [
                          {"from": [{"namespaceSelector": {"matchLabels": dict(TRAINING_NAMESPACE_LABEL)},
                                     "podSelector": {"matchLabels": dict(REDIS_CLIENT_LABEL)}}],
                           "ports": [{"protocol": "TCP", "port": REDIS_PORT}]},
                          {"from": [{"namespaceSelector": {"matchLabels": {
                              "kubernetes.io/metadata.name": "monitoring"}}}],
                           "ports": [{"protocol": "TCP", "port": EXPORTER_PORT}]},
                      ]},
                opts=child(self, depends_on=args.depends_on))

        if cfg.is_prod:
            # ElastiCache has no exporter of its own: scrape it (TLS) from the cluster so
            # RagpoolRedisDown and failover alerts see the queue.
            self._elasticache_exporter(name, args)

        self.secret_name = CONNECTION_SECRET
        self.required_replicas = required_replicas(cfg)
        self.url = pulumi.Output.secret(url)
        self.register_outputs({"url": self.url, "required_replicas": self.required_replicas})

    def _elasticache_exporter(self, name: str, args: RedisArgs) -> None:
        ns = args.namespace
        k8s.apps.v1.Deployment(
            f"{name}-exporter",
            metadata={"name": EXPORTER_NAME, "namespace": ns, "labels": k8s_labels("queue-metrics", EXPORTER_NAME)},
            spec=exporter_deployment_spec(), opts=child(self, depends_on=[self.secret]))
        k8s.networking.v1.NetworkPolicy(
            f"{name}-exporter",
            metadata={"name": EXPORTER_NAME, "namespace": ns, "labels": k8s_labels("queue-metrics")},
            spec={"podSelector": {"matchLabels": {"app.kubernetes.io/name": EXPORTER_NAME}},
                  "policyTypes": ["Ingress", "Egress"],
                  "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {
                      "kubernetes.io/metadata.name": "monitoring"}}}],
                      "ports": [{"protocol": "TCP", "port": EXPORTER_PORT}]}],
                  "egress": [{"to": [{"ipBlock": {"cidr": args.config.network.vpc_cidr}}],
                              "ports": [{"protocol": "TCP", "port": REDIS_PORT}]}]},
            opts=child(self, depends_on=args.depends_on))
