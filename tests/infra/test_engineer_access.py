"""The ML-engineer tier (issue 39): every exact IAM ARN of ``apiTeams`` gets an EKS access entry in
``contract.api.ENGINEER_GROUP`` and no access policy; a namespaced Role lets that group reach the run API through
the API server's service proxy and read the login ConfigMap, by name, and nothing else; the policy
``engineer-tier-namespaced`` refuses anything more. On the AWS side the stack builds the IAM policy ``ragpool login
--cluster`` needs (``eks:DescribeCluster`` on this cluster only, through the project's IAM evaluator), attached to no
role, and exports its ARN for admins to attach."""

from __future__ import annotations

import copy
import json

import pulumi
import pytest

from contract.api import ENGINEER_GROUP, LOGIN_CONFIGMAP, LoginFacts, proxy_resource_name
from contract.names import TRAINING_NAMESPACE
from infra.cluster import engineer_principals
from infra.config import parse
from infra.plan import MOCK_ACCOUNT, plan
from infra.run_api import RUN_API_NAME
from policy.checks import RULES_BY_NAME
from policy.offline import evaluate
from tests.conftest import STACKS
from tests.infra.harness import inputs_of
from tests.infra.iam_eval import ALLOW, IMPLICIT_DENY, Request, evaluate as iam_evaluate
from tests.support.kube_api import rbac_allows

pytestmark = pytest.mark.infra

ENTRY = "aws:eks/accessEntry:AccessEntry"
ASSOCIATION = "aws:eks/accessPolicyAssociation:AccessPolicyAssociation"
ROLE = "kubernetes:rbac.authorization.k8s.io/v1:Role"
BINDING = "kubernetes:rbac.authorization.k8s.io/v1:RoleBinding"
CLUSTER_BINDING = "kubernetes:rbac.authorization.k8s.io/v1:ClusterRoleBinding"
POLICY = "engineer-tier-namespaced"
ALICE = "arn:aws:iam::123456789012:role/ml-alice"
LEAD = "arn:aws:iam::123456789012:role/ml-lead"
DEPLOY = "arn:aws:iam::111122223333:role/ragpool-deploy-dev"
"""The dev stack's deploy role (Pulumi.dev.yaml): a cluster admin already, so no second access entry."""
TEAMS = {"teams": {"team-a": [ALICE, "arn:aws:iam::123456789012:role/ml-a-*"], "team-b": [ALICE]},
         "admins": [LEAD, DEPLOY]}


@pytest.fixture(scope="module")
def engineer_plan():
    return plan("dev", overrides={"apiTeams": TEAMS})


def of_type(doc: dict, rtype: str) -> list[dict]:
    return [r for r in doc["resources"] if r["type"] == rtype]


def engineer_entries(doc: dict) -> dict[str, dict]:
    return {r["inputs"]["principalArn"]: r for r in of_type(doc, ENTRY)
            if ENGINEER_GROUP in (r["inputs"].get("kubernetesGroups") or [])}


def findings(doc: dict) -> list[str]:
    return [v.message for v in evaluate(doc, None, rules=[RULES_BY_NAME[POLICY]])]


def test_each_exact_arn_gets_one_entry_in_the_group_and_no_access_policy(engineer_plan):
    entries = engineer_entries(engineer_plan)
    assert set(entries) == {ALICE, LEAD}, "once each; the pattern and the deploy role (an admin already) get none"
    for arn, entry in entries.items():
        assert entry["inputs"]["type"] == "STANDARD" and entry["inputs"]["kubernetesGroups"] == [ENGINEER_GROUP]
        assert entry["inputs"]["clusterName"] == "ragpool-dev"
    assert not [a for a in of_type(engineer_plan, ASSOCIATION) if a["inputs"]["principalArn"] in entries]
    assert [e for e in of_type(engineer_plan, ENTRY) if e["inputs"]["principalArn"] == DEPLOY][0]["name"] == \
        "cluster-admin-0"
    cfg = parse({"owner": "t", "costCenter": "c", "deployRoleArn": LEAD, "publicAccessCidrs": ["203.0.113.0/24"],
                 "apiTeams": {"teams": {"b": [ALICE]}, "admins": [LEAD]}}, stack="dev", region="us-west-2")
    assert engineer_principals(cfg) == (ALICE,), "the deploy role is a cluster admin: one access entry per principal"


@pytest.mark.parametrize("stack", STACKS)
def test_the_role_grants_the_proxy_and_the_login_configmap_by_name_only(committed_plans, stack):
    doc = committed_plans[stack]
    [role] = [r for r in inputs_of(doc, ROLE, TRAINING_NAMESPACE) if r["metadata"]["name"] == "ragpool-ml-engineer"]
    [binding] = [b for b in inputs_of(doc, BINDING, TRAINING_NAMESPACE) if b["metadata"]["name"] == "ragpool-ml-engineer"]
    assert binding["subjects"] == [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": ENGINEER_GROUP}]
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                  "name": role["metadata"]["name"]}
    rules = role["rules"]
    target = proxy_resource_name(RUN_API_NAME)
    assert target == f"{RUN_API_NAME}:http"
    assert rbac_allows(rules, "services/proxy", "get", target) and rbac_allows(rules, "services/proxy", "create", target)
    assert rbac_allows(rules, "configmaps", "get", LOGIN_CONFIGMAP)
    refused = [("services/proxy", "get", RUN_API_NAME), ("services/proxy", "get", "ragpool-redis:redis"),
               ("services/proxy", "delete", target), ("services", "get", RUN_API_NAME),
               ("configmaps", "get", "ragpool-run-api-teams"), ("configmaps", "list", None),
               ("configmaps", "patch", LOGIN_CONFIGMAP), ("secrets", "get", "ragpool-redis"),
               ("pods/exec", "create", None), ("pods", "list", None)]
    for resource, verb, name in refused:
        assert not rbac_allows(rules, resource, verb, name), (resource, verb, name)
    assert not [b for b in of_type(doc, CLUSTER_BINDING)
                if ENGINEER_GROUP in [s["name"] for s in b["inputs"].get("subjects") or []]]
    assert not findings(doc)


@pytest.mark.parametrize("stack", STACKS)
def test_the_login_configmap_holds_what_login_needs(committed_plans, stack):
    doc = committed_plans[stack]
    [data] = [c["data"] for c in inputs_of(doc, "kubernetes:core/v1:ConfigMap", TRAINING_NAMESPACE)
              if c["metadata"]["name"] == LOGIN_CONFIGMAP]
    facts = LoginFacts.from_data(data, LOGIN_CONFIGMAP)
    assert facts.cluster_id == f"ragpool-{stack}" and facts.region == "us-west-2"
    assert facts.sts_endpoint == "https://sts.us-west-2.amazonaws.com"
    [service] = [s for s in inputs_of(doc, "kubernetes:core/v1:Service", TRAINING_NAMESPACE)
                 if s["metadata"]["name"] == RUN_API_NAME]
    port = service["spec"]["ports"][0]["name"]
    assert facts.proxy_path == f"/api/v1/namespaces/{TRAINING_NAMESPACE}/services/{RUN_API_NAME}:{port}/proxy"
    with pytest.raises(ValueError, match=r"ragpool-login\.proxyPath"):
        LoginFacts.from_data({**data, "proxyPath": "/api/v1/secrets"}, LOGIN_CONFIGMAP)
    with pytest.raises(ValueError, match=r"ragpool-login\.clusterId: .*pulumi up"):
        LoginFacts.from_data({k: v for k, v in data.items() if k != "clusterId"}, LOGIN_CONFIGMAP)


def test_the_engineer_plan_passes_every_mandatory_policy(engineer_plan):
    assert [str(v) for v in evaluate(engineer_plan, None) if v.mandatory] == []


def _role(doc: dict) -> dict:
    return next(r for r in of_type(doc, ROLE) if r["inputs"]["metadata"]["name"] == "ragpool-ml-engineer")


def _binding(doc: dict) -> dict:
    return next(r for r in of_type(doc, BINDING) if r["inputs"]["metadata"]["name"] == "ragpool-ml-engineer")


def _broaden(doc: dict, how: str) -> None:
    alice = engineer_entries(doc)[ALICE]
    if how == "cluster-admin":
        doc["resources"].append({"type": ASSOCIATION, "name": "cluster-engineer-admin", "inputs": {
            "clusterName": "ragpool-dev", "principalArn": ALICE, "accessScope": {"type": "cluster"},
            "policyArn": "arn:aws:eks::aws:cluster-access-policy/AmazonEKSClusterAdminPolicy"}, "dependsOn": []})
    elif how == "view-policy":
        doc["resources"].append({"type": ASSOCIATION, "name": "cluster-engineer-view", "inputs": {
            "clusterName": "ragpool-dev", "principalArn": ALICE, "accessScope": {"type": "namespace",
                                                                                 "namespaces": ["ragpool-training"]},
            "policyArn": "arn:aws:eks::aws:cluster-access-policy/AmazonEKSViewPolicy"}, "dependsOn": []})
    elif how == "second-group":
        alice["inputs"]["kubernetesGroups"] = [ENGINEER_GROUP, "ragpool:preview"]
    elif how == "cluster-binding":
        binding = copy.deepcopy(_binding(doc))
        binding["type"], binding["name"] = CLUSTER_BINDING, "engineer-everywhere"
        binding["inputs"]["kind"] = "ClusterRoleBinding"
        binding["inputs"]["roleRef"] = {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "view"}
        doc["resources"].append(binding)
    elif how == "bound-to-cluster-role":
        _binding(doc)["inputs"]["roleRef"]["kind"] = "ClusterRole"
    elif how == "any-name":
        del _role(doc)["inputs"]["rules"][0]["resourceNames"]
    elif how == "secrets":
        _role(doc)["inputs"]["rules"][1]["resources"].append("secrets")
    elif how == "delete-verb":
        _role(doc)["inputs"]["rules"][0]["verbs"].append("delete")
    elif how == "wildcard-verb":
        _role(doc)["inputs"]["rules"][1]["verbs"] = ["*"]
    elif how == "other-group":
        _role(doc)["inputs"]["rules"][0]["apiGroups"] = ["*"]


@pytest.mark.parametrize("how", ["cluster-admin", "view-policy", "second-group", "cluster-binding",
                                 "bound-to-cluster-role", "any-name", "secrets", "delete-verb", "wildcard-verb",
                                 "other-group"])
def test_the_policy_refuses_a_broader_tier(engineer_plan, how):
    doc = copy.deepcopy(engineer_plan)
    _broaden(doc, how)
    found = findings(doc)
    assert len(found) == 1 and ENGINEER_GROUP in found[0] and "infra/run_api.py" in found[0], found


# ------------------------------------------------------------------ the IAM side: eks:DescribeCluster for `ragpool login`

IAM_POLICY = "aws:iam/policy:Policy"
ATTACHMENTS = ("aws:iam/rolePolicyAttachment:RolePolicyAttachment", "aws:iam/userPolicyAttachment:UserPolicyAttachment",
               "aws:iam/groupPolicyAttachment:GroupPolicyAttachment", "aws:iam/policyAttachment:PolicyAttachment")


def engineer_iam_policy(doc: dict) -> dict:
    [policy] = [r for r in of_type(doc, IAM_POLICY) if r["name"] == "cluster-engineer-describe"]
    return policy


@pytest.mark.parametrize("stack", STACKS)
def test_the_engineer_iam_policy_allows_describe_cluster_on_this_cluster_only(committed_plans, stack):
    doc = committed_plans[stack]
    policy = engineer_iam_policy(doc)
    assert policy["parent"] == "cluster" and {"project", "stack"} <= set(policy["inputs"]["tags"])
    document = json.loads(policy["inputs"]["policy"])
    this = f"arn:aws:eks:us-west-2:{MOCK_ACCOUNT}:cluster/ragpool-{stack}"

    def decide(action: str, resource: str) -> str:
        return iam_evaluate([document], Request(action, resource, {"aws:RequestedRegion": resource.split(":")[3]}))

    assert decide("eks:DescribeCluster", this) == ALLOW
    for other in (f"arn:aws:eks:us-west-2:{MOCK_ACCOUNT}:cluster/ragpool-other",
                  f"arn:aws:eks:us-east-1:{MOCK_ACCOUNT}:cluster/ragpool-{stack}",
                  f"arn:aws:eks:us-west-2:999999999999:cluster/ragpool-{stack}"):
        assert decide("eks:DescribeCluster", other) == IMPLICIT_DENY, other
    for action in ("eks:ListClusters", "eks:UpdateClusterConfig", "eks:DeleteCluster", "eks:AccessKubernetesApi",
                   "eks:CreateAccessEntry", "eks:AssociateAccessPolicy", "eks:ListAccessEntries",
                   "eks:DescribeAccessEntry", "eks:DescribeNodegroup", "eks:TagResource", "iam:AttachRolePolicy"):
        assert decide(action, this) == IMPLICIT_DENY, action
    # attached to no principal: the engineers' roles are not the stack's (an admin attaches the exported ARN)
    assert not [r for t in ATTACHMENTS for r in of_type(doc, t) if "engineer" in json.dumps(r["inputs"])]


def test_no_listed_role_gets_the_engineer_iam_policy(engineer_plan):
    """apiTeams lists roles of the stack's own account (ALICE, LEAD): the stack still attaches nothing to them."""
    [statement] = json.loads(engineer_iam_policy(engineer_plan)["inputs"]["policy"])["Statement"]
    assert statement["Resource"] == f"arn:aws:eks:us-west-2:{MOCK_ACCOUNT}:cluster/ragpool-dev"
    assert not [r for t in ATTACHMENTS for r in of_type(engineer_plan, t)
                if ALICE in json.dumps(r["inputs"]) or LEAD in json.dumps(r["inputs"])]


def test_the_engineer_iam_policy_arn_is_a_stack_output(pulumi_mocks, monkeypatch):
    import runpy

    from infra.plan import INFRA_DIR
    from infra.stack import load_stack

    settings = load_stack("dev")
    pulumi.runtime.set_all_config(dict(settings.engine_config), list(settings.secret_keys))
    exported: dict = {}
    monkeypatch.setattr(pulumi, "export", lambda name, value: exported.__setitem__(name, value))

    @pulumi.runtime.test
    def check():
        policy = runpy.run_path(str(INFRA_DIR), run_name="__main__")["cluster"].engineer_policy

        def verify(args):
            arn, output = args
            assert output == arn and arn.startswith("arn:aws:iam:"), (arn, output)

        return pulumi.Output.all(policy.arn, exported["engineerClusterPolicyArn"]).apply(verify)

    check()
