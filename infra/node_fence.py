"""The node fence: a GPU worker whose pre-flight health check failed may taint its own node, and nothing else.

Why (round-4 audit, item 2): the worker Job FailJobs on ``HEALTH_CHECK_FAILED``, but the run stays queued
and KEDA's next poll starts a Job whose pod lands on the same empty node. The worker therefore adds
``contract.names.NODE_FENCE_TAINT_KEY`` (NoSchedule) to its node (training/scheduler/worker/node_fence.py),
which no ragpool pod tolerates: the scheduler places the next worker elsewhere, Karpenter brings a node
for it and consolidates the fenced one once empty. Karpenter's node repair was not the lever: it acts only
on the node conditions its cloud provider lists (infra/reference/gpu_fault_repair.yaml
``karpenter_node_repair.policies``: aws/karpenter-provider-aws v1.14.1 pkg/cloudprovider/cloudprovider.go
``RepairPolicies``), conditions the EKS node monitoring agent owns and rewrites, and after 10-30 minutes.

Least privilege, in two layers:

- RBAC (``ClusterRole`` ``ragpool-node-fence``): ``get`` and ``patch`` on ``nodes``, bound to the worker
  service account of each training namespace. RBAC cannot name a node that does not exist yet, so on its
  own this would let a worker patch any node, any field.
- A ``ValidatingAdmissionPolicy`` narrows it to the one change: for the worker service accounts only, a
  node update is admitted only when the node is the one the request's token was issued on (the bound
  token's node, which the API server puts in the user's extra ``authentication.kubernetes.io/node-name``:
  kubernetes/kubernetes pkg/serviceaccount/util.go ``NodeNameKey``, ``ServiceAccountInfo.UserInfo``;
  feature ServiceAccountTokenPodNodeInfo, on by default since 1.30), its labels, annotations, finalizers
  and ``unschedulable`` are unchanged, no taint is removed or changed, and every added taint is the
  fence. The status subresource is not granted at all.

The token: the worker pods do not automount one (``automountServiceAccountToken: false``); only the GPU
worker's template projects a short-lived token and the cluster CA at ``contract.paths.SERVICE_ACCOUNT_DIR``
(:func:`token_volume`). The workers' NetworkPolicy already allows HTTPS out (the API server).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_kubernetes as k8s

from contract.names import NODE_FENCE_TAINT_EFFECT, NODE_FENCE_TAINT_KEY
from contract.paths import SERVICE_ACCOUNT_DIR
from infra.common import child, k8s_labels
from infra.component import RagpoolComponent
from infra.training_namespace import WORKER_SERVICE_ACCOUNT

FENCE_NAME = "ragpool-node-fence"
"""The ClusterRole, its binding, the admission policy and its binding."""
NODE_NAME_EXTRA = "authentication.kubernetes.io/node-name"
"""kubernetes/kubernetes pkg/serviceaccount/util.go ``NodeNameKey``: the node of a pod-bound token."""
TOKEN_EXPIRATION_SECONDS = 3600
"""The projected token's lifetime; the kubelet refreshes it at 80 % (the minimum is 600)."""
KUBE_ROOT_CA = "kube-root-ca.crt"
"""The ConfigMap every namespace gets with the cluster CA (key ``ca.crt``; the root CA publisher)."""


def fence_rules() -> list[dict[str, Any]]:
    """The ClusterRole's rules: read a node and patch it; nothing else (no status, no list, no delete)."""
    return [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "patch"]}]


def worker_usernames(namespaces: list[str]) -> list[str]:
    """The API users the worker service accounts authenticate as."""
    return [f"system:serviceaccount:{ns}:{WORKER_SERVICE_ACCOUNT}" for ns in namespaces]


def _or_empty(expr: str, empty: str) -> str:
    """``expr`` when present, else ``empty`` (CEL ``has()`` on the last field)."""
    return f"(has({expr}) ? {expr} : {empty})"


def admission_policy_spec(namespaces: list[str]) -> dict[str, Any]:
    """The ValidatingAdmissionPolicy: what a worker service account may change on a node (module docstring)."""
    users = ", ".join(f"'{u}'" for u in worker_usernames(namespaces))
    new_taints, old_taints = _or_empty("object.spec.taints", "[]"), _or_empty("oldObject.spec.taints", "[]")
    same = [(_or_empty(f"object.{f}", e), _or_empty(f"oldObject.{f}", e))
            for f, e in (("metadata.labels", "{}"), ("metadata.annotations", "{}"), ("metadata.finalizers", "[]"),
                         ("spec.unschedulable", "false"))]
    return {
        "failurePolicy": "Fail",
        "matchConstraints": {"resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["UPDATE"],
                                                "resources": ["nodes"]}]},
        "matchConditions": [{"name": "ragpool-worker", "expression": f"request.userInfo.username in [{users}]"}],
        "validations": [
            {"expression": f"has(request.userInfo.extra) && '{NODE_NAME_EXTRA}' in request.userInfo.extra && "
                           f"request.userInfo.extra['{NODE_NAME_EXTRA}'] == [object.metadata.name]",
             "message": "a ragpool worker may fence only the node its pod runs on"},
            {"expression": " && ".join(f"{new} == {old}" for new, old in same),
             "message": "a ragpool worker may not change a node's labels, annotations, finalizers or unschedulable"},
            {"expression": f"{old_taints}.all(o, {new_taints}.exists(t, t == o)) && "
                           f"{new_taints}.all(t, {old_taints}.exists(o, o == t) || "
                           f"(t.key == '{NODE_FENCE_TAINT_KEY}' && t.effect == '{NODE_FENCE_TAINT_EFFECT}'))",
             "message": f"a ragpool worker may only add the taint {NODE_FENCE_TAINT_KEY}:{NODE_FENCE_TAINT_EFFECT}"},
        ],
    }


def token_volume() -> tuple[dict[str, Any], dict[str, Any]]:
    """The GPU worker's projected service-account token and cluster CA (volume, mount), read-only at
    ``SERVICE_ACCOUNT_DIR``; 0440 for the pod's fsGroup, as the Secret volumes."""
    volume = {"name": "kube-api", "projected": {"defaultMode": 0o440, "sources": [
        {"serviceAccountToken": {"path": "token", "expirationSeconds": TOKEN_EXPIRATION_SECONDS}},
        {"configMap": {"name": KUBE_ROOT_CA, "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
    ]}}
    return volume, {"name": "kube-api", "mountPath": SERVICE_ACCOUNT_DIR, "readOnly": True}


@dataclass(frozen=True)
class NodeFenceArgs:
    k8s_provider: k8s.Provider
    namespaces: list[str]
    """The training namespaces whose worker service account may fence its node."""
    depends_on: list[pulumi.Resource]


class NodeFence(RagpoolComponent):
    def __init__(self, name: str, args: NodeFenceArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("ragpool:infra:NodeFence", name, opts, k8s_provider=args.k8s_provider)
        name = self.child_prefix
        meta = {"name": FENCE_NAME, "labels": k8s_labels("worker", FENCE_NAME)}
        # The admission policy first: the permission is granted only once it is narrowed.
        policy = k8s.admissionregistration.v1.ValidatingAdmissionPolicy(
            f"{name}-policy", metadata=meta, spec=admission_policy_spec(args.namespaces),
            opts=child(self, depends_on=args.depends_on))
        policy_binding = k8s.admissionregistration.v1.ValidatingAdmissionPolicyBinding(
            f"{name}-policy-binding", metadata=meta,
            spec={"policyName": FENCE_NAME, "validationActions": ["Deny"]},
            opts=child(self, depends_on=[policy]))
        role = k8s.rbac.v1.ClusterRole(f"{name}-role", metadata=meta, rules=fence_rules(),
                                       opts=child(self, depends_on=[policy_binding]))
        k8s.rbac.v1.ClusterRoleBinding(
            f"{name}-binding", metadata=meta,
            role_ref={"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": FENCE_NAME},
            subjects=[{"kind": "ServiceAccount", "name": WORKER_SERVICE_ACCOUNT, "namespace": ns}
                      for ns in args.namespaces],
            opts=child(self, depends_on=[role, *args.depends_on]))
        self.register_outputs({"clusterRole": FENCE_NAME})
