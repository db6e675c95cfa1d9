"""Workloads and namespaces: training containers (non-root, restricted, memory and GPU limits) and each training
namespace's default-deny NetworkPolicy."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from contract.names import GPU_RESOURCE
from contract.names import TEAM_NAMESPACE_PREFIX
from infra.pod_security import restricted_problems  # Pulumi-free: the one home of the restricted context
from policy.checks.model import (DEFAULT_TRAINING_NAMESPACES, NAMESPACE_TYPE, NETWORK_POLICY_TYPE, Context,
                                 Resource)
from policy.checks.values import _is_blank, _is_true, _metadata_name, _number, _same_quantity
from policy.pod_templates import POD_SPEC_PATHS
from policy.pod_templates import as_list as _as_list
from policy.pod_templates import containers as _containers
from policy.pod_templates import get as _get


#: Team namespaces (infra/config_gpu.py trainingTeams, TEAM_NAMESPACE_PREFIX) are training namespaces too.


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
