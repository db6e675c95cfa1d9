"""``ragpool leftovers``: find (and optionally terminate) Karpenter GPU instances that
outlived their cluster.

`pulumi destroy` deletes the NodePools and EC2NodeClasses before the Karpenter release
(they depend on it), so Karpenter itself drains and terminates its nodes while it still
runs. If a destroy is interrupted, or the cluster is deleted out of band
(aws/karpenter-provider-aws#4223), instances can be left running with nobody to stop
them: this command finds them by the tags Karpenter puts on every instance it launches.

Exit codes: 0 nothing left (or all terminated), 1 leftovers found (without --terminate).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from contract import exit_codes

LIVE_STATES = ["pending", "running", "stopping", "stopped"]


def find_leftovers(ec2: Any, cluster_name: str) -> list[dict[str, str]]:
    """Instances Karpenter launched for ``cluster_name`` that are not terminated."""
    paginator = ec2.get_paginator("describe_instances")
    found = []
    for page in paginator.paginate(Filters=[
        {"Name": f"tag:kubernetes.io/cluster/{cluster_name}", "Values": ["owned"]},
        {"Name": "tag-key", "Values": ["karpenter.sh/nodepool"]},
        {"Name": "instance-state-name", "Values": LIVE_STATES},
    ]):
        for reservation in page["Reservations"]:
            for inst in reservation["Instances"]:
                tags = {t["Key"]: t["Value"] for t in inst.get("Tags", [])}
                found.append({"id": inst["InstanceId"], "type": inst["InstanceType"],
                              "state": inst["State"]["Name"], "nodepool": tags.get("karpenter.sh/nodepool", "")})
    return sorted(found, key=lambda i: i["id"])


def terminate(ec2: Any, instances: list[dict[str, str]]) -> None:
    if instances:
        ec2.terminate_instances(InstanceIds=[i["id"] for i in instances])


def cmd_leftovers(args: argparse.Namespace) -> int:
    import boto3

    ec2 = boto3.client("ec2", region_name=args.region)
    leftovers = find_leftovers(ec2, args.cluster)
    for inst in leftovers:
        print(f"{inst['id']}  {inst['type']:<16} {inst['state']:<10} nodepool={inst['nodepool']}")
    if not leftovers:
        print(f"no Karpenter instances left for cluster {args.cluster} in {args.region}")
        return 0
    if args.terminate:
        terminate(ec2, leftovers)
        print(f"terminated {len(leftovers)} instance(s)")
        return 0
    print(f"{len(leftovers)} instance(s) left; rerun with --terminate to stop paying for them", file=sys.stderr)
    return exit_codes.FAILED


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("leftovers", help="find/terminate Karpenter instances left after a destroy")
    p.add_argument("--cluster", required=True, help="EKS cluster name, e.g. ragpool-dev")
    p.add_argument("--region", required=True)
    p.add_argument("--terminate", action="store_true", help="terminate what is found")
    p.set_defaults(handler=cmd_leftovers)
