"""Cluster access and node agents: an access-entry-only EKS cluster has a cluster admin, the Kubernetes provider
waits for its access, the ML-engineer tier stays namespaced (no EKS access policy, no cluster-scoped binding, a
Role of named proxy/ConfigMap rights only), the node monitoring agent tolerates the GPU taints."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from contract.api import ENGINEER_GROUP, RUN_API_NAME
from policy.checks.karpenter import is_gpu_nodepool
from policy.checks.model import Context, Resource
from policy.checks.values import _first, _is_true
from policy.k8s_scheduling import untolerated_taints
from policy.pod_templates import as_list as _as_list
from policy.pod_templates import get as _get


EKS_CLUSTER_TYPE = "aws:eks/cluster:Cluster"
ACCESS_ENTRY_TYPE = "aws:eks/accessEntry:AccessEntry"
ACCESS_POLICY_ASSOCIATION_TYPE = "aws:eks/accessPolicyAssociation:AccessPolicyAssociation"
K8S_PROVIDER_TYPE = "pulumi:providers:kubernetes"
ADDON_TYPE = "aws:eks/addon:Addon"
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


# ------------------------------------------------------------------ the ML-engineer tier (issue 39)

ROLE_TYPE = "kubernetes:rbac.authorization.k8s.io/v1:Role"
ROLE_BINDING_TYPE = "kubernetes:rbac.authorization.k8s.io/v1:RoleBinding"
CLUSTER_ROLE_BINDING_TYPE = "kubernetes:rbac.authorization.k8s.io/v1:ClusterRoleBinding"
ENGINEER_ALLOWED: dict[str, frozenset[str]] = {
    "services/proxy": frozenset({"get", "create"}),
    "configmaps": frozenset({"get"}),
}
"""Core-group resources the ML-engineer tier may be granted, and the verbs: the run API through the service
proxy, the login ConfigMap; always by name (infra/run_api.py ``engineer_rules``)."""


def _has_engineer_group(subjects: Any) -> bool:
    return any(isinstance(s, Mapping) and s.get("kind") == "Group" and s.get("name") == ENGINEER_GROUP
               for s in _as_list(subjects))


def _engineer_rule_problem(rule: Any) -> str | None:
    """Why one Role rule grants the ML-engineer tier more than ENGINEER_ALLOWED (None: it does not)."""
    if not isinstance(rule, Mapping):
        return f"rule {rule!r} is not a mapping"
    groups, resources = _as_list(rule.get("apiGroups")), _as_list(rule.get("resources"))
    verbs, names = _as_list(rule.get("verbs")), _as_list(rule.get("resourceNames"))
    if rule.get("nonResourceURLs"):
        return f"rule grants nonResourceURLs {rule.get('nonResourceURLs')!r}"
    if groups != [""]:
        return f"rule's apiGroups {groups!r} are not just the core group ''"
    if not resources or not names:
        return f"rule on {resources!r} lists no resourceNames (it would cover every object of the namespace)"
    for resource in resources:
        allowed = ENGINEER_ALLOWED.get(resource)
        if allowed is None:
            return f"rule grants {resource!r}, which is not one of {sorted(ENGINEER_ALLOWED)}"
        extra = sorted(set(map(str, verbs)) - allowed)
        if extra or not verbs:
            return f"rule grants verbs {extra or verbs!r} on {resource!r} (allowed: {sorted(allowed)})"
    if any("*" in str(n) for n in names):
        return f"rule's resourceNames {names!r} contain a wildcard"
    return None


def check_engineer_tier_namespaced(resources: Sequence[Resource], ctx: Context
                                   ) -> Iterator[tuple[Resource | None, str]]:
    """The ML-engineer tier (access entries in ``contract.api.ENGINEER_GROUP``) never gets an EKS access policy
    (cluster-admin or any other), another Kubernetes group, a cluster-scoped binding, or a Role beyond
    ENGINEER_ALLOWED by name."""
    fix = ("the ML-engineer tier gets its rights only from the namespaced Role of infra/run_api.py "
           "(services/proxy of the run API, get on the login ConfigMap)")
    engineers = set()
    for entry in resources:
        if entry.type != ACCESS_ENTRY_TYPE:
            continue
        groups = [str(g) for g in _as_list(_get(entry.inputs, "kubernetesGroups"))]
        if ENGINEER_GROUP not in groups:
            continue
        engineers.add((_get(entry.inputs, "clusterName"), _get(entry.inputs, "principalArn")))
        if groups != [ENGINEER_GROUP]:
            yield entry, (f"access entry of {_get(entry.inputs, 'principalArn')!r} is in {ENGINEER_GROUP!r} and also "
                          f"in {[g for g in groups if g != ENGINEER_GROUP]!r}: {fix}")
    for association in resources:
        if association.type == ACCESS_POLICY_ASSOCIATION_TYPE and (
                _get(association.inputs, "clusterName"), _get(association.inputs, "principalArn")) in engineers:
            yield association, (f"{_get(association.inputs, 'principalArn')!r} is in the ML-engineer group "
                                f"{ENGINEER_GROUP!r} but is associated with the EKS access policy "
                                f"{_get(association.inputs, 'policyArn')!r}: {fix}; remove the association (a "
                                "cluster admin belongs in adminRoleArns instead)")
    roles = {(_get(r.inputs, "metadata", "namespace"), _get(r.inputs, "metadata", "name")): r
             for r in resources if r.type == ROLE_TYPE}
    for binding in resources:
        if binding.type == CLUSTER_ROLE_BINDING_TYPE and _has_engineer_group(_get(binding.inputs, "subjects")):
            yield binding, (f"ClusterRoleBinding {_get(binding.inputs, 'metadata', 'name')!r} binds {ENGINEER_GROUP!r}:"
                            f" cluster-wide rights; {fix}")
        if binding.type != ROLE_BINDING_TYPE or not _has_engineer_group(_get(binding.inputs, "subjects")):
            continue
        namespace = _get(binding.inputs, "metadata", "namespace")
        ref = _get(binding.inputs, "roleRef") or {}
        where = f"RoleBinding {namespace}/{_get(binding.inputs, 'metadata', 'name')}"
        if _get(ref, "kind") != "Role":
            yield binding, f"{where} binds {ENGINEER_GROUP!r} to {_get(ref, 'kind')} {_get(ref, 'name')!r}: {fix}"
            continue
        role = roles.get((namespace, _get(ref, "name")))
        if role is None:
            yield binding, (f"{where} binds {ENGINEER_GROUP!r} to Role {_get(ref, 'name')!r}, which the program does "
                            f"not declare in {namespace!r}: {fix}")
            continue
        for rule in _as_list(_get(role.inputs, "rules")):
            problem = _engineer_rule_problem(rule)
            if problem:
                yield role, f"Role {namespace}/{_get(ref, 'name')} (bound to {ENGINEER_GROUP!r} by {where}): {problem}; {fix}"


CLUSTER_ROLE_TYPE = "kubernetes:rbac.authorization.k8s.io/v1:ClusterRole"
READ_VERBS = frozenset({"get", "list", "watch"})
"""What the run API's service account may do with what it is granted (training/scheduler/quota_wait.py reads)."""


def _read_rule_problem(rule: Any, cluster_scoped: bool) -> str | None:
    """Why one rule grants more than reading named, non-secret objects (None: it does not)."""
    if not isinstance(rule, Mapping):
        return f"rule {rule!r} is not a mapping"
    groups, resources = _as_list(rule.get("apiGroups")), _as_list(rule.get("resources"))
    verbs, names = [str(v) for v in _as_list(rule.get("verbs"))], _as_list(rule.get("resourceNames"))
    if rule.get("nonResourceURLs"):
        return f"rule grants nonResourceURLs {rule.get('nonResourceURLs')!r}"
    if not verbs or set(verbs) - READ_VERBS:
        return f"rule grants verbs {sorted(set(verbs) - READ_VERBS) or verbs!r} (allowed: {sorted(READ_VERBS)})"
    if "*" in groups or not resources or any("*" in str(r) for r in resources):
        return f"rule on {groups!r}/{resources!r} uses a wildcard"
    if any(str(r).split("/")[0] == "secrets" for r in resources):
        return "rule grants secrets"
    if cluster_scoped and not names:
        return f"ClusterRole rule on {resources!r} lists no resourceNames (it would read every one in the cluster)"
    return None


def check_run_api_reads_only(resources: Sequence[Resource], ctx: Context) -> Iterator[tuple[Resource | None, str]]:
    """Every Role or ClusterRole bound to the run API's service account (``contract.api.RUN_API_NAME``) is declared
    and only reads: get/list/watch, no secrets, no wildcard; a ClusterRole (bound cluster-wide) only by name."""
    fix = "grant the run API's service account only infra/run_api.py kueue_reader_rules and kueue_cluster_reader_rules"
    roles = {(r.type, _get(r.inputs, "metadata", "namespace"), _get(r.inputs, "metadata", "name")): r
             for r in resources if r.type in (ROLE_TYPE, CLUSTER_ROLE_TYPE)}
    for binding in resources:
        if binding.type not in (ROLE_BINDING_TYPE, CLUSTER_ROLE_BINDING_TYPE) or not any(
                isinstance(s, Mapping) and s.get("kind") == "ServiceAccount" and s.get("name") == RUN_API_NAME
                for s in _as_list(_get(binding.inputs, "subjects"))):
            continue
        ref = _get(binding.inputs, "roleRef") or {}
        kind, ref_name = _get(ref, "kind"), _get(ref, "name")
        namespace = _get(binding.inputs, "metadata", "namespace") if binding.type == ROLE_BINDING_TYPE else None
        where = f"{binding.type.rsplit(':', 1)[-1]} {_get(binding.inputs, 'metadata', 'name')!r}"
        role = roles.get((ROLE_TYPE, namespace, ref_name) if kind == "Role" else (CLUSTER_ROLE_TYPE, None, ref_name))
        if role is None:
            yield binding, (f"{where} binds {RUN_API_NAME!r} to {kind} {ref_name!r}, which the program does not "
                            f"declare{f' in {namespace!r}' if namespace else ''}: {fix}")
            continue
        # A ClusterRole is bound cluster-wide by a ClusterRoleBinding: by name only. In a RoleBinding it is namespaced.
        cluster_scoped = kind == "ClusterRole" and binding.type == CLUSTER_ROLE_BINDING_TYPE
        for rule in _as_list(_get(role.inputs, "rules")):
            problem = _read_rule_problem(rule, cluster_scoped)
            if problem:
                yield role, f"{kind} {ref_name!r} (bound to {RUN_API_NAME!r} by {where}): {problem}; {fix}"
