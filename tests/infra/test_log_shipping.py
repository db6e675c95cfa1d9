"""Log shipping under Pulumi mocks, against the add-on's upstream facts
(infra/reference/cloudwatch_observability.yaml): the add-on with its Pod Identity role, the log
groups Fluent Bit writes (pre-created, retention from config, KMS), a key policy CloudWatch Logs
can actually use (evaluated), and Fluent Bit collecting every ragpool container's log file."""

from __future__ import annotations

import fnmatch
import json
from pathlib import Path

import pytest
import yaml

from infra import log_shipping as ls
from infra.config import StackConfigError, parse
from infra.config_schema import CLOUDWATCH_RETENTION_DAYS
from tests.conftest import STACKS
from tests.infra.iam_eval import Request, evaluate
from tests.support.helm import helm_merge

REPO = Path(__file__).resolve().parents[2]
REFERENCE = yaml.safe_load((REPO / "infra" / "reference" / "cloudwatch_observability.yaml").read_text())
REGION = "us-west-2"
ACCOUNT = "123456789012"  # the mocks' account (infra/plan.py)


def _by_type(plan: dict, type_: str) -> list[dict]:
    return [r for r in plan["resources"] if r["type"] == type_]


def _cluster_name(plan: dict) -> str:
    [cluster] = _by_type(plan, "aws:eks/cluster:Cluster")
    return cluster["inputs"]["name"]


def _addon(plan: dict) -> dict:
    [addon] = [r for r in _by_type(plan, "aws:eks/addon:Addon") if r["inputs"]["addonName"] == ls.ADDON]
    return addon


# ------------------------------------------------------------------ the constants are upstream's


def test_log_group_formats_are_the_ones_the_addon_writes():
    upstream = written_log_groups({}, "${CLUSTER_NAME}")
    for kind, fmt in ls.LOG_GROUP_FORMATS.items():
        assert fmt.format(cluster="${CLUSTER_NAME}") in upstream, kind
    for kind in REFERENCE["fluent_bit"]:
        if isinstance(REFERENCE["fluent_bit"][kind], dict) and "log_group" in REFERENCE["fluent_bit"][kind]:
            assert ls.LOG_GROUP_FORMATS[kind].format(cluster="${CLUSTER_NAME}") == REFERENCE["fluent_bit"][kind]["log_group"]
    assert ls.APPLICATION_LOG_GROUP_FORMAT.format(cluster="c1") == "/aws/containerinsights/c1/application"
    assert ls.log_group_name("c1", "host") == "/aws/containerinsights/c1/host"


def test_identity_and_retention_values_are_upstream_facts():
    identity = REFERENCE["identity"]
    assert (ls.ADDON_NAMESPACE, ls.ADDON_SERVICE_ACCOUNT, ls.ADDON_POLICY) == (
        identity["namespace"], identity["service_account"], identity["managed_policy"])
    assert list(CLOUDWATCH_RETENTION_DAYS) == REFERENCE["retention_days"]


def _leaf_paths(values: dict, prefix: str = "") -> set[str]:
    out = set()
    for key, value in values.items():
        path = f"{prefix}{key}"
        out |= _leaf_paths(value, path + ".") if isinstance(value, dict) and value else {path}
    return out


def test_configuration_values_use_only_verified_keys():
    """No add-on configuration schema offline: every key we set is a chart value whose consuming
    template is recorded (infra/reference/cloudwatch_observability.yaml configuration_keys)."""
    assert _leaf_paths(ls.ADDON_CONFIGURATION) <= set(REFERENCE["configuration_keys"])
    assert ls.ADDON_CONFIGURATION["containerLogs"]["enabled"] is True


# ------------------------------------------------------------------ every log group the add-on writes


def _value(values: dict, dotted: str):
    for step in dotted.split("."):
        values = values[step]
    return values


def written_log_groups(configuration: dict, cluster: str) -> set[str]:
    """Log groups the add-on writes with these configuration values over its recorded chart defaults."""
    values = helm_merge(REFERENCE["defaults"], configuration)
    groups = set()
    for writer in REFERENCE["log_group_writers"]:
        if _value(values, writer["when"]) is not True:
            continue
        if "groups_from" in writer:
            groups |= {v["log_group"] for v in REFERENCE[writer["groups_from"]].values()
                       if isinstance(v, dict) and "log_group" in v}
        groups |= set(writer.get("groups", []))
    return {g.replace("${CLUSTER_NAME}", cluster) for g in groups}


def test_the_log_group_check_sees_every_default_writer():
    """The add-on's defaults write Container Insights performance and Application Signals groups too."""
    assert written_log_groups({}, "c1") == {
        "/aws/containerinsights/c1/application", "/aws/containerinsights/c1/dataplane",
        "/aws/containerinsights/c1/host", "/aws/containerinsights/c1/performance", "/aws/application-signals/data"}
    assert written_log_groups({"containerLogs": {"enabled": False}, "containerInsights": {"enabled": False},
                               "applicationSignals": {"enabled": False}}, "c1") == set()


@pytest.mark.parametrize("stack,days", [("dev", 7), ("prod", 90)])
def test_every_log_group_the_addon_writes_is_precreated(committed_plans, stack, days):
    plan = committed_plans[stack]
    addon = _addon(plan)
    written = written_log_groups(json.loads(addon["inputs"]["configurationValues"]), _cluster_name(plan))
    groups = {r["inputs"]["name"]: r for r in _by_type(plan, "aws:cloudwatch/logGroup:LogGroup")}
    missing = sorted(written - set(groups))
    assert missing == [], f"the add-on writes {missing} but the plan creates no such log group"
    for name in written:
        group = groups[name]
        assert group["inputs"]["retentionInDays"] == days, name
        assert group["inputs"]["kmsKeyId"].endswith("/key-logs-key"), name
        assert f"aws:cloudwatch/logGroup:LogGroup::{group['name']}" in addon["dependsOn"], name


# ------------------------------------------------------------------ the plan


@pytest.mark.parametrize("stack,days", [("dev", 7), ("prod", 90)])
def test_log_groups_are_precreated_with_retention_and_the_logs_key(committed_plans, stack, days):
    plan = committed_plans[stack]
    cluster = _cluster_name(plan)
    groups = {r["inputs"]["name"]: r for r in _by_type(plan, "aws:cloudwatch/logGroup:LogGroup")}
    [key] = [r for r in _by_type(plan, "aws:kms/key:Key") if r["name"] == "logs-key"]
    for kind in ls.LOG_GROUP_FORMATS:
        group = groups[ls.log_group_name(cluster, kind)]
        assert group["inputs"]["retentionInDays"] == days
        assert group["inputs"]["kmsKeyId"].endswith("/key-logs-key")  # the mocks' ARN of that key
        assert "aws:kms/key:Key::logs-key" in group["dependsOn"]
        assert bool(group.get("protect")) == (stack == "prod") and bool(group.get("retainOnDelete")) == (stack == "prod")
    assert key["inputs"]["enableKeyRotation"] is True
    assert bool(key.get("protect")) == (stack == "prod")


@pytest.mark.parametrize("stack", STACKS)
def test_the_addon_gets_cloudwatch_credentials_through_pod_identity(committed_plans, stack):
    plan = committed_plans[stack]
    addon = _addon(plan)
    assert addon["inputs"]["clusterName"] == _cluster_name(plan)
    # The configuration keys are the pinned chart's: the add-on's build is that chart's.
    assert addon["inputs"]["addonVersion"] == ls.ADDON_VERSION == REFERENCE["addon_version"]["version"]
    assert ls.ADDON_VERSION.startswith(f"v{REFERENCE['chart']['version']}-eksbuild.")
    assert REFERENCE["addon_version"]["chart_version"] == REFERENCE["chart"]["version"]
    assert json.loads(addon["inputs"]["configurationValues"]) == ls.ADDON_CONFIGURATION
    [assoc] = addon["inputs"]["podIdentityAssociations"]
    assert assoc["serviceAccount"] == REFERENCE["identity"]["service_account"]
    role_name = assoc["roleArn"].rsplit("/", 1)[1]
    [role] = [r for r in _by_type(plan, "aws:iam/role:Role") if r["name"] == role_name]
    trust = json.loads(role["inputs"]["assumeRolePolicy"])
    assert evaluate([trust], Request("sts:AssumeRole", "*", principal="pods.eks.amazonaws.com")) == "Allow"
    assert evaluate([trust], Request("sts:TagSession", "*", principal="pods.eks.amazonaws.com")) == "Allow"
    attached = {r["inputs"]["policyArn"] for r in _by_type(plan, "aws:iam/rolePolicyAttachment:RolePolicyAttachment")
                if r["inputs"]["role"] == role_name}
    assert attached == {"arn:aws:iam::aws:policy/CloudWatchAgentServerPolicy"}
    # The add-on starts after its log groups exist (else Fluent Bit auto-creates them without
    # retention or KMS), its role can be used, and nodes with the Pod Identity agent run.
    deps = set(addon["dependsOn"])
    assert {f"aws:cloudwatch/logGroup:LogGroup::logs-{kind}" for kind in ls.LOG_GROUP_FORMATS} <= deps
    assert "aws:iam/rolePolicyAttachment:RolePolicyAttachment::logs-agent-policy" in deps
    assert "aws:eks/nodeGroup:NodeGroup::cluster-system" in deps
    pod_identity = [r for r in _by_type(plan, "aws:eks/addon:Addon") if r["inputs"]["addonName"] == "eks-pod-identity-agent"]
    assert pod_identity, "Pod Identity associations need the eks-pod-identity-agent add-on"


def _logs_key_policy(plan: dict) -> dict:
    [key] = [r for r in _by_type(plan, "aws:kms/key:Key") if r["name"] == "logs-key"]
    return json.loads(key["inputs"]["policy"])


def _cloudwatch_logs_request(action: str, group_arn: str, region: str = REGION) -> Request:
    return Request(action, "*", context={REFERENCE["kms"]["encryption_context_key"]: group_arn},
                   principal=REFERENCE["kms"]["service_principal"].format(region=region))


@pytest.mark.parametrize("stack", STACKS)
def test_cloudwatch_logs_can_use_the_key_for_these_log_groups_only(committed_plans, stack):
    plan = committed_plans[stack]
    policy = _logs_key_policy(plan)
    cluster = _cluster_name(plan)
    arn = f"arn:aws:logs:{REGION}:{ACCOUNT}:log-group:{ls.log_group_name(cluster)}"
    for action in ("kms:GenerateDataKey", "kms:Encrypt", "kms:Decrypt", "kms:ReEncryptFrom", "kms:DescribeKey"):
        assert evaluate([policy], _cloudwatch_logs_request(action, arn)) == "Allow", action
    # Another log group, another region's CloudWatch Logs, no encryption context: no.
    other = f"arn:aws:logs:{REGION}:{ACCOUNT}:log-group:/aws/lambda/someone-else"
    assert evaluate([policy], _cloudwatch_logs_request("kms:GenerateDataKey", other)) == "ImplicitDeny"
    assert evaluate([policy], _cloudwatch_logs_request("kms:GenerateDataKey", arn, region="eu-west-1")) == "ImplicitDeny"
    assert evaluate([policy], Request("kms:GenerateDataKey", "*", principal=f"logs.{REGION}.amazonaws.com")) == "ImplicitDeny"
    # The account keeps administering its key (no lock-out).
    assert evaluate([policy], Request("kms:PutKeyPolicy", "*", principal=f"arn:aws:iam::{ACCOUNT}:root")) == "Allow"


def test_a_key_policy_without_the_logs_statement_is_refused_by_the_check(committed_plans):
    policy = _logs_key_policy(committed_plans["dev"])
    policy["Statement"] = [s for s in policy["Statement"] if "Service" not in s["Principal"]]
    arn = f"arn:aws:logs:{REGION}:{ACCOUNT}:log-group:{ls.log_group_name(_cluster_name(committed_plans['dev']))}"
    assert evaluate([policy], _cloudwatch_logs_request("kms:GenerateDataKey", arn)) == "ImplicitDeny"


# ------------------------------------------------------------------ every ragpool container is collected


def _collected(pod: str, namespace: str, container: str) -> bool:
    """Does the add-on's application input tail this container's log file?"""
    app = REFERENCE["fluent_bit"]["application"]
    path = REFERENCE["container_log_file"].format(pod=pod, namespace=namespace, container=container,
                                                  container_id="0" * 64)
    return fnmatch.fnmatchcase(path, app["path"]) and not any(fnmatch.fnmatchcase(path, p) for p in app["exclude_path"])


def test_the_collection_rule_sees_exclusions():
    assert _collected("ragpool-worker-gpu-spot-x-0-abcde", "ragpool-training", "worker")
    assert not _collected("aws-node-abcde", "kube-system", "aws-node")
    assert not _collected("fluent-bit-abcde", "amazon-cloudwatch", "fluent-bit")


@pytest.mark.parametrize("stack", STACKS)
def test_fluent_bit_collects_every_ragpool_workload(committed_plans, stack):
    """The pod name of every workload ragpool declares starts with its controller's name;
    none may fall under the add-on's excludes, in any namespace (training, teams, Ray, monitoring)."""
    app = REFERENCE["fluent_bit"]["application"]
    assert app["k8s_logging_exclude"] is False  # no annotation can opt a pod out either
    kinds = ("Deployment", "StatefulSet", "DaemonSet", "CronJob", "Job", "RayCluster")
    workloads = [r for r in committed_plans[stack]["resources"]
                 if r["type"].startswith("kubernetes:") and r["type"].rsplit(":", 1)[1] in kinds]
    assert any(r["type"].endswith(":CronJob") for r in workloads)
    namespaces = set()
    for r in workloads:
        meta = r["inputs"].get("metadata") or {}
        name, namespace = meta.get("name") or r["name"], meta.get("namespace") or "default"
        namespaces.add(namespace)
        assert _collected(f"{name}-0-abcde", namespace, "main"), f"{r['type']} {namespace}/{name} is not shipped"
    assert "ragpool-training" in namespaces


# ------------------------------------------------------------------ config


BASE = {"owner": "ml-platform", "costCenter": "rag", "publicAccessCidrs": ["198.51.100.0/24"],
        "deployRoleArn": "arn:aws:iam::444455556666:role/deploy"}


def test_log_retention_comes_from_config():
    assert parse(BASE, stack="dev", region=REGION).log_retention_days == 7
    assert parse({**BASE, "logRetentionDays": 365}, stack="dev", region=REGION).log_retention_days == 365


@pytest.mark.parametrize("bad", [10, 0, -1, 3654])
def test_a_retention_cloudwatch_does_not_accept_is_refused_with_the_allowed_values(bad):
    with pytest.raises(StackConfigError) as err:
        parse({**BASE, "logRetentionDays": bad}, stack="dev", region=REGION)
    message = str(err.value)
    assert f"logRetentionDays = {bad}" in message and "1, 3, 5, 7, 14, 30" in message and "3653" in message


@pytest.mark.parametrize("bad", [True, "seven"])
def test_a_retention_that_is_not_an_integer_is_refused(bad):
    with pytest.raises(StackConfigError, match="logRetentionDays.*integer"):
        parse({**BASE, "logRetentionDays": bad}, stack="dev", region=REGION)
