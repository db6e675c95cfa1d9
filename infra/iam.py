"""IAM helpers: trust policies and managed-policy ARNs, built once."""

from __future__ import annotations

import json
from functools import lru_cache

import pulumi
import pulumi_aws as aws


@lru_cache(maxsize=1)
def partition() -> str:
    """The AWS partition (aws, aws-cn, aws-us-gov) of the target account."""
    return aws.get_partition().partition


@lru_cache(maxsize=1)
def account_id() -> str:
    return aws.get_caller_identity().account_id


def eks_cluster_arn(region: str, cluster_name: str) -> str:
    """ARN of an EKS cluster of the target account: arn:<partition>:eks:<region>:<account>:cluster/<name>."""
    return f"arn:{partition()}:eks:{region}:{account_id()}:cluster/{cluster_name}"


def managed_policy(name: str) -> str:
    return f"arn:{partition()}:iam::aws:policy/{name}"


def service_trust(*services: str) -> str:
    return json.dumps({
        "Version": "2012-10-17",
        "Statement": [{"Effect": "Allow", "Principal": {"Service": list(services)}, "Action": "sts:AssumeRole"}],
    })


def pod_identity_trust() -> str:
    """Trust policy for EKS Pod Identity (no OIDC provider to manage)."""
    return json.dumps({
        "Version": "2012-10-17",
        "Statement": [{
            "Effect": "Allow",
            "Principal": {"Service": "pods.eks.amazonaws.com"},
            "Action": ["sts:AssumeRole", "sts:TagSession"],
        }],
    })


# Managed policies of a node role: the same four as Karpenter's reference KarpenterNodeRole
# (infra/reference/karpenter_v1.14_controller_policy.json, "node_role"). Used by the system
# node group's role (cluster.py) and the GPU nodes' role (gpu_pools.py).
NODE_ROLE_POLICIES = ("AmazonEKSWorkerNodePolicy", "AmazonEKS_CNI_Policy", "AmazonEC2ContainerRegistryPullOnly",
                      "AmazonSSMManagedInstanceCore")


def node_role(prefix: str, tags: dict[str, str], parent: pulumi.Resource,
              ) -> tuple[aws.iam.Role, list[aws.iam.RolePolicyAttachment]]:
    """An EC2 node role with NODE_ROLE_POLICIES attached.

    Children are named ``{prefix}-node-role`` and ``{prefix}-node-{policy}`` (names are part
    of the URNs: keep them, or existing roles are replaced).
    """
    role = aws.iam.Role(f"{prefix}-node-role", assume_role_policy=service_trust("ec2.amazonaws.com"), tags=tags,
                        opts=pulumi.ResourceOptions(parent=parent))
    attachments = [
        aws.iam.RolePolicyAttachment(f"{prefix}-node-{policy}", role=role.name, policy_arn=managed_policy(policy),
                                     opts=pulumi.ResourceOptions(parent=parent))
        for policy in NODE_ROLE_POLICIES
    ]
    return role, attachments
