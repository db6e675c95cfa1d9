"""OpenCost: what each node costs an hour, for dollars per team (`ragpool usage`, the Teams dashboard).

- The ``opencost`` chart (infra/charts.py ``OPENCOST``) in namespace ``opencost`` on the system nodes: the
  exporter only (no UI, no MCP server), pointed at the stack's Prometheus (infra/monitoring.py, the operator's
  ``prometheus-operated`` Service) for the usage it prices. infra/values/opencost.yaml says why each value.
- Prices: on-demand list prices from the public AWS price list (opencost/opencost pkg/cloud/aws/provider.go
  ``getRegionPricing``: an unauthenticated HTTPS GET of
  ``https://pricing.us-east-1.amazonaws.com/offers/v1.0/aws/AmazonEC2/current/<region>/index.json``, no
  credentials). Spot nodes: what the account really paid, from the EC2 Spot Instance data feed
  (``openCostSpotFeed``, :func:`spot_feed`), as OpenCost documents for AWS (opencost/opencost-website
  docs/configuration/aws.mdx, "AWS Spot Instance Data Feed"): the feed's bucket, region, prefix and the account id
  (``projectID``) in OpenCost's AWS provider configuration file ``aws.json``, read with the SDK's default
  credentials (EKS Pod Identity here). ``off``: a spot node gets the on-demand list price (provider.go
  ``createNode``: a preemptible node without spot-feed data gets the public price), an upper bound.
  provider.go read at opencost/opencost commit 5f6533303e38 (2024-10-24, the newest stored); the chart pins 1.120.1.
- The spot feed (``create``): an S3 bucket (SSE-S3, public access blocked, files expire after
  ``SPOT_FEED_EXPIRY_DAYS``, ACLs enabled as the feed needs, :func:`spot_feed_bucket_settings`) and the account's
  one ``aws.ec2.SpotDatafeedSubscription``. A second stack in the same account sets ``existing`` with the first
  one's bucket (or ``off``): AWS allows one subscription per account. OpenCost's role reads that bucket only
  (:func:`spot_feed_policy`), through a Pod Identity association on the chart's ServiceAccount.
- Its metrics (``node_total_hourly_cost{node}``, named in opencost/opencost pkg/costmodel/metrics.go) are scraped
  from the API port by a ServiceMonitor here, ``honorLabels`` as the chart's own ServiceMonitor
  (templates/servicemonitor.yaml): OpenCost's ``node``, ``namespace``, ``pod`` labels name what is priced, not
  the scrape target.
- NetworkPolicies: default-deny in ``opencost``; the exporter reaches DNS, Prometheus (9090), HTTPS (the API
  server, the price list, S3) and, with a spot feed, the node's Pod Identity agent; only Prometheus reaches it, on
  the API port.
- Least privilege: the chart's ClusterRole (templates/clusterrole.yaml) only gets, lists and watches (no
  Secrets); the ``nodes/proxy`` rule is off with the collector data source. Pod Security restricted.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_aws as aws
import pulumi_kubernetes as k8s

from infra import iam
from infra.charts import OPENCOST
from infra.common import RESTRICTED_NAMESPACE_LABELS, aws_tags, child, deep_merge, k8s_labels, load_values
from infra.component import RagpoolComponent
from infra.config import StackConfig
from infra.data_access import pod_identity_agent_egress
from infra.monitoring import MONITORING_NAMESPACE
from infra.pod_security import container_security_context, pod_security_context
from infra.training_namespace import baseline_policies

OPENCOST_NAMESPACE = "opencost"
RELEASE_NAME = "opencost"
# The exporter's pods, as the chart labels them (opencost/opencost-helm-chart opencost-2.5.17
# templates/_helpers.tpl ``opencost.selectorLabels``: the chart name and the release name).
EXPORTER_POD_LABELS = {"app.kubernetes.io/name": "opencost", "app.kubernetes.io/instance": RELEASE_NAME}
# The chart's Service and container port name for the API and /metrics (templates/service.yaml, deployment.yaml).
API_PORT_NAME = "http"
# The user of the opencost image (opencost/opencost Dockerfile: ``USER 1001``).
OPENCOST_UID = 1001
# The Service prometheus-operator creates for every Prometheus (kube-prometheus-stack's values name it as the
# default ``prometheusServiceName``) and Prometheus' web port.
PROMETHEUS_SERVICE = "prometheus-operated"
PROMETHEUS_PORT = 9090
PROMETHEUS_POD_LABELS = {"app.kubernetes.io/name": "prometheus"}
# The exporter's ServiceAccount: the chart's ``opencost.serviceAccountName`` (templates/_helpers.tpl) is
# ``serviceAccount.name``, set to this in opencost_values so the Pod Identity association names it for sure.
SERVICE_ACCOUNT = RELEASE_NAME

# OpenCost's AWS provider configuration file: provider.go's NewProvider picks ``aws.json`` for an AWS node and
# providerconfig.go ``configPathFor`` looks for it under $CONFIG_PATH, else ``/models/`` (the image ships
# configs/aws.json there: Dockerfile ``ADD ./configs/aws.json /models/aws.json``). Mounted over that file, read-only:
# a file that exists is read, never rewritten (providerconfig.go ``loadConfig``). Not the chart's
# ``customPricing`` ConfigMap: OpenCost applies that one through ``UpdateFromMap``, which looks fields up by their
# Go name (models.go ``SetCustomPricingField``), so the documented ``awsSpotDataBucket`` key is refused there.
AWS_PROVIDER_CONFIG_PATH = "/models/aws.json"
AWS_PROVIDER_CONFIGMAP = "opencost-aws-provider"
# The image's /models/aws.json (opencost/opencost configs/aws.json at 5f6533303e38), kept as is but the spot feed
# fields: the list-price fallbacks OpenCost already used stay the same.
IMAGE_AWS_JSON: dict[str, str] = {
    "provider": "custom",
    "description": "Default prices used to compute allocation between RAM and CPU. AWS pricing API data still used for total node cost.",
    "CPU": "0.031611", "spotCPU": "0.006655", "RAM": "0.004237", "GPU": "0.95", "spotRAM": "0.000892",
    "storage": "0.00005479452", "zoneNetworkEgress": "0.01", "regionNetworkEgress": "0.01",
    "internetNetworkEgress": "0.143", "spotLabel": "kops.k8s.io/instancegroup", "spotLabelValue": "spotinstance-nodes",
    "awsServiceKeyName": "", "awsServiceKeySecret": "", "awsSpotDataRegion": "", "awsSpotDataBucket": "",
    "awsSpotDataPrefix": "", "athenaBucketName": "", "athenaRegion": "", "athenaDatabase": "", "athenaTable": "",
    "projectID": "",
}
# How long the feed's files stay: OpenCost reads today's and yesterday's (provider.go ``parseSpotData`` lists the
# prefixes ``<prefix>/<account>.<yesterday>`` and ``.<today>``); a month more is for people checking a bill.
SPOT_FEED_EXPIRY_DAYS = 30


@dataclass(frozen=True)
class SpotFeed:
    """Where the account's spot data feed lands: its bucket, prefix and region (the bucket's, this stack's)."""

    bucket: str
    prefix: str
    region: str
    create: bool
    """This stack creates the bucket and the account's subscription (``openCostSpotFeed: create``)."""


def spot_feed(cfg: StackConfig, account_id: str) -> SpotFeed | None:
    """The feed OpenCost reads, from ``openCostSpotFeed``: None with ``off``. ``create`` names its bucket after the
    stack and the account (bucket names are global; one subscription per account), ``existing`` takes the given
    bucket."""
    if cfg.opencost_spot_feed == "off":
        return None
    create = cfg.opencost_spot_feed == "create"
    bucket = f"{cfg.name_prefix}-spot-datafeed-{account_id}" if create else cfg.opencost_spot_feed_bucket
    return SpotFeed(bucket=bucket, prefix=cfg.opencost_spot_feed_prefix, region=cfg.region, create=create)


def aws_provider_config(feed: SpotFeed, account_id: str) -> dict[str, str]:
    """OpenCost's ``aws.json``: the image's own, with the four settings OpenCost documents for the spot feed
    (aws.mdx "Configuration": ``awsSpotDataBucket``, ``awsSpotDataRegion``, ``awsSpotDataPrefix``, ``projectID`` =
    the account id; the JSON names of models.go ``CustomPricing``). ``projectID`` is required: the feed's files are
    named ``<prefix>/<account id>.<YYYY-MM-DD-HH>...`` (EC2 User Guide, "Data feed file name and format") and
    provider.go lists them by it."""
    return {**IMAGE_AWS_JSON, "awsSpotDataBucket": feed.bucket, "awsSpotDataRegion": feed.region,
            "awsSpotDataPrefix": feed.prefix, "projectID": account_id}


def spot_feed_policy(bucket_arn: str, prefix: str) -> dict[str, Any]:
    """OpenCost's role: what provider.go ``parseSpotData`` calls, nothing else: ``ListObjects`` (s3:ListBucket on
    the bucket) and the download manager's ``GetObject`` (s3:GetObject on the files). OpenCost's docs grant
    s3:List*, s3:Get* and s3:ListAllMyBuckets; it needs no more than these two. On-demand prices come from the
    public price list, unauthenticated: no pricing:* action."""
    files = f"{bucket_arn}/{prefix}/*" if prefix else f"{bucket_arn}/*"
    return {"Version": "2012-10-17", "Statement": [
        {"Sid": "ListSpotFeed", "Effect": "Allow", "Action": "s3:ListBucket", "Resource": bucket_arn},
        {"Sid": "ReadSpotFeed", "Effect": "Allow", "Action": "s3:GetObject", "Resource": files},
    ]}


def spot_feed_bucket_settings() -> dict[str, Any]:
    """The feed bucket's settings, one resource each in OpenCost._spot_feed_bucket.

    - Ownership ``BucketOwnerPreferred``, not ``BucketOwnerEnforced``: subscribing updates the bucket's ACL to give
      the AWS data feed account FULL_CONTROL, and the feed writes each file with its own ACL (EC2 User Guide, Spot
      Instance data feed, "Amazon S3 bucket requirements"); with ACLs disabled S3 refuses ACL updates
      (AccessControlListNotSupported; S3 User Guide, Object Ownership troubleshooting).
    - SSE-S3: with SSE-KMS the feed needs a customer managed key (same EC2 page); S3's own key needs no key policy.
    - Public access blocked, all four: the data feed account's grant is to an account, not public.
    - Files expire after SPOT_FEED_EXPIRY_DAYS; incomplete uploads are aborted.
    """
    return {
        "ownership": {"object_ownership": "BucketOwnerPreferred"},
        "encryption": {"apply_server_side_encryption_by_default": {"sse_algorithm": "AES256"}},
        "public_access_block": {"block_public_acls": True, "block_public_policy": True, "ignore_public_acls": True,
                                "restrict_public_buckets": True},
        "lifecycle": {"id": "expire-spot-feed", "status": "Enabled", "filter": {"prefix": ""},
                      "expiration": {"days": SPOT_FEED_EXPIRY_DAYS},
                      "abort_incomplete_multipart_upload": {"days_after_initiation": 1}},
    }


@dataclass(frozen=True)
class OpenCostArgs:
    config: StackConfig
    k8s_provider: k8s.Provider
    monitoring_namespace: pulumi.Input[str]
    depends_on: list[pulumi.Resource]
    """The monitoring release (Prometheus, the ServiceMonitor CRD)."""
    cluster_name: pulumi.Input[str] = ""
    """The EKS cluster, for the Pod Identity association that lets OpenCost read the spot feed."""


def api_port(values: dict[str, Any] | None = None) -> int:
    """The exporter's API and metrics port: the chart's ``opencost.exporter.apiPort`` (9003 by default)."""
    exporter = ((values or load_values("opencost.yaml")).get("opencost") or {}).get("exporter") or {}
    return int(exporter.get("apiPort", 9003))


def opencost_values(cfg: StackConfig, provider_config: dict[str, str] | None = None) -> dict[str, Any]:
    """The release's values: infra/values/opencost.yaml and what is computed (Prometheus, cluster id, contexts) and,
    with a spot feed, ``provider_config`` (:func:`aws_provider_config`) mounted over the image's aws.json."""
    base = load_values("opencost.yaml")
    values = deep_merge(base, {
        "serviceAccount": {"name": SERVICE_ACCOUNT},
        "podSecurityContext": pod_security_context(OPENCOST_UID),
        "opencost": {
            "exporter": {"defaultClusterId": cfg.name_prefix, "securityContext": container_security_context()},
            "prometheus": {"internal": {"enabled": True, "serviceName": PROMETHEUS_SERVICE,
                                        "namespaceName": MONITORING_NAMESPACE, "port": PROMETHEUS_PORT,
                                        "scheme": "http"}},
        },
    })
    if provider_config is not None:
        # The chart's extraVolumes / opencost.exporter.extraVolumeMounts (values.yaml, templates/deployment.yaml);
        # a subPath mount never sees a changed ConfigMap, so the pod template carries the file's hash and rolls.
        text = aws_json(provider_config)
        values["extraVolumes"] = [*values["extraVolumes"],
                                  {"name": "aws-provider-config", "configMap": {"name": AWS_PROVIDER_CONFIGMAP}}]
        exporter = values["opencost"]["exporter"]
        exporter["extraVolumeMounts"] = [*exporter["extraVolumeMounts"], {
            "name": "aws-provider-config", "mountPath": AWS_PROVIDER_CONFIG_PATH, "subPath": "aws.json",
            "readOnly": True}]
        values["podAnnotations"] = {**(values.get("podAnnotations") or {}),
                                    "ragpool.io/aws-provider-config": hashlib.sha256(text.encode()).hexdigest()[:16]}
    return values


def aws_json(provider_config: dict[str, str]) -> str:
    """The aws.json file's text (the ConfigMap's and the pod annotation's hash)."""
    return json.dumps(provider_config, indent=2) + "\n"


def opencost_network_policies(spot_feed_on: bool = False) -> dict[str, dict[str, Any]]:
    """OpenCost's namespace: DNS, Prometheus and HTTPS out (with a spot feed, the Pod Identity agent too);
    Prometheus in on the API port; nothing else."""
    monitoring = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": MONITORING_NAMESPACE}}}
    return {
        **baseline_policies("opencost-"),
        "opencost-exporter": {
            "podSelector": {"matchLabels": dict(EXPORTER_POD_LABELS)}, "policyTypes": ["Ingress", "Egress"],
            "ingress": [{"from": [monitoring], "ports": [{"protocol": "TCP", "port": api_port()}]}],
            "egress": [
                {"to": [{**monitoring, "podSelector": {"matchLabels": dict(PROMETHEUS_POD_LABELS)}}],
                 "ports": [{"protocol": "TCP", "port": PROMETHEUS_PORT}]},
                # The API server, the public AWS price list and S3 (the spot feed).
                {"to": [{"ipBlock": {"cidr": "0.0.0.0/0"}}], "ports": [{"protocol": "TCP", "port": 443}]},
                # The node's EKS Pod Identity agent: the SDK's credentials for reading the spot feed.
                *([pod_identity_agent_egress()] if spot_feed_on else []),
            ],
        },
    }


def service_monitor_spec() -> dict[str, Any]:
    """Prometheus scrapes /metrics on the API port, keeping OpenCost's own labels (honorLabels)."""
    return {"namespaceSelector": {"matchNames": [OPENCOST_NAMESPACE]},
            "selector": {"matchLabels": dict(EXPORTER_POD_LABELS)},
            "endpoints": [{"port": API_PORT_NAME, "path": "/metrics", "interval": "60s", "honorLabels": True}]}


class OpenCost(RagpoolComponent):
    def __init__(self, name: str, args: OpenCostArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("ragpool:infra:OpenCost", name, opts, k8s_provider=args.k8s_provider)
        name = self.child_prefix
        cfg = args.config
        account = iam.account_id()
        feed = spot_feed(cfg, account)

        self.namespace = k8s.core.v1.Namespace(
            f"{name}-ns", metadata={"name": OPENCOST_NAMESPACE, "labels": {
                **k8s_labels("cost", OPENCOST_NAMESPACE), **RESTRICTED_NAMESPACE_LABELS}},
            opts=child(self, depends_on=args.depends_on))
        self.namespace_name = self.namespace.metadata.name
        ns_opts = child(self, depends_on=[self.namespace])
        policies = [k8s.networking.v1.NetworkPolicy(
            f"{name}-{np_name}",
            metadata={"name": np_name, "namespace": OPENCOST_NAMESPACE, "labels": k8s_labels("cost")},
            spec=spec, opts=ns_opts) for np_name, spec in opencost_network_policies(feed is not None).items()]
        provider_config = None if feed is None else aws_provider_config(feed, account)
        feed_deps = [] if feed is None else self._spot_feed(name, cfg, args, feed, provider_config, ns_opts)
        # After the policies: the exporter's readiness (which the atomic release waits for) needs Prometheus.
        self.release = k8s.helm.v3.Release(
            f"{name}-exporter", name=RELEASE_NAME, namespace=OPENCOST_NAMESPACE,
            values=opencost_values(cfg, provider_config), atomic=True, cleanup_on_fail=True,
            **OPENCOST.release_args(),
            opts=child(self, depends_on=[self.namespace, *policies, *feed_deps, *args.depends_on]))
        k8s.apiextensions.CustomResource(
            f"{name}-metrics", api_version="monitoring.coreos.com/v1", kind="ServiceMonitor",
            metadata={"name": "opencost", "namespace": args.monitoring_namespace,
                      "labels": k8s_labels("monitoring", "opencost")},
            spec=service_monitor_spec(), opts=child(self, depends_on=[self.release, *args.depends_on]))
        self.register_outputs({"namespace": self.namespace_name})

    def _spot_feed(self, name: str, cfg: StackConfig, args: OpenCostArgs, feed: SpotFeed,
                   provider_config: dict[str, str], ns_opts: pulumi.ResourceOptions) -> list[pulumi.Resource]:
        """The bucket and subscription (``create``), OpenCost's read-only role on the bucket, its Pod Identity
        association and the aws.json ConfigMap: what the release waits for."""
        deps: list[pulumi.Resource] = []
        if feed.create:
            deps.append(self._spot_feed_bucket(name, cfg, feed))
        tags = aws_tags(cfg, f"{cfg.name_prefix}-opencost")
        role = aws.iam.Role(f"{name}-spot-feed-reader", assume_role_policy=iam.pod_identity_trust(), tags=tags,
                            opts=child(self))
        bucket_arn = f"arn:{iam.partition()}:s3:::{feed.bucket}"
        policy = aws.iam.RolePolicy(f"{name}-spot-feed-reader", role=role.id,
                                    policy=json.dumps(spot_feed_policy(bucket_arn, feed.prefix)), opts=child(self))
        identity = aws.eks.PodIdentityAssociation(
            f"{name}-spot-feed-reader", cluster_name=args.cluster_name, namespace=OPENCOST_NAMESPACE,
            service_account=SERVICE_ACCOUNT, role_arn=role.arn, tags=tags, opts=child(self, depends_on=[policy]))
        config = k8s.core.v1.ConfigMap(
            f"{name}-aws-provider", metadata={"name": AWS_PROVIDER_CONFIGMAP, "namespace": OPENCOST_NAMESPACE,
                                              "labels": k8s_labels("cost")},
            data={"aws.json": aws_json(provider_config)}, opts=ns_opts)
        return [*deps, identity, config]

    def _spot_feed_bucket(self, name: str, cfg: StackConfig, feed: SpotFeed) -> pulumi.Resource:
        """The feed's bucket with spot_feed_bucket_settings, and the account's one subscription writing to it."""
        settings = spot_feed_bucket_settings()
        # force_destroy: `pulumi destroy` empties it (the files restate what the bill already shows), so a
        # teardown does not stop at a non-empty bucket.
        bucket = aws.s3.Bucket(f"{name}-spot-feed", bucket=feed.bucket, force_destroy=True,
                               tags=aws_tags(cfg, feed.bucket), opts=child(self))
        ownership = aws.s3.BucketOwnershipControls(f"{name}-spot-feed", bucket=bucket.id,
                                                   rule=settings["ownership"], opts=child(self))
        blocked = aws.s3.BucketPublicAccessBlock(f"{name}-spot-feed", bucket=bucket.id,
                                                 **settings["public_access_block"], opts=child(self))
        aws.s3.BucketServerSideEncryptionConfiguration(f"{name}-spot-feed", bucket=bucket.id,
                                                       rules=[settings["encryption"]], opts=child(self))
        aws.s3.BucketLifecycleConfiguration(f"{name}-spot-feed", bucket=bucket.id, rules=[settings["lifecycle"]],
                                            opts=child(self))
        # Subscribing rewrites the bucket's ACL for the data feed account: after ACLs are enabled and public
        # access is blocked. One per account (EC2 CreateSpotDatafeedSubscription): a second stack sets existing.
        return aws.ec2.SpotDatafeedSubscription(
            f"{name}-spot-feed", bucket=bucket.id, prefix=feed.prefix or None,
            opts=child(self, depends_on=[ownership, blocked]))
