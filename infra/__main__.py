"""ragpool Pulumi program: wires the components and exports the stack outputs.

Loaded by the Pulumi language host from ``main: infra/`` (the repo is installed in
the project virtualenv, so ``infra.*`` imports resolve) and, offline, by
``ragpool plan`` under Pulumi mocks.
"""

import pulumi

from infra.config import StackConfigError
from infra.deploy_config import from_pulumi
from infra.efa_devices import check_efa_pools

try:
    cfg = from_pulumi()
    cfg = check_efa_pools(cfg, f"stack {cfg.stack}")
except StackConfigError as exc:
    # RunError: Pulumi prints the message alone, without a Python traceback.
    raise pulumi.RunError(str(exc)) from None

from infra.cluster import Cluster, ClusterArgs  # noqa: E402
from infra.data_access import DataAccess, DataAccessArgs  # noqa: E402
from infra.efa import Efa, EfaArgs  # noqa: E402
from infra.efa_devices import efa_pools  # noqa: E402
from infra.gpu_memory import pool_gpus  # noqa: E402
from infra.gpu_plugins import GpuPlugins, GpuPluginsArgs  # noqa: E402
from infra.gpu_pools import GpuPools, GpuPoolsArgs  # noqa: E402
from infra.keda import Keda, KedaArgs, KedaQueue  # noqa: E402
from infra.kueue import Kueue, KueueArgs  # noqa: E402
from infra.kueue_objects import reachable_gpus  # noqa: E402
from infra.log_shipping import LogShipping, LogShippingArgs  # noqa: E402
from infra.monitoring import Monitoring, MonitoringArgs  # noqa: E402
from infra.network import Network, NetworkArgs  # noqa: E402
from infra.opencost import OpenCost, OpenCostArgs  # noqa: E402
from infra.ray_cluster import Ray, RayArgs, RayNamespace, ray_endpoint  # noqa: E402
from infra.registry import Registry, RegistryArgs  # noqa: E402
from infra.storage import SharedStorage, StorageArgs  # noqa: E402
from infra.run_api import RunApi, RunApiArgs, team_queue  # noqa: E402
from infra.queue_redis import Redis, RedisArgs  # noqa: E402
from infra.peers import TRAINING_NAMESPACE  # noqa: E402
from infra.node_fence import NodeFence, NodeFenceArgs  # noqa: E402
from infra.training_namespace import TrainingNamespace, TrainingNamespaceArgs  # noqa: E402
from infra.worker_jobs import WorkerJobs, WorkerJobsArgs  # noqa: E402
from contract.datasets import format_buckets  # noqa: E402
from contract.names import DEFAULT_NAMESPACE  # noqa: E402

cluster_name = cfg.name_prefix
network = Network("network", NetworkArgs(config=cfg, cluster_name=cluster_name))
cluster = Cluster("cluster", ClusterArgs(
    config=cfg, cluster_name=cluster_name, vpc_id=network.vpc_id,
    private_subnet_ids=network.private_subnet_ids, public_subnet_ids=network.public_subnet_ids))
# GPU pools with EFA (infra/efa.py): their security group, placement groups and device plugin; none without.
efa = Efa("efa", EfaArgs(config=cfg, vpc_id=network.vpc_id, k8s_provider=cluster.provider,
                         depends_on=[cluster.system_nodes])) if efa_pools(cfg) else None
gpu_pools = GpuPools("gpu", GpuPoolsArgs(
    config=cfg, cluster_name=cluster.name, cluster_security_group_id=cluster.cluster_security_group_id,
    k8s_provider=cluster.provider, depends_on=[cluster.system_nodes], efa=efa))
training = TrainingNamespace("training", TrainingNamespaceArgs(
    config=cfg, k8s_provider=cluster.provider, depends_on=[cluster.system_nodes]))
storage = SharedStorage("storage", StorageArgs(
    config=cfg, vpc_id=network.vpc_id, private_subnet_ids=network.private_subnet_ids,
    node_security_group_id=cluster.cluster_security_group_id, k8s_provider=cluster.provider,
    namespace=training.name, depends_on=[cluster.system_nodes]))
registry = Registry("registry", RegistryArgs(config=cfg))
# A team's GPU cap (its ResourceQuota, its ScaledJobs' maxReplicaCount) is what Kueue lets it reach by borrowing,
# not its nominal quota: Kueue admits within the nominal (docs/DESIGN.md, "KEDA and Kueue").
teams = [TrainingNamespace(f"team-{t.name}", TrainingNamespaceArgs(
    config=cfg, k8s_provider=cluster.provider, depends_on=[cluster.system_nodes, storage], namespace=t.namespace,
    gpu_quota=reachable_gpus(cfg, t.namespace), cluster_scoped=False, shared_claim=storage.claim_name))
    for t in cfg.teams]
NodeFence("node-fence", NodeFenceArgs(
    k8s_provider=cluster.provider, namespaces=[TRAINING_NAMESPACE, *(t.namespace for t in cfg.teams)],
    depends_on=[training, *teams]))
monitoring = Monitoring("monitoring", MonitoringArgs(
    config=cfg, cluster_name=cluster.name, k8s_provider=cluster.provider, training_namespaces=[training.name, *(t.name for t in teams)],
    depends_on=[cluster.system_nodes, storage]))
keda = Keda("keda", KedaArgs(
    config=cfg, k8s_provider=cluster.provider, training_namespace=training.name,
    monitoring_namespace=monitoring.namespace_name, depends_on=[training, monitoring.release]))
# Kueue admits the worker Jobs against each training namespace's ClusterQueue (infra/kueue.py).
kueue = Kueue("kueue", KueueArgs(
    config=cfg, k8s_provider=cluster.provider, monitoring_namespace=monitoring.namespace_name,
    depends_on=[training, *teams, monitoring.release]))
# Node prices for dollars per team (`ragpool usage`, the Teams dashboard), scraped by the stack's Prometheus.
if cfg.opencost_enabled:
    OpenCost("opencost", OpenCostArgs(
        config=cfg, k8s_provider=cluster.provider, monitoring_namespace=monitoring.namespace_name,
        depends_on=[cluster.system_nodes, monitoring.release], cluster_name=cluster.name))
redis = Redis("redis", RedisArgs(
    config=cfg, k8s_provider=cluster.provider, namespace=training.name, vpc_id=network.vpc_id,
    private_subnet_ids=network.private_subnet_ids, node_security_group_id=cluster.cluster_security_group_id,
    kms_key_arn=storage.key.arn, depends_on=[training, *teams, keda.namespace],
    client_namespaces=(*(t.name for t in teams), keda.namespace_name)))
# KEDA's Redis scaler takes host:port, db and TLS, not a URL; the URL holds no credentials.
keda_queue = pulumi.Output.unsecret(redis.url).apply(KedaQueue.from_url)
workers = WorkerJobs("workers", WorkerJobsArgs(
    config=cfg, k8s_provider=cluster.provider, namespace=training.name, image=registry.image_ref,
    redis_secret=redis.secret_name, shared_claim=storage.claim_name, depends_on=[redis, storage, keda],
    ray=ray_endpoint(cfg, TRAINING_NAMESPACE) if cfg.ray.enabled else None, keda=keda_queue,
    keeper_queue_namespaces=(DEFAULT_NAMESPACE, *(t.name for t in cfg.teams))))
team_workers = [
    WorkerJobs(f"workers-{team.name}", WorkerJobsArgs(
        config=cfg, k8s_provider=cluster.provider, namespace=team_ns.name, image=registry.image_ref,
        redis_secret=redis.secret_name, shared_claim=storage.claim_name, depends_on=[redis, team_ns, keda],
        queue_namespace=team.name, ray=ray_endpoint(cfg, team.namespace, team.gpu_quota) if cfg.ray.enabled else None,
        gpu_quota=reachable_gpus(cfg, team.namespace), keda=keda_queue))
    for team, team_ns in zip(cfg.teams, teams)]
# The run API (`ragpool login`): people's path to the queue, as their IAM identity; a team's verbs go to its own
# queue, its submits checked against what its workers serve (after team_workers: their served lanes).
run_api = RunApi("run-api", RunApiArgs(
    config=cfg, k8s_provider=cluster.provider, namespace=training.name, image=registry.image_ref,
    redis_secret=redis.secret_name, shared_claim=storage.claim_name, cluster_id=cluster.name,
    served_lanes=workers.served_lanes,
    ray_pools=ray_endpoint(cfg, TRAINING_NAMESPACE).pools if cfg.ray.enabled else "", depends_on=[redis, storage],
    team_queues=tuple(team_queue(cfg, t, t.name, w.served_lanes,
                                 ray_endpoint(cfg, t.namespace, t.gpu_quota).pools if cfg.ray.enabled else "")
                      for t, w in zip(cfg.teams, team_workers)),
    # each team's storage: the volume its claim is bound to (its EFS access point), mounted read-only by the API
    team_volumes={t.name: ns.claim.spec.apply(lambda s: s.volume_name) for t, ns in zip(cfg.teams, teams)}))
gpu_plugins = GpuPlugins("gpu-plugins", GpuPluginsArgs(
    k8s_provider=cluster.provider, gpu_pool_names=[p.name for p in cfg.gpu_pools],
    monitoring_namespace=monitoring.namespace_name, depends_on=[monitoring.release]))
log_shipping = LogShipping("logs", LogShippingArgs(
    config=cfg, cluster_name=cluster_name, eks_cluster_name=cluster.name, depends_on=[cluster.system_nodes]))
if cfg.data.enabled:  # dataBuckets / dataExport: the ragpool-data role of every training namespace
    DataAccess("data", DataAccessArgs(config=cfg, cluster_name=cluster.name, k8s_provider=cluster.provider,
                                      namespaces=[TRAINING_NAMESPACE, *(t.namespace for t in cfg.teams)], depends_on=[training, *teams],
                                      run_api_namespace=training.name))
ray = None
if cfg.ray.enabled:
    ray = Ray("ray", RayArgs(
        config=cfg, k8s_provider=cluster.provider, image=registry.image_ref, shared_claim=storage.claim_name,
        namespaces=[RayNamespace(TRAINING_NAMESPACE), *(RayNamespace(t.namespace, t.gpu_quota) for t in cfg.teams)],
        monitoring_namespace=monitoring.namespace_name, depends_on=[monitoring.release, storage, training, *teams]))

pulumi.export("clusterName", cluster.name)
pulumi.export("clusterEndpoint", cluster.endpoint)
pulumi.export("kubeconfig", cluster.kubeconfig)
pulumi.export("efsId", storage.file_system_id)
pulumi.export("ecrRepositoryUrl", registry.repository_url)
pulumi.export("trainingImage", registry.image_ref)
pulumi.export("trainingNamespace", training.name)
pulumi.export("gpuPools", [p.name for p in cfg.gpu_pools])
pulumi.export("grafanaAdminPassword", monitoring.grafana_admin_password)
pulumi.export("redisUrl", redis.url)
# REDIS_REQUIRED_REPLICAS for `ragpool submit` (README); the worker templates read it from the Secret.
pulumi.export("redisRequiredReplicas", redis.required_replicas)
pulumi.export("workerJobTemplates", workers.templates)
pulumi.export("applicationLogGroup", log_shipping.application_log_group)
# RAGPOOL_RAY_POOLS per training namespace, for `ragpool submit` of executor: ray runs (README).
pulumi.export("rayPools", ray.pools if ray else {})
# RAGPOOL_SERVED_LANES per training namespace (the lanes its ScaledJobs start workers for) and
# RAGPOOL_POOL_GPUS (GPUs per worker and GiB per GPU of each pool), for `ragpool submit` (README).
pulumi.export("servedLanes", {TRAINING_NAMESPACE: workers.served_lanes,
                              **{t.namespace: w.served_lanes for t, w in zip(cfg.teams, team_workers)}})
pulumi.export("poolGpus", pool_gpus(cfg))
# RAGPOOL_DATA_BUCKETS and RAGPOOL_DATA_EXPORT for `ragpool data import` and `ragpool export` (README).
pulumi.export("dataBuckets", format_buckets([b.name for b in cfg.data.buckets]))
pulumi.export("dataExport", cfg.data.export_url)
# The run API's Service in the main training namespace (`ragpool login`; reached through the API server's proxy).
pulumi.export("runApiService", run_api.service_name)
# What `ragpool login --stack NAME` needs (the login ConfigMap holds the same facts): the cluster id, region, STS
# endpoint and the run API's proxy path; with clusterEndpoint and the cluster's CA (public: a certificate).
pulumi.export("runApiLogin", run_api.login)
pulumi.export("clusterCertificateAuthority", cluster.cluster.certificate_authority.data)
# The IAM policy `ragpool login --cluster` needs (eks:DescribeCluster on this cluster only): admins attach it to the
# ML engineers' roles, which the stack does not own (docs/DEPLOYING.md "The ML-engineer tier").
pulumi.export("engineerClusterPolicyArn", cluster.engineer_policy.arn)
