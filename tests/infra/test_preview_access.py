"""The PR preview's access to the cluster (issue 21, item 5): with ragpool:previewRoleArn set, the
preview role gets an access entry in PREVIEW_GROUP and a ClusterRole with exactly the verbs
pulumi-kubernetes' server-side dry-run asks for (infra/reference/pulumi_kubernetes_preview.yaml)
on every kind the program declares, but Secrets; without it, no entry at all. AmazonEKSViewPolicy
would not do: every dry-run would be Forbidden and silently previewed client-side."""

from __future__ import annotations

import re

import pytest
import yaml

from infra.cluster import PREVIEW_EXCLUDED, PREVIEW_GROUP, preview_rules
from infra.config import StackConfigError, parse
from infra.plan import plan
from infra.stack import REPO_ROOT
from policy.cel_eval import crd_documents
from tests.support.stack_config import REAL_CIDR

REFERENCE = yaml.safe_load((REPO_ROOT / "infra" / "reference" / "pulumi_kubernetes_preview.yaml").read_text())
PREVIEW = "arn:aws:iam::210987654321:role/ragpool-preview"
ENTRY = "aws:eks/accessEntry:AccessEntry"
ASSOCIATION = "aws:eks/accessPolicyAssociation:AccessPolicyAssociation"


def allows(rules: list[dict], group: str, resource: str, verb: str, name: str | None = None) -> bool:
    """Kubernetes RBAC: some rule matches the group, resource, verb (and name, where it lists names)."""
    return any((group in r["apiGroups"] or "*" in r["apiGroups"])
               and (resource in r["resources"] or "*" in r["resources"])
               and (verb in r["verbs"] or "*" in r["verbs"])
               and (not r.get("resourceNames") or name in r["resourceNames"]) for r in rules)


def resource_of(api_version: str, kind: str) -> tuple[str, str]:
    """(API group, plural resource): the CRD's names.plural, else Kubernetes' plural of a built-in kind."""
    group = api_version.split("/")[0] if "/" in api_version else ""
    if (group, kind) in crd_documents():
        return group, crd_documents()[(group, kind)][1]["spec"]["names"]["plural"]
    lower = kind.lower()
    if lower.endswith("y"):
        return group, lower[:-1] + "ies"
    return group, lower + ("es" if re.search(r"(s|x|ch|sh)$", lower) else "s")


def kubernetes_kinds(doc: dict) -> set[tuple[str, str, str]]:
    """(apiVersion, kind, name) of every Kubernetes object the plan declares."""
    return {(r["inputs"]["apiVersion"], r["inputs"]["kind"], r["inputs"].get("metadata", {}).get("name", ""))
            for r in doc["resources"] if r["type"].startswith("kubernetes:") and isinstance(r.get("inputs"), dict)
            and "apiVersion" in r["inputs"] and "kind" in r["inputs"]}


@pytest.fixture(scope="module")
def preview_plan():
    return plan("dev", overrides={"previewRoleArn": PREVIEW})


def of_type(doc: dict, rtype: str) -> list[dict]:
    return [r for r in doc["resources"] if r["type"] == rtype]


def preview_objects(doc: dict, rtype: str) -> list[dict]:
    """The preview's own RBAC objects of ``rtype`` (the node fence has its own: infra/node_fence.py)."""
    return [r for r in of_type(doc, rtype) if r["inputs"]["metadata"]["name"].endswith("-preview")]


def test_the_preview_role_gets_an_entry_in_its_group_and_no_access_policy(preview_plan):
    [entry] = [r for r in of_type(preview_plan, ENTRY) if r["inputs"]["principalArn"] == PREVIEW]
    assert entry["inputs"]["kubernetesGroups"] == [PREVIEW_GROUP] and entry["inputs"]["type"] == "STANDARD"
    assert not [r for r in of_type(preview_plan, ASSOCIATION) if r["inputs"]["principalArn"] == PREVIEW]
    [binding] = preview_objects(preview_plan, "kubernetes:rbac.authorization.k8s.io/v1:ClusterRoleBinding")
    [role] = preview_objects(preview_plan, "kubernetes:rbac.authorization.k8s.io/v1:ClusterRole")
    assert binding["inputs"]["subjects"] == [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group",
                                               "name": PREVIEW_GROUP}]
    assert binding["inputs"]["roleRef"]["name"] == role["inputs"]["metadata"]["name"]


def test_no_preview_access_without_the_key(committed_plans):
    for stack in ("dev", "prod"):
        doc = committed_plans[stack]
        assert not [r for r in of_type(doc, ENTRY) if PREVIEW_GROUP in (r["inputs"].get("kubernetesGroups") or [])]
        assert not [r for r in of_type(doc, ENTRY) if r["name"].endswith("-preview")]
        assert not preview_objects(doc, "kubernetes:rbac.authorization.k8s.io/v1:ClusterRole")


def test_the_cluster_role_allows_every_dry_run_of_every_declared_kind(preview_plan, committed_plans):
    [role] = preview_objects(preview_plan, "kubernetes:rbac.authorization.k8s.io/v1:ClusterRole")
    rules = role["inputs"]["rules"]
    verbs = REFERENCE["dry_run_verbs"]
    kinds = kubernetes_kinds(preview_plan) | kubernetes_kinds(committed_plans["prod"])
    # The CRDs the program applies from files (yaml/v2 ConfigFile) are objects too.
    kinds |= {("apiextensions.k8s.io/v1", "CustomResourceDefinition", "")}
    missing = []
    for api_version, kind, name in sorted(kinds):
        group, resource = resource_of(api_version, kind)
        if (group, resource) in PREVIEW_EXCLUDED:
            assert not allows(rules, group, resource, "get"), f"{resource} must stay out of reach"
            continue
        needed = set(verbs["update_crd" if kind == "CustomResourceDefinition" else "update"])
        if group != "rbac.authorization.k8s.io":
            # The preview's own ClusterRole and binding exist (a deploy made them) before the preview
            # role can call the API at all: only their updates are previewed by it.
            needed |= set(verbs["create"])
        missing += [f"{verb} {group or 'core'}/{resource} {name}" for verb in sorted(needed)
                    if not allows(rules, group, resource, verb, name)]
    assert missing == [], "dry-run requests the preview role would be refused (silent client-side preview):\n" + \
        "\n".join(missing)
    # Narrow: never delete, never list/watch, never everything.
    assert not any({"delete", "deletecollection", "list", "watch", "*", "escalate", "bind"} & set(r["verbs"])
                   for r in rules)
    assert not any("*" in r["apiGroups"] or "*" in r["resources"] for r in rules)


def test_the_view_access_policy_would_preview_nothing_against_the_cluster(preview_plan):
    """AmazonEKSViewPolicy: every dry-run create/patch is Forbidden, so pulumi-kubernetes falls back."""
    view = [{"apiGroups": ["*"], "resources": ["*"],
             "verbs": REFERENCE["eks_access_policies"]["AmazonEKSViewPolicy"]["verbs"]}]
    for api_version, kind, name in kubernetes_kinds(preview_plan):
        group, resource = resource_of(api_version, kind)
        assert not allows(view, group, resource, "create") and not allows(view, group, resource, "patch")
    assert REFERENCE["forbidden_dry_run"] == "silent client-side fallback"


def test_the_check_sees_a_missing_verb():
    rules = preview_rules("r", "b")
    assert allows(rules, "karpenter.sh", "nodepools", "patch")
    narrowed = [dict(r, verbs=[v for v in r["verbs"] if v != "patch"]) if r["apiGroups"] == ["karpenter.sh"] else r
                for r in rules]
    assert not allows(narrowed, "karpenter.sh", "nodepools", "patch")


BASE = {"owner": "t", "costCenter": "c", "deployRoleArn": "arn:aws:iam::444455556666:role/ragpool-deploy",
        "publicAccessCidrs": ["203.0.113.0/24"]}


@pytest.mark.parametrize(("value", "fragment"), [
    ("not-an-arn", "must be the IAM role ARN the PR preview runs as"),
    ("arn:aws:iam::444455556666:role/ragpool-deploy", "must not be the deploy role or an admin role"),
])
def test_a_bad_preview_role_is_refused_naming_the_key(value, fragment):
    with pytest.raises(StackConfigError) as err:
        parse({**BASE, "previewRoleArn": value}, stack="dev", region="us-west-2")
    assert any("previewRoleArn" in p and fragment in p for p in err.value.problems), err.value.problems
    assert parse({**BASE, "previewRoleArn": PREVIEW}, stack="dev", region="us-west-2").cluster.cluster_preview
    assert not parse(BASE, stack="dev", region="us-west-2").cluster.cluster_preview


def test_an_example_account_preview_role_is_refused_only_for_a_real_deployment():
    from infra.deploy_config import deploy_problems

    cfg = parse({**BASE, "previewRoleArn": "arn:aws:iam::111122223333:role/ragpool-preview"}, stack="dev",
                region="us-west-2")
    assert [p for p in deploy_problems(cfg) if "previewRoleArn" in p and "placeholder" in p
            and "pulumi config set previewRoleArn" in p]
    real = {**BASE, "previewRoleArn": PREVIEW, "publicAccessCidrs": [REAL_CIDR]}  # BASE's is a documentation range
    assert deploy_problems(parse(real, stack="dev", region="us-west-2")) == []
