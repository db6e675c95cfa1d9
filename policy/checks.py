"""Guardrail checks shared by the CrossGuard pack and the offline evaluator.

Every rule here is a plain function over a :class:`Resource` (type token, inputs as the
engine records them in camelCase, ``protect``) and a :class:`Context` (stack name and the
rule's config). ``policy/pack.py`` wraps the same functions as ``pulumi_policy`` policies
for ``pulumi preview --policy-pack policy``; ``policy/offline.py`` runs them on the
``ragpool plan`` document. Nothing here imports Pulumi, so the checks behave the same in
both places, and a violation message always names the field, the value found and the fix.

Values are read through ``Mapping``/``Sequence`` (never ``dict``/``list``) because
CrossGuard hands inputs over as read-only proxies that raise on values unknown during
preview; those errors are left to propagate so the SDK reports them as "can't run policy".
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from infra.config import GPU_INSTANCE_FAMILIES, is_gpu_instance_type  # Pulumi-free: the one GPU-family rule
from infra.config import TEAM_NAMESPACE_PREFIX
from infra.pod_security import restricted_problems  # Pulumi-free: the one home of the restricted context
from policy.k8s_scheduling import untolerated_taints
from policy.pod_templates import POD_SPEC_PATHS, RAY_CLUSTER_SPEC_PATHS, SCALED_JOB_POD_PATH, SCALED_JOB_TYPE
from policy.pod_templates import as_list as _as_list
from policy.pod_templates import containers as _containers
from policy.pod_templates import get as _get
from policy.pod_templates import is_list as _is_list
from policy.secret_access import check_secret_volumes_readable
from policy.efa import check_efa_pool_requests_devices
from contract.names import POOL_LABEL
from contract.names import GPU_RESOURCE

MANDATORY = "mandatory"
ADVISORY = "advisory"
ENFORCEMENT_LEVELS = (MANDATORY, ADVISORY, "disabled")

ENVIRONMENTS = ("dev", "staging", "prod")
REQUIRED_TAGS = ("project", "stack", "environment", "owner", "cost-center")
DEFAULT_TRAINING_NAMESPACES = ("ragpool-training",)

# AWS resource types this program declares that take no `tags` input. Every other `aws:*`
# type counts as taggable, so a new resource type is held to the tag rule until someone
# adds it here; tests/policy checks this list against the pulumi_aws SDK.
NON_TAGGABLE_AWS_TYPES = frozenset({
    "aws:backup/selection:Selection",
    "aws:cloudwatch/eventTarget:EventTarget",
    "aws:ec2/routeTableAssociation:RouteTableAssociation",
    "aws:eks/accessPolicyAssociation:AccessPolicyAssociation",
    "aws:ecr/lifecyclePolicy:LifecyclePolicy",
    "aws:efs/fileSystemPolicy:FileSystemPolicy",
    "aws:efs/mountTarget:MountTarget",
    "aws:iam/rolePolicy:RolePolicy",
    "aws:iam/rolePolicyAttachment:RolePolicyAttachment",
    "aws:kms/alias:Alias",
    "aws:sqs/queuePolicy:QueuePolicy",
})

# Stateful resources whose loss loses data or keys: `protect` is required on them in prod.
STATEFUL_TYPES = frozenset({
    "aws:efs/fileSystem:FileSystem",
    "aws:kms/key:Key",
    "aws:backup/vault:Vault",
    "aws:elasticache/replicationGroup:ReplicationGroup",
})

NODEPOOL_TYPES = frozenset({
    "kubernetes:karpenter.sh/v1:NodePool",
    "kubernetes:karpenter.sh/v1beta1:NodePool",
})
EC2NODECLASS_TYPES = frozenset({
    "kubernetes:karpenter.k8s.aws/v1:EC2NodeClass",
    "kubernetes:karpenter.k8s.aws/v1beta1:EC2NodeClass",
})


NAMESPACE_TYPE = "kubernetes:core/v1:Namespace"
NETWORK_POLICY_TYPE = "kubernetes:networking.k8s.io/v1:NetworkPolicy"
SERVICE_TYPE = "kubernetes:core/v1:Service"
HELM_RELEASE_TYPE = "kubernetes:helm.sh/v3:Release"

_MONITORING_NAME = re.compile(r"grafana|prometheus|alertmanager", re.IGNORECASE)
_SELF_HOSTED_REDIS_IMAGE = re.compile(r"(^|/)(redis|valkey)(:|@|$)")
_INTERNAL_LB_ANNOTATIONS = {
    "service.beta.kubernetes.io/aws-load-balancer-scheme": "internal",
    "service.beta.kubernetes.io/aws-load-balancer-internal": "true",
}


# ------------------------------------------------------------------ data model


@dataclass(frozen=True)
class Resource:
    """One resource as a policy sees it, whichever side (CrossGuard or offline plan) built it."""

    type: str
    """Pulumi type token, e.g. ``aws:efs/fileSystem:FileSystem``."""
    name: str
    """Logical resource name (the plan's ``name``, the URN's last part)."""
    inputs: Mapping[str, Any]
    """Inputs in camelCase as the engine records them (CrossGuard: ``args.props``)."""
    protect: bool = False
    """The ``protect`` resource option."""
    urn: str | None = None
    """The URN under CrossGuard; None offline."""
    dependencies: tuple[str, ...] = ()
    """What the engine creates first, as ``type::name`` (plan ``dependsOn``; CrossGuard stack
    policies: ``PolicyResource.dependencies``). Resource policies do not see them."""

    @property
    def label(self) -> str:
        return f'{self.type} "{self.name}"'


@dataclass(frozen=True)
class Context:
    """What a check knows beyond one resource: the stack and this rule's config."""

    stack: str | None
    """Stack name (offline: the plan's ``stack``; CrossGuard: parsed from the URN)."""
    config: Mapping[str, Any] = field(default_factory=dict)
    """This rule's config properties with schema defaults filled in."""

    def environment_of(self, resource: Resource) -> str:
        """Environment class a resource belongs to: dev, staging or prod.

        Order: the rule's ``environment`` config; the resource's own ``environment`` tag
        (the program tags every AWS resource and Karpenter node class with it, from the
        stack's ``ragpool:environment``); the stack name when it is an environment name.
        Anything else counts as prod, so an unknown stack gets the strict checks.
        """
        configured = self.config.get("environment")
        if configured:
            return str(configured)
        tag = _tags_of(resource).get("environment")
        if isinstance(tag, str) and tag in ENVIRONMENTS:
            return tag
        if self.stack in ENVIRONMENTS:
            return str(self.stack)
        return "prod"


ResourceCheck = Callable[[Resource, Context], Iterable[str]]
StackCheck = Callable[[Sequence[Resource], Context], Iterable[tuple["Resource | None", str]]]


@dataclass(frozen=True)
class Rule:
    """One policy: metadata shared by both runners plus its check function."""

    name: str
    description: str
    enforcement: str
    remediation: str
    check: Callable[..., Iterable[Any]]
    scope: str = "resource"  # "resource": check(Resource, Context) -> messages;
    #                          "stack": check(resources, Context) -> (resource|None, message)
    config_schema: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.enforcement not in (MANDATORY, ADVISORY):
            raise ValueError(f"rule {self.name}: enforcement {self.enforcement!r} is not mandatory|advisory")
        if self.scope not in ("resource", "stack"):
            raise ValueError(f"rule {self.name}: scope {self.scope!r} is not resource|stack")

    def defaults(self) -> dict[str, Any]:
        return {k: v["default"] for k, v in self.config_schema.items() if "default" in v}


# ------------------------------------------------------------------ value helpers (get, as_list: policy/pod_templates.py)


def _first(value: Any) -> Any:
    """Some provider versions model a nested block as a one-element list."""
    return value[0] if _is_list(value) and len(value) else value


def _is_true(value: Any) -> bool:
    # The AWS provider types some booleans as strings ("true"), e.g. EBS `encrypted`.
    return value is True or (isinstance(value, str) and value.lower() == "true")


def _is_blank(value: Any) -> bool:
    return value is None or (isinstance(value, str) and not value.strip())


def _number(value: Any) -> float | None:
    """A count given as int, float or numeric string (CrossGuard delivers every number as float)."""
    if isinstance(value, bool) or value is None:
        return None
    try:
        return float(str(value))
    except ValueError:
        return None


def _same_quantity(a: Any, b: Any) -> bool:
    na, nb = _number(a), _number(b)
    return na == nb if na is not None and nb is not None else str(a) == str(b)


def _tags_of(resource: Resource) -> Mapping[str, Any]:
    if resource.type in EC2NODECLASS_TYPES:
        tags = _get(resource.inputs, "spec", "tags")
    else:
        tags = _get(resource.inputs, "tags")
    return tags if isinstance(tags, Mapping) else {}


def _metadata_name(resource: Resource) -> str:
    name = _get(resource.inputs, "metadata", "name")
    return name if isinstance(name, str) and name else resource.name


# ------------------------------------------------------------------ AWS storage and cluster


def check_efs_encrypted(resource: Resource, ctx: Context) -> Iterator[str]:
    if resource.type != "aws:efs/fileSystem:FileSystem":
        return
    value = _get(resource.inputs, "encrypted")
    if not _is_true(value):
        yield (f"encrypted is {value!r}: the shared file system holds datasets and checkpoints "
               "and must be encrypted at rest; set encrypted=True (with kms_key_id) — "
               "encryption cannot be added later, so this replaces the file system")


def check_eks_secrets_encrypted(resource: Resource, ctx: Context) -> Iterator[str]:
    if resource.type != "aws:eks/cluster:Cluster":
        return
    config = _first(_get(resource.inputs, "encryptionConfig"))
    if not isinstance(config, Mapping):
        yield ("encryptionConfig is missing: Kubernetes secrets must be envelope-encrypted; "
               "set encryption_config={resources: ['secrets'], provider: {key_arn: <KMS key>}}")
        return
    resources = [str(r) for r in _as_list(_get(config, "resources"))]
    if "secrets" not in resources:
        yield (f"encryptionConfig.resources is {resources!r}: it must include 'secrets'")
    key_arn = _get(_first(_get(config, "provider")), "keyArn")
    if _is_blank(key_arn):
        yield "encryptionConfig.provider.keyArn is empty: point it at a customer-managed KMS key"


def check_eks_endpoint_access(resource: Resource, ctx: Context) -> Iterator[str]:
    if resource.type != "aws:eks/cluster:Cluster":
        return
    vpc = _first(_get(resource.inputs, "vpcConfig"))
    vpc = vpc if isinstance(vpc, Mapping) else {}
    # AWS defaults: public access on (open to 0.0.0.0/0), private access off.
    public = vpc.get("endpointPublicAccess", True)
    private = vpc.get("endpointPrivateAccess", False)
    environment = ctx.environment_of(resource)
    if environment == "prod":
        if _is_true(public) or public is None:
            yield (f"vpcConfig.endpointPublicAccess is {public!r} in {environment}: the prod API "
                   "endpoint must be private; set ragpool:endpointPublicAccess false (reach it "
                   "through the VPC or a VPN)")
        if not _is_true(private):
            yield (f"vpcConfig.endpointPrivateAccess is {private!r} in {environment}: nodes and "
                   "operators need the private endpoint; set endpoint_private_access=True")
        return
    if _is_true(public):
        cidrs = [str(c) for c in _as_list(vpc.get("publicAccessCidrs"))]
        if not cidrs:
            yield ("vpcConfig.publicAccessCidrs is empty with a public endpoint, so AWS opens it "
                   "to 0.0.0.0/0; set ragpool:publicAccessCidrs to your office/VPN ranges")
        for cidr in cidrs:
            if cidr in ("0.0.0.0/0", "::/0"):
                yield (f"vpcConfig.publicAccessCidrs contains {cidr}: the public API endpoint is "
                       "open to the internet; list only your office/VPN ranges")


def check_redis_auth_tls_in_prod(resource: Resource, ctx: Context) -> Iterator[str]:
    if ctx.environment_of(resource) != "prod":
        return
    if resource.type == "aws:elasticache/replicationGroup:ReplicationGroup":
        transit = _get(resource.inputs, "transitEncryptionEnabled")
        if not _is_true(transit):
            yield (f"transitEncryptionEnabled is {transit!r}: the prod task queue must use TLS; "
                   "set transit_encryption_enabled=True")
        token = _get(resource.inputs, "authToken")
        user_groups = _as_list(_get(resource.inputs, "userGroupIds"))
        if _is_blank(token) and not user_groups:
            yield ("authToken is not set and no userGroupIds: the prod task queue must require "
                   "auth; set auth_token from a generated secret (or RBAC user groups)")
        return
    if resource.type == "aws:elasticache/cluster:Cluster":
        engine = str(_get(resource.inputs, "engine") or "")
        if engine in ("redis", "valkey"):
            yield (f"a single ElastiCache {engine} cluster cannot take an auth token: in prod run "
                   "the queue as a ReplicationGroup with auth_token and TLS")
        return
    path = POD_SPEC_PATHS.get(resource.type)
    if path is None:
        return
    for container in _containers(_get(resource.inputs, *path)):
        image = str(_get(container, "image") or "")
        if _SELF_HOSTED_REDIS_IMAGE.search(image):
            yield (f"container {_get(container, 'name')!r} runs {image} in prod: the self-hosted "
                   "queue has no TLS; prod uses ElastiCache with auth and TLS")


def check_prod_stateful_protected(resource: Resource, ctx: Context) -> Iterator[str]:
    if resource.type not in STATEFUL_TYPES or ctx.environment_of(resource) != "prod":
        return
    if not resource.protect:
        yield ("protect is not set on a stateful prod resource: `pulumi destroy` or a replace "
               "would delete it; create it with infra/common.py stateful(parent, cfg) "
               "(protect and retain_on_delete in prod)")


def check_required_tags(resource: Resource, ctx: Context) -> Iterator[str]:
    required = [str(t) for t in _as_list(ctx.config.get("requiredTags", REQUIRED_TAGS))]
    if resource.type in EC2NODECLASS_TYPES:
        # Karpenter copies these onto the GPU instances and volumes it launches.
        yield from _tag_problems("spec.tags", _get(resource.inputs, "spec", "tags"), required, ctx)
        return
    if not resource.type.startswith("aws:") or resource.type in NON_TAGGABLE_AWS_TYPES:
        return
    yield from _tag_problems("tags", _get(resource.inputs, "tags"), required, ctx)
    if resource.type == "aws:ec2/launchTemplate:LaunchTemplate":
        for i, spec in enumerate(_as_list(_get(resource.inputs, "tagSpecifications"))):
            kind = _get(spec, "resourceType") or i
            yield from _tag_problems(f"tagSpecifications[{kind}].tags", _get(spec, "tags"), required, ctx)


def _tag_problems(where: str, tags: Any, required: Sequence[str], ctx: Context) -> Iterator[str]:
    tags = tags if isinstance(tags, Mapping) else {}
    missing = [key for key in required if _is_blank(tags.get(key))]
    if missing:
        yield (f"{where} lack {', '.join(missing)}: cost reports group GPU and storage spend by "
               "these tags; tag with infra/common.py aws_tags(cfg, name) (owner and cost-center "
               "come from ragpool:owner and ragpool:costCenter)")
    stack_tag = tags.get("stack")
    if ctx.stack and isinstance(stack_tag, str) and stack_tag and stack_tag != ctx.stack:
        yield f"{where}.stack is {stack_tag!r} but the stack is {ctx.stack!r}: costs would land on the wrong stack"


# ------------------------------------------------------------------ EC2 metadata service


def check_imdsv2_required(resource: Resource, ctx: Context) -> Iterator[str]:
    if resource.type in ("aws:ec2/launchTemplate:LaunchTemplate", "aws:ec2/instance:Instance"):
        options, where = _first(_get(resource.inputs, "metadataOptions")), "metadataOptions"
    elif resource.type in EC2NODECLASS_TYPES:
        options, where = _get(resource.inputs, "spec", "metadataOptions"), "spec.metadataOptions"
    else:
        return
    tokens = _get(options, "httpTokens")
    if tokens != "required":
        yield (f"{where}.httpTokens is {tokens!r}: require IMDSv2 so a pod cannot lift the node "
               "role's credentials with a plain GET; set httpTokens: required")


# ------------------------------------------------------------------ Karpenter GPU pools


def is_gpu_nodepool(resource: Resource) -> bool:
    """A NodePool that can launch NVIDIA GPU instances."""
    if resource.type not in NODEPOOL_TYPES:
        return False
    spec = _get(resource.inputs, "spec")
    if _get(spec, "limits", GPU_RESOURCE) is not None:
        return True
    for req in _as_list(_get(spec, "template", "spec", "requirements")):
        key = _get(req, "key")
        values = [str(v) for v in _as_list(_get(req, "values"))]
        if isinstance(key, str) and key.startswith("karpenter.k8s.aws/instance-gpu"):
            return True
        if key == "node.kubernetes.io/instance-type" and any(is_gpu_instance_type(v) for v in values):
            return True
        if key == "karpenter.k8s.aws/instance-category" and {"g", "p"} & set(values):
            return True
        if key == "karpenter.k8s.aws/instance-family" and any(v in GPU_INSTANCE_FAMILIES for v in values):
            return True
    return False


def check_gpu_nodepool_tainted(resource: Resource, ctx: Context) -> Iterator[str]:
    if not is_gpu_nodepool(resource):
        return
    taints = _as_list(_get(resource.inputs, "spec", "template", "spec", "taints"))
    if not any(_get(t, "key") == GPU_RESOURCE and _get(t, "effect") == "NoSchedule" for t in taints):
        found = [f"{_get(t, 'key')}={_get(t, 'value')}:{_get(t, 'effect')}" for t in taints]
        yield (f"spec.template.spec.taints is {found!r}: GPU nodes must carry "
               f"{GPU_RESOURCE}=true:NoSchedule so only pods that tolerate it (training workers) "
               "land on them")


def check_gpu_nodepool_limits(resource: Resource, ctx: Context) -> Iterator[str]:
    if not is_gpu_nodepool(resource):
        return
    limit = _get(resource.inputs, "spec", "limits", GPU_RESOURCE)
    count = _number(limit)
    if count is None or count <= 0 or count != int(count):
        yield (f"spec.limits[{GPU_RESOURCE!r}] is {limit!r}: without a positive GPU limit "
               "Karpenter can launch GPU instances without bound; set the pool's gpuLimit in "
               "ragpool:gpuPools")


def check_gpu_ami_pinned_in_prod(resource: Resource, ctx: Context) -> Iterator[str]:
    if resource.type not in EC2NODECLASS_TYPES or ctx.environment_of(resource) != "prod":
        return
    for term in _as_list(_get(resource.inputs, "spec", "amiSelectorTerms")):
        alias = _get(term, "alias")
        if isinstance(alias, str) and alias.endswith("@latest"):
            yield (f"spec.amiSelectorTerms alias is {alias!r} in prod: a new AMI rolls every GPU "
                   "node on its own schedule; pin a dated version with ragpool:gpuAmiAlias "
                   "(al2023@vYYYYMMDD)")


# ------------------------------------------------------------------ workloads and namespaces


#: Team namespaces (infra/config.py trainingTeams, TEAM_NAMESPACE_PREFIX) are training namespaces too.


def training_namespaces(ctx: Context) -> set[str]:
    return {str(n) for n in _as_list(ctx.config.get("trainingNamespaces", DEFAULT_TRAINING_NAMESPACES))}


def is_training_namespace(namespace: Any, ctx: Context) -> bool:
    return namespace in training_namespaces(ctx) or str(namespace).startswith(TEAM_NAMESPACE_PREFIX)


def check_training_containers(resource: Resource, ctx: Context) -> Iterator[str]:
    path = POD_SPEC_PATHS.get(resource.type)
    if path is None:
        return
    namespace = _get(resource.inputs, "metadata", "namespace")
    if not is_training_namespace(namespace, ctx):
        return
    pod = _get(resource.inputs, *path)
    pod_security = _get(pod, "securityContext")
    containers = _containers(pod)
    if not containers:
        yield f"{'.'.join(path)}.containers is empty: nothing to check, the workload is malformed"
    for container in containers:
        name = _get(container, "name")
        security = _get(container, "securityContext")
        non_root = _get(security, "runAsNonRoot")
        if non_root is None:
            non_root = _get(pod_security, "runAsNonRoot")
        if non_root is not True:
            yield (f"container {name!r}: runAsNonRoot is {non_root!r} (container and pod "
                   "securityContext): training containers must run as non-root; set "
                   "runAsNonRoot: true and a non-zero runAsUser")
        user = _get(security, "runAsUser")
        if user is None:
            user = _get(pod_security, "runAsUser")
        if user is not None and _number(user) == 0:
            yield f"container {name!r}: runAsUser is 0 (root); use the image's non-root user (1000)"
        if _is_true(_get(security, "privileged")):
            yield f"container {name!r}: privileged is true; training never needs a privileged container"
        for problem in restricted_problems(pod_security, security):
            yield (f"container {name!r}: {problem} (the restricted securityContext of "
                   "infra/pod_security.py; build it with container_security_context())")
        limits = _get(container, "resources", "limits")
        limits = limits if isinstance(limits, Mapping) else {}
        if _is_blank(limits.get("memory")):
            yield (f"container {name!r}: resources.limits.memory is not set (limits: "
                   f"{dict(limits)!r}): an unbounded container can take the node down with it; "
                   "set a memory limit")
        requested_gpus = _get(container, "resources", "requests", GPU_RESOURCE)
        if requested_gpus is not None and not _same_quantity(limits.get(GPU_RESOURCE), requested_gpus):
            yield (f"container {name!r}: requests {requested_gpus} {GPU_RESOURCE} but limits "
                   f"{limits.get(GPU_RESOURCE)!r}; set limits[{GPU_RESOURCE!r}] equal to the request")


def _is_default_deny(policy: Resource) -> bool:
    spec = _get(policy.inputs, "spec")
    selector = _get(spec, "podSelector")
    selects_all = selector is None or (
        isinstance(selector, Mapping)
        and not _as_list(selector.get("matchExpressions"))
        and not (isinstance(selector.get("matchLabels"), Mapping) and len(selector["matchLabels"]))
    )
    types = {str(t) for t in _as_list(_get(spec, "policyTypes"))}
    no_rules = not _as_list(_get(spec, "ingress")) and not _as_list(_get(spec, "egress"))
    return selects_all and {"Ingress", "Egress"} <= types and no_rules


def check_training_default_deny(resources: Sequence[Resource], ctx: Context) -> Iterator[tuple[Resource | None, str]]:
    configured = training_namespaces(ctx)
    namespaces = [
        r for r in resources
        if r.type == NAMESPACE_TYPE and (
            _metadata_name(r) in configured
            or _get(r.inputs, "metadata", "labels", "app.kubernetes.io/component") == "training")
    ]
    denying = {
        _get(r.inputs, "metadata", "namespace")
        for r in resources if r.type == NETWORK_POLICY_TYPE and _is_default_deny(r)
    }
    for ns in namespaces:
        name = _metadata_name(ns)
        if name not in denying:
            yield ns, (f"training namespace {name!r} has no default-deny NetworkPolicy (podSelector {{}}, "
                       "policyTypes [Ingress, Egress], no rules): without it every pod accepts "
                       "traffic from anywhere in the cluster; declare one next to the allow rules "
                       "in infra/training_namespace.py")


# ------------------------------------------------------------------ monitoring exposure


def _is_internal_lb(annotations: Any) -> bool:
    if not isinstance(annotations, Mapping):
        return False
    return any(str(annotations.get(k, "")).lower() == v for k, v in _INTERNAL_LB_ANNOTATIONS.items())


def _monitoring_services(resource: Resource) -> Iterator[tuple[str, Any]]:
    """(where, service spec) pairs for Grafana/Prometheus/Alertmanager services."""
    if resource.type == SERVICE_TYPE:
        labels = _get(resource.inputs, "metadata", "labels")
        label_text = " ".join(str(v) for v in labels.values()) if isinstance(labels, Mapping) else ""
        if _MONITORING_NAME.search(f"{_metadata_name(resource)} {label_text}"):
            spec = _get(resource.inputs, "spec")
            yield "spec", {"type": _get(spec, "type"),
                           "annotations": _get(resource.inputs, "metadata", "annotations")}
        return
    if resource.type != HELM_RELEASE_TYPE:
        return
    values = _get(resource.inputs, "values")
    chart = str(_get(resource.inputs, "chart") or "")
    # kube-prometheus-stack nests each component; the standalone charts keep it at the top.
    for key in ("grafana", "prometheus", "alertmanager"):
        yield f"values.{key}.service", _get(values, key, "service")
    if _MONITORING_NAME.search(chart):
        yield "values.service", _get(values, "service")
        yield "values.server.service", _get(values, "server", "service")


def check_monitoring_not_public(resource: Resource, ctx: Context) -> Iterator[str]:
    if _is_true(ctx.config.get("allowPublicLoadBalancer", False)):
        return
    for where, service in _monitoring_services(resource):
        if _get(service, "type") == "LoadBalancer" and not _is_internal_lb(_get(service, "annotations")):
            yield (f"{where}.type is LoadBalancer without an internal-scheme annotation: Grafana/"
                   "Prometheus would be reachable from the internet; use ClusterIP with "
                   "`kubectl port-forward`, an internal load balancer "
                   "(service.beta.kubernetes.io/aws-load-balancer-scheme: internal), or set this "
                   "policy's allowPublicLoadBalancer config to true")


# ------------------------------------------------------------------ cluster access and node agents

EKS_CLUSTER_TYPE = "aws:eks/cluster:Cluster"
ACCESS_ENTRY_TYPE = "aws:eks/accessEntry:AccessEntry"
ACCESS_POLICY_ASSOCIATION_TYPE = "aws:eks/accessPolicyAssociation:AccessPolicyAssociation"
K8S_PROVIDER_TYPE = "pulumi:providers:kubernetes"
ADDON_TYPE = "aws:eks/addon:Addon"
EFS_POLICY_TYPE = "aws:efs/fileSystemPolicy:FileSystemPolicy"
STORAGE_CLASS_TYPE = "kubernetes:storage.k8s.io/v1:StorageClass"
PERSISTENT_VOLUME_TYPE = "kubernetes:core/v1:PersistentVolume"
# arn:<partition>:eks::aws:cluster-access-policy/<name> (EKS User Guide, "access policies").
_ADMIN_ACCESS_POLICY = re.compile(r"arn:aws(-cn|-us-gov)?:eks::aws:cluster-access-policy/AmazonEKSClusterAdminPolicy")
NODE_MONITORING_AGENT = "eks-node-monitoring-agent"


def _key(resource: Resource) -> str:
    return f"{resource.type}::{resource.name}"


def _api_mode_without_creator_admin(cluster: Resource) -> bool:
    access = _first(_get(cluster.inputs, "accessConfig"))
    mode = _get(access, "authenticationMode")
    # EKS default: CONFIG_MAP with the creator as admin; only the API modes use access entries.
    return mode in ("API", "API_AND_CONFIG_MAP") and not _is_true(_get(access, "bootstrapClusterCreatorAdminPermissions"))


def _admin_associations(resources: Sequence[Resource], cluster_name: Any) -> list[Resource]:
    """Cluster-scoped AmazonEKSClusterAdminPolicy associations of a cluster that have an access entry."""
    entries = {(_get(r.inputs, "clusterName"), _get(r.inputs, "principalArn"))
               for r in resources if r.type == ACCESS_ENTRY_TYPE}
    return [r for r in resources if r.type == ACCESS_POLICY_ASSOCIATION_TYPE
            and _get(r.inputs, "clusterName") == cluster_name
            and _ADMIN_ACCESS_POLICY.fullmatch(str(_get(r.inputs, "policyArn") or ""))
            and _get(r.inputs, "accessScope", "type") == "cluster"
            and (cluster_name, _get(r.inputs, "principalArn")) in entries]


def check_api_cluster_has_admin(resources: Sequence[Resource], ctx: Context) -> Iterator[tuple[Resource | None, str]]:
    for cluster in resources:
        if cluster.type != EKS_CLUSTER_TYPE or not _api_mode_without_creator_admin(cluster):
            continue
        name = _get(cluster.inputs, "name")
        if not _admin_associations(resources, name):
            yield cluster, (f"cluster {name!r} authenticates with access entries only "
                            "(authenticationMode API, bootstrapClusterCreatorAdminPermissions false) but no "
                            "principal has an access entry with AmazonEKSClusterAdminPolicy at cluster scope: "
                            "nobody, not even `pulumi up`, can call its Kubernetes API; set ragpool:deployRoleArn "
                            "(the role the deployment runs as)")


def check_k8s_provider_waits_for_access(resources: Sequence[Resource], ctx: Context
                                        ) -> Iterator[tuple[Resource | None, str]]:
    clusters = [c for c in resources if c.type == EKS_CLUSTER_TYPE and _api_mode_without_creator_admin(c)]
    if not clusters:
        return
    admin_keys = {_key(a) for c in clusters for a in _admin_associations(resources, _get(c.inputs, "name"))}
    for provider in resources:
        if provider.type != K8S_PROVIDER_TYPE:
            continue
        if not admin_keys & set(provider.dependencies):
            yield provider, (f"Kubernetes provider {provider.name!r} depends on {sorted(provider.dependencies)!r} "
                             "but on no cluster-admin access policy association: its first call races the "
                             "access entry and fails with Unauthorized; create it with "
                             "depends_on=[the AccessPolicyAssociation]")


def _gpu_taints(resources: Sequence[Resource]) -> list[Mapping[str, Any]]:
    taints: list[Mapping[str, Any]] = []
    for pool in resources:
        if is_gpu_nodepool(pool):
            for taint in _as_list(_get(pool.inputs, "spec", "template", "spec", "taints")):
                if isinstance(taint, Mapping) and taint not in taints:
                    taints.append(taint)
    return taints


def check_node_monitoring_agent_tolerates_gpu(resources: Sequence[Resource], ctx: Context
                                              ) -> Iterator[tuple[Resource | None, str]]:
    taints = _gpu_taints(resources)
    if not taints:
        return
    for addon in resources:
        if addon.type != ADDON_TYPE or _get(addon.inputs, "addonName") != NODE_MONITORING_AGENT:
            continue
        raw = _get(addon.inputs, "configurationValues")
        try:
            values = json.loads(raw) if isinstance(raw, str) and raw.strip() else {}
        except json.JSONDecodeError:
            yield addon, f"configurationValues is not JSON ({str(raw)[:80]!r}); the add-on would refuse it"
            continue
        # The chart's dcgm-server DaemonSet has no tolerations by default (dcgmAgent.tolerations: []).
        tolerations = _get(values, "dcgmAgent", "tolerations") or []
        missing = untolerated_taints(tolerations, taints)
        if missing:
            shown_taints = [f"{t.get('key')}={t.get('value')}:{t.get('effect')}" for t in missing]
            yield addon, (f"configurationValues dcgmAgent.tolerations is {tolerations!r}, which does not "
                          f"tolerate the GPU pools' taints {shown_taints}: the dcgm-server DaemonSet never runs "
                          "on GPU nodes, the agent reports AcceleratedHardwareReady=False and node repair "
                          "replaces healthy nodes; add {\"key\": \"nvidia.com/gpu\", \"operator\": \"Exists\", "
                          "\"effect\": \"NoSchedule\"} (infra/cluster.py ADDON_CONFIGURATION)")


# ------------------------------------------------------------------ EFS access

# The request the EFS CSI driver's mount makes, as EFS evaluates it against a file system
# policy: NFS client actions, over TLS (the driver's default `tls` mount option), through
# a mount target. Anonymous unless the volume mounts with the `iam` option.
EFS_MOUNT_ACTIONS = ("elasticfilesystem:ClientMount", "elasticfilesystem:ClientWrite")
_EFS_MOUNT_CONTEXT = {"aws:securetransport": "true", "elasticfilesystem:accessedviamounttarget": "true"}


def _action_matches(patterns: Any, action: str) -> bool:
    import fnmatch

    return any(fnmatch.fnmatchcase(action.lower(), str(p).lower()) for p in _as_list(patterns))


def _principal_matches(principal: Any, anonymous: bool) -> bool:
    """Anonymous NFS clients match only "*" / {"AWS": "*"}; an IAM-authenticated mount also
    matches a named principal (which role it is cannot be resolved offline)."""
    if principal == "*":
        return True
    if not isinstance(principal, Mapping):
        return False
    aws = [str(p) for p in _as_list(principal.get("AWS"))]
    return "*" in aws or (not anonymous and bool(aws))


def _conditions_hold(conditions: Any, context: Mapping[str, str], effect: str) -> bool:
    """Bool / StringEquals / StringNotEquals / StringLike (and ...IfExists) on a request context.

    An operator this evaluator does not know counts as holding for Deny and failing for
    Allow, so an unknown condition can only make the verdict stricter.
    """
    import fnmatch

    if not isinstance(conditions, Mapping):
        return True
    for operator, block in conditions.items():
        op = str(operator)
        if_exists = op.endswith("IfExists")
        base = op.removesuffix("IfExists")
        if base not in ("Bool", "StringEquals", "StringNotEquals", "StringLike", "StringEqualsIgnoreCase"):
            return effect == "Deny"
        if not isinstance(block, Mapping):
            return effect == "Deny"
        for key, wanted in block.items():
            have = context.get(str(key).lower())
            values = [str(v) for v in _as_list(wanted)]
            if have is None:
                if if_exists:
                    continue
                return False
            if base == "Bool":
                ok = have.lower() in [v.lower() for v in values]
            elif base == "StringEquals":
                ok = have in values
            elif base == "StringEqualsIgnoreCase":
                ok = have.lower() in [v.lower() for v in values]
            elif base == "StringNotEquals":
                ok = have not in values
            else:
                ok = any(fnmatch.fnmatchcase(have, v) for v in values)
            if not ok:
                return False
    return True


def efs_policy_allows(policy: Any, action: str, *, anonymous: bool,
                      context: Mapping[str, str] = _EFS_MOUNT_CONTEXT) -> bool:
    """Would this file system policy let a client do ``action``? (explicit Deny wins; else an Allow is needed)."""
    statements = _as_list(_get(policy, "Statement"))
    allowed = False
    for st in statements:
        if not isinstance(st, Mapping):
            continue
        if "Action" in st:
            applies = _action_matches(st["Action"], action)
        else:
            applies = not _action_matches(st.get("NotAction"), action)
        if not applies or not _principal_matches(st.get("Principal"), anonymous):
            continue
        effect = str(st.get("Effect"))
        if not _conditions_hold(st.get("Condition"), context, effect):
            continue
        if effect == "Deny":
            return False
        if effect == "Allow":
            allowed = True
    return allowed


def _efs_clients_anonymous(resources: Sequence[Resource]) -> bool:
    """True unless every EFS CSI volume the stack declares mounts with the `iam` option."""
    options = []
    for r in resources:
        if r.type == STORAGE_CLASS_TYPE and _get(r.inputs, "provisioner") == "efs.csi.aws.com":
            options.append([str(o) for o in _as_list(_get(r.inputs, "mountOptions"))])
        elif r.type == PERSISTENT_VOLUME_TYPE and _get(r.inputs, "spec", "csi", "driver") == "efs.csi.aws.com":
            options.append([str(o) for o in _as_list(_get(r.inputs, "spec", "mountOptions"))])
    return not options or any("iam" not in o for o in options)


def check_efs_policy_allows_mounts(resources: Sequence[Resource], ctx: Context
                                   ) -> Iterator[tuple[Resource | None, str]]:
    anonymous = _efs_clients_anonymous(resources)
    for r in resources:
        if r.type != EFS_POLICY_TYPE:
            continue
        raw = _get(r.inputs, "policy")
        try:
            policy = json.loads(raw) if isinstance(raw, str) else raw
        except json.JSONDecodeError:
            yield r, f"policy is not JSON ({str(raw)[:80]!r})"
            continue
        refused = [a for a in EFS_MOUNT_ACTIONS if not efs_policy_allows(policy, a, anonymous=anonymous)]
        if refused:
            who = "anonymous NFS clients (the EFS CSI driver without the `iam` mount option)" if anonymous \
                else "IAM-authenticated clients"
            yield r, (f"the file system policy does not allow {', '.join(refused)} for {who} over TLS through a "
                      "mount target: once a file system has a policy EFS stops allowing mounts by default, so "
                      "every pod mount fails with \"access denied by server\"; add an Allow of "
                      "ClientMount/ClientWrite with Condition Bool elasticfilesystem:AccessedViaMountTarget true")

# ------------------------------------------------------------------ Ray

_RAY_AUTH_MODE_ENV = "RAY_AUTH_MODE"
_RAY_AUTH_TOKEN_ENV = "RAY_AUTH_TOKEN"


def check_ray_token_auth(resource: Resource, ctx: Context) -> Iterator[str]:
    """A RayCluster (or the cluster a RayJob/RayService makes) runs with Ray's token authentication:
    ``authOptions.mode: token`` (KubeRay enables it for exactly that value, utils.IsAuthEnabled), no
    container overriding the ``RAY_AUTH_MODE`` KubeRay sets (KubeRay keeps a container's own value,
    common/pod.go SetContainerTokenAuthEnvVars), and the token never written into the spec."""
    path = RAY_CLUSTER_SPEC_PATHS.get(resource.type)
    if path is None:
        return
    spec = _get(resource.inputs, *path)
    if spec is None:  # a RayJob on an existing cluster (clusterSelector): that cluster is checked itself
        return
    where = ".".join(path)
    mode = _get(spec, "authOptions", "mode")
    if mode != "token":
        yield (f"{where}.authOptions.mode is {mode!r}: the Ray dashboard, Jobs API and GCS take anyone who "
               "reaches them; set authOptions {mode: token, secretName: <the namespace's token Secret>} "
               "(infra/ray_cluster.py auth_options)")
    containers = [(f"headGroupSpec container {_get(c, 'name')!r}", c)
                  for c in _containers(_get(spec, "headGroupSpec", "template", "spec"))]
    for group in _as_list(_get(spec, "workerGroupSpecs")):
        containers += [(f"worker group {_get(group, 'groupName')!r} container {_get(c, 'name')!r}", c)
                       for c in _containers(_get(group, "template", "spec"))]
    containers.append(("autoscalerOptions", _get(spec, "autoscalerOptions")))
    for label, container in containers:
        for env in _as_list(_get(container, "env")):
            name, value = _get(env, "name"), _get(env, "value")
            if name == _RAY_AUTH_MODE_ENV and value is not None and value != "token":
                yield (f"{where} {label} sets {name}={value!r}: KubeRay keeps it instead of token; "
                       f"remove it (authOptions sets {name})")
            if name == _RAY_AUTH_TOKEN_ENV and not _is_blank(value):
                yield (f"{where} {label} carries {name} as a plain value: the token would sit in the spec; "
                       "remove it (authOptions.secretName hands it over from the Secret)")


# ------------------------------------------------------------------ KEDA: a ScaledJob per lane

RESOURCE_QUOTA_TYPE = "kubernetes:core/v1:ResourceQuota"
RAYCLUSTER_TYPES = frozenset({"kubernetes:ray.io/v1:RayCluster"})


def _worker_env(pod_spec: Any) -> dict[str, str]:
    """The plain env values of a worker pod's first container."""
    containers = _as_list(_get(pod_spec, "containers"))
    return {str(_get(e, "name")): str(_get(e, "value")) for e in _as_list(_get(_first(containers), "env"))
            if _get(e, "value") is not None} if containers else {}


def _claimed_lanes(pod_spec: Any) -> tuple[Any, ...]:
    """The lanes a worker pod claims (its RAGPOOL_LANES); () when it names none or they do not parse."""
    from contract.lanes import LANES_ENV, LaneError, parse_lanes

    text = _worker_env(pod_spec).get(LANES_ENV)
    try:
        return parse_lanes(text) if text else ()
    except LaneError:
        return ()


def check_lanes_have_one_scaled_job(resources: Sequence[Resource], ctx: Context) -> Iterator[tuple[Resource | None, str]]:
    """In every training namespace, every lane that can hold a run has exactly one ScaledJob, and
    each ScaledJob triggers on exactly its lanes' ready lists (every priority) of its own queue,
    summed. Lanes that can hold a run, for every GPU NodePool P of which at least one worker fits
    (its GPU limit, within the namespace's GPU quota, over the GPUs of P's worker pod): ``pool.<P>``
    and ``pool.<P>.n<N>`` for N from 2 to the workers P holds, and for the default pool (the one
    whose workers take the unpinned lane, the stack's first) ``torchrun`` and ``torchrun.n<N>``
    likewise; ``ray`` where a RayCluster runs. (A namespace whose quota fits no worker of a pool
    has no lane of it: such runs are the submitter's to pin elsewhere.)"""
    from contract.lanes import LANES_ENV, MAX_NODES, Lane
    from contract.env import NAMESPACE_ENV
    from contract.names import DEFAULT_NAMESPACE

    pools: dict[str, float] = {}
    for r in resources:
        if is_gpu_nodepool(r):
            pool = _get(r.inputs, "spec", "template", "metadata", "labels", POOL_LABEL)
            limit = _number(_get(r.inputs, "spec", "limits", GPU_RESOURCE))
            if isinstance(pool, str) and limit:
                pools[pool] = limit
    if not pools:
        return
    configured = training_namespaces(ctx)
    namespaces = [_metadata_name(r) for r in resources if r.type == NAMESPACE_TYPE and (
        _metadata_name(r) in configured or _get(r.inputs, "metadata", "labels", "app.kubernetes.io/component") == "training")]
    # GPUs per worker pod of each pool, and the default pool: the same in every namespace.
    gpus: dict[str, float] = {}
    default_pool = None
    for r in resources:
        path = SCALED_JOB_POD_PATH if r.type == SCALED_JOB_TYPE else POD_SPEC_PATHS.get(r.type)
        pod = _get(r.inputs, *path) if path else None
        pool = _get(pod, "nodeSelector", POOL_LABEL)
        count = _number(_get(_first(_as_list(_get(pod, "containers"))), "resources", "requests", GPU_RESOURCE))
        if pool in pools and count:
            gpus[pool] = count
            if Lane() in _claimed_lanes(pod):
                default_pool = pool
    for ns in namespaces:
        def here(r: Resource) -> bool:
            return _get(r.inputs, "metadata", "namespace") == ns  # noqa: B023 (used at once)

        scaled = [r for r in resources if r.type == SCALED_JOB_TYPE and here(r)]
        quota = next((_number(_get(r.inputs, "spec", "hard", f"requests.{GPU_RESOURCE}")) for r in resources
                      if r.type == RESOURCE_QUOTA_TYPE and here(r)
                      and _get(r.inputs, "spec", "hard", f"requests.{GPU_RESOURCE}") is not None), None)
        expected = set() if default_pool else {Lane()}  # no worker takes unpinned runs: say so below
        for pool, limit in pools.items():
            if pool not in gpus:
                expected.add(Lane(pool=pool))  # no worker of the pool anywhere: its lane is uncovered
                continue
            workers = int(min(limit, quota) if quota is not None else limit) // int(gpus[pool])
            for nodes in range(1, min(workers, MAX_NODES) + 1):
                expected.add(Lane(nodes=nodes, pool=pool))
                if pool == default_pool:
                    expected.add(Lane(nodes=nodes))
        if any(r.type in RAYCLUSTER_TYPES and here(r) for r in resources):
            expected.add(Lane("ray"))
        owners: dict[Any, list[str]] = {lane: [] for lane in expected}
        for r in scaled:
            spec = _get(r.inputs, "spec")
            pod = _get(spec, "jobTargetRef", "template", "spec")
            lanes = _claimed_lanes(pod)
            name = _metadata_name(r)
            if not lanes:
                yield r, (f"ScaledJob {ns}/{name}: its worker names no valid {LANES_ENV} (jobTargetRef's first "
                          "container): KEDA would start workers that claim lanes nobody counted; build the Job "
                          "with infra/worker_jobs.py (worker_env of its lanes)")
                continue
            for lane in lanes:
                owners.setdefault(lane, []).append(name)
            queue = _worker_env(pod).get(NAMESPACE_ENV) or DEFAULT_NAMESPACE
            want = sorted(key for lane in lanes for key in lane.ready_keys(queue))
            triggers = _as_list(_get(spec, "triggers"))
            got = sorted(str(_get(t, "metadata", "listName")) for t in triggers)
            if got != want or any(_get(t, "type") not in ("redis", "redis-sentinel") for t in triggers):
                yield r, (f"ScaledJob {ns}/{name}: triggers on {got!r} but its workers claim "
                          f"{[lane.name for lane in lanes]!r} of queue {queue!r}, whose ready lists are {want!r}: "
                          "one redis trigger per list, no other (infra/keda.py redis_triggers)")
            calc = _get(spec, "scalingStrategy", "multipleScalersCalculation")
            if len(triggers) > 1 and calc != "sum":
                yield r, (f"ScaledJob {ns}/{name}: scalingStrategy.multipleScalersCalculation is {calc!r}: its "
                          "lists together hold the runs that need a worker; set sum")
        for lane, names in sorted(owners.items(), key=lambda item: item[0].name):
            if len(names) != 1:
                found = f"{len(names)} ({', '.join(sorted(names))})" if names else "none"
                yield None, (f"lane {lane.name!r} in namespace {ns!r} can hold a run but has {found} ScaledJobs: "
                             "exactly one must start its workers, or its runs wait forever (none) or get two "
                             "Jobs each (two); declare one per worker kind (infra/keda.py worker_kinds)")


# KEDA's defaults for a ScaledJob field left unset (kedacore/keda v2.20.2 apis/keda/v1alpha1/scaledjob_types.go;
# pkg/scaling/executor/scale_jobs.go cleanUp keeps that many finished Jobs of each kind).
KEDA_DEFAULT_JOBS_HISTORY = 100
KEDA_DEFAULT_MAX_REPLICAS = 100


def check_jobs_quota_covers_scaled_jobs(resources: Sequence[Resource], ctx: Context
                                        ) -> Iterator[tuple[Resource | None, str]]:
    """In every namespace with ScaledJobs, each ResourceQuota's ``count/jobs.batch`` holds what they can keep at
    once: per ScaledJob, ``successfulJobsHistoryLimit`` + ``failedJobsHistoryLimit`` finished Jobs (KEDA deletes
    older ones) and up to ``maxReplicaCount`` unfinished ones. At the quota the API server refuses the next Job
    KEDA creates, and the lane's runs wait with no worker and no error but KEDA's log."""
    need: dict[Any, int] = {}
    for r in resources:
        if r.type != SCALED_JOB_TYPE:
            continue
        spec = _get(r.inputs, "spec")
        counts = [_number(_get(spec, "successfulJobsHistoryLimit")), _number(_get(spec, "failedJobsHistoryLimit")),
                  _number(_get(spec, "maxReplicaCount"))]
        defaults = (KEDA_DEFAULT_JOBS_HISTORY, KEDA_DEFAULT_JOBS_HISTORY, KEDA_DEFAULT_MAX_REPLICAS)
        ns = _get(r.inputs, "metadata", "namespace")
        need[ns] = need.get(ns, 0) + sum(int(c if c is not None else d) for c, d in zip(counts, defaults))
    for r in resources:
        if r.type != RESOURCE_QUOTA_TYPE:
            continue
        ns = _get(r.inputs, "metadata", "namespace")
        hard = _number(_get(r.inputs, "spec", "hard", "count/jobs.batch"))
        if hard is not None and ns in need and hard < need[ns]:
            yield r, (f"ResourceQuota {ns}/{_metadata_name(r)}: count/jobs.batch {hard:g} is below the {need[ns]} "
                      "Jobs the namespace's ScaledJobs can hold (history limits + maxReplicaCount each); KEDA's next "
                      "Job would be refused. Size it with infra/keda.py jobs_quota")


# ------------------------------------------------------------------ the rule list

_ENVIRONMENT_SCHEMA = {"environment": {
    "type": "string", "enum": list(ENVIRONMENTS),
    "description": "Override the environment (default: the resource's environment tag, else the stack name)."}}
_NAMESPACES_SCHEMA = {"trainingNamespaces": {
    "type": "array", "items": {"type": "string"}, "default": list(DEFAULT_TRAINING_NAMESPACES),
    "description": "Namespaces whose workloads and network policies the training rules cover."}}

RULES: tuple[Rule, ...] = (
    Rule("efs-encrypted", "The shared EFS file system is encrypted at rest.", MANDATORY,
         "Set encrypted=True and kms_key_id on aws.efs.FileSystem.", check_efs_encrypted),
    Rule("eks-secrets-encrypted", "EKS envelope-encrypts Kubernetes secrets with a KMS key.", MANDATORY,
         "Set encryption_config with resources ['secrets'] and a KMS key ARN.", check_eks_secrets_encrypted),
    Rule("eks-endpoint-private-in-prod",
         "The EKS API endpoint is private in prod and never open to 0.0.0.0/0 elsewhere.", MANDATORY,
         "prod: ragpool:endpointPublicAccess false. Other stacks: list ragpool:publicAccessCidrs.",
         check_eks_endpoint_access, config_schema=_ENVIRONMENT_SCHEMA),
    Rule("redis-auth-tls-in-prod", "The prod task queue requires auth and TLS (ElastiCache).", MANDATORY,
         "Use an ElastiCache ReplicationGroup with auth_token and transit_encryption_enabled.",
         check_redis_auth_tls_in_prod, config_schema=_ENVIRONMENT_SCHEMA),
    Rule("training-containers-nonroot-limits",
         "Every container in a training namespace runs as non-root with a memory limit.", MANDATORY,
         "Set runAsNonRoot/runAsUser in securityContext and resources.limits.memory.",
         check_training_containers, config_schema=_NAMESPACES_SCHEMA),
    Rule("training-namespace-default-deny",
         "Every training namespace has a default-deny NetworkPolicy.", MANDATORY,
         "Add a NetworkPolicy with podSelector {} and policyTypes [Ingress, Egress] and no rules.",
         check_training_default_deny, scope="stack", config_schema=_NAMESPACES_SCHEMA),
    Rule("gpu-nodepool-tainted", "GPU NodePools taint their nodes nvidia.com/gpu=true:NoSchedule.", MANDATORY,
         "Add the taint to spec.template.spec.taints.", check_gpu_nodepool_tainted),
    Rule("gpu-nodepool-limits", "GPU NodePools cap nvidia.com/gpu in spec.limits.", MANDATORY,
         "Set the pool's gpuLimit in ragpool:gpuPools.", check_gpu_nodepool_limits),
    Rule("imdsv2-required", "Launch templates and Karpenter node classes require IMDSv2.", MANDATORY,
         "Set metadataOptions.httpTokens to 'required'.", check_imdsv2_required),
    Rule("monitoring-no-public-loadbalancer",
         "Grafana/Prometheus/Alertmanager are not exposed through a public LoadBalancer.", MANDATORY,
         "Use ClusterIP or an internal load balancer, or allow it in this policy's config.",
         check_monitoring_not_public,
         config_schema={"allowPublicLoadBalancer": {
             "type": "boolean", "default": False,
             "description": "Allow a public LoadBalancer for the monitoring UIs (e.g. behind an auth proxy)."}}),
    Rule("prod-stateful-protected",
         "Stateful prod resources (EFS, KMS keys, backup vault, ElastiCache) are protected.", MANDATORY,
         "Create them with infra/common.py stateful() (protect=True, retain_on_delete=True).",
         check_prod_stateful_protected, config_schema=_ENVIRONMENT_SCHEMA),
    Rule("efs-policy-allows-cluster-mounts",
         "An EFS file system policy lets the cluster's clients mount and write (over TLS, via a mount target).",
         MANDATORY, "Allow elasticfilesystem:ClientMount/ClientWrite with AccessedViaMountTarget true (keep the TLS Deny).",
         check_efs_policy_allows_mounts, scope="stack"),
    Rule("eks-api-mode-has-admin",
         "An EKS cluster that authenticates with access entries only has a cluster-admin access entry.", MANDATORY,
         "Set ragpool:deployRoleArn; infra/cluster.py gives it an access entry with AmazonEKSClusterAdminPolicy.",
         check_api_cluster_has_admin, scope="stack"),
    Rule("k8s-provider-waits-for-access",
         "The Kubernetes provider depends on the access policy association that authorizes it.", MANDATORY,
         "Create the provider with depends_on=[the cluster-admin AccessPolicyAssociation].",
         check_k8s_provider_waits_for_access, scope="stack"),
    Rule("node-monitoring-agent-tolerates-gpu",
         "With GPU NodePools, the eks-node-monitoring-agent's DCGM server tolerates their taints.", MANDATORY,
         "Give the add-on configurationValues {dcgmAgent: {tolerations: [nvidia.com/gpu Exists NoSchedule]}}.",
         check_node_monitoring_agent_tolerates_gpu, scope="stack"),
    Rule("lane-has-one-scaledjob",
         "In every training namespace, every lane that can hold a run has exactly one KEDA ScaledJob, "
         "triggered by exactly its ready lists, summed.", MANDATORY,
         "Declare the namespace's worker kinds with infra/worker_jobs.py (infra/keda.py worker_kinds, scaled_job_spec).",
         check_lanes_have_one_scaled_job, scope="stack", config_schema=_NAMESPACES_SCHEMA),
    Rule("jobs-quota-covers-scaledjobs",
         "In every namespace with ScaledJobs, count/jobs.batch holds their kept and running Jobs.", MANDATORY,
         "Derive the quota from the namespace's worker kinds (infra/keda.py jobs_quota, infra/worker_jobs.py).",
         check_jobs_quota_covers_scaled_jobs, scope="stack"),
    Rule("efa-pool-requests-devices",
         "Every GPU worker template of a pool with EFA requests (limits = requests) its share of the node's EFA "
         "devices; no other GPU template requests any.", MANDATORY,
         "Build GPU worker Jobs with infra/worker_jobs.py (infra/efa_devices.py pool_efa_devices).",
         lambda resources, ctx: check_efa_pool_requests_devices(resources, ctx, nodepool_types=NODEPOOL_TYPES),
         scope="stack"),
    Rule("secret-volumes-readable",
         "Every container of every pod template can read the Secret files it mounts (as its uid, gid and fsGroup).",
         MANDATORY, "Set the pod's securityContext.fsGroup to the container's group (infra/pod_security.py "
         "pod_security_context(uid, fs_group=uid)), or give the files a mode readable by others.",
         check_secret_volumes_readable),
    Rule("ray-token-auth",
         "Every RayCluster (also a RayJob's or RayService's) runs with Ray token authentication.", MANDATORY,
         "Set spec.authOptions {mode: token, secretName: <the namespace's token Secret>}; never set "
         "RAY_AUTH_MODE or a literal RAY_AUTH_TOKEN in its containers.", check_ray_token_auth),
    Rule("required-cost-tags",
         "Taggable AWS resources and Karpenter node classes carry the cost tags.", ADVISORY,
         "Tag with infra/common.py aws_tags(): project, stack, environment, owner, cost-center.",
         check_required_tags,
         config_schema={"requiredTags": {
             "type": "array", "items": {"type": "string"}, "default": list(REQUIRED_TAGS),
             "description": "Tag keys every taggable resource must carry with a non-empty value."}}),
    Rule("gpu-ami-pinned-in-prod", "Prod GPU node classes pin a dated AMI instead of @latest.", ADVISORY,
         "Set ragpool:gpuAmiAlias to al2023@vYYYYMMDD in Pulumi.prod.yaml.",
         check_gpu_ami_pinned_in_prod, config_schema=_ENVIRONMENT_SCHEMA),
)

RULES_BY_NAME: dict[str, Rule] = {rule.name: rule for rule in RULES}
if len(RULES_BY_NAME) != len(RULES):  # pragma: no cover - guards edits to RULES
    raise RuntimeError("duplicate rule names in policy.checks.RULES")


def stack_from_urn(urn: str | None) -> str | None:
    """``urn:pulumi:<stack>::<project>::<type>::<name>`` -> ``<stack>``."""
    if not urn or not urn.startswith("urn:pulumi:"):
        return None
    return urn[len("urn:pulumi:"):].split("::", 1)[0] or None
