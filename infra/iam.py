"""IAM helpers: trust policies and managed-policy ARNs, built once."""

from __future__ import annotations

import json
from functools import lru_cache

import pulumi_aws as aws


@lru_cache(maxsize=1)
def partition() -> str:
    """The AWS partition (aws, aws-cn, aws-us-gov) of the target account."""
    return aws.get_partition().partition


@lru_cache(maxsize=1)
def account_id() -> str:
    return aws.get_caller_identity().account_id


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
