"""The cluster's Kubernetes provider waits for everything its first call needs (issue 21, item 6):
the admin access associations and the apiAccessCidrs security-group rules (a private endpoint is
unreachable from the deploy runner until they exist)."""

from __future__ import annotations

RULE = "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule"


def test_provider_depends_on_the_api_access_rules_and_admin_associations(committed_plans):
    for stack, doc in committed_plans.items():
        (provider,) = [r for r in doc["resources"] if r["type"] == "pulumi:providers:kubernetes"
                       and r["name"] == "cluster-k8s"]
        rules = {f"{RULE}::{r['name']}" for r in doc["resources"] if r["type"] == RULE
                 and r["name"].startswith("cluster-api-from-")}
        associations = {f"{r['type']}::{r['name']}" for r in doc["resources"]
                        if r["type"] == "aws:eks/accessPolicyAssociation:AccessPolicyAssociation"}
        if stack == "prod":
            assert rules, "prod's private endpoint is reached through apiAccessCidrs"
        assert associations
        assert sorted((rules | associations) - set(provider.get("dependsOn", []))) == [], stack
