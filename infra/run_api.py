"""The run API (training/api/server.py) in the cluster: the ``ragpool`` verbs over HTTP as the caller's IAM identity.

In the main training namespace, on the system nodes: a Deployment (2 replicas spread over zones in prod, 1 in
dev) of the training image's ``python -m training.api.server``, a Redis client like the keeper (the URL from the
connection ConfigMap, the password as a file: fsGroup makes the 0440 Secret readable), the shared storage
mounted read-only (submit checks what the pool sees, ``logs`` reads run directories), the stack's facts in its
environment (pools, served lanes, pool GPUs, Ray pools: submit's fit check and ``/v1/facts``), and ``apiTeams``
as a mounted ConfigMap. A ClusterIP Service in front; people reach it through the Kubernetes API server's service
proxy (docs/DESIGN.md, "The run API"), so its NetworkPolicy admits the VPC's addresses (the API server's ENIs)
on the API port and lets it out to the queue, EFS and STS (HTTPS) only. With ``dataExport`` (``ragpool export``
through the API), its environment names the export destination (``RAGPOOL_DATA_EXPORT``) and region, EKS Pod
Identity gives its service account an export-only role (infra/data_access.py ``run_api_export_policy``: write
below the export prefix, read no bucket), and its NetworkPolicy also reaches the node's Pod Identity agent.

The ML-engineer tier's side of that path: the login ConfigMap (``contract.api.LOGIN_CONFIGMAP``: cluster id,
region, STS endpoint, proxy path; ``ragpool login --cluster`` reads it) and a Role + RoleBinding in this namespace
giving the group ``contract.api.ENGINEER_GROUP`` (whose access entries infra/cluster.py makes) ``get``/``create``
on ``services/proxy`` of this Service's ``<name>:http`` only and ``get`` on that ConfigMap only: no other object,
no list, nothing cluster-scoped.

Its own service account ``ragpool-run-api`` reads what Kueue says about a queued run's lane for ``ragpool status``
(training/scheduler/quota_wait.py), and nothing else: a Role in this namespace and in each trainingTeams team's
(``list`` Jobs, ``get``/``list`` Workloads, ``get`` of the LocalQueue by name) and a ClusterRole with ``get`` of
those namespaces' ClusterQueues by name; read-only (policy ``run-api-reads-only``).

Each trainingTeams team's runs write to its own namespace's EFS access point (the claim infra/training_namespace.py
makes; a pod here cannot claim it): a second PersistentVolume on the same access point (its ``volumeHandle`` read
from the team claim's bound volume; ``Retain``, CSI ``readOnly``) claimed here and mounted read-only at
``contract.paths.team_shared_root(team)``, which the team's ``TeamQueue.shared_root`` tells the API. The token is projected, not automounted (infra/node_fence.py
``token_volume``), with the pod's namespace beside it; the NetworkPolicy's HTTPS egress reaches the API server.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import pulumi
import pulumi_kubernetes as k8s

from contract.api import (ENGINEER_GROUP, LOGIN_CONFIGMAP, RUN_API_NAME, RUN_API_PORT_NAME, LoginFacts, TeamQueue,
                          proxy_path, proxy_resource_name)
from contract.api import sts_endpoint as region_sts_endpoint
from contract.datasets import DATA_EXPORT_ENV
from contract.env import API_CLUSTER_ID_ENV, API_STS_ENDPOINT_ENV, API_TEAM_QUEUES_ENV, API_TEAMS_FILE_ENV
from contract.lanes import POOLS_ENV, SERVED_LANES_ENV
from contract.names import KUEUE_API_VERSION
from contract.paths import team_shared_root
from contract.pool_gpus import POOL_GPUS_ENV
from contract.ports import REDIS_PORT, RUN_API_PORT
from contract.ray_pools import POOLS_ENV as RAY_POOLS_ENV
from infra.common import SHARED_MOUNT_PATH, SYSTEM_NODE_SELECTOR, TRAINING_UID, child, k8s_labels
from infra.component import RagpoolComponent
from infra.config import StackConfig
from infra.config_gpu import TeamConfig
from infra.data_access import pod_identity_agent_egress
from infra.gpu_memory import pool_gpus
from infra.kueue_objects import LOCAL_QUEUE
from infra.kueue_objects import cluster_queue as kueue_cluster_queue
from infra.node_fence import token_volume
from infra.peers import REDIS_CLIENT_LABEL, redis_peer
from infra.pod_security import container_security_context, pod_security_context
from infra.queue_redis import redis_client_env, redis_secret_volume

TEAMS_CONFIG = "ragpool-run-api-teams"
TEAMS_DIR = "/etc/ragpool/run-api"
TEAMS_KEY = "teams.json"
ENGINEER_ROLE = "ragpool-ml-engineer"
"""The ML-engineer tier's Role and RoleBinding in the main training namespace."""
KUEUE_READER = "ragpool-run-api-kueue"
"""The run API service account's Role, ClusterRole and their bindings: what Kueue says about a lane's Jobs."""
PROXY_VERBS = ("get", "create")
"""What the run API's routes need through the proxy: GET is ``get``, POST ``create`` (requestinfo.go)."""
EFS_PORT = 2049
HTTPS_PORT = 443


def replicas(cfg: StackConfig) -> int:
    """Two in prod (a node or zone lost keeps one answering), one in dev."""
    return 2 if cfg.is_prod else 1


def sts_endpoint(cfg: StackConfig) -> str:
    """The STS regional endpoint of the stack's region: tokens must be presigned for it."""
    return region_sts_endpoint(cfg.region)


def teams_config(cfg: StackConfig) -> dict[str, str]:
    """The ConfigMap data: ``apiTeams`` as the JSON the API reads (contract/api.py parses both)."""
    return {TEAMS_KEY: json.dumps(cfg.api_teams.to_json(), sort_keys=True)}


def namespace_facts(cfg: StackConfig, served_lanes: str, ray_pools: str) -> dict[str, str]:
    """One training namespace's facts as its submits are checked (fit.py, spec.py): the stack's pools and pool
    GPUs, the lanes its workers serve, its Ray pools ('' without Ray: left out)."""
    facts = {POOLS_ENV: ",".join(p.name for p in cfg.gpu_pools), POOL_GPUS_ENV: pool_gpus(cfg),
             SERVED_LANES_ENV: served_lanes}
    if ray_pools:
        facts[RAY_POOLS_ENV] = ray_pools
    return facts


def team_queue(cfg: StackConfig, team: TeamConfig, queue_namespace: str, served_lanes: str,
               ray_pools: str) -> TeamQueue:
    """A trainingTeams team as the run API routes to it: the queue key namespace its workers read
    (``queue_namespace``), the lanes they serve and its Ray pools (what infra/__main__.py gives its WorkerJobs)."""
    return TeamQueue(team.name, team.namespace, queue_namespace, namespace_facts(cfg, served_lanes, ray_pools),
                     team_shared_root(team.name))


def team_volume_name(team: str) -> str:
    """The read-only PersistentVolume (cluster-scoped) and its claim (in the API's namespace) of a team's storage."""
    return f"{RUN_API_NAME}-{team}"


def team_pod_volume(team: str) -> str:
    return f"team-{team}"


def team_pv_spec(source: Any, namespace: str, team: str) -> dict[str, Any]:
    """A second, read-only PersistentVolume on the team's own EFS access point: the CSI driver and
    ``volumeHandle`` (``<file system>::<access point>``), capacity and mount options of the volume the team's
    claim is bound to (``source``: its spec as read from the API server), pre-bound to the API's claim.
    ``Retain``: deleting it never deletes the access point (the team's data); the team's own volume keeps it."""
    def get(obj: Any, key: str) -> Any:  # a read spec: a dict or an output type, keyed by snake_case names
        return obj.get(key) if isinstance(obj, dict) else getattr(obj, key, None)

    csi = get(source, "csi")
    spec: dict[str, Any] = {
        "capacity": dict(get(source, "capacity") or {"storage": "1Ti"}), "accessModes": ["ReadWriteMany"],
        "persistentVolumeReclaimPolicy": "Retain", "storageClassName": "", "volumeMode": "Filesystem",
        "csi": {"driver": get(csi, "driver"), "volumeHandle": get(csi, "volume_handle"), "readOnly": True},
        "claimRef": {"namespace": namespace, "name": team_volume_name(team)}}
    if get(source, "mount_options"):
        spec["mountOptions"] = list(get(source, "mount_options"))
    return spec


def team_pvc_spec(team: str, capacity: str = "1Ti") -> dict[str, Any]:
    """The API's claim of :func:`team_pv_spec`'s volume, by name (no StorageClass: nothing is provisioned)."""
    return {"accessModes": ["ReadWriteMany"], "storageClassName": "", "volumeName": team_volume_name(team),
            "resources": {"requests": {"storage": capacity}}}


def team_queues_json(queues: list[TeamQueue]) -> str:
    """``RAGPOOL_API_TEAM_QUEUES``: each trainingTeams team's queue and facts (contract/api.py parses it)."""
    return json.dumps({q.team: q.to_json() for q in queues}, sort_keys=True)


def run_api_deployment_spec(cfg: StackConfig, image: str, redis_secret: str, shared_claim: str, cluster_id: str,
                            served_lanes: str, ray_pools: str, team_queues: tuple[TeamQueue, ...] = ()) -> dict[str, Any]:
    labels = {**k8s_labels("run-api", RUN_API_NAME), **REDIS_CLIENT_LABEL}
    redis_volume, redis_mount = redis_secret_volume(redis_secret)
    env = [*redis_client_env(),
           {"name": API_CLUSTER_ID_ENV, "value": cluster_id},
           {"name": API_STS_ENDPOINT_ENV, "value": sts_endpoint(cfg)},
           {"name": API_TEAMS_FILE_ENV, "value": f"{TEAMS_DIR}/{TEAMS_KEY}"},
           *({"name": k, "value": v} for k, v in namespace_facts(cfg, served_lanes, ray_pools).items())]
    if team_queues:
        env.append({"name": API_TEAM_QUEUES_ENV, "value": team_queues_json(list(team_queues))})
    if cfg.data.export_url:  # `ragpool export` through the API: where it may write, in which region
        env += [{"name": DATA_EXPORT_ENV, "value": cfg.data.export_url}, {"name": "AWS_REGION", "value": cfg.region}]
    kube_volume, kube_mount = kube_api_volume()
    # each trainingTeams team's own storage, read-only where the API reads that team's runs (its shared_root)
    team_volumes = [{"name": team_pod_volume(q.team), "persistentVolumeClaim": {
        "claimName": team_volume_name(q.team), "readOnly": True}} for q in team_queues if q.shared_root]
    team_mounts = [{"name": team_pod_volume(q.team), "mountPath": q.shared_root, "readOnly": True}
                   for q in team_queues if q.shared_root]
    pod: dict[str, Any] = {
        "serviceAccountName": RUN_API_NAME,
        "automountServiceAccountToken": False,
        "nodeSelector": dict(SYSTEM_NODE_SELECTOR),
        "securityContext": pod_security_context(TRAINING_UID, fs_group=TRAINING_UID),
        "containers": [{
            "name": "run-api",
            "image": image,
            "command": ["python", "-m", "training.api.server"],
            "args": ["--port", str(RUN_API_PORT)],
            "env": env,
            "ports": [{"name": RUN_API_PORT_NAME, "containerPort": RUN_API_PORT}],
            "livenessProbe": {"httpGet": {"path": "/healthz", "port": RUN_API_PORT_NAME}, "periodSeconds": 20,
                              "timeoutSeconds": 5, "failureThreshold": 3},
            "readinessProbe": {"httpGet": {"path": "/readyz", "port": RUN_API_PORT_NAME}, "periodSeconds": 10,
                               "timeoutSeconds": 5},
            "resources": {"requests": {"cpu": "100m", "memory": "256Mi"}, "limits": {"memory": "512Mi"}},
            "securityContext": container_security_context(),
            "volumeMounts": [redis_mount,
                             {"name": "shared", "mountPath": SHARED_MOUNT_PATH, "readOnly": True},
                             {"name": "teams", "mountPath": TEAMS_DIR, "readOnly": True},
                             {"name": "tmp", "mountPath": "/tmp"},
                             kube_mount, *team_mounts],
        }],
        "volumes": [redis_volume,
                    {"name": "shared", "persistentVolumeClaim": {"claimName": shared_claim, "readOnly": True}},
                    {"name": "teams", "configMap": {"name": TEAMS_CONFIG}},
                    {"name": "tmp", "emptyDir": {"sizeLimit": "64Mi"}},
                    kube_volume, *team_volumes],
    }
    if cfg.is_prod:
        pod["topologySpreadConstraints"] = [{
            "maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone", "whenUnsatisfiable": "ScheduleAnyway",
            "labelSelector": {"matchLabels": {"app.kubernetes.io/name": RUN_API_NAME}}}]
    return {"replicas": replicas(cfg),
            "selector": {"matchLabels": {"app.kubernetes.io/name": RUN_API_NAME}},
            "template": {"metadata": {"labels": labels}, "spec": pod}}


def kube_api_volume() -> tuple[dict[str, Any], dict[str, Any]]:
    """The projected token and cluster CA (infra/node_fence.py ``token_volume``) plus the pod's ``namespace``, where
    training/scheduler/quota_wait.py ``in_cluster`` reads them."""
    volume, mount = token_volume()
    volume["projected"]["sources"].append(
        {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"fieldPath": "metadata.namespace"}}]}})
    return volume, mount


def kueue_reader_rules() -> list[dict[str, Any]]:
    """The Role in the run API's namespace: a lane's Jobs (by label: ``list``), their Workloads, the LocalQueue."""
    group = KUEUE_API_VERSION.split("/")[0]
    return [{"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["list"]},
            {"apiGroups": [group], "resources": ["workloads"], "verbs": ["get", "list"]},
            {"apiGroups": [group], "resources": ["localqueues"], "resourceNames": [LOCAL_QUEUE], "verbs": ["get"]}]


def kueue_cluster_reader_rules(cfg: StackConfig, namespaces: list[str]) -> list[dict[str, Any]]:
    """The ClusterRole: ``get`` of each training namespace's own ClusterQueue (cluster-scoped), by name: the main
    one's and every trainingTeams team's (the API explains a team run's lane in the team's namespace)."""
    names = [kueue_cluster_queue(cfg, ns, None)["metadata"]["name"] for ns in namespaces]
    return [{"apiGroups": [KUEUE_API_VERSION.split("/")[0]], "resources": ["clusterqueues"], "resourceNames": names,
             "verbs": ["get"]}]


def run_api_service_spec() -> dict[str, Any]:
    return {"type": "ClusterIP", "selector": {"app.kubernetes.io/name": RUN_API_NAME},
            "ports": [{"name": RUN_API_PORT_NAME, "port": RUN_API_PORT, "targetPort": RUN_API_PORT_NAME,
                       "protocol": "TCP"}]}


def login_facts(cfg: StackConfig, cluster_id: str, namespace: str) -> LoginFacts:
    """What ``ragpool login`` needs: the login ConfigMap's data and the stack output ``runApiLogin``."""
    return LoginFacts(cluster_id=cluster_id, region=cfg.region, sts_endpoint=sts_endpoint(cfg),
                      proxy_path=proxy_path(namespace, RUN_API_NAME))


def engineer_rules() -> list[dict[str, Any]]:
    """The ML-engineer Role: the run API through the API server's service proxy, and the login ConfigMap; by name."""
    return [{"apiGroups": [""], "resources": ["services/proxy"], "resourceNames": [proxy_resource_name(RUN_API_NAME)],
             "verbs": list(PROXY_VERBS)},
            {"apiGroups": [""], "resources": ["configmaps"], "resourceNames": [LOGIN_CONFIGMAP], "verbs": ["get"]}]


def run_api_network_policy(cfg: StackConfig) -> dict[str, Any]:
    """In: the API port from the VPC's addresses (the API server's service proxy comes from its ENIs in the
    cluster's subnets). Out: the queue, EFS (the shared root) and HTTPS (STS; S3 with ``dataExport``), and with
    ``dataExport`` the node's Pod Identity agent (the export role's credentials: infra/data_access.py)."""
    vpc = {"ipBlock": {"cidr": cfg.network.vpc_cidr}}
    egress = [{"to": [redis_peer(cfg)], "ports": [{"protocol": "TCP", "port": REDIS_PORT}]},
              {"to": [vpc], "ports": [{"protocol": "TCP", "port": EFS_PORT}]},
              {"to": [{"ipBlock": {"cidr": "0.0.0.0/0"}}], "ports": [{"protocol": "TCP", "port": HTTPS_PORT}]}]
    if cfg.data.export_bucket:
        egress.append(pod_identity_agent_egress())
    return {"podSelector": {"matchLabels": {"app.kubernetes.io/name": RUN_API_NAME}},
            "policyTypes": ["Ingress", "Egress"],
            "ingress": [{"from": [vpc], "ports": [{"protocol": "TCP", "port": RUN_API_PORT}]}],
            "egress": egress}


@dataclass
class RunApiArgs:
    config: StackConfig
    k8s_provider: k8s.Provider
    namespace: pulumi.Input[str]
    image: pulumi.Input[str]
    redis_secret: str
    shared_claim: str
    cluster_id: pulumi.Input[str]
    """The EKS cluster's name: the cluster id tokens sign (the same token then authenticates to EKS)."""
    served_lanes: str
    """``RAGPOOL_SERVED_LANES`` of the main namespace (infra/worker_jobs.py)."""
    ray_pools: pulumi.Input[str]
    """``RAGPOOL_RAY_POOLS`` of the main namespace ('' without Ray)."""
    depends_on: list[pulumi.Resource]
    team_queues: tuple[TeamQueue, ...] = ()
    """Each trainingTeams team's queue and facts, from what its workers get (infra/__main__.py)."""
    team_volumes: dict[str, pulumi.Input[str]] = field(default_factory=dict)
    """Each trainingTeams team's storage: the name of the PersistentVolume its namespace's shared claim is bound to
    (infra/training_namespace.py ``claim``; its EFS access point), which the API mounts read-only."""


class RunApi(RagpoolComponent):
    def __init__(self, name: str, args: RunApiArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("ragpool:infra:RunApi", name, opts, k8s_provider=args.k8s_provider)
        name = self.child_prefix
        cfg = args.config
        meta = {"name": RUN_API_NAME, "namespace": args.namespace, "labels": k8s_labels("run-api", RUN_API_NAME)}
        teams = k8s.core.v1.ConfigMap(
            f"{name}-teams", metadata={**meta, "name": TEAMS_CONFIG}, data=teams_config(cfg),
            opts=child(self, depends_on=args.depends_on))
        account = k8s.core.v1.ServiceAccount(f"{name}-sa", metadata=meta, automount_service_account_token=False,
                                             opts=child(self, depends_on=args.depends_on))
        subject = pulumi.Output.from_input(args.namespace).apply(
            lambda ns: [{"kind": "ServiceAccount", "name": RUN_API_NAME, "namespace": ns}])
        reader_meta = {**meta, "name": KUEUE_READER}
        reader = k8s.rbac.v1.Role(f"{name}-kueue-reader", metadata=reader_meta, rules=kueue_reader_rules(),
                                  opts=child(self, depends_on=args.depends_on))
        k8s.rbac.v1.RoleBinding(
            f"{name}-kueue-reader", metadata=reader_meta, subjects=subject,
            role_ref={"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": KUEUE_READER},
            opts=child(self, depends_on=[reader, account]))
        for q in args.team_queues:  # the same reads in each team's namespace, for its runs' lanes
            team_meta = {**reader_meta, "namespace": q.namespace}
            team_reader = k8s.rbac.v1.Role(f"{name}-kueue-reader-{q.team}", metadata=team_meta,
                                           rules=kueue_reader_rules(), opts=child(self, depends_on=args.depends_on))
            k8s.rbac.v1.RoleBinding(
                f"{name}-kueue-reader-{q.team}", metadata=team_meta, subjects=subject,
                role_ref={"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": KUEUE_READER},
                opts=child(self, depends_on=[team_reader, account]))
        cluster_meta = {"name": KUEUE_READER, "labels": meta["labels"]}
        cluster_reader = k8s.rbac.v1.ClusterRole(
            f"{name}-kueue-cq-reader", metadata=cluster_meta,
            rules=pulumi.Output.from_input(args.namespace).apply(
                lambda ns: kueue_cluster_reader_rules(cfg, [ns, *(q.namespace for q in args.team_queues)])),
            opts=child(self, depends_on=args.depends_on))
        k8s.rbac.v1.ClusterRoleBinding(
            f"{name}-kueue-cq-reader", metadata=cluster_meta, subjects=subject,
            role_ref={"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": KUEUE_READER},
            opts=child(self, depends_on=[cluster_reader, account]))
        team_claims = []
        for q in args.team_queues:
            if not q.shared_root:
                continue
            source = k8s.core.v1.PersistentVolume.get(f"{name}-{q.team}-source", args.team_volumes[q.team],
                                                      opts=child(self))
            volume = k8s.core.v1.PersistentVolume(
                f"{name}-{q.team}-pv", metadata={"name": team_volume_name(q.team), "labels": meta["labels"]},
                spec=pulumi.Output.all(pulumi.Output.unsecret(source.spec), args.namespace).apply(
                    lambda a, team=q.team: team_pv_spec(a[0], a[1], team)),
                opts=child(self, depends_on=args.depends_on))
            team_claims.append(k8s.core.v1.PersistentVolumeClaim(
                f"{name}-{q.team}-pvc", metadata={**meta, "name": team_volume_name(q.team)},
                spec=team_pvc_spec(q.team), opts=child(self, depends_on=[volume])))
        k8s.apps.v1.Deployment(
            f"{name}-deployment", metadata=meta,
            spec=pulumi.Output.all(args.image, args.cluster_id, args.ray_pools).apply(
                lambda a: run_api_deployment_spec(cfg, a[0], args.redis_secret, args.shared_claim, a[1],
                                                  args.served_lanes, a[2] or "", args.team_queues)),
            opts=child(self, depends_on=[*args.depends_on, teams, account, *team_claims]))
        service = k8s.core.v1.Service(f"{name}-service", metadata=meta, spec=run_api_service_spec(),
                                      opts=child(self, depends_on=args.depends_on))
        k8s.networking.v1.NetworkPolicy(f"{name}-netpol", metadata=meta, spec=run_api_network_policy(cfg),
                                        opts=child(self, depends_on=args.depends_on))
        self.login = pulumi.Output.all(args.cluster_id, args.namespace).apply(
            lambda a: login_facts(cfg, a[0], a[1]).to_data())
        k8s.core.v1.ConfigMap(f"{name}-login", metadata={**meta, "name": LOGIN_CONFIGMAP}, data=self.login,
                              opts=child(self, depends_on=args.depends_on))
        engineer_meta = {**meta, "name": ENGINEER_ROLE}
        role = k8s.rbac.v1.Role(f"{name}-engineer", metadata=engineer_meta, rules=engineer_rules(),
                                opts=child(self, depends_on=args.depends_on))
        k8s.rbac.v1.RoleBinding(
            f"{name}-engineer", metadata=engineer_meta,
            role_ref={"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": ENGINEER_ROLE},
            subjects=[{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": ENGINEER_GROUP}],
            opts=child(self, depends_on=[*args.depends_on, role]))
        self.service_name = service.metadata.apply(lambda m: m["name"])
        self.register_outputs({"serviceName": self.service_name, "login": self.login})
