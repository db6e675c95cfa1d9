"""The stack config's keys: every ``ragpool:`` key declared once, with its type, default and allowed values.

``SCHEMA`` is the single source of truth: ``Pulumi.yaml``'s ``config:`` block is generated from it
(``python -m infra.config_schema --write Pulumi.yaml``; a test keeps the two in sync) and
infra/config.py validates against it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from contract.names import TEAM_NAMESPACE_PREFIX

PROJECT = "ragpool"

# Kubernetes minor versions EKS offers in standard support for this release of
# ragpool (1.33 ends Jul 2026 standard support; 1.35 GA on EKS Jan 2026).
SUPPORTED_KUBERNETES_VERSIONS = ("1.33", "1.34", "1.35")
ENVIRONMENTS = ("dev", "staging", "prod")
CAPACITY_TYPES = ("spot", "on-demand")
NAT_MODES = ("single", "perAz")
ALERT_RECEIVERS = ("none", "slack", "pagerduty")
SPOT_FEED_MODES = ("create", "existing", "off")

# EC2 instance families that carry NVIDIA GPUs (g5g is Graviton + T4G).
GPU_INSTANCE_FAMILIES = (
    "g4dn", "g5", "g5g", "g6", "g6e", "g6f", "gr6", "gr6f",
    "p3", "p3dn", "p4d", "p4de", "p5", "p5e", "p5en", "p6-b200", "p6e-gb200",
)
# An EC2 instance type. Always applied with fullmatch: re.match(r"...$") accepts a trailing newline.
_INSTANCE_TYPE = re.compile(r"(?P<family>[a-z][a-z0-9-]*?)\.(?P<size>[0-9a-z-]+)")


def is_gpu_instance_type(instance_type: Any) -> bool:
    """An EC2 instance type of one of GPU_INSTANCE_FAMILIES, e.g. g6e.12xlarge (the one rule; policy uses it too)."""
    m = _INSTANCE_TYPE.fullmatch(instance_type) if isinstance(instance_type, str) else None
    return bool(m) and m.group("family") in GPU_INSTANCE_FAMILIES


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
        "weight?, expireAfter?, consolidateAfter?, disruptionBudget?, gpusPerWorker?, checkpointSeconds?}. Pools scale from zero. "
        "checkpointSeconds: the measured time of one checkpoint (ragpool_checkpoint_duration_seconds) of the largest run "
        "trained on the pool; on a spot pool two of them (a background save in flight, then the SIGTERM "
        "one) must fit the 2-minute spot notice, on on-demand they lengthen the worker pods' grace period past 300 s "
        "when needed. (Pulumi cannot type objects, so "
        "infra/config_gpu.py validates this key.)",
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
    ConfigKey("openCostSpotFeed", "string", "Where OpenCost reads what spot nodes really cost (the EC2 Spot Instance data feed; infra/opencost.py): create (this stack creates the feed's S3 bucket and the account's one feed subscription), existing (another stack or person owns the account's subscription: read it from openCostSpotFeedBucket, see `aws ec2 describe-spot-datafeed-subscription`) or off (spot nodes priced at the on-demand list price, an upper bound).", "create"),
    ConfigKey("openCostSpotFeedBucket", "string", "With openCostSpotFeed existing: the S3 bucket the account's spot data feed subscription writes to, in the stack's region (OpenCost reads it there); empty otherwise.", ""),
    ConfigKey("openCostSpotFeedPrefix", "string", "The spot data feed's file prefix: the one this stack's subscription writes with (create) or the existing subscription's (existing); empty: no prefix.", ""),
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
    ConfigKey(
        "mainNamespaceTeams", "array",
        "apiTeams teams whose runs go, on purpose, to the main training namespace ragpool-training (its queue and the "
        "GPUs the trainingTeams leave) while trainingTeams exist. With trainingTeams set, every other apiTeams team "
        "must be a trainingTeams team of the same name, so a misspelt team is refused instead of silently sharing the "
        "main queue. Without trainingTeams every team uses the main namespace and this list is not needed.",
        [], items="string",
    ),
)
SCHEMA_BY_NAME = {k.name: k for k in SCHEMA}


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

