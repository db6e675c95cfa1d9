"""Cluster access for a real deployment (issue 12, defect 4), as the program declares it.

The deploy role is cluster admin through an access entry, every admin association is waited
for by the Kubernetes provider, the private endpoint admits apiAccessCidrs on 443, and the
example-account placeholder in the committed stack files is refused wherever a real
deployment would start (``config check --deploy``, a real engine), never offline.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from infra.plan import plan
from infra.stack import REPO_ROOT

ENTRY = "aws:eks/accessEntry:AccessEntry"
ASSOCIATION = "aws:eks/accessPolicyAssociation:AccessPolicyAssociation"
PROVIDER = "pulumi:providers:kubernetes"
API_RULE = "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule"
ADMIN_POLICY = "arn:aws:eks::aws:cluster-access-policy/AmazonEKSClusterAdminPolicy"
DEPLOY = "arn:aws:iam::444455556666:role/ragpool-deploy"
OPS = "arn:aws:iam::444455556666:role/ops"


def of_type(doc: dict, rtype: str) -> list[dict]:
    return [r for r in doc["resources"] if r["type"] == rtype]


def test_deploy_role_and_admins_get_entries_and_the_provider_waits_for_all():
    doc = plan("dev", overrides={"ragpool:deployRoleArn": DEPLOY, "ragpool:adminRoleArns": [OPS, DEPLOY]})
    cluster_name = "ragpool-dev"
    entries = {r["inputs"]["principalArn"]: r for r in of_type(doc, ENTRY) if r["parent"] == "cluster"}
    associations = {r["inputs"]["principalArn"]: r for r in of_type(doc, ASSOCIATION)}
    assert set(entries) == set(associations) == {DEPLOY, OPS}  # the deploy role once, first
    assert entries[DEPLOY]["name"] == "cluster-admin-0"
    for arn, assoc in associations.items():
        assert entries[arn]["inputs"]["type"] == "STANDARD" and entries[arn]["inputs"]["clusterName"] == cluster_name
        assert assoc["inputs"] == {"accessScope": {"type": "cluster"}, "clusterName": cluster_name,
                                   "policyArn": ADMIN_POLICY, "principalArn": arn}
        assert f"{ENTRY}::{entries[arn]['name']}" in assoc["dependsOn"]
    [provider] = of_type(doc, PROVIDER)
    assert {f"{ASSOCIATION}::{a['name']}" for a in associations.values()} <= set(provider["dependsOn"])


def test_private_endpoint_admits_each_api_access_cidr_on_https_only(committed_plans):
    doc = plan("prod", overrides={"ragpool:apiAccessCidrs": ["10.0.0.0/16", "172.20.0.0/22"]})
    rules = [r for r in of_type(doc, API_RULE) if r["parent"] == "cluster"]  # not the EFA groups' own rules
    assert {r["inputs"]["cidrIpv4"] for r in rules} == {"10.0.0.0/16", "172.20.0.0/22"}
    for rule in rules:
        assert rule["inputs"]["securityGroupId"] == "sg-ragpool-prod-cluster"  # the group on the endpoint's ENIs
        assert (rule["inputs"]["ipProtocol"], rule["inputs"]["fromPort"], rule["inputs"]["toPort"]) == ("tcp", 443, 443)
    assert [r for r in of_type(committed_plans["dev"], API_RULE) if r["parent"] == "cluster"] == []  # dev: public


def _check(*args):
    return subprocess.run([sys.executable, "-m", "infra.cli", "config", "check", *args], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=120)


def test_config_check_deploy_refuses_the_committed_placeholders():
    assert _check("--stack", "dev", "--stack", "prod").returncode == 0  # offline they are fine
    res = _check("--deploy", "--stack", "dev", "--stack", "prod")
    assert res.returncode == 2 and "Traceback" not in res.stderr
    for stack in ("dev", "prod"):
        assert (f"Pulumi.{stack}.yaml: ragpool:deployRoleArn = \"arn:aws:iam::111122223333:role/ragpool-deploy-{stack}\""
                in res.stderr)
    assert "fix: pulumi config set deployRoleArn" in res.stderr
    assert 'Pulumi.dev.yaml: ragpool:publicAccessCidrs[0] = "203.0.113.0/24": a documentation range' in res.stderr


@pytest.fixture
def real_engine(monkeypatch):
    """The config reader as a real `pulumi up` runs it: stack config set, no mock monitor."""
    import pulumi
    from pulumi.runtime.settings import SETTINGS

    from infra.stack import load_stack

    def configure(stack: str, overrides: dict | None = None):
        settings = load_stack(stack, overrides=overrides)
        pulumi.runtime.set_all_config(dict(settings.engine_config), [])
        monkeypatch.setattr(pulumi, "get_stack", lambda: stack)
        monkeypatch.setattr(pulumi, "get_project", lambda: "ragpool")
        monkeypatch.setattr(SETTINGS, "monitor", object())  # anything but Pulumi's MockMonitor

    yield configure
    pulumi.runtime.set_all_config({}, [])


def test_a_real_engine_refuses_the_placeholder_and_accepts_a_real_role(real_engine):
    from infra.config import StackConfigError
    from infra.deploy_config import from_pulumi

    real_engine("prod")
    with pytest.raises(StackConfigError) as err:
        from_pulumi()
    assert "ragpool:deployRoleArn" in str(err.value) and "111122223333" in str(err.value)
    real_engine("prod", {"ragpool:deployRoleArn": DEPLOY})
    assert from_pulumi().cluster.cluster_admin_arns == (DEPLOY,)
