"""Stack configuration: the ``ragpool:`` keys parsed once into frozen, validated objects.

:func:`parse` validates raw values against the schema (infra/config_schema.py ``SCHEMA``) into a
:class:`StackConfig`. Every problem is collected and raised as one :class:`StackConfigError` whose lines each
name the key, the value and what is allowed, so an operator fixes a broken stack file in one pass. The GPU
pools and teams are parsed in infra/config_gpu.py, the data buckets and the run API's teams in
infra/config_access.py; the program reads its config with infra/deploy_config.py ``from_pulumi``.
"""

from __future__ import annotations

import difflib
import ipaddress
import re
from dataclasses import dataclass, field
from typing import Any, Mapping

from contract.api import ApiTeams
from contract.messages import shown
from infra.config_access import DataConfig, check_team_routes, parse_access
from infra.config_gpu import GpuPoolConfig, TeamConfig, parse_gpu
from infra.config_reader import Reader, check, is_int, shown_key
from infra.config_schema import (
    ALERT_RECEIVERS,
    CLOUDWATCH_RETENTION_DAYS,
    ENVIRONMENTS,
    NAT_MODES,
    PROJECT,
    SCHEMA_BY_NAME,
    SPOT_FEED_MODES,
    SUPPORTED_KUBERNETES_VERSIONS,
    _INSTANCE_TYPE,
)

# Identifier rules. Always applied with fullmatch: re.match(r"...$") accepts a trailing newline.
_ROLE_ARN = re.compile(r"arn:aws(-cn|-us-gov)?:iam::\d{12}:role/[\w+=,.@/-]{1,512}")
_IMAGE_TAG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")
_IMAGE_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
_REGION = re.compile(r"[a-z]{2}(-gov)?-[a-z]+-\d")
# An S3 general purpose bucket name (S3 User Guide, "General purpose bucket naming rules": 3-63 lowercase letters,
# digits, dots and hyphens, beginning and ending with a letter or digit).
_S3_BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
# A key prefix without a leading or trailing slash (S3's "safe characters" for object keys, slash-separated).
_S3_PREFIX = re.compile(r"[A-Za-z0-9!_.*'()-]+(/[A-Za-z0-9!_.*'()-]+)*")


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
    opencost_spot_feed: str = SCHEMA_BY_NAME["openCostSpotFeed"].default
    """Where OpenCost reads spot prices: create, existing or off (``openCostSpotFeed``; infra/opencost.py)."""
    opencost_spot_feed_bucket: str = ""
    """The existing feed's bucket (``openCostSpotFeedBucket``), with ``existing`` only."""
    opencost_spot_feed_prefix: str = ""
    """The feed's file prefix (``openCostSpotFeedPrefix``)."""
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


def _check_unknown_keys(r: Reader) -> None:
    for key in sorted(r.raw, key=str):
        if not isinstance(key, str):
            r.problems.append(f"{PROJECT}: key {shown_key(key)} is not a string; config keys are names like owner")
        elif key not in SCHEMA_BY_NAME:
            close = difflib.get_close_matches(key[:100], list(SCHEMA_BY_NAME), n=1, cutoff=0.75)
            hint = f"did you mean {close[0]}?" if close else "known keys: " + ", ".join(sorted(SCHEMA_BY_NAME))
            r.problems.append(f"{PROJECT}:{shown_key(key)} is not a ragpool config key ({hint}); "
                              f"remove it with: pulumi config rm {shown_key(key)}")


def _parse_identity(r: Reader) -> dict[str, Any]:
    """environment, owner, costCenter."""
    env = r.get("environment")
    check(env in ENVIRONMENTS, r, "environment", env, "must be one of " + ", ".join(ENVIRONMENTS))
    owner = r.get("owner")
    cost_center = r.get("costCenter")
    for key, value in (("owner", owner), ("costCenter", cost_center)):
        if value is not None:
            check(bool(re.fullmatch(r"[\w .:/=+@-]{1,128}", value)), r, key, value,
                  "must be 1-128 characters valid in an AWS tag value")
    return {"environment": env, "owner": owner, "cost_center": cost_center}


def _valid_region(region: Any) -> bool:
    return isinstance(region, str) and bool(_REGION.fullmatch(region))


def _check_region(r: Reader, region: str | None) -> None:
    if not _valid_region(region):
        r.problems.append(f"aws:region = {shown(region)}: must be set to an AWS region, e.g. us-west-2 (fix: pulumi config set aws:region us-west-2)")


def _parse_network(r: Reader, prod: bool, region: str | None) -> NetworkConfig:
    """vpcCidr, availabilityZones, natGateways."""
    cidr = r.get("vpcCidr")
    try:
        net = ipaddress.ip_network(cidr, strict=True)
        check(net.version == 4 and 16 <= net.prefixlen <= 20 and net.is_private, r, "vpcCidr", cidr,
              "must be a private IPv4 network from /16 to /20, e.g. 10.0.0.0/16")
    except (ValueError, TypeError):
        r.problem("vpcCidr", cidr, "must be a valid IPv4 CIDR with no host bits set, e.g. 10.0.0.0/16")

    zones = tuple(r.get("availabilityZones") or ())
    min_zones = 3 if prod else 2
    check(len(zones) >= min_zones, r, "availabilityZones", list(zones),
          f"needs at least {min_zones} availability zones{' in prod (HA)' if prod else ''}")
    check(len(set(zones)) == len(zones), r, "availabilityZones", list(zones), "zones must be distinct")
    check(len(zones) <= 6, r, "availabilityZones", list(zones), "at most 6 zones (subnets are carved per AZ)")
    if _valid_region(region):
        for z in zones:
            check(bool(re.fullmatch(re.escape(region) + r"[a-z]", z)), r, "availabilityZones", z,
                  f"must be a zone of aws:region {region}, e.g. {region}a")

    nat = r.get("natGateways")
    check(nat in NAT_MODES, r, "natGateways", nat, "must be one of " + ", ".join(NAT_MODES))
    return NetworkConfig(vpc_cidr=cidr, availability_zones=zones, nat_gateways=nat)


def _parse_cluster(r: Reader, prod: bool) -> ClusterConfig:
    """kubernetesVersion, the API endpoint's access, admin roles and the system node group."""
    version = r.get("kubernetesVersion")
    check(version in SUPPORTED_KUBERNETES_VERSIONS, r, "kubernetesVersion", version,
          "must be one of " + ", ".join(SUPPORTED_KUBERNETES_VERSIONS))
    public = r.get("endpointPublicAccess")
    cidrs = tuple(r.get("publicAccessCidrs") or ())
    if prod:
        check(not public, r, "endpointPublicAccess", public, "must be false in prod (private API endpoint; reach it over VPN or a bastion)")
    if public:
        check(bool(cidrs), r, "publicAccessCidrs", list(cidrs),
              "must list the CIDRs allowed to reach the public API endpoint (or set endpointPublicAccess false)")
    for c in cidrs:
        try:
            n = ipaddress.ip_network(c, strict=True)
            check(n.prefixlen > 0, r, "publicAccessCidrs", c, "0.0.0.0/0 opens the API to the internet; list specific CIDRs")
        except ValueError:
            r.problem("publicAccessCidrs", c, "must be a valid CIDR such as 203.0.113.0/24")
    arns = tuple(r.get("adminRoleArns") or ())
    for a in arns:
        check(bool(_ROLE_ARN.fullmatch(a)), r, "adminRoleArns", a, "must be an IAM role ARN: arn:aws:iam::<12-digit account>:role/<name>")
    deploy_role = r.get("deployRoleArn")
    if deploy_role is not None:
        check(bool(_ROLE_ARN.fullmatch(deploy_role)), r, "deployRoleArn", deploy_role,
              "must be the IAM role ARN `pulumi up` runs as: arn:aws:iam::<12-digit account>:role/<name> "
              "(fix: pulumi config set deployRoleArn arn:aws:iam::<account>:role/<deploy-role>)")
    preview_role = r.get("previewRoleArn")
    if preview_role:
        check(bool(_ROLE_ARN.fullmatch(preview_role)), r, "previewRoleArn", preview_role,
              "must be the IAM role ARN the PR preview runs as: arn:aws:iam::<12-digit account>:role/<name> "
              "(or empty for no cluster preview; fix: pulumi config set previewRoleArn arn:aws:iam::<account>:role/<preview-role>)")
        check(preview_role not in (deploy_role, *arns), r, "previewRoleArn", preview_role,
              "must not be the deploy role or an admin role (those already have cluster admin; the preview role "
              "gets only the dry-run rights)")
    api_cidrs = tuple(r.get("apiAccessCidrs") or ())
    for c in api_cidrs:
        try:
            check(ipaddress.ip_network(c, strict=True).is_private, r, "apiAccessCidrs", c,
                  "must be a private range (VPN, deploy runner subnet) such as 10.0.0.0/16")
        except ValueError:
            r.problem("apiAccessCidrs", c, "must be a valid CIDR such as 10.0.0.0/16")
    if public is False:
        check(bool(api_cidrs), r, "apiAccessCidrs", list(api_cidrs),
              "must list the VPN / deploy-runner CIDRs that reach the private API endpoint (otherwise nobody "
              "outside the cluster can run kubectl or `pulumi up`; fix: pulumi config set --path 'apiAccessCidrs[0]' 10.0.0.0/16)")
    sys_types = tuple(r.get("systemNodeInstanceTypes") or ())
    check(bool(sys_types), r, "systemNodeInstanceTypes", list(sys_types), "must list at least one instance type")
    for t in sys_types:
        check(bool(_INSTANCE_TYPE.fullmatch(t)), r, "systemNodeInstanceTypes", t, "must be an EC2 instance type like m7i.large")
    smin, smax = r.get("systemNodeMinCount"), r.get("systemNodeMaxCount")
    if isinstance(smin, int) and isinstance(smax, int):
        check(smin >= (2 if prod else 1), r, "systemNodeMinCount", smin, f"must be at least {2 if prod else 1}")
        check(smin <= smax, r, "systemNodeMinCount", smin, f"must not exceed systemNodeMaxCount ({smax})")
        check(smax <= 100, r, "systemNodeMaxCount", smax, "must be at most 100")
    return ClusterConfig(
        kubernetes_version=version, endpoint_public_access=public, public_access_cidrs=cidrs,
        admin_role_arns=arns, system_node_instance_types=sys_types,
        system_node_min_count=smin, system_node_max_count=smax,
        deploy_role_arn=deploy_role or "", api_access_cidrs=api_cidrs, preview_role_arn=preview_role or "",
    )


def _parse_storage_and_image(r: Reader) -> dict[str, Any]:
    """efsBackupRetentionDays, buildImage, imageTag, imageDigest."""
    retention = r.get("efsBackupRetentionDays")
    check(isinstance(retention, int) and 1 <= retention <= 36500, r, "efsBackupRetentionDays", retention,
          "must be an integer from 1 to 36500 days")
    build = r.get("buildImage")
    tag = r.get("imageTag")
    check(isinstance(tag, str) and bool(_IMAGE_TAG.fullmatch(tag)) and tag != "latest", r, "imageTag", tag,
          "must be a valid immutable Docker tag (not `latest`), e.g. 0.1.0 or a git SHA")
    digest = r.get("imageDigest")
    check(isinstance(digest, str) and (digest == "" or bool(_IMAGE_DIGEST.fullmatch(digest))), r, "imageDigest", digest,
          "must be empty or an image digest sha256:<64 lowercase hex> (`aws ecr describe-images` imageDigest)")
    return {"efs_backup_retention_days": retention, "build_image": build, "image_tag": tag, "image_digest": digest}


def _parse_monitoring(r: Reader) -> dict[str, Any]:
    """prometheusRetention, gpuHoursBudget, runbookBaseUrl, prometheusStorageGiB, logRetentionDays, openCostEnabled,
    the openCostSpotFeed keys."""
    retention_p = r.get("prometheusRetention")
    check(_duration_days(retention_p) >= 30, r, "prometheusRetention", retention_p,
          "must be a Prometheus duration of at least 30d, such as 31d or 1y (the GPU-hour budget looks back 30 days)")
    budget_h = r.get("gpuHoursBudget")
    check(isinstance(budget_h, int) and budget_h > 0, r, "gpuHoursBudget", budget_h, "must be a positive integer")
    runbook = r.get("runbookBaseUrl")
    check(runbook == "" or (isinstance(runbook, str) and bool(re.fullmatch(r"https://[!-~]+", runbook))), r,
          "runbookBaseUrl", runbook, "must be empty or an https:// URL (printable ASCII, no spaces)")
    storage_p = r.get("prometheusStorageGiB")
    check(isinstance(storage_p, int) and 10 <= storage_p <= 16384, r, "prometheusStorageGiB", storage_p,
          "must be an integer from 10 to 16384")
    log_days = r.get("logRetentionDays")
    check(log_days in CLOUDWATCH_RETENTION_DAYS and not isinstance(log_days, bool), r, "logRetentionDays", log_days,
          "must be one of CloudWatch Logs' retention periods: " + ", ".join(map(str, CLOUDWATCH_RETENTION_DAYS)))
    return {"prometheus_retention": retention_p, "gpu_hours_budget": budget_h, "runbook_base_url": runbook,
            "prometheus_storage_gib": storage_p, "log_retention_days": log_days,
            "opencost_enabled": bool(r.get("openCostEnabled")), **_parse_spot_feed(r)}


def _parse_spot_feed(r: Reader) -> dict[str, Any]:
    """openCostSpotFeed, openCostSpotFeedBucket, openCostSpotFeedPrefix (infra/opencost.py)."""
    mode = r.get("openCostSpotFeed")
    check(mode in SPOT_FEED_MODES, r, "openCostSpotFeed", mode, "must be one of " + ", ".join(SPOT_FEED_MODES))
    bucket = r.get("openCostSpotFeedBucket")
    if mode == "existing":
        check(isinstance(bucket, str) and bool(_S3_BUCKET.fullmatch(bucket)), r, "openCostSpotFeedBucket", bucket,
              "must name the S3 bucket of the account's spot data feed with openCostSpotFeed existing "
              "(`aws ec2 describe-spot-datafeed-subscription` shows it)")
    else:
        check(bucket == "", r, "openCostSpotFeedBucket", bucket,
              f"must be empty unless openCostSpotFeed is existing (it is {mode!r}): create names its own bucket")
    prefix = r.get("openCostSpotFeedPrefix")
    check(prefix == "" or (isinstance(prefix, str) and len(prefix) <= 512 and bool(_S3_PREFIX.fullmatch(prefix))), r,
          "openCostSpotFeedPrefix", prefix,
          "must be empty or an S3 key prefix of letters, digits and !_.*'()- in /-separated parts, no leading or "
          "trailing slash")
    return {"opencost_spot_feed": mode, "opencost_spot_feed_bucket": bucket, "opencost_spot_feed_prefix": prefix}


def _parse_queue(r: Reader) -> dict[str, Any]:
    """redisNodeType."""
    redis_node = r.get("redisNodeType")
    check(isinstance(redis_node, str) and bool(re.fullmatch(r"cache\.[a-z0-9]+\.[a-z0-9]+", redis_node or "")), r,
          "redisNodeType", redis_node, "must be an ElastiCache node type such as cache.r7g.large")
    return {"redis_node_type": redis_node}


def _parse_alerts(r: Reader) -> dict[str, Any]:
    """alertReceiver and its secret."""
    receiver = r.get("alertReceiver")
    check(receiver in ALERT_RECEIVERS, r, "alertReceiver", receiver, "must be one of " + ", ".join(ALERT_RECEIVERS))
    secret = r.get("alertReceiverSecret")
    if receiver in ("slack", "pagerduty") and not secret:
        r.problems.append(
            f"{PROJECT}:alertReceiverSecret is required when alertReceiver is {receiver} "
            f"(fix: pulumi config set --secret alertReceiverSecret <{'webhook URL' if receiver == 'slack' else 'routing key'}>)"
        )
    return {"alert_receiver": receiver, "alert_receiver_secret": secret}


def _parse_ray(r: Reader, pools: tuple[GpuPoolConfig, ...]) -> dict[str, Any]:
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
            if check(is_int(value, 0, most), r, f"rayMaxWorkers.{name}", value,
                     f"must be an integer from 0 to {most} (pool {name}: gpuLimit {pool.gpu_limit} / "
                     f"gpusPerWorker {pool.gpus_per_worker})"):
                max_workers.append((name, value))
    head_cpu = r.get("rayHeadCpu")
    check(is_int(head_cpu, 1, 64), r, "rayHeadCpu", head_cpu, "must be an integer from 1 to 64 (cores)")
    head_mem = r.get("rayHeadMemoryGiB")
    check(is_int(head_mem, 2, 1024), r, "rayHeadMemoryGiB", head_mem, "must be an integer from 2 to 1024 (GiB)")
    return {"ray": RayConfig(enabled=bool(enabled), max_workers=tuple(sorted(max_workers)),
                             head_cpu=head_cpu, head_memory_gib=head_mem)}


def parse(raw: Mapping[str, Any], *, stack: str, region: str | None, project: str = PROJECT,
          source: str | None = None) -> StackConfig:
    """Validate raw ``ragpool:`` values (keys without the namespace) into a StackConfig.

    ``raw`` values may be Pulumi's wire form (strings, JSON text) or native YAML values.
    Raises one StackConfigError listing every problem.
    """
    r = Reader(raw)
    _check_unknown_keys(r)
    identity = _parse_identity(r)
    prod = identity["environment"] == "prod"
    _check_region(r, region)
    network = _parse_network(r, prod, region)
    cluster = _parse_cluster(r, prod)
    gpu = parse_gpu(r, prod, network.availability_zones)
    groups = {
        **gpu,
        **_parse_storage_and_image(r),
        **_parse_monitoring(r),
        **_parse_queue(r),
        **_parse_alerts(r),
        **_parse_ray(r, gpu["gpu_pools"]),
        **parse_access(r),
    }
    check_team_routes(r, groups["teams"], groups.get("api_teams"))
    if r.problems:
        raise StackConfigError(r.problems, source or f"stack {stack}")
    return StackConfig(project=project, stack=stack, region=region, network=network, cluster=cluster,
                       **identity, **groups)
