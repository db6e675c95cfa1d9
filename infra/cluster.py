"""Cluster: EKS control plane, KMS envelope encryption, access entries, managed add-ons
and a small on-demand system node group with node auto-repair.

Authentication is EKS access entries (API mode); workloads get AWS credentials from
EKS Pod Identity, so there is no OIDC provider to manage.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import pulumi
import pulumi_aws as aws
import pulumi_kubernetes as k8s

from infra.aliases import RagpoolComponent
from infra import iam
from infra.common import aws_tags, child, stateful
from infra.config import StackConfig

CONTROL_PLANE_LOGS = ("api", "audit", "authenticator", "controllerManager", "scheduler")
# Managed add-ons. Versions are left to EKS (the default for the cluster version),
# so a Kubernetes upgrade brings matching add-ons.
ADDONS = ("vpc-cni", "kube-proxy", "eks-pod-identity-agent", "coredns", "aws-efs-csi-driver",
          "aws-ebs-csi-driver", "eks-node-monitoring-agent")
# Add-ons whose pods need nodes to become healthy.
ADDONS_NEEDING_NODES = ("coredns", "aws-efs-csi-driver", "aws-ebs-csi-driver", "eks-node-monitoring-agent")
# CSI drivers get AWS credentials through Pod Identity: (service account, managed policy).
CSI_IDENTITIES = {
    "aws-efs-csi-driver": ("efs-csi-controller-sa", "service-role/AmazonEFSCSIDriverPolicy"),
    "aws-ebs-csi-driver": ("ebs-csi-controller-sa", "service-role/AmazonEBSCSIDriverPolicy"),
}
CLUSTER_ADMIN_POLICY = "AmazonEKSClusterAdminPolicy"


@dataclass(frozen=True)
class ClusterArgs:
    config: StackConfig
    cluster_name: str
    vpc_id: pulumi.Input[str]
    private_subnet_ids: list[pulumi.Input[str]]
    public_subnet_ids: list[pulumi.Input[str]]


def kubeconfig_for(cluster_name: str, endpoint: str, ca_data: str, region: str) -> str:
    """A kubeconfig that gets tokens from `aws eks get-token` (no static credentials)."""
    return json.dumps({
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": cluster_name, "cluster": {"server": endpoint, "certificate-authority-data": ca_data}}],
        "contexts": [{"name": cluster_name, "context": {"cluster": cluster_name, "user": cluster_name}}],
        "current-context": cluster_name,
        "users": [{"name": cluster_name, "user": {"exec": {
            "apiVersion": "client.authentication.k8s.io/v1beta1", "command": "aws",
            "args": ["eks", "get-token", "--cluster-name", cluster_name, "--region", region, "--output", "json"],
        }}}],
    })


class Cluster(RagpoolComponent):
    def __init__(self, name: str, args: ClusterArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("ragpool:infra:Cluster", name, opts)
        name = self.child_prefix
        cfg, cc = args.config, args.config.cluster

        self.secrets_key = aws.kms.Key(
            f"{name}-secrets-key", description=f"EKS secrets envelope encryption for {args.cluster_name}",
            enable_key_rotation=True, deletion_window_in_days=30,
            tags=aws_tags(cfg, f"{args.cluster_name}-secrets"), opts=stateful(self, cfg))
        aws.kms.Alias(f"{name}-secrets-key", name=f"alias/{args.cluster_name}-eks-secrets",
                      target_key_id=self.secrets_key.key_id, opts=child(self))

        cluster_role = aws.iam.Role(f"{name}-cluster-role", assume_role_policy=iam.service_trust("eks.amazonaws.com"),
                                    tags=aws_tags(cfg, f"{args.cluster_name}-cluster"), opts=child(self))
        cluster_policy = aws.iam.RolePolicyAttachment(
            f"{name}-cluster-policy", role=cluster_role.name,
            policy_arn=iam.managed_policy("AmazonEKSClusterPolicy"), opts=child(self))

        self.cluster = aws.eks.Cluster(
            f"{name}-eks",
            name=args.cluster_name,
            version=cc.kubernetes_version,
            role_arn=cluster_role.arn,
            vpc_config={
                "subnet_ids": list(args.private_subnet_ids),
                "endpoint_private_access": True,
                "endpoint_public_access": cc.endpoint_public_access,
                **({"public_access_cidrs": list(cc.public_access_cidrs)} if cc.endpoint_public_access else {}),
            },
            encryption_config={"provider": {"key_arn": self.secrets_key.arn}, "resources": ["secrets"]},
            enabled_cluster_log_types=list(CONTROL_PLANE_LOGS),
            access_config={"authentication_mode": "API", "bootstrap_cluster_creator_admin_permissions": False},
            # ragpool installs vpc-cni/kube-proxy/coredns as managed add-ons below.
            bootstrap_self_managed_addons=False,
            upgrade_policy={"support_type": "STANDARD"},
            deletion_protection=cfg.is_prod,
            tags=aws_tags(cfg, args.cluster_name),
            opts=child(self, depends_on=[cluster_policy]),
        )
        # EKS creates this security group and attaches it to every node; other
        # components admit traffic from it (EFS, Redis).
        self.cluster_security_group_id = self.cluster.vpc_config.cluster_security_group_id

        for i, arn in enumerate(cc.admin_role_arns):
            entry = aws.eks.AccessEntry(f"{name}-admin-{i}", cluster_name=self.cluster.name, principal_arn=arn,
                                        type="STANDARD", tags=aws_tags(cfg, f"{args.cluster_name}-admin-{i}"),
                                        opts=child(self))
            aws.eks.AccessPolicyAssociation(
                f"{name}-admin-{i}", cluster_name=self.cluster.name, principal_arn=arn,
                policy_arn=f"arn:{iam.partition()}:eks::aws:cluster-access-policy/{CLUSTER_ADMIN_POLICY}",
                access_scope={"type": "cluster"}, opts=child(self, depends_on=[entry]))

        # The system node group's role (Karpenter's GPU nodes have their own, gpu_pools.py).
        self.node_role, node_policies = iam.node_role(name, aws_tags(cfg, f"{args.cluster_name}-node"), self)

        base_addons = {}
        for addon in ADDONS:
            if addon in ADDONS_NEEDING_NODES:
                continue
            extra = {}
            if addon == "vpc-cni":
                # The training namespace relies on NetworkPolicies; VPC CNI enforces them.
                extra["configuration_values"] = json.dumps({"enableNetworkPolicy": "true"})
            base_addons[addon] = self._addon(name, cfg, addon, **extra)

        # IMDSv2 only; hop limit 2 so system controllers without host networking can
        # still read their region (GPU nodes use hop limit 1: training pods need no IMDS).
        launch_template = aws.ec2.LaunchTemplate(
            f"{name}-system-lt",
            metadata_options={"http_endpoint": "enabled", "http_tokens": "required",
                              "http_put_response_hop_limit": 2},
            block_device_mappings=[{"device_name": "/dev/xvda", "ebs": {
                "volume_size": 50, "volume_type": "gp3", "encrypted": "true", "delete_on_termination": "true"}}],
            tag_specifications=[{"resource_type": "instance", "tags": aws_tags(cfg, f"{args.cluster_name}-system")},
                                {"resource_type": "volume", "tags": aws_tags(cfg, f"{args.cluster_name}-system")}],
            tags=aws_tags(cfg, f"{args.cluster_name}-system"), opts=child(self))
        self.system_nodes = aws.eks.NodeGroup(
            f"{name}-system",
            cluster_name=self.cluster.name,
            node_group_name_prefix="system-",
            node_role_arn=self.node_role.arn,
            subnet_ids=list(args.private_subnet_ids),
            instance_types=list(cc.system_node_instance_types),
            capacity_type="ON_DEMAND",
            ami_type="AL2023_x86_64_STANDARD",
            scaling_config={"min_size": cc.system_node_min_count, "desired_size": cc.system_node_min_count,
                            "max_size": cc.system_node_max_count},
            update_config={"max_unavailable": 1},
            launch_template={"id": launch_template.id, "version": launch_template.latest_version.apply(str)},
            node_repair_config={"enabled": True},
            labels={"ragpool.io/pool": "system"},
            tags=aws_tags(cfg, f"{args.cluster_name}-system"),
            opts=child(self, depends_on=[*node_policies, *base_addons.values()],
                       ignore_changes=["scalingConfig.desiredSize"]),
        )

        for addon in ADDONS_NEEDING_NODES:
            extra = {}
            deps: list[pulumi.Resource] = [self.system_nodes]
            if addon in CSI_IDENTITIES:
                service_account, policy = CSI_IDENTITIES[addon]
                short = addon.removeprefix("aws-").removesuffix("-driver")
                role = aws.iam.Role(f"{name}-{short}-role", assume_role_policy=iam.pod_identity_trust(),
                                    tags=aws_tags(cfg, f"{args.cluster_name}-{short}"), opts=child(self))
                deps.append(aws.iam.RolePolicyAttachment(f"{name}-{short}-policy", role=role.name,
                                                         policy_arn=iam.managed_policy(policy), opts=child(self)))
                extra["pod_identity_associations"] = [{"role_arn": role.arn, "service_account": service_account}]
            self._addon(name, cfg, addon, deps=deps, **extra)

        self.kubeconfig = pulumi.Output.secret(pulumi.Output.all(
            self.cluster.name, self.cluster.endpoint, self.cluster.certificate_authority.data,
        ).apply(lambda a: kubeconfig_for(a[0], a[1], a[2], cfg.region)))
        self.provider = k8s.Provider(f"{name}-k8s", kubeconfig=self.kubeconfig,
                                     enable_server_side_apply=True, opts=child(self))
        self.name = self.cluster.name
        self.endpoint = self.cluster.endpoint
        self.register_outputs({"name": self.name, "endpoint": self.endpoint, "kubeconfig": self.kubeconfig})

    def _addon(self, name: str, cfg: StackConfig, addon: str, deps: list[pulumi.Resource] | None = None,
               **extra) -> aws.eks.Addon:
        return aws.eks.Addon(
            f"{name}-addon-{addon}", cluster_name=self.cluster.name, addon_name=addon,
            resolve_conflicts_on_create="OVERWRITE", resolve_conflicts_on_update="OVERWRITE",
            tags=aws_tags(cfg, addon), opts=child(self, depends_on=deps or []), **extra)
