"""The policies that guard a real `pulumi up`: EFS mounts, cluster access, provider ordering, GPU node agents.

Each passes on the committed stacks and fails on the defect it guards against, reproduced as
the program declared it before issue 12 (deny-only EFS policy, no admin access entry, a
provider without the association dependency, the monitoring add-on without configuration).
"""

from __future__ import annotations

import json

import pytest

from policy.checks import MANDATORY, RULES_BY_NAME, efs_policy_allows
from policy.offline import Violation, evaluate
from tests.conftest import STACKS
from tests.policy.conftest import find, find_all

pytestmark = pytest.mark.infra

EFS_POLICY = "aws:efs/fileSystemPolicy:FileSystemPolicy"
ASSOCIATION = "aws:eks/accessPolicyAssociation:AccessPolicyAssociation"
ENTRY = "aws:eks/accessEntry:AccessEntry"
EKS = "aws:eks/cluster:Cluster"
PROVIDER = "pulumi:providers:kubernetes"
ADDON = "aws:eks/addon:Addon"
NODEPOOL = "kubernetes:karpenter.sh/v1:NodePool"
STORAGE_CLASS = "kubernetes:storage.k8s.io/v1:StorageClass"
NEW_POLICIES = ("efs-policy-allows-cluster-mounts", "eks-api-mode-has-admin", "k8s-provider-waits-for-access",
                "node-monitoring-agent-tolerates-gpu")
FS_ARN = "arn:aws:elasticfilesystem:us-west-2:111122223333:file-system/fs-0123456789abcdef0"
TLS_DENY = {"Sid": "DenyUnencryptedTransport", "Effect": "Deny", "Principal": {"AWS": "*"}, "Action": "*",
            "Resource": FS_ARN, "Condition": {"Bool": {"aws:SecureTransport": "false"}}}
MOUNT_ALLOW = {"Effect": "Allow", "Principal": {"AWS": "*"},
               "Action": ["elasticfilesystem:ClientMount", "elasticfilesystem:ClientWrite"], "Resource": FS_ARN,
               "Condition": {"Bool": {"elasticfilesystem:AccessedViaMountTarget": "true"}}}


def run(doc: dict, policy: str) -> list[Violation]:
    return evaluate(doc, None, rules=[RULES_BY_NAME[policy]])


def monitoring_addon(doc: dict) -> dict:
    return next(a for a in find_all(doc, ADDON) if a["inputs"]["addonName"] == "eks-node-monitoring-agent")


@pytest.mark.parametrize("stack", STACKS)
@pytest.mark.parametrize("policy", NEW_POLICIES)
def test_new_policies_are_mandatory_and_pass_on_committed_stacks(committed_plans, stack, policy):
    assert RULES_BY_NAME[policy].enforcement == MANDATORY
    assert run(committed_plans[stack], policy) == []


# ------------------------------------------------------------------ EFS


@pytest.mark.parametrize(("statements", "allowed"), [
    ([TLS_DENY], False),                                   # the pre-issue-12 policy: mounts refused
    ([TLS_DENY, MOUNT_ALLOW], True),                       # the fix
    ([MOUNT_ALLOW], True),
    ([{**MOUNT_ALLOW, "Action": "elasticfilesystem:Client*"}], True),
    ([{**MOUNT_ALLOW, "Action": "elasticfilesystem:ClientRootAccess"}], False),
    ([{**MOUNT_ALLOW, "Condition": {"Bool": {"elasticfilesystem:AccessedViaMountTarget": "false"}}}], False),
    ([{**MOUNT_ALLOW, "Principal": {"AWS": "arn:aws:iam::111122223333:role/efs-csi"}}], False),  # not anonymous
    ([MOUNT_ALLOW, {**TLS_DENY, "Condition": {}}], False),  # an unconditional Deny wins
    ([MOUNT_ALLOW, {**TLS_DENY, "Action": "elasticfilesystem:ClientWrite", "Condition": None}], False),
    ([MOUNT_ALLOW, {**TLS_DENY, "Action": "elasticfilesystem:ClientMount", "Condition": None}], True),
    ([MOUNT_ALLOW, {**TLS_DENY, "NotAction": "elasticfilesystem:ClientMount", "Action": None, "Condition": None}],
     False),
    ([MOUNT_ALLOW, {**TLS_DENY, "NotAction": "elasticfilesystem:Client*", "Action": None, "Condition": None}], True),
    ([{**MOUNT_ALLOW, "Condition": {"NumericLessThan": {"x": "1"}}}], False),  # unknown operator: no Allow
])
def test_efs_evaluator_anonymous_mount_over_tls(statements, allowed):
    statements = [{k: v for k, v in st.items() if v is not None} for st in statements]
    policy = {"Version": "2012-10-17", "Statement": statements}
    assert efs_policy_allows(policy, "elasticfilesystem:ClientWrite", anonymous=True) is allowed


def test_efs_evaluator_without_tls_is_denied_by_the_tls_statement():
    policy = {"Statement": [TLS_DENY, MOUNT_ALLOW]}
    context = {"aws:securetransport": "false", "elasticfilesystem:accessedviamounttarget": "true"}
    assert not efs_policy_allows(policy, "elasticfilesystem:ClientMount", anonymous=True, context=context)


def test_efs_named_principal_counts_for_iam_mounts_only():
    policy = {"Statement": [TLS_DENY, {**MOUNT_ALLOW, "Principal": {"AWS": "arn:aws:iam::111122223333:role/x"}}]}
    assert efs_policy_allows(policy, "elasticfilesystem:ClientMount", anonymous=False)
    assert not efs_policy_allows(policy, "elasticfilesystem:ClientMount", anonymous=True)


@pytest.mark.parametrize("stack", STACKS)
def test_deny_only_efs_policy_fails(plan_of, stack):
    doc = plan_of(stack)
    fs_policy = find(doc, EFS_POLICY)
    fs_policy["inputs"]["policy"] = json.dumps({"Version": "2012-10-17", "Statement": [TLS_DENY]})
    [v] = run(doc, "efs-policy-allows-cluster-mounts")
    assert v.resource_name == fs_policy["name"]
    assert "ClientMount, elasticfilesystem:ClientWrite" in v.message and "anonymous NFS clients" in v.message


def test_iam_mounts_need_a_principal_not_anonymous_access(plan_of):
    doc = plan_of("dev")
    fs_policy = find(doc, EFS_POLICY)
    fs_policy["inputs"]["policy"] = json.dumps({"Statement": [
        TLS_DENY, {**MOUNT_ALLOW, "Principal": {"AWS": "arn:aws:iam::111122223333:role/efs-csi-node"}}]})
    assert len(run(doc, "efs-policy-allows-cluster-mounts")) == 1  # the driver mounts anonymously
    for sc in find_all(doc, STORAGE_CLASS):
        if sc["inputs"].get("provisioner") == "efs.csi.aws.com":
            sc["inputs"]["mountOptions"] = ["tls", "iam"]
    assert run(doc, "efs-policy-allows-cluster-mounts") == []


def test_no_file_system_policy_means_the_efs_default_allow(plan_of):
    doc = plan_of("dev")
    doc["resources"] = [e for e in doc["resources"] if e["type"] != EFS_POLICY]
    assert run(doc, "efs-policy-allows-cluster-mounts") == []


# ------------------------------------------------------------------ cluster access


@pytest.mark.parametrize("stack", STACKS)
def test_api_cluster_without_admin_association_fails(plan_of, stack):
    """The pre-issue-12 stacks: no adminRoleArns, so no access entry at all."""
    doc = plan_of(stack)
    doc["resources"] = [e for e in doc["resources"] if e["type"] not in (ASSOCIATION, ENTRY)
                        or e["inputs"]["principalArn"].endswith(":role/gpu-node-role")]
    [v] = run(doc, "eks-api-mode-has-admin")
    assert v.resource_type == EKS and "deployRoleArn" in v.message and "AmazonEKSClusterAdminPolicy" in v.message


@pytest.mark.parametrize(("field", "value"), [
    ("policyArn", "arn:aws:eks::aws:cluster-access-policy/AmazonEKSViewPolicy"),
    ("policyArn", "arn:aws:iam::aws:policy/AmazonEKSClusterAdminPolicy"),  # an IAM ARN is not an access policy
    ("accessScope", {"type": "namespace", "namespaces": ["default"]}),
    ("clusterName", "another-cluster"),
])
def test_admin_association_must_be_cluster_admin_at_cluster_scope(plan_of, field, value):
    doc = plan_of("dev")
    find(doc, ASSOCIATION)["inputs"][field] = value
    assert len(run(doc, "eks-api-mode-has-admin")) == 1


def test_admin_association_needs_its_access_entry(plan_of):
    doc = plan_of("dev")
    principal = find(doc, ASSOCIATION)["inputs"]["principalArn"]
    doc["resources"] = [e for e in doc["resources"] if not (e["type"] == ENTRY and e["inputs"]["principalArn"] == principal)]
    assert len(run(doc, "eks-api-mode-has-admin")) == 1


@pytest.mark.parametrize(("access", "violations"), [
    ({"authenticationMode": "API", "bootstrapClusterCreatorAdminPermissions": True}, 0),
    ({"authenticationMode": "CONFIG_MAP"}, 0),
    ({"authenticationMode": "API_AND_CONFIG_MAP", "bootstrapClusterCreatorAdminPermissions": False}, 1),
])
def test_admin_rule_applies_to_access_entry_only_clusters(plan_of, access, violations):
    doc = plan_of("dev")
    doc["resources"] = [e for e in doc["resources"] if e["type"] != ASSOCIATION]
    find(doc, EKS)["inputs"]["accessConfig"] = access
    assert len(run(doc, "eks-api-mode-has-admin")) == violations


@pytest.mark.parametrize("stack", STACKS)
def test_provider_not_waiting_for_the_association_fails(plan_of, stack):
    doc = plan_of(stack)
    provider = find(doc, PROVIDER)
    assert any(d.startswith(ASSOCIATION + "::") for d in provider["dependsOn"])
    provider["dependsOn"] = [d for d in provider["dependsOn"] if not d.startswith(ASSOCIATION + "::")]
    [v] = run(doc, "k8s-provider-waits-for-access")
    assert v.resource_name == "cluster-k8s" and "Unauthorized" in v.message


def test_provider_waiting_for_a_view_only_association_fails(plan_of):
    doc = plan_of("dev")
    find(doc, ASSOCIATION)["inputs"]["policyArn"] = "arn:aws:eks::aws:cluster-access-policy/AmazonEKSViewPolicy"
    assert len(run(doc, "k8s-provider-waits-for-access")) == 1


# ------------------------------------------------------------------ node monitoring agent


@pytest.mark.parametrize("stack", STACKS)
def test_monitoring_agent_without_configuration_fails_when_gpu_pools_exist(plan_of, stack):
    """The add-on as installed before issue 12: no configuration values at all."""
    doc = plan_of(stack)
    monitoring_addon(doc)["inputs"].pop("configurationValues")
    [v] = run(doc, "node-monitoring-agent-tolerates-gpu")
    assert "nvidia.com/gpu=true:NoSchedule" in v.message and "AcceleratedHardwareReady" in v.message


@pytest.mark.parametrize(("tolerations", "violations"), [
    ([{"key": "nvidia.com/gpu", "operator": "Equal", "value": "true", "effect": "NoSchedule"}], 0),
    ([{"operator": "Exists"}], 0),                                              # tolerate everything
    ([{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoExecute"}], 1),  # wrong effect
    ([{"key": "nvidia.com/gpu", "operator": "Equal", "value": "false"}], 1),       # wrong value
    ([{"key": "CriticalAddonsOnly", "operator": "Exists"}], 1),
])
def test_monitoring_agent_tolerations_follow_kubernetes_semantics(plan_of, tolerations, violations):
    doc = plan_of("prod")
    monitoring_addon(doc)["inputs"]["configurationValues"] = json.dumps({"dcgmAgent": {"tolerations": tolerations}})
    assert len(run(doc, "node-monitoring-agent-tolerates-gpu")) == violations


def test_node_agent_tolerations_do_not_count_for_the_dcgm_server(plan_of):
    doc = plan_of("dev")
    monitoring_addon(doc)["inputs"]["configurationValues"] = json.dumps(
        {"nodeAgent": {"tolerations": [{"operator": "Exists"}]}})
    assert len(run(doc, "node-monitoring-agent-tolerates-gpu")) == 1


def test_monitoring_rule_needs_gpu_pools(plan_of):
    doc = plan_of("dev")
    monitoring_addon(doc)["inputs"].pop("configurationValues")
    doc["resources"] = [e for e in doc["resources"] if e["type"] != NODEPOOL]
    assert run(doc, "node-monitoring-agent-tolerates-gpu") == []
