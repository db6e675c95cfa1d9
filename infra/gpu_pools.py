"""GPU node pools: Karpenter (controller, IAM, interruption queue) and one
NodePool + EC2NodeClass per configured pool.

Pools scale from zero (Karpenter launches nodes only for pending pods), GPU nodes are
tainted ``nvidia.com/gpu=true:NoSchedule`` and labelled ``ragpool.io/pool``, and
consolidation only removes *empty* nodes: a running training pod is never moved
(training pods also carry ``karpenter.sh/do-not-disrupt``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_aws as aws
import pulumi_kubernetes as k8s

from infra.component import RagpoolComponent
from infra import iam
from infra.charts import KARPENTER
from contract.names import GPU_RESOURCE
from infra.common import GPU_TAINT, POOL_LABEL, PART_OF, aws_tags, child, deep_merge, load_values
from infra.config import StackConfig
from infra.config_gpu import GpuPoolConfig, node_termination_grace
from infra.efa import Efa

KARPENTER_NAMESPACE = "kube-system"
KARPENTER_SERVICE_ACCOUNT = "karpenter"
ARM64_FAMILIES = ("g5g", "p6e-gb200")
# EC2 events Karpenter reacts to ahead of time (spot notice, rebalance, health, state).
INTERRUPTION_EVENTS = {
    "health": {"source": ["aws.health"], "detail-type": ["AWS Health Event"]},
    "spot": {"source": ["aws.ec2"], "detail-type": ["EC2 Spot Instance Interruption Warning"]},
    "rebalance": {"source": ["aws.ec2"], "detail-type": ["EC2 Instance Rebalance Recommendation"]},
    "state": {"source": ["aws.ec2"], "detail-type": ["EC2 Instance State-change Notification"]},
}


@dataclass(frozen=True)
class GpuPoolsArgs:
    config: StackConfig
    cluster_name: pulumi.Input[str]
    cluster_security_group_id: pulumi.Input[str]
    k8s_provider: k8s.Provider
    depends_on: list[pulumi.Resource]
    efa: Efa | None = None
    """The EFA security group and placement groups (infra/efa.py); None: the stack has no EFA pool."""


def node_pool_spec(pool: GpuPoolConfig, node_class: str) -> dict[str, Any]:
    arches = sorted({"arm64" if t.split(".")[0] in ARM64_FAMILIES else "amd64" for t in pool.instance_types})
    return {
        "template": {
            "metadata": {"labels": {POOL_LABEL: pool.name, **PART_OF, **dict(pool.labels)}},
            "spec": {
                "nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": node_class},
                "taints": [dict(GPU_TAINT)],
                "requirements": [
                    {"key": "node.kubernetes.io/instance-type", "operator": "In", "values": list(pool.instance_types)},
                    {"key": "karpenter.sh/capacity-type", "operator": "In", "values": [pool.capacity_type]},
                    {"key": "topology.kubernetes.io/zone", "operator": "In", "values": list(pool.zones)},
                    {"key": "kubernetes.io/arch", "operator": "In", "values": arches},
                ],
                "expireAfter": pool.expire_after,
                # Bound how long a deleted node waits for do-not-disrupt pods: on spot the notice's 2 minutes, so
                # an interruption deletes the training pods at once (their SIGTERM), infra/config_gpu.py SPOT_GRACE_S.
                "terminationGracePeriod": node_termination_grace(pool),
            },
        },
        "limits": {GPU_RESOURCE: str(pool.gpu_limit)},
        "disruption": {
            # Only empty nodes are consolidated: a training pod is never evicted to save money.
            "consolidationPolicy": "WhenEmpty",
            "consolidateAfter": pool.consolidate_after,
            "budgets": [{"nodes": pool.disruption_budget}],
        },
        "weight": pool.weight,
    }


def node_class_spec(cfg: StackConfig, pool: GpuPoolConfig, cluster_name: str, role_name: str,
                    security_group_id: str, efa_security_group_id: str | None = None,
                    placement_group: str | None = None) -> dict[str, Any]:
    """The pool's EC2NodeClass. An EFA pool (infra/efa.py) also selects the EFA security group and its cluster
    placement group; its EFA interfaces are Karpenter's to attach (no ``networkInterfaces``: set, they would
    replace the per-instance-type count Karpenter attaches when a pod requests vpc.amazonaws.com/efa)."""
    spec = {
        "role": role_name,
        "amiSelectorTerms": [{"alias": cfg.gpu_ami_alias}],
        "subnetSelectorTerms": [{"tags": {"karpenter.sh/discovery": cluster_name}}],
        "securityGroupSelectorTerms": [{"id": security_group_id}],
        # IMDSv2 only, hop limit 1: containers on GPU nodes cannot reach instance credentials.
        "metadataOptions": {"httpEndpoint": "enabled", "httpProtocolIPv6": "disabled",
                            "httpPutResponseHopLimit": 1, "httpTokens": "required"},
        "blockDeviceMappings": [{
            "deviceName": "/dev/xvda",
            "ebs": {"volumeSize": f"{pool.disk_size_gib}Gi", "volumeType": "gp3", "encrypted": True,
                    "deleteOnTermination": True},
        }],
        "tags": aws_tags(cfg, f"{cluster_name}-{pool.name}", **{POOL_LABEL: pool.name}),
    }
    if efa_security_group_id:
        spec["securityGroupSelectorTerms"].append({"id": efa_security_group_id})
    if placement_group:
        spec["placementGroupSelector"] = {"name": placement_group}
    return spec


def controller_policy(cluster_name: str, region: str, node_role_arn: str, queue_arn: str) -> str:
    """Karpenter's controller policy, statement for statement the reference of the pinned
    version (infra/reference/karpenter_v1.14_controller_policy.json, checked by
    tests/infra/test_iam_reference.py) merged into one document; the deliberate
    deviations are listed in infra/reference/iam_deviations.yaml.
    """
    p, acct = iam.partition(), iam.account_id()
    ec2 = f"arn:{p}:ec2:{region}"
    instance_profiles = f"arn:{p}:iam::{acct}:instance-profile/*"
    cluster_tag = f"kubernetes.io/cluster/{cluster_name}"
    owned = {f"aws:ResourceTag/{cluster_tag}": "owned"}
    req_owned = {f"aws:RequestTag/{cluster_tag}": "owned", "aws:RequestTag/eks:eks-cluster-name": cluster_name}
    nodepool = {"aws:ResourceTag/karpenter.sh/nodepool": "*"}
    req_nodepool = {"aws:RequestTag/karpenter.sh/nodepool": "*"}
    launched = [f"{ec2}:*:{r}/*" for r in ("fleet", "instance", "volume", "network-interface", "launch-template",
                                             "spot-instances-request")]
    profile_owned = {f"aws:ResourceTag/{cluster_tag}": "owned", "aws:ResourceTag/topology.kubernetes.io/region": region}
    profile_req = {**req_owned, "aws:RequestTag/topology.kubernetes.io/region": region}
    return json.dumps({"Version": "2012-10-17", "Statement": [
        # NodeLifecyclePolicy
        {"Sid": "AllowScopedEC2InstanceAccessActions", "Effect": "Allow",
         "Resource": [f"{ec2}::image/*", f"{ec2}::snapshot/*", f"{ec2}:*:security-group/*", f"{ec2}:*:subnet/*",
                      f"{ec2}:*:capacity-reservation/*", f"{ec2}:*:placement-group/*"],
         "Action": ["ec2:RunInstances", "ec2:CreateFleet"]},
        {"Sid": "AllowScopedEC2LaunchTemplateAccessActions", "Effect": "Allow",
         "Resource": f"{ec2}:*:launch-template/*", "Action": ["ec2:RunInstances", "ec2:CreateFleet"],
         "Condition": {"StringEquals": owned, "StringLike": nodepool}},
        {"Sid": "AllowScopedEC2InstanceActionsWithTags", "Effect": "Allow", "Resource": launched,
         "Action": ["ec2:RunInstances", "ec2:CreateFleet", "ec2:CreateLaunchTemplate"],
         "Condition": {"StringEquals": req_owned, "StringLike": req_nodepool}},
        {"Sid": "AllowScopedResourceCreationTagging", "Effect": "Allow", "Resource": launched, "Action": "ec2:CreateTags",
         "Condition": {"StringEquals": {**req_owned,
                                        "ec2:CreateAction": ["RunInstances", "CreateFleet", "CreateLaunchTemplate"]},
                       "StringLike": req_nodepool}},
        {"Sid": "AllowScopedResourceTagging", "Effect": "Allow", "Resource": f"{ec2}:*:instance/*",
         "Action": "ec2:CreateTags",
         "Condition": {"StringEquals": owned, "StringLike": nodepool,
                       "StringEqualsIfExists": {"aws:RequestTag/eks:eks-cluster-name": cluster_name},
                       "ForAllValues:StringEquals": {"aws:TagKeys": ["eks:eks-cluster-name", "karpenter.sh/nodeclaim",
                                                                     "Name"]}}},
        {"Sid": "AllowScopedDeletion", "Effect": "Allow", "Resource": [f"{ec2}:*:instance/*", f"{ec2}:*:launch-template/*"],
         "Action": ["ec2:TerminateInstances", "ec2:DeleteLaunchTemplate"],
         "Condition": {"StringEquals": owned, "StringLike": nodepool}},
        # IAMIntegrationPolicy
        {"Sid": "AllowPassingInstanceRole", "Effect": "Allow", "Resource": node_role_arn, "Action": "iam:PassRole",
         "Condition": {"StringEquals": {"iam:PassedToService": ["ec2.amazonaws.com", "ec2.amazonaws.com.cn"]}}},
        # A new profile has no tags yet: creation is scoped by the tags in the request.
        {"Sid": "AllowScopedInstanceProfileCreationActions", "Effect": "Allow", "Resource": instance_profiles,
         "Action": ["iam:CreateInstanceProfile"],
         "Condition": {"StringEquals": profile_req,
                       "StringLike": {"aws:RequestTag/karpenter.k8s.aws/ec2nodeclass": "*"}}},
        {"Sid": "AllowScopedInstanceProfileTagActions", "Effect": "Allow", "Resource": instance_profiles,
         "Action": ["iam:TagInstanceProfile"],
         "Condition": {"StringEquals": {**profile_owned, **profile_req},
                       "StringLike": {"aws:ResourceTag/karpenter.k8s.aws/ec2nodeclass": "*",
                                      "aws:RequestTag/karpenter.k8s.aws/ec2nodeclass": "*"}}},
        {"Sid": "AllowScopedInstanceProfileActions", "Effect": "Allow", "Resource": instance_profiles,
         "Action": ["iam:AddRoleToInstanceProfile", "iam:RemoveRoleFromInstanceProfile", "iam:DeleteInstanceProfile"],
         "Condition": {"StringEquals": profile_owned,
                       "StringLike": {"aws:ResourceTag/karpenter.k8s.aws/ec2nodeclass": "*"}}},
        # EKSIntegrationPolicy
        {"Sid": "AllowAPIServerEndpointDiscovery", "Effect": "Allow",
         "Resource": iam.eks_cluster_arn(region, cluster_name), "Action": "eks:DescribeCluster"},
        # InterruptionPolicy
        {"Sid": "AllowInterruptionQueueActions", "Effect": "Allow", "Resource": queue_arn,
         "Action": ["sqs:DeleteMessage", "sqs:GetQueueUrl", "sqs:ReceiveMessage"]},
        # ResourceDiscoveryPolicy (ZonalShiftPolicy is left out: settings.enableZonalShift stays false)
        {"Sid": "AllowRegionalReadActions", "Effect": "Allow", "Resource": "*",
         "Action": ["ec2:DescribeCapacityReservations", "ec2:DescribeImages", "ec2:DescribeInstances",
                    "ec2:DescribeInstanceStatus", "ec2:DescribeInstanceTypeOfferings", "ec2:DescribeInstanceTypes",
                    "ec2:DescribeLaunchTemplates", "ec2:DescribePlacementGroups", "ec2:DescribeSecurityGroups",
                    "ec2:DescribeSpotPriceHistory", "ec2:DescribeSubnets"],
         "Condition": {"StringEquals": {"aws:RequestedRegion": region}}},
        {"Sid": "AllowSSMReadActions", "Effect": "Allow", "Resource": f"arn:{p}:ssm:{region}::parameter/aws/service/*",
         "Action": "ssm:GetParameter"},
        {"Sid": "AllowPricingReadActions", "Effect": "Allow", "Resource": "*", "Action": "pricing:GetProducts"},
        {"Sid": "AllowUnscopedInstanceProfileListAction", "Effect": "Allow", "Resource": "*",
         "Action": "iam:ListInstanceProfiles"},
        {"Sid": "AllowInstanceProfileReadActions", "Effect": "Allow", "Resource": instance_profiles,
         "Action": "iam:GetInstanceProfile"},
    ]})


class GpuPools(RagpoolComponent):
    def __init__(self, name: str, args: GpuPoolsArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("ragpool:infra:GpuPools", name, opts, k8s_provider=args.k8s_provider)
        name = self.child_prefix
        cfg = args.config

        # GPU nodes get their own role (the managed node group's role already has an access entry).
        node_role, _ = iam.node_role(name, aws_tags(cfg, f"{cfg.name_prefix}-gpu-node"), self)
        node_access = aws.eks.AccessEntry(f"{name}-node-access", cluster_name=args.cluster_name,
                                          principal_arn=node_role.arn, type="EC2_LINUX",
                                          tags=aws_tags(cfg, f"{cfg.name_prefix}-gpu-node"), opts=child(self))

        queue = aws.sqs.Queue(f"{name}-interruptions", message_retention_seconds=300, sqs_managed_sse_enabled=True,
                              tags=aws_tags(cfg, f"{cfg.name_prefix}-karpenter-interruptions"), opts=child(self))
        aws.sqs.QueuePolicy(f"{name}-interruptions", queue_url=queue.id, policy=queue.arn.apply(lambda arn: json.dumps({
            "Version": "2012-10-17",
            "Statement": [
                {"Sid": "EventBridgeWrite", "Effect": "Allow", "Action": "sqs:SendMessage", "Resource": arn,
                 "Principal": {"Service": ["events.amazonaws.com", "sqs.amazonaws.com"]}},
                {"Sid": "DenyHTTP", "Effect": "Deny", "Action": "sqs:*", "Resource": arn, "Principal": "*",
                 "Condition": {"Bool": {"aws:SecureTransport": "false"}}},
            ]})), opts=child(self))
        for event, pattern in INTERRUPTION_EVENTS.items():
            rule = aws.cloudwatch.EventRule(f"{name}-{event}", event_pattern=json.dumps(pattern),
                                            description=f"Karpenter interruption handling: {pattern['detail-type'][0]}",
                                            tags=aws_tags(cfg, f"{cfg.name_prefix}-karpenter-{event}"),
                                            opts=child(self))
            aws.cloudwatch.EventTarget(f"{name}-{event}", rule=rule.name, arn=queue.arn, opts=child(self))

        controller_role = aws.iam.Role(f"{name}-controller-role", assume_role_policy=iam.pod_identity_trust(),
                                       tags=aws_tags(cfg, f"{cfg.name_prefix}-karpenter"), opts=child(self))
        controller_policy_res = aws.iam.RolePolicy(
            f"{name}-controller-policy", role=controller_role.id,
            policy=pulumi.Output.all(args.cluster_name, node_role.arn, queue.arn).apply(
                lambda a: controller_policy(a[0], cfg.region, a[1], a[2])),
            opts=child(self))
        identity = aws.eks.PodIdentityAssociation(
            f"{name}-controller-identity", cluster_name=args.cluster_name, namespace=KARPENTER_NAMESPACE,
            service_account=KARPENTER_SERVICE_ACCOUNT, role_arn=controller_role.arn,
            tags=aws_tags(cfg, f"{cfg.name_prefix}-karpenter"), opts=child(self))

        values = pulumi.Output.all(args.cluster_name, queue.name).apply(lambda a: deep_merge(
            load_values("karpenter.yaml"), {"settings": {"clusterName": a[0], "interruptionQueue": a[1]}}))
        self.release = k8s.helm.v3.Release(
            f"{name}-karpenter", name="karpenter", chart=KARPENTER.chart_ref, version=KARPENTER.version,
            namespace=KARPENTER_NAMESPACE, values=values, atomic=True, cleanup_on_fail=True, timeout=600,
            opts=child(self, depends_on=[identity, controller_policy_res, node_access, *args.depends_on]))

        self.node_pools: dict[str, k8s.apiextensions.CustomResource] = {}
        for pool in cfg.gpu_pools:
            efa_group = args.efa.placement_groups.get(pool.name) if args.efa else None
            efa_inputs = [args.efa.security_group_id, efa_group] if efa_group is not None else []
            node_class = k8s.apiextensions.CustomResource(
                f"{name}-{pool.name}-class", api_version="karpenter.k8s.aws/v1", kind="EC2NodeClass",
                metadata={"name": pool.name, "labels": {POOL_LABEL: pool.name, **PART_OF}},
                spec=pulumi.Output.all(args.cluster_name, node_role.name, args.cluster_security_group_id,
                                       *efa_inputs).apply(
                    lambda a, pool=pool: node_class_spec(cfg, pool, a[0], a[1], a[2], *a[3:])),
                opts=child(self, depends_on=[self.release]))
            self.node_pools[pool.name] = k8s.apiextensions.CustomResource(
                f"{name}-{pool.name}", api_version="karpenter.sh/v1", kind="NodePool",
                metadata={"name": pool.name, "labels": {POOL_LABEL: pool.name, **PART_OF}},
                spec=node_pool_spec(pool, pool.name),
                opts=child(self, depends_on=[self.release, node_class]))

        self.node_role_arn = node_role.arn
        self.interruption_queue = queue.name
        self.register_outputs({"interruption_queue": queue.name, "node_pools": list(self.node_pools)})
