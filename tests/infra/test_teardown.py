"""`pulumi destroy` must not leave Karpenter GPU instances running (karpenter-provider-aws#4223).

Two guarantees: the dependency order makes Pulumi delete NodePools/EC2NodeClasses (so
Karpenter terminates its nodes) before Karpenter, its IAM and the cluster go; and
`ragpool leftovers` finds and terminates anything an interrupted destroy left behind.
"""

from __future__ import annotations

import argparse

import boto3
import pytest
from moto import mock_aws

from infra.leftovers import cmd_leftovers, find_leftovers, terminate
from infra.plan import run_program
from infra.stack import load_stack


@pytest.fixture(scope="module")
def recorded():
    return run_program(load_stack("dev"))


def _deps(recorded):
    """(type, name) -> names of the resources it depends on."""
    return {(r.type, r.name): {u.rsplit("::", 1)[-1] for u in r.dependencies} for r in recorded}


def test_node_pools_are_destroyed_before_karpenter_and_its_iam(recorded):
    deps = _deps(recorded)
    for (typ, name), d in deps.items():
        if typ in ("kubernetes:karpenter.sh/v1:NodePool", "kubernetes:karpenter.k8s.aws/v1:EC2NodeClass"):
            assert "gpu-karpenter" in d, f"{name} must depend on the Karpenter release"
    node_pool = deps[("kubernetes:karpenter.sh/v1:NodePool", "gpu-gpu-spot")]
    assert "gpu-gpu-spot-class" in node_pool  # NodePool goes before its EC2NodeClass
    release = deps[("kubernetes:helm.sh/v3:Release", "gpu-karpenter")]
    # Karpenter keeps its credentials, node access and system nodes until it is gone.
    assert {"gpu-controller-identity", "gpu-controller-policy", "gpu-node-access", "cluster-system"} <= release


def _launch(ec2, cluster, pool, count=1):
    ami = ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
    tags = [{"Key": f"kubernetes.io/cluster/{cluster}", "Value": "owned"}]
    if pool:
        tags.append({"Key": "karpenter.sh/nodepool", "Value": pool})
    res = ec2.run_instances(ImageId=ami, MinCount=count, MaxCount=count, InstanceType="g5.xlarge",
                            TagSpecifications=[{"ResourceType": "instance", "Tags": tags}])
    return [i["InstanceId"] for i in res["Instances"]]


@mock_aws
def test_leftovers_finds_only_this_clusters_karpenter_nodes_and_terminates_them():
    ec2 = boto3.client("ec2", region_name="us-west-2")
    ours = _launch(ec2, "ragpool-dev", "gpu-spot", count=2)
    _launch(ec2, "other-cluster", "gpu-spot")
    _launch(ec2, "ragpool-dev", None)  # a managed node group instance: not Karpenter's
    found = find_leftovers(ec2, "ragpool-dev")
    assert [i["id"] for i in found] == sorted(ours)
    assert {i["nodepool"] for i in found} == {"gpu-spot"}
    terminate(ec2, found)
    assert find_leftovers(ec2, "ragpool-dev") == []


@mock_aws
def test_leftovers_cli_exit_codes(capsys):
    ec2 = boto3.client("ec2", region_name="us-west-2")
    args = argparse.Namespace(cluster="ragpool-dev", region="us-west-2", terminate=False)
    assert cmd_leftovers(args) == 0
    _launch(ec2, "ragpool-dev", "gpu-spot")
    assert cmd_leftovers(args) == 1
    assert "--terminate" in capsys.readouterr().err
    assert cmd_leftovers(argparse.Namespace(**{**vars(args), "terminate": True})) == 0
    assert cmd_leftovers(args) == 0
