"""Each guardrail policy passes on the committed stacks and fails on a one-field mutation.

Negative cases start from the real offline plan and break one thing, so a pass is never
vacuous: the same resource that passes is shown to fail once the guarded field changes.
"""

from __future__ import annotations

import pytest

from infra.common import TRAINING_UID
from infra.pod_security import container_security_context
from policy.checks import ADVISORY, MANDATORY, RULES, RULES_BY_NAME, Context, Resource
from policy.offline import Violation, evaluate
from tests.conftest import STACKS
from tests.policy.conftest import find, find_all

pytestmark = pytest.mark.infra

EFS = "aws:efs/fileSystem:FileSystem"
EKS = "aws:eks/cluster:Cluster"
REDIS_RG = "aws:elasticache/replicationGroup:ReplicationGroup"
CRONJOB = "kubernetes:batch/v1:CronJob"
STATEFULSET = "kubernetes:apps/v1:StatefulSet"
NETPOL = "kubernetes:networking.k8s.io/v1:NetworkPolicy"
NODEPOOL = "kubernetes:karpenter.sh/v1:NodePool"
NODECLASS = "kubernetes:karpenter.k8s.aws/v1:EC2NodeClass"
LAUNCH_TEMPLATE = "aws:ec2/launchTemplate:LaunchTemplate"
HELM = "kubernetes:helm.sh/v3:Release"
KMS_KEY = "aws:kms/key:Key"
VAULT = "aws:backup/vault:Vault"


def run(doc: dict, policy: str, config: dict | None = None) -> list[Violation]:
    return evaluate(doc, config, rules=[RULES_BY_NAME[policy]])


def pod_spec(cronjob: dict) -> dict:
    return cronjob["inputs"]["spec"]["jobTemplate"]["spec"]["template"]["spec"]


def prometheus_stack(doc: dict) -> dict:
    return next(e for e in find_all(doc, HELM) if e["inputs"].get("chart") == "kube-prometheus-stack")


# ------------------------------------------------------------------ the committed stacks


@pytest.mark.parametrize("stack", STACKS)
def test_committed_stacks_pass_every_mandatory_policy(committed_plans, stack):
    mandatory = [v for v in evaluate(committed_plans[stack]) if v.mandatory]
    assert mandatory == [], "\n".join(map(str, mandatory))


def test_pack_has_mandatory_and_advisory_policies():
    levels = {rule.enforcement for rule in RULES}
    assert levels == {MANDATORY, ADVISORY}
    assert RULES_BY_NAME["efs-encrypted"].enforcement == MANDATORY
    assert RULES_BY_NAME["required-cost-tags"].enforcement == ADVISORY


POSITIVE = [(rule.name, stack) for rule in RULES for stack in STACKS
            # prod still runs al2023@latest: that advisory finding is asserted below.
            if (rule.name, stack) != ("gpu-ami-pinned-in-prod", "prod")]


@pytest.mark.parametrize(("policy", "stack"), POSITIVE)
def test_policy_passes_on_committed_stack(committed_plans, policy, stack):
    assert run(committed_plans[stack], policy) == []


# ------------------------------------------------------------------ one field broken, one finding

DELETE = object()
"""In ONE_FIELD_BREAKS: the field is removed from the resource's inputs instead of set."""

# (stack, resource type, dotted path in the first such resource's inputs, the value it gets or
# DELETE, the policy that must then report exactly that resource, fragments of its one message).
ONE_FIELD_BREAKS = [
    pytest.param("dev", EFS, "encrypted", False, "efs-encrypted", ("encrypted is False", "set encrypted=True"),
                 id="efs-unencrypted"),
    pytest.param("prod", EFS, "encrypted", DELETE, "efs-encrypted", ("encrypted is None",),
                 id="efs-without-encrypted-input"),
    pytest.param("prod", EKS, "encryptionConfig", DELETE, "eks-secrets-encrypted", ("encryptionConfig is missing",),
                 id="eks-without-encryption-config"),
    # AWS's default for a missing endpointPublicAccess is a public endpoint.
    pytest.param("prod", EKS, "vpcConfig.endpointPublicAccess", DELETE, "eks-endpoint-private-in-prod",
                 ("endpointPublicAccess is True in prod",), id="prod-endpoint-default-is-public"),
    pytest.param("dev", EKS, "vpcConfig.publicAccessCidrs", ["0.0.0.0/0"], "eks-endpoint-private-in-prod",
                 ("contains 0.0.0.0/0",), id="dev-public-endpoint-open-to-world"),
    pytest.param("dev", EKS, "vpcConfig.publicAccessCidrs", DELETE, "eks-endpoint-private-in-prod",
                 ("publicAccessCidrs is empty",), id="dev-public-endpoint-without-allow-list"),
    pytest.param("prod", REDIS_RG, "transitEncryptionEnabled", False, "redis-auth-tls-in-prod",
                 ("transitEncryptionEnabled is False",), id="prod-redis-without-tls"),
    pytest.param("prod", REDIS_RG, "authToken", DELETE, "redis-auth-tls-in-prod", ("authToken is not set",),
                 id="prod-redis-without-auth"),
    *(pytest.param(stack, LAUNCH_TEMPLATE, "metadataOptions.httpTokens", "optional", "imdsv2-required",
                   ("metadataOptions.httpTokens is 'optional'",), id=f"{stack}-launch-template-allowing-imdsv1")
      for stack in STACKS),
    pytest.param("prod", NODECLASS, "spec.metadataOptions", DELETE, "imdsv2-required",
                 ("spec.metadataOptions.httpTokens is None",), id="node-class-without-metadata-options"),
    pytest.param("prod", EFS, "tags.cost-center", DELETE, "required-cost-tags", ("tags lack cost-center",),
                 id="missing-cost-tag-is-advisory"),
    pytest.param("dev", KMS_KEY, "tags", DELETE, "required-cost-tags",
                 ("tags lack project, stack, environment, owner, cost-center",), id="untagged-taggable-resource"),
    pytest.param("dev", EFS, "tags.stack", "prod", "required-cost-tags", ("tags.stack is 'prod' but the stack is 'dev'",),
                 id="stack-tag-must-name-this-stack"),
]


@pytest.mark.parametrize(("stack", "rtype", "path", "value", "policy", "fragments"), ONE_FIELD_BREAKS)
def test_one_broken_field_is_one_finding_of_its_policy(plan_of, stack, rtype, path, value, policy, fragments):
    doc = plan_of(stack)
    entry = find(doc, rtype)
    *parents, field = path.split(".")
    inputs = entry["inputs"]
    for key in parents:
        inputs = inputs[key]
    if value is DELETE:
        del inputs[field]
    else:
        inputs[field] = value
    [v] = run(doc, policy)
    assert (v.policy, v.enforcement) == (policy, RULES_BY_NAME[policy].enforcement)
    assert (v.resource_type, v.resource_name) == (rtype, entry["name"])
    for fragment in fragments:
        assert fragment in v.message


# ------------------------------------------------------------------ eks-secrets-encrypted


def test_eks_encryption_without_secrets_or_key_fails(plan_of):
    doc = plan_of("dev")
    config = find(doc, EKS)["inputs"]["encryptionConfig"]
    config["resources"] = ["configmaps"]
    config["provider"]["keyArn"] = ""
    messages = [v.message for v in run(doc, "eks-secrets-encrypted")]
    assert len(messages) == 2
    assert "['configmaps']" in messages[0] and "'secrets'" in messages[0]
    assert "keyArn is empty" in messages[1]


# ------------------------------------------------------------------ eks-endpoint-private-in-prod


def test_prod_public_endpoint_fails(plan_of):
    doc = plan_of("prod")
    vpc = find(doc, EKS)["inputs"]["vpcConfig"]
    vpc["endpointPublicAccess"] = True
    vpc["publicAccessCidrs"] = ["203.0.113.0/24"]  # an allow-list does not make it private
    [v] = run(doc, "eks-endpoint-private-in-prod")
    assert "endpointPublicAccess is True in prod" in v.message


def test_environment_comes_from_tags_not_only_stack_name(plan_of):
    # A prod-class stack under another name is still held to the prod rule.
    doc = plan_of("prod")
    doc["stack"] = "prod-eu"
    find(doc, EKS)["inputs"]["vpcConfig"]["endpointPublicAccess"] = True
    assert len(run(doc, "eks-endpoint-private-in-prod")) == 1
    # ... and the policy config can name the environment outright.
    assert run(doc, "eks-endpoint-private-in-prod", {"eks-endpoint-private-in-prod": {"environment": "dev"}}) != []


# ------------------------------------------------------------------ redis-auth-tls-in-prod


def test_self_hosted_redis_in_prod_fails(plan_of):
    # The dev queue (a Valkey StatefulSet, no TLS) must never ship to a prod stack.
    doc = plan_of("dev")
    doc["stack"] = "prod"
    violations = run(doc, "redis-auth-tls-in-prod")
    assert [v.resource_type for v in violations] == [STATEFULSET]
    assert "valkey/valkey" in violations[0].message and "no TLS" in violations[0].message


def test_redis_rule_is_prod_only(plan_of):
    doc = plan_of("prod")
    rg = find(doc, REDIS_RG)
    rg["inputs"]["transitEncryptionEnabled"] = False
    rg["inputs"]["tags"]["environment"] = "dev"
    doc["stack"] = "dev"
    assert run(doc, "redis-auth-tls-in-prod") == []


# ------------------------------------------------------------------ training-containers-nonroot-limits


@pytest.mark.parametrize("stack", STACKS)
def test_worker_running_as_root_fails(plan_of, stack):
    doc = plan_of(stack)
    spec = pod_spec(find_all(doc, CRONJOB)[0])
    spec["securityContext"].pop("runAsNonRoot")
    spec["containers"][0]["securityContext"].pop("runAsNonRoot")
    spec["containers"][0]["securityContext"]["runAsUser"] = 0
    messages = [v.message for v in run(doc, "training-containers-nonroot-limits")]
    assert len(messages) == 2
    assert "container 'worker': runAsNonRoot is None" in messages[0]
    assert "runAsUser is 0" in messages[1]


def test_worker_without_memory_limit_fails(plan_of):
    doc = plan_of("prod")
    resources = pod_spec(find_all(doc, CRONJOB)[0])["containers"][0]["resources"]
    del resources["limits"]["memory"]
    [v] = run(doc, "training-containers-nonroot-limits")
    assert "resources.limits.memory is not set" in v.message and "nvidia.com/gpu" in v.message


def test_worker_gpu_limit_must_match_request(plan_of):
    doc = plan_of("prod")
    pod_spec(find_all(doc, CRONJOB)[0])["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = "4"
    [v] = run(doc, "training-containers-nonroot-limits")
    assert "requests 8 nvidia.com/gpu but limits '4'" in v.message


def test_privileged_init_container_in_dev_redis_fails(plan_of):
    doc = plan_of("dev")
    spec = find(doc, STATEFULSET)["inputs"]["spec"]["template"]["spec"]
    spec["initContainers"] = [{"name": "chown", "image": "busybox:1.37",
                               "securityContext": {"privileged": True, "runAsNonRoot": True,
                                                   **container_security_context()},
                               "resources": {"limits": {"memory": "16Mi"}}}]
    [v] = run(doc, "training-containers-nonroot-limits")
    assert "container 'chown': privileged is true" in v.message


@pytest.mark.parametrize(("field", "value", "fragment"), [
    ("allowPrivilegeEscalation", None, "allowPrivilegeEscalation is None"),
    ("allowPrivilegeEscalation", True, "allowPrivilegeEscalation is True"),
    ("readOnlyRootFilesystem", False, "readOnlyRootFilesystem is False"),
    ("capabilities", {"drop": ["NET_RAW"]}, "capabilities.drop is ['NET_RAW']"),
])
def test_worker_outside_the_restricted_security_context_fails(plan_of, field, value, fragment):
    doc = plan_of("prod")
    container = pod_spec(find_all(doc, CRONJOB)[0])["containers"][0]
    assert container["securityContext"] == container_security_context(TRAINING_UID)  # the one home
    if value is None:
        del container["securityContext"][field]
    else:
        container["securityContext"][field] = value
    [v] = run(doc, "training-containers-nonroot-limits")
    assert fragment in v.message and "infra/pod_security.py" in v.message


def test_seccomp_may_come_from_the_pod_but_must_be_set_somewhere(plan_of):
    doc = plan_of("dev")
    spec = pod_spec(find_all(doc, CRONJOB)[0])
    del spec["containers"][0]["securityContext"]["seccompProfile"]
    assert run(doc, "training-containers-nonroot-limits") == []  # the pod's RuntimeDefault applies
    del spec["securityContext"]["seccompProfile"]
    [v] = run(doc, "training-containers-nonroot-limits")
    assert "seccompProfile.type is None" in v.message


def test_container_rule_covers_only_training_namespaces(plan_of):
    doc = plan_of("dev")
    sts = find(doc, STATEFULSET)
    sts["inputs"]["spec"]["template"]["spec"]["containers"][0]["securityContext"]["runAsNonRoot"] = False
    assert len(run(doc, "training-containers-nonroot-limits")) == 1
    sts["inputs"]["metadata"]["namespace"] = "kube-system"
    assert run(doc, "training-containers-nonroot-limits") == []
    config = {"training-containers-nonroot-limits": {"trainingNamespaces": ["kube-system"]}}
    assert len(run(doc, "training-containers-nonroot-limits", config)) == 1


# ------------------------------------------------------------------ training-namespace-default-deny


def _drop_default_deny(doc: dict) -> None:
    doc["resources"] = [e for e in doc["resources"]
                        if not (e["type"] == NETPOL and e["inputs"]["metadata"]["name"] == "default-deny")]


@pytest.mark.parametrize("stack", STACKS)
def test_training_namespace_without_default_deny_fails(plan_of, stack):
    doc = plan_of(stack)
    _drop_default_deny(doc)
    [v] = run(doc, "training-namespace-default-deny")
    assert (v.resource_type, v.resource_name) == ("kubernetes:core/v1:Namespace", "training-ns")
    assert "'ragpool-training' has no default-deny NetworkPolicy" in v.message


def test_default_deny_that_selects_some_pods_does_not_count(plan_of):
    doc = plan_of("prod")
    deny = next(e for e in find_all(doc, NETPOL) if e["inputs"]["metadata"]["name"] == "default-deny")
    deny["inputs"]["spec"]["podSelector"] = {"matchLabels": {"app.kubernetes.io/component": "worker"}}
    assert len(run(doc, "training-namespace-default-deny")) == 1


def test_default_deny_covering_ingress_only_does_not_count(plan_of):
    doc = plan_of("prod")
    deny = next(e for e in find_all(doc, NETPOL) if e["inputs"]["metadata"]["name"] == "default-deny")
    deny["inputs"]["spec"]["policyTypes"] = ["Ingress"]
    assert len(run(doc, "training-namespace-default-deny")) == 1


def test_default_deny_in_another_namespace_does_not_count(plan_of):
    doc = plan_of("dev")
    deny = next(e for e in find_all(doc, NETPOL) if e["inputs"]["metadata"]["name"] == "default-deny")
    deny["inputs"]["metadata"]["namespace"] = "monitoring"
    assert len(run(doc, "training-namespace-default-deny")) == 1


# ------------------------------------------------------------------ gpu-nodepool-tainted / limits


@pytest.mark.parametrize("stack", STACKS)
def test_gpu_pool_without_taint_fails(plan_of, stack):
    doc = plan_of(stack)
    pool = find_all(doc, NODEPOOL)[0]
    pool["inputs"]["spec"]["template"]["spec"]["taints"] = [
        {"key": "nvidia.com/gpu", "value": "true", "effect": "PreferNoSchedule"}]
    [v] = run(doc, "gpu-nodepool-tainted")
    assert v.resource_name == pool["name"]
    assert "nvidia.com/gpu=true:PreferNoSchedule" in v.message and "NoSchedule" in v.message


def test_cpu_nodepool_needs_no_gpu_taint():
    pool = Resource(NODEPOOL, "cpu-batch", {"spec": {"template": {"spec": {"requirements": [
        {"key": "node.kubernetes.io/instance-type", "operator": "In", "values": ["m7i.2xlarge"]}]}}}})
    rule = RULES_BY_NAME["gpu-nodepool-tainted"]
    assert list(rule.check(pool, Context("dev"))) == []
    gpu_pool = Resource(NODEPOOL, "gpu-by-category", {"spec": {"template": {"spec": {"requirements": [
        {"key": "karpenter.k8s.aws/instance-category", "operator": "In", "values": ["g"]}]}}}})
    assert len(list(rule.check(gpu_pool, Context("dev")))) == 1


@pytest.mark.parametrize("limits", [None, {}, {"nvidia.com/gpu": "0"}, {"cpu": "1000"}])
def test_gpu_pool_without_gpu_limit_fails(plan_of, limits):
    doc = plan_of("prod")
    pool = find(doc, NODEPOOL, "gpu-gpu-spot")
    if limits is None:
        del pool["inputs"]["spec"]["limits"]
    else:
        pool["inputs"]["spec"]["limits"] = limits
    [v] = run(doc, "gpu-nodepool-limits")
    assert v.resource_name == "gpu-gpu-spot" and "spec.limits['nvidia.com/gpu']" in v.message


# ------------------------------------------------------------------ monitoring-no-public-loadbalancer


@pytest.mark.parametrize("component", ["grafana", "prometheus"])
def test_public_monitoring_load_balancer_fails(plan_of, component):
    doc = plan_of("dev")
    values = prometheus_stack(doc)["inputs"]["values"]
    values[component].setdefault("service", {})["type"] = "LoadBalancer"
    [v] = run(doc, "monitoring-no-public-loadbalancer")
    assert f"values.{component}.service.type is LoadBalancer" in v.message


def test_internal_or_allowed_monitoring_load_balancer_passes(plan_of):
    doc = plan_of("prod")
    service = prometheus_stack(doc)["inputs"]["values"]["grafana"]["service"]
    service["type"] = "LoadBalancer"
    assert len(run(doc, "monitoring-no-public-loadbalancer")) == 1
    allowed = {"monitoring-no-public-loadbalancer": {"allowPublicLoadBalancer": True}}
    assert run(doc, "monitoring-no-public-loadbalancer", allowed) == []
    service["annotations"] = {"service.beta.kubernetes.io/aws-load-balancer-scheme": "internal"}
    assert run(doc, "monitoring-no-public-loadbalancer") == []


def test_plain_grafana_service_of_type_load_balancer_fails():
    rule = RULES_BY_NAME["monitoring-no-public-loadbalancer"]
    service = Resource("kubernetes:core/v1:Service", "grafana-public", {
        "metadata": {"name": "grafana", "namespace": "monitoring"}, "spec": {"type": "LoadBalancer"}})
    [message] = rule.check(service, Context("dev", rule.defaults()))
    assert "spec.type is LoadBalancer" in message
    other = Resource("kubernetes:core/v1:Service", "api", {"metadata": {"name": "api"}, "spec": {"type": "LoadBalancer"}})
    assert list(rule.check(other, Context("dev", rule.defaults()))) == []


# ------------------------------------------------------------------ prod-stateful-protected


@pytest.mark.parametrize("rtype", [EFS, KMS_KEY, VAULT, REDIS_RG])
def test_unprotected_stateful_prod_resource_fails(plan_of, rtype):
    doc = plan_of("prod")
    entry = find(doc, rtype)
    del entry["protect"]
    [v] = run(doc, "prod-stateful-protected")
    assert (v.resource_type, v.resource_name) == (rtype, entry["name"])
    assert "protect is not set" in v.message


def test_dev_stateful_resources_need_no_protect(committed_plans):
    assert "protect" not in find(committed_plans["dev"], EFS)  # dev really is unprotected ...
    assert run(committed_plans["dev"], "prod-stateful-protected") == []  # ... and that is allowed


# ------------------------------------------------------------------ required-cost-tags


def test_node_class_and_launch_template_tag_specs_are_checked(plan_of):
    doc = plan_of("prod")
    del find_all(doc, NODECLASS)[0]["inputs"]["spec"]["tags"]["owner"]
    find(doc, LAUNCH_TEMPLATE)["inputs"]["tagSpecifications"][1]["tags"]["owner"] = ""
    messages = sorted(v.message for v in run(doc, "required-cost-tags"))
    assert len(messages) == 2
    assert messages[0].startswith("spec.tags lack owner")
    assert messages[1].startswith("tagSpecifications[volume].tags lack owner")


# ------------------------------------------------------------------ gpu-ami-pinned-in-prod


def test_prod_gpu_ami_at_latest_is_advisory(committed_plans):
    violations = run(committed_plans["prod"], "gpu-ami-pinned-in-prod")
    assert {v.resource_name for v in violations} == {"gpu-gpu-ondemand-class", "gpu-gpu-ondemand-p5-class",
                                                     "gpu-gpu-spot-class"}
    assert all(v.enforcement == ADVISORY and "'al2023@latest' in prod" in v.message for v in violations)


def test_prod_gpu_ami_pinned_passes():
    # A real config change, run through the program: pin the AMI in prod.
    from infra.plan import plan

    doc = plan("prod", overrides={"ragpool:gpuAmiAlias": "al2023@v20250101"})
    aliases = {t["alias"] for e in find_all(doc, NODECLASS) for t in e["inputs"]["spec"]["amiSelectorTerms"]}
    assert aliases == {"al2023@v20250101"}
    assert run(doc, "gpu-ami-pinned-in-prod") == []
