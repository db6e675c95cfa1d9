"""The AWS calls that matter, evaluated against the policies the real program plans.

Karpenter's calls and their tags follow its source at the pinned release (aws/karpenter-
provider-aws v1.14.1, commit bde00654cd316fddb3dccfba3f5ac07039865429):
- pkg/apis/v1/ec2nodeclass.go InstanceProfileTags: an instance profile is created with the
  EC2NodeClass's spec.tags plus kubernetes.io/cluster/<cluster>=owned,
  eks:eks-cluster-name, karpenter.k8s.aws/ec2nodeclass and topology.kubernetes.io/region;
- pkg/utils/utils.go GetTags: fleets, instances, volumes, network interfaces and launch
  templates are tagged with spec.tags plus kubernetes.io/cluster/<cluster>=owned,
  karpenter.sh/nodepool, eks:eks-cluster-name and karpenter.k8s.aws/ec2nodeclass;
- pkg/controllers/nodeclaim/tagging/controller.go: after launch an instance gets Name,
  karpenter.sh/nodeclaim and eks:eks-cluster-name.
EC2 authorizes a launch per resource (the launch template with its resource tags; the new
instance, volumes... with the request's tags; CreateTags with ec2:CreateAction), as in
the "IfExists" RunInstances example of the IAM User Guide.

The EFS CSI driver mounts anonymously through a mount target with TLS
(infra/reference/efs_file_system_policy.json, "client").
"""

from __future__ import annotations

import pytest

from infra.plan import MOCK_ACCOUNT
from tests.conftest import STACKS
from tests.infra.iam_eval import ALLOW, DENY, IMPLICIT_DENY, Request, evaluate
from tests.infra.iam_facts import EFS_REFERENCE, PlannedIam, planned_iam, reference

OTHER_CLUSTER = "someone-elses-cluster"


@pytest.fixture(scope="module", params=STACKS)
def iam(request, committed_plans) -> PlannedIam:
    return planned_iam(request.param, committed_plans[request.param])


def request_tags(tags: dict[str, str]) -> dict[str, object]:
    return {**{f"aws:RequestTag/{k}": v for k, v in tags.items()}, "aws:TagKeys": list(tags)}


def resource_tags(tags: dict[str, str]) -> dict[str, str]:
    return {f"aws:ResourceTag/{k}": v for k, v in tags.items()}


def node_class(iam: PlannedIam) -> dict:
    return iam.node_classes[0]


def profile_tags(iam: PlannedIam, cluster: str | None = None) -> dict[str, str]:
    cluster = cluster or iam.cluster_name
    nc = node_class(iam)
    return {**nc["spec"]["tags"], f"kubernetes.io/cluster/{cluster}": "owned", "eks:eks-cluster-name": cluster,
            "karpenter.k8s.aws/ec2nodeclass": nc["metadata"]["name"], "topology.kubernetes.io/region": iam.region}


def launch_tags(iam: PlannedIam, cluster: str | None = None) -> dict[str, str]:
    cluster = cluster or iam.cluster_name
    nc = node_class(iam)
    return {**nc["spec"]["tags"], f"kubernetes.io/cluster/{cluster}": "owned",
            "karpenter.sh/nodepool": nc["metadata"]["name"], "eks:eks-cluster-name": cluster,
            "karpenter.k8s.aws/ec2nodeclass": nc["metadata"]["name"]}


def controller(iam: PlannedIam, action: str, resource: str, context: dict | None = None) -> str:
    ctx = {"aws:RequestedRegion": iam.region, "aws:SecureTransport": "true", **(context or {})}
    return evaluate([iam.controller_policy], Request(action, resource, ctx))


def profile_arn(name: str = "ragpool_123") -> str:
    return f"arn:aws:iam::{MOCK_ACCOUNT}:instance-profile/{name}"


def ec2_arn(iam: PlannedIam, kind: str, ident: str, account: str = MOCK_ACCOUNT) -> str:
    return f"arn:aws:ec2:{iam.region}:{account}:{kind}/{ident}"


# ------------------------------------------------------------------ instance profiles


def test_karpenter_creates_the_instance_profile_from_request_tags(iam):
    # A profile that does not exist yet has no resource tags: only the request's tags count.
    assert controller(iam, "iam:CreateInstanceProfile", profile_arn(), request_tags(profile_tags(iam))) == ALLOW
    assert controller(iam, "iam:CreateInstanceProfile", profile_arn(),
                      request_tags(profile_tags(iam, OTHER_CLUSTER))) == IMPLICIT_DENY


def test_karpenter_tags_its_instance_profile(iam):
    tags = profile_tags(iam)
    ctx = {**resource_tags(tags), **request_tags(tags)}
    assert controller(iam, "iam:TagInstanceProfile", profile_arn(), ctx) == ALLOW
    # Re-tagging a profile it does not own, or handing its own to another cluster, is refused.
    foreign = {**resource_tags(profile_tags(iam, OTHER_CLUSTER)), **request_tags(tags)}
    assert controller(iam, "iam:TagInstanceProfile", profile_arn(), foreign) == IMPLICIT_DENY
    give_away = {**resource_tags(tags), **request_tags(profile_tags(iam, OTHER_CLUSTER))}
    assert controller(iam, "iam:TagInstanceProfile", profile_arn(), give_away) == IMPLICIT_DENY


@pytest.mark.parametrize("action", ["iam:AddRoleToInstanceProfile", "iam:RemoveRoleFromInstanceProfile",
                                    "iam:DeleteInstanceProfile", "iam:GetInstanceProfile"])
def test_karpenter_manages_its_own_instance_profile(iam, action):
    assert controller(iam, action, profile_arn(), resource_tags(profile_tags(iam))) == ALLOW


def test_karpenter_cannot_touch_another_clusters_instance_profile(iam):
    other = resource_tags(profile_tags(iam, OTHER_CLUSTER))
    for action in ("iam:AddRoleToInstanceProfile", "iam:RemoveRoleFromInstanceProfile", "iam:DeleteInstanceProfile"):
        assert controller(iam, action, profile_arn(), other) == IMPLICIT_DENY


def test_karpenter_passes_only_the_node_role_and_only_to_ec2(iam):
    to_ec2 = {"iam:PassedToService": "ec2.amazonaws.com"}
    assert controller(iam, "iam:PassRole", iam.node_role_arn, to_ec2) == ALLOW
    assert controller(iam, "iam:PassRole", iam.node_role_arn, {"iam:PassedToService": "lambda.amazonaws.com"}) \
        == IMPLICIT_DENY
    admin = f"arn:aws:iam::{MOCK_ACCOUNT}:role/cluster-admin"
    assert controller(iam, "iam:PassRole", admin, to_ec2) == IMPLICIT_DENY


# ------------------------------------------------------------------ launching


@pytest.mark.parametrize("action", ["ec2:CreateFleet", "ec2:RunInstances"])
def test_karpenter_launches_from_its_launch_template(iam, action):
    tags = launch_tags(iam)
    template = ec2_arn(iam, "launch-template", "lt-0123")
    assert controller(iam, action, template, resource_tags(tags)) == ALLOW
    created = ["instance/*", "volume/*", "network-interface/*", "spot-instances-request/*"]
    if action == "ec2:CreateFleet":
        created.append("fleet/*")
    for kind_ident in created:
        kind, ident = kind_ident.split("/")
        resource = ec2_arn(iam, kind, ident)
        assert controller(iam, action, resource, request_tags(tags)) == ALLOW, resource
        tagging = {**request_tags(tags), "ec2:CreateAction": action.split(":")[1]}
        assert controller(iam, "ec2:CreateTags", resource, tagging) == ALLOW, resource
    for used in (ec2_arn(iam, "subnet", "subnet-1"), ec2_arn(iam, "security-group", "sg-1"),
                 f"arn:aws:ec2:{iam.region}::image/ami-1", f"arn:aws:ec2:{iam.region}::snapshot/snap-1"):
        assert controller(iam, action, used) == ALLOW, used


def test_karpenter_creates_its_launch_templates(iam):
    tags = launch_tags(iam)
    template = ec2_arn(iam, "launch-template", "*")
    assert controller(iam, "ec2:CreateLaunchTemplate", template, request_tags(tags)) == ALLOW
    assert controller(iam, "ec2:CreateTags", template,
                      {**request_tags(tags), "ec2:CreateAction": "CreateLaunchTemplate"}) == ALLOW


def test_karpenter_cannot_launch_for_another_cluster(iam):
    foreign = launch_tags(iam, OTHER_CLUSTER)
    assert controller(iam, "ec2:CreateFleet", ec2_arn(iam, "instance", "*"), request_tags(foreign)) == IMPLICIT_DENY
    assert controller(iam, "ec2:CreateFleet", ec2_arn(iam, "launch-template", "lt-9"),
                      resource_tags(foreign)) == IMPLICIT_DENY
    # Tags on their own (not while creating) cannot be added through the creation statement.
    assert controller(iam, "ec2:CreateTags", ec2_arn(iam, "volume", "vol-1"), request_tags(launch_tags(iam))) \
        == IMPLICIT_DENY


def test_karpenter_names_its_instance_after_launch(iam):
    instance = ec2_arn(iam, "instance", "i-0abc")
    owned = resource_tags(launch_tags(iam))
    naming = {"Name": "ip-10-0-1-2.ec2.internal", "karpenter.sh/nodeclaim": "gpu-spot-abcde",
              "eks:eks-cluster-name": iam.cluster_name}
    assert controller(iam, "ec2:CreateTags", instance, {**owned, **request_tags(naming)}) == ALLOW
    # The cluster-name tag may only name this cluster (reference: StringEqualsIfExists).
    wrong = {**naming, "eks:eks-cluster-name": OTHER_CLUSTER}
    assert controller(iam, "ec2:CreateTags", instance, {**owned, **request_tags(wrong)}) == IMPLICIT_DENY
    # Only those three keys: re-pointing an instance at another nodepool is refused.
    assert controller(iam, "ec2:CreateTags", instance,
                      {**owned, **request_tags({"karpenter.sh/nodepool": "other"})}) == IMPLICIT_DENY


# ------------------------------------------------------------------ terminating and discovering


def test_karpenter_terminates_its_own_instance(iam):
    instance = ec2_arn(iam, "instance", "i-0abc")
    assert controller(iam, "ec2:TerminateInstances", instance, resource_tags(launch_tags(iam))) == ALLOW


def test_karpenter_cannot_terminate_another_clusters_instance(iam):
    instance = ec2_arn(iam, "instance", "i-0def")
    assert controller(iam, "ec2:TerminateInstances", instance,
                      resource_tags(launch_tags(iam, OTHER_CLUSTER))) == IMPLICIT_DENY
    # Nor this cluster's managed node group instances (no karpenter.sh/nodepool tag).
    system = {f"kubernetes.io/cluster/{iam.cluster_name}": "owned", "eks:eks-cluster-name": iam.cluster_name}
    assert controller(iam, "ec2:TerminateInstances", instance, resource_tags(system)) == IMPLICIT_DENY


@pytest.mark.parametrize("action", ["ec2:DescribeInstanceStatus", "ec2:DescribePlacementGroups",
                                    "ec2:DescribeInstanceTypes", "ec2:DescribeSubnets"])
def test_karpenter_discovers_in_its_region_only(iam, action):
    # DescribeInstanceStatus feeds Karpenter's instance-status health controller.
    assert controller(iam, action, "*") == ALLOW
    assert controller(iam, action, "*", {"aws:RequestedRegion": "ap-southeast-7"}) == IMPLICIT_DENY


def test_karpenter_reads_its_interruption_queue_and_cluster(iam):
    for action in ("sqs:ReceiveMessage", "sqs:DeleteMessage", "sqs:GetQueueUrl"):
        assert controller(iam, action, iam.queue_arn) == ALLOW
    assert controller(iam, "sqs:ReceiveMessage", iam.queue_arn.rsplit(":", 1)[0] + ":other-queue") == IMPLICIT_DENY
    cluster = f"arn:aws:eks:{iam.region}:{MOCK_ACCOUNT}:cluster/{iam.cluster_name}"
    assert controller(iam, "eks:DescribeCluster", cluster) == ALLOW


# ------------------------------------------------------------------ EFS CSI driver mounting


def efs(iam: PlannedIam, action: str, tls: bool, via_mount_target: bool) -> str:
    ctx = {"aws:SecureTransport": str(tls).lower(),
           "elasticfilesystem:AccessedViaMountTarget": str(via_mount_target).lower()}
    return evaluate([iam.efs_policy], Request(action, iam.file_system_arn, ctx))


def test_csi_driver_mounts_anonymously_through_a_mount_target_with_tls(iam):
    client = reference(EFS_REFERENCE)["client"]
    assert client["anonymous_mount_context"] == {"aws:SecureTransport": "true",
                                                 "elasticfilesystem:AccessedViaMountTarget": "true"}
    for action in client["actions"]:
        assert efs(iam, action, tls=True, via_mount_target=True) == ALLOW, action


def test_mount_without_tls_is_denied(iam):
    for action in ("elasticfilesystem:ClientMount", "elasticfilesystem:ClientWrite"):
        assert efs(iam, action, tls=False, via_mount_target=True) == DENY


def test_mount_not_through_a_mount_target_is_refused(iam):
    assert efs(iam, "elasticfilesystem:ClientMount", tls=True, via_mount_target=False) == IMPLICIT_DENY


def test_root_access_is_not_granted(iam):
    assert efs(iam, "elasticfilesystem:ClientRootAccess", tls=True, via_mount_target=True) == IMPLICIT_DENY
