"""Stack configuration: one schema, parsed once into frozen, validated objects.

``SCHEMA`` is the single source of truth: ``Pulumi.yaml``'s ``config:`` block is
generated from it (``python -m infra.config --pulumi-yaml``; a test keeps the two in
sync) and :func:`parse` validates against it. Every problem is collected and raised
as one :class:`StackConfigError` whose lines each name the key, the value and what is
allowed, so an operator fixes a broken stack file in one pass.
"""

from __future__ import annotations

import difflib
import ipaddress
import json
import re
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, Mapping

from contract.api import ApiTeams, TeamsError, parse_api_teams
from contract.datasets import S3_URL_RULE, is_bucket_name, parse_s3_url
from contract.messages import shown
from contract.names import TEAM_NAMESPACE_PREFIX

PROJECT = "ragpool"

# Kubernetes minor versions EKS offers in standard support for this release of
# ragpool (1.33 ends Jul 2026 standard support; 1.35 GA on EKS Jan 2026).
SUPPORTED_KUBERNETES_VERSIONS = ("1.33", "1.34", "1.35")
ENVIRONMENTS = ("dev", "staging", "prod")
CAPACITY_TYPES = ("spot", "on-demand")
NAT_MODES = ("single", "perAz")
ALERT_RECEIVERS = ("none", "slack", "pagerduty")

# EC2 instance families that carry NVIDIA GPUs (g5g is Graviton + T4G).
GPU_INSTANCE_FAMILIES = (
    "g4dn", "g5", "g5g", "g6", "g6e", "g6f", "gr6", "gr6f",
    "p3", "p3dn", "p4d", "p4de", "p5", "p5e", "p5en", "p6-b200", "p6e-gb200",
)
# Identifier rules. Always applied with fullmatch: re.match(r"...$") accepts a trailing newline.
_INSTANCE_TYPE = re.compile(r"(?P<family>[a-z][a-z0-9-]*?)\.(?P<size>[0-9a-z-]+)")
_DNS_LABEL = re.compile(r"[a-z]([-a-z0-9]{0,30}[a-z0-9])?")
_ROLE_ARN = re.compile(r"arn:aws(-cn|-us-gov)?:iam::\d{12}:role/[\w+=,.@/-]{1,512}")
_DURATION = re.compile(r"Never|(\d{1,6}h)?(\d{1,6}m)?(\d{1,6}s)?")
_BUDGET = re.compile(r"\d{1,6}|\d{1,3}%")
_LABEL_KEY = re.compile(r"([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")
_LABEL_VALUE = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?")
_RESERVED_LABEL_DOMAINS = ("kubernetes.io", "k8s.io", "karpenter.sh", "karpenter.k8s.aws", "ragpool.io")
_IMAGE_TAG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")
_IMAGE_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
_REGION = re.compile(r"[a-z]{2}(-gov)?-[a-z]+-\d")


def is_gpu_instance_type(instance_type: Any) -> bool:
    """An EC2 instance type of one of GPU_INSTANCE_FAMILIES, e.g. g6e.12xlarge (the one rule; policy uses it too)."""
    m = _INSTANCE_TYPE.fullmatch(instance_type) if isinstance(instance_type, str) else None
    return bool(m) and m.group("family") in GPU_INSTANCE_FAMILIES


def shown_key(key: Any) -> str:
    """A config key as a message names it: verbatim when it is a plain identifier, else quoted like a value."""
    if isinstance(key, str) and re.fullmatch(r"[A-Za-z0-9_.:/\[\]-]{1,100}", key):
        return key
    return shown(key, 60)


_DURATION_DAYS = {"ms": 1 / 86_400_000, "s": 1 / 86400, "m": 1 / 1440, "h": 1 / 24, "d": 1, "w": 7, "y": 365}


def _duration_days(value: Any) -> float:
    """Days in a Prometheus duration like 31d or 1y; -1 when it is not one."""
    m = re.fullmatch(r"(\d{1,9})(ms|s|m|h|d|w|y)", value) if isinstance(value, str) else None
    return int(m.group(1)) * _DURATION_DAYS[m.group(2)] if m else -1


class StackConfigError(ValueError):
    """One or more invalid stack config values; ``problems`` holds one line each."""

    def __init__(self, problems: list[str], source: str = "stack config"):
        self.problems = list(problems)
        self.source = source
        head = f"invalid {source}: " if len(problems) == 1 else f"{len(problems)} problems in {source}:\n  - "
        super().__init__(head + "\n  - ".join(problems))


@dataclass(frozen=True)
class ConfigKey:
    """Declaration of one ``ragpool:`` key (rendered into Pulumi.yaml)."""

    name: str
    type: str | None  # Pulumi project type; None where Pulumi cannot type it (objects)
    description: str
    default: Any = None
    required: bool = False
    secret: bool = False
    items: str | None = None  # element type of an array


DEFAULT_GPU_POOLS = [
    {
        "name": "gpu-spot",
        "instanceTypes": ["g5.xlarge", "g5.2xlarge", "g6.xlarge", "g6.2xlarge"],
        "capacityType": "spot",
        "gpuLimit": 8,
    }
]

# The retention periods CloudWatch Logs accepts (PutRetentionPolicy; 0 = never expire is not offered).
CLOUDWATCH_RETENTION_DAYS = (1, 3, 5, 7, 14, 30, 60, 90, 120, 150, 180, 365, 400, 545, 731, 1096, 1827, 2192, 2557,
                             2922, 3288, 3653)

SCHEMA: tuple[ConfigKey, ...] = (
    ConfigKey("environment", "string", "Environment class: dev, staging or prod. prod enforces the HA and safety rules (3 AZs, private API endpoint, an on-demand GPU pool, protected storage).", "dev"),
    ConfigKey("owner", "string", "Team or person that owns this stack; tagged on every AWS resource as `owner`.", required=True),
    ConfigKey("costCenter", "string", "Cost center tagged on every AWS resource as `cost-center`.", required=True),
    ConfigKey("vpcCidr", "string", "IPv4 CIDR of the VPC (/16 to /20); subnets are carved from it per AZ.", "10.0.0.0/16"),
    ConfigKey("availabilityZones", "array", "Availability zones to span (at least 2; prod at least 3), all in the stack's aws:region.", ["us-west-2a", "us-west-2b"], items="string"),
    ConfigKey("natGateways", "string", "NAT gateways: `single` (one shared, cheap) or `perAz` (one per AZ, no cross-AZ dependency).", "single"),
    ConfigKey("kubernetesVersion", "string", "EKS Kubernetes minor version, one of " + ", ".join(SUPPORTED_KUBERNETES_VERSIONS) + ".", "1.35"),
    ConfigKey("endpointPublicAccess", "boolean", "Expose the EKS API endpoint publicly (restricted to publicAccessCidrs). Must be false in prod.", True),
    ConfigKey("publicAccessCidrs", "array", "CIDRs allowed to reach a public EKS API endpoint; required when endpointPublicAccess is true; 0.0.0.0/0 is refused.", [], items="string"),
    ConfigKey("adminRoleArns", "array", "IAM role ARNs granted cluster-admin through EKS access entries.", [], items="string"),
    ConfigKey("deployRoleArn", "string", "IAM role ARN that runs `pulumi up` (CI's AWS_DEPLOY_ROLE_ARN for this stack). The cluster uses API authentication without creator admin, so this role gets an access entry with AmazonEKSClusterAdminPolicy; without it every Kubernetes resource fails with Unauthorized. Example-account ARNs (111122223333) are refused by `ragpool config check --deploy` and by `pulumi up`.", required=True),
    ConfigKey("previewRoleArn", "string", "IAM role ARN the PR workflow's `pulumi preview` runs as (CI's AWS_PREVIEW_ROLE_ARN). Set, the cluster preview is on: the role gets an access entry in the Kubernetes group `ragpool:preview`, bound to a ClusterRole with the verbs pulumi-kubernetes' server-side dry-run needs (infra/cluster.py PREVIEW_RULES; no delete), and the preview job runs on the self-hosted runner PREVIEW_RUNNER_LABEL_<STACK> that reaches the API endpoint. Empty, it is off: the preview runs on a hosted runner, Kubernetes objects are previewed client-side only, and the PR comment's first line says so.", ""),
    ConfigKey("apiAccessCidrs", "array", "Private CIDRs (VPN, the deploy runner's subnet) admitted to the EKS API endpoint on TCP 443 through the cluster security group; required when endpointPublicAccess is false.", [], items="string"),
    ConfigKey("systemNodeInstanceTypes", "array", "Instance types of the on-demand system node group (controllers, monitoring, Redis).", ["m7i.large"], items="string"),
    ConfigKey("systemNodeMinCount", "integer", "Minimum nodes in the system node group (spread across AZs).", 2),
    ConfigKey("systemNodeMaxCount", "integer", "Maximum nodes in the system node group.", 4),
    ConfigKey("gpuAmiAlias", "string", "Karpenter AMI alias for GPU nodes (AL2023 selects the NVIDIA variant for GPU instance types). Pin a dated version (al2023@vYYYYMMDD) in prod.", "al2023@latest"),
    ConfigKey(
        "gpuPools", None,
        "GPU node pools, each {name, instanceTypes, capacityType: spot|on-demand, gpuLimit, zones?, diskSizeGiB?, labels?, "
        "weight?, expireAfter?, consolidateAfter?, disruptionBudget?, gpusPerWorker?}. Pools scale from zero. (Pulumi cannot type objects, so "
        "infra/config.py validates this key.)",
        DEFAULT_GPU_POOLS,
    ),
    ConfigKey(
        "trainingTeams", None,
        f"Teams that get their own training namespace {TEAM_NAMESPACE_PREFIX}<name>: {{name, gpuQuota, borrowingLimit?, "
        "lendingLimit?, fairShareWeight?}. Each has its own GPU quota, shared-storage directory (its own EFS access "
        "point), queue (RAGPOOL_QUEUE_NAMESPACE=<name>) and worker Job templates. Kueue (infra/kueue.py) admits its "
        "Jobs: gpuQuota is its ClusterQueue's nominal GPUs (the teams' total at most the pools' gpuLimit total; the "
        "main namespace ragpool-training, which always exists, gets the rest); borrowingLimit: most GPUs it may borrow "
        "per pool from the cohort's idle quota (default: no limit); lendingLimit: most of its idle GPUs per pool "
        "others may borrow (default: all); fairShareWeight: its share when several teams borrow (default 1).",
        [],
    ),
    ConfigKey("efsBackupRetentionDays", "integer", "Days AWS Backup keeps daily recovery points of the shared EFS file system.", 14),
    ConfigKey("buildImage", "boolean", "Build and push the training image from training/Dockerfile during `pulumi up` (needs Docker).", False),
    ConfigKey("imageTag", "string", "Tag of the training image in ECR (tags are immutable: bump it for every build; `latest` is refused).", "0.1.0"),
    ConfigKey("imageDigest", "string", "Digest (sha256:<64 hex>) of the training image under imageTag: set, every pod pulls <repository>:<imageTag>@<digest> (the deploy workflow sets it to the image it built); empty: by tag.", ""),
    ConfigKey("prometheusRetention", "string", "How long Prometheus keeps samples (a Prometheus duration of at least 30d: the GPU-hour budget rule looks back 30 days).", "31d"),
    ConfigKey("prometheusStorageGiB", "integer", "Size of Prometheus' persistent volume in GiB (gp3).", 50),
    ConfigKey("logRetentionDays", "integer", "Days CloudWatch Logs keeps the cluster's container logs (the Container Insights log groups infra/log_shipping.py creates); one of CloudWatch's retention values: " + ", ".join(map(str, CLOUDWATCH_RETENTION_DAYS)) + ".", 7),
    ConfigKey("redisNodeType", "string", "ElastiCache node type of the prod task queue (one node per AZ, Multi-AZ failover).", "cache.r7g.large"),
    ConfigKey("gpuHoursBudget", "integer", "GPU-hours per 30 days above which RagpoolGpuHoursOverBudget fires.", 5000),
    ConfigKey("runbookBaseUrl", "string", "Where dashboards/RUNBOOK.md is browsable (e.g. your repo's blob URL); alert runbook_url links point into it. Empty keeps repo-relative links.", ""),
    ConfigKey("openCostEnabled", "boolean", "Install OpenCost (infra/opencost.py): node prices from the public AWS price list, scraped by the stack's Prometheus, for the dollars of `ragpool usage` and the Teams dashboard.", True),
    ConfigKey("alertReceiver", "string", "Where critical alerts go: none, slack or pagerduty.", "none"),
    ConfigKey("alertReceiverSecret", "string", "Slack webhook URL or PagerDuty routing key for alertReceiver (required unless alertReceiver is none).", secret=True),
    ConfigKey("rayEnabled", "boolean", "Install the KubeRay operator and run one autoscaling RayCluster (ragpool-ray) per training namespace, with a CPU worker template that takes `executor: ray` runs.", True),
    ConfigKey(
        "rayMaxWorkers", None,
        "Most Ray workers per GPU pool, as a map {<pool name>: <workers>}; a worker holds gpusPerWorker GPUs. A pool not "
        "listed gets gpuLimit / gpusPerWorker; a team namespace is further capped by its gpuQuota. (Pulumi cannot type "
        "objects, so infra/config.py validates this key.)",
        {},
    ),
    ConfigKey("rayHeadCpu", "integer", "CPU cores the Ray head pod requests on the system nodes (it runs GCS, the dashboard and the autoscaler; `num-cpus: 0`, so no Ray tasks).", 1),
    ConfigKey("rayHeadMemoryGiB", "integer", "Memory of the Ray head pod in GiB (request = limit).", 4),
    ConfigKey(
        "dataBuckets", None,
        "S3 buckets the training namespaces may import datasets from (`ragpool data import`), each {bucket, "
        "kmsKeyArn?}: kmsKeyArn is the key of an SSE-KMS bucket, used for decryption only through S3. Set, each "
        "training namespace gets the service account ragpool-data with a Pod Identity role that may list and read "
        "these buckets and nothing else. Empty: no data role. (Pulumi cannot type objects, so infra/config.py "
        "validates this key.)",
        [],
    ),
    ConfigKey(
        "dataExport", None,
        "Where `ragpool export` may write a run's models and index: {bucket, prefix, kmsKeyArn?}; the data role may "
        "put objects only below s3://bucket/prefix/. Empty ({}): no export. (Pulumi cannot type objects, so "
        "infra/config.py validates this key.)",
        {},
    ),
    ConfigKey(
        "apiTeams", None,
        "Who may use the run API (`ragpool login`) and on which runs: {teams: {<team>: [<IAM ARN pattern>...]}, "
        "admins: [<IAM ARN pattern>...]}; a pattern is an IAM role or user ARN of one account, `*` allowed in the "
        "name (arn:aws:iam::<account>:role/ml-team-a-*). A caller acts on its team's runs only, an admin on all. "
        "Each exact ARN (no `*`) also gets an EKS access entry in the ML-engineer group ragpool:ml-engineers, which "
        "may reach the run API and nothing else; list by exact ARN whoever must `ragpool login`. "
        "(Pulumi cannot type objects, so infra/config.py validates this key.)",
        {},
    ),
)
SCHEMA_BY_NAME = {k.name: k for k in SCHEMA}


@dataclass(frozen=True)
class GpuPoolConfig:
    name: str
    instance_types: tuple[str, ...]
    capacity_type: str
    gpu_limit: int
    zones: tuple[str, ...]
    disk_size_gib: int = 200
    labels: tuple[tuple[str, str], ...] = ()
    weight: int = 10
    expire_after: str = "720h"
    consolidate_after: str = "30m"
    disruption_budget: str = "10%"
    gpus_per_worker: int = 1


@dataclass(frozen=True)
class TeamConfig:
    name: str
    gpu_quota: int
    borrowing_limit: int | None = None
    """GPUs the team's ClusterQueue may borrow beyond gpu_quota from the cohort (``borrowingLimit``); None: no limit."""
    lending_limit: int | None = None
    """Of its gpu_quota, the GPUs others may borrow while idle (``lendingLimit``); None: all of them."""
    fair_share_weight: int = 1
    """The ClusterQueue's ``fairSharing.weight`` (``fairShareWeight``)."""

    @property
    def namespace(self) -> str:
        return f"{TEAM_NAMESPACE_PREFIX}{self.name}"


@dataclass(frozen=True)
class NetworkConfig:
    vpc_cidr: str
    availability_zones: tuple[str, ...]
    nat_gateways: str


@dataclass(frozen=True)
class ClusterConfig:
    kubernetes_version: str
    endpoint_public_access: bool
    public_access_cidrs: tuple[str, ...]
    admin_role_arns: tuple[str, ...]
    system_node_instance_types: tuple[str, ...]
    system_node_min_count: int
    system_node_max_count: int
    deploy_role_arn: str = ""
    api_access_cidrs: tuple[str, ...] = ()
    preview_role_arn: str = ""

    @property
    def cluster_preview(self) -> bool:
        """Whether `pulumi preview` runs against the cluster (previewRoleArn set)."""
        return bool(self.preview_role_arn)

    @property
    def cluster_admin_arns(self) -> tuple[str, ...]:
        """Principals given an access entry with AmazonEKSClusterAdminPolicy: the deploy role first."""
        return tuple(dict.fromkeys(a for a in (self.deploy_role_arn, *self.admin_role_arns) if a))


@dataclass(frozen=True)
class RayConfig:
    """KubeRay: the operator and one autoscaling RayCluster per training namespace."""

    enabled: bool = True
    max_workers: tuple[tuple[str, int], ...] = ()
    """(pool, most workers) for the pools rayMaxWorkers lists; the others derive theirs from the pool."""
    head_cpu: int = 1
    head_memory_gib: int = 4

    def pool_max_workers(self, pool: GpuPoolConfig) -> int:
        """Most Ray workers of ``pool`` (each holds gpusPerWorker GPUs)."""
        return dict(self.max_workers).get(pool.name, pool.gpu_limit // pool.gpus_per_worker)


@dataclass(frozen=True)
class DataBucket:
    """A bucket datasets may be imported from, and the KMS key of its SSE-KMS encryption ('' for none)."""

    name: str
    kms_key_arn: str = ""


@dataclass(frozen=True)
class DataConfig:
    """dataBuckets and dataExport: what the training namespaces' data role may read and write."""

    buckets: tuple[DataBucket, ...] = ()
    export_bucket: str = ""
    export_prefix: str = ""
    """Ends in '/'; '' when there is no export."""
    export_kms_key_arn: str = ""

    @property
    def enabled(self) -> bool:
        """Whether the stack declares a data role at all."""
        return bool(self.buckets or self.export_bucket)

    @property
    def export_url(self) -> str:
        """``s3://bucket/prefix/`` of the export destination, '' when there is none."""
        return f"s3://{self.export_bucket}/{self.export_prefix}" if self.export_bucket else ""


@dataclass(frozen=True)
class StackConfig:
    project: str
    stack: str
    region: str
    environment: str
    owner: str
    cost_center: str
    network: NetworkConfig
    cluster: ClusterConfig
    gpu_pools: tuple[GpuPoolConfig, ...]
    gpu_ami_alias: str
    efs_backup_retention_days: int
    build_image: bool
    image_tag: str
    alert_receiver: str
    redis_node_type: str = "cache.r7g.large"
    teams: tuple[TeamConfig, ...] = ()
    prometheus_retention: str = "31d"
    gpu_hours_budget: int = 5000
    runbook_base_url: str = ""
    prometheus_storage_gib: int = 50
    opencost_enabled: bool = True
    """Install OpenCost (``openCostEnabled``; infra/opencost.py)."""
    log_retention_days: int = SCHEMA_BY_NAME["logRetentionDays"].default
    alert_receiver_secret: str | None = field(default=None, repr=False)
    ray: RayConfig = RayConfig()
    data: DataConfig = DataConfig()
    image_digest: str = ""
    api_teams: ApiTeams = ApiTeams(teams={}, admins=())
    """The run API's teams and admins (``apiTeams``; contract/api.py)."""

    @property
    def is_prod(self) -> bool:
        return self.environment == "prod"

    @property
    def protect_stateful(self) -> bool:
        """Stateful resources (EFS, KMS keys, backup vault) are protected and retained in prod."""
        return self.is_prod

    @property
    def name_prefix(self) -> str:
        return f"{self.project}-{self.stack}"

    @property
    def tags(self) -> dict[str, str]:
        """Common tags for every AWS resource (cost allocation and ownership)."""
        return {
            "project": self.project,
            "stack": self.stack,
            "environment": self.environment,
            "owner": self.owner,
            "cost-center": self.cost_center,
            "managed-by": "pulumi",
        }


# --------------------------------------------------------------------------- parsing


class _Reader:
    """Decodes raw values (Pulumi strings/JSON or native YAML) and records problems."""

    def __init__(self, raw: Mapping[str, Any]):
        self.raw = raw
        self.problems: list[str] = []

    def problem(self, key: str, value: Any, allowed: str) -> None:
        text = "[secret]" if key in SCHEMA_BY_NAME and SCHEMA_BY_NAME[key].secret else shown(value)
        self.problems.append(f"{PROJECT}:{key} = {text}: {allowed}")

    def get(self, key: str) -> Any:
        decl = SCHEMA_BY_NAME[key]
        if key in self.raw and self.raw[key] is None:
            # `key: null` (or `key:` with nothing after it) is a slip, not a request for the default.
            fix = f"pulumi config set {'--secret ' if decl.secret else ''}{key} VALUE"
            if not decl.required:
                fix += ", or delete the line" + ("" if decl.default is None else f" for the default {shown(decl.default)}")
            self.problems.append(f"{PROJECT}:{key} is set to null: give it a value (fix: {fix})")
            return decl.default
        if key not in self.raw:
            if decl.required:
                self.problems.append(
                    f"{PROJECT}:{key} is required but not set: {decl.description} "
                    f"(fix: pulumi config set {'--secret ' if decl.secret else ''}{key} VALUE)"
                )
            return decl.default
        value = self.raw[key]
        try:
            return _decode(decl, value)
        except ValueError as exc:
            self.problem(key, value, str(exc))
            return decl.default


def _decode(decl: ConfigKey, value: Any) -> Any:
    if decl.type == "string":
        if not isinstance(value, str):
            raise ValueError("must be a string")
        return value
    if decl.type == "boolean":
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false"):
            return value.lower() == "true"
        raise ValueError("must be true or false")
    if decl.type == "integer":
        if isinstance(value, bool):
            raise ValueError("must be an integer")
        if isinstance(value, int) and abs(value) < 2**63:
            return value
        if isinstance(value, str) and re.fullmatch(r"-?\d{1,18}", value.strip()):
            return int(value)
        raise ValueError("must be an integer (at most 18 digits)")
    # arrays and objects arrive from the Pulumi engine as JSON text
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise ValueError(f"must be valid {'a list' if decl.type == 'array' else 'structured'} value ({exc.msg})") from None
        except RecursionError:
            raise ValueError("is nested too deeply") from None
    if decl.type == "array":
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ValueError("must be a list of strings")
    return value


def _check(ok: bool, r: _Reader, key: str, value: Any, allowed: str) -> bool:
    if not ok:
        r.problem(key, value, allowed)
    return ok


# gpuPools[] field -> GpuPoolConfig attribute; the dataclass holds the defaults of the optional ones.
_POOL_FIELDS = {
    "name": "name", "instanceTypes": "instance_types", "capacityType": "capacity_type", "gpuLimit": "gpu_limit",
    "zones": "zones", "diskSizeGiB": "disk_size_gib", "labels": "labels", "weight": "weight",
    "expireAfter": "expire_after", "consolidateAfter": "consolidate_after", "disruptionBudget": "disruption_budget",
    "gpusPerWorker": "gpus_per_worker",
}
_POOL_DEFAULTS = {f.name: f.default for f in fields(GpuPoolConfig) if f.default is not MISSING}


def _pool_value(p: Mapping[str, Any], key: str) -> Any:
    """A pool field as written, else GpuPoolConfig's default in the stack file's shape (a map for labels, a list).

    ``zones`` has no default there: absent (empty), the pool spans every availabilityZone.
    """
    if key in p:
        return p[key]
    default = _POOL_DEFAULTS.get(_POOL_FIELDS[key], ())
    if key == "labels":
        return dict(default)
    return list(default) if isinstance(default, tuple) else default


def _is_int(value: Any, lo: int, hi: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and lo <= value <= hi


def _parse_gpu_pools(r: _Reader, pools: Any, zones: tuple[str, ...]) -> tuple[GpuPoolConfig, ...]:
    key = "gpuPools"
    if not isinstance(pools, list) or not pools:
        r.problem(key, pools, "must be a non-empty list of pool objects, e.g. [{name: gpu-spot, instanceTypes: [g5.xlarge], capacityType: spot, gpuLimit: 8}]")
        return ()
    out: list[GpuPoolConfig] = []
    seen: set[str] = set()
    for i, p in enumerate(pools):
        at = f"{key}[{i}]"
        if not isinstance(p, dict):
            r.problem(at, p, "must be an object with name, instanceTypes, capacityType and gpuLimit")
            continue
        before = len(r.problems)
        pool = _parse_pool(r, at, p, zones, seen)
        if len(r.problems) == before:
            out.append(pool)
    return tuple(out)


def _parse_pool(r: _Reader, at: str, p: Mapping[Any, Any], zones: tuple[str, ...], seen: set[str]) -> GpuPoolConfig | None:
    """One gpuPools[] entry; problems are recorded on ``r`` (the result is only used when there were none)."""
    for unknown in sorted(set(p) - set(_POOL_FIELDS), key=str):
        r.problem(f"{at}.{shown_key(unknown)}", p[unknown], "unknown pool field; allowed: " + ", ".join(sorted(_POOL_FIELDS)))
    name = p.get("name")
    if _check(isinstance(name, str) and bool(_DNS_LABEL.fullmatch(name)), r, f"{at}.name", name,
              "must be a lowercase DNS label of at most 32 characters (a-z, 0-9, -)"):
        _check(name not in seen, r, f"{at}.name", name, "pool names must be unique")
        seen.add(name)
    itypes = p.get("instanceTypes")
    if _check(isinstance(itypes, list) and bool(itypes) and all(isinstance(t, str) for t in itypes),
              r, f"{at}.instanceTypes", itypes, "must be a non-empty list of EC2 instance types"):
        for t in itypes:
            _check(is_gpu_instance_type(t), r, f"{at}.instanceTypes", t,
                   "is not an NVIDIA GPU instance type; allowed families: " + ", ".join(GPU_INSTANCE_FAMILIES))
    cap = p.get("capacityType")
    _check(cap in CAPACITY_TYPES, r, f"{at}.capacityType", cap, "must be one of " + ", ".join(CAPACITY_TYPES))
    limit = p.get("gpuLimit")
    _check(_is_int(limit, 1, 4096), r, f"{at}.gpuLimit", limit,
           "must be an integer from 1 to 4096 (the most GPUs this pool may run at once)")
    pzones = _pool_value(p, "zones")
    if _check(isinstance(pzones, list) and all(isinstance(z, str) for z in pzones), r, f"{at}.zones", pzones,
              "must be a list of availability zones"):
        for z in pzones:
            _check(z in zones, r, f"{at}.zones", z, "must be one of availabilityZones: " + ", ".join(zones))
    disk = _pool_value(p, "diskSizeGiB")
    _check(_is_int(disk, 50, 16384), r, f"{at}.diskSizeGiB", disk,
           "must be an integer from 50 to 16384 (GPU images and datasets need room)")
    labels = _pool_value(p, "labels")
    if _check(isinstance(labels, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in labels.items()),
              r, f"{at}.labels", labels, "must be a map of label key to string value"):
        for lk, lv in labels.items():
            domain = lk.split("/", 1)[0] if "/" in lk else ""
            _check(bool(_LABEL_KEY.fullmatch(lk)) and not any(domain == d or domain.endswith("." + d) for d in _RESERVED_LABEL_DOMAINS),
                   r, f"{at}.labels", lk, "must be a valid label key outside the reserved domains " + ", ".join(_RESERVED_LABEL_DOMAINS))
            _check(bool(_LABEL_VALUE.fullmatch(lv)), r, f"{at}.labels.{shown_key(lk)}", lv,
                   "must be a Kubernetes label value: at most 63 of A-Z a-z 0-9 - _ . , starting and ending alphanumeric")
    weight = _pool_value(p, "weight")
    _check(_is_int(weight, 0, 100), r, f"{at}.weight", weight,
           "must be an integer from 0 to 100 (higher pools are tried first)")
    for fld in ("expireAfter", "consolidateAfter"):
        v = _pool_value(p, fld)
        _check(isinstance(v, str) and v != "" and bool(_DURATION.fullmatch(v)), r, f"{at}.{fld}", v,
               "must be a Go duration like 720h, 30m or Never")
    per_worker = _pool_value(p, "gpusPerWorker")
    _check(_is_int(per_worker, 1, 8), r,
           f"{at}.gpusPerWorker", per_worker, "must be an integer from 1 to 8 (GPUs one worker pod requests)")
    budget = _pool_value(p, "disruptionBudget")
    _check(isinstance(budget, str) and bool(_BUDGET.fullmatch(budget)), r, f"{at}.disruptionBudget", budget,
           "must be a node count or percentage string, e.g. \"1\" or \"10%\"")
    try:
        return GpuPoolConfig(
            name=name, instance_types=tuple(itypes), capacity_type=cap, gpu_limit=limit,
            zones=tuple(pzones) or zones, disk_size_gib=disk, labels=tuple(sorted(labels.items())),
            weight=weight, expire_after=_pool_value(p, "expireAfter"),
            consolidate_after=_pool_value(p, "consolidateAfter"), disruption_budget=budget,
            gpus_per_worker=per_worker,
        )
    except (TypeError, AttributeError):  # only with problems recorded above
        return None


_TEAM_FIELDS = ("name", "gpuQuota", "borrowingLimit", "lendingLimit", "fairShareWeight")
FAIR_SHARE_WEIGHT_MAX = 1000


def _parse_teams(r: _Reader, teams: Any, gpu_total: int) -> tuple[TeamConfig, ...]:
    key = "trainingTeams"
    if not isinstance(teams, list):
        r.problem(key, teams, "must be a list of {name, gpuQuota} objects")
        return ()
    out, seen = [], set()
    for i, t in enumerate(teams):
        at = f"{key}[{i}]"
        if not isinstance(t, dict) or set(t) - set(_TEAM_FIELDS):
            r.problem(at, t, "must be an object with name and gpuQuota, and optionally borrowingLimit, lendingLimit "
                             "and fairShareWeight")
            continue
        name, quota = t.get("name"), t.get("gpuQuota")
        ok = _check(isinstance(name, str) and bool(re.fullmatch(r"[a-z]([-a-z0-9]{0,18}[a-z0-9])?", name)) and
                    name not in seen, r, f"{at}.name", name, "must be a unique lowercase DNS label of at most 20 characters")
        ok &= _check(_is_int(quota, 1, max(gpu_total, 1)), r,
                     f"{at}.gpuQuota", quota, f"must be an integer from 1 to the pools' total GPU limit ({gpu_total})")
        borrow, lend = t.get("borrowingLimit"), t.get("lendingLimit")
        ok &= _check(borrow is None or _is_int(borrow, 0, gpu_total), r, f"{at}.borrowingLimit", borrow,
                     f"must be an integer from 0 to the pools' total GPU limit ({gpu_total}), or left out (no limit)")
        ok &= _check(lend is None or (_is_int(lend, 0, gpu_total) and (not _is_int(quota, 1, gpu_total) or lend <= quota)),
                     r, f"{at}.lendingLimit", lend,
                     f"must be an integer from 0 to the team's gpuQuota ({quota}), or left out (lends all its idle GPUs)")
        weight = t.get("fairShareWeight", TeamConfig.fair_share_weight)
        ok &= _check(_is_int(weight, 1, FAIR_SHARE_WEIGHT_MAX), r, f"{at}.fairShareWeight", weight,
                     f"must be an integer from 1 to {FAIR_SHARE_WEIGHT_MAX} (default 1)")
        if ok:
            seen.add(name)
            out.append(TeamConfig(name=name, gpu_quota=quota, borrowing_limit=borrow, lending_limit=lend,
                                  fair_share_weight=weight))
    total = sum(t.gpu_quota for t in out)
    _check(total <= gpu_total, r, key, [t.name for t in out],
           f"the teams' gpuQuota total ({total}) must not exceed the pools' total GPU limit ({gpu_total}): "
           "Kueue's nominal quotas share those GPUs; lower a gpuQuota or raise a pool's gpuLimit")
    return tuple(out)


def _check_unknown_keys(r: _Reader) -> None:
    for key in sorted(r.raw, key=str):
        if not isinstance(key, str):
            r.problems.append(f"{PROJECT}: key {shown_key(key)} is not a string; config keys are names like owner")
        elif key not in SCHEMA_BY_NAME:
            close = difflib.get_close_matches(key[:100], list(SCHEMA_BY_NAME), n=1, cutoff=0.75)
            hint = f"did you mean {close[0]}?" if close else "known keys: " + ", ".join(sorted(SCHEMA_BY_NAME))
            r.problems.append(f"{PROJECT}:{shown_key(key)} is not a ragpool config key ({hint}); "
                              f"remove it with: pulumi config rm {shown_key(key)}")


def _parse_identity(r: _Reader) -> dict[str, Any]:
    """environment, owner, costCenter."""
    env = r.get("environment")
    _check(env in ENVIRONMENTS, r, "environment", env, "must be one of " + ", ".join(ENVIRONMENTS))
    owner = r.get("owner")
    cost_center = r.get("costCenter")
    for key, value in (("owner", owner), ("costCenter", cost_center)):
        if value is not None:
            _check(bool(re.fullmatch(r"[\w .:/=+@-]{1,128}", value)), r, key, value,
                   "must be 1-128 characters valid in an AWS tag value")
    return {"environment": env, "owner": owner, "cost_center": cost_center}


def _valid_region(region: Any) -> bool:
    return isinstance(region, str) and bool(_REGION.fullmatch(region))


def _check_region(r: _Reader, region: str | None) -> None:
    if not _valid_region(region):
        r.problems.append(f"aws:region = {shown(region)}: must be set to an AWS region, e.g. us-west-2 (fix: pulumi config set aws:region us-west-2)")


def _parse_network(r: _Reader, prod: bool, region: str | None) -> NetworkConfig:
    """vpcCidr, availabilityZones, natGateways."""
    cidr = r.get("vpcCidr")
    try:
        net = ipaddress.ip_network(cidr, strict=True)
        _check(net.version == 4 and 16 <= net.prefixlen <= 20 and net.is_private, r, "vpcCidr", cidr,
               "must be a private IPv4 network from /16 to /20, e.g. 10.0.0.0/16")
    except (ValueError, TypeError):
        r.problem("vpcCidr", cidr, "must be a valid IPv4 CIDR with no host bits set, e.g. 10.0.0.0/16")

    zones = tuple(r.get("availabilityZones") or ())
    min_zones = 3 if prod else 2
    _check(len(zones) >= min_zones, r, "availabilityZones", list(zones),
           f"needs at least {min_zones} availability zones{' in prod (HA)' if prod else ''}")
    _check(len(set(zones)) == len(zones), r, "availabilityZones", list(zones), "zones must be distinct")
    _check(len(zones) <= 6, r, "availabilityZones", list(zones), "at most 6 zones (subnets are carved per AZ)")
    if _valid_region(region):
        for z in zones:
            _check(bool(re.fullmatch(re.escape(region) + r"[a-z]", z)), r, "availabilityZones", z,
                   f"must be a zone of aws:region {region}, e.g. {region}a")

    nat = r.get("natGateways")
    _check(nat in NAT_MODES, r, "natGateways", nat, "must be one of " + ", ".join(NAT_MODES))
    return NetworkConfig(vpc_cidr=cidr, availability_zones=zones, nat_gateways=nat)


def _parse_cluster(r: _Reader, prod: bool) -> ClusterConfig:
    """kubernetesVersion, the API endpoint's access, admin roles and the system node group."""
    version = r.get("kubernetesVersion")
    _check(version in SUPPORTED_KUBERNETES_VERSIONS, r, "kubernetesVersion", version,
           "must be one of " + ", ".join(SUPPORTED_KUBERNETES_VERSIONS))
    public = r.get("endpointPublicAccess")
    cidrs = tuple(r.get("publicAccessCidrs") or ())
    if prod:
        _check(not public, r, "endpointPublicAccess", public, "must be false in prod (private API endpoint; reach it over VPN or a bastion)")
    if public:
        _check(bool(cidrs), r, "publicAccessCidrs", list(cidrs),
               "must list the CIDRs allowed to reach the public API endpoint (or set endpointPublicAccess false)")
    for c in cidrs:
        try:
            n = ipaddress.ip_network(c, strict=True)
            _check(n.prefixlen > 0, r, "publicAccessCidrs", c, "0.0.0.0/0 opens the API to the internet; list specific CIDRs")
        except ValueError:
            r.problem("publicAccessCidrs", c, "must be a valid CIDR such as 203.0.113.0/24")
    arns = tuple(r.get("adminRoleArns") or ())
    for a in arns:
        _check(bool(_ROLE_ARN.fullmatch(a)), r, "adminRoleArns", a, "must be an IAM role ARN: arn:aws:iam::<12-digit account>:role/<name>")
    deploy_role = r.get("deployRoleArn")
    if deploy_role is not None:
        _check(bool(_ROLE_ARN.fullmatch(deploy_role)), r, "deployRoleArn", deploy_role,
               "must be the IAM role ARN `pulumi up` runs as: arn:aws:iam::<12-digit account>:role/<name> "
               "(fix: pulumi config set deployRoleArn arn:aws:iam::<account>:role/<deploy-role>)")
    preview_role = r.get("previewRoleArn")
    if preview_role:
        _check(bool(_ROLE_ARN.fullmatch(preview_role)), r, "previewRoleArn", preview_role,
               "must be the IAM role ARN the PR preview runs as: arn:aws:iam::<12-digit account>:role/<name> "
               "(or empty for no cluster preview; fix: pulumi config set previewRoleArn arn:aws:iam::<account>:role/<preview-role>)")
        _check(preview_role not in (deploy_role, *arns), r, "previewRoleArn", preview_role,
               "must not be the deploy role or an admin role (those already have cluster admin; the preview role "
               "gets only the dry-run rights)")
    api_cidrs = tuple(r.get("apiAccessCidrs") or ())
    for c in api_cidrs:
        try:
            _check(ipaddress.ip_network(c, strict=True).is_private, r, "apiAccessCidrs", c,
                   "must be a private range (VPN, deploy runner subnet) such as 10.0.0.0/16")
        except ValueError:
            r.problem("apiAccessCidrs", c, "must be a valid CIDR such as 10.0.0.0/16")
    if public is False:
        _check(bool(api_cidrs), r, "apiAccessCidrs", list(api_cidrs),
               "must list the VPN / deploy-runner CIDRs that reach the private API endpoint (otherwise nobody "
               "outside the cluster can run kubectl or `pulumi up`; fix: pulumi config set --path 'apiAccessCidrs[0]' 10.0.0.0/16)")
    sys_types = tuple(r.get("systemNodeInstanceTypes") or ())
    _check(bool(sys_types), r, "systemNodeInstanceTypes", list(sys_types), "must list at least one instance type")
    for t in sys_types:
        _check(bool(_INSTANCE_TYPE.fullmatch(t)), r, "systemNodeInstanceTypes", t, "must be an EC2 instance type like m7i.large")
    smin, smax = r.get("systemNodeMinCount"), r.get("systemNodeMaxCount")
    if isinstance(smin, int) and isinstance(smax, int):
        _check(smin >= (2 if prod else 1), r, "systemNodeMinCount", smin, f"must be at least {2 if prod else 1}")
        _check(smin <= smax, r, "systemNodeMinCount", smin, f"must not exceed systemNodeMaxCount ({smax})")
        _check(smax <= 100, r, "systemNodeMaxCount", smax, "must be at most 100")
    return ClusterConfig(
        kubernetes_version=version, endpoint_public_access=public, public_access_cidrs=cidrs,
        admin_role_arns=arns, system_node_instance_types=sys_types,
        system_node_min_count=smin, system_node_max_count=smax,
        deploy_role_arn=deploy_role or "", api_access_cidrs=api_cidrs, preview_role_arn=preview_role or "",
    )


def _parse_gpu(r: _Reader, prod: bool, zones: tuple[str, ...]) -> dict[str, Any]:
    """gpuAmiAlias, gpuPools and the trainingTeams that share the pools' GPUs."""
    ami = r.get("gpuAmiAlias")
    _check(isinstance(ami, str) and bool(re.fullmatch(r"(al2023|bottlerocket)@(latest|v\d{8}|\d+\.\d+\.\d+)", ami or "")),
           r, "gpuAmiAlias", ami, "must be an AMI alias like al2023@latest, al2023@v20250101 or bottlerocket@1.30.0")

    pools = _parse_gpu_pools(r, r.get("gpuPools"), zones)
    if prod and pools:
        _check(any(p.capacity_type == "on-demand" for p in pools), r, "gpuPools", [p.name for p in pools],
               "prod needs at least one on-demand GPU pool (spot capacity can vanish); add a pool with capacityType: on-demand")

    teams = _parse_teams(r, r.get("trainingTeams"), sum(p.gpu_limit for p in pools))
    return {"gpu_ami_alias": ami, "gpu_pools": pools, "teams": teams}


def _parse_storage_and_image(r: _Reader) -> dict[str, Any]:
    """efsBackupRetentionDays, buildImage, imageTag, imageDigest."""
    retention = r.get("efsBackupRetentionDays")
    _check(isinstance(retention, int) and 1 <= retention <= 36500, r, "efsBackupRetentionDays", retention,
           "must be an integer from 1 to 36500 days")
    build = r.get("buildImage")
    tag = r.get("imageTag")
    _check(isinstance(tag, str) and bool(_IMAGE_TAG.fullmatch(tag)) and tag != "latest", r, "imageTag", tag,
           "must be a valid immutable Docker tag (not `latest`), e.g. 0.1.0 or a git SHA")
    digest = r.get("imageDigest")
    _check(isinstance(digest, str) and (digest == "" or bool(_IMAGE_DIGEST.fullmatch(digest))), r, "imageDigest", digest,
           "must be empty or an image digest sha256:<64 lowercase hex> (`aws ecr describe-images` imageDigest)")
    return {"efs_backup_retention_days": retention, "build_image": build, "image_tag": tag, "image_digest": digest}


def _parse_monitoring(r: _Reader) -> dict[str, Any]:
    """prometheusRetention, gpuHoursBudget, runbookBaseUrl, prometheusStorageGiB, logRetentionDays, openCostEnabled."""
    retention_p = r.get("prometheusRetention")
    _check(_duration_days(retention_p) >= 30, r, "prometheusRetention", retention_p,
           "must be a Prometheus duration of at least 30d, such as 31d or 1y (the GPU-hour budget looks back 30 days)")
    budget_h = r.get("gpuHoursBudget")
    _check(isinstance(budget_h, int) and budget_h > 0, r, "gpuHoursBudget", budget_h, "must be a positive integer")
    runbook = r.get("runbookBaseUrl")
    _check(runbook == "" or (isinstance(runbook, str) and bool(re.fullmatch(r"https://[!-~]+", runbook))), r,
           "runbookBaseUrl", runbook, "must be empty or an https:// URL (printable ASCII, no spaces)")
    storage_p = r.get("prometheusStorageGiB")
    _check(isinstance(storage_p, int) and 10 <= storage_p <= 16384, r, "prometheusStorageGiB", storage_p,
           "must be an integer from 10 to 16384")
    log_days = r.get("logRetentionDays")
    _check(log_days in CLOUDWATCH_RETENTION_DAYS and not isinstance(log_days, bool), r, "logRetentionDays", log_days,
           "must be one of CloudWatch Logs' retention periods: " + ", ".join(map(str, CLOUDWATCH_RETENTION_DAYS)))
    return {"prometheus_retention": retention_p, "gpu_hours_budget": budget_h, "runbook_base_url": runbook,
            "prometheus_storage_gib": storage_p, "log_retention_days": log_days,
            "opencost_enabled": bool(r.get("openCostEnabled"))}


def _parse_queue(r: _Reader) -> dict[str, Any]:
    """redisNodeType."""
    redis_node = r.get("redisNodeType")
    _check(isinstance(redis_node, str) and bool(re.fullmatch(r"cache\.[a-z0-9]+\.[a-z0-9]+", redis_node or "")), r,
           "redisNodeType", redis_node, "must be an ElastiCache node type such as cache.r7g.large")
    return {"redis_node_type": redis_node}


def _parse_alerts(r: _Reader) -> dict[str, Any]:
    """alertReceiver and its secret."""
    receiver = r.get("alertReceiver")
    _check(receiver in ALERT_RECEIVERS, r, "alertReceiver", receiver, "must be one of " + ", ".join(ALERT_RECEIVERS))
    secret = r.get("alertReceiverSecret")
    if receiver in ("slack", "pagerduty") and not secret:
        r.problems.append(
            f"{PROJECT}:alertReceiverSecret is required when alertReceiver is {receiver} "
            f"(fix: pulumi config set --secret alertReceiverSecret <{'webhook URL' if receiver == 'slack' else 'routing key'}>)"
        )
    return {"alert_receiver": receiver, "alert_receiver_secret": secret}


def _parse_ray(r: _Reader, pools: tuple[GpuPoolConfig, ...]) -> dict[str, Any]:
    """rayEnabled, rayMaxWorkers (checked against the GPU pools), rayHeadCpu, rayHeadMemoryGiB."""
    enabled = r.get("rayEnabled")
    limits = r.get("rayMaxWorkers")
    by_name = {p.name: p for p in pools}
    max_workers: list[tuple[str, int]] = []
    if not isinstance(limits, dict):
        r.problem("rayMaxWorkers", limits, "must be a map of GPU pool name to most Ray workers, e.g. {gpu-spot: 4}")
    else:
        for name, value in limits.items():
            pool = by_name.get(name)
            if pool is None:
                r.problems.append(
                    f"{PROJECT}:rayMaxWorkers has {shown_key(name)}, which is not a GPU pool: "
                    f"use one of {', '.join(sorted(by_name)) or '(no pools)'} (fix: rename or delete that entry)")
                continue
            most = pool.gpu_limit // pool.gpus_per_worker
            if _check(_is_int(value, 0, most), r, f"rayMaxWorkers.{name}", value,
                      f"must be an integer from 0 to {most} (pool {name}: gpuLimit {pool.gpu_limit} / "
                      f"gpusPerWorker {pool.gpus_per_worker})"):
                max_workers.append((name, value))
    head_cpu = r.get("rayHeadCpu")
    _check(_is_int(head_cpu, 1, 64), r, "rayHeadCpu", head_cpu, "must be an integer from 1 to 64 (cores)")
    head_mem = r.get("rayHeadMemoryGiB")
    _check(_is_int(head_mem, 2, 1024), r, "rayHeadMemoryGiB", head_mem, "must be an integer from 2 to 1024 (GiB)")
    return {"ray": RayConfig(enabled=bool(enabled), max_workers=tuple(sorted(max_workers)),
                             head_cpu=head_cpu, head_memory_gib=head_mem)}


_KMS_KEY_ARN = re.compile(r"arn:aws(-cn|-us-gov)?:kms:[a-z]{2}(-gov)?-[a-z]+-\d:\d{12}:key/"
                          r"(mrk-[0-9a-f]{32}|[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})")
_KMS_RULE = "must be a KMS key ARN: arn:aws:kms:<region>:<12-digit account>:key/<key id> (not an alias)"


def _parse_data(r: _Reader) -> dict[str, Any]:
    """dataBuckets and dataExport."""
    buckets_raw, export_raw = r.get("dataBuckets"), r.get("dataExport")
    buckets: list[DataBucket] = []
    if not isinstance(buckets_raw, list):
        r.problem("dataBuckets", buckets_raw, "must be a list of {bucket, kmsKeyArn?} objects, e.g. [{bucket: my-corpora}]")
        buckets_raw = []
    for i, b in enumerate(buckets_raw):
        at = f"dataBuckets[{i}]"
        if not isinstance(b, dict) or "bucket" not in b or set(b) - {"bucket", "kmsKeyArn"}:
            r.problem(at, b, "must be an object with bucket and optionally kmsKeyArn")
            continue
        name, key = b["bucket"], b.get("kmsKeyArn", "")
        ok = _check(is_bucket_name(name), r, f"{at}.bucket", name,
                    "must be an S3 bucket name: 3-63 lowercase letters, digits, '.' or '-'")
        ok &= _check(name not in [x.name for x in buckets], r, f"{at}.bucket", name, "is listed twice")
        ok &= _check(key == "" or (isinstance(key, str) and bool(_KMS_KEY_ARN.fullmatch(key))), r, f"{at}.kmsKeyArn",
                     key, _KMS_RULE)
        if ok:
            buckets.append(DataBucket(name, key))
    export = {"export_bucket": "", "export_prefix": "", "export_kms_key_arn": ""}
    if not isinstance(export_raw, dict) or set(export_raw) - {"bucket", "prefix", "kmsKeyArn"}:
        r.problem("dataExport", export_raw, "must be an object {bucket, prefix, kmsKeyArn?} or empty ({})")
    elif export_raw:
        bucket, prefix, key = export_raw.get("bucket"), export_raw.get("prefix"), export_raw.get("kmsKeyArn", "")
        ok = _check(is_bucket_name(bucket), r, "dataExport.bucket", bucket,
                    "must be an S3 bucket name: 3-63 lowercase letters, digits, '.' or '-'")
        loc = None
        if ok and isinstance(prefix, str):
            try:
                loc = parse_s3_url(f"s3://{bucket}/{prefix}", need_prefix=True)
            except ValueError as exc:
                r.problem("dataExport.prefix", prefix, f"{exc} ({S3_URL_RULE})")
        elif not isinstance(prefix, str):
            r.problem("dataExport.prefix", prefix, "must be a key prefix such as exports/ (exports go below it only)")
        ok = _check(key == "" or (isinstance(key, str) and bool(_KMS_KEY_ARN.fullmatch(key))), r,
                    "dataExport.kmsKeyArn", key, _KMS_RULE)
        if loc is not None and ok:
            export = {"export_bucket": loc.bucket, "export_prefix": loc.prefix, "export_kms_key_arn": key}
    return {"data": DataConfig(buckets=tuple(buckets), **export)}


def _parse_api_teams(r: _Reader) -> dict[str, Any]:
    """apiTeams (contract/api.py parses it, for the stack and for the run API alike)."""
    raw = r.get("apiTeams")
    try:
        return {"api_teams": parse_api_teams(raw if raw is not None else {})}
    except TeamsError as exc:
        for key, message in exc.problems:
            r.problems.append(f"{PROJECT}:{key}: {message} (fix: pulumi config set --path '{key}' VALUE)")
        return {}


def parse(raw: Mapping[str, Any], *, stack: str, region: str | None, project: str = PROJECT,
          source: str | None = None) -> StackConfig:
    """Validate raw ``ragpool:`` values (keys without the namespace) into a StackConfig.

    ``raw`` values may be Pulumi's wire form (strings, JSON text) or native YAML values.
    Raises one StackConfigError listing every problem.
    """
    r = _Reader(raw)
    _check_unknown_keys(r)
    identity = _parse_identity(r)
    prod = identity["environment"] == "prod"
    _check_region(r, region)
    network = _parse_network(r, prod, region)
    cluster = _parse_cluster(r, prod)
    gpu = _parse_gpu(r, prod, network.availability_zones)
    groups = {
        **gpu,
        **_parse_storage_and_image(r),
        **_parse_monitoring(r),
        **_parse_queue(r),
        **_parse_alerts(r),
        **_parse_ray(r, gpu["gpu_pools"]),
        **_parse_data(r),
        **_parse_api_teams(r),
    }
    if r.problems:
        raise StackConfigError(r.problems, source or f"stack {stack}")
    return StackConfig(project=project, stack=stack, region=region, network=network, cluster=cluster,
                       **identity, **groups)


def from_pulumi() -> StackConfig:
    """Read this stack's config from the Pulumi runtime (the engine has applied Pulumi.yaml defaults)."""
    import pulumi
    from pulumi.runtime import config as rc

    every = {**rc.get_config_env(), **rc.CONFIG.get()}
    prefix = PROJECT + ":"
    raw = {k[len(prefix):]: v for k, v in every.items() if k.startswith(prefix)}
    region = rc.get_config("aws:region")
    cfg = parse(raw, stack=pulumi.get_stack(), region=region, project=pulumi.get_project())
    if not _under_mocks():
        problems = deploy_problems(cfg)
        if problems:
            raise StackConfigError(problems, f"stack {cfg.stack} (deploy)")
    return cfg


# AWS's documentation account IDs: the committed stack files carry them as marked
# placeholders so the offline plan works; a real deployment must replace them.
EXAMPLE_ACCOUNT_IDS = ("111122223333", "123456789012")
DOCUMENTATION_NETWORKS = tuple(ipaddress.ip_network(n) for n in (
    "192.0.2.0/24", "198.51.100.0/24", "203.0.113.0/24",  # RFC 5737 TEST-NET-1, -2, -3
    "2001:db8::/32"))  # RFC 3849
"""Address ranges reserved for documentation: a CIDR inside one reaches nobody, a placeholder."""


def deploy_problems(cfg: StackConfig) -> list[str]:
    """Problems that only matter when the program talks to AWS: placeholders still in place.

    ``ragpool config check --deploy`` reports them and a real ``pulumi preview``/``up``
    refuses to start; the offline plan (under mocks) and ``make demo`` accept them.
    """
    problems = []
    for key, arns in (("deployRoleArn", (cfg.cluster.deploy_role_arn,)), ("adminRoleArns", cfg.cluster.admin_role_arns),
                      ("previewRoleArn", (cfg.cluster.preview_role_arn,) if cfg.cluster.preview_role_arn else ())):
        for arn in arns:
            account = arn.split(":")[4] if arn.count(":") >= 5 else ""
            if account in EXAMPLE_ACCOUNT_IDS:
                problems.append(
                    f"{PROJECT}:{key} = {json.dumps(arn)}: account {account} is AWS's documentation example, a placeholder; "
                    f"set the real role (fix: pulumi config set "
                    f"{key if key != 'adminRoleArns' else '--path adminRoleArns[0]'} arn:aws:iam::<account>:role/<name>)")
    for i, cidr in enumerate(cfg.cluster.public_access_cidrs):
        network = ipaddress.ip_network(cidr)
        if any(network.version == doc.version and network.subnet_of(doc) for doc in DOCUMENTATION_NETWORKS):
            problems.append(
                f"{PROJECT}:publicAccessCidrs[{i}] = {json.dumps(cidr)}: a documentation range (RFC 5737/3849), a "
                "placeholder that reaches nobody: the API endpoint would admit no one; set your office or VPN "
                f"ranges (fix: pulumi config set --path 'publicAccessCidrs[{i}]' <your CIDR>)")
    return problems


def _under_mocks() -> bool:
    """True when the program runs under Pulumi mocks (``ragpool plan``, tests), not a real engine."""
    from pulumi.runtime.mocks import MockMonitor
    from pulumi.runtime.settings import SETTINGS

    return isinstance(SETTINGS.monitor, MockMonitor)


# ------------------------------------------------------------------ Pulumi.yaml rendering


def pulumi_yaml_config() -> dict[str, Any]:
    """The ``config:`` block of Pulumi.yaml, rendered from SCHEMA."""
    block: dict[str, Any] = {}
    for k in SCHEMA:
        entry: dict[str, Any] = {}
        if k.type is not None:
            entry["type"] = k.type
        if k.items:
            entry["items"] = {"type": k.items}
        entry["description"] = k.description
        if k.secret:
            entry["secret"] = True
        if k.default is not None:
            entry["default"] = k.default
        block[k.name] = entry
    return block


def _main(argv: list[str] | None = None) -> int:
    import argparse
    import sys

    import yaml

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pulumi-yaml", action="store_true", help="print the config: block for Pulumi.yaml")
    parser.add_argument("--write", metavar="PULUMI_YAML", help="rewrite the config: block of this Pulumi.yaml")
    args = parser.parse_args(argv)
    block = yaml.safe_dump({"config": pulumi_yaml_config()}, sort_keys=False, width=100)
    if args.write:
        from pathlib import Path

        path = Path(args.write)
        head = path.read_text().split("\nconfig:\n", 1)[0]
        path.write_text(head.rstrip("\n") + "\n" + block)
    elif args.pulumi_yaml:
        sys.stdout.write(block)
    return 0


if __name__ == "__main__":
    raise SystemExit(_main())

