"""Cluster access and node agents: an access-entry-only EKS cluster has a cluster admin, the Kubernetes provider
waits for its access, the node monitoring agent tolerates the GPU taints."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

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
