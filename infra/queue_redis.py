"""Redis: the training-task queue.

dev: an in-cluster Valkey StatefulSet with AOF on a gp3 volume, a generated password,
and a NetworkPolicy that admits only queue clients. prod: an ElastiCache (Valkey)
replication group, Multi-AZ with automatic failover, TLS in transit, KMS encryption at
rest and a generated auth token, reachable only from cluster nodes.

Either way clients get the same ConfigMap in their namespace, ``url`` (redis:// or rediss://, no
credentials) and ``required_replicas`` (:func:`required_replicas`), and the Secret with the ``password``;
workers read them as REDIS_URL, REQUIRED_REPLICAS (variables from the ConfigMap) and REDIS_PASSWORD_FILE
(the Secret mounted as a file; training/scheduler/redis_conn.py), never from the command line. The ``redisRequiredReplicas``
stack output gives the last to ``ragpool submit`` (README).
"""

from __future__ import annotations

import json
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
"""The queue's password (key ``password``), in every namespace with a client."""
CONNECTION_CONFIG = "ragpool-redis"
"""The ConfigMap beside it: how to reach the queue, nothing secret (keys ``URL_KEY``, ``REQUIRED_REPLICAS_KEY``)."""
URL_KEY = "url"
REQUIRED_REPLICAS_KEY = "required_replicas"
"""Key of the connection Secret that holds :func:`required_replicas` (REDIS_REQUIRED_REPLICAS)."""
ELASTICACHE_ENGINE_VERSION = "8.0"
EXPORTER_PORT = 9121
EXPORTER_NAME = "ragpool-redis-exporter"


EXPORTER_HEALTH_PATH = "/health"
"""redis_exporter's own health endpoint (oliver006/redis_exporter exporter/exporter.go ``NewRedisExporter``:
``/health`` -> ``healthHandler``, 200 "ok"): the exporter answers, whether or not Redis does (``redis_up``
reports that), so a Redis outage never restarts the exporter."""


def checkov_skips(*skips: tuple[str, str]) -> dict[str, str]:
    """checkov's inline suppressions of one object (``checkov.io/skip<N>: <check>=<reason>`` annotations, read by
    ``checkov --framework kubernetes``: tests/policy/test_checkov.py), each with the reason it is deliberate."""
    return {f"checkov.io/skip{i}": f"{check}={reason}" for i, (check, reason) in enumerate(skips, 1)}


EXPORTER_PASSWORDS_KEY = "exporter-passwords"
"""Key of the connection Secret (prod, main namespace) holding ``{"<url>": "<password>"}`` for redis_exporter."""
EXPORTER_PASSWORDS_FILE = "passwords.json"
EXPORTER_SECRET_DIR = "/var/run/secrets/ragpool/redis-exporter"


def exporter_passwords(url: str, password: str) -> str:
    """The exporter's password file: its one entry keyed by the URL it scrapes (``REDIS_ADDR``)."""
    return json.dumps({url: password})


def exporter_probes() -> dict[str, Any]:
    """Liveness and readiness of a redis_exporter container (round-4 audit, item 7: it had neither)."""
    probe = {"httpGet": {"path": EXPORTER_HEALTH_PATH, "port": "redis-metrics"}, "periodSeconds": 20,
             "timeoutSeconds": 5}
    return {"livenessProbe": {**probe, "failureThreshold": 3}, "readinessProbe": {**probe, "periodSeconds": 10}}


REDIS_SECRET_DIR = "/var/run/secrets/ragpool/redis"


def redis_client_env() -> list[dict[str, Any]]:
    """The queue's Redis for a client container: the URL (no password in it) and the replicas every write
    must reach (the stack's ``queue_redis.required_replicas``) from the connection ConfigMap, plain
    configuration; the password only as a file (``redis_secret_volume``), never in the environment nor
    on the command line (round-4 audit, item 7: checkov CKV_K8S_35 found the URL as a Secret-backed
    variable in every client template)."""
    return [{"name": REDIS_URL_ENV, "valueFrom": {"configMapKeyRef": {"name": CONNECTION_CONFIG, "key": URL_KEY}}},
            {"name": REDIS_PASSWORD_FILE_ENV, "value": f"{REDIS_SECRET_DIR}/password"},
            {"name": REQUIRED_REPLICAS_ENV, "valueFrom": {"configMapKeyRef": {"name": CONNECTION_CONFIG,
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
                        **exporter_probes(),
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
                # fsGroup: the password file is 0440 (policy rule secret-volumes-readable).
                "securityContext": pod_security_context(EXPORTER_UID, fs_group=EXPORTER_UID),
                "containers": [{
                    "name": "exporter",
                    "image": REDIS_EXPORTER_IMAGE,
                    # The password as a file, not a Secret-backed variable (checkov CKV_K8S_35): redis_exporter's
                    # --redis.password-file is a JSON map of Redis URI to password (exporter/pwd_file.go
                    # LoadPwdFile), looked up by the scraped URI (exporter/redis.go lookupPasswordInPasswordMap).
                    "args": [f"--redis.password-file={EXPORTER_SECRET_DIR}/{EXPORTER_PASSWORDS_FILE}"],
                    "env": [
                        {"name": "REDIS_ADDR", "valueFrom": {"configMapKeyRef": {"name": CONNECTION_CONFIG,
                                                                                 "key": URL_KEY}}},
                    ],
                    "ports": [{"name": "redis-metrics", "containerPort": EXPORTER_PORT}],
                    **exporter_probes(),
                    "resources": {"requests": {"cpu": "20m", "memory": "32Mi"}, "limits": {"memory": "64Mi"}},
                    "securityContext": container_security_context(),
                    "volumeMounts": [{"name": "passwords", "mountPath": EXPORTER_SECRET_DIR, "readOnly": True}],
                }],
                "volumes": [{"name": "passwords", "secret": {
                    "secretName": CONNECTION_SECRET, "defaultMode": 0o440,
                    "items": [{"key": EXPORTER_PASSWORDS_KEY, "path": EXPORTER_PASSWORDS_FILE}]}}],
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

        connection = {"password": password.result}
        config = {URL_KEY: url, REQUIRED_REPLICAS_KEY: str(required_replicas(cfg))}
        # prod's exporter reads the password from a file keyed by the URL (exporter_deployment_spec).
        exporter_file = ({EXPORTER_PASSWORDS_KEY: pulumi.Output.all(url, password.result).apply(
            lambda a: exporter_passwords(a[0], a[1]))} if cfg.is_prod else {})
        self.secret = k8s.core.v1.Secret(
            f"{name}-connection",
            metadata={"name": CONNECTION_SECRET, "namespace": args.namespace, "labels": k8s_labels("queue", CONNECTION_SECRET)},
            string_data={**connection, **exporter_file},
            opts=child(self, depends_on=[*args.depends_on, *deps]))
        self.config = k8s.core.v1.ConfigMap(
            f"{name}-connection",
            metadata={"name": CONNECTION_CONFIG, "namespace": args.namespace, "labels": k8s_labels("queue", CONNECTION_CONFIG)},
            data=config, opts=child(self, depends_on=[*args.depends_on, *deps]))
        for i, client_ns in enumerate(args.client_namespaces):
            k8s.core.v1.Secret(
                f"{name}-connection-{i}",
                metadata={"name": CONNECTION_SECRET, "namespace": client_ns, "labels": k8s_labels("queue", CONNECTION_SECRET)},
                string_data=connection,
                opts=child(self, depends_on=[*args.depends_on, *deps]))
            k8s.core.v1.ConfigMap(
                f"{name}-connection-{i}",
                metadata={"name": CONNECTION_CONFIG, "namespace": client_ns, "labels": k8s_labels("queue", CONNECTION_CONFIG)},
                data=config, opts=child(self, depends_on=[*args.depends_on, *deps]))

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
                metadata={"name": REDIS_SERVICE, "namespace": ns, "labels": k8s_labels("queue", REDIS_SERVICE),
                          "annotations": checkov_skips(
                              ("CKV_K8S_35", "valkey takes its password only as --requirepass, expanded from the "
                                             "environment; the exporter sidecar reads REDIS_PASSWORD the same way"),
                              ("CKV_K8S_40", "the official valkey image runs as its own user 999 and owns /data"))},
                spec=pulumi.Output.from_input(ns).apply(valkey_statefulset_spec),
                opts=child(self, depends_on=[self.secret, self.config, self.service]))
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
            spec=exporter_deployment_spec(), opts=child(self, depends_on=[self.secret, self.config]))
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
