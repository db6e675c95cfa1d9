"""The VPC reaches S3 through its gateway endpoint, not the NAT: the endpoint is on every private route table
(the nodes' and pods' subnets), so S3's prefix-list route, more specific than the NAT's 0.0.0.0/0, carries
image layers, dataset imports and exports."""

from __future__ import annotations

import pytest

from infra.stack import load_stack
from tests.conftest import STACKS


@pytest.mark.parametrize("stack", STACKS)
def test_the_s3_gateway_endpoint_is_on_every_private_route_table(committed_plans, stack):
    plan = committed_plans[stack]
    resources = plan["resources"]
    subnets = [r for r in resources if r["type"] == "aws:ec2/subnet:Subnet" and "-private-" in r["name"]]
    associations = {r["inputs"]["subnetId"]: r["inputs"]["routeTableId"] for r in resources
                    if r["type"] == "aws:ec2/routeTableAssociation:RouteTableAssociation"}
    private_tables = {associations[f"{s['name']}-id"] for s in subnets}
    assert len(private_tables) == len(subnets) >= 2
    [endpoint] = [r["inputs"] for r in resources if r["type"] == "aws:ec2/vpcEndpoint:VpcEndpoint"
                  and r["inputs"]["serviceName"].endswith(".s3")]
    assert endpoint["vpcEndpointType"] == "Gateway"
    assert endpoint["serviceName"] == f"com.amazonaws.{load_stack(stack).region}.s3"
    assert set(endpoint["routeTableIds"]) == private_tables
    for table in (r for r in resources if r["type"] == "aws:ec2/routeTable:RouteTable" and f"{r['name']}-id" in private_tables):
        assert [route.get("natGatewayId", "").startswith("network-nat-") for route in table["inputs"]["routes"]] == [True]

