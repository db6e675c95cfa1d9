"""Log shipping: container logs outlive their node (CloudWatch Logs, through the managed add-on).

The EKS add-on ``amazon-cloudwatch-observability`` runs Fluent Bit as a DaemonSet on every
node (it tolerates every taint by default, GPU nodes included) and ships every file under
``/var/log/containers`` to CloudWatch Logs: container logs of every namespace (training, the
team namespaces, Ray) land in ``/aws/containerinsights/<cluster>/application``; aws-node and
kube-proxy in ``.../dataplane``; the node journal in ``.../host``. Its upstream Fluent Bit
configuration excludes only its own pods, aws-node and kube-proxy from ``application``
(reference data: infra/reference/cloudwatch_observability.yaml).

The CloudWatch agent's Container Insights metrics (on by default) go to ``.../performance``.
ragpool pre-creates those log groups, so they carry the stack's retention
(``logRetentionDays``) and a customer-managed KMS key whose policy lets CloudWatch Logs use it
for exactly these groups (Fluent Bit's ``auto_create_group`` finds them existing). The add-on's
service account ``cloudwatch-agent`` (namespace ``amazon-cloudwatch``; Fluent Bit and the
CloudWatch agent share it) gets its AWS credentials through EKS Pod Identity: a role with the
managed ``CloudWatchAgentServerPolicy``.

``ragpool logs`` reads ``APPLICATION_LOG_GROUP_FORMAT`` (filtering by run id).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import pulumi
import pulumi_aws as aws

from infra import iam
from infra.component import RagpoolComponent
from infra.common import aws_tags, child, stateful
from infra.config import StackConfig
from contract.names import APPLICATION_LOG_GROUP

ADDON = "amazon-cloudwatch-observability"
#: Pinned, unlike the other managed add-ons (infra/cluster.py): the configuration keys below are
#: version-specific (``applicationSignals``/``containerInsights`` exist from chart 6.2.0) and the
#: add-on's configuration schema refuses unknown keys. v6.4.0 is the chart whose facts
#: infra/reference/cloudwatch_observability.yaml records (``addon_version`` there).
ADDON_VERSION = "v6.4.0-eksbuild.1"
ADDON_NAMESPACE = "amazon-cloudwatch"
#: The add-on's service account; Fluent Bit's DaemonSet runs as it too (chart helper
#: ``cloudwatch-agent.serviceAccountName``), so one Pod Identity association covers both.
ADDON_SERVICE_ACCOUNT = "cloudwatch-agent"
ADDON_POLICY = "CloudWatchAgentServerPolicy"
#: The log group container logs go to (Fluent Bit's ``log_group_name`` in the add-on's chart):
#: ``APPLICATION_LOG_GROUP_FORMAT.format(cluster=<EKS cluster name>)``.
APPLICATION_LOG_GROUP_FORMAT = APPLICATION_LOG_GROUP  # one home: what ragpool logs reads
#: Every log group the add-on writes with ADDON_CONFIGURATION (all pre-created with retention and
#: KMS): Fluent Bit's three, and Container Insights' ``performance`` (the CloudWatch agent's EMF
#: metrics; on by the chart's default). tests/infra/test_log_shipping.py derives the set the add-on
#: writes from its recorded defaults plus ADDON_CONFIGURATION and requires each one here.
LOG_GROUP_FORMATS = {
    "application": APPLICATION_LOG_GROUP_FORMAT,
    "dataplane": "/aws/containerinsights/{cluster}/dataplane",
    "host": "/aws/containerinsights/{cluster}/host",
    "performance": "/aws/containerinsights/{cluster}/performance",
}
#: Add-on configuration values (keys verified against the chart at the recorded commit,
#: infra/reference/cloudwatch_observability.yaml ``configuration_keys``):
#: - container logs on (the default, stated so a default change upstream cannot switch them off
#:   silently). Tolerations stay the chart's default (``operator: Exists``, every taint), which
#:   tests/infra/test_gpu_node_scheduling.py checks lands Fluent Bit on every GPU node;
#: - Application Signals off, and its auto-monitoring with it: ragpool does not use it, and its
#:   webhooks would give every Service-selected Deployment/StatefulSet/DaemonSet outside the
#:   operator's excluded namespaces ADOT init containers without a securityContext, which the
#:   training namespace's ``restricted`` Pod Security level rejects (tests/infra/test_admission.py);
#:   ``monitorAllServices`` is stated too, so a chart that stops deriving it from the first key
#:   cannot turn auto-monitoring back on. Its log group is then never written;
#: - the add-on's own DCGM exporter off: ragpool's dcgm-exporter (infra/gpu_plugins.py) is the one
#:   exporter per GPU node, on the node monitoring agent's host engine (one host engine per node).
ADDON_CONFIGURATION: dict = {
    "containerLogs": {"enabled": True},
    "applicationSignals": {"enabled": False},
    "manager": {"applicationSignals": {"autoMonitor": {"monitorAllServices": False}}},
    "dcgmExporter": {"enabled": False},
}


def log_group_name(cluster: str, kind: str = "application") -> str:
    """``/aws/containerinsights/<cluster>/<kind>``."""
    return LOG_GROUP_FORMATS[kind].format(cluster=cluster)


def log_group_arn_pattern(partition: str, region: str, account: str, cluster: str) -> str:
    """ARN pattern of every Container Insights log group of ``cluster`` (KMS encryption context)."""
    return f"arn:{partition}:logs:{region}:{account}:log-group:/aws/containerinsights/{cluster}/*"


def logs_key_policy(partition: str, region: str, account: str, cluster: str) -> dict:
    """KMS key policy: the account administers the key; CloudWatch Logs in this region may use
    it, only for this cluster's Container Insights log groups (the ``aws:logs:arn`` encryption
    context CloudWatch Logs sends; AWS docs "Encrypt log data in CloudWatch Logs using AWS KMS")."""
    return {
        "Version": "2012-10-17",
        "Statement": [
            {"Sid": "AccountAdministers", "Effect": "Allow",
             "Principal": {"AWS": f"arn:{partition}:iam::{account}:root"}, "Action": "kms:*", "Resource": "*"},
            {"Sid": "CloudWatchLogsUsesForContainerInsights", "Effect": "Allow",
             "Principal": {"Service": f"logs.{region}.amazonaws.com"},
             "Action": ["kms:Encrypt*", "kms:Decrypt*", "kms:ReEncrypt*", "kms:GenerateDataKey*", "kms:Describe*"],
             "Resource": "*",
             "Condition": {"ArnLike": {
                 "kms:EncryptionContext:aws:logs:arn": log_group_arn_pattern(partition, region, account, cluster)}}},
        ],
    }


@dataclass(frozen=True)
class LogShippingArgs:
    config: StackConfig
    cluster_name: str
    """The EKS cluster's name (the log group names contain it)."""
    eks_cluster_name: pulumi.Input[str]
    """The same name as an output of the cluster, so the add-on waits for the cluster."""
    depends_on: list[pulumi.Resource]
    """What the add-on's pods need: nodes, and the Pod Identity agent."""


class LogShipping(RagpoolComponent):
    def __init__(self, name: str, args: LogShippingArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("ragpool:infra:LogShipping", name, opts)
        name = self.child_prefix
        cfg, cluster = args.config, args.cluster_name
        partition, account = iam.partition(), iam.account_id()

        self.key = aws.kms.Key(
            f"{name}-key", description=f"CloudWatch Logs encryption for {cluster} container logs",
            enable_key_rotation=True, deletion_window_in_days=30,
            policy=json.dumps(logs_key_policy(partition, cfg.region, account, cluster)),
            tags=aws_tags(cfg, f"{cluster}-logs"), opts=stateful(self, cfg))
        aws.kms.Alias(f"{name}-key", name=f"alias/{cluster}-logs", target_key_id=self.key.key_id, opts=child(self))

        self.log_groups = {
            kind: aws.cloudwatch.LogGroup(
                f"{name}-{kind}", name=log_group_name(cluster, kind), retention_in_days=cfg.log_retention_days,
                kms_key_id=self.key.arn, tags=aws_tags(cfg, log_group_name(cluster, kind)),
                opts=stateful(self, cfg))
            for kind in LOG_GROUP_FORMATS
        }

        role = aws.iam.Role(f"{name}-agent-role", assume_role_policy=iam.pod_identity_trust(),
                            tags=aws_tags(cfg, f"{cluster}-cloudwatch-agent"), opts=child(self))
        policy = aws.iam.RolePolicyAttachment(f"{name}-agent-policy", role=role.name,
                                              policy_arn=iam.managed_policy(ADDON_POLICY), opts=child(self))
        self.addon = aws.eks.Addon(
            f"{name}-addon", cluster_name=args.eks_cluster_name, addon_name=ADDON, addon_version=ADDON_VERSION,
            configuration_values=json.dumps(ADDON_CONFIGURATION),
            pod_identity_associations=[{"role_arn": role.arn, "service_account": ADDON_SERVICE_ACCOUNT}],
            resolve_conflicts_on_create="OVERWRITE", resolve_conflicts_on_update="OVERWRITE",
            tags=aws_tags(cfg, ADDON),
            opts=child(self, depends_on=[policy, *self.log_groups.values(), *args.depends_on]))
        self.application_log_group = self.log_groups["application"].name
        self.register_outputs({"applicationLogGroup": self.application_log_group, "keyArn": self.key.arn})
