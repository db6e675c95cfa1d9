"""What the IAM tests compare: ragpool's policies as the real program plans them (under
Pulumi mocks, see infra/plan.py) and the upstream reference facts in infra/reference/.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from infra.gpu_pools import KARPENTER_SERVICE_ACCOUNT
from infra.plan import MOCK_ACCOUNT, mock_outputs
from infra.stack import load_stack, validate_stack

REFERENCE_DIR = Path(__file__).resolve().parents[2] / "infra" / "reference"
KARPENTER_REFERENCE = "karpenter_v1.14_controller_policy"
EFS_REFERENCE = "efs_file_system_policy"
PARTITION = "aws"  # what the offline plan's mocks answer for aws.get_partition()


def reference(name: str) -> dict[str, Any]:
    return json.loads((REFERENCE_DIR / f"{name}.json").read_text())


def deviations() -> list[dict[str, Any]]:
    return yaml.safe_load((REFERENCE_DIR / "iam_deviations.yaml").read_text())["deviations"]


def substitute(value: Any, names: dict[str, str]) -> Any:
    """Fill the template placeholders (``${ClusterName}``...) of reference facts."""
    if isinstance(value, str):
        for placeholder, actual in names.items():
            value = value.replace("${" + placeholder + "}", actual)
        return value
    if isinstance(value, list):
        return [substitute(v, names) for v in value]
    if isinstance(value, dict):
        return {substitute(k, names): substitute(v, names) for k, v in value.items()}
    return value


@dataclass(frozen=True)
class PlannedIam:
    """The IAM facts of one stack's plan."""

    stack: str
    region: str
    cluster_name: str
    controller_policy: dict[str, Any]
    node_role_arn: str  # the role Karpenter's EC2NodeClasses launch GPU nodes with
    queue_arn: str
    efs_policy: dict[str, Any]
    file_system_arn: str
    node_classes: list[dict[str, Any]]  # EC2NodeClass objects
    karpenter_values: dict[str, Any]
    plan: dict[str, Any]

    def names(self) -> dict[str, str]:
        """Values for the reference templates' placeholders."""
        return {"ClusterName": self.cluster_name, "AWS::Partition": PARTITION, "AWS::Region": self.region,
                "AWS::AccountId": MOCK_ACCOUNT, "AWS::URLSuffix": "amazonaws.com",
                "KarpenterNodeRole.Arn": self.node_role_arn, "KarpenterInterruptionQueue.Arn": self.queue_arn,
                "FileSystemArn": self.file_system_arn}

    def resources(self, typ: str) -> list[dict[str, Any]]:
        return [r for r in self.plan["resources"] if r["type"] == typ]

    def outputs(self, resource: dict[str, Any]) -> dict[str, Any]:
        """The provider outputs the offline plan's mocks give this resource (arn, name...)."""
        return mock_outputs(resource["type"], resource["name"], resource["inputs"], self.region)


def _one(items: list[Any], what: str) -> Any:
    assert len(items) == 1, f"expected one {what}, found {len(items)}"
    return items[0]


def planned_iam(stack: str, plan: dict[str, Any]) -> PlannedIam:
    region = validate_stack(load_stack(stack)).region
    res = plan["resources"]

    def outputs(r: dict[str, Any]) -> dict[str, Any]:
        return mock_outputs(r["type"], r["name"], r["inputs"], region)

    roles = {outputs(r)["arn"]: r for r in res if r["type"] == "aws:iam/role:Role"}
    # Karpenter's controller role is the one its service account gets through Pod Identity.
    identity = _one([r for r in res if r["type"] == "aws:eks/podIdentityAssociation:PodIdentityAssociation"
                     and r["inputs"]["serviceAccount"] == KARPENTER_SERVICE_ACCOUNT], "Karpenter pod identity")
    role = roles[identity["inputs"]["roleArn"]]
    # A RolePolicy names its role by name or by id (the mocks' id is "<resource name>-id").
    role_refs = {outputs(role)["name"], f"{role['name']}-id"}
    controller_policy = _one([r for r in res if r["type"] == "aws:iam/rolePolicy:RolePolicy"
                              and r["inputs"]["role"] in role_refs], "controller inline policy")
    node_classes = [r["inputs"] for r in res if r["type"] == "kubernetes:karpenter.k8s.aws/v1:EC2NodeClass"]
    node_role_name = _one(sorted({nc["spec"]["role"] for nc in node_classes}), "EC2NodeClass role")
    node_role_arn = _one([arn for arn, r in roles.items() if outputs(r)["name"] == node_role_name], "node role")
    release = _one([r for r in res if r["type"] == "kubernetes:helm.sh/v3:Release"
                    and r["inputs"]["name"] == "karpenter"], "Karpenter release")
    values = release["inputs"]["values"]
    queue = _one([r for r in res if r["type"] == "aws:sqs/queue:Queue"
                  and outputs(r)["name"] == values["settings"]["interruptionQueue"]], "interruption queue")
    cluster = _one([r for r in res if r["type"] == "aws:eks/cluster:Cluster"], "EKS cluster")
    file_system = _one([r for r in res if r["type"] == "aws:efs/fileSystem:FileSystem"], "EFS file system")
    efs_policy = _one([r for r in res if r["type"] == "aws:efs/fileSystemPolicy:FileSystemPolicy"],
                      "EFS file system policy")
    return PlannedIam(stack=stack, region=region, cluster_name=cluster["inputs"]["name"],
                      controller_policy=json.loads(controller_policy["inputs"]["policy"]),
                      node_role_arn=node_role_arn, queue_arn=outputs(queue)["arn"],
                      efs_policy=json.loads(efs_policy["inputs"]["policy"]),
                      file_system_arn=outputs(file_system)["arn"], node_classes=node_classes,
                      karpenter_values=values, plan=plan)
