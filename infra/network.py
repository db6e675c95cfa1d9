"""Network: a VPC across the configured AZs with public and private subnets.

Private subnets (one large block per AZ, for VPC-CNI pod IPs) host every node; public
subnets only hold NAT gateways and internet-facing load balancers. Subnets carry the
EKS load-balancer role tags and the Karpenter discovery tag of the cluster.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

import pulumi
import pulumi_aws as aws

from infra.component import RagpoolComponent
from infra.common import aws_tags, child
from infra.config import NetworkConfig, StackConfig


@dataclass(frozen=True)
class NetworkArgs:
    config: StackConfig
    cluster_name: str


def carve_subnets(vpc_cidr: str, zones: int) -> tuple[list[str], list[str]]:
    """Private /19s (from a /16) in the first blocks and small public /22s from the last one.

    Deterministic, so re-running never moves a subnet.
    """
    vpc = ipaddress.ip_network(vpc_cidr)
    blocks = list(vpc.subnets(prefixlen_diff=3))  # 8 blocks
    private = [str(b) for b in blocks[:zones]]
    public = [str(b) for b in list(blocks[-1].subnets(prefixlen_diff=3))[:zones]]
    return private, public


class Network(RagpoolComponent):
    vpc_id: pulumi.Output[str]
    private_subnet_ids: list[pulumi.Output[str]]
    public_subnet_ids: list[pulumi.Output[str]]

    def __init__(self, name: str, args: NetworkArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("ragpool:infra:Network", name, opts)
        name = self.child_prefix
        cfg = args.config
        net: NetworkConfig = cfg.network
        zones = net.availability_zones
        private_cidrs, public_cidrs = carve_subnets(net.vpc_cidr, len(zones))
        discovery = {"karpenter.sh/discovery": args.cluster_name,
                     f"kubernetes.io/cluster/{args.cluster_name}": "shared"}

        vpc = aws.ec2.Vpc(f"{name}-vpc", cidr_block=net.vpc_cidr, enable_dns_hostnames=True,
                          enable_dns_support=True, tags=aws_tags(cfg, f"{cfg.name_prefix}-vpc"),
                          opts=child(self))
        igw = aws.ec2.InternetGateway(f"{name}-igw", vpc_id=vpc.id,
                                      tags=aws_tags(cfg, f"{cfg.name_prefix}-igw"), opts=child(self))
        public_rt = aws.ec2.RouteTable(f"{name}-public-rt", vpc_id=vpc.id,
                                       routes=[{"cidr_block": "0.0.0.0/0", "gateway_id": igw.id}],
                                       tags=aws_tags(cfg, f"{cfg.name_prefix}-public"), opts=child(self))

        public_subnets, private_subnets, nats, private_rts = [], [], [], []
        for i, zone in enumerate(zones):
            pub = aws.ec2.Subnet(
                f"{name}-public-{zone}", vpc_id=vpc.id, cidr_block=public_cidrs[i], availability_zone=zone,
                map_public_ip_on_launch=False,
                tags=aws_tags(cfg, f"{cfg.name_prefix}-public-{zone}", **{"kubernetes.io/role/elb": "1"}),
                opts=child(self))
            aws.ec2.RouteTableAssociation(f"{name}-public-{zone}", subnet_id=pub.id, route_table_id=public_rt.id,
                                          opts=child(self))
            public_subnets.append(pub)
            priv = aws.ec2.Subnet(
                f"{name}-private-{zone}", vpc_id=vpc.id, cidr_block=private_cidrs[i], availability_zone=zone,
                tags=aws_tags(cfg, f"{cfg.name_prefix}-private-{zone}",
                              **{"kubernetes.io/role/internal-elb": "1", **discovery}),
                opts=child(self))
            private_subnets.append(priv)

        # dev: one NAT in the first AZ; prod: one per AZ so an AZ outage cuts no other AZ off.
        nat_zones = zones if net.nat_gateways == "perAz" else zones[:1]
        for i, zone in enumerate(nat_zones):
            eip = aws.ec2.Eip(f"{name}-nat-{zone}", domain="vpc",
                              tags=aws_tags(cfg, f"{cfg.name_prefix}-nat-{zone}"), opts=child(self))
            nats.append(aws.ec2.NatGateway(
                f"{name}-nat-{zone}", allocation_id=eip.id, subnet_id=public_subnets[i].id,
                tags=aws_tags(cfg, f"{cfg.name_prefix}-nat-{zone}"),
                opts=child(self, depends_on=[igw])))
        for i, zone in enumerate(zones):
            nat = nats[i] if len(nats) > 1 else nats[0]
            rt = aws.ec2.RouteTable(f"{name}-private-rt-{zone}", vpc_id=vpc.id,
                                    routes=[{"cidr_block": "0.0.0.0/0", "nat_gateway_id": nat.id}],
                                    tags=aws_tags(cfg, f"{cfg.name_prefix}-private-{zone}"), opts=child(self))
            aws.ec2.RouteTableAssociation(f"{name}-private-{zone}", subnet_id=private_subnets[i].id,
                                          route_table_id=rt.id, opts=child(self))
            private_rts.append(rt)

        # S3 traffic (image layers, datasets) skips the NAT gateways: cheaper and faster.
        aws.ec2.VpcEndpoint(f"{name}-s3", vpc_id=vpc.id, service_name=f"com.amazonaws.{cfg.region}.s3",
                            vpc_endpoint_type="Gateway", route_table_ids=[rt.id for rt in private_rts],
                            tags=aws_tags(cfg, f"{cfg.name_prefix}-s3"), opts=child(self))

        self.vpc_id = vpc.id
        self.vpc_cidr = net.vpc_cidr
        self.private_subnet_ids = [s.id for s in private_subnets]
        self.public_subnet_ids = [s.id for s in public_subnets]
        self.register_outputs({"vpc_id": self.vpc_id, "private_subnet_ids": self.private_subnet_ids,
                               "public_subnet_ids": self.public_subnet_ids})
