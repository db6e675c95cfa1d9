"""EFA (Elastic Fabric Adapter) for the GPU pools whose instance types have it: multi-node NCCL over
EFA instead of TCP over one VPC-CNI interface (round-4 audit, item 4).

Which side attaches what (aws/karpenter-provider-aws v1.14.1, infra/reference/efa_interfaces.yaml):
Karpenter attaches a node's EFA interfaces itself, one per network card, as many as the instance type has
(``MaximumEfaInterfaces``), when the pending pod's NodeClaim requests ``vpc.amazonaws.com/efa`` and the
EC2NodeClass sets no ``networkInterfaces`` (pkg/providers/amifamily/resolver.go efaCount,
pkg/providers/launchtemplate/launchtemplate.go generateNetworkInterfaces); the AWS EFA device plugin
(aws/eks-charts stable/aws-efa-k8s-device-plugin, :data:`infra.charts.EFA_DEVICE_PLUGIN`) then advertises
them to the kubelet. So ragpool:

- requests :data:`contract.names.EFA_RESOURCE` in every GPU worker Job and Ray worker group of an EFA pool
  (limits = requests, ``infra.efa_devices.pool_efa_devices`` of them; infra/worker_jobs.py,
  infra/ray_cluster.py), which is what makes Karpenter attach the interfaces; every kind of an EFA pool asks, so
  every node of the pool has them when a gang lands on it;
- installs the device plugin on the nodes of EFA pools only (``supportedInstanceLabels`` keyed by the pool
  label), tolerating the GPU taint;
- gives the pool's EC2NodeClass a security group that admits all traffic from and to itself (what EFA
  requires, the EC2 User Guide's EFA security group; the EKS cluster group the nodes also carry allows all egress
  but is EKS's to manage, so the self rules live in a group of ours) beside the cluster's, and a
  cluster placement group (``placementGroupSelector``, in the vendored v1.14.1 CRD);
- sets the libfabric environment of the worker (``infra.efa_devices.efa_env``); the training image carries AWS's
  EFA installer (libfabric, aws-ofi-nccl; training/Dockerfile).

A pool is an EFA pool when every instance type of it has EFA interfaces and a worker pod's GPUs get a
whole share of them on each (``efa * gpusPerWorker / gpus``): two 4-GPU workers on an 8-GPU node with one
EFA interface cannot both have one, so such a pool stays on TCP. A pool's pods request one count for every
instance type Karpenter may launch for them, so the types must agree on it: a p4d.24xlarge (4) and p5.48xlarge
(32) pool would have used 4 of a p5's 32 interfaces, and is refused (``infra.efa_devices.efa_pool_problems``,
key ``gpuPools[i].instanceTypes``; split it, as prod's ``gpu-ondemand`` and ``gpu-ondemand-p5``). Policy
``efa-pool-requests-devices`` (policy/efa.py) holds every GPU pod template of a plan to the share of every
instance type of its NodePool.
Pools without EFA are unchanged: a stack without an EFA pool declares nothing of this module.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_aws as aws
import pulumi_kubernetes as k8s

from contract.names import POOL_LABEL
from infra.charts import EFA_DEVICE_PLUGIN
from infra.common import aws_tags, child, deep_merge, load_values
from infra.component import RagpoolComponent
from infra.config import StackConfig
from infra.efa_devices import efa_pools

DEVICE_PLUGIN_VALUES = "aws-efa-k8s-device-plugin.yaml"
DEVICE_PLUGIN_NAMESPACE = "kube-system"


def device_plugin_values(base: dict[str, Any], pools: list[str]) -> dict[str, Any]:
    """The chart's values: ``base`` (infra/values/aws-efa-k8s-device-plugin.yaml) on the EFA pools' nodes only.
    The chart's DaemonSet affinity is one ``In`` term per ``supportedInstanceLabels.keys`` entry over
    ``supportedInstanceLabels.values`` (templates/daemonset.yaml): keyed by the pool label, it selects exactly
    the nodes of those pools."""
    return deep_merge(base, {"supportedInstanceLabels": {"keys": [POOL_LABEL], "values": sorted(pools)}})


def self_rule_args(security_group_id: pulumi.Input[str]) -> dict[str, Any]:
    """An ingress or egress rule of all traffic between members of the group (what EFA requires)."""
    return {"security_group_id": security_group_id, "referenced_security_group_id": security_group_id,
            "ip_protocol": "-1"}


@dataclass(frozen=True)
class EfaArgs:
    config: StackConfig
    vpc_id: pulumi.Input[str]
    k8s_provider: k8s.Provider
    depends_on: list[pulumi.Resource]


class Efa(RagpoolComponent):
    """What the EFA pools need outside their pods: the security group and placement groups their
    EC2NodeClasses select (infra/gpu_pools.py), and the device plugin on their nodes."""

    def __init__(self, name: str, args: EfaArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("ragpool:infra:Efa", name, opts, k8s_provider=args.k8s_provider)
        name = self.child_prefix
        cfg = args.config
        pools = efa_pools(cfg)

        sg_name = f"{cfg.name_prefix}-efa"
        self.security_group = aws.ec2.SecurityGroup(
            f"{name}-sg", vpc_id=args.vpc_id, description="EFA: all traffic between the GPU nodes of EFA pools",
            tags=aws_tags(cfg, sg_name), opts=child(self))
        rules = self_rule_args(self.security_group.id)
        aws.vpc.SecurityGroupIngressRule(f"{name}-sg-in", description="EFA: all traffic from the group itself",
                                         tags=aws_tags(cfg, f"{sg_name}-in"), **rules, opts=child(self))
        aws.vpc.SecurityGroupEgressRule(f"{name}-sg-out", description="EFA: all traffic to the group itself",
                                        tags=aws_tags(cfg, f"{sg_name}-out"), **rules, opts=child(self))

        # One cluster placement group per pool (an EC2NodeClass selects exactly one).
        self.placement_groups: dict[str, pulumi.Output[str]] = {}
        for pool in pools:
            group = aws.ec2.PlacementGroup(
                f"{name}-{pool.name}-pg", name=f"{cfg.name_prefix}-{pool.name}", strategy="cluster",
                tags=aws_tags(cfg, f"{cfg.name_prefix}-{pool.name}"), opts=child(self))
            self.placement_groups[pool.name] = group.name

        self.device_plugin = k8s.helm.v3.Release(
            f"{name}-device-plugin", name="aws-efa-k8s-device-plugin", namespace=DEVICE_PLUGIN_NAMESPACE,
            values=device_plugin_values(load_values(DEVICE_PLUGIN_VALUES), [p.name for p in pools]),
            atomic=True, cleanup_on_fail=True, **EFA_DEVICE_PLUGIN.release_args(),
            opts=child(self, depends_on=args.depends_on))
        self.security_group_id = self.security_group.id
        self.register_outputs({"securityGroupId": self.security_group.id, "pools": [p.name for p in pools]})
